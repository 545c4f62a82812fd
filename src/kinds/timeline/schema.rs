//! What `heatsink migrate` and `check --backend-url` do for a timeline rule.
//!
//! Every mode reads the messages through an index that starts with (author, id),
//! which is checked. Push and hybrid also keep a mailbox.
//!
//! ## The mailbox (the contract with `plan.rs`)
//!
//! ```sql
//! CREATE TABLE mailbox (
//!   `hs_reader` <the follow table's reader type> NOT NULL,
//!   `hs_message` <the message id's type> NOT NULL,
//!   `hs_author` <the message author's type> NOT NULL,
//!   PRIMARY KEY (hs_reader, hs_message),
//!   KEY hs_message (hs_message),            -- a message deleted
//!   KEY hs_reader_author (hs_reader, hs_author)  -- an author unfollowed
//! ) ENGINE=InnoDB
//! ```
//!
//! Its one invariant: every entry `(r, id, a)` is a message `id` by author `a` that
//! reader `r` follows — never an entry more than the timeline holds. It may hold
//! fewer (the reads only take a bound from it, see `plan.rs`). Six `AFTER` triggers,
//! named after the mailbox, keep it in the writer's transaction, for writes through
//! heatsink and straight to the database alike:
//!
//! - `<mailbox>_hs_msg_ins`: a new message is copied to its author's followers with
//!   one `INSERT … SELECT` (hybrid: only when the author has at most `fanout_limit`
//!   followers, counted then);
//! - `<mailbox>_hs_msg_del`: a deleted message leaves every mailbox;
//! - `<mailbox>_hs_msg_upd`: a message whose id or author changed: both;
//! - `<mailbox>_hs_fol_ins`: a follow copies the author's `mailbox_size` newest
//!   messages into the reader's mailbox;
//! - `<mailbox>_hs_fol_del`: an unfollow removes the author's entries from the
//!   reader's mailbox;
//! - `<mailbox>_hs_fol_upd`: a follow row whose reader or author changed: both.
//!
//! Races keep the invariant because every read of another table in a trigger is a
//! locking read (`LOCK IN SHARE MODE`), and every removal finds its entries in the
//! mailbox alone: a message insert and an unfollow of its author meet on the follow
//! row; a follow and a message delete on the message row. `TRUNCATE` fires no
//! trigger: through heatsink it is refused, and done on the database directly the
//! mailbox must be emptied with it.
//!
//! ## The fill (`migrate --apply`, the mailbox empty, the tables not)
//!
//! After the triggers exist, each reader's mailbox gets its timeline's
//! `mailbox_size` newest messages: the `fill` job, run through the job runner
//! ([`crate::jobs`]) once every rule's schema is in place — by `migrate --apply`
//! at its end, or, with `migrate --defer-jobs`, by `heatsink maintain --job fill`
//! (and `serve --maintain-url`). Each chunk is a range of readers
//! (`reader > ?lo AND reader <= ?hi`, `--chunk` readers, 100 by default) filled by
//! one `INSERT IGNORE … SELECT`: the join of their follows and their followees'
//! messages, ranked per reader by id (`DENSE_RANK`), the `mailbox_size` newest
//! kept. Its reads lock what they copy, so a concurrent unfollow or delete either
//! waits for it or is seen by it; an entry a trigger already wrote is skipped.
//!
//! The chunk and its progress row commit together, so a fill stopped at any point
//! continues after the last committed range of readers; a chunk done twice would
//! insert nothing new (`INSERT IGNORE` of entries that are on the timeline). Reads
//! need no finished fill: they take only a bound from the mailbox, and a reader
//! whose mailbox is not filled yet gets pull's bound (see `plan.rs`), so answers
//! are exact throughout, only slower for the readers not filled yet.
//!
//! ## Size
//!
//! The `trim` job of `heatsink maintain` cuts each reader's mailbox to its
//! `mailbox_size` newest entries; reads of older pages take pull's bound.

use std::io::Write;

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

use super::spec::{Serve, TimelineSpec};
use crate::error::{Error, Result, Source};
use crate::jobs::{JobKey, JobState};
use crate::kinds::{JobContext, JobReport, Migration, SchemaError};
use crate::report::Severity;
use crate::rules::spec::{quote, TableName};
use crate::schema::{
    emit, enforced, existing_and_missing, inspect_base_table, inspect_table, needed_trigger,
    refuse_changing_foreign_keys, resolve_tables, run_sql, schema_err, suffixed_name,
    table_has_rows, text, Column, NeededTrigger, Table, TriggerState,
};

/// The mailbox's reader column.
pub const MAILBOX_READER: &str = "hs_reader";
/// The mailbox's message id column.
pub const MAILBOX_MESSAGE: &str = "hs_message";
/// The mailbox's author column.
pub const MAILBOX_AUTHOR: &str = "hs_author";

/// Readers per chunk of the fill when `--chunk` is not given.
pub const FILL_CHUNK: usize = 100;

/// The fill's name as a job (`heatsink maintain --job fill`).
pub const FILL: &str = "fill";

/// A write event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Insert,
    Update,
    Delete,
}

impl Event {
    fn sql(self) -> &'static str {
        match self {
            Event::Insert => "INSERT",
            Event::Update => "UPDATE",
            Event::Delete => "DELETE",
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Event::Insert => "_ins",
            Event::Update => "_upd",
            Event::Delete => "_del",
        }
    }
}

/// A piece of a trigger body for a row (`NEW` or `OLD`).
type Piece = fn(&Names, &str) -> String;

/// Names and columns the triggers and the backfill are written with.
#[derive(Debug, Clone)]
struct Names {
    messages: TableName,
    follows: TableName,
    mailbox: TableName,
    id: String,
    author: String,
    reader: String,
    followed: String,
    mode: Serve,
    fanout_limit: u32,
    mailbox_size: u32,
}

/// The push or hybrid part of a checked rule.
struct Mailbox {
    names: Names,
    /// `CREATE TABLE` when the mailbox is missing.
    create_table: Option<String>,
    triggers: Vec<NeededTrigger>,
    /// The fill has work left: the mailbox is empty and the tables are not, or a
    /// fill stopped half way.
    backfill_due: bool,
    /// The fill's progress row.
    job: JobKey,
    /// Where a fill stopped half way, if one did.
    stopped: Option<JobState>,
}

/// A timeline rule checked against the database.
pub(crate) struct CheckedTimeline {
    name: String,
    mode: Serve,
    messages: TableName,
    /// The message table's AUTO_INCREMENT column.
    id: String,
    /// An index of the messages starting with (author, id), by name.
    index: Option<String>,
    author: String,
    mailbox: Option<Mailbox>,
}

/// Checks one timeline rule against the database.
pub(crate) async fn check(
    conn: &mut Conn,
    spec: &TimelineSpec,
    default_db: Option<&str>,
) -> std::result::Result<CheckedTimeline, SchemaError> {
    let refuse = SchemaError::Refused;
    spec.validate().map_err(refuse)?;
    let mut physical = vec![spec.follows.as_str()];
    if let Some(m) = &spec.mailbox {
        physical.push(m);
    }
    let (messages, others) = resolve_tables(&spec.messages, &physical, default_db)?;
    let table = inspect_base_table(conn, &messages).await?;
    let id_col = table
        .columns
        .iter()
        .find(|c| c.extra.contains("auto_increment"))
        .cloned()
        .ok_or_else(|| {
            refuse(format!(
                "{} has no AUTO_INCREMENT column, which orders a timeline",
                messages.quoted()
            ))
        })?;
    let author_col = table.column(&spec.message_author).cloned().ok_or_else(|| {
        refuse(format!(
            "message_author `{}` is not a column of {}",
            spec.message_author,
            messages.quoted()
        ))
    })?;
    let follows = others[0].clone();
    let follow_table = inspect_base_table(conn, &follows).await?;
    for c in [&spec.follow_reader, &spec.follow_author] {
        if follow_table.column(c).is_none() {
            return Err(refuse(format!(
                "`{c}` is not a column of {}",
                follows.quoted()
            )));
        }
    }
    if let Some(mb) = others.get(1) {
        // The mailbox is kept by triggers on both tables; a cascade skips them.
        let kept = format!("the mailbox {}", mb.quoted());
        for t in [&messages, &follows] {
            refuse_changing_foreign_keys(t, &enforced(conn, t).await?, &kept)?;
        }
    }
    let index = author_id_index(conn, &messages, &spec.message_author, &id_col.name).await?;
    let mailbox = match others.get(1) {
        None => None,
        Some(mb) => {
            let names = Names {
                messages: messages.clone(),
                follows: follows.clone(),
                mailbox: mb.clone(),
                id: id_col.name.clone(),
                author: author_col.name.clone(),
                reader: spec.follow_reader.clone(),
                followed: spec.follow_author.clone(),
                mode: spec.mode,
                fanout_limit: spec.fanout_limit,
                mailbox_size: spec.mailbox_size,
            };
            let reader_col = follow_table
                .column(&spec.follow_reader)
                .ok_or_else(|| refuse("no reader column".into()))?;
            Some(
                check_mailbox(
                    conn,
                    names,
                    &spec.name,
                    reader_col,
                    &id_col,
                    &author_col,
                    &table,
                )
                .await?,
            )
        }
    };
    Ok(CheckedTimeline {
        name: spec.name.clone(),
        mode: spec.mode,
        messages,
        id: id_col.name,
        index,
        author: spec.message_author.clone(),
        mailbox,
    })
}

async fn check_mailbox(
    conn: &mut Conn,
    names: Names,
    rule: &str,
    reader: &Column,
    id: &Column,
    author: &Column,
    messages: &Table,
) -> std::result::Result<Mailbox, SchemaError> {
    let refuse = SchemaError::Refused;
    let existing = inspect_table(conn, &names.mailbox).await?;
    let wanted = [
        (MAILBOX_READER, reader),
        (MAILBOX_MESSAGE, id),
        (MAILBOX_AUTHOR, author),
    ];
    let create_table = match &existing {
        None => Some(create_table_sql(&names, &wanted, messages)),
        Some(t) => {
            for (name, col) in wanted {
                match t.column(name) {
                    Some(c) if c.same_type(col) => {}
                    _ => {
                        return Err(refuse(format!(
                            "{} exists but its column `{name}` is missing or not {} like the column it copies; drop it and run migrate again",
                            names.mailbox.quoted(),
                            col.type_sql()
                        )))
                    }
                }
            }
            let pk_fits = t.primary.as_ref().is_some_and(|p| {
                p.len() == 2
                    && p[0].eq_ignore_ascii_case(MAILBOX_READER)
                    && p[1].eq_ignore_ascii_case(MAILBOX_MESSAGE)
            });
            if !pk_fits {
                return Err(refuse(format!(
                    "{} exists but its primary key is not ({MAILBOX_READER}, {MAILBOX_MESSAGE}); drop it and run migrate again",
                    names.mailbox.quoted()
                )));
            }
            None
        }
    };
    let triggers = plan_triggers(conn, &names).await?;
    let has_rows = match existing {
        Some(_) => table_has_rows(conn, &names.mailbox).await?,
        None => false,
    };
    if has_rows && triggers.iter().any(|t| t.state == TriggerState::Missing) {
        return Err(refuse(format!(
            "{} holds entries but its triggers are missing, so it may hold messages a reader no longer sees; empty it (TRUNCATE) and run migrate again",
            names.mailbox.quoted()
        )));
    }
    let job = fill_key(&names, rule);
    let stopped = crate::jobs::state(conn, &job)
        .await
        .map_err(SchemaError::Failed)?;
    // Unfinished: continue. Otherwise an empty mailbox over tables with rows is
    // filled (also after a done fill of a mailbox since emptied).
    let unfinished = stopped.as_ref().is_some_and(JobState::unfinished);
    let backfill_due = unfinished
        || (!has_rows
            && table_has_rows(conn, &names.follows).await?
            && table_has_rows(conn, &names.messages).await?);
    Ok(Mailbox {
        names,
        create_table,
        triggers,
        backfill_due,
        job,
        stopped: stopped.filter(JobState::unfinished),
    })
}

fn create_table_sql(names: &Names, cols: &[(&str, &Column)], messages: &Table) -> String {
    let columns: Vec<String> = cols
        .iter()
        .map(|(name, c)| {
            // The copied type without AUTO_INCREMENT or defaults: NOT NULL.
            format!("  {} {} NOT NULL", quote(name), c.type_sql())
        })
        .collect();
    format!(
        "CREATE TABLE {} (\n{},\n  PRIMARY KEY ({}, {}),\n  KEY {} ({}),\n  KEY `hs_reader_author` ({}, {})\n) ENGINE=InnoDB{}",
        names.mailbox.quoted(),
        columns.join(",\n"),
        quote(MAILBOX_READER),
        quote(MAILBOX_MESSAGE),
        quote(MAILBOX_MESSAGE),
        quote(MAILBOX_MESSAGE),
        quote(MAILBOX_READER),
        quote(MAILBOX_AUTHOR),
        messages
            .charset
            .as_ref()
            .map(|c| format!(" DEFAULT CHARSET={c}"))
            .unwrap_or_default()
    )
}

impl Names {
    fn mb_cols(&self) -> String {
        format!(
            "({}, {}, {})",
            quote(MAILBOX_READER),
            quote(MAILBOX_MESSAGE),
            quote(MAILBOX_AUTHOR)
        )
    }

    /// Copies message `row` (`NEW`) to its author's followers.
    fn fan_out(&self, row: &str) -> String {
        let (id, author) = (quote(&self.id), quote(&self.author));
        let (reader, followed) = (quote(&self.reader), quote(&self.followed));
        let copy = format!(
            "INSERT IGNORE INTO {} {} SELECT `hs_f`.{reader}, {row}.{id}, {row}.{author} \
             FROM {} AS `hs_f` WHERE `hs_f`.{followed} = {row}.{author} AND `hs_f`.{reader} IS NOT NULL \
             LOCK IN SHARE MODE;",
            self.mailbox.quoted(),
            self.mb_cols(),
            self.follows.quoted()
        );
        match self.mode {
            Serve::Hybrid => format!(
                "IF (SELECT COUNT(*) FROM (SELECT 1 FROM {} WHERE {followed} = {row}.{author} LIMIT {}) AS `hs_n`) <= {} THEN {copy} END IF;",
                self.follows.quoted(),
                u64::from(self.fanout_limit) + 1,
                self.fanout_limit
            ),
            _ => copy,
        }
    }

    /// Removes message `row` (`OLD`) from every mailbox.
    fn unpost(&self, row: &str) -> String {
        format!(
            "DELETE FROM {} WHERE {} = {row}.{};",
            self.mailbox.quoted(),
            quote(MAILBOX_MESSAGE),
            quote(&self.id)
        )
    }

    /// Copies the followed author's newest messages into the reader's mailbox
    /// (follow row `row`).
    fn follow(&self, row: &str) -> String {
        let (id, author) = (quote(&self.id), quote(&self.author));
        let (reader, followed) = (quote(&self.reader), quote(&self.followed));
        format!(
            "INSERT IGNORE INTO {} {} SELECT {row}.{reader}, `hs_m`.{id}, `hs_m`.{author} \
             FROM {} AS `hs_m` WHERE `hs_m`.{author} = {row}.{followed} AND {row}.{reader} IS NOT NULL \
             ORDER BY `hs_m`.{id} DESC LIMIT {} LOCK IN SHARE MODE;",
            self.mailbox.quoted(),
            self.mb_cols(),
            self.messages.quoted(),
            self.mailbox_size
        )
    }

    /// Removes the followed author's messages from the reader's mailbox.
    fn unfollow(&self, row: &str) -> String {
        format!(
            "DELETE FROM {} WHERE {} = {row}.{} AND {} = {row}.{};",
            self.mailbox.quoted(),
            quote(MAILBOX_READER),
            quote(&self.reader),
            quote(MAILBOX_AUTHOR),
            quote(&self.followed)
        )
    }

    fn trigger_body(&self, on_messages: bool, event: Event) -> String {
        let (id_or_reader, author_or_followed) = if on_messages {
            (quote(&self.id), quote(&self.author))
        } else {
            (quote(&self.reader), quote(&self.followed))
        };
        let (remove, add): (Piece, Piece) = if on_messages {
            (Names::unpost, Names::fan_out)
        } else {
            (Names::unfollow, Names::follow)
        };
        let body = match event {
            Event::Insert => add(self, "NEW"),
            Event::Delete => remove(self, "OLD"),
            Event::Update => format!(
                "IF NOT (OLD.{id_or_reader} <=> NEW.{id_or_reader} AND OLD.{author_or_followed} <=> NEW.{author_or_followed}) THEN {} {} END IF;",
                remove(self, "OLD"),
                add(self, "NEW")
            ),
        };
        format!("BEGIN {body} END")
    }

    fn trigger_name(&self, on_messages: bool, event: Event) -> TableName {
        let which = if on_messages { "_hs_msg" } else { "_hs_fol" };
        TableName {
            db: self.mailbox.db.clone(),
            name: suffixed_name(&self.mailbox.name, &format!("{which}{}", event.suffix())),
        }
    }

    /// The fill of a range of readers (`reader > ?` or from the first, `[AND
    /// reader <= ?]`): each one's
    /// `mailbox_size` newest timeline messages into their mailbox.
    fn fill_sql(&self, after: bool, upto: bool) -> String {
        let (id, author) = (quote(&self.id), quote(&self.author));
        let (reader, followed) = (quote(&self.reader), quote(&self.followed));
        let from = if after {
            format!("`hs_f`.{reader} > ?")
        } else {
            format!("`hs_f`.{reader} IS NOT NULL")
        };
        let upto = if upto {
            format!(" AND `hs_f`.{reader} <= ?")
        } else {
            String::new()
        };
        format!(
            "INSERT IGNORE INTO {mb} {cols} SELECT `hs_w`.`hs_r`, `hs_w`.`hs_i`, `hs_w`.`hs_a` FROM \
             (SELECT `hs_f`.{reader} AS `hs_r`, `hs_m`.{id} AS `hs_i`, `hs_m`.{author} AS `hs_a`, \
             DENSE_RANK() OVER (PARTITION BY `hs_f`.{reader} ORDER BY `hs_m`.{id} DESC) AS `hs_n` \
             FROM {f} AS `hs_f` STRAIGHT_JOIN {m} AS `hs_m` ON `hs_m`.{author} = `hs_f`.{followed} \
             WHERE {from}{upto}) AS `hs_w` WHERE `hs_w`.`hs_n` <= {size}",
            mb = self.mailbox.quoted(),
            cols = self.mb_cols(),
            f = self.follows.quoted(),
            m = self.messages.quoted(),
            size = self.mailbox_size,
        )
    }
}

/// The six triggers and their state; refused when a trigger of one of their names
/// is something else.
async fn plan_triggers(
    conn: &mut Conn,
    names: &Names,
) -> std::result::Result<Vec<NeededTrigger>, SchemaError> {
    let mut out = Vec::new();
    for on_messages in [true, false] {
        let table = if on_messages {
            &names.messages
        } else {
            &names.follows
        };
        for event in [Event::Insert, Event::Update, Event::Delete] {
            let name = names.trigger_name(on_messages, event);
            let body = names.trigger_body(on_messages, event);
            let create = format!(
                "CREATE TRIGGER {} AFTER {} ON {} FOR EACH ROW {body}",
                name.quoted(),
                event.sql(),
                table.quoted()
            );
            out.push(
                needed_trigger(
                    conn,
                    name,
                    (table, event.sql()),
                    &body,
                    create,
                    "the mailbox",
                )
                .await?,
            );
        }
    }
    Ok(out)
}

/// The name of an index of `t` whose first two columns are `author` and `id`.
async fn author_id_index(
    conn: &mut Conn,
    t: &TableName,
    author: &str,
    id: &str,
) -> std::result::Result<Option<String>, SchemaError> {
    let rows: Vec<Row> = conn
        .exec(
            "SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX SEPARATOR ',') \
             FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? \
             GROUP BY INDEX_NAME",
            (t.db.clone().unwrap_or_default(), t.name.clone()),
        )
        .await
        .map_err(|e| schema_err(format!("reading the indexes of {}", t.quoted()), e))?;
    Ok(rows.iter().find_map(|r| {
        let cols = text(r, 1)?;
        let mut it = cols.split(',');
        let starts = it.next()?.eq_ignore_ascii_case(author)
            && it.next().is_some_and(|c| c.eq_ignore_ascii_case(id));
        starts.then(|| text(r, 0)).flatten()
    }))
}

impl CheckedTimeline {
    fn missing_index(&self) -> String {
        format!(
            "{} has no index starting with ({}, {}): every timeline read would read each followee's messages in full (add one: ALTER TABLE {} ADD KEY ({}, {}))",
            self.messages.quoted(),
            self.author,
            self.id,
            self.messages.quoted(),
            quote(&self.author),
            quote(&self.id)
        )
    }
}

impl Mailbox {
    fn problems(&self) -> Vec<(Severity, String)> {
        let mut out = Vec::new();
        let mb = self.names.mailbox.quoted();
        if self.create_table.is_some() {
            out.push((
                Severity::Error,
                format!("mailbox {mb} does not exist (`heatsink migrate` creates it)"),
            ));
        }
        for t in &self.triggers {
            match t.state {
                TriggerState::Missing => out.push((
                    Severity::Error,
                    format!(
                        "trigger {} is missing, so writes would not reach mailbox {mb} (`heatsink migrate` creates it)",
                        t.name.quoted()
                    ),
                )),
                TriggerState::Differs => out.push((
                    Severity::Warning,
                    format!(
                        "trigger {} differs from the rule's; mailbox {mb} may not be kept (drop it and run `heatsink migrate` to replace it)",
                        t.name.quoted()
                    ),
                )),
                TriggerState::Fits => {}
            }
        }
        if self.backfill_due {
            out.push((
                Severity::Warning,
                format!("mailbox {mb} is not filled yet: reads take pull's bound for the readers not filled until `heatsink migrate --apply` (or `heatsink maintain --job fill --apply`) fills it"),
            ));
        }
        out
    }

    async fn run(
        &self,
        conn: &mut Conn,
        rule: &str,
        apply: bool,
        out: &mut dyn Write,
    ) -> Result<()> {
        let mb = self.names.mailbox.quoted();
        match &self.create_table {
            Some(sql) => {
                emit(out, &format!("{sql};"))?;
                if apply {
                    run_sql(conn, rule, sql).await?;
                    emit(out, "-- applied: created the mailbox")?;
                }
            }
            None => emit(out, &format!("-- mailbox {mb} exists and matches the rule"))?,
        }
        let missing = existing_and_missing(&self.triggers, out)?;
        if !missing.is_empty() {
            emit(out, "DELIMITER ;;")?;
            for t in &missing {
                emit(out, &format!("{t};;"))?;
            }
            emit(out, "DELIMITER ;")?;
            if apply {
                for t in &missing {
                    run_sql(conn, rule, t).await?;
                }
                emit(
                    out,
                    &format!("-- applied: created {} triggers", missing.len()),
                )?;
            }
        }
        if self.backfill_due {
            let from = match &self.stopped {
                Some(st) => match &st.position {
                    Some(p) => format!(
                        ", continuing after reader {p} ({} readers done)",
                        st.rows_done
                    ),
                    None => String::new(),
                },
                None => String::new(),
            };
            emit(
                out,
                &format!(
                    "-- fill (job '{FILL}', after the schema of every rule; resumable): for each range of readers ?lo < reader <= ?hi of {}, their {} newest timeline messages{from}:",
                    self.names.follows.quoted(),
                    self.names.mailbox_size
                ),
            )?;
            emit(out, &format!("--   {};", self.names.fill_sql(true, true)))?;
            if apply && self.stopped.is_none() {
                crate::jobs::reset(conn, &self.job, crate::jobs::PENDING).await?;
            }
        }
        Ok(())
    }

    /// Runs the fill to its end through the job runner (from where it stopped).
    async fn fill(
        &self,
        conn: &mut Conn,
        settings: &crate::jobs::Settings,
        out: &mut dyn Write,
    ) -> Result<()> {
        run_sql(
            conn,
            &self.job.rule,
            "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        )
        .await?;
        if self.stopped.is_none() {
            // A fresh fill (or one of a mailbox emptied since it was done).
            crate::jobs::reset(conn, &self.job, crate::jobs::PENDING).await?;
        }
        let mut settings = settings.clone();
        settings.chunk = Some(settings.chunk_or(FILL_CHUNK));
        let mut job = Fill { names: &self.names };
        match crate::jobs::run(conn, &self.job, &settings, &mut job).await? {
            crate::jobs::Outcome::Busy => emit(
                out,
                &format!(
                    "-- rule {}: the fill of {} is running elsewhere; skipped",
                    self.job.rule,
                    self.names.mailbox.quoted()
                ),
            ),
            crate::jobs::Outcome::Done { this_run, total } => emit(
                out,
                &format!("-- applied: filled the mailboxes of {this_run} readers ({total} in all)"),
            ),
        }
    }
}

/// The fill's progress row: `(rule, 'fill')` in the messages' database.
fn fill_key(names: &Names, rule: &str) -> JobKey {
    JobKey {
        db: names.messages.db.clone().unwrap_or_default(),
        rule: rule.to_string(),
        job: FILL,
    }
}

/// A reader key as a statement parameter: an integer when it reads as one (an
/// integer column compared with a string would be compared as doubles).
fn key_param(v: &str) -> mysql_async::Value {
    match v.parse::<i64>() {
        Ok(n) => mysql_async::Value::Int(n),
        Err(_) => mysql_async::Value::Bytes(v.as_bytes().to_vec()),
    }
}

/// The fill as a job of the runner: chunks of readers.
struct Fill<'a> {
    names: &'a Names,
}

#[async_trait(?Send)]
impl crate::jobs::Chunked for Fill<'_> {
    fn unit(&self) -> &'static str {
        "readers"
    }

    async fn total(&mut self, conn: &mut Conn, after: Option<&str>) -> Result<u64> {
        let r = quote(&self.names.reader);
        let f = self.names.follows.quoted();
        let n: Option<u64> = match after {
            None => {
                conn.query_first(format!("SELECT COUNT(DISTINCT {r}) FROM {f}"))
                    .await
            }
            Some(a) => {
                conn.exec_first(
                    format!("SELECT COUNT(DISTINCT {r}) FROM {f} WHERE {r} > ?"),
                    (key_param(a),),
                )
                .await
            }
        }
        .map_err(|e| schema_err(format!("counting the readers of {f}"), e))?;
        Ok(n.unwrap_or(0))
    }

    async fn chunk(
        &mut self,
        conn: &mut Conn,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Option<crate::jobs::Step>> {
        let r = quote(&self.names.reader);
        let f = self.names.follows.quoted();
        let from = match after {
            Some(_) => format!("{r} > ?"),
            None => format!("{r} IS NOT NULL"),
        };
        let lo: Vec<mysql_async::Value> = after.map(key_param).into_iter().collect();
        // The chunk's last reader: the limit-th after `after`, else the last one.
        let row: Option<Row> = conn
            .exec_first(
                format!(
                    "SELECT CAST(MAX(`hs_r`) AS CHAR), CAST(COUNT(*) AS CHAR) FROM (SELECT DISTINCT {r} AS `hs_r` FROM {f} \
                     WHERE {from} ORDER BY {r} LIMIT {limit}) AS `hs_c`"
                ),
                lo.clone(),
            )
            .await
            .map_err(|e| schema_err(format!("listing the readers of {f}"), e))?;
        let Some(row) = row else { return Ok(None) };
        let (Some(hi), Some(n)) = (text(&row, 0), text(&row, 1)) else {
            return Ok(None);
        };
        let n: u64 = n.parse().unwrap_or(0);
        let mut params = lo;
        params.push(key_param(&hi));
        conn.exec_drop(self.names.fill_sql(after.is_some(), true), params)
            .await
            .map_err(|e| {
                Error::with_cause(
                    Source::Backend,
                    format!("filling {}", self.names.mailbox.quoted()),
                    e,
                )
            })?;
        Ok(Some(crate::jobs::Step { last: hi, rows: n }))
    }
}

#[async_trait(?Send)]
impl Migration for CheckedTimeline {
    async fn problems(&self, _conn: &mut Conn) -> Result<Vec<(Severity, String)>> {
        let mut out = Vec::new();
        if self.index.is_none() {
            out.push((Severity::Error, self.missing_index()));
        }
        if let Some(mb) = &self.mailbox {
            out.extend(mb.problems());
        }
        Ok(out)
    }

    async fn run(&self, conn: &mut Conn, apply: bool, out: &mut dyn Write) -> Result<()> {
        let what = match &self.mailbox {
            None => ": nothing to create",
            Some(_) => "",
        };
        emit(
            out,
            &format!(
                "-- rule {}: timeline ({}) over {}{what}",
                self.name,
                self.mode.name(),
                self.messages.quoted()
            ),
        )?;
        match &self.index {
            Some(i) => emit(out, &format!("-- index `{i}` serves the timeline reads"))?,
            None => emit(out, &format!("-- warning: {}", self.missing_index()))?,
        }
        if let Some(mb) = &self.mailbox {
            mb.run(conn, &self.name, apply, out).await?;
        }
        emit(out, "")
    }

    async fn run_jobs(
        &self,
        conn: &mut Conn,
        jobs: &crate::jobs::Settings,
        out: &mut dyn Write,
    ) -> Result<()> {
        match &self.mailbox {
            Some(mb) if mb.backfill_due => mb.fill(conn, jobs, out).await,
            _ => Ok(()),
        }
    }
}

/// The `fill` job: the mailboxes filled when the fill has work left (see the
/// module's notes); without apply, what it would do.
pub(crate) async fn fill(spec: &TimelineSpec, ctx: &mut JobContext<'_>) -> Result<JobReport> {
    let checked = match check(ctx.conn, spec, ctx.default_db).await {
        Ok(c) => c,
        Err(SchemaError::Refused(r)) => return Err(Error::new(Source::Rules, r)),
        Err(SchemaError::Failed(e)) => return Err(e),
    };
    let Some(mb) = &checked.mailbox else {
        return Ok(JobReport {
            summary: "pull mode: no mailbox".into(),
            failed: Vec::new(),
        });
    };
    if mb.create_table.is_some() || mb.triggers.iter().any(|t| t.state != TriggerState::Fits) {
        return Ok(JobReport {
            summary:
                "the mailbox or its triggers are missing: run `heatsink migrate --apply` first"
                    .into(),
            failed: Vec::new(),
        });
    }
    if !mb.backfill_due {
        return Ok(JobReport {
            summary: "nothing to fill".into(),
            failed: Vec::new(),
        });
    }
    if !ctx.apply {
        emit(ctx.out, &format!("--   {};", mb.names.fill_sql(true, true)))?;
        return Ok(JobReport {
            summary: "dry run: the mailboxes would be filled".into(),
            failed: Vec::new(),
        });
    }
    let mut out = Vec::new();
    mb.fill(ctx.conn, &ctx.jobs, &mut out).await?;
    Ok(JobReport {
        summary: String::from_utf8_lossy(&out)
            .trim()
            .trim_start_matches("-- ")
            .to_string(),
        failed: Vec::new(),
    })
}

/// The `trim` job: each reader's mailbox cut to its `mailbox_size` newest entries.
pub(crate) async fn trim(spec: &TimelineSpec, ctx: &mut JobContext<'_>) -> Result<JobReport> {
    let Some(mailbox) = &spec.mailbox else {
        return Ok(JobReport {
            summary: "pull mode: no mailbox".into(),
            failed: Vec::new(),
        });
    };
    let mb = match resolve_tables(&spec.messages, &[mailbox], ctx.default_db) {
        Ok((_, t)) if !t.is_empty() => t[0].clone(),
        Ok(_) => return Err(Error::new(Source::Internal, "no mailbox table")),
        Err(SchemaError::Refused(r)) => return Err(Error::new(Source::Rules, r)),
        Err(SchemaError::Failed(e)) => return Err(e),
    };
    let size = u64::from(spec.mailbox_size);
    let (reader, message) = (quote(MAILBOX_READER), quote(MAILBOX_MESSAGE));
    let over = format!(
        "SELECT {reader}, COUNT(*) FROM {} WHERE {reader} > ? GROUP BY {reader} HAVING COUNT(*) > {size} ORDER BY {reader} LIMIT {}",
        mb.quoted(),
        ctx.batch.max(1)
    );
    let first = format!(
        "SELECT {reader}, COUNT(*) FROM {} GROUP BY {reader} HAVING COUNT(*) > {size} ORDER BY {reader} LIMIT {}",
        mb.quoted(),
        ctx.batch.max(1)
    );
    let kth = format!(
        "SELECT {message} FROM {} WHERE {reader} = ? ORDER BY {message} DESC LIMIT 1 OFFSET {}",
        mb.quoted(),
        size - 1
    );
    let cut = format!(
        "DELETE FROM {} WHERE {reader} = ? AND {message} < ?",
        mb.quoted()
    );
    let backend = |what: &str, e| {
        Error::with_cause(
            Source::Backend,
            format!("rule {}: {what} {}", spec.name, mb.quoted()),
            e,
        )
    };
    let (mut readers, mut removed) = (0u64, 0u64);
    let mut after: Option<mysql_async::Value> = None;
    loop {
        let rows: Vec<Row> = match &after {
            None => ctx.conn.exec(first.as_str(), ()).await,
            Some(v) => ctx.conn.exec(over.as_str(), (v.clone(),)).await,
        }
        .map_err(|e| backend("listing the readers of", e))?;
        let list: Vec<(mysql_async::Value, u64)> = rows
            .into_iter()
            .filter_map(|mut r| Some((r.take::<mysql_async::Value, usize>(0)?, r.take(1)?)))
            .collect();
        let Some(last) = list.last().map(|(r, _)| r.clone()) else {
            break;
        };
        for (r, n) in list {
            if !ctx.apply {
                // A dry run: what the cut would remove.
                readers += 1;
                removed += n.saturating_sub(size);
                continue;
            }
            let k: Option<mysql_async::Value> = ctx
                .conn
                .exec_first(kth.as_str(), (r.clone(),))
                .await
                .map_err(|e| backend("reading", e))?;
            if let Some(k) = k {
                ctx.conn
                    .exec_drop(cut.as_str(), (r, k))
                    .await
                    .map_err(|e| backend("trimming", e))?;
                removed += ctx.conn.affected_rows();
                readers += 1;
            }
        }
        after = Some(last);
    }
    if !ctx.apply {
        emit(
            ctx.out,
            &format!("-- for each reader ? with more than {size} entries: {kth}; then {cut} with the id read"),
        )?;
        return Ok(JobReport {
            summary: format!(
                "dry run: {readers} mailboxes hold more than {size} entries; trimming would remove {removed}"
            ),
            failed: Vec::new(),
        });
    }
    Ok(JobReport {
        summary: format!(
            "{readers} mailboxes trimmed to {size} entries, {removed} entries removed"
        ),
        failed: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(mode: Serve) -> Names {
        let t = |n: &str| TableName {
            db: Some("shop".into()),
            name: n.into(),
        };
        Names {
            messages: t("message"),
            follows: t("follower"),
            mailbox: t("mailbox"),
            id: "id".into(),
            author: "user_id".into(),
            reader: "user_id".into(),
            followed: "follower_id".into(),
            mode,
            fanout_limit: 1000,
            mailbox_size: 200,
        }
    }

    #[test]
    fn trigger_bodies_parse_as_sql() {
        // Each body is a compound statement; its statements must parse.
        for mode in [Serve::Push, Serve::Hybrid] {
            let n = names(mode);
            for on_messages in [true, false] {
                for event in [Event::Insert, Event::Update, Event::Delete] {
                    let body = n.trigger_body(on_messages, event);
                    assert!(
                        body.starts_with("BEGIN ") && body.ends_with(" END"),
                        "{body}"
                    );
                    let name = n.trigger_name(on_messages, event);
                    assert!(name.name.starts_with("mailbox_hs_"), "{}", name.name);
                }
            }
            let fan = n.fan_out("NEW");
            assert_eq!(
                fan.contains("IF (SELECT COUNT(*)"),
                mode == Serve::Hybrid,
                "{fan}"
            );
            assert!(fan.contains("LOCK IN SHARE MODE"), "{fan}");
        }
        for (after, upto) in [(false, false), (true, true)] {
            let fill = names(Serve::Push).fill_sql(after, upto);
            crate::rewrite::parse_statements(&fill.replace('?', "1")).expect(&fill);
        }
    }
}
