//! `heatsink migrate --revert RULE`: takes a rule back out of the database.
//!
//! The order with running proxies (docs/design.md, "Removing a rule"): the DBA
//! first removes the rule from the rule files of every proxy and reloads them
//! (`RELOAD RULES` on each admin port, or SIGHUP; `SHOW RULES` confirms), and only
//! then runs the revert. Until a proxy reloads, its writes go to the rule's side
//! tables; after, they go to the logical table. The revert is correct whenever it
//! runs after the last proxy dropped the rule, and each kind makes it safe to run
//! again (see [`crate::kinds::RuleSpec::revert`]).
//!
//! The rule's definition comes from the `heatsink_rules` table that `migrate
//! --apply` writes ([`crate::registry`]), since it is no longer in the rule files.
//! The revert refuses a rule that is still in `--rules` (those are the files the
//! proxies load), a rule that is not registered, and — for kinds whose side tables
//! only a proxy running the rule writes — a rule whose side table changes while it
//! is watched for `--observe` seconds.
//!
//! Like every migrate job it only prints what it would do unless `--apply` is given.

use std::io::Write;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

use crate::error::{Error, Result, Source};
use crate::kinds::{Leftovers, RevertContext};
use crate::registry::{self, Registered};
use crate::rules::spec::TableName;
use crate::schema::{connect, emit, existing_trigger, inspect_table, run_sql, schema_err};

/// What `heatsink migrate --revert` was asked to do.
#[derive(Debug, Clone)]
pub struct RevertOptions<'a> {
    /// The rule files the proxies load: the rule must no longer be in them.
    pub rules: &'a std::path::Path,
    /// `mysql://…` of the database.
    pub backend_url: &'a str,
    /// The rule to revert.
    pub rule: &'a str,
    /// Execute instead of only printing.
    pub apply: bool,
    /// How long side tables only proxies running the rule write are watched first.
    pub observe: Duration,
    /// Keys per transaction where a kind folds in chunks.
    pub batch: usize,
}

/// Reverts one rule (see the module documentation).
pub async fn run(opts: &RevertOptions<'_>, out: &mut dyn Write) -> Result<()> {
    let name = opts.rule;
    let in_files = crate::rules::specs(opts.rules)?
        .into_iter()
        .find(|s| s.name() == name);
    let draining = match &in_files {
        None => false,
        Some(s) if s.draining() => true,
        Some(_) => {
            return Err(Error::new(
                Source::Rules,
                format!(
                    "revert refused, nothing was changed: rule '{name}' is still in {}: remove \
                     it from the rule files of every proxy, reload each (RELOAD RULES on its \
                     admin port or SIGHUP; SHOW RULES must no longer list it), then run \
                     `heatsink migrate --revert {name}` again (a counter can first drain: \
                     `drain = true`, see rules/README.md)",
                    opts.rules.display()
                ),
            ))
        }
    };
    let mut conn = connect(opts.backend_url).await?;
    let result = revert(&mut conn, opts, draining, out).await;
    let _ = conn.disconnect().await;
    result
}

async fn revert(
    conn: &mut Conn,
    opts: &RevertOptions<'_>,
    draining: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let name = opts.rule;
    let only = crate::schema::default_db(opts.backend_url)?;
    let mut found: Vec<Registered> = registry::all(conn, only.as_deref())
        .await?
        .into_iter()
        .filter(|r| r.name == name)
        .collect();
    let reg = match found.len() {
        0 => {
            return Err(Error::new(
                Source::Rules,
                format!(
                    "revert refused, nothing was changed: rule '{name}' is not recorded in {}, \
                     so its tables are unknown: run `heatsink migrate --apply --rule {name}` \
                     with a rule file that still holds the rule (it creates nothing that \
                     exists, and records the rule), then the revert",
                    match &only {
                        Some(db) => registry::registry_table(db).quoted(),
                        None => format!("any {} table", registry::TABLE),
                    }
                ),
            ))
        }
        1 => found.remove(0),
        _ => {
            let dbs: Vec<String> = found.iter().map(|r| r.db.clone()).collect();
            return Err(Error::new(
                Source::Rules,
                format!(
                    "revert refused, nothing was changed: rule '{name}' is recorded in several \
                     databases ({}): name the one to revert in --backend-url",
                    dbs.join(", ")
                ),
            ));
        }
    };
    let spec = reg.rule()?;
    emit(
        out,
        &format!(
            "-- revert {} '{name}' on {} (recorded in {}{})",
            reg.kind,
            reg.logical_table,
            reg.table().quoted(),
            match reg.state.as_deref() {
                Some(s) => format!(", state {s}"),
                None => String::new(),
            }
        ),
    )?;
    if !opts.apply {
        emit(out, "-- dry run: nothing is changed; --apply runs it")?;
    }
    let db = reg.db.clone();
    let mut ctx = RevertContext {
        conn,
        default_db: Some(&db),
        apply: opts.apply,
        observe: opts.observe,
        batch: opts.batch.max(1),
        draining,
        registry: &reg,
        out,
    };
    spec.revert(&mut ctx).await?;
    if opts.apply && !draining {
        registry::set_state(ctx.conn, &reg.table(), name, Some(registry::REVERTED)).await?;
        emit(
            ctx.out,
            &format!(
                "-- applied: rule '{name}' is reverted (its row in {} says so)",
                reg.table().quoted()
            ),
        )?;
    }
    Ok(())
}

/// Drops `leftovers`, triggers first (so that writes to the tables that stay never
/// meet a trigger whose table is gone), printing each statement; with
/// `ctx.apply` runs them. What is already gone is reported and skipped.
pub async fn drop_leftovers(ctx: &mut RevertContext<'_>, leftovers: &Leftovers) -> Result<()> {
    let rule = ctx.registry.name.clone();
    let mut nothing = true;
    for t in &leftovers.triggers {
        if existing_trigger(ctx.conn, t).await?.is_none() {
            continue;
        }
        nothing = false;
        let sql = format!("DROP TRIGGER IF EXISTS {}", t.quoted());
        emit(ctx.out, &format!("{sql};"))?;
        if ctx.apply {
            run_sql(ctx.conn, &rule, &sql).await?;
        }
    }
    for t in &leftovers.tables {
        if inspect_table(ctx.conn, t).await?.is_none() {
            continue;
        }
        nothing = false;
        let rows = row_count(ctx.conn, t).await?;
        emit(ctx.out, &format!("-- {} holds {rows} rows", t.quoted()))?;
        let sql = format!("DROP TABLE IF EXISTS {}", t.quoted());
        emit(ctx.out, &format!("{sql};"))?;
        if ctx.apply {
            run_sql(ctx.conn, &rule, &sql).await?;
        }
    }
    if nothing {
        emit(
            ctx.out,
            &format!("-- rule '{rule}': none of its triggers and side tables is left"),
        )?;
    }
    Ok(())
}

/// `SELECT COUNT(*)` of `t`.
pub async fn row_count(conn: &mut Conn, t: &TableName) -> Result<u64> {
    let n: Option<u64> = conn
        .query_first(format!("SELECT COUNT(*) FROM {}", t.quoted()))
        .await
        .map_err(|e| schema_err(format!("counting the rows of {}", t.quoted()), e))?;
    Ok(n.unwrap_or_default())
}

/// `CHECKSUM TABLE t`: its content's checksum (`None` when the table is gone).
async fn checksum(conn: &mut Conn, t: &TableName) -> Result<Option<i64>> {
    let rows: Vec<Row> = conn
        .query(format!("CHECKSUM TABLE {}", t.quoted()))
        .await
        .map_err(|e| schema_err(format!("checksumming {}", t.quoted()), e))?;
    Ok(rows
        .first()
        .and_then(|r| r.get_opt::<Option<i64>, usize>(1))
        .and_then(|r| r.ok())
        .flatten())
}

/// Watches `t`, a table only proxies running rule `rule` write, for `ctx.observe`:
/// refused when its content changes meanwhile (a proxy still runs the rule).
pub async fn refuse_if_written(
    ctx: &mut RevertContext<'_>,
    t: &TableName,
    rule: &str,
) -> Result<()> {
    if ctx.observe.is_zero() {
        return Ok(());
    }
    emit(
        ctx.out,
        &format!(
            "-- watching {} for {:.1} s: only a proxy still running rule '{rule}' writes it",
            t.quoted(),
            ctx.observe.as_secs_f64()
        ),
    )?;
    let before = checksum(ctx.conn, t).await?;
    tokio::time::sleep(ctx.observe).await;
    let after = checksum(ctx.conn, t).await?;
    if before != after {
        return Err(Error::new(
            Source::Rules,
            format!(
                "revert refused, nothing was changed: {} changed while it was watched for \
                 {:.1} s, so a proxy still runs rule '{rule}': remove the rule from the rule \
                 files of every proxy and reload each (SHOW RULES on each admin port must no \
                 longer list it), then run `heatsink migrate --revert {rule}` again",
                t.quoted(),
                ctx.observe.as_secs_f64()
            ),
        ));
    }
    Ok(())
}
