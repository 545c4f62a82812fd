//! The ring's schema work: what `heatsink migrate` creates and backfills for a ring
//! rule, and what `check --backend-url` reports about it.
//!
//! A `[[ring]]` rule stores a "keep the last N per key" log as fixed-size rings (see
//! [`crate::rewrite::ring`]). From the logical (log) table the command derives:
//!
//! 1. the ring table: every logical column with its exact type, character set,
//!    collation, nullability, default, `ON UPDATE` and `AUTO_INCREMENT` (the log's
//!    `AUTO_INCREMENT` column gets a secondary `KEY (<ai>)`), but without the log's
//!    keys; then `<slot_column> SMALLINT UNSIGNED NOT NULL` (`INT UNSIGNED` when
//!    `size` > 65535) and `<seq_column> BIGINT UNSIGNED NOT NULL`, neither with a
//!    default; `PRIMARY KEY (key…, slot)`. Key columns are `NOT NULL` there even when
//!    the log's are nullable (rows with a NULL key cannot be kept);
//! 2. the sequence table: the key columns (exact types), `<seq_column> BIGINT UNSIGNED
//!    NOT NULL`, `PRIMARY KEY (key…)`. A ring without key columns has one sequence
//!    row, held in place by a `single_row` column whose default every insert repeats;
//! 3. `<ring_table>_hs_seq`, a `BEFORE INSERT` trigger on the ring table that numbers
//!    every row inserted into it: it takes the key's next sequence number from the
//!    sequence table (`INSERT … VALUES (NEW.k…, LAST_INSERT_ID(1)) ON DUPLICATE KEY
//!    UPDATE seq = LAST_INSERT_ID(seq + 1)`, read back with `LAST_INSERT_ID()`, which
//!    MariaDB restores when the trigger ends) and sets `seq` and `slot = seq % size`.
//!    The rule's inserts give both as NULL, so without the trigger they fail (1048)
//!    instead of filling slot 0;
//! 4. the trigger on the log described below.
//!
//! The rule is refused when the log is missing or not a base table, a key column is
//! missing or TEXT/BLOB, the slot or sequence column name is already a logical column,
//! `order_by` is not a column, the log has generated columns (ring inserts assign
//! every column), an existing ring or sequence table does not fit (for instance the
//! log's `AUTO_INCREMENT` column is not `AUTO_INCREMENT` in the ring), or a trigger of
//! one of the two names exists that is not `BEFORE INSERT` on the ring, respectively
//! `AFTER INSERT` on the log.
//!
//! **Backfill and the switch.** With `--apply`, when the ring table is new (or it and
//! the sequence table are both empty, e.g. after an interrupted backfill) and the log
//! has rows, each key's latest `size` rows are copied into the ring: "latest" by
//! `order_by` then the primary key, or by the primary key alone. A copied row keeps
//! its id; its sequence number is its position in the key's full history
//! (`ROW_NUMBER()` over the key, oldest first) and its slot that number modulo
//! `size`; the sequence table gets each key's row count, so new inserts continue after
//! the history. The backfill runs before `<ring_table>_hs_seq` exists (the trigger
//! would renumber the copied rows; an existing one is dropped for the backfill and
//! created again). Then the ring's `AUTO_INCREMENT` counter is raised to the log's
//! (`ALTER TABLE … AUTO_INCREMENT`) when it is lower, so ids keep increasing across the
//! switch and inserts through heatsink report the ids the log would have given.
//!
//! Clients rarely all move to heatsink at the same instant, so the command also
//! installs `<ring_table>_hs_log`, an `AFTER INSERT` trigger on the log that mirrors a
//! row appended to the log directly into the ring: the row with its id, slot and
//! sequence NULL (the ring's trigger numbers it) and the rule's guarded upsert; rows
//! with a NULL key are skipped; the appending client's `LAST_INSERT_ID()` is untouched.
//! The backfill, the counter and both triggers' creation happen under `LOCK TABLES log
//! WRITE, ring WRITE, seq WRITE`, so every row appended to the log is counted exactly
//! once, backfilled or mirrored: the rule can be switched on while the application
//! keeps inserting, and no row that belongs in the latest N is lost. Appends and reads
//! of the log wait for the backfill. Inside that one transaction the backfill fills
//! the sequence table first, then the ring in chunks of whole keys (their ranges read
//! from the sequence table) as a job of [`crate::jobs::run_owned`], which shows its
//! progress and keeps to the throttle; stopped, it rolls back whole. Once every client goes through heatsink nothing
//! appends to the log any more and the trigger is idle; it keeps the ring in step with
//! writers that bypass heatsink.

use std::io::Write;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::spec::RingSpec;
use crate::error::{Error, Result, Source};
use crate::kinds::SchemaError;
use crate::rules::spec::{quote, TableName};
use crate::schema::*;

/// Suffix of the trigger on a ring rule's log that mirrors direct appends into the ring.
pub const RING_TRIGGER_SUFFIX: &str = "_hs_log";

/// Suffix of the trigger on a ring table that numbers its rows (sequence and slot).
pub const SEQ_TRIGGER_SUFFIX: &str = "_hs_seq";

/// Column of a keyless ring's sequence table: every insert repeats its default, so the
/// table keeps exactly one row.
pub const SINGLE_ROW: &str = "single_row";

/// The backfill's derived column: a row's position in its key's history (1 = oldest).
const POS: &str = "__heatsink_pos";

/// The backfill's derived column: the number of rows in the key's history.
const COUNT: &str = "__heatsink_count";

/// A ring rule checked against the database.
#[derive(Debug, Clone)]
pub(crate) struct CheckedRing {
    /// The rule as written.
    pub spec: RingSpec,
    /// The log table, database resolved.
    pub logical: TableName,
    /// The ring table, database resolved.
    pub ring: TableName,
    /// The sequence table, database resolved.
    pub seq: TableName,
    /// Key columns, spelled as in the log.
    pub key: Vec<String>,
    /// `CREATE TABLE` for a missing ring table; `None` when it exists and fits.
    pub create_ring: Option<String>,
    /// `CREATE TABLE` for a missing sequence table; `None` when it exists and fits.
    pub create_seq: Option<String>,
    /// The backfill (ring rows, then sequence values); `None` when the log gives no
    /// order to tell the latest rows by (then it must be empty).
    pub backfill: Option<[String; 2]>,
    /// The ring part of the backfill per chunk of keys (see
    /// [`ring_backfill_chunks`]); `None` without key columns.
    pub backfill_chunks: Option<[String; 3]>,
    /// Whether the backfill is due: the log has rows and the ring and sequence tables
    /// are new or empty. Checked again under the table locks when applying.
    pub backfill_due: bool,
    /// The log's `AUTO_INCREMENT` column, if any.
    pub auto_inc: Option<String>,
    /// Unique keys of the log (name, columns) the ring does not enforce: all but a
    /// key of the `AUTO_INCREMENT` column alone, whose generated ids are unique.
    pub unenforced_unique: Vec<(String, Vec<String>)>,
    /// The log's next id when the ring's counter is below it (checked again when
    /// applying): the ring's `AUTO_INCREMENT` is raised to it.
    pub raise_auto_inc: Option<u64>,
    /// The trigger on the ring that numbers its rows.
    pub seq_trigger_name: TableName,
    /// What to do about that trigger.
    pub seq_trigger: TriggerPlan,
    /// The statement creating it (also to create it again after a backfill).
    pub create_seq_trigger: String,
    /// The trigger on the log that mirrors rows appended to it directly.
    pub trigger_name: TableName,
    /// What to do about that trigger.
    pub trigger: TriggerPlan,
    /// The log's BEFORE INSERT triggers, copied to the ring (rows inserted through
    /// heatsink go there), created after the numbering trigger and before it in
    /// firing order.
    pub copied_triggers: Vec<CopiedTrigger>,
    /// Remarks for the operator (printed as comments).
    pub notes: Vec<String>,
}

/// A trigger of the log copied to the ring table.
#[derive(Debug, Clone)]
pub(crate) struct CopiedTrigger {
    /// The log's trigger, for messages.
    pub original: TableName,
    /// The copy's name: `<ring>__<trigger>`.
    pub name: TableName,
    /// Its `CREATE TRIGGER` statement.
    pub create: String,
    /// Whether it exists already.
    pub exists: bool,
}

/// What the ring table keeps of what the log enforces: the log's CHECK constraints
/// and foreign keys as `CREATE TABLE` elements (name, definition).
#[derive(Debug, Clone, Default)]
struct KeptConstraints {
    /// Table-level CHECKs: (name, definition).
    checks: Vec<(String, String)>,
    /// Column-level CHECKs, kept on the same column (the server's message names them
    /// `table.column`): (column, clause).
    column_checks: Vec<(String, String)>,
    foreign_keys: Vec<(String, String)>,
}

/// Resolves a ring rule's tables to a database: the rule's prefix, else
/// `default_db`; unqualified ring and sequence tables live next to the log.
pub(crate) fn resolve_ring(
    spec: &RingSpec,
    default_db: Option<&str>,
) -> std::result::Result<(TableName, TableName, TableName), SchemaError> {
    let seq = spec.seq_table_name();
    let (logical, physical) = resolve_tables(&spec.table, &[&spec.ring_table, &seq], default_db)?;
    let [ring, seq] = <[TableName; 2]>::try_from(physical)
        .map_err(|_| SchemaError::Refused("internal error: ring and sequence tables".into()))?;
    Ok((logical, ring, seq))
}

/// A schema check's outcome: refusals and backend failures are [`SchemaError`]s.
type SchemaResult<T> = std::result::Result<T, SchemaError>;

/// Checks one ring rule against the database and works out the DDL and backfill it
/// needs. A refusal is [`SchemaError::Refused`]; backend failures are
/// [`SchemaError::Failed`].
pub(crate) async fn check_ring(
    conn: &mut Conn,
    spec: &RingSpec,
    default_db: Option<&str>,
) -> SchemaResult<CheckedRing> {
    let refuse = SchemaError::Refused;
    spec.validate().map_err(refuse)?;
    let (logical, ring, seq) = resolve_ring(spec, default_db)?;
    let table = inspect_log(conn, &logical).await?;
    let mut notes = Vec::new();
    let key_cols = ring_key_columns(spec, &table, &logical, &mut notes)?;
    let key: Vec<String> = key_cols.iter().map(|c| c.name.clone()).collect();
    check_ring_column_names(spec, &table, &logical)?;
    let order_by = order_by_column(spec, &table, &logical)?;
    note_engine(&table, &logical, &mut notes);
    let auto_inc = auto_increment_column(&table, &mut notes);
    let log_enforced = enforced(conn, &logical).await?;
    let kept = kept_constraints(&logical, &ring, &log_enforced, &key)?;

    let existing_ring = inspect_table(conn, &ring).await?;
    let create_ring = plan_ring_table(spec, &ring, existing_ring.as_ref(), &table, &key, &kept)?;
    if existing_ring.is_some() {
        missing_constraints(conn, &ring, &kept).await?;
    }
    let existing_seq = inspect_table(conn, &seq).await?;
    let create_seq = plan_seq_table(spec, &seq, existing_seq.as_ref(), &table, &key_cols)?;

    let tables = [&logical, &ring, &seq];
    let existing = (existing_ring.is_some(), existing_seq.is_some());
    let backfill_due = check_backfill_due(conn, tables, existing, &mut notes).await?;
    let order = backfill_order(&table, order_by.as_deref());
    let backfill = plan_backfill(
        spec,
        tables,
        &table,
        &key_cols,
        (&order, order_by.is_some()),
        backfill_due,
        &mut notes,
    )?;
    let backfill_chunks = backfill
        .as_ref()
        .and_then(|_| ring_backfill_chunks(spec, &logical, &ring, &table, &key_cols, &order));
    let raise_auto_inc =
        ring_auto_inc_raise(conn, &logical, &ring, existing_ring.is_some(), &auto_inc).await?;

    let (seq_trigger_name, create_seq_trigger, seq_trigger) =
        plan_seq_trigger(conn, spec, &ring, &seq, &key_cols, &mut notes).await?;
    let (trigger_name, trigger) =
        plan_log_trigger(conn, spec, (&logical, &ring), &table, &key_cols, &mut notes).await?;
    let copied_triggers = copied_triggers(
        conn,
        (&logical, &ring),
        &log_enforced,
        &trigger_name,
        &seq_trigger_name,
    )
    .await?;

    let unenforced_unique = unenforced_unique_keys(&table, &auto_inc);
    Ok(CheckedRing {
        spec: spec.clone(),
        logical,
        ring,
        seq,
        key,
        create_ring,
        create_seq,
        backfill,
        backfill_chunks,
        backfill_due,
        auto_inc,
        unenforced_unique,
        raise_auto_inc,
        seq_trigger_name,
        seq_trigger,
        create_seq_trigger,
        trigger_name,
        trigger,
        copied_triggers,
        notes,
    })
}

/// The log's CHECK constraints and foreign keys, as the ring table keeps them: every
/// CHECK under its own name (the server's 4025 then names the same constraint), and
/// every foreign key under `<ring>__<name>` (foreign key names are per database).
/// Refused when the log is referenced by another table (rows inserted through
/// heatsink never reach the log, so rows referencing them would be refused), or a
/// foreign key's action would change the ring's rows in a way the ring cannot keep:
/// `ON UPDATE CASCADE` or `SET NULL` of a key column (a key's rows would move to
/// another key's ring, whose sequence does not know them), or an `ON DELETE` action
/// that deletes or changes some of a key's rows (`ON DELETE CASCADE` on columns that
/// are not all key columns).
fn kept_constraints(
    logical: &TableName,
    ring: &TableName,
    enforced: &Enforced,
    key: &[String],
) -> SchemaResult<KeptConstraints> {
    let refuse = SchemaError::Refused;
    if let Some(fk) = enforced.referenced_by.first() {
        return Err(refuse(format!(
            "foreign key {} of {} references {}, but rows inserted through heatsink are kept \
             in the ring {}, never in the log, so rows referencing them would be refused \
             (1452): drop the constraint or the rule",
            fk.describe(),
            fk.child.quoted(),
            logical.quoted(),
            ring.quoted()
        )));
    }
    let mut kept = KeptConstraints::default();
    for fk in &enforced.foreign_keys {
        let on_key = fk.columns.iter().any(|c| is_in(key, c));
        let all_key = fk.columns.iter().all(|c| is_in(key, c));
        let delete = fk.on_delete.to_ascii_uppercase();
        let reason = if changes_rows(&fk.on_update) && on_key {
            Some("its ON UPDATE action changes key columns, which would move rows to another key's ring without their sequence")
        } else if changes_rows(&delete) && delete != "CASCADE" && on_key {
            Some("its ON DELETE action changes key columns, which are NOT NULL in the ring")
        } else if delete == "CASCADE" && !all_key {
            Some("ON DELETE CASCADE on columns that are not all key columns deletes some of a key's rows, after which the ring and the log keep different rows")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(refuse(format!(
                "foreign key {} of {}: {reason}: make it ON DELETE RESTRICT ON UPDATE \
                 RESTRICT (and delete the log's rows explicitly, whole keys at a time), or \
                 drop the rule",
                fk.describe(),
                logical.quoted()
            )));
        }
        let name = suffixed_name(&format!("{}__{}", ring.name, fk.name), "");
        let def = fk.definition(&name);
        kept.foreign_keys.push((name, def));
    }
    for c in &enforced.checks {
        if c.level.eq_ignore_ascii_case("Column") {
            kept.column_checks.push((c.name.clone(), c.clause.clone()));
        } else {
            kept.checks.push((c.name.clone(), c.definition()));
        }
    }
    Ok(kept)
}

/// Refuses an existing ring table that lacks one of the log's CHECK constraints or
/// foreign keys, with the statement that adds it.
async fn missing_constraints(
    conn: &mut Conn,
    ring: &TableName,
    kept: &KeptConstraints,
) -> SchemaResult<()> {
    let have = enforced(conn, ring).await?;
    let column_checks: Vec<(String, String)> = kept
        .column_checks
        .iter()
        .map(|(col, clause)| {
            (
                col.clone(),
                format!("CONSTRAINT {} CHECK ({clause})", quote(col)),
            )
        })
        .collect();
    let missing = kept
        .checks
        .iter()
        .chain(&column_checks)
        .filter(|(n, _)| !have.checks.iter().any(|c| c.name.eq_ignore_ascii_case(n)))
        .chain(kept.foreign_keys.iter().filter(|(n, _)| {
            !have
                .foreign_keys
                .iter()
                .any(|f| f.name.eq_ignore_ascii_case(n))
        }))
        .map(|(_, def)| format!("ALTER TABLE {} ADD {def}", ring.quoted()))
        .collect::<Vec<_>>();
    if missing.is_empty() {
        return Ok(());
    }
    Err(SchemaError::Refused(format!(
        "ring table {} lacks constraints of the log, so inserts the log refuses would be \
         kept; add them: {}",
        ring.quoted(),
        missing.join("; ")
    )))
}

/// The log's triggers other than the rule's own: a `BEFORE INSERT` trigger is copied
/// to the ring (rows inserted through heatsink go there) unless its body names the
/// log; any other trigger is refused, since nothing heatsink runs would fire it.
async fn copied_triggers(
    conn: &mut Conn,
    (logical, ring): (&TableName, &TableName),
    enforced: &Enforced,
    own: &TableName,
    seq_trigger: &TableName,
) -> SchemaResult<Vec<CopiedTrigger>> {
    let refuse = SchemaError::Refused;
    let mut out = Vec::new();
    let own = [own.name.as_str()];
    for t in enforced.other_triggers(&own) {
        let before_insert =
            t.timing.eq_ignore_ascii_case("BEFORE") && t.event.eq_ignore_ascii_case("INSERT");
        if !before_insert {
            return Err(refuse(format!(
                "trigger {} on {} would not fire for the rows heatsink keeps in the ring {}: \
                 drop it or the rule (BEFORE INSERT triggers are copied to the ring)",
                t.describe(),
                logical.quoted(),
                ring.quoted()
            )));
        }
        if t.body
            .to_ascii_lowercase()
            .contains(&logical.name.to_ascii_lowercase())
        {
            return Err(refuse(format!(
                "trigger {} on {} reads or names the log, which heatsink's inserts do not \
                 write (they go to the ring {}), so its copy on the ring would not do the \
                 same: drop it or the rule",
                t.describe(),
                logical.quoted(),
                ring.quoted()
            )));
        }
        let name = TableName {
            db: ring.db.clone(),
            name: suffixed_name(&format!("{}__{}", ring.name, t.name.name), ""),
        };
        let create = format!(
            "CREATE TRIGGER IF NOT EXISTS {} BEFORE INSERT ON {} FOR EACH ROW PRECEDES {} {}",
            name.quoted(),
            ring.quoted(),
            quote(&seq_trigger.name),
            t.body
        );
        let exists = existing_trigger(conn, &name).await?.is_some();
        out.push(CopiedTrigger {
            original: t.name.clone(),
            name,
            create,
            exists,
        });
    }
    Ok(out)
}

/// Reads the log table; refused when it is missing, not a base table, or has
/// generated columns (ring inserts assign every column).
async fn inspect_log(conn: &mut Conn, logical: &TableName) -> SchemaResult<Table> {
    let refuse = SchemaError::Refused;
    let table = inspect_base_table(conn, logical).await?;
    if let Some(c) = table.columns.iter().find(|c| c.extra.contains("generated")) {
        return Err(refuse(format!(
            "column `{}` of {} is generated; a ring table cannot hold it (ring inserts assign every column)",
            c.name,
            logical.quoted()
        )));
    }
    Ok(table)
}

/// The rule's key columns as the log defines them, with a note for each nullable one
/// (it is `NOT NULL` in the ring). Refused when one is missing or TEXT/BLOB.
fn ring_key_columns(
    spec: &RingSpec,
    table: &Table,
    logical: &TableName,
    notes: &mut Vec<String>,
) -> SchemaResult<Vec<Column>> {
    let mut key_cols: Vec<Column> = Vec::new();
    for k in &spec.key {
        let col = table
            .key_column(k, logical, "a ring table")
            .map_err(SchemaError::Refused)?;
        if col.nullable {
            notes.push(format!(
                "key column `{}` is nullable in the log but NOT NULL in the ring: rows whose key is NULL cannot be kept (the backfill skips them)",
                col.name
            ));
        }
        key_cols.push(col.clone());
    }
    Ok(key_cols)
}

/// Refuses a slot or sequence column name that is already a column of the log.
fn check_ring_column_names(
    spec: &RingSpec,
    table: &Table,
    logical: &TableName,
) -> SchemaResult<()> {
    for (what, c) in [
        ("slot_column", &spec.slot_column),
        ("seq_column", &spec.seq_column),
    ] {
        if table.column(c).is_some() {
            return Err(SchemaError::Refused(format!(
                "{what} `{c}` is already a column of {}; choose another name",
                logical.quoted()
            )));
        }
    }
    Ok(())
}

/// The rule's `order_by` column, spelled as in the log; refused when the log has no
/// such column.
fn order_by_column(
    spec: &RingSpec,
    table: &Table,
    logical: &TableName,
) -> SchemaResult<Option<String>> {
    let Some(o) = &spec.order_by else {
        return Ok(None);
    };
    let col = table.column(o).ok_or_else(|| {
        SchemaError::Refused(format!(
            "order_by column `{o}` is not a column of {}",
            logical.quoted()
        ))
    })?;
    Ok(Some(col.name.clone()))
}

/// Notes a log whose engine is not InnoDB (the ring tables are).
fn note_engine(table: &Table, logical: &TableName, notes: &mut Vec<String>) {
    if table
        .engine
        .as_deref()
        .is_some_and(|e| !e.eq_ignore_ascii_case("InnoDB"))
    {
        notes.push(format!(
            "{} uses {}; the ring tables are InnoDB",
            logical.quoted(),
            table.engine.as_deref().unwrap_or_default()
        ));
    }
}

/// The log's `AUTO_INCREMENT` column, if any, with a note that the ring keeps it.
fn auto_increment_column(table: &Table, notes: &mut Vec<String>) -> Option<String> {
    let auto_inc = table
        .columns
        .iter()
        .find(|c| c.extra.contains("auto_increment"))
        .map(|c| c.name.clone());
    if let Some(a) = &auto_inc {
        notes.push(format!(
            "`{a}` stays AUTO_INCREMENT in the ring: ids and last_insert_id continue the log's"
        ));
    }
    auto_inc
}

/// `CREATE TABLE` for the ring table when it is missing (`existing` is `None`);
/// refused when it exists but does not match the rule.
fn plan_ring_table(
    spec: &RingSpec,
    ring: &TableName,
    existing: Option<&Table>,
    table: &Table,
    key: &[String],
    kept: &KeptConstraints,
) -> SchemaResult<Option<String>> {
    let Some(existing) = existing else {
        return Ok(Some(create_ring_sql(spec, ring, table, key, kept)));
    };
    let problems = ring_table_problems(spec, existing, table, key);
    if !problems.is_empty() {
        return Err(SchemaError::Refused(format!(
            "ring table {} exists but does not match the rule: {}",
            ring.quoted(),
            problems.join("; ")
        )));
    }
    Ok(None)
}

/// `CREATE TABLE` for the sequence table when it is missing (`existing` is `None`);
/// refused when it exists but does not match the rule.
fn plan_seq_table(
    spec: &RingSpec,
    seq: &TableName,
    existing: Option<&Table>,
    table: &Table,
    key_cols: &[Column],
) -> SchemaResult<Option<String>> {
    let Some(existing) = existing else {
        return Ok(Some(create_seq_sql(spec, seq, table, key_cols)));
    };
    let problems = seq_table_problems(spec, existing, key_cols);
    if !problems.is_empty() {
        return Err(SchemaError::Refused(format!(
            "sequence table {} exists but does not match the rule: {}",
            seq.quoted(),
            problems.join("; ")
        )));
    }
    Ok(None)
}

/// Whether the backfill is due: the log (`tables[0]`) has rows and neither the ring
/// nor the sequence table (`tables[1]`, `tables[2]`; `exists` says which exist) does.
/// Notes a skipped backfill.
async fn check_backfill_due(
    conn: &mut Conn,
    [logical, ring, seq]: [&TableName; 3],
    (ring_exists, seq_exists): (bool, bool),
    notes: &mut Vec<String>,
) -> SchemaResult<bool> {
    let log_has_rows = table_has_rows(conn, logical).await?;
    let ring_has_rows = if ring_exists {
        table_has_rows(conn, ring).await?
    } else {
        false
    };
    let seq_has_rows = if seq_exists {
        table_has_rows(conn, seq).await?
    } else {
        false
    };
    let backfill_due = log_has_rows && !ring_has_rows && !seq_has_rows;
    if log_has_rows && !backfill_due {
        notes.push(format!(
            "no backfill: {} already holds rows",
            if ring_has_rows { ring } else { seq }.quoted()
        ));
    }
    Ok(backfill_due)
}

/// The order that tells a key's latest rows: `order_by`, then the primary key (else
/// the first unique key of `NOT NULL` columns) for ties. Empty when there is none.
fn backfill_order(table: &Table, order_by: Option<&str>) -> Vec<String> {
    let mut order: Vec<String> = order_by.iter().map(|o| o.to_string()).collect();
    let tiebreak = table.primary.clone().or_else(|| {
        table
            .unique
            .iter()
            .find(|(_, cols)| {
                cols.iter()
                    .all(|c| table.column(c).is_some_and(|c| !c.nullable))
            })
            .map(|(_, cols)| cols.clone())
    });
    for c in tiebreak.unwrap_or_default() {
        if !order.iter().any(|o| o.eq_ignore_ascii_case(&c)) {
            order.push(c);
        }
    }
    order
}

/// The backfill statements in `order` (`has_order_by`: it starts with `order_by`);
/// `None` when there is no order, refused when a due backfill has none.
fn plan_backfill(
    spec: &RingSpec,
    [logical, ring, seq]: [&TableName; 3],
    table: &Table,
    key_cols: &[Column],
    (order, has_order_by): (&[String], bool),
    backfill_due: bool,
    notes: &mut Vec<String>,
) -> SchemaResult<Option<[String; 2]>> {
    if order.is_empty() {
        if backfill_due {
            return Err(SchemaError::Refused(format!(
                "{} has rows but neither order_by nor a primary key says which are the latest; set order_by",
                logical.quoted()
            )));
        }
        return Ok(None);
    }
    if backfill_due && has_order_by && table.primary.is_none() {
        notes.push(format!(
            "{} has no primary key: rows with equal `{}` are backfilled in an arbitrary order",
            logical.quoted(),
            order[0]
        ));
    }
    Ok(Some(backfill_sql(
        spec, logical, ring, seq, table, key_cols, order,
    )))
}

/// The log's next id when the ring's `AUTO_INCREMENT` counter (1 for a new ring) is
/// below it; `None` without an `AUTO_INCREMENT` column.
async fn ring_auto_inc_raise(
    conn: &mut Conn,
    logical: &TableName,
    ring: &TableName,
    ring_exists: bool,
    auto_inc: &Option<String>,
) -> SchemaResult<Option<u64>> {
    let Some(a) = auto_inc else {
        return Ok(None);
    };
    let log_next = next_id(conn, logical, a).await?;
    let ring_next = if ring_exists {
        next_id(conn, ring, a).await?
    } else {
        1
    };
    Ok((log_next > ring_next).then_some(log_next))
}

/// The ring's numbering trigger: its name, its `CREATE TRIGGER` and what to do about
/// it; refused when a trigger of that name does something else.
async fn plan_seq_trigger(
    conn: &mut Conn,
    spec: &RingSpec,
    ring: &TableName,
    seq: &TableName,
    key_cols: &[Column],
    notes: &mut Vec<String>,
) -> SchemaResult<(TableName, String, TriggerPlan)> {
    let seq_trigger_name = TableName {
        db: ring.db.clone(),
        name: suffixed_name(&ring.name, SEQ_TRIGGER_SUFFIX),
    };
    let seq_body = seq_trigger_body(spec, seq, key_cols);
    let create_seq_trigger = format!(
        "CREATE TRIGGER IF NOT EXISTS {} BEFORE INSERT ON {} FOR EACH ROW {seq_body}",
        seq_trigger_name.quoted(),
        ring.quoted()
    );
    let seq_trigger = plan_insert_trigger(
        conn,
        &seq_trigger_name,
        (ring, "BEFORE"),
        &seq_body,
        create_seq_trigger.clone(),
        notes,
    )
    .await?
    .map_err(SchemaError::Refused)?;
    Ok((seq_trigger_name, create_seq_trigger, seq_trigger))
}

/// The log's mirroring trigger: its name and what to do about it; refused when a
/// trigger of that name does something else.
async fn plan_log_trigger(
    conn: &mut Conn,
    spec: &RingSpec,
    (logical, ring): (&TableName, &TableName),
    table: &Table,
    key_cols: &[Column],
    notes: &mut Vec<String>,
) -> SchemaResult<(TableName, TriggerPlan)> {
    let trigger_name = TableName {
        db: logical.db.clone(),
        name: suffixed_name(&ring.name, RING_TRIGGER_SUFFIX),
    };
    let body = ring_trigger_body(spec, ring, table, key_cols);
    let create = format!(
        "CREATE TRIGGER IF NOT EXISTS {} AFTER INSERT ON {} FOR EACH ROW {body}",
        trigger_name.quoted(),
        logical.quoted()
    );
    let trigger = plan_insert_trigger(
        conn,
        &trigger_name,
        (logical, "AFTER"),
        &body,
        create,
        notes,
    )
    .await?
    .map_err(SchemaError::Refused)?;
    Ok((trigger_name, trigger))
}

/// The log's unique keys the ring does not enforce: all but a key of the
/// `AUTO_INCREMENT` column alone.
fn unenforced_unique_keys(table: &Table, auto_inc: &Option<String>) -> Vec<(String, Vec<String>)> {
    table
        .unique
        .iter()
        .filter(|(_, cols)| {
            !matches!((cols.as_slice(), auto_inc), ([c], Some(a)) if c.eq_ignore_ascii_case(a))
        })
        .cloned()
        .collect()
}

/// A log column as a ring column: same type, nullability, default, `ON UPDATE` and
/// `AUTO_INCREMENT`; `NOT NULL` when it is part of the primary key.
fn ring_column_sql(c: &Column, in_key: bool) -> String {
    let nullable = c.nullable && !in_key;
    let mut s = format!(
        "  {} {} {}",
        quote(&c.name),
        c.type_sql(),
        if nullable { "NULL" } else { "NOT NULL" }
    );
    if let Some(d) = &c.default {
        if nullable || !d.eq_ignore_ascii_case("NULL") {
            s.push_str(&format!(" DEFAULT {d}"));
        }
    }
    if let Some(on) = on_update(&c.extra) {
        s.push_str(&format!(" ON UPDATE {on}"));
    }
    if c.extra.contains("auto_increment") {
        s.push_str(" AUTO_INCREMENT");
    }
    if c.extra.contains("invisible") {
        s.push_str(" INVISIBLE");
    }
    s
}

/// The slot column's type for `size` slots.
fn slot_type(size: u32) -> &'static str {
    if size > 65_535 {
        "INT UNSIGNED"
    } else {
        "SMALLINT UNSIGNED"
    }
}

/// `CREATE TABLE IF NOT EXISTS` for the ring table.
fn create_ring_sql(
    spec: &RingSpec,
    ring: &TableName,
    logical: &Table,
    key: &[String],
    kept: &KeptConstraints,
) -> String {
    let mut lines: Vec<String> = logical
        .columns
        .iter()
        .map(|c| {
            let mut line = ring_column_sql(c, is_in(key, &c.name));
            for (_, clause) in kept.column_checks.iter().filter(|(n, _)| n == &c.name) {
                line.push_str(&format!(" CHECK ({clause})"));
            }
            line
        })
        .collect();
    lines.push(format!(
        "  {} {} NOT NULL",
        quote(&spec.slot_column),
        slot_type(spec.size)
    ));
    lines.push(format!(
        "  {} BIGINT UNSIGNED NOT NULL",
        quote(&spec.seq_column)
    ));
    let pk: Vec<String> = key
        .iter()
        .chain(std::iter::once(&spec.slot_column))
        .map(|c| quote(c))
        .collect();
    lines.push(format!("  PRIMARY KEY ({})", pk.join(", ")));
    if let Some(ai) = logical
        .columns
        .iter()
        .find(|c| c.extra.contains("auto_increment"))
    {
        lines.push(format!("  KEY ({})", quote(&ai.name)));
    }
    for (_, def) in kept.checks.iter().chain(&kept.foreign_keys) {
        lines.push(format!("  {def}"));
    }
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n{}\n) {}",
        ring.quoted(),
        lines.join(",\n"),
        table_options(logical)
    )
}

/// `CREATE TABLE IF NOT EXISTS` for the sequence table.
fn create_seq_sql(spec: &RingSpec, seq: &TableName, logical: &Table, key: &[Column]) -> String {
    let mut lines: Vec<String> = key
        .iter()
        .map(|c| format!("  {} {} NOT NULL", quote(&c.name), c.type_sql()))
        .collect();
    let mut pk: Vec<String> = key.iter().map(|c| quote(&c.name)).collect();
    if key.is_empty() {
        lines.push(format!(
            "  {} TINYINT UNSIGNED NOT NULL DEFAULT 0",
            quote(SINGLE_ROW)
        ));
        pk.push(quote(SINGLE_ROW));
    }
    lines.push(format!(
        "  {} BIGINT UNSIGNED NOT NULL",
        quote(&spec.seq_column)
    ));
    lines.push(format!("  PRIMARY KEY ({})", pk.join(", ")));
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n{}\n) {}",
        seq.quoted(),
        lines.join(",\n"),
        table_options(logical)
    )
}

/// Problems of an existing integer column meant to hold values up to `max`.
fn integer_column_problem(t: &Table, name: &str, what: &str, max: u64) -> Option<String> {
    match t.column(name) {
        None => Some(format!("{what} `{name}` is missing")),
        Some(c) => match integer_max(&c.data_type, c.is_unsigned()) {
            None => Some(format!(
                "{what} `{}` is {}, not an integer type",
                c.name, c.column_type
            )),
            Some(m) if m < max => Some(format!(
                "{what} `{}` ({}) cannot hold {max}",
                c.name, c.column_type
            )),
            Some(_) => None,
        },
    }
}

/// Problems with `t`'s primary key and with columns no ring statement assigns.
fn key_and_extra_problems(t: &Table, want_pk: &[String], assigned: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    match &t.primary {
        Some(pk) if same_set(pk, want_pk) => {}
        Some(pk) => problems.push(format!(
            "primary key is ({}), not ({})",
            list(pk),
            list(want_pk)
        )),
        None => problems.push(format!("no primary key; it needs ({})", list(want_pk))),
    }
    for c in &t.columns {
        if !is_in(assigned, &c.name) && !c.omittable {
            problems.push(format!(
                "column `{}` is NOT NULL without a default, so inserts would fail",
                c.name
            ));
        }
    }
    problems
}

/// What is wrong with an existing ring table for this rule (empty: it fits).
fn ring_table_problems(
    spec: &RingSpec,
    ring: &Table,
    logical: &Table,
    key: &[String],
) -> Vec<String> {
    let mut problems = Vec::new();
    for l in &logical.columns {
        match ring.column(&l.name) {
            None => problems.push(format!("column `{}` is missing", l.name)),
            Some(c) if !c.same_type(l) => problems.push(format!(
                "column `{}` is {} but the log's is {}",
                l.name,
                c.type_sql(),
                l.type_sql()
            )),
            Some(c)
                if l.extra.contains("auto_increment") && !c.extra.contains("auto_increment") =>
            {
                problems.push(format!(
                    "column `{}` is not AUTO_INCREMENT (the log's is, and inserts leave it to the table)",
                    l.name
                ))
            }
            Some(_) => {}
        }
    }
    problems.extend(integer_column_problem(
        ring,
        &spec.slot_column,
        "slot column",
        u64::from(spec.size.saturating_sub(1)),
    ));
    problems.extend(integer_column_problem(
        ring,
        &spec.seq_column,
        "sequence column",
        u64::from(u32::MAX),
    ));
    let want_pk: Vec<String> = key
        .iter()
        .cloned()
        .chain(std::iter::once(spec.slot_column.clone()))
        .collect();
    let assigned: Vec<String> = logical
        .columns
        .iter()
        .map(|c| c.name.clone())
        .chain([spec.slot_column.clone(), spec.seq_column.clone()])
        .collect();
    problems.extend(key_and_extra_problems(ring, &want_pk, &assigned));
    problems
}

/// What is wrong with an existing sequence table for this rule (empty: it fits).
fn seq_table_problems(spec: &RingSpec, seq: &Table, key: &[Column]) -> Vec<String> {
    let mut problems = key_column_problems(seq, key, "the log's");
    problems.extend(integer_column_problem(
        seq,
        &spec.seq_column,
        "sequence column",
        u64::from(u32::MAX),
    ));
    let mut want_pk: Vec<String> = key.iter().map(|c| c.name.clone()).collect();
    if key.is_empty() {
        want_pk.push(SINGLE_ROW.to_string());
    }
    let assigned: Vec<String> = key
        .iter()
        .map(|c| c.name.clone())
        .chain(std::iter::once(spec.seq_column.clone()))
        .collect();
    problems.extend(key_and_extra_problems(seq, &want_pk, &assigned));
    problems
}

/// The backfill: the latest `size` rows of each key into the ring (with their ids),
/// and each key's history length into the sequence table.
fn backfill_sql(
    spec: &RingSpec,
    logical: &TableName,
    ring: &TableName,
    seq: &TableName,
    table: &Table,
    key: &[Column],
    order: &[String],
) -> [String; 2] {
    let keys: Vec<String> = key.iter().map(|c| quote(&c.name)).collect();
    let filter = key_filter(key, &[]);
    let ring_sql = ring_backfill_sql(spec, logical, ring, table, key, order, &[]);
    let seqc = quote(&spec.seq_column);
    let seq_sql = if keys.is_empty() {
        format!(
            "INSERT INTO {} ({seqc})\nSELECT COUNT(*) FROM {}{filter}\nON DUPLICATE KEY UPDATE {seqc} = GREATEST({seqc}, VALUES({seqc}))",
            seq.quoted(),
            logical.quoted()
        )
    } else {
        format!(
            "INSERT INTO {} ({k}, {seqc})\nSELECT {k}, COUNT(*) FROM {}{filter} GROUP BY {k}\nON DUPLICATE KEY UPDATE {seqc} = GREATEST({seqc}, VALUES({seqc}))",
            seq.quoted(),
            logical.quoted(),
            k = keys.join(", ")
        )
    };
    [ring_sql, seq_sql]
}

/// ` WHERE k IS NOT NULL AND … AND extra…` (nothing when there is no condition).
fn key_filter(key: &[Column], extra: &[String]) -> String {
    let conds: Vec<String> = key
        .iter()
        .filter(|c| c.nullable)
        .map(|c| format!("{} IS NOT NULL", quote(&c.name)))
        .chain(extra.iter().cloned())
        .collect();
    if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    }
}

/// The ring part of the backfill, over the log's rows that also meet `range`
/// (whole keys: the window functions number each key's full history).
fn ring_backfill_sql(
    spec: &RingSpec,
    logical: &TableName,
    ring: &TableName,
    table: &Table,
    key: &[Column],
    order: &[String],
    range: &[String],
) -> String {
    let keys: Vec<String> = key.iter().map(|c| quote(&c.name)).collect();
    let partition = if keys.is_empty() {
        String::new()
    } else {
        format!("PARTITION BY {} ", keys.join(", "))
    };
    let order: Vec<String> = order.iter().map(|c| format!("{} ASC", quote(c))).collect();
    let filter = key_filter(key, range);
    let cols: Vec<String> = table.columns.iter().map(|c| quote(&c.name)).collect();
    let picked: Vec<String> = table
        .columns
        .iter()
        .map(|c| format!("h.{}", quote(&c.name)))
        .collect();
    let size = spec.size;
    format!(
        "INSERT INTO {ring} ({cols}, {slot}, {seqc})\nSELECT {picked}, h.{pos} % {size}, h.{pos}\nFROM (SELECT {cols}, ROW_NUMBER() OVER ({partition}ORDER BY {order}) AS {pos}, COUNT(*) OVER ({part_only}) AS {count}\n      FROM {log}{filter}) AS h\nWHERE h.{pos} + {size} > h.{count}",
        ring = ring.quoted(),
        cols = cols.join(", "),
        slot = quote(&spec.slot_column),
        seqc = quote(&spec.seq_column),
        picked = picked.join(", "),
        pos = quote(POS),
        count = quote(COUNT),
        order = order.join(", "),
        part_only = partition.trim_end(),
        log = logical.quoted(),
    )
}

/// The ring part of the backfill for one chunk of keys, `(k…) > (?…)` and/or
/// `(k…) <= (?…)`: `[upper bound only, both, lower bound only]` (neither: the
/// whole backfill). `None` for a ring without key columns (one chunk).
fn ring_backfill_chunks(
    spec: &RingSpec,
    logical: &TableName,
    ring: &TableName,
    table: &Table,
    key: &[Column],
    order: &[String],
) -> Option<[String; 3]> {
    if key.is_empty() {
        return None;
    }
    let tuple = format!(
        "({})",
        key.iter()
            .map(|c| quote(&c.name))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let marks = vec!["?"; key.len()].join(", ");
    let lower = format!("{tuple} > ({marks})");
    let upper = format!("{tuple} <= ({marks})");
    let sql = |range: &[String]| ring_backfill_sql(spec, logical, ring, table, key, order, range);
    Some([
        sql(std::slice::from_ref(&upper)),
        sql(&[lower.clone(), upper.clone()]),
        sql(std::slice::from_ref(&lower)),
    ])
}

/// `ALTER TABLE ring AUTO_INCREMENT = next`.
fn raise_auto_inc_sql(ring: &TableName, next: u64) -> String {
    format!("ALTER TABLE {} AUTO_INCREMENT = {next}", ring.quoted())
}

/// The body of `<ring_table>_hs_seq`, `BEFORE INSERT` on the ring: takes the key's
/// next sequence number (`LAST_INSERT_ID(1)` on a key's first insert, since `VALUES
/// (k, 1)` would leave a stale LAST_INSERT_ID()) and sets the row's sequence and slot.
/// MariaDB restores the session's LAST_INSERT_ID() when the trigger ends.
fn seq_trigger_body(spec: &RingSpec, seq: &TableName, key: &[Column]) -> String {
    let seqc = quote(&spec.seq_column);
    let mut cols: Vec<String> = key.iter().map(|c| quote(&c.name)).collect();
    let mut vals: Vec<String> = key
        .iter()
        .map(|c| format!("NEW.{}", quote(&c.name)))
        .collect();
    cols.push(seqc.clone());
    vals.push("LAST_INSERT_ID(1)".into());
    format!(
        "BEGIN INSERT INTO {} ({}) VALUES ({}) ON DUPLICATE KEY UPDATE {seqc} = LAST_INSERT_ID({seqc} + 1); \
         SET NEW.{seqc} = LAST_INSERT_ID(); SET NEW.{} = NEW.{seqc} % {}; END",
        seq.quoted(),
        cols.join(", "),
        vals.join(", "),
        quote(&spec.slot_column),
        spec.size
    )
}

/// The body of the trigger that mirrors a row appended to the log directly (by a
/// client that does not go through heatsink yet) into the ring: the row with its id,
/// slot and sequence NULL (the ring's `BEFORE INSERT` trigger numbers it), and the
/// rule's guarded upsert. Rows with a NULL key are skipped.
fn ring_trigger_body(spec: &RingSpec, ring: &TableName, table: &Table, key: &[Column]) -> String {
    let seqc = quote(&spec.seq_column);
    let cols: Vec<String> = table.columns.iter().map(|c| quote(&c.name)).collect();
    let vals: Vec<String> = table
        .columns
        .iter()
        .map(|c| format!("NEW.{}", quote(&c.name)))
        .collect();
    let mut update: Vec<String> = table
        .columns
        .iter()
        .filter(|c| !key.iter().any(|k| k.name.eq_ignore_ascii_case(&c.name)))
        .map(|c| {
            format!(
                "{0} = IF(VALUES({seqc}) > {seqc}, VALUES({0}), {0})",
                quote(&c.name)
            )
        })
        .collect();
    // Last: the guards above compare with the row's old sequence number.
    update.push(format!(
        "{seqc} = IF(VALUES({seqc}) > {seqc}, VALUES({seqc}), {seqc})"
    ));
    let insert = format!(
        "INSERT INTO {} ({}, {}, {seqc}) VALUES ({}, NULL, NULL) ON DUPLICATE KEY UPDATE {}",
        ring.quoted(),
        cols.join(", "),
        quote(&spec.slot_column),
        vals.join(", "),
        update.join(", ")
    );
    let nullable: Vec<String> = key
        .iter()
        .filter(|c| c.nullable)
        .map(|c| format!("NEW.{} IS NOT NULL", quote(&c.name)))
        .collect();
    if nullable.is_empty() {
        insert
    } else {
        format!(
            "BEGIN IF {} THEN {insert}; END IF; END",
            nullable.join(" AND ")
        )
    }
}

/// What the locked part of a ring migration did.
struct RingApplied {
    /// Ring and sequence rows backfilled.
    backfilled: Option<Vec<u64>>,
    /// The ring's new AUTO_INCREMENT counter.
    raised: Option<u64>,
    /// Triggers created.
    created: Vec<String>,
}

/// Under the table locks: backfill (when still due, without the ring's numbering
/// trigger), raise the ring's AUTO_INCREMENT counter, create the triggers, commit.
async fn apply_ring_locked(
    conn: &mut Conn,
    rule: &CheckedRing,
    jobs: &crate::jobs::Settings,
) -> Result<RingApplied> {
    let name = &rule.spec.name;
    let due = table_has_rows(conn, &rule.logical).await?
        && !table_has_rows(conn, &rule.ring).await?
        && !table_has_rows(conn, &rule.seq).await?;
    let backfilled = match (&rule.backfill, due) {
        (Some([ring_sql, seq_sql]), true) => {
            // The numbering trigger would renumber the copied rows.
            let drop = format!("DROP TRIGGER IF EXISTS {}", rule.seq_trigger_name.quoted());
            run_sql(conn, name, &drop).await?;
            // So would the log's copied triggers (they may change NEW).
            for t in &rule.copied_triggers {
                let drop = format!("DROP TRIGGER IF EXISTS {}", t.name.quoted());
                run_sql(conn, name, &drop).await?;
            }
            // The sequence rows first: the key ranges of the ring's chunks are
            // read from them (a primary key), and so is the progress's total.
            let seq_rows = run_sql(conn, name, seq_sql).await?;
            let mut job = RingBackfill {
                rule,
                whole: ring_sql,
                lo: None,
                finished: false,
                ring_rows: 0,
            };
            let key = crate::jobs::JobKey {
                db: rule.logical.db.clone().unwrap_or_default(),
                rule: name.clone(),
                job: BACKFILL_JOB,
            };
            crate::jobs::run_owned(conn, &key, jobs, &mut job).await?;
            Some(vec![job.ring_rows, seq_rows])
        }
        (None, true) => {
            return Err(Error::new(
                Source::Rules,
                format!(
                    "ring '{name}': {} has rows but neither order_by nor a primary key says which are the latest; set order_by",
                    rule.logical.quoted()
                ),
            ))
        }
        (_, false) => None,
    };
    let mut raised = None;
    if let Some(ai) = &rule.auto_inc {
        let log_next = next_id(conn, &rule.logical, ai).await?;
        if log_next > next_id(conn, &rule.ring, ai).await? {
            // ALTER TABLE commits the backfill.
            run_sql(conn, name, &raise_auto_inc_sql(&rule.ring, log_next)).await?;
            raised = Some(log_next);
        }
    }
    let mut created = Vec::new();
    if backfilled.is_some() || matches!(rule.seq_trigger, TriggerPlan::Create(_)) {
        run_sql(conn, name, &rule.create_seq_trigger).await?;
        created.push(rule.seq_trigger_name.quoted());
    }
    for t in &rule.copied_triggers {
        if backfilled.is_some() || !t.exists {
            run_sql(conn, name, &t.create).await?;
            created.push(t.name.quoted());
        }
    }
    if let TriggerPlan::Create(ddl) = &rule.trigger {
        run_sql(conn, name, ddl).await?;
        created.push(rule.trigger_name.quoted());
    }
    run_sql(conn, name, "COMMIT").await?;
    Ok(RingApplied {
        backfilled,
        raised,
        created,
    })
}

/// The backfill's job name (`heatsink_jobs`, progress lines, `/metrics`).
const BACKFILL_JOB: &str = "backfill";

/// The ring part of the backfill as a job the runner drives inside the locked
/// transaction ([`crate::jobs::run_owned`]): chunks of whole keys, their ranges
/// read from the sequence table (filled just before, one row per key with the
/// key's history length, so also the count of log rows done).
struct RingBackfill<'a> {
    rule: &'a CheckedRing,
    /// The whole ring part (a ring without key columns is one chunk).
    whole: &'a str,
    /// The last key backfilled.
    lo: Option<Vec<mysql_async::Value>>,
    finished: bool,
    /// Ring rows inserted.
    ring_rows: u64,
}

impl RingBackfill<'_> {
    fn key_tuple(&self) -> String {
        format!("({})", list(&self.rule.key))
    }

    fn marks(&self) -> String {
        vec!["?"; self.rule.key.len()].join(", ")
    }

    /// `SUM(seq)` of the sequence rows whose key meets `cond` (bound to `params`).
    async fn log_rows(
        &self,
        conn: &mut Conn,
        cond: &str,
        params: Vec<mysql_async::Value>,
    ) -> Result<u64> {
        let sql = format!(
            "SELECT CAST(COALESCE(SUM({}), 0) AS UNSIGNED) FROM {}{cond}",
            quote(&self.rule.spec.seq_column),
            self.rule.seq.quoted()
        );
        let params = if params.is_empty() {
            mysql_async::Params::Empty
        } else {
            mysql_async::Params::Positional(params)
        };
        let n: Option<u64> = conn
            .exec_first(sql, params)
            .await
            .map_err(|e| schema_err(format!("reading {}", self.rule.seq.quoted()), e))?;
        Ok(n.unwrap_or(0))
    }
}

#[async_trait::async_trait(?Send)]
impl crate::jobs::Chunked for RingBackfill<'_> {
    fn unit(&self) -> &'static str {
        "log rows"
    }

    async fn total(&mut self, conn: &mut Conn, _after: Option<&str>) -> Result<u64> {
        self.log_rows(conn, "", Vec::new()).await
    }

    async fn chunk(
        &mut self,
        conn: &mut Conn,
        _after: Option<&str>,
        limit: usize,
    ) -> Result<Option<crate::jobs::Step>> {
        if self.finished {
            return Ok(None);
        }
        let rule = self.rule;
        let name = &rule.spec.name;
        let Some(chunks) = &rule.backfill_chunks else {
            // No key columns: one ring, one chunk.
            let rows = self.log_rows(conn, "", Vec::new()).await?;
            self.ring_rows += run_sql(conn, name, self.whole).await?;
            self.finished = true;
            return Ok(Some(crate::jobs::Step {
                last: "all".into(),
                rows,
            }));
        };
        let lower = format!(" WHERE {} > ({})", self.key_tuple(), self.marks());
        let bound_sql = format!(
            "SELECT {k} FROM {}{} ORDER BY {k} LIMIT 1 OFFSET {}",
            rule.seq.quoted(),
            if self.lo.is_some() {
                lower.as_str()
            } else {
                ""
            },
            limit.max(1) - 1,
            k = list(&rule.key)
        );
        let lo = self.lo.clone().unwrap_or_default();
        let params = if lo.is_empty() {
            mysql_async::Params::Empty
        } else {
            mysql_async::Params::Positional(lo.clone())
        };
        let bound: Vec<mysql_async::Row> = conn
            .exec(bound_sql, params)
            .await
            .map_err(|e| schema_err(format!("rule {name}: reading a chunk's bound"), e))?;
        let hi: Option<Vec<mysql_async::Value>> = bound.into_iter().next().map(values);
        let mut conds = Vec::new();
        if self.lo.is_some() {
            conds.push(format!("{} > ({})", self.key_tuple(), self.marks()));
        }
        if hi.is_some() {
            conds.push(format!("{} <= ({})", self.key_tuple(), self.marks()));
        }
        let mut params = lo;
        params.extend(hi.clone().unwrap_or_default());
        let cond = if conds.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conds.join(" AND "))
        };
        let rows = self.log_rows(conn, &cond, params.clone()).await?;
        let sql = match (self.lo.is_some(), hi.is_some()) {
            (false, false) => self.whole,
            (false, true) => chunks[0].as_str(),
            (true, true) => chunks[1].as_str(),
            (true, false) => chunks[2].as_str(),
        };
        let params = if params.is_empty() {
            mysql_async::Params::Empty
        } else {
            mysql_async::Params::Positional(params)
        };
        conn.exec_drop(sql, params).await.map_err(|e| {
            schema_err(
                format!("rule {name}: backfilling {}", rule.ring.quoted()),
                e,
            )
        })?;
        self.ring_rows += conn.affected_rows();
        let last = match &hi {
            Some(k) => k
                .iter()
                .map(|v| v.as_sql(true))
                .collect::<Vec<_>>()
                .join(", "),
            None => "the last key".into(),
        };
        match hi {
            Some(k) => self.lo = Some(k),
            None => self.finished = true,
        }
        Ok(Some(crate::jobs::Step { last, rows }))
    }
}

/// Prints one ring rule's plan and, with `apply`, executes it.
pub(crate) async fn print_and_apply_ring(
    conn: &mut Conn,
    rule: &CheckedRing,
    apply: bool,
    jobs: &crate::jobs::Settings,
    out: &mut dyn Write,
) -> Result<()> {
    print_ring_header(rule, out)?;
    print_and_apply_ring_tables(conn, rule, apply, out).await?;
    let create_seq_trigger = matches!(rule.seq_trigger, TriggerPlan::Create(_));
    let create_log_trigger = matches!(rule.trigger, TriggerPlan::Create(_));
    for (exists, t) in [
        (!create_seq_trigger, &rule.seq_trigger_name),
        (!create_log_trigger, &rule.trigger_name),
    ] {
        if exists {
            emit(out, &format!("-- trigger {} exists", t.quoted()))?;
        }
    }
    for t in rule.copied_triggers.iter().filter(|t| t.exists) {
        emit(out, &format!("-- trigger {} exists", t.name.quoted()))?;
    }
    let copy_triggers = rule.copied_triggers.iter().any(|t| !t.exists);
    if !(rule.backfill_due || create_seq_trigger || create_log_trigger || copy_triggers) {
        // Nothing to lock for; at most the counter to raise.
        print_and_apply_raise(conn, rule, apply, out).await?;
        return emit(out, "");
    }

    // The log stays locked from the backfill until both triggers exist, so every row
    // appended to it is either backfilled or mirrored.
    let lock = format!(
        "LOCK TABLES {} WRITE, {} WRITE, {} WRITE",
        rule.logical.quoted(),
        rule.ring.quoted(),
        rule.seq.quoted()
    );
    print_trigger_purposes(rule, out)?;
    print_locked_script(rule, &lock, out)?;
    if apply {
        apply_locked_and_report(conn, rule, &lock, jobs, out).await?;
    }
    emit(out, "")
}

/// Prints a ring rule's header line and its notes.
fn print_ring_header(rule: &CheckedRing, out: &mut dyn Write) -> Result<()> {
    let key = if rule.key.is_empty() {
        "no key: one ring".to_string()
    } else {
        format!("key {}", list(&rule.key))
    };
    emit(
        out,
        &format!(
            "-- rule {}: ring of {} rows per key for log {} ({key}) in {}, sequences in {}",
            rule.spec.name,
            rule.spec.size,
            rule.logical.quoted(),
            rule.ring.quoted(),
            rule.seq.quoted(),
        ),
    )?;
    for note in &rule.notes {
        emit(out, &format!("-- note: {note}"))?;
    }
    Ok(())
}

/// Prints the `CREATE TABLE` of a missing ring or sequence table (and, with `apply`,
/// runs it), or that the table exists and matches.
async fn print_and_apply_ring_tables(
    conn: &mut Conn,
    rule: &CheckedRing,
    apply: bool,
    out: &mut dyn Write,
) -> Result<()> {
    for (what, ddl, table) in [
        ("ring table", &rule.create_ring, &rule.ring),
        ("sequence table", &rule.create_seq, &rule.seq),
    ] {
        match ddl {
            Some(sql) => {
                emit(out, &format!("{sql};"))?;
                if apply {
                    run_sql(conn, &rule.spec.name, sql).await?;
                    emit(out, &format!("-- applied: created {what}"))?;
                }
            }
            None => emit(
                out,
                &format!("-- {what} {} exists and matches the rule", table.quoted()),
            )?,
        }
    }
    Ok(())
}

/// When there is nothing to lock for: prints the raise of the ring's
/// `AUTO_INCREMENT` counter, if due, and with `apply` raises it when it is still
/// below the log's.
async fn print_and_apply_raise(
    conn: &mut Conn,
    rule: &CheckedRing,
    apply: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let (Some(next), Some(ai)) = (rule.raise_auto_inc, &rule.auto_inc) else {
        return Ok(());
    };
    emit(out, &format!("{};", raise_auto_inc_sql(&rule.ring, next)))?;
    if apply {
        let next = next_id(conn, &rule.logical, ai).await?;
        if next > next_id(conn, &rule.ring, ai).await? {
            run_sql(conn, &rule.spec.name, &raise_auto_inc_sql(&rule.ring, next)).await?;
            emit(
                out,
                &format!(
                    "-- applied: AUTO_INCREMENT of {} raised to {next}",
                    rule.ring.quoted()
                ),
            )?;
        }
    }
    Ok(())
}

/// Prints what the triggers created under the locks do (and that the numbering
/// trigger is dropped for the backfill when it already exists).
fn print_trigger_purposes(rule: &CheckedRing, out: &mut dyn Write) -> Result<()> {
    let backfill = rule.backfill.as_ref().filter(|_| rule.backfill_due);
    if matches!(rule.seq_trigger, TriggerPlan::Create(_)) {
        emit(
            out,
            &format!(
                "-- trigger {}: numbers every row inserted into {} (the key's next sequence number and its slot)",
                rule.seq_trigger_name.quoted(),
                rule.ring.quoted()
            ),
        )?;
    } else if backfill.is_some() {
        emit(
            out,
            &format!(
                "-- trigger {}: dropped for the backfill (it would renumber the copied rows) and created again",
                rule.seq_trigger_name.quoted()
            ),
        )?;
    }
    if matches!(rule.trigger, TriggerPlan::Create(_)) {
        emit(
            out,
            &format!(
                "-- trigger {}: rows appended to {} directly (by clients not yet going through heatsink) are mirrored into the ring",
                rule.trigger_name.quoted(),
                rule.logical.quoted()
            ),
        )?;
    }
    Ok(())
}

/// Prints the script run under `lock`: the backfill, the counter's raise and the
/// triggers' creation, committed before the tables are unlocked.
fn print_locked_script(rule: &CheckedRing, lock: &str, out: &mut dyn Write) -> Result<()> {
    let backfill = rule.backfill.as_ref().filter(|_| rule.backfill_due);
    let create_seq_trigger = matches!(rule.seq_trigger, TriggerPlan::Create(_));
    emit(out, "SET autocommit = 0;")?;
    emit(out, &format!("{lock};"))?;
    if let Some([ring_sql, seq_sql]) = backfill {
        if !create_seq_trigger {
            emit(
                out,
                &format!("DROP TRIGGER IF EXISTS {};", rule.seq_trigger_name.quoted()),
            )?;
        }
        for t in rule.copied_triggers.iter().filter(|t| t.exists) {
            emit(out, &format!("DROP TRIGGER IF EXISTS {};", t.name.quoted()))?;
        }
        emit(
            out,
            &format!(
                "-- backfill: the latest {} rows of each key of {} with their ids, numbered by their position in the key's history",
                rule.spec.size,
                rule.logical.quoted()
            ),
        )?;
        emit(out, &format!("{seq_sql};"))?;
        match &rule.backfill_chunks {
            Some(chunks) => {
                emit(
                    out,
                    &format!(
                        "-- in chunks of whole keys, their ranges read from {} (progress and \
                         --max-rows-per-second per chunk; still one transaction under the locks: \
                         stopped, it rolls back whole and the next migrate --apply does it again), \
                         a chunk of keys in (lo, hi]:",
                        rule.seq.quoted()
                    ),
                )?;
                emit(out, &format!("{};", chunks[1]))?;
            }
            None => emit(out, &format!("{ring_sql};"))?,
        }
    }
    if let Some(next) = rule.raise_auto_inc {
        emit(
            out,
            "-- ids continue the log's (applied with the log's counter under the locks)",
        )?;
        emit(out, &format!("{};", raise_auto_inc_sql(&rule.ring, next)))?;
    }
    emit(out, "DELIMITER ;;")?;
    if create_seq_trigger || backfill.is_some() {
        emit(out, &format!("{};;", rule.create_seq_trigger))?;
    }
    if let TriggerPlan::Create(ddl) = &rule.trigger {
        emit(out, &format!("{ddl};;"))?;
    }
    for t in &rule.copied_triggers {
        if backfill.is_some() || !t.exists {
            emit(
                out,
                &format!(
                    "-- trigger {}: a copy of {}",
                    t.name.quoted(),
                    t.original.quoted()
                ),
            )?;
            emit(out, &format!("{};;", t.create))?;
        }
    }
    emit(out, "DELIMITER ;")?;
    emit(out, "COMMIT;")?;
    emit(out, "UNLOCK TABLES;")?;
    emit(out, "SET autocommit = 1;")
}

/// Runs the locked part under `lock` (rolled back on failure; the tables are
/// unlocked and autocommit restored either way) and prints what it did.
async fn apply_locked_and_report(
    conn: &mut Conn,
    rule: &CheckedRing,
    lock: &str,
    jobs: &crate::jobs::Settings,
    out: &mut dyn Write,
) -> Result<()> {
    run_all(conn, &rule.spec.name, &["SET autocommit = 0", lock]).await?;
    let done = apply_ring_locked(conn, rule, jobs).await;
    if done.is_err() {
        let _ = conn.query_drop("ROLLBACK").await;
    }
    let _ = conn.query_drop("UNLOCK TABLES").await;
    let _ = conn.query_drop("SET autocommit = 1").await;
    let done = done?;
    if let Some(counts) = done.backfilled {
        emit(
            out,
            &format!(
                "-- applied: backfilled {} ring rows and {} sequence rows",
                counts[0], counts[1]
            ),
        )?;
    }
    if let Some(next) = done.raised {
        emit(
            out,
            &format!(
                "-- applied: AUTO_INCREMENT of {} raised to {next}",
                rule.ring.quoted()
            ),
        )?;
    }
    for t in done.created {
        emit(out, &format!("-- applied: created trigger {t}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, column_type: &str, nullable: bool, default: Option<&str>) -> Column {
        Column::for_test(name, column_type, nullable, default)
    }

    #[test]
    fn ring_columns_copy_the_log_with_auto_increment() {
        let mut id = col("id", "int(11)", false, None);
        id.extra = "auto_increment".into();
        assert_eq!(
            ring_column_sql(&id, false),
            "  `id` int(11) NOT NULL AUTO_INCREMENT"
        );
        let mut ts = col("ts", "timestamp(3)", false, Some("current_timestamp(3)"));
        ts.extra = "on update current_timestamp(3)".into();
        assert_eq!(
            ring_column_sql(&ts, false),
            "  `ts` timestamp(3) NOT NULL DEFAULT current_timestamp(3) ON UPDATE current_timestamp(3)"
        );
        let k = col("uid", "int(11)", true, Some("NULL"));
        assert_eq!(ring_column_sql(&k, true), "  `uid` int(11) NOT NULL");
        assert_eq!(
            ring_column_sql(&k, false),
            "  `uid` int(11) NULL DEFAULT NULL"
        );
        assert_eq!(
            on_update("on update current_timestamp(), invisible"),
            Some("current_timestamp()")
        );
        assert_eq!(on_update("auto_increment"), None);
        assert_eq!(slot_type(65_535), "SMALLINT UNSIGNED");
        assert_eq!(slot_type(65_536), "INT UNSIGNED");
        assert_eq!(suffixed_name("r", RING_TRIGGER_SUFFIX), "r_hs_log");
        assert_eq!(suffixed_name("r", SEQ_TRIGGER_SUFFIX), "r_hs_seq");
        for suffix in [RING_TRIGGER_SUFFIX, SEQ_TRIGGER_SUFFIX] {
            let long = suffixed_name(&"r".repeat(64), suffix);
            assert_eq!(long.len(), 64);
            assert!(long.ends_with(suffix));
        }
    }

    fn ring_fixture() -> (Vec<RingSpec>, Table, Column) {
        let spec: Vec<RingSpec> = crate::kinds::entries(
            "[[ring]]\nname = \"v\"\ntable = \"log\"\nkey = [\"uid\"]\nsize = 5\nring_table = \"r\"\n",
            "ring",
        )
        .unwrap();
        let mut id = col("id", "int(11)", false, None);
        id.extra = "auto_increment".into();
        let uid = col("uid", "int(11)", true, None);
        let table = Table {
            table_type: "BASE TABLE".into(),
            engine: Some("InnoDB".into()),
            collation: None,
            charset: None,
            columns: vec![id, uid.clone(), col("v", "int(11)", false, None)],
            primary: Some(vec!["id".into()]),
            unique: Vec::new(),
            unique_prefix: Vec::new(),
        };
        (spec, table, uid)
    }

    #[test]
    fn ring_table_keeps_auto_increment_with_a_key() {
        let (spec, table, _) = ring_fixture();
        assert_eq!(
            create_ring_sql(
                &spec[0],
                &TableName::parse("d.r").unwrap(),
                &table,
                &["uid".into()],
                &KeptConstraints::default()
            ),
            "CREATE TABLE IF NOT EXISTS `d`.`r` (\n  `id` int(11) NOT NULL AUTO_INCREMENT,\n  `uid` int(11) NOT NULL,\n  \
             `v` int(11) NOT NULL,\n  `slot` SMALLINT UNSIGNED NOT NULL,\n  `seq` BIGINT UNSIGNED NOT NULL,\n  \
             PRIMARY KEY (`uid`, `slot`),\n  KEY (`id`)\n) ENGINE=InnoDB"
        );
    }

    #[test]
    fn ring_triggers_number_and_mirror_rows() {
        let (spec, table, uid) = ring_fixture();
        let seq = TableName::parse("d.r_seq").unwrap();
        assert_eq!(
            seq_trigger_body(&spec[0], &seq, std::slice::from_ref(&uid)),
            "BEGIN INSERT INTO `d`.`r_seq` (`uid`, `seq`) VALUES (NEW.`uid`, LAST_INSERT_ID(1)) \
             ON DUPLICATE KEY UPDATE `seq` = LAST_INSERT_ID(`seq` + 1); \
             SET NEW.`seq` = LAST_INSERT_ID(); SET NEW.`slot` = NEW.`seq` % 5; END"
        );
        assert_eq!(
            seq_trigger_body(&spec[0], &seq, &[]),
            "BEGIN INSERT INTO `d`.`r_seq` (`seq`) VALUES (LAST_INSERT_ID(1)) \
             ON DUPLICATE KEY UPDATE `seq` = LAST_INSERT_ID(`seq` + 1); \
             SET NEW.`seq` = LAST_INSERT_ID(); SET NEW.`slot` = NEW.`seq` % 5; END"
        );
        let ring = TableName::parse("d.r").unwrap();
        let upsert = "INSERT INTO `d`.`r` (`id`, `uid`, `v`, `slot`, `seq`) VALUES (NEW.`id`, NEW.`uid`, NEW.`v`, NULL, NULL) \
             ON DUPLICATE KEY UPDATE `id` = IF(VALUES(`seq`) > `seq`, VALUES(`id`), `id`), `v` = IF(VALUES(`seq`) > `seq`, VALUES(`v`), `v`), \
             `seq` = IF(VALUES(`seq`) > `seq`, VALUES(`seq`), `seq`)";
        assert_eq!(
            ring_trigger_body(&spec[0], &ring, &table, std::slice::from_ref(&uid)),
            format!("BEGIN IF NEW.`uid` IS NOT NULL THEN {upsert}; END IF; END")
        );
        let mut not_null = uid;
        not_null.nullable = false;
        assert_eq!(
            ring_trigger_body(&spec[0], &ring, &table, &[not_null]),
            upsert
        );
    }

    fn fk(name: &str, columns: &[&str], on_delete: &str, on_update: &str) -> ForeignKey {
        ForeignKey {
            name: name.into(),
            child: TableName::parse("d.ev").unwrap(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            parent: TableName::parse("d.users").unwrap(),
            parent_columns: columns.iter().map(|_| "id".to_string()).collect(),
            on_delete: on_delete.into(),
            on_update: on_update.into(),
        }
    }

    #[test]
    fn ring_keeps_the_constraints_it_can() {
        let (log, ring) = (
            TableName::parse("d.ev").unwrap(),
            TableName::parse("d.ev_ring").unwrap(),
        );
        let key = vec!["uid".to_string()];
        let kept = |fks: Vec<ForeignKey>| {
            let enforced = Enforced {
                foreign_keys: fks,
                checks: vec![
                    CheckConstraint {
                        name: "n".into(),
                        level: "Column".into(),
                        clause: "`n` >= 0".into(),
                    },
                    CheckConstraint {
                        name: "small".into(),
                        level: "Table".into(),
                        clause: "`n` < 100".into(),
                    },
                ],
                ..Enforced::default()
            };
            kept_constraints(&log, &ring, &enforced, &key)
        };
        let ok = kept(vec![
            fk("by_user", &["uid"], "CASCADE", "RESTRICT"),
            fk("by_other", &["other"], "SET NULL", "CASCADE"),
        ])
        .unwrap_or_else(|_| panic!("refused"));
        assert_eq!(
            ok.column_checks,
            [("n".to_string(), "`n` >= 0".to_string())]
        );
        assert_eq!(ok.checks[0].1, "CONSTRAINT `small` CHECK (`n` < 100)");
        assert_eq!(
            ok.foreign_keys[0].1,
            "CONSTRAINT `ev_ring__by_user` FOREIGN KEY (`uid`) REFERENCES `d`.`users` (`id`) ON DELETE CASCADE ON UPDATE RESTRICT"
        );
        for refused in [
            fk("a", &["uid"], "RESTRICT", "CASCADE"),
            fk("b", &["uid"], "SET NULL", "RESTRICT"),
            fk("c", &["other"], "CASCADE", "RESTRICT"),
            fk("d", &["uid", "other"], "CASCADE", "RESTRICT"),
        ] {
            let name = refused.name.clone();
            match kept(vec![refused]) {
                Err(SchemaError::Refused(r)) => assert!(r.contains(&format!("`{name}`")), "{r}"),
                _ => panic!("{name} kept"),
            }
        }
    }
}
