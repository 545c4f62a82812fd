//! `heatsink migrate`: creates the schema objects every rule needs.
//!
//! For each selected rule the rule's kind checks the logical table against the
//! database ([`crate::kinds::RuleSpec::schema`]) and works out what to create: the
//! counter's slot table and trigger (`src/kinds/counter/schema.rs`), the ring's ring
//! and sequence tables, triggers and backfill (`src/kinds/ring/schema.rs`), and so on.
//! The command prints that plan as SQL comments and statements; with `--apply` it
//! executes it. Nothing is executed unless every selected rule passes its checks,
//! and the statements are idempotent (`IF NOT EXISTS`; objects that exist and match
//! are reported and left alone), so running the command twice is harmless.
//!
//! Then the users who hold table-level privileges on a rule's logical table get
//! the privileges heatsink's statements for them need on the rule's physical tables
//! ([`crate::kinds::RuleSpec::client_tables`]); `--print-grants` prints those
//! `GRANT`s without running them.
//!
//! The database of a table is the rule's `db.` prefix, else the database of
//! `--backend-url`.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result, Source};
use crate::kinds::SchemaError;
use crate::schema::{connect, default_db, emit};

/// What `heatsink migrate` was asked to do.
#[derive(Debug, Clone)]
pub struct MigrateOptions<'a> {
    /// Rule file or directory of rule files.
    pub rules: &'a Path,
    /// `mysql://user:pw@host:port/db` of the database the rules apply to.
    pub backend_url: &'a str,
    /// Execute the statements instead of only printing them.
    pub apply: bool,
    /// Only this rule, when given.
    pub rule: Option<&'a str>,
    /// Print the grants the rules' users need instead of running them (with
    /// `apply`).
    pub print_grants: bool,
    /// How long jobs (backfills, fills) run: chunks, throttle, progress.
    pub jobs: crate::jobs::Settings,
    /// Leave the long jobs that can wait (a mailbox fill) to `heatsink maintain`.
    pub defer_jobs: bool,
}

/// Checks every rule under `opts.rules` against the database and prints (and, with
/// `apply`, executes) the DDL it needs. Nothing is executed unless every selected
/// rule passes its checks.
pub async fn run(opts: &MigrateOptions<'_>, out: &mut dyn Write) -> Result<()> {
    let specs = crate::rules::select(crate::rules::specs(opts.rules)?, opts.rule)?;
    if specs.is_empty() {
        emit(out, "-- no rules: nothing to migrate")?;
        return Ok(());
    }
    let mut conn = connect(opts.backend_url).await?;
    let default_db = default_db(opts.backend_url)?;
    let mut checked = Vec::with_capacity(specs.len());
    let mut refused = Vec::new();
    for spec in &specs {
        match spec.schema(&mut conn, default_db.as_deref()).await {
            Ok(c) => checked.push(c),
            Err(SchemaError::Refused(reason)) => {
                refused.push(format!("{} '{}': {reason}", spec.kind(), spec.name()))
            }
            Err(SchemaError::Failed(e)) => return Err(e),
        }
    }
    if !refused.is_empty() {
        let _ = conn.disconnect().await;
        return Err(Error::new(
            Source::Rules,
            format!(
                "migration refused, nothing was changed:\n  {}",
                refused.join("\n  ")
            ),
        ));
    }
    if crate::schema::on_galera(&mut conn).await? {
        for spec in specs.iter().filter(|s| s.backfills_under_lock()) {
            emit(
                out,
                &format!(
                    "-- warning: {} '{}': this is a Galera node; the backfill below runs under \
                     LOCK TABLES, which holds only on this node: stop writes to {} through \
                     the other nodes (or send them all through this one) while it runs",
                    spec.kind(),
                    spec.name(),
                    spec.table()
                ),
            )?;
        }
    }
    for (migration, spec) in checked.iter().zip(&specs) {
        if opts.apply {
            let (logical, _) = crate::kinds::resolved(spec.table(), &[], default_db.as_deref())
                .map_err(|r| Error::new(Source::Rules, r))?;
            crate::registry::record_migrating(&mut conn, &logical, spec.as_ref()).await?;
        }
        migration
            .run_with(&mut conn, opts.apply, &opts.jobs, out)
            .await?;
        register(
            &mut conn,
            spec.as_ref(),
            default_db.as_deref(),
            opts.apply,
            out,
        )
        .await?;
    }
    for spec in &specs {
        grant(&mut conn, spec.as_ref(), default_db.as_deref(), opts, out).await?;
    }
    // The long jobs last, once every rule's schema is in place: stopped, they
    // continue where they stopped at the next `migrate --apply` or `maintain`.
    if opts.apply && !opts.defer_jobs {
        for (migration, spec) in checked.iter().zip(&specs) {
            migration
                .run_jobs(&mut conn, &opts.jobs, out)
                .await
                .map_err(|e| {
                    Error::new(
                        Source::Backend,
                        format!(
                            "{e}\nrule {}: the job stopped; its progress is kept: run the same command again to continue",
                            spec.name()
                        ),
                    )
                })?;
        }
    }
    if opts.apply && opts.defer_jobs {
        emit(
            out,
            "-- long jobs deferred (--defer-jobs): `heatsink maintain --apply` (or serve --maintain-url) runs them",
        )?;
    }
    let _ = conn.disconnect().await;
    Ok(())
}

/// Records the rule in the `heatsink_rules` table of its logical table's database
/// ([`crate::registry`]) with `apply`; says so without.
async fn register(
    conn: &mut mysql_async::Conn,
    spec: &dyn crate::kinds::RuleSpec,
    default_db: Option<&str>,
    apply: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let (logical, _) = crate::kinds::resolved(spec.table(), &[], default_db)
        .map_err(|r| Error::new(Source::Rules, r))?;
    let db = logical.db.clone().unwrap_or_default();
    let table = crate::registry::registry_table(&db).quoted();
    if !apply {
        return emit(
            out,
            &format!(
                "-- rule {}: --apply records it in {table} (what `migrate --revert` and `check` \
                 read once the rule has left the rule files)",
                spec.name()
            ),
        );
    }
    crate::registry::record(conn, &logical, spec).await?;
    emit(
        out,
        &format!("-- rule {}: recorded in {table}", spec.name()),
    )
}

/// Prints (and with `apply`, unless `print_grants`, runs) the grants users who hold
/// privileges on the rule's logical table lack on the tables heatsink's statements
/// for them use: without them their statements through heatsink fail (1142) where
/// they work directly.
async fn grant(
    conn: &mut mysql_async::Conn,
    spec: &dyn crate::kinds::RuleSpec,
    default_db: Option<&str>,
    opts: &MigrateOptions<'_>,
    out: &mut dyn Write,
) -> Result<()> {
    let missing =
        crate::schema::rule_missing_grants(conn, spec.table(), &spec.client_tables(), default_db)
            .await?;
    if missing.is_empty() {
        return Ok(());
    }
    emit(
        out,
        &format!(
            "-- rule {}: users who may use {} need these grants on its tables",
            spec.name(),
            spec.table()
        ),
    )?;
    for g in &missing {
        let sql = g.sql();
        emit(out, &format!("{sql};"))?;
        if opts.apply && !opts.print_grants {
            // Migrate's user may lack the GRANT OPTION: the rest still stands, and
            // `check` keeps listing the users until someone who has it grants.
            match mysql_async::prelude::Queryable::query_drop(conn, sql.as_str()).await {
                Ok(()) => emit(out, &format!("-- applied: granted to {}", g.grantee))?,
                Err(e) => emit(
                    out,
                    &format!(
                        "-- warning: not granted ({e}): run the GRANT above as a user with the \
                         GRANT OPTION; until then {}'s statements through heatsink fail (1142)",
                        g.grantee
                    ),
                )?,
            }
        }
    }
    emit(out, "")
}
