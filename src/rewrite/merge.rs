//! Group commit, the kind's half: how executions of one rewrite merge.
//!
//! A rule kind whose rewrites may be merged by the connection layer's group commit
//! (`relay::coalesce`, `relay::merge`) implements [`Merger`] in
//! `kinds/<kind>/merge.rs` and puts it in [`crate::rewrite::Plan::merge`]. The
//! pieces it needs are rendered per execution like the statements
//! ([`crate::rewrite::Plan::aux`]); only the kind knows what they are. The relay
//! asks the merger for an execution's [`Part`] and group target, for the merged
//! statement of a batch, and for each member's answer from the merged write's
//! response; grouping, leader election, retries, fallback to running members
//! alone, `SHOW WARNINGS` routing and `LAST_INSERT_ID()` restoration are the
//! relay's.

use std::fmt;

use crate::wire::packets::OkSummary;

/// One execution's contribution to a merged write.
///
/// A batch sums the parts' `sums` element-wise and refuses a part whose sum would
/// overflow or whose length differs; it concatenates nothing itself: the merger
/// builds the statement from the parts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Part {
    /// Numbers summed over the batch (for example one delta per counter column).
    pub sums: Vec<i64>,
    /// Text of the part (for example rendered VALUES tuples), bounded per batch by
    /// [`Limits::bytes`].
    pub text: Vec<u8>,
    /// Items (rows, increments) the part writes, bounded per batch by
    /// [`Limits::items`]; member answers and the merged-items metric count them.
    pub items: u64,
    /// Sort key of the part, if the merger orders parts.
    pub order: Vec<u8>,
}

/// Bounds of one merged write: a part that would exceed them waits for no batch and
/// runs alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Items of all parts at most.
    pub items: u64,
    /// Bytes of all parts' text at most.
    pub bytes: usize,
}

impl Limits {
    /// No bound.
    pub const NONE: Limits = Limits {
        items: u64::MAX,
        bytes: usize::MAX,
    };
}

/// A batch's merged statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// The statement (the relay appends `RETURNING column` when
    /// [`Merger::returning`] names one).
    pub sql: Vec<u8>,
    /// The parts' indices in the order their items appear in the statement.
    pub order: Vec<usize>,
}

/// What the merged write's response said, as the relay read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// With `RETURNING`: the returned value of every item, in statement order
    /// (exactly one per item); else empty.
    pub ids: Vec<u64>,
    /// The write's warning count.
    pub warnings: u16,
}

/// Where one member's items are in a merged write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// Its first item, counted from 0 in statement order.
    pub first: u64,
    /// Its items ([`Part::items`]).
    pub items: u64,
}

/// The counter of items written as part of a merged write, one per kind (a
/// Prometheus counter).
#[derive(Debug, PartialEq, Eq)]
pub struct MergeMetric {
    /// Metric name.
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
}

/// How executions of a rewrite merge: implemented by a rule kind, read by the relay.
///
/// `aux` is always the execution's rendered [`crate::rewrite::Rewritten::aux`].
/// Any method may return `None` for pieces it does not recognise; the execution
/// then runs alone.
pub trait Merger: Send + Sync + fmt::Debug {
    /// Identifies the merger: mergers with equal names behave the same.
    fn name(&self) -> &'static str;

    /// What merging does, for `heatsink explain`; `None` when executions never
    /// merge (the merger then only serves [`Merger::returning_alone`]).
    fn explain(&self) -> Option<&'static str>;

    /// The counter of merged items.
    fn metric(&self) -> &'static MergeMetric;

    /// Bounds of one merged write.
    fn limits(&self) -> Limits;

    /// This execution's part, and the pieces that name its target (executions of
    /// the same rule with equal target pieces merge). `None`: it runs alone.
    fn part<'a>(&self, aux: &'a [Vec<u8>]) -> Option<(Vec<&'a [u8]>, Part)>;

    /// The statement this execution runs alone, rebuilt from its pieces (a prepared
    /// execute written as text).
    fn statement(&self, aux: &[Vec<u8>]) -> Option<Vec<u8>>;

    /// The merged statement of a batch: `parts` in arrival order, `sums` their
    /// summed [`Part::sums`].
    fn merged(&self, aux: &[Vec<u8>], parts: &[Part], sums: &[i64]) -> Option<Merged>;

    /// The column a merged write returns for every item (`RETURNING`): each
    /// member's last insert id is its first item's value. `None`: no `RETURNING`.
    fn returning<'a>(&self, aux: &'a [Vec<u8>]) -> Option<&'a [u8]>;

    /// The column an execution running alone must return (`RETURNING`) to be
    /// answered as the original statement; `None`: it runs as rendered.
    fn returning_alone<'a>(&self, aux: &'a [Vec<u8>]) -> Option<&'a [u8]>;

    /// After a merged write of `members` members failed (other than by a lock
    /// conflict): whether every member runs its own statement alone (`true`) or
    /// gets the write's error.
    fn alone_after_failure(&self, members: usize) -> bool;

    /// Whether the write's warnings are routed to the members by row number
    /// (`at row N`), each member then seeing only its own.
    fn routes_warnings(&self) -> bool;

    /// How many merged writes of one target may be in flight at once (each
    /// session joins the lane of its backend connection id). One lane serializes
    /// the target's writes, which is what a single hot row needs; a target whose
    /// writes touch many rows (inserts into a log) gains from a few lanes.
    fn lanes(&self) -> u32 {
        1
    }

    /// The table a merged write inserts into or updates, resolved at plan time:
    /// its triggers and column defaults run on the leader's connection, so group
    /// commit asks whether they may read the connection (`rewrite::bound`) before
    /// an execution joins a merge. `None`: not known; executions run alone.
    fn table(&self) -> Option<&MergeTable>;

    /// The OK of an execution that ran alone with [`Merger::returning_alone`]
    /// (status flags are the session's), from its response (`None`: not
    /// understood); `Err` holds the message of the error it gets instead.
    fn answer_alone(&self, written: Option<&Written>) -> Result<OkSummary, &'static str>;

    /// A member's OK (status flags are the member session's), from the merged
    /// write's response (`None`: not understood); `Err` holds the message of the
    /// error every member then gets.
    fn answer(&self, written: Option<&Written>, member: Member) -> Result<OkSummary, &'static str>;
}

/// The table a merged write writes ([`Merger::table`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeTable {
    /// Its database.
    pub db: String,
    /// Its name.
    pub name: String,
    /// heatsink's own trigger is on it (what tells that the connection's user can
    /// see the table's triggers).
    pub expects_own_trigger: bool,
    /// Database and name lower-cased (what verdicts are kept by).
    pub key: (String, String),
}

impl MergeTable {
    /// The table `name` in `db` (the statement's database when the rule names
    /// none); `None` without a database.
    pub fn new(db: Option<&str>, name: &str, expects_own_trigger: bool) -> Option<MergeTable> {
        let db = db?;
        Some(MergeTable {
            db: db.to_string(),
            name: name.to_string(),
            expects_own_trigger,
            key: (db.to_ascii_lowercase(), name.to_ascii_lowercase()),
        })
    }
}

impl PartialEq for dyn Merger {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for dyn Merger {}
