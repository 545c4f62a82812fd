//! The rollup's schema work: the rollup table `heatsink migrate` creates for a rollup
//! rule, the triggers that keep it exact, its online backfill, and what `check
//! --backend-url` reports about it.
//!
//! ## The rollup table (the contract with `plan.rs`)
//!
//! ```sql
//! CREATE TABLE plays_by_country_day (
//!   `track_id` INT NOT NULL,             -- each dimension: the log's type, charset and
//!   `country` VARCHAR(255) … NOT NULL,   --   collation, NOT NULL (a NULL value is stored
//!                                        --   as the type's zero value, see hs_nulls)
//!   `hs_nulls` INT UNSIGNED NOT NULL,    -- bit i: dimension i is NULL; bit 31: time is NULL
//!   `hs_bucket` DATETIME NOT NULL,       -- start of the bucket holding the time value
//!                                        --   ('1000-01-01 00:00:00' when it is NULL)
//!   `hs_slot` SMALLINT UNSIGNED NOT NULL,
//!   `hs_rows` BIGINT NOT NULL,           -- count(*)
//!   `hs_count_<col>` BIGINT NOT NULL,    -- count(col), one per measure
//!   `hs_sum_<col>` DECIMAL(65,s) NOT NULL, -- sum(col) (with hs_count_<col> for NULLs)
//!   PRIMARY KEY (track_id, country, hs_nulls, hs_bucket, hs_slot)
//! ) ENGINE=InnoDB
//! ```
//!
//! A group (dimension values, bucket) is the sum over its slot rows; a group whose
//! `SUM(hs_rows)` is 0 has no log rows (all were deleted) and is not shown.
use crate::kinds::SchemaError;

use super::spec::RollupSpec;

/// A rollup rule checked against the database.
pub(crate) struct CheckedRollup;

#[async_trait::async_trait(?Send)]
impl crate::kinds::Migration for CheckedRollup {
    async fn problems(
        &self,
        _conn: &mut mysql_async::Conn,
    ) -> crate::error::Result<Vec<(crate::check::Severity, String)>> {
        Ok(Vec::new())
    }

    async fn run(
        &self,
        _conn: &mut mysql_async::Conn,
        _apply: bool,
        _out: &mut dyn std::io::Write,
    ) -> crate::error::Result<()> {
        Ok(())
    }
}

/// Checks one rollup rule against the database.
pub(crate) async fn check(
    _conn: &mut mysql_async::Conn,
    _spec: &RollupSpec,
    _default_db: Option<&str>,
) -> std::result::Result<CheckedRollup, SchemaError> {
    Err(SchemaError::Refused(
        "migrate does not create rollup tables yet".into(),
    ))
}
