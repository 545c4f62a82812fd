//! Aggregate reads of the log, answered from the rollup.

use sqlparser::ast::Query;

use super::plan::RollupRule;
use crate::rewrite::{Plan, PlanContext};

/// The plan answering `q` from the rollup, or `None` when the rollup cannot answer
/// it exactly (the read then goes to the log unchanged).
pub(super) fn plan_read(_rule: &RollupRule, _q: &Query, _ctx: &PlanContext<'_>) -> Option<Plan> {
    None
}
