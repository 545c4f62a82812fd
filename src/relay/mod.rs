//! The data path: one task per client connection, relaying to its own backend
//! connection (1:1), following the command/response state machine only as far as it
//! must to find response boundaries and to splice in rewritten statements.
//!
//! - [`response`]: where a response ends (pure state machine, unit-tested).
//! - `link`: a session's client and backend connections and the packet I/O between
//!   them (responses streamed in bulk, or read whole).
//! - [`session`]: the per-connection task (handshake, auth, command loop).
//! - [`shared`]: what all sessions of a server share (config, rules, counters).
//! - [`coalesce`]: group commit: who writes a merged batch, who waits.
//! - [`state`]: what the relay knows of the backend session's state (from the
//!   server's session state tracking), and whether a statement may join a merged
//!   write.
//! - `splice`: running rewritten statements on the client's connection and shaping
//!   the reply the original statement would have produced.
//! - `bound`: whether a merged write's table has triggers or defaults that read
//!   the connection (`rewrite::bound`), learned and kept per table.
//! - `merge`: writing a merged batch as the rule kind's merger
//!   (`rewrite::Merger`) builds it, and answering each member.

mod bound;
pub mod coalesce;
mod link;
mod merge;
mod prepared;
pub mod response;
pub mod session;
pub mod shared;
mod splice;
pub mod state;

pub use bound::MergeTables;
pub use session::{serve_client, LEARN_PACKET_LIMIT_AT};
pub use shared::{Shared, Stats};
