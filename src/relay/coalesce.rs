//! Group commit: concurrent autocommit writes to one target merged into one write.
//!
//! What merges, and how, is the rule kind's business ([`crate::rewrite::Merger`],
//! `kinds/<kind>/merge.rs`; for example counter increments become one slot upsert
//! of the summed deltas, ring inserts one multi-row upsert). Here a member
//! contributes a [`Part`]: its numbers are summed over the batch (a part whose sum
//! would overflow is not merged), its items and text are bounded by the kind's
//! [`Limits`].
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

pub use crate::rewrite::merge::{Limits, Part};

/// Writes merged into one.
#[derive(Debug)]
pub struct Batch {
    /// The members' parts in arrival order: member `i` contributed `parts[i]`.
    pub parts: Vec<Part>,
    /// Member `i`'s channel; `None` for the member holding the batch (and for one
    /// whose session went away).
    waiters: Vec<Option<oneshot::Sender<Signal>>>,
    /// Summed [`Part::sums`] of the parts.
    pub sums: Vec<i64>,
    /// Items of the parts.
    items: u64,
    /// Text bytes of the parts.
    bytes: usize,
    /// The batch's bounds.
    limits: Limits,
}

impl Batch {
    /// A batch holding one part, of the member holding it.
    pub fn new(part: Part, limits: Limits) -> Self {
        let mut b = Batch {
            parts: Vec::new(),
            waiters: Vec::new(),
            sums: vec![0; part.sums.len()],
            items: 0,
            bytes: 0,
            limits,
        };
        b.push(part, None);
        b
    }

    /// Adds a part unless the batch cannot take it (a sum would overflow, the
    /// number of sums differs, the batch is full); the part is returned then.
    fn try_add(&mut self, part: Part, waiter: oneshot::Sender<Signal>) -> Result<(), Part> {
        if part.sums.len() != self.sums.len() {
            return Err(part);
        }
        let sums: Option<Vec<i64>> = self
            .sums
            .iter()
            .zip(&part.sums)
            .map(|(a, b)| a.checked_add(*b))
            .collect();
        let items = self.items.checked_add(part.items);
        let bytes = self.bytes.checked_add(part.text.len());
        if sums.is_none()
            || items.is_none_or(|n| n > self.limits.items)
            || bytes.is_none_or(|n| n > self.limits.bytes)
        {
            return Err(part);
        }
        self.push(part, Some(waiter));
        Ok(())
    }

    fn push(&mut self, part: Part, waiter: Option<oneshot::Sender<Signal>>) {
        for (s, v) in self.sums.iter_mut().zip(&part.sums) {
            *s = s.saturating_add(*v);
        }
        self.items = self.items.saturating_add(part.items);
        self.bytes = self.bytes.saturating_add(part.text.len());
        self.parts.push(part);
        self.waiters.push(waiter);
    }

    /// How many writes the batch merges.
    pub fn members(&self) -> usize {
        self.parts.len()
    }

    /// Items of the parts.
    pub fn items(&self) -> u64 {
        self.items
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
    /// Joins the group of target `key` with a part; a batch of this target is
    /// bounded by `limits`. `None` when the part cannot be merged (a sum would
    /// overflow, the pending batch is full): the caller writes it alone.
    pub fn join(&self, key: &[u8], part: Part, limits: Limits) -> Option<Role> {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let g = groups.entry(key.to_vec()).or_default();
        if !g.in_flight {
            g.in_flight = true;
            return Some(Role::Lead(Batch::new(part, limits), 0));
        }
        let (tx, rx) = oneshot::channel();
        match &mut g.pending {
            Some(batch) => batch.try_add(part, tx).ok()?,
            None => {
                let mut batch = Batch::new(part, limits);
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

    /// The summed numbers of the parts ([`Part::sums`]).
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

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Limits = Limits::NONE;

    fn d(v: i64) -> Part {
        Part {
            sums: vec![v],
            items: 1,
            ..Part::default()
        }
    }

    #[tokio::test]
    async fn batches_form_while_a_write_is_in_flight() {
        let c = Arc::new(Coalescer::default());
        let Some(Role::Lead(first, 0)) = c.join(b"k", d(1), NONE) else {
            panic!()
        };
        let Some(Role::Wait(w1)) = c.join(b"k", d(2), NONE) else {
            panic!()
        };
        let Some(Role::Wait(w2)) = c.join(b"k", d(3), NONE) else {
            panic!()
        };
        // Another target is independent.
        assert!(matches!(c.join(b"other", d(1), NONE), Some(Role::Lead(..))));
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
        // The target is idle again.
        assert!(matches!(c.join(b"k", d(1), NONE), Some(Role::Lead(..))));
    }

    #[tokio::test]
    async fn a_failed_leader_reports_and_hands_over() {
        let c = Arc::new(Coalescer::default());
        let Some(Role::Lead(first, 0)) = c.join(b"k", d(1), NONE) else {
            panic!()
        };
        let g = LeaderGuard::new(c.clone(), b"k".to_vec(), first);
        let Some(Role::Wait(w1)) = c.join(b"k", d(2), NONE) else {
            panic!()
        };
        drop(g);
        assert!(matches!(w1.await.unwrap(), Signal::Lead(_, 0)));
    }

    #[test]
    fn overflow_is_not_merged() {
        let c = Coalescer::default();
        let _lead = c.join(b"k", d(1), NONE);
        assert!(c.join(b"k", d(i64::MAX), NONE).is_some());
        assert!(c.join(b"k", d(1), NONE).is_none());
    }

    const BOUNDED: Limits = Limits {
        items: 512,
        bytes: 64 * 1024,
    };

    fn rows(n: u64, order: &str) -> Part {
        Part {
            text: b"(1)".repeat(n as usize),
            items: n,
            order: order.as_bytes().to_vec(),
            ..Part::default()
        }
    }

    #[tokio::test]
    async fn batches_are_bounded_and_answered_per_member() {
        let c = Arc::new(Coalescer::default());
        let Some(Role::Lead(first, 0)) = c.join(b"r", rows(1, "1"), BOUNDED) else {
            panic!()
        };
        let Some(Role::Wait(w1)) = c.join(b"r", rows(BOUNDED.items - 1, "2"), BOUNDED) else {
            panic!()
        };
        let Some(Role::Wait(w2)) = c.join(b"r", rows(1, "3"), BOUNDED) else {
            panic!()
        };
        // The pending batch is full.
        assert!(c.join(b"r", rows(1, "4"), BOUNDED).is_none());
        LeaderGuard::new(c.clone(), b"r".to_vec(), first).resolve(Ok(OkSummary::default()));
        let Signal::Lead(next, 0) = w1.await.unwrap() else {
            panic!()
        };
        assert_eq!((next.members(), next.items()), (2, BOUNDED.items));
        LeaderGuard::new(c.clone(), b"r".to_vec(), next).resolve_each(|i| {
            assert_eq!(i, 1);
            Signal::Alone
        });
        assert!(matches!(w2.await.unwrap(), Signal::Alone));
    }
}
