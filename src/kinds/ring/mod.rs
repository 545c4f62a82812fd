//! The ring kind: "keep the last N per key" logs stored as fixed-size rings.

pub mod merge;
pub mod plan;

pub use plan::RingRule;
