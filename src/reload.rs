//! Hot reload of the rule set: parse → validate → swap, or keep the previous set.
//!
//! Three triggers lead here: the rule files changed on disk (polled once a second),
//! SIGHUP, and the admin command `RELOAD RULES`. Every trigger runs the same steps,
//! one reload at a time:
//!
//! 1. read every rule file under `--rules` and fingerprint their contents;
//! 2. [`rules::load`] parses and validates the whole set and builds a new
//!    [`Engine`] (fresh plan cache, fresh table metadata);
//! 3. on success the per-rule counters and the engine are swapped in atomically
//!    ([`Shared::install`]); on failure nothing changes: the previous rules stay in
//!    force, the error is logged with its file and line, and
//!    `heatsink_rule_reloads_total{result="error"}` goes up.
//!
//! What a reload means for statements in flight:
//!
//! - A statement takes the engine once, when it is decided, so it sees one rule set
//!   from start to end (a multi-statement rewrite included).
//! - A prepared statement keeps the plan it was prepared with: if it was rewritten,
//!   its executions keep running the rewritten statement even after its rule was
//!   changed or removed; if it was not rewritten, it keeps passing through even after
//!   a rule for its table appears. Re-prepare (or reconnect) to pick up the new rules.
//!
//! The file watcher debounces: a change is loaded only once the files read the same
//! twice in a row, a fifth of a second apart, and a given content is tried once (a
//! broken file is reported once, not every second).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tracing::{debug, error, info};

use crate::error::{Error, Source};
use crate::relay::Shared;
use crate::rewrite::Engine;
use crate::rules;

/// How often the watcher looks at the rule files.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How long the files must stay unchanged before a change is loaded.
pub const SETTLE: Duration = Duration::from_millis(200);

/// The answer to a reload when the proxy was started without `--rules`.
pub const NO_RULES_PATH: &str =
    "no rules path: heatsink was started without --rules and is a pure passthrough; restart it with --rules PATH to load rules";

/// What asked for a reload (for logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The rule files changed on disk.
    Watch,
    /// SIGHUP.
    Signal,
    /// `RELOAD RULES` on the admin port.
    Admin,
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Trigger::Watch => "file change",
            Trigger::Signal => "SIGHUP",
            Trigger::Admin => "admin command",
        })
    }
}

/// How a rule file describes one rule, for `SHOW RULES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleInfo {
    /// The rule's name.
    pub name: String,
    /// Its kind: the rule file section (`counter`, …).
    pub kind: String,
    /// Its tables as written in the rule.
    pub tables: Vec<String>,
    /// `on` or `shadow` (`drain` for a draining counter; a timeline's serving
    /// mode).
    pub mode: String,
    /// The file it comes from.
    pub file: PathBuf,
}

/// The rule files as read at one moment.
#[derive(Debug)]
pub struct Snapshot {
    /// Hash of every file's path and contents (or of the error reading them).
    pub fingerprint: u64,
    /// `(path, contents)` of each rule file; empty when they could not be read.
    pub files: Vec<(PathBuf, String)>,
}

impl Snapshot {
    /// No rule files: the proxy was started without a rules path.
    pub fn none() -> Snapshot {
        Snapshot {
            fingerprint: 0,
            files: Vec::new(),
        }
    }

    /// Reads the rule files under `path` (a file, or a directory's `*.toml`).
    pub fn read(path: &Path) -> Snapshot {
        let mut h = DefaultHasher::new();
        let listed = rules::rule_files(path).and_then(|files| {
            files
                .into_iter()
                .map(|f| {
                    let text = std::fs::read_to_string(&f).map_err(|e| {
                        Error::with_cause(
                            Source::Rules,
                            format!("reading rule file {}", f.display()),
                            e,
                        )
                    })?;
                    Ok((f, text))
                })
                .collect::<Result<Vec<_>, Error>>()
        });
        match listed {
            Ok(files) => {
                files.hash(&mut h);
                Snapshot {
                    fingerprint: h.finish(),
                    files,
                }
            }
            Err(e) => {
                e.to_string().hash(&mut h);
                Snapshot {
                    fingerprint: h.finish(),
                    files: Vec::new(),
                }
            }
        }
    }

    /// What the files say about each rule of `engine` (kind and mode come from the
    /// section and `mode` key that define the rule's name).
    pub fn describe(&self, engine: &Engine) -> Vec<RuleInfo> {
        let mut found: Vec<(String, String, String, PathBuf)> = Vec::new();
        for (file, text) in &self.files {
            let Ok(table) = text.parse::<toml::Table>() else {
                continue;
            };
            for (kind, value) in &table {
                let Some(entries) = value.as_array() else {
                    continue;
                };
                for entry in entries {
                    let Some(name) = entry.get("name").and_then(|n| n.as_str()) else {
                        continue;
                    };
                    let drains = entry.get("drain").and_then(|d| d.as_bool()) == Some(true);
                    let mode = match entry.get("mode").and_then(|m| m.as_str()) {
                        // A counter's first step out (`migrate --revert`).
                        _ if drains => "drain",
                        Some(m) => m,
                        None => "on",
                    }
                    .to_string();
                    found.push((name.to_string(), kind.clone(), mode, file.clone()));
                }
            }
        }
        engine
            .rules()
            .iter()
            .map(|r| {
                let (kind, mode, file) = found
                    .iter()
                    .find(|(n, ..)| n == r.name())
                    .map(|(_, k, m, f)| (k.clone(), m.clone(), f.clone()))
                    .unwrap_or_default();
                RuleInfo {
                    name: r.name().to_string(),
                    kind,
                    tables: r.tables().iter().map(|t| t.to_string()).collect(),
                    mode,
                    file,
                }
            })
            .collect()
    }
}

/// Reads the rule files, then builds an engine from them. The snapshot is taken
/// first, so a file changed during the load shows up as a new fingerprint later.
pub fn load(path: &Path, cache_capacity: u64) -> (Snapshot, Result<Engine, Error>) {
    let snapshot = Snapshot::read(path);
    let engine = rules::load(path, cache_capacity);
    (snapshot, engine)
}

/// Reloads the rule set on request and keeps what `SHOW RULES` shows.
pub struct Reloader {
    /// Where the engine and counters are swapped in.
    shared: Arc<Shared>,
    /// Serialises reloads; holds the fingerprint of the files last loaded or refused,
    /// so the watcher tries each content once.
    last: tokio::sync::Mutex<u64>,
    /// The rules in force, as their files describe them.
    catalog: ArcSwap<Vec<RuleInfo>>,
}

impl Reloader {
    /// A reloader for `shared`, whose current engine was built from `snapshot`.
    pub fn new(shared: Arc<Shared>, snapshot: &Snapshot) -> Arc<Reloader> {
        let catalog = snapshot.describe(&shared.engine.load());
        Arc::new(Reloader {
            shared,
            last: tokio::sync::Mutex::new(snapshot.fingerprint),
            catalog: ArcSwap::from_pointee(catalog),
        })
    }

    /// The rules in force, in the order the engine consults them.
    pub fn catalog(&self) -> Arc<Vec<RuleInfo>> {
        self.catalog.load_full()
    }

    /// Loads the rule files and swaps them in. Ok: the names of the rules now in
    /// force. Err: why the files were refused (file:line included); the previous
    /// rules stay in force.
    pub async fn reload(&self, trigger: Trigger) -> Result<Vec<String>, String> {
        let mut last = self.last.lock().await;
        self.reload_locked(trigger, &mut last).await
    }

    async fn reload_locked(&self, trigger: Trigger, last: &mut u64) -> Result<Vec<String>, String> {
        let Some(path) = self.shared.config.rules.clone() else {
            info!(%trigger, "rule reload skipped: {NO_RULES_PATH}");
            return Err(NO_RULES_PATH.to_string());
        };
        let cap = self.shared.config.plan_cache_size;
        let loaded = tokio::task::spawn_blocking(move || load(&path, cap)).await;
        let (snapshot, engine) = match loaded {
            Ok(x) => x,
            Err(e) => {
                self.shared
                    .stats
                    .reloads_failed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                error!(%trigger, error = %e, "rule reload failed");
                return Err(format!("internal error: reload task failed: {e}"));
            }
        };
        *last = snapshot.fingerprint;
        match engine {
            Ok(engine) => {
                let catalog = snapshot.describe(&engine);
                let names: Vec<String> = catalog.iter().map(|r| r.name.clone()).collect();
                self.shared.install(engine);
                self.catalog.store(Arc::new(catalog));
                self.shared
                    .stats
                    .reloads_ok
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                info!(%trigger, rules = ?names, "rules reloaded");
                Ok(names)
            }
            Err(e) => {
                self.shared
                    .stats
                    .reloads_failed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                error!(%trigger, error = %e, "rule reload failed: the previous rules stay in force");
                Err(e.to_string())
            }
        }
    }

    /// One watcher step: reload if the files differ from what was last tried and
    /// have settled.
    async fn check(&self) {
        let Some(path) = self.shared.config.rules.clone() else {
            return;
        };
        let Some(first) = fingerprint(path.clone()).await else {
            return;
        };
        if first == *self.last.lock().await {
            return;
        }
        tokio::time::sleep(SETTLE).await;
        let Some(second) = fingerprint(path).await else {
            return;
        };
        if second != first {
            debug!("rule files still changing; waiting");
            return;
        }
        let mut last = self.last.lock().await;
        if *last == second {
            return; // another trigger loaded it meanwhile
        }
        let _ = self.reload_locked(Trigger::Watch, &mut last).await;
    }
}

/// The fingerprint of the rule files, read off the runtime's threads.
async fn fingerprint(path: PathBuf) -> Option<u64> {
    tokio::task::spawn_blocking(move || Snapshot::read(&path).fingerprint)
        .await
        .ok()
}

/// Polls the rule files every `interval` and reloads when they change. Runs until
/// the task is dropped.
pub async fn watch(reloader: Arc<Reloader>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        reloader.check().await;
    }
}

/// Reloads on every SIGHUP. The handler is installed before this returns, so a
/// SIGHUP arriving afterwards never terminates the process.
pub fn on_sighup(reloader: Arc<Reloader>) -> Result<(), Error> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = signal(SignalKind::hangup())
            .map_err(|e| Error::with_cause(Source::Internal, "installing SIGHUP handler", e))?;
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                info!("SIGHUP received: reloading rules");
                let _ = reloader.reload(Trigger::Signal).await;
            }
        });
    }
    #[cfg(not(unix))]
    {
        let _ = reloader;
        tracing::warn!("SIGHUP reload is not available on this platform");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const COUNTER: &str = "[[counter]]\nname = \"hits_rule\"\ntable = \"hits\"\nkey = [\"slug\"]\ncolumns = [\"cnt\"]\nslots = 4\nslot_table = \"hits_slots\"\n";

    #[test]
    fn fingerprint_follows_contents() {
        let d = tempfile::tempdir().unwrap();
        let empty = Snapshot::read(d.path());
        assert!(empty.files.is_empty());
        std::fs::write(d.path().join("a.toml"), COUNTER).unwrap();
        std::fs::write(d.path().join("notes.txt"), "ignored").unwrap();
        let one = Snapshot::read(d.path());
        assert_eq!(one.files.len(), 1);
        assert_ne!(one.fingerprint, empty.fingerprint);
        assert_eq!(Snapshot::read(d.path()).fingerprint, one.fingerprint);
        std::fs::write(d.path().join("a.toml"), COUNTER.replace("4", "8")).unwrap();
        assert_ne!(Snapshot::read(d.path()).fingerprint, one.fingerprint);
        let missing = Snapshot::read(&d.path().join("nope"));
        assert!(missing.files.is_empty());
        assert_ne!(missing.fingerprint, empty.fingerprint);
    }

    #[test]
    fn describe_reads_kind_mode_and_tables() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.toml"), COUNTER).unwrap();
        let (snap, engine) = load(d.path(), 10);
        let engine = engine.unwrap();
        let info = snap.describe(&engine);
        assert_eq!(info.len(), 1);
        assert_eq!(info[0].name, "hits_rule");
        assert_eq!(info[0].kind, "counter");
        assert_eq!(info[0].mode, "on");
        assert_eq!(info[0].tables, vec!["hits".to_string()]);
    }

    #[tokio::test]
    async fn a_broken_file_keeps_the_previous_rules() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.toml"), COUNTER).unwrap();
        let config = crate::config::Config {
            rules: Some(d.path().to_path_buf()),
            ..Default::default()
        };
        let (snap, engine) = load(d.path(), 10);
        let shared = Shared::new(config, engine.unwrap());
        let r = Reloader::new(shared.clone(), &snap);
        std::fs::write(d.path().join("b.toml"), "[[counter]\nname = 1\n").unwrap();
        let e = r.reload(Trigger::Admin).await.unwrap_err();
        assert!(e.contains("b.toml:1:"), "{e}");
        assert!(shared.engine.load().has_rules());
        assert_eq!(r.catalog().len(), 1);
        std::fs::remove_file(d.path().join("b.toml")).unwrap();
        std::fs::remove_file(d.path().join("a.toml")).unwrap();
        assert_eq!(
            r.reload(Trigger::Admin).await.unwrap(),
            Vec::<String>::new()
        );
        assert!(!shared.engine.load().has_rules());
        assert!(r.catalog().is_empty());
        use std::sync::atomic::Ordering::Relaxed;
        assert_eq!(shared.stats.reloads_ok.load(Relaxed), 1);
        assert_eq!(shared.stats.reloads_failed.load(Relaxed), 1);
    }
}
