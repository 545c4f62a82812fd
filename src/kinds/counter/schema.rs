//! The counter's schema work: what `heatsink migrate` creates for a counter rule,
//! and what `check --backend-url` reports about it.
//!
//! A `[[counter]]` rule keeps the application's table as the counter's base value and
//! spreads increments over a slot table (see [`crate::rewrite::counter`]). For every
//! counter rule this command reads the logical table from `information_schema`, checks
//! that the rule fits it, and prints the DDL that creates:
//!
//! 1. the slot table: the key columns with exactly the logical table's types
//!    (character set and collation included, so the join on the key compares the same
//!    way), the slot number column, one `BIGINT NOT NULL DEFAULT 0` column per counter
//!    (deltas may be negative), `PRIMARY KEY (key…, slot)`, InnoDB, the logical
//!    table's default character set and collation;
//! 2. the trigger `<slot_table>_hs_ai`, `AFTER INSERT` on the slot table, which inserts
//!    the logical row (counters at 0) when an increment names a key that has none yet.
//!    A duplicate of the key is skipped (the row exists); anything else the table
//!    refuses (a foreign key, a CHECK, a column without a default, a duplicate of
//!    another unique key) fails the increment, whose UPDATE the proxy then runs as
//!    sent: it matches no row. An earlier form of the trigger (`INSERT IGNORE`, which
//!    let such an increment stay in a slot row no read shows) is replaced.
//!    A counter without key columns needs no trigger: its logical table must hold its
//!    one row.
//!
//! The rule is refused (nothing is printed or created for any rule) when the logical
//! table is missing, a key or counter column is missing, a counter column is not an
//! integer, the key columns are not exactly the primary key or a unique key (then the
//! trigger would not create exactly one row per key), or an existing slot table
//! or trigger does not match what the rule needs.
//!
//! With `--apply` the statements are executed. They are idempotent (`IF NOT EXISTS`),
//! so running the command twice is harmless; objects that already exist and match are
//! reported and left alone.
//!
//! The database of a table is the rule's `db.` prefix, else the database of
//! `--backend-url`. An unqualified slot table lives next to its logical table.
//!
//! The checks are shared with [`crate::kinds::counter::compact`], which refuses to touch a rule whose
//! tables do not fit it.

use std::io::Write;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

use super::spec::CounterSpec;
use crate::error::{Error, Result, Source};
use crate::kinds::SchemaError;
use crate::rules::spec::{quote, TableName};
use crate::schema::*;

/// Suffix of the trigger that creates missing logical rows.
pub const TRIGGER_SUFFIX: &str = "_hs_ai";

/// A counter rule checked against the database.
#[derive(Debug, Clone)]
pub(crate) struct CheckedRule {
    /// The rule as written.
    pub spec: CounterSpec,
    /// The logical table, database resolved.
    pub logical: TableName,
    /// The slot table, database resolved.
    pub slot: TableName,
    /// Key columns, spelled as in the logical table.
    pub key: Vec<String>,
    /// Counter columns, spelled as in the logical table.
    pub columns: Vec<String>,
    /// The slot number column.
    pub slot_column: String,
    /// `CREATE TABLE` for a missing slot table; `None` when it exists and matches.
    pub create_table: Option<String>,
    /// Trigger name (in the slot table's database).
    pub trigger_name: String,
    /// What to do about the trigger.
    pub trigger: TriggerPlan,
    /// Remarks for the operator (printed as comments).
    pub notes: Vec<String>,
}

impl CheckedRule {
    pub(crate) fn trigger_quoted(&self) -> String {
        TableName {
            db: self.slot.db.clone(),
            name: self.trigger_name.clone(),
        }
        .quoted()
    }
}

/// `<slot_table>_hs_ai`, shortened with a hash of the full name when that would exceed
/// 64 characters.
pub fn trigger_name(slot_table: &str) -> String {
    suffixed_name(slot_table, TRIGGER_SUFFIX)
}

/// Resolves `spec`'s tables to a database: the rule's prefix, else `default_db` (the
/// URL's); an unqualified slot table lives next to the logical table.
pub(crate) fn resolve(
    spec: &CounterSpec,
    default_db: Option<&str>,
) -> std::result::Result<(TableName, TableName), SchemaError> {
    let (logical, physical) = resolve_tables(&spec.table, &[&spec.slot_table], default_db)?;
    let [slot] = <[TableName; 1]>::try_from(physical)
        .map_err(|_| SchemaError::Refused("internal error: one slot table".into()))?;
    Ok((logical, slot))
}

/// A schema check's outcome: refusals and backend failures are [`SchemaError`]s.
type SchemaResult<T> = std::result::Result<T, SchemaError>;

/// Checks one counter rule against the database and works out the DDL it needs.
/// A refusal is [`SchemaError::Refused`]; backend failures are
/// [`SchemaError::Failed`].
pub(crate) async fn check_rule(
    conn: &mut Conn,
    spec: &CounterSpec,
    default_db: Option<&str>,
) -> SchemaResult<CheckedRule> {
    spec.validate().map_err(SchemaError::Refused)?;
    let (logical, slot) = resolve(spec, default_db)?;
    let table = inspect_logical(conn, &logical).await?;
    let mut notes = Vec::new();
    let key_cols = counter_key_columns(spec, &table, &logical, &mut notes)?;
    let key: Vec<String> = key_cols.iter().map(|c| c.name.clone()).collect();
    let columns = counter_columns(spec, &table, &logical)?;
    let enforced = enforced(conn, &logical).await?;
    refuse_unkept_constraints(&logical, &slot, &enforced, &columns)?;
    note_engine(&table, &logical, &mut notes);
    let create_table = plan_slot_table(conn, spec, &slot, &table, &key_cols, &columns).await?;

    let trigger_name = trigger_name(&slot.name);
    let trigger = if key.is_empty() {
        note_single_row(conn, &logical, &mut notes).await?;
        TriggerPlan::NotNeeded
    } else {
        let trig = TableName {
            db: slot.db.clone(),
            name: trigger_name.clone(),
        };
        // The body the table needs, and the other form, which it replaces.
        let lone = only_the_key_collides(&table, (&key, &columns), &enforced);
        let bodies = [lone, !lone].map(|l| trigger_body(&logical, &key, &columns, l));
        plan_slot_trigger(conn, (&logical, &slot), &trig, &bodies, &mut notes).await?
    };
    if !key.is_empty() {
        note_omitted_columns(&table, &logical, (&key, &columns), &mut notes);
    }

    Ok(CheckedRule {
        spec: spec.clone(),
        logical,
        slot,
        key,
        columns,
        slot_column: spec.slot_column.clone(),
        create_table,
        trigger_name,
        trigger,
        notes,
    })
}

/// Refuses what the slot rows would bypass: a CHECK constraint that reads a counter
/// column (increments add to slot rows, so the base row's CHECK never sees the
/// total), a foreign key that deletes or changes the counter's rows by itself (its
/// slot rows would be left behind, and come back with a new row of that key), and an
/// `UPDATE` trigger (increments do not update the counter's row).
fn refuse_unkept_constraints(
    logical: &TableName,
    slot: &TableName,
    enforced: &Enforced,
    columns: &[String],
) -> SchemaResult<()> {
    for c in columns {
        if let Some(check) = enforced.checks.iter().find(|k| k.reads(c)) {
            return Err(SchemaError::Refused(format!(
                "counter column `{c}` of {} is under CHECK constraint {} ({}), which \
                 increments bypass (they add to slot rows in {}, not to the row the \
                 constraint checks): drop the constraint or leave `{c}` out of the rule",
                logical.quoted(),
                quote(&check.name),
                check.clause,
                slot.quoted()
            )));
        }
    }
    refuse_changing_foreign_keys(
        logical,
        enforced,
        &format!("its slot rows in {}", slot.quoted()),
    )?;
    if let Some(t) = enforced
        .triggers
        .iter()
        .find(|t| t.event.eq_ignore_ascii_case("UPDATE"))
    {
        return Err(SchemaError::Refused(format!(
            "trigger {} on {} would not fire for increments (they add to slot rows in {}): \
             drop the trigger or the rule",
            t.describe(),
            logical.quoted(),
            slot.quoted()
        )));
    }
    Ok(())
}

/// Reads the logical table; refused when it is missing or not a base table.
async fn inspect_logical(conn: &mut Conn, logical: &TableName) -> SchemaResult<Table> {
    inspect_base_table(conn, logical).await
}

/// Key columns: present, usable in a primary key, exactly a unique key (refused
/// otherwise); a note for each nullable one.
fn counter_key_columns(
    spec: &CounterSpec,
    table: &Table,
    logical: &TableName,
    notes: &mut Vec<String>,
) -> SchemaResult<Vec<Column>> {
    let mut key_cols: Vec<Column> = Vec::new();
    for k in &spec.key {
        key_cols.push(
            table
                .key_column(k, logical, "a slot table")
                .map_err(SchemaError::Refused)?
                .clone(),
        );
    }
    if key_cols.is_empty() {
        return Ok(key_cols);
    }
    let key: Vec<String> = key_cols.iter().map(|c| c.name.clone()).collect();
    if !table.unique.iter().any(|(_, cols)| same_set(cols, &key)) {
        let have: Vec<String> = table
            .unique
            .iter()
            .map(|(n, cols)| format!("{n} ({})", list(cols)))
            .collect();
        let have = if have.is_empty() {
            "none".to_string()
        } else {
            have.join(", ")
        };
        return Err(SchemaError::Refused(format!(
            "key ({}) is neither the primary key nor a unique key of {}, so one row per key is not guaranteed (unique keys: {have})",
            list(&key),
            logical.quoted()
        )));
    }
    for c in key_cols.iter().filter(|c| c.nullable) {
        notes.push(format!(
            "key column `{}` is nullable; rows whose key is NULL cannot be incremented through slot rows",
            c.name
        ));
    }
    Ok(key_cols)
}

/// Counter columns, spelled as in the logical table: refused when one is missing or
/// not of an integer type.
fn counter_columns(
    spec: &CounterSpec,
    table: &Table,
    logical: &TableName,
) -> SchemaResult<Vec<String>> {
    let mut columns = Vec::new();
    for c in &spec.columns {
        let col = table.column(c).ok_or_else(|| {
            SchemaError::Refused(format!(
                "counter column `{c}` is not a column of {}",
                logical.quoted()
            ))
        })?;
        if !col.is_integer() {
            return Err(SchemaError::Refused(format!(
                "counter column `{}` of {} is {}, not an integer type",
                col.name,
                logical.quoted(),
                col.column_type
            )));
        }
        columns.push(col.name.clone());
    }
    Ok(columns)
}

/// Notes a logical table whose engine is not InnoDB (rewritten statements are only
/// atomic on a transactional engine).
fn note_engine(table: &Table, logical: &TableName, notes: &mut Vec<String>) {
    if table
        .engine
        .as_deref()
        .is_some_and(|e| !e.eq_ignore_ascii_case("InnoDB"))
    {
        notes.push(format!(
            "{} uses {}; rewritten statements are only atomic on a transactional engine such as InnoDB",
            logical.quoted(),
            table.engine.as_deref().unwrap_or_default()
        ));
    }
}

/// `CREATE TABLE` for the slot table when it is missing; refused when it exists but
/// does not match the rule.
async fn plan_slot_table(
    conn: &mut Conn,
    spec: &CounterSpec,
    slot: &TableName,
    table: &Table,
    key_cols: &[Column],
    columns: &[String],
) -> SchemaResult<Option<String>> {
    let Some(existing) = inspect_table(conn, slot).await? else {
        return Ok(Some(create_table_sql(spec, slot, table, key_cols, columns)));
    };
    let problems = slot_table_problems(spec, &existing, key_cols, columns);
    if !problems.is_empty() {
        return Err(SchemaError::Refused(format!(
            "slot table {} exists but does not match the rule: {}",
            slot.quoted(),
            problems.join("; ")
        )));
    }
    Ok(None)
}

/// For a counter without key columns: notes a logical table that does not hold
/// exactly one row.
async fn note_single_row(
    conn: &mut Conn,
    logical: &TableName,
    notes: &mut Vec<String>,
) -> SchemaResult<()> {
    let rows: Vec<Row> = conn
        .query(format!("SELECT COUNT(*) FROM {}", logical.quoted()))
        .await
        .map_err(|e| schema_err(format!("counting rows of {}", logical.quoted()), e))?;
    let n = rows
        .first()
        .and_then(|r| r.get_opt::<u64, usize>(0))
        .and_then(|r| r.ok())
        .unwrap_or_default();
    if n != 1 {
        notes.push(format!(
            "{} holds {n} rows; a counter without key columns needs exactly one",
            logical.quoted()
        ));
    }
    Ok(())
}

/// What to do about `trig`, the slot table's trigger that creates missing logical
/// rows: create it when missing, keep an equivalent one (with a note when its body
/// differs); refused when a trigger of that name does something else.
async fn plan_slot_trigger(
    conn: &mut Conn,
    (logical, slot): (&TableName, &TableName),
    trig: &TableName,
    [body, other]: &[String; 2],
    notes: &mut Vec<String>,
) -> SchemaResult<TriggerPlan> {
    let Some(t) = existing_trigger(conn, trig).await? else {
        return Ok(TriggerPlan::Create(format!(
            "CREATE TRIGGER IF NOT EXISTS {} AFTER INSERT ON {} FOR EACH ROW {body}",
            trig.quoted(),
            slot.quoted()
        )));
    };
    let on_slot = t.table.eq_ignore_ascii_case(&slot.name)
        && t.timing.eq_ignore_ascii_case("AFTER")
        && t.event.eq_ignore_ascii_case("INSERT");
    let found = normalize(&t.body);
    let table = logical.name.to_ascii_lowercase();
    let want = normalize(body);
    // The earlier form (an INSERT IGNORE into the logical table, ours or a
    // hand-written one, e.g. without the counters) is replaced, and so is the other
    // form of today's (with or without the check that a duplicate is the key's: the
    // table's unique keys decide which one it needs); a hand-written equivalent
    // (a 1062 handler around the insert) is accepted; anything else is not ours.
    let earlier = found.starts_with("insert ignore into") && found.contains(&table);
    let creates_row = found.starts_with("begin")
        && found.contains("continue handler for 1062")
        && found.contains(&table);
    let other_form = found == normalize(other);
    if on_slot && (earlier || other_form) {
        let why = match (earlier, want.contains(CHECKED)) {
            (true, _) => "which lets the increment of a key whose row the table refuses stay in a slot row that no read shows",
            (false, true) => "which takes any duplicate for the key's own, where another unique key of the table may now refuse the row",
            (false, false) => "which checks that a duplicate is the key's own, which the table's unique keys no longer need",
        };
        notes.push(format!(
            "trigger {} has an earlier body, `{}`, {why}; it is replaced (`heatsink migrate --apply`)",
            trig.quoted(),
            t.body
        ));
        return Ok(TriggerPlan::Replace(format!(
            "CREATE OR REPLACE TRIGGER {} AFTER INSERT ON {} FOR EACH ROW {body}",
            trig.quoted(),
            slot.quoted()
        )));
    }
    if !on_slot || !creates_row {
        return Err(SchemaError::Refused(format!(
            "trigger {} exists but is not `AFTER INSERT ON {} FOR EACH ROW {body}` (it is `{} {} ON {} FOR EACH ROW {}`); drop it or rename the slot table",
            trig.quoted(),
            slot.quoted(),
            t.timing,
            t.event,
            quote(&t.table),
            t.body
        )));
    }
    if found != want {
        // The table needs the check that a duplicate is the key's own; a hand-written
        // body that never signals cannot have it.
        let unchecked = if want.contains(CHECKED) && !found.contains("signal") {
            "; another unique key of the table (or its `BEFORE INSERT` trigger) can make a new key's row a duplicate that is not the key's, which this body takes for the key's own: such an increment would stay in a slot row that no read shows (drop the trigger and run `heatsink migrate --apply` for the form that checks)"
        } else {
            ""
        };
        notes.push(format!(
            "trigger {} exists with the body `{}`; left as it is{unchecked}",
            trig.quoted(),
            t.body
        ));
    }
    Ok(TriggerPlan::Exists)
}

/// Notes the logical table's columns without a default that the trigger's rows
/// leave out (neither key nor counter columns).
fn note_omitted_columns(
    table: &Table,
    logical: &TableName,
    (key, columns): (&[String], &[String]),
    notes: &mut Vec<String>,
) {
    let omitted: Vec<String> = table
        .columns
        .iter()
        .filter(|c| !c.omittable && !key.contains(&c.name) && !columns.contains(&c.name))
        .map(|c| c.name.clone())
        .collect();
    if !omitted.is_empty() {
        notes.push(format!(
            "{} has no default for {}: under a strict sql_mode (the trigger keeps the one it is created with) the trigger cannot create the row of a new key, and an increment of a key without a row runs as sent and matches none; otherwise such rows get the type's implicit default there",
            logical.quoted(),
            list(&omitted)
        ));
    }
}

/// `CREATE TABLE IF NOT EXISTS` for the slot table.
fn create_table_sql(
    spec: &CounterSpec,
    slot: &TableName,
    logical: &Table,
    key: &[Column],
    columns: &[String],
) -> String {
    let mut lines: Vec<String> = key
        .iter()
        .map(|c| format!("  {} {} NOT NULL", quote(&c.name), c.type_sql()))
        .collect();
    lines.push(format!(
        "  {} SMALLINT UNSIGNED NOT NULL",
        quote(&spec.slot_column)
    ));
    for c in columns {
        lines.push(format!("  {} BIGINT NOT NULL DEFAULT 0", quote(c)));
    }
    let pk: Vec<String> = key
        .iter()
        .map(|c| quote(&c.name))
        .chain(std::iter::once(quote(&spec.slot_column)))
        .collect();
    lines.push(format!("  PRIMARY KEY ({})", pk.join(", ")));
    let mut options = "ENGINE=InnoDB".to_string();
    if let Some(cs) = &logical.charset {
        options.push_str(&format!(" DEFAULT CHARSET={cs}"));
    }
    if let Some(coll) = &logical.collation {
        options.push_str(&format!(" COLLATE={coll}"));
    }
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n{}\n) {options}",
        slot.quoted(),
        lines.join(",\n")
    )
}

/// What is wrong with an existing slot table for this rule (empty: it fits).
fn slot_table_problems(
    spec: &CounterSpec,
    slot: &Table,
    key: &[Column],
    columns: &[String],
) -> Vec<String> {
    let mut problems = key_column_problems(slot, key, "the logical table's");
    match slot.column(&spec.slot_column) {
        None => problems.push(format!("slot column `{}` is missing", spec.slot_column)),
        Some(c) => match integer_max(&c.data_type, c.is_unsigned()) {
            None => problems.push(format!(
                "slot column `{}` is {}, not an integer type",
                c.name, c.column_type
            )),
            Some(max) if max < u64::from(spec.slots.saturating_sub(1)) => problems.push(format!(
                "slot column `{}` ({}) cannot hold slot {}",
                c.name,
                c.column_type,
                spec.slots - 1
            )),
            Some(_) => {}
        },
    }
    for name in columns {
        match slot.column(name) {
            None => problems.push(format!("counter column `{name}` is missing")),
            Some(c) if !c.is_integer() || c.is_unsigned() => problems.push(format!(
                "counter column `{name}` is {}, not a signed integer (deltas may be negative)",
                c.column_type
            )),
            // A slot row sums any number of deltas, whatever the counter's own type
            // holds; a narrower column would fail them, or clamp them in a session
            // that is not strict.
            Some(c) if !c.data_type.eq_ignore_ascii_case("bigint") => problems.push(format!(
                "counter column `{name}` is {}, not BIGINT (a slot row sums any number of deltas; a narrower column would clamp them in a session that is not strict)",
                c.column_type
            )),
            Some(_) => {}
        }
    }
    let want_pk: Vec<String> = key
        .iter()
        .map(|c| c.name.clone())
        .chain(std::iter::once(spec.slot_column.clone()))
        .collect();
    match &slot.primary {
        Some(pk) if same_set(pk, &want_pk) => {}
        Some(pk) => problems.push(format!(
            "primary key is ({}), not ({})",
            list(pk),
            list(&want_pk)
        )),
        None => problems.push(format!("no primary key; it needs ({})", list(&want_pk))),
    }
    for c in &slot.columns {
        let used = want_pk
            .iter()
            .chain(columns)
            .any(|n| n.eq_ignore_ascii_case(&c.name));
        if !used && !c.omittable {
            problems.push(format!(
                "column `{}` is NOT NULL without a default, so slot inserts would fail",
                c.name
            ));
        }
    }
    problems
}

/// The local variable of the trigger's check that a duplicate is the key's own
/// (its name tells the two forms apart).
const CHECKED: &str = "hs_found";

/// The trigger's body: create the logical row with counters at 0. A duplicate of the
/// key means the row exists, and is skipped; every other error fails the statement
/// that inserted the slot row, and so the increment. When another unique key of the
/// table could also hold the new row's values (`lone` false: see
/// [`only_the_key_collides`]), a duplicate is taken for the key's only when a locking
/// read finds the key's row, else the trigger signals 1062 itself. The check costs
/// the server 1.29 × per new slot row of an existing key (`bench-counter-trigger.sh`),
/// so the tables that do not need it go without.
fn trigger_body(logical: &TableName, key: &[String], columns: &[String], lone: bool) -> String {
    let values: Vec<String> = key.iter().map(|k| format!("NEW.{}", quote(k))).collect();
    let insert = key_row_insert("INSERT", &logical.quoted(), key, columns, &values);
    if lone {
        return format!("BEGIN DECLARE CONTINUE HANDLER FOR 1062 BEGIN END; {insert}; END");
    }
    // Qualified: a local variable would shadow a column of its name.
    let table = logical.quoted();
    let found: Vec<String> = key
        .iter()
        .map(|k| format!("{table}.{0} = NEW.{0}", quote(k)))
        .collect();
    format!(
        "BEGIN DECLARE {CHECKED} INT DEFAULT 0; \
         DECLARE CONTINUE HANDLER FOR 1062 BEGIN \
         SELECT COUNT(*) INTO {CHECKED} FROM {table} WHERE {} LOCK IN SHARE MODE; \
         IF {CHECKED} = 0 THEN SIGNAL SQLSTATE '23000' SET MYSQL_ERRNO = 1062, \
         MESSAGE_TEXT = 'heatsink: another unique key refuses the new row of this counter key'; \
         END IF; END; {insert}; END",
        found.join(" AND ")
    )
}

/// Whether a row of the key alone (counters at 0, other columns at their defaults)
/// can be a duplicate only of the key's own row: every other unique key of the table
/// holds all of the key's columns whole, or a column the row leaves NULL (NULLs are
/// never duplicates) or AUTO_INCREMENT; and no `BEFORE INSERT` trigger of the table
/// may set the row's columns otherwise.
fn only_the_key_collides(
    table: &Table,
    (key, columns): (&[String], &[String]),
    enforced: &Enforced,
) -> bool {
    let has = |cols: &[String], c: &str| cols.iter().any(|k| k.eq_ignore_ascii_case(c));
    let distinct = |index: &[String]| {
        index.iter().any(|c| {
            !has(key, c)
                && !has(columns, c)
                && table.column(c).is_some_and(|col| {
                    col.extra.contains("auto_increment")
                        || (col.nullable
                            && !col.extra.contains("generated")
                            && col
                                .default
                                .as_deref()
                                .is_none_or(|d| d.eq_ignore_ascii_case("NULL")))
                })
        })
    };
    let whole_ok = table
        .unique
        .iter()
        .all(|(_, index)| key.iter().all(|k| has(index, k)) || distinct(index));
    let prefix_ok = table.unique_prefix.iter().all(|(_, index)| distinct(index));
    let no_before_insert = !enforced
        .triggers
        .iter()
        .any(|t| t.timing.eq_ignore_ascii_case("BEFORE") && t.event.eq_ignore_ascii_case("INSERT"));
    whole_ok && prefix_ok && no_before_insert
}

/// `<verb> INTO table (key…, counters…) VALUES (values…, 0…)`: a counter's row with
/// its key alone, as the slot trigger creates it (`INSERT`) and as the upsert's key
/// probe asks for it (`INSERT IGNORE`).
pub(crate) fn key_row_insert(
    verb: &str,
    table: &str,
    key: &[String],
    columns: &[String],
    values: &[String],
) -> String {
    let cols: Vec<String> = key.iter().chain(columns).map(|c| quote(c)).collect();
    let vals: Vec<String> = values
        .iter()
        .cloned()
        .chain(columns.iter().map(|_| "0".to_string()))
        .collect();
    format!(
        "{verb} INTO {table} ({}) VALUES ({})",
        cols.join(", "),
        vals.join(", ")
    )
}

/// Prints one rule's plan and, with `apply`, executes it.
pub(crate) async fn print_and_apply(
    conn: &mut Conn,
    rule: &CheckedRule,
    apply: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let key = if rule.key.is_empty() {
        "no key: one global counter".to_string()
    } else {
        format!("key {}", list(&rule.key))
    };
    emit(
        out,
        &format!(
            "-- rule {}: counter table {} ({key}; counters {}), {} slots in {}",
            rule.spec.name,
            rule.logical.quoted(),
            list(&rule.columns),
            rule.spec.slots,
            rule.slot.quoted(),
        ),
    )?;
    for note in &rule.notes {
        emit(out, &format!("-- note: {note}"))?;
    }
    let mut statements: Vec<(&str, String)> = Vec::new();
    match &rule.create_table {
        Some(ddl) => statements.push(("created slot table", ddl.clone())),
        None => emit(
            out,
            &format!(
                "-- slot table {} exists and matches the rule",
                rule.slot.quoted()
            ),
        )?,
    }
    match &rule.trigger {
        TriggerPlan::NotNeeded => emit(
            out,
            &format!(
                "-- no trigger: without key columns the counter is the single row of {}, which must exist",
                rule.logical.quoted()
            ),
        )?,
        TriggerPlan::Exists => emit(
            out,
            &format!("-- trigger {} exists and matches the rule", rule.trigger_quoted()),
        )?,
        TriggerPlan::Create(ddl) => statements.push(("created trigger", ddl.clone())),
        TriggerPlan::Replace(ddl) => statements.push(("replaced trigger", ddl.clone())),
    }
    for (done, sql) in statements {
        emit(out, &format!("{sql};"))?;
        if apply {
            conn.query_drop(sql.as_str()).await.map_err(|e| {
                Error::with_cause(
                    Source::Backend,
                    format!("rule {}: executing `{sql}`", rule.spec.name),
                    e,
                )
            })?;
            emit(out, &format!("-- applied: {done}"))?;
        }
    }
    emit(out, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_names_fit() {
        assert_eq!(trigger_name("hits_slots"), "hits_slots_hs_ai");
        let long = "s".repeat(64);
        let t = trigger_name(&long);
        assert_eq!(t.len(), 64);
        assert!(t.ends_with(TRIGGER_SUFFIX));
        assert_ne!(t, trigger_name(&format!("{}t", "s".repeat(63))));
        assert_eq!(trigger_name(&"a".repeat(58)).len(), 64);
    }

    #[test]
    fn trigger_body_creates_the_row_or_fails() {
        let t = TableName::parse("shop.hits").unwrap();
        let key = ["slug".to_string(), "day".to_string()];
        assert_eq!(
            normalize(&trigger_body(&t, &key, &["cnt".into()], true)),
            normalize(
                "BEGIN DECLARE CONTINUE HANDLER FOR 1062 BEGIN END; \
                 INSERT INTO `shop`.`hits` (`slug`, `day`, `cnt`) VALUES (NEW.`slug`, NEW.`day`, 0); END"
            )
        );
        let body = trigger_body(&t, &key, &["cnt".into()], false);
        assert_eq!(
            normalize(&body),
            normalize(
                "BEGIN DECLARE hs_found INT DEFAULT 0; \
                 DECLARE CONTINUE HANDLER FOR 1062 BEGIN \
                 SELECT COUNT(*) INTO hs_found FROM `shop`.`hits` \
                 WHERE `shop`.`hits`.`slug` = NEW.`slug` AND `shop`.`hits`.`day` = NEW.`day` \
                 LOCK IN SHARE MODE; \
                 IF hs_found = 0 THEN SIGNAL SQLSTATE '23000' SET MYSQL_ERRNO = 1062, \
                 MESSAGE_TEXT = 'heatsink: another unique key refuses the new row of this counter key'; \
                 END IF; END; \
                 INSERT INTO `shop`.`hits` (`slug`, `day`, `cnt`) VALUES (NEW.`slug`, NEW.`day`, 0); END"
            )
        );
    }

    /// `hits (slug PK, cnt, <extra>)` with `unique` as its other unique keys.
    fn hits(extra: Vec<Column>, unique: &[&[&str]], prefix: &[&[&str]]) -> Table {
        let keys = |list: &[&[&str]]| -> Vec<(String, Vec<String>)> {
            list.iter()
                .enumerate()
                .map(|(i, cols)| {
                    (
                        format!("u{i}"),
                        cols.iter().map(|c| c.to_string()).collect(),
                    )
                })
                .collect()
        };
        let mut columns = vec![
            Column::for_test("slug", "varchar(64)", false, None),
            Column::for_test("cnt", "int(11)", false, Some("0")),
        ];
        columns.extend(extra);
        let mut all = vec![("PRIMARY".to_string(), vec!["slug".to_string()])];
        all.extend(keys(unique));
        Table {
            table_type: "BASE TABLE".into(),
            engine: Some("InnoDB".into()),
            collation: None,
            charset: None,
            columns,
            primary: Some(vec!["slug".into()]),
            unique: all,
            unique_prefix: keys(prefix),
        }
    }

    #[test]
    fn only_the_key_collides_unless_another_unique_key_can() {
        let key = ["slug".to_string()];
        let counters = ["cnt".to_string()];
        let lone = |t: &Table, e: &Enforced| only_the_key_collides(t, (&key, &counters), e);
        let none = Enforced::default();
        let nullable = |name: &str| Column::for_test(name, "varchar(20)", true, Some("NULL"));
        let with_default = |name: &str| Column::for_test(name, "varchar(20)", false, Some("'x'"));
        let mut id = Column::for_test("id", "int(11)", false, None);
        id.extra = "auto_increment".into();
        assert!(lone(&hits(vec![], &[], &[]), &none));
        // NULLs are never duplicates; nor are AUTO_INCREMENT values, nor keys
        // that hold the counter's key.
        assert!(lone(
            &hits(vec![nullable("note")], &[&["note"]], &[]),
            &none
        ));
        assert!(lone(&hits(vec![id.clone()], &[&["id"]], &[]), &none));
        assert!(lone(
            &hits(vec![with_default("tag")], &[&["tag", "slug"]], &[]),
            &none
        ));
        assert!(lone(
            &hits(
                vec![with_default("tag"), nullable("n")],
                &[&["tag", "n"]],
                &[&["n"]]
            ),
            &none
        ));
        // A default every new row shares, a counter column, a prefix of the key.
        assert!(!lone(
            &hits(vec![with_default("tag")], &[&["tag"]], &[]),
            &none
        ));
        assert!(!lone(&hits(vec![], &[&["cnt"]], &[]), &none));
        assert!(!lone(&hits(vec![], &[], &[&["slug"]]), &none));
        // A BEFORE INSERT trigger may set any column.
        let trigger = Enforced {
            triggers: vec![crate::schema::TableTrigger {
                name: TableName::parse("shop.hits_bi").unwrap(),
                timing: "BEFORE".into(),
                event: "INSERT".into(),
                body: "SET NEW.note = 'x'".into(),
            }],
            ..Enforced::default()
        };
        assert!(!lone(
            &hits(vec![nullable("note")], &[&["note"]], &[]),
            &trigger
        ));
    }
}
