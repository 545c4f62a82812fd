//! The counter kind: hot single-row counters spread over slot rows, summed on read.

pub mod compact;
pub mod merge;
pub mod plan;

pub use plan::CounterRule;
