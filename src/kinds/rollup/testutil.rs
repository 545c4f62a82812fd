//! Engines over rollup rules for the planners' unit tests.

use std::sync::Arc;

use super::spec::RollupSpec;
use super::RollupRule;
use crate::rewrite::testutil::col;
use crate::rewrite::{Engine, Rule};
use crate::wire::resultset::types;

/// A day rollup of `plays` by (track_id, country).
pub const DAY_RULE: &str =
    "[[rollup]]\nname = \"by_day\"\ntable = \"plays\"\nrollup_table = \"plays_by_day\"\n\
     time = \"created_at\"\nbucket = \"day\"\ndimensions = [\"track_id\", \"country\"]\n";

/// An engine over the `[[rollup]]` rules of `toml`, with the log's columns (id,
/// created_at DATETIME, track_id, country, ms) known for database `shop`.
pub fn engine_of(toml: &str) -> Engine {
    engine_with_time(toml, types::DATETIME)
}

/// [`engine_of`] with `created_at` of type `time` (a protocol type).
pub fn engine_with_time(toml: &str, time: u8) -> Engine {
    let specs: Vec<RollupSpec> = crate::kinds::entries(toml, "rollup").unwrap();
    let rules: Vec<Arc<dyn Rule>> = specs
        .iter()
        .map(|s| Arc::new(RollupRule::new(s).unwrap()) as Arc<dyn Rule>)
        .collect();
    let n = rules.len();
    let e = Engine::new(rules, 100).unwrap();
    let columns = [
        col("plays", "id", types::LONGLONG, 0x4203),
        col("plays", "created_at", time, 0x4008),
        col("plays", "track_id", types::LONG, 0x4008),
        col("plays", "country", 0xfd, 0),
        col("plays", "ms", types::LONG, 0),
    ];
    for rule in 0..n {
        e.provide_metadata(rule, Some("shop"), &columns);
    }
    e
}
