//! Group commit's question about the written table (`rewrite::bound`): may its
//! triggers and column defaults run on another session's connection? The answer is
//! kept per table for [`VERDICT_TTL`] and shared by every session of the server; the
//! first session that finds it missing or stale learns it on its own backend
//! connection (a few `information_schema` queries, before its statement). A missing
//! or stale verdict is never used: while one session reads the table, the others
//! wait for its verdict (a few milliseconds) and run alone (`table_recheck`) if it
//! does not come within [`RECHECK_LIMIT`]. So a trigger created while heatsink serves
//! is seen by every write that starts more than [`VERDICT_TTL`] after it, and neither
//! a start nor a reload under load sends every session to read the same table at
//! once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::watch;

use super::session::Session;
use super::state::AloneReason;
use crate::error::Result;
use crate::rewrite::bound::{self, Learn, Verdict, VERDICT_TTL};
use crate::rewrite::{MergeTable, Rewritten};
use crate::wire::resultset::text_cells;

/// Verdicts per table (lower-cased database and name).
#[derive(Debug)]
pub struct MergeTables {
    verdicts: Mutex<Verdicts>,
    /// Bumped whenever a reading ends (stored or abandoned), under the map's lock:
    /// what sessions waiting for another's reading watch.
    readings: watch::Sender<u64>,
}

/// The verdicts, and how many times they were forgotten (rule reloads): a reading
/// that began before a reload is not stored after it.
#[derive(Debug, Default)]
struct Verdicts {
    by_table: HashMap<(String, String), Entry>,
    generation: u64,
}

impl Default for MergeTables {
    fn default() -> Self {
        MergeTables {
            verdicts: Mutex::default(),
            readings: watch::Sender::new(0),
        }
    }
}

#[derive(Debug)]
struct Entry {
    /// When the verdict's reading began; `None` before the first one finished.
    at: Option<Instant>,
    verdict: Verdict,
    /// When a session began reading the table again (one at a time).
    rechecking: Option<Instant>,
}

/// How long one session's reading may take before another session may start one
/// (its connection failed or hangs), and how long the others wait for it before
/// their writes run alone.
const RECHECK_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What [`MergeTables::lookup`] found.
enum Lookup {
    /// Whether the table is free.
    Known(bool),
    /// The caller learns it and stores the verdict (with this generation).
    Learn(u64),
    /// Missing or stale, and another session is reading the table: the caller
    /// waits for a change of the receiver (subscribed under the map's lock, so no
    /// ending reading is missed) and asks again (a stale verdict is never used).
    Rechecking(watch::Receiver<u64>),
}

impl MergeTables {
    fn verdicts(&self) -> std::sync::MutexGuard<'_, Verdicts> {
        self.verdicts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the sessions waiting for a reading (called under the verdicts' lock).
    fn reading_ended(&self) {
        self.readings.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn lookup(&self, t: &MergeTable) -> Lookup {
        let mut verdicts = self.verdicts();
        let generation = verdicts.generation;
        match verdicts.by_table.get_mut(&t.key) {
            Some(e) if e.at.is_some_and(|at| at.elapsed() < VERDICT_TTL) => {
                Lookup::Known(e.verdict == Verdict::Free)
            }
            Some(e) if e.rechecking.is_some_and(|r| r.elapsed() < RECHECK_LIMIT) => {
                Lookup::Rechecking(self.readings.subscribe())
            }
            Some(e) => {
                e.rechecking = Some(Instant::now());
                Lookup::Learn(generation)
            }
            None => {
                verdicts.by_table.insert(
                    t.key.clone(),
                    Entry {
                        at: None,
                        verdict: Verdict::Bound("not learned yet".into()),
                        rechecking: Some(Instant::now()),
                    },
                );
                Lookup::Learn(generation)
            }
        }
    }

    /// Stores a verdict read from `learned_at` on, unless the verdicts were forgotten
    /// since its reading began (`generation`); whether it was stored.
    fn store(
        &self,
        t: &MergeTable,
        verdict: Verdict,
        learned_at: Instant,
        generation: u64,
    ) -> bool {
        let mut verdicts = self.verdicts();
        let current = verdicts.generation == generation;
        if current {
            verdicts.by_table.insert(
                t.key.clone(),
                Entry {
                    at: Some(learned_at),
                    verdict,
                    rechecking: None,
                },
            );
        }
        self.reading_ended();
        current
    }

    /// A reading that failed: the next session may start one.
    fn abandon(&self, t: &MergeTable) {
        let mut verdicts = self.verdicts();
        if let Some(e) = verdicts.by_table.get_mut(&t.key) {
            e.rechecking = None;
        }
        self.reading_ended();
    }

    /// Forgets every verdict (a rule reload).
    pub fn clear(&self) {
        let mut verdicts = self.verdicts();
        verdicts.by_table.clear();
        verdicts.generation = verdicts.generation.wrapping_add(1);
    }
}

impl Session {
    /// Whether an execution that may merge ([`Session::merge_part`] said so) may run
    /// on another session's connection as far as its table goes; counts it as run
    /// alone (`connection_bound`) when not.
    pub(super) async fn merge_table_free(&mut self, rw: &Rewritten) -> Result<bool> {
        let merger = rw.merge.clone();
        let (free, reason) = match merger.as_deref().and_then(|m| m.table()) {
            None => (false, AloneReason::ConnectionBound),
            Some(t) => {
                let until = tokio::time::Instant::now() + RECHECK_LIMIT;
                loop {
                    match self.shared.merge_tables.lookup(t) {
                        Lookup::Known(free) => break (free, AloneReason::ConnectionBound),
                        Lookup::Learn(generation) => {
                            break match self.learn_merge_table(t, generation).await? {
                                Some(v) => (v == Verdict::Free, AloneReason::ConnectionBound),
                                // Read across a rule reload: not kept, and this
                                // write runs alone as while another session reads.
                                None => (false, AloneReason::TableRecheck),
                            };
                        }
                        Lookup::Rechecking(mut readings) => {
                            // Another session is reading the table: its verdict, or
                            // its failure (then this one may read it), is a change.
                            match tokio::time::timeout_at(until, readings.changed()).await {
                                Ok(Ok(())) => continue,
                                Ok(Err(_)) | Err(_) => break (false, AloneReason::TableRecheck),
                            }
                        }
                    }
                }
            }
        };
        if !free {
            self.count_alone(reason);
        }
        Ok(free)
    }

    /// Learns `t`'s verdict on this connection and stores it.
    /// `None` when the rules were reloaded while it read: the verdict is not kept.
    async fn learn_merge_table(
        &mut self,
        t: &MergeTable,
        generation: u64,
    ) -> Result<Option<Verdict>> {
        // The verdict stands from when the reading began.
        let started = Instant::now();
        let mut learn = Learn::new(&t.db, &t.name, t.expects_own_trigger);
        while let Some(q) = learn.query() {
            let c = match self.run_collect(q.as_bytes()).await {
                Ok(c) => c,
                Err(e) => {
                    self.shared.merge_tables.abandon(t);
                    return Err(e);
                }
            };
            if c.err().is_some() {
                // A server without these tables (MariaDB < 10.6 has no
                // SQL_FUNCTIONS), or one the user may not read.
                learn.take([None]);
                continue;
            }
            let rows = c.text_rows(self.link.deprecate_eof);
            let found: Vec<_> = c
                .packets
                .get(rows)
                .unwrap_or_default()
                .iter()
                .map(|p| text_cells(&p.payload).and_then(|cells| bound::found(&cells)))
                .collect();
            learn.take(found);
        }
        let verdict = learn
            .verdict()
            .cloned()
            .unwrap_or_else(|| Verdict::Bound("not learned".into()));
        if !self
            .shared
            .merge_tables
            .store(t, verdict.clone(), started, generation)
        {
            // The rules were reloaded while it read (perhaps after a trigger changed):
            // what it read may be older than the reload. The next write reads the
            // table again.
            return Ok(None);
        }
        match &verdict {
            Verdict::Free => {
                tracing::debug!(db = %t.db, table = %t.name, "merged writes may run on any connection")
            }
            Verdict::Bound(why) => tracing::info!(
                db = %t.db,
                table = %t.name,
                reason = %why,
                "writes into this table run alone on their own connections (no group commit)"
            ),
        }
        Ok(Some(verdict))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> MergeTable {
        MergeTable {
            db: "d".into(),
            name: "t".into(),
            expects_own_trigger: false,
            key: ("d".into(), "t".into()),
        }
    }

    #[test]
    fn one_session_reads_a_missing_verdict_the_others_wait_for_it() {
        let tables = MergeTables::default();
        let t = table();
        assert!(matches!(tables.lookup(&t), Lookup::Learn(_)));
        // Meanwhile nobody else reads it, and nobody uses a verdict: they wait for
        // the reading to end.
        let Lookup::Rechecking(waiting) = tables.lookup(&t) else {
            panic!("a second reading")
        };
        assert!(!waiting.has_changed().unwrap());
        assert!(tables.store(&t, Verdict::Free, Instant::now(), 0));
        assert!(waiting.has_changed().unwrap());
        assert!(matches!(tables.lookup(&t), Lookup::Known(true)));
    }

    #[test]
    fn an_abandoned_first_reading_is_taken_up_by_the_next_session() {
        let tables = MergeTables::default();
        let t = table();
        assert!(matches!(tables.lookup(&t), Lookup::Learn(_)));
        let Lookup::Rechecking(waiting) = tables.lookup(&t) else {
            panic!("a second reading")
        };
        tables.abandon(&t);
        // The one waiting hears of it and reads the table itself.
        assert!(waiting.has_changed().unwrap());
        assert!(matches!(tables.lookup(&t), Lookup::Learn(_)));
        assert!(matches!(tables.lookup(&t), Lookup::Rechecking(_)));
        assert!(tables.store(&t, Verdict::Bound("a trigger".into()), Instant::now(), 0));
        assert!(matches!(tables.lookup(&t), Lookup::Known(false)));
        // A reload forgets it: read again, by one session.
        tables.clear();
        assert!(matches!(tables.lookup(&t), Lookup::Learn(_)));
        assert!(matches!(tables.lookup(&t), Lookup::Rechecking(_)));
    }

    #[test]
    fn a_stale_verdict_is_read_again_by_one_session() {
        let tables = MergeTables::default();
        let t = table();
        let Some(long_ago) = Instant::now().checked_sub(VERDICT_TTL * 2) else {
            return;
        };
        assert!(tables.store(&t, Verdict::Free, long_ago, 0));
        assert!(matches!(tables.lookup(&t), Lookup::Learn(_)));
        assert!(matches!(tables.lookup(&t), Lookup::Rechecking(_)));
    }

    #[test]
    fn a_reading_begun_before_a_reload_is_not_kept() {
        let tables = MergeTables::default();
        let t = table();
        let Lookup::Learn(before) = tables.lookup(&t) else {
            panic!("no reading")
        };
        tables.clear();
        let Lookup::Learn(after) = tables.lookup(&t) else {
            panic!("no reading after the reload")
        };
        // The older reading ends first: not stored; the newer one is.
        assert!(!tables.store(&t, Verdict::Free, Instant::now(), before));
        assert!(matches!(tables.lookup(&t), Lookup::Rechecking(_)));
        assert!(tables.store(
            &t,
            Verdict::Bound("a trigger".into()),
            Instant::now(),
            after
        ));
        assert!(matches!(tables.lookup(&t), Lookup::Known(false)));
    }
}
