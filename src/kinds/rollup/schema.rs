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
//!   PRIMARY KEY (track_id, hs_bucket, country, hs_nulls, hs_slot)
//! ) ENGINE=InnoDB
//! ```
//!
//! The key starts with the first dimension and the bucket: the reads a rollup
//! serves fix the first dimension (a track) and ask for a time range, which is then
//! one contiguous range of the clustered index whatever the other dimensions are.
//! (Tables made with the earlier order, all dimensions before `hs_nulls,
//! hs_bucket`, are still accepted; `check` suggests rebuilding them.)
//!
//! A group (dimension values, bucket) is the sum over its slot rows; a group whose
//! `SUM(hs_rows)` is 0 has no log rows (all were deleted) and is not shown.
//!
//! Details of the layout as `migrate` writes it: columns in the order above (the
//! dimensions in rule order, then the `hs_count_<col>` of every `count(col)` and
//! `sum(col)` in measure order, then the `hs_sum_<col>`); the table takes the log's
//! default character set and collation. The zero value stored for a NULL dimension
//! is `0` for numbers and `YEAR`, `''` for strings, `'1000-01-01'` for `DATE`,
//! `'1000-01-01 00:00:00'` for `DATETIME`, `'00:00:00'` for `TIME` and the first
//! member for `ENUM`. `hs_sum_<col>` has the scale of `col` (0 for integers).
//!
//! ## Triggers
//!
//! Three triggers on the log per rollup, `<rollup_table>_hs_ins`, `_hs_upd` and
//! `_hs_del` (`AFTER` each event), upsert the row's contribution (+1 / −1 and its
//! measures) into slot `CONNECTION_ID() % slots` of its group (one writer keeps to
//! one row per group, so concurrent writers meet on a row only when their connection
//! ids collide, and a statement touching several groups cannot cross another's
//! locks on slot rows it picked at random); the update trigger
//! subtracts `OLD` and adds `NEW`, and does nothing when no column the rollup reads
//! changed. They run in the writer's transaction, so a rolled-back write leaves no
//! trace. Several rollups of one log each have their own three triggers; their order
//! does not matter (each writes its own table).
//!
//! ## Online backfill (`migrate --apply`, when the log has rows and the rollup none)
//!
//! 1. `LOCK TABLES log WRITE, rollup WRITE` (held for milliseconds: no transaction
//!    can hold uncommitted changes to the log while it is granted); under it, check
//!    that the rollup is still empty, create the missing triggers, and on a second
//!    connection `START TRANSACTION WITH CONSISTENT SNAPSHOT`; then `UNLOCK TABLES`.
//!    Call that instant T: the snapshot holds exactly the log as of T, and every
//!    change committed after T went through the triggers.
//! 2. On the snapshot connection (plain consistent reads: no row locks, writers are
//!    never blocked), aggregate the log by chunks of 10,000 primary-key values
//!    (`GROUP BY` the same expressions the triggers use) and add each chunk's groups
//!    to slot 0 of the rollup with `INSERT … ON DUPLICATE KEY UPDATE hs_rows =
//!    hs_rows + VALUES(hs_rows), …` in short autocommit statements on the first
//!    connection.
//!
//! Exactness: the additions commute, so at the end rollup = aggregate(log at T) + Σ
//! trigger deltas after T, and Σ trigger deltas after T = aggregate(log now) −
//! aggregate(log at T): every insert after T adds its row, every update subtracts
//! the row as it was and adds it as it is, every delete subtracts the row as it was
//! (for a row that existed at T, the first change subtracts exactly what the
//! snapshot counts). Hence rollup = aggregate(log now), whatever writers do
//! meanwhile. The snapshot keeps old row versions from being purged while the
//! backfill runs. The log needs a single-column integer primary key for the chunks;
//! without one a non-empty log is refused (an empty one needs no backfill).
//!
//! The chunks run through the job runner ([`crate::jobs`]): progress, throttle, and
//! one transaction per chunk holding its upserts and its progress row in
//! `heatsink_jobs`. A backfill stopped half way leaves a partial rollup and an
//! unfinished progress row; the next `migrate --apply` continues it. For that, under
//! the lock of step 1 a backfill also notes its last key `end` (the log's largest
//! key at T, in the comment of `<rollup>_backfill_delta`) and creates three delta
//! triggers (`<rollup>_hs_bf_ins/_upd/_del`) that append, in the writer's
//! transaction, the change the rollup's trigger makes to a row with a key up to
//! `end`, with that key, to the delta table. The next run, under the same lock,
//! subtracts the delta table's changes to keys after the position from the rollup
//! and empties it in one transaction, then takes a new snapshot and goes on from the
//! position up to `end` (the argument: `docs/design.md`, "Long jobs"). When the last
//! chunk is committed the delta triggers and table are dropped. A stopped backfill
//! whose delta table or triggers are incomplete starts over instead: under the lock
//! it empties the rollup (`TRUNCATE`), which puts it in the state of one created at
//! that instant (no writer in flight, every trigger delta so far gone with the
//! partial sums), and starts a new backfill. A non-empty rollup
//! whose triggers are missing has missed writes and is refused: drop the remaining
//! triggers, empty it and run `migrate --apply` again.

use mysql_async::Conn;

use crate::kinds::SchemaError;
use crate::rules::spec::{quote, TableName};
use crate::schema::{
    enforced, inspect_base_table, inspect_table, integer_max, needed_trigger,
    refuse_changing_foreign_keys, resolve_tables, suffixed_name, table_has_rows, table_options,
    Column, Table, MAX_IDENT,
};

pub(crate) use super::checked::{
    counted, layout, primary_key, summed, CheckedRollup, Dimension, Measured, Resume,
};
use super::spec::{Measure, RollupSpec};

/// Longest primary key InnoDB takes, in bytes.
const MAX_KEY_BYTES: u32 = 3072;

/// The backfill's name as a job (its progress row in `heatsink_jobs`).
pub const BACKFILL: &str = "backfill";

/// Suffix of the backfill's delta table's name.
pub(crate) const DELTA_SUFFIX: &str = "_backfill_delta";

/// The start of the delta table's comment; the last key the backfill covers follows.
const DELTA_COMMENT: &str = "heatsink: changes to log rows with a key <= ";

/// One of the three triggers on the log.
pub(crate) use crate::schema::{NeededTrigger as Trigger, TriggerState};

type SchemaResult<T> = std::result::Result<T, SchemaError>;

/// Checks one rollup rule against the database.
pub(crate) async fn check(
    conn: &mut Conn,
    spec: &RollupSpec,
    default_db: Option<&str>,
) -> SchemaResult<CheckedRollup> {
    let refuse = SchemaError::Refused;
    spec.validate().map_err(refuse)?;
    let (log, rollup) = resolve(spec, default_db)?;
    let table = inspect_log(conn, &log).await?;
    // Its triggers keep the rollup; a cascade changes the log without them.
    let kept = format!("the rollup table {}", rollup.quoted());
    refuse_changing_foreign_keys(&log, &enforced(conn, &log).await?, &kept)?;
    let (time, utc) = time_column(spec, &table, &log)?;
    let dims = dimensions(spec, &table, &log)?;
    let measures = measured(spec, &table, &log)?;
    let pk = integer_pk(&table);
    let mut checked = CheckedRollup {
        spec: spec.clone(),
        log,
        rollup,
        pk,
        dims,
        time,
        utc,
        measures,
        create_table: None,
        triggers: Vec::new(),
        backfill_due: false,
        restart: false,
        resume: None,
        delta: TableName {
            db: None,
            name: String::new(),
        },
        delta_create: String::new(),
        stale_delta: false,
        job: crate::jobs::JobKey {
            db: String::new(),
            rule: spec.name.clone(),
            job: BACKFILL,
        },
        legacy_key: false,
        notes: Vec::new(),
    };
    let existing = inspect_table(conn, &checked.rollup).await?;
    match &existing {
        Some(t) => checked.legacy_key = rollup_table_fits(&checked, t).map_err(refuse)?,
        None => checked.create_table = Some(create_table_sql(&checked, &table)),
    }
    checked.triggers = plan_triggers(conn, &checked).await?;
    let rollup_has_rows = match existing {
        Some(_) => table_has_rows(conn, &checked.rollup).await?,
        None => false,
    };
    let log_has_rows = table_has_rows(conn, &checked.log).await?;
    let missing = checked
        .triggers
        .iter()
        .any(|t| t.state == TriggerState::Missing);
    if rollup_has_rows && missing {
        return Err(refuse(format!(
            "{} holds rows but its triggers on {} are missing, so it may have missed writes; drop its remaining triggers, empty it (TRUNCATE) and run migrate again to rebuild it",
            checked.rollup.quoted(),
            checked.log.quoted()
        )));
    }
    checked.job.db = checked.log.db.clone().unwrap_or_default();
    checked.delta = delta_table(&checked.rollup);
    checked.delta_create = delta_create_sql(&checked, &table);
    let job = crate::jobs::state(conn, &checked.job)
        .await
        .map_err(SchemaError::Failed)?;
    checked.restart = !missing && job.as_ref().is_some_and(|s| s.unfinished());
    let delta = delta_state(conn, &checked).await?;
    if checked.restart {
        // The position is a key the backfill wrote; anything else starts over.
        let numeric = |p: &str| {
            let digits = p.strip_prefix('-').unwrap_or(p);
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        };
        let job = job.filter(|j| j.position.as_deref().is_none_or(numeric));
        if let (Some(end), Some(job)) = (&delta.complete, &job) {
            checked.resume = Some(Resume {
                end: end.clone(),
                position: job.position.clone(),
                rows_done: job.rows_done,
            });
        }
    }
    checked.stale_delta = delta.any && checked.resume.is_none();
    checked.backfill_due = (log_has_rows && !rollup_has_rows) || checked.restart;
    if checked.backfill_due && checked.pk.is_none() {
        return Err(refuse(format!(
            "{} has rows and no single-column integer primary key, which the online backfill of {} reads it by",
            checked.log.quoted(),
            checked.rollup.quoted()
        )));
    }
    if log_has_rows && rollup_has_rows && !checked.restart {
        checked.notes.push(format!(
            "no backfill: {} already holds rows",
            checked.rollup.quoted()
        ));
    }
    Ok(checked)
}

/// The backfill's delta table of `rollup`, in its database.
pub(crate) fn delta_table(rollup: &TableName) -> TableName {
    TableName {
        db: rollup.db.clone(),
        name: suffixed_name(&rollup.name, DELTA_SUFFIX),
    }
}

/// The delta trigger of `event` on the log, named after the rollup table.
pub(crate) fn delta_trigger(rule: &CheckedRollup, event: super::triggers::Event) -> TableName {
    TableName {
        db: rule.log.db.clone(),
        name: suffixed_name(&rule.rollup.name, event.delta_suffix()),
    }
}

/// The delta table's comment naming `end`, the backfill's last key.
pub(crate) fn delta_comment(end: &str) -> String {
    format!("{DELTA_COMMENT}{end}")
}

/// `CREATE TABLE IF NOT EXISTS` of the delta table: an append-only list of the
/// changes the rollup's triggers made to log rows with keys up to the backfill's
/// last key (each with the row's key), in the rollup's group columns (no slot).
fn delta_create_sql(rule: &CheckedRollup, log: &Table) -> String {
    let pk_type = rule
        .pk
        .as_deref()
        .and_then(|pk| log.column(pk))
        .map_or_else(|| "BIGINT".to_string(), |c| c.column_type.clone());
    let mut lines = vec![
        "  `hs_seq` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT".to_string(),
        format!("  {} {pk_type} NOT NULL", quote(super::triggers::DELTA_PK)),
    ];
    lines.extend(
        layout(rule)
            .into_iter()
            .filter(|(n, _)| n != "hs_slot")
            .map(|(name, ty)| format!("  {} {ty} NOT NULL", quote(&name))),
    );
    lines.push("  PRIMARY KEY (`hs_seq`)".into());
    lines.push(format!("  KEY ({})", quote(super::triggers::DELTA_PK)));
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n{}\n) {}",
        rule.delta.quoted(),
        lines.join(",\n"),
        table_options(log)
    )
}

/// What of a backfill's delta table and triggers exists.
struct DeltaState {
    /// The delta table or one of the delta triggers exists.
    any: bool,
    /// The backfill's last key, when the table and all three triggers exist and
    /// the triggers' bodies are those of that key.
    complete: Option<String>,
}

async fn delta_state(conn: &mut Conn, rule: &CheckedRollup) -> SchemaResult<DeltaState> {
    use mysql_async::prelude::Queryable;
    let comment: Option<Option<String>> = conn
        .exec_first(
            "SELECT TABLE_COMMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (
                rule.delta.db.clone().unwrap_or_default(),
                rule.delta.name.clone(),
            ),
        )
        .await
        .map_err(|e| crate::schema::schema_err(format!("reading {}", rule.delta.quoted()), e))?;
    let table = comment.is_some();
    let end = comment
        .flatten()
        .and_then(|c| c.strip_prefix(DELTA_COMMENT).map(str::to_string))
        .filter(|e| {
            let digits = e.strip_prefix('-').unwrap_or(e);
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        });
    let mut any = table;
    let mut complete = end.is_some();
    for event in super::triggers::EVENTS {
        let name = delta_trigger(rule, event);
        let Some(t) = crate::schema::existing_trigger(conn, &name).await? else {
            complete = false;
            continue;
        };
        any = true;
        let body = end
            .as_deref()
            .map(|end| super::triggers::delta_body(rule, event, end));
        let fits = t.table.eq_ignore_ascii_case(&rule.log.name)
            && t.timing.eq_ignore_ascii_case("AFTER")
            && t.event.eq_ignore_ascii_case(event.sql())
            && body
                .is_some_and(|b| crate::schema::normalize(&b) == crate::schema::normalize(&t.body));
        complete &= fits;
    }
    Ok(DeltaState {
        any,
        complete: end.filter(|_| complete),
    })
}

/// The log and the rollup table, each with its database: the rule's prefix, else
/// `default_db` for the log and the log's database for the rollup.
fn resolve(spec: &RollupSpec, default_db: Option<&str>) -> SchemaResult<(TableName, TableName)> {
    let (log, physical) = resolve_tables(&spec.table, &[&spec.rollup_table], default_db)?;
    let [rollup] = <[TableName; 1]>::try_from(physical)
        .map_err(|_| SchemaError::Refused("internal error: one rollup table".into()))?;
    Ok((log, rollup))
}

/// Reads the log; refused when it is missing or not a base table.
async fn inspect_log(conn: &mut Conn, log: &TableName) -> SchemaResult<Table> {
    inspect_base_table(conn, log).await
}

/// The time column's name as the log spells it, and whether it is a TIMESTAMP
/// (buckets of UTC) rather than a DATETIME (buckets of its wall-clock value).
fn time_column(spec: &RollupSpec, table: &Table, log: &TableName) -> SchemaResult<(String, bool)> {
    let col = table.column(&spec.time).ok_or_else(|| {
        SchemaError::Refused(format!(
            "time column `{}` is not a column of {}",
            spec.time,
            log.quoted()
        ))
    })?;
    match col.data_type.as_str() {
        "datetime" => Ok((col.name.clone(), false)),
        "timestamp" => Ok((col.name.clone(), true)),
        _ => Err(SchemaError::Refused(format!(
            "time column `{}` is {}, not DATETIME or TIMESTAMP",
            col.name, col.column_type
        ))),
    }
}

/// The dimensions with their zero values; refused when one is missing, cannot be a
/// primary-key column, or the key would be too long.
fn dimensions(spec: &RollupSpec, table: &Table, log: &TableName) -> SchemaResult<Vec<Dimension>> {
    // hs_nulls, hs_bucket, hs_slot.
    let mut bytes = 4 + 8 + 2;
    let mut dims = Vec::new();
    for d in &spec.dimensions {
        let col = table.column(d).ok_or_else(|| {
            SchemaError::Refused(format!(
                "dimension `{d}` is not a column of {}",
                log.quoted()
            ))
        })?;
        let (zero, size) = key_type(col).map_err(|why| {
            SchemaError::Refused(format!(
                "dimension `{}` is {}: {why}",
                col.name, col.column_type
            ))
        })?;
        bytes += size;
        dims.push(Dimension {
            column: col.clone(),
            zero,
        });
    }
    if bytes > MAX_KEY_BYTES {
        return Err(SchemaError::Refused(format!(
            "the dimensions make a primary key of up to {bytes} bytes, over InnoDB's {MAX_KEY_BYTES}; use shorter columns or fewer dimensions"
        )));
    }
    Ok(dims)
}

/// The zero value (SQL) and the largest key size in bytes of a dimension's type;
/// `Err(reason)` when it cannot be a `NOT NULL` primary-key column of the rollup.
pub(crate) fn key_type(col: &Column) -> std::result::Result<(String, u32), String> {
    let t = col.data_type.as_str();
    if integer_max(t, false).is_some() {
        return Ok(("0".into(), 8));
    }
    let ok = |zero: &str, size: u32| Ok((zero.to_string(), size));
    match t {
        "decimal" | "numeric" => ok("0", 33),
        "char" | "varchar" | "binary" | "varbinary" => {
            let len = type_args(&col.column_type)
                .first()
                .and_then(|n| n.trim().parse::<u32>().ok())
                .ok_or_else(|| "its length is unknown".to_string())?;
            let size = len
                .saturating_mul(charset_bytes(col.charset.as_deref()))
                .saturating_add(2);
            if size > MAX_KEY_BYTES {
                return Err(format!(
                    "up to {size} bytes, longer than a primary-key column may be ({MAX_KEY_BYTES})"
                ));
            }
            ok("''", size)
        }
        "date" => ok("'1000-01-01'", 3),
        "datetime" => ok("'1000-01-01 00:00:00'", 8),
        "time" => ok("'00:00:00'", 6),
        "year" => ok("0", 1),
        "enum" => first_enum_member(&col.column_type)
            .map(|m| (m, 2))
            .ok_or_else(|| "its members are unknown".to_string()),
        "float" | "double" | "real" => {
            Err("approximate numbers make poor group keys; use DECIMAL".into())
        }
        "timestamp" => {
            Err("TIMESTAMP values depend on the session time zone; not supported as a dimension".into())
        }
        _ => Err(
            "a rollup's primary key cannot hold it (TEXT, BLOB, JSON, SET, BIT and geometry types are not supported as dimensions)"
                .into(),
        ),
    }
}

/// Bytes per character of a character set (4 when unknown; 1 for binary strings).
fn charset_bytes(charset: Option<&str>) -> u32 {
    match charset.map(str::to_ascii_lowercase).as_deref() {
        None | Some("binary" | "latin1" | "latin2" | "ascii" | "cp1250" | "cp1251" | "cp1252") => 1,
        Some("ucs2" | "gbk" | "big5" | "sjis" | "cp932" | "euckr" | "gb2312") => 2,
        Some("utf8" | "utf8mb3" | "ujis" | "eucjpms") => 3,
        _ => 4,
    }
}

/// The arguments in the parentheses of a `COLUMN_TYPE` (`decimal(10,2)` → `10`, `2`).
fn type_args(column_type: &str) -> Vec<&str> {
    let Some(open) = column_type.find('(') else {
        return Vec::new();
    };
    let Some(close) = column_type[open..].find(')') else {
        return Vec::new();
    };
    column_type[open + 1..open + close].split(',').collect()
}

/// The first member of an `enum('a','b')` type, as an SQL literal.
fn first_enum_member(column_type: &str) -> Option<String> {
    let open = column_type.find("('")?;
    let rest = &column_type[open + 2..];
    let mut end = 0;
    let bytes = rest.as_bytes();
    loop {
        let at = rest[end..].find('\'')? + end;
        if bytes.get(at + 1) == Some(&b'\'') {
            end = at + 2;
        } else {
            return Some(format!("'{}'", &rest[..at]));
        }
    }
}

/// The measures with their scales; refused when a measured column is missing or a
/// summed one is not an exact number.
fn measured(spec: &RollupSpec, table: &Table, log: &TableName) -> SchemaResult<Vec<Measured>> {
    let refuse = SchemaError::Refused;
    let mut out = Vec::new();
    for m in spec.parsed_measures().map_err(refuse)? {
        let mut scale = 0;
        let measure = match &m {
            Measure::Rows => m.clone(),
            Measure::Count(c) | Measure::Sum(c) => {
                let col = table.column(c).ok_or_else(|| {
                    refuse(format!(
                        "measured column `{c}` is not a column of {}",
                        log.quoted()
                    ))
                })?;
                if format!("hs_count_{}", col.name).len() > MAX_IDENT {
                    return Err(refuse(format!(
                        "measured column `{c}`: hs_count_{c} would be longer than {MAX_IDENT} characters"
                    )));
                }
                if let Measure::Sum(_) = m {
                    scale = sum_scale(col).map_err(|why| {
                        refuse(format!(
                            "sum({}) : `{}` is {}, {why}",
                            c, col.name, col.column_type
                        ))
                    })?;
                    Measure::Sum(col.name.clone())
                } else {
                    Measure::Count(col.name.clone())
                }
            }
        };
        out.push(Measured { measure, scale });
    }
    Ok(out)
}

/// The scale of a summed column; `Err` unless it is an integer or DECIMAL.
fn sum_scale(col: &Column) -> std::result::Result<u32, String> {
    if col.is_integer() {
        return Ok(0);
    }
    match col.data_type.as_str() {
        "decimal" | "numeric" => Ok(type_args(&col.column_type)
            .get(1)
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)),
        "float" | "double" | "real" => {
            Err("an approximate number, which the rollup cannot sum exactly".into())
        }
        _ => Err("not a number".into()),
    }
}

/// The log's primary key when it is one integer column.
fn integer_pk(table: &Table) -> Option<String> {
    match table.primary.as_deref() {
        Some([one]) => table
            .column(one)
            .filter(|c| c.is_integer())
            .map(|c| c.name.clone()),
        _ => None,
    }
}

/// The primary key order of rollup tables made before [`primary_key`]'s: every
/// dimension, then the NULL bits, the bucket and the slot. Reads are exact on it,
/// only slower (a time range does not narrow the clustered index).
fn legacy_primary_key(rule: &CheckedRollup) -> Vec<String> {
    let mut key: Vec<String> = rule.dims.iter().map(|d| d.column.name.clone()).collect();
    key.extend(["hs_nulls", "hs_bucket", "hs_slot"].map(String::from));
    key
}

fn create_table_sql(rule: &CheckedRollup, log: &Table) -> String {
    let mut lines: Vec<String> = layout(rule)
        .into_iter()
        .map(|(name, ty)| format!("  {} {ty} NOT NULL", quote(&name)))
        .collect();
    let key: Vec<String> = primary_key(rule).iter().map(|c| quote(c)).collect();
    lines.push(format!("  PRIMARY KEY ({})", key.join(", ")));
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n{}\n) {}",
        rule.rollup.quoted(),
        lines.join(",\n"),
        table_options(log)
    )
}

/// `Err(reason)` unless an existing rollup table has the layout's columns (types,
/// `NOT NULL`) and primary key; other columns must be omittable.
/// `Ok(true)`: the table has the legacy key order ([`legacy_primary_key`]).
fn rollup_table_fits(rule: &CheckedRollup, t: &Table) -> std::result::Result<bool, String> {
    let name = rule.rollup.quoted();
    let dims = rule.dims.len();
    for (i, (col, ty)) in layout(rule).iter().enumerate() {
        let Some(have) = t.column(col) else {
            return Err(format!(
                "{name} exists but has no column `{col}`; drop or fix it"
            ));
        };
        let fits = if i < dims {
            have.same_type(&rule.dims[i].column)
        } else {
            fixed_type_fits(have, ty)
        };
        if !fits || have.nullable {
            return Err(format!(
                "{name} exists but its column `{col}` is {}{} instead of {ty} NOT NULL; drop or fix it",
                have.type_sql(),
                if have.nullable { " NULL" } else { "" }
            ));
        }
    }
    let want = primary_key(rule);
    let is = |want: &[String]| {
        t.primary.as_ref().is_some_and(|pk| {
            pk.len() == want.len() && pk.iter().zip(want).all(|(a, b)| a.eq_ignore_ascii_case(b))
        })
    };
    let legacy = !is(&want) && is(&legacy_primary_key(rule));
    if !is(&want) && !legacy {
        return Err(format!(
            "{name} exists but its primary key is not ({}); drop or fix it",
            want.join(", ")
        ));
    }
    let known: Vec<String> = layout(rule).into_iter().map(|(n, _)| n).collect();
    if let Some(extra) = t
        .columns
        .iter()
        .find(|c| !known.iter().any(|k| k.eq_ignore_ascii_case(&c.name)) && !c.omittable)
    {
        return Err(format!(
            "{name} has column `{}` without a default, which the triggers would not fill",
            extra.name
        ));
    }
    Ok(legacy)
}

/// Whether an existing column has one of the layout's own types (`INT UNSIGNED`,
/// `DATETIME`, `SMALLINT UNSIGNED`, `BIGINT`, `DECIMAL(65,s)`).
fn fixed_type_fits(have: &Column, want: &str) -> bool {
    let ct = have.column_type.to_ascii_lowercase();
    let unsigned = have.is_unsigned();
    match want {
        "INT UNSIGNED" => have.data_type == "int" && unsigned,
        "SMALLINT UNSIGNED" => have.data_type == "smallint" && unsigned,
        "BIGINT" => have.data_type == "bigint" && !unsigned,
        "DATETIME" => ct == "datetime",
        decimal => ct.replace(' ', "") == decimal.to_ascii_lowercase(),
    }
}

/// The three triggers and their state; refused when a trigger of one of their names
/// is not an `AFTER` trigger of the right event on the log.
async fn plan_triggers(conn: &mut Conn, rule: &CheckedRollup) -> SchemaResult<Vec<Trigger>> {
    let mut out = Vec::new();
    let galera = crate::schema::on_galera(conn).await?;
    for event in super::triggers::EVENTS {
        let name = TableName {
            db: rule.log.db.clone(),
            name: suffixed_name(&rule.rollup.name, event.suffix()),
        };
        let body = super::triggers::body(rule, event, galera);
        let create = super::triggers::create_sql(rule, &name, event, &body);
        out.push(
            needed_trigger(
                conn,
                name,
                (&rule.log, event.sql()),
                &body,
                create,
                "the rollup table",
            )
            .await?,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, data_type: &str, column_type: &str, charset: Option<&str>) -> Column {
        Column {
            name: name.into(),
            data_type: data_type.into(),
            column_type: column_type.into(),
            charset: charset.map(str::to_string),
            collation: None,
            nullable: true,
            omittable: true,
            default: None,
            extra: String::new(),
        }
    }

    #[test]
    fn key_types_and_zero_values() {
        let zero = |c: Column| key_type(&c).map(|(z, _)| z);
        assert_eq!(zero(col("a", "int", "int(11)", None)).unwrap(), "0");
        assert_eq!(
            zero(col("a", "varchar", "varchar(255)", Some("utf8mb4"))).unwrap(),
            "''"
        );
        assert_eq!(
            zero(col("a", "enum", "enum('it''s','b')", None)).unwrap(),
            "'it''s'"
        );
        assert!(zero(col("a", "varchar", "varchar(1000)", Some("utf8mb4"))).is_err());
        for (dt, ct) in [
            ("text", "text"),
            ("longtext", "longtext"),
            ("blob", "blob"),
            ("set", "set('a')"),
            ("bit", "bit(1)"),
            ("float", "float"),
            ("double", "double"),
            ("point", "point"),
        ] {
            assert!(zero(col("a", dt, ct, None)).is_err(), "{dt}");
        }
    }

    #[test]
    fn sum_scales() {
        assert_eq!(
            sum_scale(&col("a", "decimal", "decimal(10,3)", None)),
            Ok(3)
        );
        assert_eq!(
            sum_scale(&col("a", "bigint", "bigint(20) unsigned", None)),
            Ok(0)
        );
        assert!(sum_scale(&col("a", "double", "double", None)).is_err());
        assert!(sum_scale(&col("a", "varchar", "varchar(3)", None)).is_err());
    }
}
