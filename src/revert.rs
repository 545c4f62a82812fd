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

use mysql_async::Conn;

use crate::error::{Error, Result, Source};
use crate::kinds::RevertContext;
use crate::registry::{self, Registered};
use crate::schema::{connect, emit};

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
    /// How the revert's long part runs (through [`crate::jobs`]): throttle,
    /// progress, replica lag; `chunk`, when set, overrides `batch`.
    pub jobs: crate::jobs::Settings,
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
        batch: opts.jobs.chunk.unwrap_or(opts.batch).max(1),
        jobs: opts.jobs.clone(),
        draining,
        registry: &reg,
        out,
    };
    let migrating = !draining && reg.state.as_deref() == Some(registry::MIGRATING);
    if migrating {
        half_migrated(&mut ctx, spec.as_ref()).await?;
        spec.back_out(&mut ctx).await?;
    } else {
        spec.revert(&mut ctx).await?;
    }
    if opts.apply && !draining {
        registry::set_state(ctx.conn, &reg.table(), name, Some(registry::REVERTED)).await?;
        crate::jobs::forget_rule(ctx.conn, &reg.db, name).await?;
        emit(
            ctx.out,
            &format!(
                "-- applied: rule '{name}' is {} (its row in {} says so)",
                if migrating {
                    "backed out: what its stopped migration made is removed, and it is reverted"
                } else {
                    "reverted"
                },
                reg.table().quoted()
            ),
        )?;
    }
    Ok(())
}

/// Says what a first migration that stopped half way (the rule recorded as
/// [`registry::MIGRATING`]) left: which of the rule's triggers and side tables
/// exist (with their rows) and its job rows, all of which the back-out removes.
async fn half_migrated(
    ctx: &mut RevertContext<'_>,
    spec: &dyn crate::kinds::RuleSpec,
) -> Result<()> {
    let name = spec.name();
    let leftovers = spec
        .leftovers(ctx.default_db)
        .map_err(|r| Error::new(Source::Rules, r))?;
    let mut found = Vec::new();
    for t in &leftovers.triggers {
        if crate::schema::existing_trigger(ctx.conn, t)
            .await?
            .is_some()
        {
            found.push(format!("trigger {}", t.quoted()));
        }
    }
    for t in &leftovers.tables {
        if crate::schema::inspect_table(ctx.conn, t).await?.is_some() {
            let rows = crate::kinds::revert::row_count(ctx.conn, t).await?;
            found.push(format!("table {} ({rows} rows)", t.quoted()));
        }
    }
    for (job, st) in crate::jobs::of_rule(ctx.conn, &ctx.registry.db, name).await? {
        found.push(format!(
            "job {job} in {} ({}, {} done)",
            crate::jobs::JobKey {
                db: ctx.registry.db.clone(),
                rule: name.to_string(),
                job: "",
            }
            .table()
            .quoted(),
            st.state,
            st.rows_done
        ));
    }
    emit(
        ctx.out,
        &format!(
            "-- rule '{name}' is recorded as {}: its first `migrate --apply` stopped before it \
             finished, so no proxy has served it from its tables. The revert backs that \
             migration out: it removes what the migration made and copies nothing back; \
             the logical table's rows stay as they are",
            registry::MIGRATING
        ),
    )?;
    if found.is_empty() {
        emit(ctx.out, "-- found: nothing the migration made is left")
    } else {
        emit(
            ctx.out,
            &format!("-- found (removed below): {}", found.join("; ")),
        )
    }
}
