//! `heatsink advise`: finds the hot spots of a workload and proposes the rules that
//! answer them.
//!
//! 1. The workload: `SHOW DIGESTS` on a proxy's admin port (`--admin`), a JSON dump
//!    of it (`--digests`), or the server's `performance_schema`
//!    (`--from-performance-schema`, with `--backend-url`), as
//!    [`crate::advice::Workload`].
//! 2. With `--backend-url`, the tables the statements name (columns, keys, triggers,
//!    foreign keys, CHECKs, sizes from `information_schema`) and the server's
//!    evidence (the latest deadlock, `Innodb_row_lock_*`).
//! 3. Every kind's detector ([`crate::kinds::Kind::advise`]) proposes rules.
//! 4. Each proposal is parsed and validated as `check` does; with `--backend-url`
//!    also checked against the schema as `check --backend-url` does (what the checks
//!    raise becomes a caveat; a rule the tables cannot carry is dropped, with the
//!    reason), and `migrate`'s dry run says what it would create.
//! 5. Ranked by the time they are expected to save; one rule per table (the best).
//!
//! Nothing here names a rule kind.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;

use serde::Serialize;

use crate::advice::{input, sql, Observed, Proposal, ServerEvidence, Thresholds, Workload};
use crate::error::{Error, Result, Source};
use crate::kinds::{SchemaError, KINDS};
use crate::report::Severity;
use crate::schema::emit;

/// Output of `heatsink advise`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum AdviseFormat {
    /// Lines for people.
    #[default]
    Text,
    /// One JSON document.
    Json,
    /// A rule file `heatsink check` accepts as it is (the proposals as comments).
    Toml,
}

/// Where the workload comes from.
#[derive(Debug, Clone, Copy)]
pub enum AdviseSource<'a> {
    /// A proxy's admin port: `mysql://admin:PW@HOST:PORT`.
    Admin(&'a str),
    /// A JSON dump of `SHOW DIGESTS`.
    Digests(&'a Path),
    /// The backend's `performance_schema`.
    PerformanceSchema,
}

/// What `heatsink advise` was asked to do.
#[derive(Debug, Clone)]
pub struct AdviseOptions<'a> {
    /// The workload.
    pub source: AdviseSource<'a>,
    /// `mysql://…` of the database: the schema, the server's evidence, the checks.
    pub backend_url: Option<&'a str>,
    /// The database of statements that name none [default: the URL's].
    pub db: Option<&'a str>,
    /// The detectors' thresholds.
    pub thresholds: Thresholds,
    /// Output format.
    pub format: AdviseFormat,
}

/// Everything `heatsink advise` found (also its JSON output).
#[derive(Debug, Serialize)]
pub struct Report {
    /// Statement shapes read.
    pub statements: usize,
    /// Their executions.
    pub executions: u64,
    /// Their time, microseconds.
    pub time_us: u64,
    /// The schema was read and the proposals checked against it.
    pub live: bool,
    /// The server's evidence.
    pub server: ServerEvidence,
    /// The thresholds applied.
    pub thresholds: Thresholds,
    /// The proposals, best first.
    pub proposals: Vec<Proposal>,
    /// Hot spots seen but not proposed, and why.
    pub notes: Vec<String>,
    /// Statement shapes the parser could not read (no detector saw them).
    pub unread: Vec<String>,
}

/// Runs `heatsink advise` and prints its report.
pub async fn run(opts: &AdviseOptions<'_>, out: &mut dyn Write) -> Result<()> {
    let report = advise(opts).await?;
    match opts.format {
        AdviseFormat::Json => {
            let json = serde_json::to_string_pretty(&report)
                .map_err(|e| Error::with_cause(Source::Internal, "writing JSON", e))?;
            emit(out, &json)
        }
        AdviseFormat::Toml => emit(out, &rule_file(&report)),
        AdviseFormat::Text => print_text(&report, out),
    }
}

/// Reads the workload, runs the detectors, validates and ranks their proposals.
pub async fn advise(opts: &AdviseOptions<'_>) -> Result<Report> {
    let mut conn = match opts.backend_url {
        Some(url) => Some(crate::schema::connect(url).await?),
        None => None,
    };
    let statements: Vec<Observed> = match opts.source {
        AdviseSource::Admin(url) => input::from_admin(url)
            .await?
            .into_iter()
            .map(Observed::new)
            .collect(),
        AdviseSource::Digests(path) => input::from_file(path)?
            .into_iter()
            .map(Observed::new)
            .collect(),
        AdviseSource::PerformanceSchema => {
            let Some(c) = conn.as_mut() else {
                return Err(Error::new(
                    Source::Rules,
                    "--from-performance-schema reads the server of --backend-url: pass it",
                ));
            };
            input::from_performance_schema(c).await?
        }
    };
    let mut w = Workload::new(statements);
    w.thresholds = opts.thresholds.clone();
    let url_db = match opts.backend_url {
        Some(url) => crate::schema::default_db(url)?,
        None => None,
    };
    w.default_db = opts.db.map(str::to_string).or(url_db);
    if let Some(c) = conn.as_mut() {
        let mut dbs: BTreeSet<String> = BTreeSet::new();
        let mut names: BTreeSet<String> = BTreeSet::new();
        for s in &w.statements {
            let Some(stmt) = &s.stmt else { continue };
            for t in sql::tables(stmt) {
                if let Some(db) = w.db_of(s, &t) {
                    dbs.insert(db);
                }
                names.insert(sql::last(&t).to_ascii_lowercase());
            }
        }
        w.tables = input::read_schema(c, &dbs, &names).await?;
        w.schema_known = true;
        w.server = input::server_evidence(c).await?;
    }

    let mut proposals = Vec::new();
    let mut notes = Vec::new();
    for k in KINDS {
        let a = k.advise(&w);
        proposals.extend(a.proposals);
        notes.extend(a.notes);
    }
    // Tables a rule already handles are left alone.
    proposals.retain(|p| {
        let ruled = w
            .statements
            .iter()
            .filter(|s| p.digests.contains(&s.row.digest))
            .find_map(|s| s.row.rule.clone());
        if let Some(rule) = &ruled {
            notes.push(format!(
                "{} on {}: already handled by rule '{rule}'",
                p.kind, p.table
            ));
        }
        ruled.is_none()
    });
    let mut kept = Vec::new();
    for mut p in proposals {
        match validate(&mut p, conn.as_mut(), w.default_db.as_deref()).await? {
            Ok(()) => kept.push(p),
            Err(why) => notes.push(format!("{} on {}: not proposed: {why}", p.kind, p.table)),
        }
    }
    kept.sort_by(|a, b| {
        b.benefit_us
            .cmp(&a.benefit_us)
            .then(b.time_us.cmp(&a.time_us))
            .then(a.name.cmp(&b.name))
    });
    // One rule per table, and unique names.
    let mut tables: Vec<String> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut proposals = Vec::new();
    for mut p in kept {
        let t = p.table.to_ascii_lowercase();
        if tables.contains(&t) {
            notes.push(format!(
                "{} on {}: a better-ranked rule is proposed for the table (one table can have one rule)",
                p.kind, p.table
            ));
            continue;
        }
        tables.push(t);
        if names.contains(&p.name) {
            let renamed = format!("{}_{}", p.name, p.kind);
            p.toml = p.toml.replacen(
                &format!("name = \"{}\"", p.name),
                &format!("name = \"{renamed}\""),
                1,
            );
            p.name = renamed;
        }
        names.push(p.name.clone());
        proposals.push(p);
    }
    if let Some(c) = conn {
        let _ = c.disconnect().await;
    }
    Ok(Report {
        statements: w.statements.len(),
        executions: w.total_count(),
        time_us: w.total_time_us(),
        live: w.schema_known,
        server: w.server.clone(),
        thresholds: w.thresholds.clone(),
        proposals,
        notes,
        unread: w
            .statements
            .iter()
            .filter(|s| s.stmt.is_none())
            .map(|s| s.row.digest_text.clone())
            .collect(),
    })
}

/// Parses and validates `p`'s rule as `check` does; with a connection, checks it
/// against the schema as `check --backend-url` does and records `migrate`'s dry run.
/// `Ok(Err(reason))`: the rule cannot be proposed.
async fn validate(
    p: &mut Proposal,
    conn: Option<&mut mysql_async::Conn>,
    default_db: Option<&str>,
) -> Result<std::result::Result<(), String>> {
    let path = Path::new("advise.toml");
    let read = match crate::rules::read_text(&p.toml, path) {
        Ok(r) => r,
        Err(e) => {
            return Ok(Err(format!(
                "the proposed rule does not parse: {}",
                e.reason
            )))
        }
    };
    if let Err(e) = crate::rules::validate(&read.specs, &p.toml, path) {
        return Ok(Err(format!("the proposed rule is invalid: {}", e.reason)));
    }
    let Some(conn) = conn else { return Ok(Ok(())) };
    let Some(spec) = read.specs.first() else {
        return Ok(Err("the proposed rule is empty".into()));
    };
    let migration = match spec.schema(conn, default_db).await {
        Ok(m) => m,
        Err(SchemaError::Refused(reason)) => return Ok(Err(reason)),
        Err(SchemaError::Failed(e)) => return Err(e),
    };
    for (severity, reason) in migration.problems(conn).await? {
        // Errors about what does not exist yet are what `migrate` creates.
        if severity == Severity::Warning {
            p.caveats.push(reason);
        } else if !reason.contains("heatsink migrate") && !reason.contains("does not exist") {
            p.caveats.push(format!("check: {reason}"));
        }
    }
    let grants =
        crate::schema::rule_missing_grants(conn, spec.table(), &spec.client_tables(), default_db)
            .await?;
    p.caveats.extend(grants.iter().map(|g| g.describe()));
    let mut plan: Vec<u8> = Vec::new();
    migration.run(conn, false, &mut plan).await?;
    let plan = String::from_utf8_lossy(&plan);
    let lines: Vec<String> = plan
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    if !lines.is_empty() {
        p.migrate = lines;
    }
    Ok(Ok(()))
}

/// A rule file of every proposal, best first, each after comments saying why.
pub fn rule_file(r: &Report) -> String {
    let mut s = format!(
        "# heatsink advise: {} rule(s) proposed from {} statement shape(s), {} executions.\n\
         # Review, then: heatsink check --rules FILE --backend-url …; heatsink migrate --rules FILE --backend-url … --apply\n",
        r.proposals.len(),
        r.statements,
        r.executions
    );
    for (i, p) in r.proposals.iter().enumerate() {
        s.push('\n');
        s.push_str(&format!(
            "# {}. {} on {}: {} of the executions, {} of the time; expected to save about {} ms\n",
            i + 1,
            p.kind,
            p.table,
            crate::advice::pct(p.count_share),
            crate::advice::pct(p.time_share),
            p.benefit_us / 1000
        ));
        for e in &p.evidence {
            s.push_str(&format!("#   evidence: {e}\n"));
        }
        s.push_str(&format!("#   expected: {}\n", p.effect));
        for c in &p.caveats {
            s.push_str(&format!("#   caveat: {c}\n"));
        }
        s.push_str(&format!("#   digests: {}\n", p.digests.join(", ")));
        s.push_str(&p.toml);
    }
    for n in &r.notes {
        s.push_str(&format!("\n# note: {n}"));
    }
    s
}

fn print_text(r: &Report, out: &mut dyn Write) -> Result<()> {
    emit(
        out,
        &format!(
            "{} statement shape(s), {} executions, {} ms; {} rule(s) proposed{}",
            r.statements,
            r.executions,
            r.time_us / 1000,
            r.proposals.len(),
            if r.live {
                " (checked against the database)"
            } else {
                " (not checked against a database: pass --backend-url)"
            }
        ),
    )?;
    for (i, p) in r.proposals.iter().enumerate() {
        emit(out, "")?;
        emit(
            out,
            &format!(
                "{}. {} '{}' on {}: {} of the executions, {} of the time; expected to save about {} ms",
                i + 1,
                p.kind,
                p.name,
                p.table,
                crate::advice::pct(p.count_share),
                crate::advice::pct(p.time_share),
                p.benefit_us / 1000
            ),
        )?;
        emit(out, &format!("   digests: {}", p.digests.join(", ")))?;
        for e in &p.evidence {
            emit(out, &format!("   evidence: {e}"))?;
        }
        emit(out, &format!("   expected: {}", p.effect))?;
        for c in &p.caveats {
            emit(out, &format!("   caveat: {c}"))?;
        }
        emit(out, "   migrate:")?;
        for m in &p.migrate {
            emit(out, &format!("     {m}"))?;
        }
        emit(out, "   rule:")?;
        for l in p.toml.lines() {
            emit(out, &format!("     {l}"))?;
        }
    }
    for n in &r.notes {
        emit(out, &format!("note: {n}"))?;
    }
    Ok(())
}
