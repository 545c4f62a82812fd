//! Rule kinds: one folder per kind, each owning its whole life.
//!
//! A kind is a pattern heatsink can rewrite (`counter`, `ring`, …). Everything about
//! one kind lives in `src/kinds/<kind>/`: its rule-file section and validation
//! (`spec.rs`), its planner (`plan.rs`, a [`Rule`] the engine calls), its schema work
//! (`schema.rs`: DDL from the logical table, backfill, live-schema checks), its
//! group-commit merge and its maintenance jobs. The [`KINDS`] registry lists them;
//! the drivers — `serve` (through [`crate::rules`]), `migrate`, `check`, `explain`,
//! `maintain` — loop over it and over the [`RuleSpec`]s it reads, and never name a
//! kind.
//!
//! The interface is what the drivers need from a rule, not what one kind happens to
//! do:
//!
//! - [`Kind::parse`] reads the kind's sections of a rule file; [`RuleSpec::rule`]
//!   validates one and builds the planner `serve` uses.
//! - A plan ([`crate::rewrite::Plan`]) is a list of statements over any number of
//!   physical tables with a reply shape; a read may be answered from several
//!   tables at once (one statement with a `UNION ALL`, or several statements whose
//!   last one answers).
//! - [`RuleSpec::schema`] checks the rule against the live database and returns a
//!   [`Migration`]: what `check --backend-url` reports and what `migrate` prints
//!   and applies.
//! - [`RuleSpec::jobs`] lists periodic maintenance (compaction, rotation) that
//!   `heatsink maintain` runs; each run holds a database-wide named lock, so that
//!   of many proxies or cron entries one does the work at a time. Without
//!   `--apply` ([`JobContext::apply`] false) a job only reads: it prints the
//!   statements it would run and what they would do, and changes nothing.
//!
//! Adding a kind: a new folder, one line in [`KINDS`], its tests, and its section in
//! `rules/README.md` (see `docs/adding-a-kind.md`).

use std::fmt;
use std::io::Write;
use std::sync::Arc;

use async_trait::async_trait;
use mysql_async::Conn;

use crate::error::Result;
use crate::report::Severity;
use crate::rewrite::merge::MergeMetric;
use crate::rewrite::Rule;
use crate::wire::resultset::ColumnDef;

pub mod revert;
pub use crate::schema::{SchemaError, SideAccess};
pub use revert::{Leftovers, RevertContext};

pub mod calendar;
pub mod counter;
pub mod inserts;
pub mod logical;
pub mod partition;
pub mod ring;
pub mod rollup;
pub mod timeline;

/// Every rule kind heatsink knows, in the order their rules are listed.
pub static KINDS: &[&dyn Kind] = &[
    &counter::Counter,
    &ring::Ring,
    &rollup::Rollup,
    &partition::Partition,
    &timeline::Timeline,
];

/// The merged-items metric of every kind that merges writes (group commit), in
/// [`KINDS`] order: the order `/metrics` shows them.
pub fn merge_metrics() -> impl Iterator<Item = &'static MergeMetric> {
    KINDS.iter().filter_map(|k| k.merge_metric())
}

/// The kind whose rule-file section is `section`.
pub fn kind(section: &str) -> Option<&'static dyn Kind> {
    KINDS.iter().copied().find(|k| k.section() == section)
}

/// One rule kind: reads its rule-file section.
pub trait Kind: Sync {
    /// The rule-file section (`[[counter]]` → `counter`), also the kind's name in
    /// messages.
    fn section(&self) -> &'static str;

    /// Reads this kind's entries of a rule file, in file order. Gets the whole text
    /// so that a syntax or shape error carries its line and column; entries are
    /// validated later, by [`RuleSpec::rule`].
    fn parse(&self, text: &str) -> std::result::Result<Vec<Arc<dyn RuleSpec>>, toml::de::Error>;

    /// The counter of items this kind's merged writes carry (group commit, see
    /// [`crate::rewrite::Merger`]), when its plans merge.
    fn merge_metric(&self) -> Option<&'static MergeMetric> {
        None
    }

    /// Finds this kind's hot spots in an observed workload and proposes rules for
    /// them (`heatsink advise`); the driver validates, checks and ranks them.
    fn advise(&self, workload: &crate::advice::Workload) -> crate::advice::Advice {
        let _ = workload;
        crate::advice::Advice::default()
    }
}

/// Reads the `[[<section>]]` entries of a rule file into `T`, skipping the other
/// sections (the rule-file reader rejects unknown ones). An error inside an entry
/// carries its position in the whole text.
pub fn entries<T: serde::de::DeserializeOwned>(
    text: &str,
    section: &'static str,
) -> std::result::Result<Vec<T>, toml::de::Error> {
    use serde::de::{Deserializer as _, IgnoredAny, MapAccess, Visitor};

    struct Section<T> {
        name: &'static str,
        entries: std::marker::PhantomData<T>,
    }

    impl<'de, T: serde::Deserialize<'de>> Visitor<'de> for Section<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a rule file with [[{}]] sections", self.name)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Vec<T>, A::Error> {
            let mut out = Vec::new();
            while let Some(key) = map.next_key::<String>()? {
                if key == self.name {
                    out = map.next_value()?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(out)
        }
    }

    toml::Deserializer::parse(text)?.deserialize_map(Section {
        name: section,
        entries: std::marker::PhantomData,
    })
}

/// [`entries`] as [`RuleSpec`]s: what most kinds' [`Kind::parse`] is.
pub fn specs_of<T>(
    text: &str,
    section: &'static str,
) -> std::result::Result<Vec<Arc<dyn RuleSpec>>, toml::de::Error>
where
    T: RuleSpec + serde::de::DeserializeOwned + 'static,
{
    Ok(entries::<T>(text, section)?
        .into_iter()
        .map(|s| Arc::new(s) as Arc<dyn RuleSpec>)
        .collect())
}

/// One rule as written in a rule file, of any kind.
#[async_trait(?Send)]
pub trait RuleSpec: Send + Sync + fmt::Debug {
    /// The kind's section name (`counter`).
    fn kind(&self) -> &'static str;

    /// The rule's name (unique across the rule set).
    fn name(&self) -> &str;

    /// The logical table the application uses, as written (`t` or `db.t`).
    fn table(&self) -> &str;

    /// The physical tables the rule writes besides the logical one, as written.
    fn physical_tables(&self) -> Vec<String>;

    /// The physical tables that statements heatsink runs for the application use
    /// (with the application's privileges), as written, and how: what a user who may
    /// use the logical table must be granted on them (`migrate` grants it, `check`
    /// lists who lacks it). Tables only the rule's triggers write (which run with
    /// their definer's privileges) and nothing reads through heatsink are left out.
    /// By default every physical table, read.
    fn client_tables(&self) -> Vec<(String, SideAccess)> {
        self.physical_tables()
            .into_iter()
            .map(|t| (t, SideAccess::Read))
            .collect()
    }

    /// Whether `migrate --apply` backfills the rule's tables under `LOCK TABLES`, which
    /// holds only on the Galera node it runs on (`check` and `migrate` warn there).
    fn backfills_under_lock(&self) -> bool {
        false
    }

    /// Whether other rules of this kind may be about the same logical table (several
    /// rollups of one log). Rules of other kinds never may.
    fn shares_table(&self) -> bool {
        false
    }

    /// Validates the rule (what needs no database) and builds the planner `serve`
    /// uses. The reason names the offending key (`slots must be …`).
    fn rule(&self) -> std::result::Result<Arc<dyn Rule>, String>;

    /// The column list to plan with when no database can be asked: what the rule
    /// names, with plausible types (`check` and `explain` without `--backend-url`).
    fn assumed_columns(&self) -> Vec<ColumnDef>;

    /// Checks the rule against the live database (`default_db` holds unqualified
    /// tables). `Err(Refused)` when the tables cannot carry the rule.
    async fn schema(
        &self,
        conn: &mut Conn,
        default_db: Option<&str>,
    ) -> std::result::Result<Box<dyn Migration>, SchemaError>;

    /// The rule as a rule-file entry (`[[counter]]\nname = …`), every setting
    /// spelled out: what `migrate --apply` records in the `heatsink_rules` table so
    /// that `migrate --revert` and `check` know the rule after it left the rule
    /// files. Each kind's is [`entry_toml`] of its spec.
    fn to_toml(&self) -> std::result::Result<String, String>;

    /// What `migrate` leaves in the database for this rule besides the logical
    /// table, databases resolved (`default_db` holds unqualified tables): the side
    /// tables it creates and the triggers it puts on tables that stay. Triggers on
    /// side tables go with them and are not listed.
    fn leftovers(&self, default_db: Option<&str>) -> std::result::Result<Leftovers, String>;

    /// Whether the rule, as written, is only draining (a counter's `drain = true`):
    /// then `migrate --revert` runs while proxies still run it, and folds without
    /// dropping anything ([`RevertContext::draining`]).
    fn draining(&self) -> bool {
        false
    }

    /// Takes the rule out of the database (`heatsink migrate --revert`), once no
    /// proxy runs it any more: brings what only the side tables hold back into the
    /// logical table, then drops the rule's triggers and side tables. Without
    /// [`RevertContext::apply`] it only reads and prints what it would do. Safe to
    /// run again: a second run finds nothing left to do. By default the kind has
    /// nothing to bring back: its [`RuleSpec::leftovers`] are dropped, triggers
    /// first.
    async fn revert(&self, ctx: &mut RevertContext<'_>) -> Result<()> {
        let leftovers = self
            .leftovers(ctx.default_db)
            .map_err(|r| crate::error::Error::new(crate::error::Source::Rules, r))?;
        revert::drop_leftovers(ctx, &leftovers).await
    }

    /// Backs out a first migration that stopped before it finished (the rule is
    /// recorded as [`revert::MIGRATING`]): no proxy has served the rule from its
    /// tables, so nothing is brought back; whatever exists of its triggers and side
    /// tables is dropped, triggers first. A kind whose side tables may hold data
    /// the logical table lacks even so overrides it. Safe to run again.
    async fn back_out(&self, ctx: &mut RevertContext<'_>) -> Result<()> {
        let leftovers = self
            .leftovers(ctx.default_db)
            .map_err(|r| crate::error::Error::new(crate::error::Source::Rules, r))?;
        revert::drop_leftovers(ctx, &leftovers).await
    }

    /// Maintenance jobs of this rule, for `heatsink maintain`.
    fn jobs(&self) -> &'static [Job] {
        &[]
    }

    /// Runs one of [`RuleSpec::jobs`] once. The driver holds the job's lock. When
    /// [`JobContext::apply`] is false the job changes nothing: it reads what it
    /// needs, prints the statements it would run and reports what they would do.
    async fn run_job(&self, job: &str, ctx: &mut JobContext<'_>) -> Result<JobReport> {
        let _ = ctx;
        Err(crate::error::Error::new(
            crate::error::Source::Internal,
            format!("rule {}: no job named '{job}'", self.name()),
        ))
    }
}

/// [`crate::schema::resolve_tables`] with the refusal as a plain reason, for
/// [`RuleSpec::leftovers`].
pub(crate) fn resolved(
    table: &str,
    physical: &[&str],
    default_db: Option<&str>,
) -> std::result::Result<
    (
        crate::rules::spec::TableName,
        Vec<crate::rules::spec::TableName>,
    ),
    String,
> {
    crate::schema::resolve_tables(table, physical, default_db).map_err(|e| match e {
        SchemaError::Refused(r) => r,
        SchemaError::Failed(e) => e.to_string(),
    })
}

/// `<base><suffix>` in `db`: a trigger's name as schema work makes it.
pub(crate) fn trigger_in(
    db: &Option<String>,
    base: &str,
    suffix: &str,
) -> crate::rules::spec::TableName {
    crate::rules::spec::TableName {
        db: db.clone(),
        name: crate::schema::suffixed_name(base, suffix),
    }
}

/// [`RuleSpec::to_toml`] for a kind whose spec serializes: `[[section]]` and one
/// `key = value` line per setting.
pub fn entry_toml<T: serde::Serialize>(
    section: &str,
    spec: &T,
) -> std::result::Result<String, String> {
    let entry = toml::Value::try_from(spec).map_err(|e| format!("writing the rule: {e}"))?;
    let mut doc = toml::Table::new();
    doc.insert(section.to_string(), toml::Value::Array(vec![entry]));
    toml::to_string(&doc).map_err(|e| format!("writing the rule: {e}"))
}

/// What one rule needs from the database, found by [`RuleSpec::schema`].
#[async_trait(?Send)]
pub trait Migration: Send {
    /// What `check --backend-url` reports: missing objects as errors, risks as
    /// warnings (not what `migrate` would merely do).
    async fn problems(&self, conn: &mut Conn) -> Result<Vec<(Severity, String)>>;

    /// Prints the plan (`-- …` comments and the statements) and, with `apply`,
    /// executes it. `migrate` calls this only when every selected rule passed its
    /// checks.
    async fn run(&self, conn: &mut Conn, apply: bool, out: &mut dyn Write) -> Result<()>;

    /// [`Migration::run`] with the settings of the long jobs it runs (a rollup's
    /// backfill: chunk size, throttle, progress; see [`crate::jobs`]). By default the
    /// migration runs no long job.
    async fn run_with(
        &self,
        conn: &mut Conn,
        apply: bool,
        jobs: &crate::jobs::Settings,
        out: &mut dyn Write,
    ) -> Result<()> {
        let _ = jobs;
        self.run(conn, apply, out).await
    }

    /// The long jobs `migrate --apply` runs once every selected rule's schema is in
    /// place and recorded (a push timeline's mailbox fill), through the job runner:
    /// resumable, throttled, with progress. `migrate --defer-jobs` leaves them to
    /// `heatsink maintain` instead. By default none.
    async fn run_jobs(
        &self,
        conn: &mut Conn,
        jobs: &crate::jobs::Settings,
        out: &mut dyn Write,
    ) -> Result<()> {
        let _ = (conn, jobs, out);
        Ok(())
    }
}

/// A maintenance job a kind offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// Its name (`--job compact`).
    pub name: &'static str,
    /// One line for `--help` and listings.
    pub about: &'static str,
}

/// What a job gets from the `maintain` driver.
pub struct JobContext<'a> {
    /// A connection to the database (`CLIENT_FOUND_ROWS`, TCP).
    pub conn: &'a mut Conn,
    /// The database of unqualified tables.
    pub default_db: Option<&'a str>,
    /// Rows or keys per batch, for jobs that work in batches.
    pub batch: usize,
    /// Where progress lines go.
    pub out: &'a mut dyn Write,
    /// Execute the job. `false` (`heatsink maintain` without `--apply`): a dry run
    /// that prints the statements the job would run and changes nothing.
    pub apply: bool,
    /// How long jobs (a mailbox fill) run: chunks, throttle, progress.
    pub jobs: crate::jobs::Settings,
}

/// What one run of a job did.
#[derive(Debug, Default)]
pub struct JobReport {
    /// One summary line (`3 keys compacted, 12 slot rows removed`).
    pub summary: String,
    /// Items that failed, with the reason; the others were still done.
    pub failed: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::MergedItems;

    #[test]
    fn merged_items_keep_their_metric_names() {
        let items = MergedItems::default();
        for m in [
            counter::merge::Increments::merger(None),
            ring::merge::merger(true, None),
        ] {
            assert!(merge_metrics().any(|x| std::ptr::eq(x, m.metric())));
        }
        items.add(&counter::merge::METRIC, 3);
        items.add(&ring::merge::METRIC, 5);
        items.add(&ring::merge::METRIC, 1);
        let shown: Vec<(&str, u64)> = items.iter().map(|(m, v)| (m.name, v)).collect();
        assert_eq!(
            shown,
            [
                ("heatsink_coalesced_increments_total", 3),
                ("heatsink_coalesced_rows_total", 6),
                ("heatsink_rollup_merged_rows_total", 0)
            ]
        );
    }

    #[test]
    fn recorded_rules_read_back_as_written() {
        // Every example rule, written as `migrate --apply` records it and read back
        // by its kind, is the same rule with the same tables.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
        let specs = crate::rules::specs(&dir).unwrap();
        assert!(specs.len() >= 5);
        for s in &specs {
            let text = s.to_toml().unwrap();
            let back = kind(s.kind()).unwrap().parse(&text).unwrap();
            assert_eq!(back.len(), 1, "{text}");
            assert_eq!(format!("{s:?}"), format!("{:?}", back[0]), "{text}");
            assert_eq!(
                s.leftovers(Some("db")).unwrap(),
                back[0].leftovers(Some("db")).unwrap()
            );
        }
    }

    #[test]
    fn sections_are_unique() {
        let mut sections: Vec<&str> = KINDS.iter().map(|k| k.section()).collect();
        sections.sort_unstable();
        sections.dedup();
        assert_eq!(sections.len(), KINDS.len());
        assert!(!sections.contains(&"test"));
    }
}
