//! Group commit: concurrent autocommit writes to one target merged into one write.
//!
//! Two kinds of writes merge:
//! - counter increments (`coalesce = true` on a `[[counter]]`): concurrent
//!   increments of the same counter become one slot upsert of +Σn;
//! - ring inserts (`coalesce = true` on a `[[ring]]`): concurrent inserts into the
//!   same ring become one multi-row upsert, rows ordered by key so that every
//!   writer takes the keys' locks in the same order.
//!
//! Per target at most one merged write is in flight: the session that finds the
//! target idle becomes the *leader* and writes its own part at once (no added
//! latency when there is no contention); parts arriving while that write is in
//! flight join the *pending* batch. When the write completes, every member of the
//! finished batch gets its answer — only now, after the write committed, so an OK
//! still means durable — and the pending batch is handed to one of its members,
//! which becomes the next leader and writes the batch on its own backend
//! connection.
//!
//! Nothing is kept in proxy memory longer than one write: a crash of the proxy loses
//! only writes whose clients have not been answered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::wire::packets::OkSummary;

/// The outcome of a merged write for one member: its OK summary, or the ERR payload
/// it receives.
pub type Outcome = Result<OkSummary, Vec<u8>>;

/// Rows of ring inserts merged into one statement at most (the statement must stay
/// well below max_allowed_packet, and one write should not hold many locks).
pub const MAX_ROWS: u64 = 512;
/// Bytes of VALUES text merged into one statement at most (a part that alone is
/// larger is written on its own): far below any max_allowed_packet a server is
/// likely to run with, which would otherwise drop the connection.
pub const MAX_VALUES_BYTES: usize = 64 * 1024;

/// One member's contribution to a merged write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// A counter increment: one delta per counter column.
    Deltas(Vec<i64>),
    /// Ring rows: the rendered VALUES tuples (`(…), (…)`), how many rows they are,
    /// and the rendered key of the first row, by which parts are ordered.
    Rows {
        /// `(…), (…)` as rendered from the member's statement.
        values: Vec<u8>,
        /// Number of rows in `values`.
        rows: u64,
        /// The key values of the first row, as rendered.
        order: Vec<u8>,
    },
}

/// Writes merged into one.
#[derive(Debug)]
pub struct Batch {
    /// The members' parts in arrival order: member `i` contributed `parts[i]`.
    pub parts: Vec<Part>,
    /// Member `i`'s channel; `None` for the member holding the batch (and for one
    /// whose session went away).
    waiters: Vec<Option<oneshot::Sender<Signal>>>,
    /// Summed deltas of the counter parts, one per counter column.
    pub sums: Vec<i64>,
    /// Rows of the ring parts.
    rows: u64,
    /// VALUES bytes of the ring parts.
    bytes: usize,
}

impl Batch {
    /// A batch holding one part, of the member holding it.
    pub fn new(part: Part) -> Self {
        let mut b = Batch {
            parts: Vec::new(),
            waiters: Vec::new(),
            sums: Vec::new(),
            rows: 0,
            bytes: 0,
        };
        if let Part::Deltas(d) = &part {
            b.sums = vec![0; d.len()];
        }
        b.push(part, None);
        b
    }

    /// Adds a part unless the batch cannot take it (a counter sum would overflow,
    /// the column count differs, a ring batch is full); the part is returned then.
    fn try_add(&mut self, part: Part, waiter: oneshot::Sender<Signal>) -> Result<(), Part> {
        match &part {
            Part::Deltas(d) => {
                if d.len() != self.sums.len() {
                    return Err(part);
                }
                let sums: Option<Vec<i64>> = self
                    .sums
                    .iter()
                    .zip(d)
                    .map(|(a, b)| a.checked_add(*b))
                    .collect();
                if sums.is_none() {
                    return Err(part);
                }
            }
            Part::Rows { values, rows, .. } => {
                if self.rows + rows > MAX_ROWS || self.bytes + values.len() > MAX_VALUES_BYTES {
                    return Err(part);
                }
            }
        }
        self.push(part, Some(waiter));
        Ok(())
    }

    fn push(&mut self, part: Part, waiter: Option<oneshot::Sender<Signal>>) {
        match &part {
            Part::Deltas(d) => {
                for (s, v) in self.sums.iter_mut().zip(d) {
                    *s = s.saturating_add(*v);
                }
            }
            Part::Rows { values, rows, .. } => {
                self.rows += rows;
                self.bytes += values.len();
            }
        }
        self.parts.push(part);
        self.waiters.push(waiter);
    }

    /// How many writes the batch merges.
    pub fn members(&self) -> usize {
        self.parts.len()
    }

    /// Rows of the ring parts.
    pub fn rows(&self) -> u64 {
        self.rows
    }
}

/// What a waiting member is told.
#[derive(Debug)]
pub enum Signal {
    /// The write containing your part finished.
    Done(Outcome),
    /// The write containing your part finished with warnings: your OK, and the
    /// SHOW WARNINGS rows (text-protocol row payloads) of your own rows.
    Warned(OkSummary, Vec<Vec<u8>>),
    /// The merged write failed in a way that may be one member's doing (a bad
    /// value): nothing was written; run your own statement alone.
    Alone,
    /// Your batch is next: write it. You are member `.1` of it.
    Lead(Batch, usize),
}

/// What a session joining a target's group must do.
#[derive(Debug)]
pub enum Role {
    /// Write this batch now; you are member `.1` of it.
    Lead(Batch, usize),
    /// Wait for a signal.
    Wait(oneshot::Receiver<Signal>),
}

#[derive(Debug, Default)]
struct Group {
    /// A merged write of this target is in flight.
    in_flight: bool,
    /// Parts waiting for the next write.
    pending: Option<Batch>,
}

/// The per-server group-commit coordinator.
#[derive(Debug, Default)]
pub struct Coalescer {
    /// Targets with a write in flight, by group key.
    groups: Mutex<HashMap<Vec<u8>, Group>>,
}

impl Coalescer {
    /// Joins the group of target `key` with a part. `None` when the part cannot be
    /// merged (a counter sum would overflow, the pending batch is full): the caller
    /// writes it alone.
    pub fn join(&self, key: &[u8], part: Part) -> Option<Role> {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let g = groups.entry(key.to_vec()).or_default();
        if !g.in_flight {
            g.in_flight = true;
            return Some(Role::Lead(Batch::new(part), 0));
        }
        let (tx, rx) = oneshot::channel();
        match &mut g.pending {
            Some(batch) => batch.try_add(part, tx).ok()?,
            None => {
                let mut batch = Batch::new(part);
                batch.waiters[0] = Some(tx);
                g.pending = Some(batch);
            }
        }
        Some(Role::Wait(rx))
    }

    /// Ends the write of a leader: hands the pending batch to one of its members,
    /// or marks the target idle.
    fn finish(&self, key: &[u8]) {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let Some(g) = groups.get_mut(key) else {
            return;
        };
        while let Some(mut batch) = g.pending.take() {
            let Some(i) = batch.waiters.iter().position(Option::is_some) else {
                break;
            };
            let Some(next) = batch.waiters[i].take() else {
                break;
            };
            match next.send(Signal::Lead(batch, i)) {
                Ok(()) => return,
                // That member's session is gone (its task was cancelled); its part
                // was never acknowledged. Hand the batch to the next one.
                Err(Signal::Lead(b, _)) => g.pending = Some(b),
                Err(_) => {}
            }
        }
        groups.remove(key);
    }
}

/// Held by the leader while it writes a batch. Dropping it without
/// [`LeaderGuard::resolve`] (the leader's session failed) tells every member that
/// the outcome is unknown, and hands over the pending batch either way.
pub struct LeaderGuard {
    coalescer: Arc<Coalescer>,
    key: Vec<u8>,
    /// The batch being written (`None` once resolved).
    pub batch: Option<Batch>,
}

impl LeaderGuard {
    /// Guards `batch` of target `key`.
    pub fn new(coalescer: Arc<Coalescer>, key: Vec<u8>, batch: Batch) -> Self {
        LeaderGuard {
            coalescer,
            key,
            batch: Some(batch),
        }
    }

    /// The summed deltas to write.
    pub fn sums(&self) -> &[i64] {
        self.batch.as_ref().map_or(&[], |b| &b.sums)
    }

    /// The parts being written.
    pub fn parts(&self) -> &[Part] {
        self.batch.as_ref().map_or(&[], |b| &b.parts)
    }

    /// Reports the same outcome to every member and hands over the next batch.
    pub fn resolve(self, outcome: Outcome) {
        self.resolve_each(|_| Signal::Done(outcome.clone()));
    }

    /// Tells member `i` what `signal(i)` says (called for the waiting members only)
    /// and hands over the next batch.
    pub fn resolve_each(mut self, mut signal: impl FnMut(usize) -> Signal) {
        if let Some(b) = self.batch.take() {
            for (i, w) in b.waiters.into_iter().enumerate() {
                if let Some(w) = w {
                    let _ = w.send(signal(i));
                }
            }
        }
        // Drop runs finish().
    }
}

impl Drop for LeaderGuard {
    fn drop(&mut self) {
        if let Some(b) = self.batch.take() {
            let lost = crate::wire::packets::err_of(
                crate::wire::packets::errors::SERVER_LOST,
                "heatsink: the connection performing this merged write failed; it may or may not have been applied",
            );
            for w in b.waiters.into_iter().flatten() {
                let _ = w.send(Signal::Done(Err(lost.clone())));
            }
        }
        self.coalescer.finish(&self.key);
    }
}

/// Parses a rendered delta (`5`, `-3`, `-(5)`, `+2`, `(7)`) as an integer.
pub fn parse_delta(text: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(text).ok()?.trim();
    let mut negative = false;
    let mut rest = s;
    loop {
        rest = rest.trim();
        if let Some(r) = rest.strip_prefix('-') {
            negative = !negative;
            rest = r;
        } else if let Some(r) = rest.strip_prefix('+') {
            rest = r;
        } else if let Some(r) = rest
            .strip_prefix('(')
            .and_then(|r| r.trim_end().strip_suffix(')'))
        {
            rest = r;
        } else {
            break;
        }
    }
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: i64 = rest.parse().ok()?;
    Some(if negative { v.checked_neg()? } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(v: i64) -> Part {
        Part::Deltas(vec![v])
    }

    #[test]
    fn deltas() {
        assert_eq!(parse_delta(b"5"), Some(5));
        assert_eq!(parse_delta(b"-(5)"), Some(-5));
        assert_eq!(parse_delta(b"-(-5)"), Some(5));
        assert_eq!(parse_delta(b" ( 7 ) "), Some(7));
        assert_eq!(parse_delta(b"'5'"), None);
        assert_eq!(parse_delta(b"1.5"), None);
        assert_eq!(parse_delta(b"0x10"), None);
        assert_eq!(parse_delta(b""), None);
        assert_eq!(parse_delta(b"99999999999999999999"), None);
    }

    #[tokio::test]
    async fn batches_form_while_a_write_is_in_flight() {
        let c = Arc::new(Coalescer::default());
        let Some(Role::Lead(first, 0)) = c.join(b"k", d(1)) else {
            panic!()
        };
        let Some(Role::Wait(w1)) = c.join(b"k", d(2)) else {
            panic!()
        };
        let Some(Role::Wait(w2)) = c.join(b"k", d(3)) else {
            panic!()
        };
        // Another counter is independent.
        assert!(matches!(c.join(b"other", d(1)), Some(Role::Lead(..))));
        let g = LeaderGuard::new(c.clone(), b"k".to_vec(), first);
        assert_eq!(g.sums(), &[1]);
        g.resolve(Ok(OkSummary::default()));
        // w1 leads the pending batch holding 2 + 3.
        let Signal::Lead(next, 0) = w1.await.unwrap() else {
            panic!()
        };
        assert_eq!(next.sums, vec![5]);
        assert_eq!(next.members(), 2);
        let g = LeaderGuard::new(c.clone(), b"k".to_vec(), next);
        g.resolve(Ok(OkSummary::default()));
        assert!(matches!(w2.await.unwrap(), Signal::Done(Ok(_))));
        // The counter is idle again.
        assert!(matches!(c.join(b"k", d(1)), Some(Role::Lead(..))));
    }

    #[tokio::test]
    async fn a_failed_leader_reports_and_hands_over() {
        let c = Arc::new(Coalescer::default());
        let Some(Role::Lead(first, 0)) = c.join(b"k", d(1)) else {
            panic!()
        };
        let g = LeaderGuard::new(c.clone(), b"k".to_vec(), first);
        let Some(Role::Wait(w1)) = c.join(b"k", d(2)) else {
            panic!()
        };
        drop(g);
        assert!(matches!(w1.await.unwrap(), Signal::Lead(_, 0)));
    }

    #[test]
    fn overflow_is_not_merged() {
        let c = Coalescer::default();
        let _lead = c.join(b"k", d(1));
        assert!(c.join(b"k", d(i64::MAX)).is_some());
        assert!(c.join(b"k", d(1)).is_none());
    }

    fn rows(n: u64, order: &str) -> Part {
        Part::Rows {
            values: b"(1)".repeat(n as usize),
            rows: n,
            order: order.as_bytes().to_vec(),
        }
    }

    #[tokio::test]
    async fn ring_batches_are_bounded_and_answered_per_member() {
        let c = Arc::new(Coalescer::default());
        let Some(Role::Lead(first, 0)) = c.join(b"r", rows(1, "1")) else {
            panic!()
        };
        let Some(Role::Wait(w1)) = c.join(b"r", rows(MAX_ROWS - 1, "2")) else {
            panic!()
        };
        let Some(Role::Wait(w2)) = c.join(b"r", rows(1, "3")) else {
            panic!()
        };
        // The pending batch is full.
        assert!(c.join(b"r", rows(1, "4")).is_none());
        LeaderGuard::new(c.clone(), b"r".to_vec(), first).resolve(Ok(OkSummary::default()));
        let Signal::Lead(next, 0) = w1.await.unwrap() else {
            panic!()
        };
        assert_eq!((next.members(), next.rows()), (2, MAX_ROWS));
        LeaderGuard::new(c.clone(), b"r".to_vec(), next).resolve_each(|i| {
            assert_eq!(i, 1);
            Signal::Alone
        });
        assert!(matches!(w2.await.unwrap(), Signal::Alone));
    }
}
