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
    spec.revert(&mut ctx).await?;
    if opts.apply && !draining {
        registry::set_state(ctx.conn, &reg.table(), name, Some(registry::REVERTED)).await?;
        crate::jobs::forget_rule(ctx.conn, &reg.db, name).await?;
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
