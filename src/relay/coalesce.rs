//! Group commit for counter increments (`coalesce = true`).
//!
//! Concurrent autocommit increments of the same counter are merged into one slot
//! upsert of +Σn. Per counter at most one merged write is in flight: the session
//! that finds the counter idle becomes the *leader* and writes its own increment at
//! once (no added latency when there is no contention); increments arriving while
//! that write is in flight join the *pending* batch. When the write completes, every
//! member of the finished batch gets its OK — only now, after the write committed,
//! so an OK still means durable — and the pending batch is handed to one of its
//! members, which becomes the next leader and writes the batch on its own backend
//! connection.
//!
//! Nothing is kept in proxy memory longer than one write: a crash of the proxy loses
//! only increments whose clients have not been answered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::wire::packets::OkSummary;

/// The outcome of a merged write: its OK summary, or the ERR payload every member
/// receives.
pub type Outcome = Result<OkSummary, Vec<u8>>;

/// Increments merged into one write.
#[derive(Debug)]
pub struct Batch {
    /// Summed deltas, one per counter column.
    pub sums: Vec<i64>,
    /// Members other than the one holding the batch, waiting for the outcome.
    waiters: Vec<oneshot::Sender<Signal>>,
}

impl Batch {
    /// A batch holding one increment.
    pub fn new(deltas: &[i64]) -> Self {
        Batch {
            sums: deltas.to_vec(),
            waiters: Vec::new(),
        }
    }

    /// How many increments the batch merges.
    pub fn members(&self) -> usize {
        self.waiters.len() + 1
    }
}

/// What a waiting member is told.
#[derive(Debug)]
pub enum Signal {
    /// The write containing your increment finished.
    Done(Outcome),
    /// Your batch is next: write it (your own increment is included).
    Lead(Batch),
}

/// What a session joining a counter's group must do.
#[derive(Debug)]
pub enum Role {
    /// Write this batch now.
    Lead(Batch),
    /// Wait for a signal.
    Wait(oneshot::Receiver<Signal>),
}

#[derive(Debug, Default)]
struct Group {
    /// A merged write of this counter is in flight.
    in_flight: bool,
    /// Increments waiting for the next write.
    pending: Option<Batch>,
}

/// The per-server group-commit coordinator.
#[derive(Debug, Default)]
pub struct Coalescer {
    /// Counters with a write in flight, by group key.
    groups: Mutex<HashMap<Vec<u8>, Group>>,
}

impl Coalescer {
    /// Joins the group of counter `key` with an increment. `None` when the increment
    /// cannot be merged (its sum would overflow): the caller writes it alone.
    pub fn join(&self, key: &[u8], deltas: &[i64]) -> Option<Role> {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let g = groups.entry(key.to_vec()).or_default();
        if !g.in_flight {
            g.in_flight = true;
            return Some(Role::Lead(Batch::new(deltas)));
        }
        let batch = g.pending.get_or_insert_with(|| Batch {
            sums: vec![0; deltas.len()],
            waiters: Vec::new(),
        });
        if batch.sums.len() != deltas.len() {
            return None;
        }
        let sums: Option<Vec<i64>> = batch
            .sums
            .iter()
            .zip(deltas)
            .map(|(a, b)| a.checked_add(*b))
            .collect();
        batch.sums = sums?;
        let (tx, rx) = oneshot::channel();
        batch.waiters.push(tx);
        Some(Role::Wait(rx))
    }

    /// Ends the write of a leader: hands the pending batch to one of its members,
    /// or marks the counter idle.
    fn finish(&self, key: &[u8]) {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let Some(g) = groups.get_mut(key) else {
            return;
        };
        while let Some(mut batch) = g.pending.take() {
            if batch.waiters.is_empty() {
                // Every member joined with a delta of its own but was a waiter; an
                // empty batch cannot exist. Be safe: nothing to write.
                break;
            }
            let next = batch.waiters.remove(0);
            match next.send(Signal::Lead(batch)) {
                Ok(()) => return,
                // That member's session is gone (its task was cancelled); its
                // increment was never acknowledged. Hand the batch to the next one.
                Err(Signal::Lead(b)) if !b.waiters.is_empty() => g.pending = Some(b),
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
    /// Guards `batch` of counter `key`.
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

    /// Reports the write's outcome to every member and hands over the next batch.
    pub fn resolve(mut self, outcome: Outcome) {
        if let Some(b) = self.batch.take() {
            for w in b.waiters {
                let _ = w.send(Signal::Done(outcome.clone()));
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
                "heatsink: the connection writing this increment failed; it may or may not have been applied",
            );
            for w in b.waiters {
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
        let Some(Role::Lead(first)) = c.join(b"k", &[1]) else {
            panic!()
        };
        let Some(Role::Wait(w1)) = c.join(b"k", &[2]) else {
            panic!()
        };
        let Some(Role::Wait(w2)) = c.join(b"k", &[3]) else {
            panic!()
        };
        // Another counter is independent.
        assert!(matches!(c.join(b"other", &[1]), Some(Role::Lead(_))));
        let g = LeaderGuard::new(c.clone(), b"k".to_vec(), first);
        assert_eq!(g.sums(), &[1]);
        g.resolve(Ok(OkSummary::default()));
        // w1 leads the pending batch holding 2 + 3.
        let Signal::Lead(next) = w1.await.unwrap() else {
            panic!()
        };
        assert_eq!(next.sums, vec![5]);
        assert_eq!(next.members(), 2);
        let g = LeaderGuard::new(c.clone(), b"k".to_vec(), next);
        g.resolve(Ok(OkSummary::default()));
        assert!(matches!(w2.await.unwrap(), Signal::Done(Ok(_))));
        // The counter is idle again.
        assert!(matches!(c.join(b"k", &[1]), Some(Role::Lead(_))));
    }

    #[tokio::test]
    async fn a_failed_leader_reports_and_hands_over() {
        let c = Arc::new(Coalescer::default());
        let Some(Role::Lead(first)) = c.join(b"k", &[1]) else {
            panic!()
        };
        let g = LeaderGuard::new(c.clone(), b"k".to_vec(), first);
        let Some(Role::Wait(w1)) = c.join(b"k", &[2]) else {
            panic!()
        };
        drop(g);
        assert!(matches!(w1.await.unwrap(), Signal::Lead(_)));
    }

    #[test]
    fn overflow_is_not_merged() {
        let c = Coalescer::default();
        let _lead = c.join(b"k", &[1]);
        assert!(c.join(b"k", &[i64::MAX]).is_some());
        assert!(c.join(b"k", &[1]).is_none());
    }
}
