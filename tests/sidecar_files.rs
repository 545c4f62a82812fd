//! The container files: `Dockerfile` and `examples/sidecar/` (compose file, example
//! application, Prometheus and Grafana configuration).
//!
//! There is no Docker engine here, so the files are checked for what a Docker engine
//! would find wrong, and their pieces are run outside containers:
//!
//! - the compose file's structure: services, build contexts, mounted paths, dependency
//!   order and conditions, ports, variables with defaults;
//! - every `serve`/`migrate` flag and `HEATSINK_*` variable it (and the Dockerfile)
//!   uses exists in the real command line;
//! - the schema file and the `migrate` service's command run against MariaDB, heatsink
//!   starts with the `heatsink` service's settings, the example application runs
//!   through it, and the health-check command succeeds;
//! - every metric, label and label value the Grafana dashboard queries appears on that
//!   proxy's live `/metrics` (fetched at the path `prometheus.yml` scrapes);
//! - the Dockerfile is multi-stage, runs as a non-root user, has the health check and a
//!   `serve` entrypoint, and copies every path `cargo build --locked` needs.
//!
//! YAML is read with Python's PyYAML (`scripts/test.sh` installs it).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::cli::run_limited;
use common::{free_port, http_get, mariadb, Proxy};

// ---------------------------------------------------------------------------------------
// Paths and file readers

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sidecar() -> PathBuf {
    repo().join("examples/sidecar")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A YAML file as JSON (PyYAML's safe loader: anchors and aliases resolved).
fn yaml(path: &Path) -> Value {
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg("import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)")
        .arg(path);
    let out = run_limited(&mut cmd, None, Duration::from_secs(60));
    assert!(
        out.success(),
        "{} is not valid YAML (or PyYAML is missing: python3 -m pip install pyyaml):\n{}",
        path.display(),
        out.stderr
    );
    serde_json::from_str(&out.stdout).expect("python3 printed JSON")
}

fn dashboard() -> Value {
    let path = sidecar().join("grafana-dashboard.json");
    serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Lexically normalizes `base/rel` (`..` and `.` resolved without touching the disk).
fn resolve(base: &Path, rel: &str) -> PathBuf {
    let mut out = if rel.starts_with('/') {
        PathBuf::from("/")
    } else {
        base.to_path_buf()
    };
    for part in rel.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            p => out.push(p),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Compose helpers

/// Compose variable interpolation as `docker compose` does it without an environment:
/// `${VAR:-default}` / `${VAR-default}` become the default, `$$` a dollar. A variable
/// without a default would make the file depend on the caller's environment: panic.
fn interpolate(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('$') {
            out.push('$');
            rest = a;
        } else if let Some(a) = after.strip_prefix('{') {
            let end = a
                .find('}')
                .unwrap_or_else(|| panic!("unclosed ${{ in {s:?}"));
            let inner = &a[..end];
            let default = inner
                .split_once(":-")
                .or_else(|| inner.split_once('-'))
                .map(|(_, d)| d)
                .unwrap_or_else(|| panic!("variable without a default in {s:?}"));
            out.push_str(default);
            rest = &a[end + 1..];
        } else {
            panic!("bare $ in {s:?}: use ${{VAR:-default}} or $$");
        }
    }
    out.push_str(rest);
    out
}

/// Names of the `${VAR…}` variables in `s`.
fn variables(s: &str) -> Vec<String> {
    s.split("${")
        .skip(1)
        .map(|p| {
            p.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

/// Every string in a JSON value, recursively.
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

struct Compose {
    doc: Value,
}

impl Compose {
    fn load() -> Compose {
        Compose {
            doc: yaml(&sidecar().join("compose.yaml")),
        }
    }

    /// The cluster variant, `compose.cluster.yaml`.
    fn load_cluster() -> Compose {
        Compose {
            doc: yaml(&sidecar().join("compose.cluster.yaml")),
        }
    }

    fn services(&self) -> &serde_json::Map<String, Value> {
        self.doc["services"]
            .as_object()
            .expect("compose.yaml: services is a map")
    }

    fn service(&self, name: &str) -> &Value {
        self.services()
            .get(name)
            .unwrap_or_else(|| panic!("compose.yaml: no service {name:?}"))
    }

    /// A service's environment, interpolated (map or `KEY=VALUE` list syntax).
    fn env(&self, name: &str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        match &self.service(name)["environment"] {
            Value::Null => {}
            Value::Object(o) => {
                for (k, v) in o {
                    let v = match v {
                        Value::String(s) => interpolate(s),
                        Value::Null => String::new(),
                        other => other.to_string(),
                    };
                    out.insert(k.clone(), v);
                }
            }
            Value::Array(a) => {
                for e in a {
                    let s = e.as_str().expect("environment entry is a string");
                    let (k, v) = s.split_once('=').unwrap_or((s, ""));
                    out.insert(k.to_string(), interpolate(v));
                }
            }
            other => panic!("{name}: environment is {other}"),
        }
        out
    }

    /// A list-or-string field (`command`, `entrypoint`), interpolated.
    fn words(&self, name: &str, field: &str) -> Vec<String> {
        match &self.service(name)[field] {
            Value::Null => Vec::new(),
            Value::String(s) => interpolate(s)
                .split_whitespace()
                .map(String::from)
                .collect(),
            Value::Array(a) => a
                .iter()
                .map(|w| interpolate(w.as_str().expect("command word is a string")))
                .collect(),
            other => panic!("{name}.{field} is {other}"),
        }
    }

    /// `(source, target, read_only)` of a service's volumes, short or long syntax.
    fn volumes(&self, name: &str) -> Vec<(String, String, bool)> {
        let Some(list) = self.service(name)["volumes"].as_array() else {
            return Vec::new();
        };
        list.iter()
            .map(|v| match v {
                Value::String(s) => {
                    let parts: Vec<&str> = s.split(':').collect();
                    assert!(
                        (2..=3).contains(&parts.len()),
                        "{name}: volume {s:?} is not source:target[:mode]"
                    );
                    let ro = parts
                        .get(2)
                        .is_some_and(|m| m.split(',').any(|o| o == "ro"));
                    (interpolate(parts[0]), parts[1].to_string(), ro)
                }
                Value::Object(o) => (
                    o["source"].as_str().unwrap_or_default().to_string(),
                    o["target"].as_str().expect("volume target").to_string(),
                    o.get("read_only").and_then(Value::as_bool).unwrap_or(false),
                ),
                other => panic!("{name}: volume {other}"),
            })
            .collect()
    }

    /// The host path a bind mount's source names (None for a named volume).
    fn bind_source(source: &str) -> Option<PathBuf> {
        (source.starts_with('.') || source.starts_with('/')).then(|| resolve(&sidecar(), source))
    }

    /// `depends_on` as service → condition (list syntax means `service_started`).
    fn depends_on(&self, name: &str) -> BTreeMap<String, String> {
        match &self.service(name)["depends_on"] {
            Value::Null => BTreeMap::new(),
            Value::Array(a) => a
                .iter()
                .map(|s| {
                    (
                        s.as_str().expect("service name").to_string(),
                        "service_started".to_string(),
                    )
                })
                .collect(),
            Value::Object(o) => o
                .iter()
                .map(|(k, v)| {
                    let cond = v["condition"].as_str().unwrap_or("service_started");
                    (k.clone(), cond.to_string())
                })
                .collect(),
            other => panic!("{name}: depends_on is {other}"),
        }
    }

    fn profiles(&self, name: &str) -> Vec<String> {
        self.service(name)["profiles"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|p| p.as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `(host ip, host port, container port)` of a service's published ports.
    fn ports(&self, name: &str) -> Vec<(String, u16, u16)> {
        let Some(list) = self.service(name)["ports"].as_array() else {
            return Vec::new();
        };
        list.iter()
            .map(|p| {
                let s = match p {
                    Value::String(s) => s.clone(),
                    other => panic!("{name}: use \"ip:host:container\" for ports, not {other}"),
                };
                let parts: Vec<&str> = s.split(':').collect();
                let port = |x: &str| -> u16 {
                    x.parse()
                        .unwrap_or_else(|_| panic!("{name}: bad port in {s:?}"))
                };
                match parts.as_slice() {
                    [ip, host, container] => (ip.to_string(), port(host), port(container)),
                    [host, container] => ("0.0.0.0".to_string(), port(host), port(container)),
                    _ => panic!("{name}: bad port mapping {s:?}"),
                }
            })
            .collect()
    }

    /// The health check command, `CMD` form, or None (none, or disabled).
    fn healthcheck(&self, name: &str) -> Option<Vec<String>> {
        let hc = &self.service(name)["healthcheck"];
        if hc.is_null() || hc["disable"].as_bool() == Some(true) {
            return None;
        }
        let test: Vec<String> = hc["test"]
            .as_array()
            .unwrap_or_else(|| panic!("{name}: healthcheck.test must be a list"))
            .iter()
            .map(|w| w.as_str().expect("string").to_string())
            .collect();
        assert!(
            matches!(test.first().map(String::as_str), Some("CMD" | "CMD-SHELL")),
            "{name}: healthcheck.test starts with CMD or CMD-SHELL: {test:?}"
        );
        Some(test)
    }
}

/// The port of a `host:port` setting.
fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("{addr:?} has no port"))
}

/// `25s`, `1m30s`, `500ms` → seconds.
fn duration_secs(s: &str) -> f64 {
    let mut total = 0.0;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let n: f64 = num.parse().unwrap_or_else(|_| panic!("bad duration {s:?}"));
        num.clear();
        total += match c {
            'h' => n * 3600.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                n / 1000.0
            }
            'm' => n * 60.0,
            's' => n,
            _ => panic!("bad duration {s:?}"),
        };
    }
    assert!(num.is_empty(), "duration {s:?} lacks a unit");
    total
}

// ---------------------------------------------------------------------------------------
// The binary's command line

/// `(flags, env vars)` listed by `heatsink <sub> --help`.
fn cli_surface(sub: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let out = Command::new(env!("CARGO_BIN_EXE_heatsink"))
        .args([sub, "--help"])
        .output()
        .expect("run heatsink --help");
    assert!(out.status.success(), "heatsink {sub} --help failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut flags = BTreeSet::new();
    let mut envs = BTreeSet::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('-') {
            for word in line.split([' ', ',']) {
                if let Some(f) = word.strip_prefix("--") {
                    flags.insert(format!("--{f}"));
                }
            }
        }
        if let Some(rest) = line.strip_prefix("[env: ") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            envs.insert(name);
        }
    }
    assert!(flags.contains("--help"), "no flags parsed from:\n{text}");
    (flags, envs)
}

/// Asserts that every `--flag` in `args` and every `HEATSINK_*` name in `env` is
/// something `heatsink <sub>` accepts.
fn assert_cli_accepts(what: &str, sub: &str, args: &[String], env: &[&String]) {
    let (flags, envs) = cli_surface(sub);
    for a in args {
        if a.starts_with("--") {
            let flag = a.split('=').next().unwrap_or(a);
            assert!(
                flags.contains(flag),
                "{what}: `heatsink {sub}` has no flag {flag}; it has {flags:?}"
            );
        }
    }
    for name in env {
        if name.starts_with("HEATSINK_") {
            assert!(
                envs.contains(name.as_str()),
                "{what}: `heatsink {sub}` reads no {name}; it reads {envs:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Dockerfile

/// `(instruction, arguments)` per Dockerfile instruction, continuation lines joined,
/// comments and parser directives dropped.
fn dockerfile() -> Vec<(String, String)> {
    let text = read(&repo().join("Dockerfile"));
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(body) = t.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
            continue;
        }
        current.push_str(t);
        let full = std::mem::take(&mut current);
        let (ins, args) = full
            .trim()
            .split_once(char::is_whitespace)
            .unwrap_or((&full, ""));
        out.push((ins.to_ascii_uppercase(), args.trim().to_string()));
    }
    assert!(
        current.is_empty(),
        "Dockerfile ends inside a continued line"
    );
    out
}

/// An exec-form (JSON array) argument list.
fn exec_form(what: &str, args: &str) -> Vec<String> {
    serde_json::from_str(args)
        .unwrap_or_else(|e| panic!("{what} must be exec form (a JSON array): {args:?}: {e}"))
}

/// The health check's command (`HEALTHCHECK [options] CMD [...]`).
fn dockerfile_healthcheck(instructions: &[(String, String)]) -> Vec<String> {
    let hc: Vec<&String> = instructions
        .iter()
        .filter(|(i, _)| i == "HEALTHCHECK")
        .map(|(_, a)| a)
        .collect();
    assert_eq!(hc.len(), 1, "exactly one HEALTHCHECK");
    let cmd = hc[0]
        .split_once("CMD ")
        .map(|(_, c)| c)
        .expect("HEALTHCHECK ... CMD [...]");
    exec_form("HEALTHCHECK CMD", cmd)
}

/// The `(sources, destination)` of the `COPY`/`ADD` instructions that copy from the
/// build context (not `--from` another stage).
fn context_copies(instructions: &[(String, String)]) -> Vec<(Vec<String>, String)> {
    instructions
        .iter()
        .filter(|(i, _)| i == "COPY" || i == "ADD")
        .filter_map(|(_, args)| {
            let words: Vec<&str> = args.split_whitespace().collect();
            if words.iter().any(|w| w.starts_with("--from")) {
                return None;
            }
            let mut paths: Vec<String> = words
                .iter()
                .filter(|w| !w.starts_with("--"))
                .map(|w| w.to_string())
                .collect();
            let dest = paths.pop().expect("COPY has a destination");
            Some((paths, dest))
        })
        .collect()
}

/// Paths (relative to the repository) that `cargo build --release --locked` reads: the
/// manifest and lock file, the library and binary roots (their directories), a build
/// script, every target Cargo.toml declares with an explicit path, workspace members,
/// and files pulled in with `include_str!`/`include_bytes!`.
fn build_inputs() -> BTreeSet<String> {
    let manifest: toml::Table =
        toml::from_str(&read(&repo().join("Cargo.toml"))).expect("Cargo.toml");
    let mut need: BTreeSet<String> = ["Cargo.toml", "Cargo.lock"].map(String::from).into();
    let src_dir = |p: &str| -> String {
        Path::new(p)
            .parent()
            .map(|d| d.to_string_lossy().into_owned())
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| p.to_string())
    };
    if let Some(lib) = manifest.get("lib") {
        need.insert(src_dir(
            lib.get("path")
                .and_then(|p| p.as_str())
                .unwrap_or("src/lib.rs"),
        ));
    }
    for kind in ["bin", "example", "bench", "test"] {
        for target in manifest
            .get(kind)
            .and_then(|t| t.as_array())
            .into_iter()
            .flatten()
        {
            match target.get("path").and_then(|p| p.as_str()) {
                Some(p) => need.insert(p.to_string()),
                None if kind == "bin" => need.insert("src".to_string()),
                None => panic!("[[{kind}]] without a path: extend build_inputs()"),
            };
        }
    }
    let package = manifest.get("package").expect("[package]");
    match package.get("build") {
        Some(toml::Value::String(b)) => {
            need.insert(b.clone());
        }
        Some(toml::Value::Boolean(false)) => {}
        _ if repo().join("build.rs").exists() => {
            need.insert("build.rs".to_string());
        }
        _ => {}
    }
    if let Some(ws) = manifest.get("workspace") {
        for m in ws
            .get("members")
            .and_then(|m| m.as_array())
            .into_iter()
            .flatten()
        {
            need.insert(m.as_str().expect("member path").to_string());
        }
    }
    // include_str!/include_bytes! with a literal path, relative to the including file.
    let mut stack = vec![repo().join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = read(&path);
            for macro_name in ["include_str!(", "include_bytes!("] {
                for (i, _) in text.match_indices(macro_name) {
                    let arg = text[i + macro_name.len()..].trim_start();
                    let literal = arg
                        .strip_prefix('"')
                        .and_then(|a| a.split_once('"'))
                        .map(|(l, _)| l)
                        .unwrap_or_else(|| {
                            panic!(
                                "{}: {macro_name} without a literal path: extend build_inputs()",
                                path.display()
                            )
                        });
                    let target = resolve(path.parent().expect("dir"), literal);
                    let rel = target
                        .strip_prefix(repo())
                        .unwrap_or_else(|_| panic!("{literal} is outside the repository"));
                    need.insert(rel.to_string_lossy().into_owned());
                }
            }
        }
    }
    need
}

// ---------------------------------------------------------------------------------------
// Prometheus text format and PromQL

/// Metric name → the label sets of its samples.
type Exposition = BTreeMap<String, Vec<BTreeMap<String, String>>>;

/// Parses the Prometheus text format (samples only).
fn parse_exposition(text: &str) -> Exposition {
    let mut out: Exposition = BTreeMap::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let mut labels = BTreeMap::new();
        if line[name_end..].starts_with('{') {
            let close = line.rfind('}').expect("closing brace");
            let body = &line[name_end + 1..close];
            let mut rest = body;
            while !rest.is_empty() {
                let (k, after) = rest.split_once("=\"").expect("label=\"value\"");
                let mut value = String::new();
                let mut chars = after.char_indices();
                let mut end = after.len();
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some((_, e)) = chars.next() {
                                value.push(match e {
                                    'n' => '\n',
                                    other => other,
                                });
                            }
                        }
                        '"' => {
                            end = i + 1;
                            break;
                        }
                        c => value.push(c),
                    }
                }
                labels.insert(k.trim().to_string(), value);
                rest = after[end..].trim_start_matches(',');
            }
        }
        let value = line[name_end..].rsplit(' ').next().expect("sample value");
        assert!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "bad sample line {line:?}"
        );
        out.entry(name.to_string()).or_default().push(labels);
    }
    out
}

/// The value of the sample `name` whose labels include `want`.
fn sample(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            return None;
        }
        let ok = want
            .iter()
            .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        ok.then(|| rest.rsplit(' ').next()?.parse().ok())?
    })
}

/// A label matcher: `(label, op, value)`.
type Matcher = (String, String, String);

/// What a PromQL expression selects: each metric with its label matchers, and the
/// labels of `by`/`without`/`on`/`ignoring`/`group_*` clauses.
#[derive(Debug, Default)]
struct Selection {
    metrics: Vec<(String, Vec<Matcher>)>,
    grouping: Vec<String>,
}

/// A small PromQL lexer: enough to find metric selectors and grouping labels.
fn parse_promql(expr: &str) -> Selection {
    let mut sel = Selection::default();
    let chars: Vec<char> = expr.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let skip_ws = |mut i: usize| {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        i
    };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' {
            // A string outside a selector (e.g. a label_replace argument).
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '[' {
            // Range or subquery duration.
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let j = skip_ws(i);
            let label_list = [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ];
            if label_list.contains(&word.as_str()) {
                if chars.get(j) != Some(&'(') {
                    // `group_left` without labels.
                    continue;
                }
                let close = chars[j..]
                    .iter()
                    .position(|&c| c == ')')
                    .map(|p| p + j)
                    .expect("closing )");
                let list: String = chars[j + 1..close].iter().collect();
                sel.grouping.extend(
                    list.split(',')
                        .map(|l| l.trim().to_string())
                        .filter(|l| !l.is_empty()),
                );
                i = close + 1;
            } else if chars.get(j) == Some(&'(') {
                // A function or aggregation call.
            } else {
                let mut matchers = Vec::new();
                if chars.get(j) == Some(&'{') {
                    let mut k = j + 1;
                    loop {
                        k = skip_ws(k);
                        if chars.get(k) == Some(&'}') {
                            k += 1;
                            break;
                        }
                        let ls = k;
                        while k < chars.len() && ident(chars[k]) {
                            k += 1;
                        }
                        let label: String = chars[ls..k].iter().collect();
                        k = skip_ws(k);
                        let os = k;
                        while k < chars.len() && "=!~".contains(chars[k]) {
                            k += 1;
                        }
                        let op: String = chars[os..k].iter().collect();
                        k = skip_ws(k);
                        assert_eq!(chars.get(k), Some(&'"'), "matcher value in {expr:?}");
                        k += 1;
                        let vs = k;
                        while k < chars.len() && chars[k] != '"' {
                            k += if chars[k] == '\\' { 2 } else { 1 };
                        }
                        let value: String = chars[vs..k].iter().collect();
                        k += 1;
                        assert!(
                            ["=", "!=", "=~", "!~"].contains(&op.as_str()) && !label.is_empty(),
                            "bad matcher {label}{op}\"{value}\" in {expr:?}"
                        );
                        matchers.push((label, op, value));
                        k = skip_ws(k);
                        if chars.get(k) == Some(&',') {
                            k += 1;
                        }
                    }
                    i = k;
                }
                // Operators and aggregations (`sum by (l) (…)` puts `by` before the call).
                let keywords = [
                    "and",
                    "or",
                    "unless",
                    "bool",
                    "offset",
                    "sum",
                    "min",
                    "max",
                    "avg",
                    "group",
                    "stddev",
                    "stdvar",
                    "count",
                    "count_values",
                    "bottomk",
                    "topk",
                    "quantile",
                    "limitk",
                    "limit_ratio",
                ];
                if !keywords.contains(&word.as_str()) {
                    sel.metrics.push((word, matchers));
                }
            }
        } else {
            i += 1;
        }
    }
    sel
}

/// Checks one PromQL expression against a live exposition: every metric exists, every
/// matcher's label exists on it (or is a target label), every fixed `=` value occurs,
/// and every grouping label belongs to one of the selected metrics.
fn check_promql(what: &str, expr: &str, live: &Exposition, target_labels: &BTreeSet<String>) {
    let sel = parse_promql(expr);
    assert!(!sel.metrics.is_empty(), "{what}: no metric in {expr:?}");
    let mut available: BTreeSet<String> = target_labels.clone();
    for (metric, matchers) in &sel.metrics {
        assert!(
            metric.starts_with("heatsink_"),
            "{what}: {metric:?} in {expr:?} is not a heatsink metric"
        );
        let series = live.get(metric).unwrap_or_else(|| {
            panic!(
                "{what}: {expr:?} uses {metric}, which /metrics does not export; it has {:?}",
                live.keys().collect::<Vec<_>>()
            )
        });
        let labels: BTreeSet<&String> = series.iter().flat_map(|s| s.keys()).collect();
        available.extend(labels.iter().map(|l| l.to_string()));
        for (label, op, value) in matchers {
            if target_labels.contains(label) {
                continue;
            }
            assert!(
                labels.contains(label),
                "{what}: {metric} has no label {label:?} (it has {labels:?}) in {expr:?}"
            );
            if op == "=" && !value.contains('$') {
                assert!(
                    series.iter().any(|s| s.get(label) == Some(value)),
                    "{what}: no {metric} series with {label}=\"{value}\" in {expr:?}"
                );
            }
        }
    }
    for label in &sel.grouping {
        assert!(
            available.contains(label),
            "{what}: grouping label {label:?} is on none of the metrics of {expr:?}"
        );
    }
}

/// Every panel, rows' nested panels included.
fn all_panels(dash: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        out.push(p);
        if let Some(nested) = p["panels"].as_array() {
            out.extend(nested.iter());
        }
    }
    out
}

/// Every PromQL expression of the dashboard: `(where, expr)`.
fn dashboard_queries(dash: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in all_panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("target expr").to_string();
            out.push((format!("panel {:?}", p["title"]), expr));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// HTTP

// ---------------------------------------------------------------------------------------
// Tests: static structure

#[test]
fn compose_file_structure() {
    let c = Compose::load();
    let top: BTreeSet<&String> = c.doc.as_object().expect("a map").keys().collect();
    for k in &top {
        assert!(
            ["name", "services", "volumes", "networks", "configs", "secrets"].contains(&k.as_str())
                || k.starts_with("x-"),
            "compose.yaml: unknown top-level key {k:?}"
        );
    }
    let known_keys = [
        "build",
        "image",
        "command",
        "entrypoint",
        "environment",
        "volumes",
        "ports",
        "healthcheck",
        "depends_on",
        "restart",
        "profiles",
        "stop_grace_period",
        "stop_signal",
        "user",
        "read_only",
        "networks",
        "network_mode",
        "working_dir",
        "expose",
        "labels",
        "logging",
        "init",
        "tmpfs",
        "cap_drop",
        "security_opt",
    ];
    for (name, svc) in c.services() {
        for k in svc.as_object().expect("service is a map").keys() {
            assert!(
                known_keys.contains(&k.as_str()),
                "compose.yaml: service {name}: unknown key {k:?}"
            );
        }
        assert!(
            svc.get("image").is_some() || svc.get("build").is_some(),
            "{name}: neither image nor build"
        );
        // Builds: the context and its Dockerfile exist.
        if let Some(build) = svc.get("build") {
            let (context, dockerfile) = match build {
                Value::String(s) => (s.as_str(), "Dockerfile"),
                Value::Object(o) => (
                    o["context"].as_str().expect("build.context"),
                    o.get("dockerfile")
                        .and_then(Value::as_str)
                        .unwrap_or("Dockerfile"),
                ),
                other => panic!("{name}: build is {other}"),
            };
            let dir = resolve(&sidecar(), context);
            assert!(
                dir.is_dir(),
                "{name}: build context {} missing",
                dir.display()
            );
            assert!(
                dir.join(dockerfile).is_file(),
                "{name}: {} missing",
                dir.join(dockerfile).display()
            );
        }
        // Bind mounts: the source exists; named volumes are declared.
        for (source, target, _) in c.volumes(name) {
            assert!(
                target.starts_with('/'),
                "{name}: mount target {target:?} is not absolute"
            );
            match Compose::bind_source(&source) {
                Some(path) => assert!(
                    path.exists(),
                    "{name}: mounts {source} ({}), which does not exist",
                    path.display()
                ),
                None => assert!(
                    c.doc["volumes"].get(&source).is_some(),
                    "{name}: named volume {source:?} not declared under volumes:"
                ),
            }
        }
        // Dependencies: known services, valid conditions, healthchecks where awaited,
        // and a service that always starts never waits for one in a profile.
        for (dep, cond) in c.depends_on(name) {
            assert!(
                c.services().contains_key(&dep),
                "{name} depends on unknown {dep}"
            );
            assert!(
                [
                    "service_started",
                    "service_healthy",
                    "service_completed_successfully"
                ]
                .contains(&cond.as_str()),
                "{name}: depends_on {dep}: bad condition {cond}"
            );
            if cond == "service_healthy" {
                assert!(
                    c.healthcheck(&dep).is_some(),
                    "{name} waits for {dep} to be healthy, but {dep} has no healthcheck"
                );
            }
            if c.profiles(name).is_empty() {
                assert!(
                    c.profiles(&dep).is_empty(),
                    "{name} (always started) depends on {dep}, which is in a profile"
                );
            }
        }
        // Variables have defaults (interpolate panics otherwise) and are documented.
        let mut all = Vec::new();
        strings(svc, &mut all);
        let readme = read(&sidecar().join("README.md"));
        for s in &all {
            let _ = interpolate(s);
            for v in variables(s) {
                assert!(
                    readme.contains(&v),
                    "{name}: ${{{v}}} is not explained in README.md"
                );
            }
        }
    }
    // No dependency cycle: repeatedly remove services whose dependencies are all gone.
    let mut left: BTreeSet<String> = c.services().keys().cloned().collect();
    while !left.is_empty() {
        let ready: Vec<String> = left
            .iter()
            .filter(|s| c.depends_on(s).keys().all(|d| !left.contains(d)))
            .cloned()
            .collect();
        assert!(!ready.is_empty(), "dependency cycle among {left:?}");
        for r in ready {
            left.remove(&r);
        }
    }
    // Published host ports are unique and bound to loopback.
    let mut host_ports = BTreeSet::new();
    for name in c.services().keys() {
        for (ip, host, _) in c.ports(name) {
            assert!(host_ports.insert(host), "host port {host} published twice");
            assert_eq!(
                ip, "127.0.0.1",
                "{name}: publish on the host's loopback only"
            );
        }
    }
}

#[test]
fn compose_services_fit_together() {
    let c = Compose::load();
    let rules_target = "/etc/heatsink/rules";

    // db: MariaDB 10.11 with the example schema in the init directory.
    assert!(
        c.service("db")["image"]
            .as_str()
            .is_some_and(|i| i.starts_with("mariadb:10.11")),
        "db runs mariadb:10.11"
    );
    let schema = c
        .volumes("db")
        .into_iter()
        .find(|(_, t, _)| t.starts_with("/docker-entrypoint-initdb.d/"))
        .expect("db mounts a file into /docker-entrypoint-initdb.d/");
    assert!(
        schema.1.ends_with(".sql"),
        "init file {:?} ends in .sql",
        schema.1
    );
    let schema_path = Compose::bind_source(&schema.0).expect("a bind mount");
    assert_eq!(schema_path, repo().join("examples/demo/schema.sql"));
    assert!(c.env("db").contains_key("MARIADB_ROOT_PASSWORD"));
    assert!(c.healthcheck("db").is_some(), "db has a healthcheck");

    // heatsink and migrate: the repository's image, the rules mounted read-only.
    for name in ["heatsink", "migrate"] {
        let build = &c.service(name)["build"];
        assert_eq!(
            resolve(&sidecar(), build["context"].as_str().expect("context")),
            repo()
        );
        assert_eq!(build["dockerfile"].as_str(), Some("Dockerfile"));
        let rules = c
            .volumes(name)
            .into_iter()
            .find(|(_, t, _)| t == rules_target)
            .unwrap_or_else(|| panic!("{name} mounts the rules at {rules_target}"));
        assert_eq!(Compose::bind_source(&rules.0), Some(repo().join("rules")));
        assert!(rules.2, "{name}: the rules are mounted read-only");
        assert!(
            std::fs::read_dir(repo().join("rules"))
                .expect("rules dir")
                .flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "toml")),
            "rules/ holds rule files"
        );
    }
    assert_eq!(
        c.service("heatsink")["image"],
        c.service("migrate")["image"],
        "one image for both"
    );

    // heatsink: where it listens, what it forwards to, its health check.
    let env = c.env("heatsink");
    assert_eq!(
        env.get("HEATSINK_BACKEND").map(String::as_str),
        Some("db:3306")
    );
    assert_eq!(
        env.get("HEATSINK_RULES").map(String::as_str),
        Some(rules_target)
    );
    let listen = port_of(
        env.get("HEATSINK_LISTEN")
            .map_or("0.0.0.0:6033", String::as_str),
    );
    let metrics = port_of(env.get("HEATSINK_METRICS").expect("HEATSINK_METRICS"));
    let published: BTreeSet<u16> = c.ports("heatsink").iter().map(|p| p.2).collect();
    assert!(
        published.contains(&metrics),
        "the metrics port is published"
    );
    let mut listening = BTreeSet::from([listen, metrics]);
    if let Some(admin) = env.get("HEATSINK_ADMIN") {
        listening.insert(port_of(admin));
        assert!(
            env.contains_key("HEATSINK_ADMIN_PASSWORD"),
            "an admin port beyond loopback needs a password"
        );
    }
    assert!(
        published.is_subset(&listening),
        "heatsink publishes {published:?} but listens on {listening:?}"
    );
    let hc = c
        .healthcheck("heatsink")
        .expect("heatsink has a healthcheck");
    assert_eq!(
        hc[1..],
        dockerfile_healthcheck(&dockerfile())[..],
        "the compose healthcheck is the image's"
    );
    assert!(
        hc.iter()
            .any(|w| w.contains(&format!(":{metrics}/healthz"))),
        "the healthcheck probes the metrics port: {hc:?}"
    );
    let command = c.words("heatsink", "command");
    let drain = command
        .iter()
        .position(|w| w == "--drain-timeout")
        .map(|i| command[i + 1].parse::<f64>().expect("seconds"))
        .or_else(|| {
            env.get("HEATSINK_DRAIN_TIMEOUT")
                .map(|s| s.parse().expect("seconds"))
        })
        .unwrap_or(30.0);
    let grace = c.service("heatsink")["stop_grace_period"]
        .as_str()
        .map_or(10.0, duration_secs);
    assert!(
        grace > drain,
        "stop_grace_period ({grace} s) must exceed the drain timeout ({drain} s)"
    );
    let deps = c.depends_on("heatsink");
    assert_eq!(deps.get("db").map(String::as_str), Some("service_healthy"));

    // migrate: one shot against db, before heatsink and the app.
    assert_eq!(
        c.words("migrate", "entrypoint"),
        ["/usr/local/bin/heatsink"],
        "migrate runs the binary, not `serve`"
    );
    let cmd = c.words("migrate", "command");
    assert_eq!(cmd.first().map(String::as_str), Some("migrate"));
    assert!(cmd.iter().any(|w| w == "--apply"), "migrate --apply");
    let i = cmd.iter().position(|w| w == "--rules").expect("--rules");
    assert_eq!(cmd[i + 1], rules_target);
    let url = migrate_url(&c);
    let after_at = url.rsplit_once('@').expect("user@host in the URL").1;
    assert!(
        after_at.starts_with("db:3306/"),
        "migrate connects to db:3306: {url}"
    );
    let database = after_at.trim_start_matches("db:3306/");
    assert!(
        read(&schema_path).contains(&format!("CREATE DATABASE IF NOT EXISTS {database}")),
        "the schema creates the database migrate works in ({database})"
    );
    assert_eq!(
        c.depends_on("migrate").get("db").map(String::as_str),
        Some("service_healthy")
    );
    assert_ne!(c.service("migrate")["restart"].as_str(), Some("always"));

    // app: through heatsink, after migrate.
    let app = c.env("app");
    assert_eq!(app.get("DB_HOST").map(String::as_str), Some("heatsink"));
    assert_eq!(
        app.get("DB_PORT").map(String::as_str),
        Some(listen.to_string().as_str())
    );
    let deps = c.depends_on("app");
    assert_eq!(
        deps.get("migrate").map(String::as_str),
        Some("service_completed_successfully")
    );
    assert_eq!(
        deps.get("heatsink").map(String::as_str),
        Some("service_healthy")
    );
    let app_dir = resolve(
        &sidecar(),
        c.service("app")["build"].as_str().expect("build: ./app"),
    );
    let app_docker = read(&app_dir.join("Dockerfile"));
    assert!(app_dir.join("app.py").is_file() && app_docker.contains("app.py"));
    assert!(
        app_docker.contains("USER "),
        "the app image runs as a non-root user"
    );

    // Prometheus scrapes heatsink's metrics port; Grafana reads Prometheus and the
    // dashboard file compose mounts.
    let prom = yaml(&sidecar().join("prometheus.yml"));
    let jobs = prom["scrape_configs"].as_array().expect("scrape_configs");
    let targets: Vec<&str> = jobs
        .iter()
        .flat_map(|j| j["static_configs"].as_array().into_iter().flatten())
        .flat_map(|s| s["targets"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    assert!(
        targets.contains(&format!("heatsink:{metrics}").as_str()),
        "prometheus.yml scrapes heatsink:{metrics}: {targets:?}"
    );
    assert!(
        duration_secs(
            prom["global"]["scrape_interval"]
                .as_str()
                .expect("interval")
        ) > 0.0
    );
    let prom_mount = c
        .volumes("prometheus")
        .into_iter()
        .find(|(_, t, _)| t == "/etc/prometheus/prometheus.yml")
        .expect("prometheus.yml mounted");
    assert_eq!(
        Compose::bind_source(&prom_mount.0),
        Some(sidecar().join("prometheus.yml"))
    );
    let grafana = c.volumes("grafana");
    let mounted = |file: &str| -> String {
        grafana
            .iter()
            .find(|(s, _, _)| Compose::bind_source(s) == Some(sidecar().join(file)))
            .map(|(_, t, _)| t.clone())
            .unwrap_or_else(|| panic!("grafana mounts {file}"))
    };
    let dash_target = mounted("grafana-dashboard.json");
    assert!(
        mounted("grafana/datasource.yaml").starts_with("/etc/grafana/provisioning/datasources/")
    );
    assert!(mounted("grafana/dashboards.yaml").starts_with("/etc/grafana/provisioning/dashboards/"));
    let providers = yaml(&sidecar().join("grafana/dashboards.yaml"));
    let provider_path = providers["providers"][0]["options"]["path"]
        .as_str()
        .expect("provider path");
    assert_eq!(
        Path::new(&dash_target).parent(),
        Some(Path::new(provider_path)),
        "the dashboard is mounted where the provider looks"
    );
    let ds = yaml(&sidecar().join("grafana/datasource.yaml"));
    let ds0 = &ds["datasources"][0];
    assert_eq!(ds0["type"].as_str(), Some("prometheus"));
    let url = ds0["url"].as_str().expect("datasource url");
    let host = url
        .trim_start_matches("http://")
        .split(':')
        .next()
        .expect("host");
    assert!(
        c.services().contains_key(host),
        "the data source points at service {host}"
    );
}

/// The `migrate` service's backend URL (its environment or `--backend-url`).
fn migrate_url(c: &Compose) -> String {
    let cmd = c.words("migrate", "command");
    cmd.iter()
        .position(|w| w == "--backend-url")
        .map(|i| cmd[i + 1].clone())
        .or_else(|| c.env("migrate").get("HEATSINK_BACKEND_URL").cloned())
        .expect("migrate has a backend URL")
}

#[test]
fn compose_and_dockerfile_use_real_flags() {
    let c = Compose::load();
    let env = c.env("heatsink");
    assert_cli_accepts(
        "compose heatsink",
        "serve",
        &c.words("heatsink", "command"),
        &env.keys().collect::<Vec<_>>(),
    );
    let menv = c.env("migrate");
    let mcmd = c.words("migrate", "command");
    assert_cli_accepts(
        "compose migrate",
        "migrate",
        &mcmd[1..],
        &menv.keys().collect::<Vec<_>>(),
    );
    let hc = c.healthcheck("heatsink").expect("healthcheck");
    assert_eq!(hc.get(2).map(String::as_str), Some("health"));
    assert_cli_accepts("compose healthcheck", "health", &hc[3..], &[]);

    let instructions = dockerfile();
    let dockerfile_env: Vec<String> = instructions
        .iter()
        .filter(|(i, _)| i == "ENV")
        .flat_map(|(_, a)| {
            a.split_whitespace()
                .map(|kv| kv.split('=').next().unwrap_or(kv).to_string())
        })
        .collect();
    assert_cli_accepts(
        "Dockerfile ENV",
        "serve",
        &[],
        &dockerfile_env.iter().collect::<Vec<_>>(),
    );
    let hc = dockerfile_healthcheck(&instructions);
    assert_cli_accepts("Dockerfile HEALTHCHECK", "health", &hc[2..], &[]);
}

/// The cluster variant: heatsink's settings are real flags and variables, its
/// backend list names the three Galera nodes, each a service that runs with Galera
/// on, one of them bootstrapping; the bind-mounted files exist.
#[test]
fn cluster_compose_file() {
    let c = Compose::load_cluster();
    let env = c.env("heatsink");
    assert_cli_accepts(
        "compose.cluster.yaml heatsink",
        "serve",
        &c.words("heatsink", "command"),
        &env.keys().collect::<Vec<_>>(),
    );
    let mcmd = c.words("migrate", "command");
    assert_cli_accepts("compose.cluster.yaml migrate", "migrate", &mcmd[1..], &[]);
    let nodes: Vec<&str> = env["HEATSINK_BACKEND"].split(',').collect();
    assert_eq!(nodes, ["db1:3306", "db2:3306", "db3:3306"]);
    let mut bootstraps = 0;
    for node in &nodes {
        let name = node.split(':').next().unwrap_or_default();
        let cmd = c.words(name, "command");
        assert!(
            cmd.contains(&"--wsrep-on=ON".to_string()),
            "{name}: {cmd:?}"
        );
        bootstraps += usize::from(cmd.contains(&"--wsrep-new-cluster".to_string()));
        for (source, _, _) in c.volumes(name) {
            if let Some(path) = Compose::bind_source(&source) {
                assert!(path.exists(), "{name}: {} is missing", path.display());
            }
        }
    }
    assert_eq!(bootstraps, 1, "exactly one node bootstraps the cluster");
    assert!(env.contains_key("HEATSINK_HEALTH_USER"));
}

#[test]
fn dockerfile_structure() {
    let instructions = dockerfile();
    let stages: Vec<usize> = instructions
        .iter()
        .enumerate()
        .filter(|(_, (i, _))| i == "FROM")
        .map(|(n, _)| n)
        .collect();
    assert!(
        stages.len() >= 2,
        "multi-stage: a build stage and a runtime stage"
    );
    let build_from = &instructions[stages[0]].1;
    let build_name = build_from
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .find(|w| w[0].eq_ignore_ascii_case("AS"))
        .map(|w| w[1].to_string())
        .expect("the build stage is named (FROM … AS name)");
    let last = *stages.last().expect("a stage");
    let final_stage = &instructions[last..];
    assert!(
        !final_stage[0].1.starts_with("rust"),
        "the runtime stage is not the Rust toolchain image"
    );

    // The build runs `cargo build --release --locked` for the heatsink binary.
    let runs: Vec<&String> = instructions[..last]
        .iter()
        .filter(|(i, _)| i == "RUN")
        .map(|(_, a)| a)
        .collect();
    assert!(
        runs.iter()
            .any(|r| r.contains("cargo build --release --locked") && r.contains("--bin heatsink")),
        "the build stage runs cargo build --release --locked --bin heatsink"
    );

    // The runtime stage: the binary from the build stage, a non-root user, the health
    // check, `serve` as entrypoint.
    let copy_from = final_stage
        .iter()
        .find(|(i, a)| i == "COPY" && a.contains(&format!("--from={build_name}")))
        .map(|(_, a)| a.split_whitespace().last().unwrap_or_default().to_string())
        .expect("COPY --from=<build stage> of the binary");
    let users: Vec<&String> = final_stage
        .iter()
        .filter(|(i, _)| i == "USER")
        .map(|(_, a)| a)
        .collect();
    let user = users.last().expect("a USER in the runtime stage");
    let name = user.split(':').next().unwrap_or_default();
    assert!(
        !["root", "0", ""].contains(&name),
        "the image runs as a non-root user, not {user:?}"
    );
    let entry = final_stage
        .iter()
        .rev()
        .find(|(i, _)| i == "ENTRYPOINT")
        .map(|(_, a)| exec_form("ENTRYPOINT", a))
        .expect("an ENTRYPOINT");
    assert_eq!(entry.len(), 2, "ENTRYPOINT [binary, serve]: {entry:?}");
    assert_eq!(entry[1], "serve");
    assert!(
        entry[0] == copy_from || Path::new(&copy_from).join("heatsink") == Path::new(&entry[0]),
        "the entrypoint {} is the binary copied to {copy_from}",
        entry[0]
    );
    let hc = dockerfile_healthcheck(&instructions);
    assert_eq!(
        hc,
        [
            entry[0].as_str(),
            "health",
            "--url",
            "http://127.0.0.1:9633/healthz"
        ]
    );
    let env: HashMap<String, String> = final_stage
        .iter()
        .filter(|(i, _)| i == "ENV")
        .flat_map(|(_, a)| {
            a.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        env.get("HEATSINK_METRICS").map(|m| port_of(m)),
        Some(9633),
        "metrics (and so /healthz) on the port the health check probes"
    );
    let exposed: BTreeSet<&str> = final_stage
        .iter()
        .filter(|(i, _)| i == "EXPOSE")
        .flat_map(|(_, a)| a.split_whitespace())
        .collect();
    for port in [
        port_of(env.get("HEATSINK_LISTEN").expect("HEATSINK_LISTEN")),
        9633,
    ] {
        assert!(exposed.contains(port.to_string().as_str()), "EXPOSE {port}");
    }

    // The build context: every COPY source exists, and together they hold everything
    // cargo reads.
    let copies = context_copies(&instructions);
    let mut sources = Vec::new();
    for (srcs, _) in &copies {
        for s in srcs {
            let p = s.trim_start_matches("./").trim_end_matches('/').to_string();
            assert!(
                repo().join(&p).exists(),
                "COPY {s}: no such path in the repository"
            );
            sources.push(p);
        }
    }
    for need in build_inputs() {
        assert!(
            sources
                .iter()
                .any(|s| need == *s || need.starts_with(&format!("{s}/"))),
            "the Dockerfile does not COPY {need}, which cargo build needs (copied: {sources:?})"
        );
    }
    // Copied to the paths cargo expects relative to the manifest.
    let workdir = instructions[..last]
        .iter()
        .rev()
        .find(|(i, _)| i == "WORKDIR")
        .map(|(_, a)| a.clone())
        .expect("WORKDIR in the build stage");
    for (srcs, dest) in &copies {
        let dest = resolve(Path::new(&workdir), dest);
        for s in srcs {
            let s = s.trim_start_matches("./").trim_end_matches('/');
            let expected = Path::new(&workdir).join(s);
            if repo().join(s).is_dir() {
                // `COPY dir dest` copies the directory's contents into dest.
                assert_eq!(dest, expected, "COPY {s} keeps its path under {workdir}");
            } else {
                assert!(
                    dest == expected
                        || Path::new(&workdir).join(&dest)
                            == expected.parent().map(Path::to_path_buf).unwrap_or_default()
                        || dest.join(s) == expected,
                    "COPY {s} keeps its path under {workdir} (goes to {})",
                    dest.display()
                );
            }
        }
    }
}

#[test]
fn dashboard_structure() {
    let dash = dashboard();
    assert!(dash["schemaVersion"].as_u64().expect("schemaVersion") >= 36);
    assert!(dash["uid"]
        .as_str()
        .is_some_and(|u| !u.is_empty() && u.len() <= 40));
    assert!(dash["title"].as_str().is_some_and(|t| !t.is_empty()));
    let vars = dash["templating"]["list"]
        .as_array()
        .expect("templating.list");
    let ds_var = vars
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a data source variable");
    assert_eq!(ds_var["query"].as_str(), Some("prometheus"));
    let ds_uid = format!("${{{}}}", ds_var["name"].as_str().expect("variable name"));
    let var_names: BTreeSet<&str> = vars.iter().filter_map(|v| v["name"].as_str()).collect();
    for v in vars.iter().filter(|v| v["type"] == "query") {
        assert_eq!(v["datasource"]["uid"].as_str(), Some(ds_uid.as_str()));
    }

    let mut ids = BTreeSet::new();
    let mut boxes: Vec<(String, u64, u64, u64, u64)> = Vec::new();
    let mut titles = BTreeSet::new();
    for p in all_panels(&dash) {
        let title = p["title"].as_str().expect("panel title").to_string();
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "duplicate panel id in {title}"
        );
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().expect("x"),
            g["y"].as_u64().expect("y"),
            g["w"].as_u64().expect("w"),
            g["h"].as_u64().expect("h"),
        );
        assert!(w > 0 && h > 0 && x + w <= 24, "{title}: gridPos {g}");
        for (other, ox, oy, ow, oh) in &boxes {
            let overlap = x < ox + ow && *ox < x + w && y < oy + oh && *oy < y + h;
            assert!(!overlap, "panels {title:?} and {other:?} overlap");
        }
        boxes.push((title.clone(), x, y, w, h));
        let kind = p["type"].as_str().expect("panel type");
        if kind == "row" {
            continue;
        }
        assert!(
            [
                "timeseries",
                "stat",
                "gauge",
                "bargauge",
                "table",
                "heatmap"
            ]
            .contains(&kind),
            "{title}: panel type {kind}"
        );
        assert!(titles.insert(title.clone()), "two panels titled {title:?}");
        assert_eq!(
            p["datasource"]["type"].as_str(),
            Some("prometheus"),
            "{title}"
        );
        assert_eq!(
            p["datasource"]["uid"].as_str(),
            Some(ds_uid.as_str()),
            "{title}"
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no queries");
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(
                refs.insert(t["refId"].as_str().expect("refId")),
                "{title}: refId twice"
            );
            let expr = t["expr"].as_str().expect("expr");
            assert_eq!(
                expr.matches('(').count(),
                expr.matches(')').count(),
                "{title}: unbalanced parentheses in {expr}"
            );
            for var in expr.split('$').skip(1) {
                let name: String = var
                    .trim_start_matches('{')
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    name.starts_with("__") || var_names.contains(name.as_str()),
                    "{title}: ${name} is not a dashboard variable"
                );
            }
            if expr.contains("rate(") || expr.contains("increase(") {
                assert!(
                    expr.contains("[$__"),
                    "{title}: use $__rate_interval/$__range: {expr}"
                );
            }
        }
    }

    // The panels the dashboard promises.
    let queries = dashboard_queries(&dash)
        .into_iter()
        .map(|(_, e)| e)
        .collect::<Vec<_>>()
        .join("\n");
    for (what, needle) in [
        ("connections", "heatsink_connections_active"),
        ("connection rate", "rate(heatsink_connections_total"),
        (
            "statements by outcome",
            "sum by (outcome) (rate(heatsink_statements_total",
        ),
        ("rewritten per rule", "outcome=\"rewritten\""),
        ("rejected per rule", "outcome=\"rejected\""),
        (
            "rewrite latency p50",
            "histogram_quantile(0.5, sum by (le) (rate(heatsink_rewrite_duration_seconds_bucket",
        ),
        (
            "rewrite latency p99",
            "histogram_quantile(0.99, sum by (le) (rate(heatsink_rewrite_duration_seconds_bucket",
        ),
        (
            "reloads by result",
            "sum by (result) (increase(heatsink_rule_reloads_total",
        ),
        ("merge ratio", "rate(heatsink_coalesced_increments_total"),
        ("merge ratio", "/ sum(rate(heatsink_coalesced_writes_total"),
        (
            "backend connect errors",
            "rate(heatsink_backend_connect_errors_total",
        ),
    ] {
        assert!(
            queries.contains(needle),
            "the dashboard lacks {what} ({needle})"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Tests: the pieces, run

/// The compose stack minus Docker: the schema and the `migrate` service's command
/// against MariaDB, heatsink with the `heatsink` service's settings, the application
/// through it, the health checks; then the dashboard's queries against `/metrics`.
#[test]
fn compose_pieces_run_and_dashboard_matches_metrics() {
    let c = Compose::load();
    let db = mariadb();
    let rules = repo().join("rules");

    // db: the init file, as the image's entrypoint runs it (the mariadb client).
    let schema = std::fs::File::open(repo().join("examples/demo/schema.sql")).expect("schema");
    let st = Command::new("mariadb")
        .arg("--no-defaults")
        .arg("-uroot")
        .arg(format!("--socket={}", db.dir().join("sock").display()))
        .stdin(schema)
        .status()
        .expect("run mariadb");
    assert!(st.success(), "schema.sql failed");

    // migrate: the service's command and environment, with the container paths and
    // host names replaced by this machine's.
    let url = migrate_url(&c);
    let database = url.rsplit_once('/').expect("db in URL").1;
    let local_url = format!("mysql://root@{}/{database}", db.addr());
    let args: Vec<String> = c
        .words("migrate", "command")
        .into_iter()
        .map(|w| match w.as_str() {
            "/etc/heatsink/rules" => rules.display().to_string(),
            _ if w == url => local_url.clone(),
            _ => w,
        })
        .collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_heatsink"));
    cmd.args(&args);
    for (k, v) in c.env("migrate") {
        cmd.env(k, if v == url { local_url.clone() } else { v });
    }
    let out = cmd.output().expect("run migrate");
    assert!(
        out.status.success(),
        "heatsink {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // heatsink: the service's arguments and environment (addresses made local).
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut builder = Proxy::builder().rules_dir(&rules);
    for a in c.words("heatsink", "command") {
        builder = builder.arg(a);
    }
    builder = builder.arg("--metrics").arg(metrics.to_string());
    for (k, v) in c.env("heatsink") {
        let v = if v == "db:3306" {
            db.addr().to_string()
        } else if v == "/etc/heatsink/rules" {
            rules.display().to_string()
        } else if v.starts_with("0.0.0.0:") {
            format!("127.0.0.1:{}", free_port())
        } else {
            v
        };
        builder = builder.env(k, v);
    }
    let proxy = builder.start();

    // Health checks: compose's and the image's command, pointed at this proxy.
    let instructions = dockerfile();
    let healthchecks = [
        c.healthcheck("heatsink").expect("healthcheck")[1..].to_vec(),
        dockerfile_healthcheck(&instructions),
    ];
    for hc in healthchecks {
        let url = hc[3].replace("127.0.0.1:9633", &metrics.to_string());
        let st = Command::new(env!("CARGO_BIN_EXE_heatsink"))
            .args(["health", "--url", &url])
            .status()
            .expect("run heatsink health");
        assert!(st.success(), "{hc:?} fails against a running proxy");
    }

    // app: the example application, through the proxy.
    let iterations = 30;
    let mut app = Command::new("python3");
    app.arg(sidecar().join("app/app.py"));
    for (k, v) in c.env("app") {
        app.env(k, v);
    }
    app.env("DB_HOST", "127.0.0.1")
        .env("DB_PORT", proxy.port().to_string())
        .env("ITERATIONS", iterations.to_string())
        .env("INTERVAL", "0")
        .env("REPORT_EVERY", "10")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = app.spawn().expect("run python3 app.py");
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("app.py did not finish; proxy log:\n{}", proxy.log_text());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("app output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "app.py failed:\n{stdout}{}\nproxy log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        proxy.log_text()
    );
    let last = stdout.lines().last().expect("a progress line");
    let field = |name: &str| -> i64 {
        last.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}= in {last:?}"))
    };
    assert_eq!(field("iterations"), iterations);
    assert_eq!(field("failures"), 0);
    assert_eq!(field("home.cnt"), iterations, "the counter counted exactly");
    assert_eq!(
        field("latest_visitors"),
        5,
        "the log reads back as a ring of 5"
    );

    // /metrics, at the path prometheus.yml scrapes.
    let prom = yaml(&sidecar().join("prometheus.yml"));
    let job = &prom["scrape_configs"][0];
    let path = job["metrics_path"].as_str().unwrap_or("/metrics");
    let (status, text) = http_get(metrics, path);
    assert_eq!(status, 200, "GET {path}: {text}");
    let live = parse_exposition(&text);
    assert!(
        sample(
            &text,
            "heatsink_rule_statements_total",
            &[("rule", "page_hits"), ("outcome", "rewritten")]
        )
        .is_some_and(|v| v >= iterations as f64),
        "the app's increments were rewritten by page_hits:\n{text}"
    );
    assert!(
        sample(&text, "heatsink_rewrite_duration_seconds_count", &[]).is_some_and(|v| v > 0.0),
        "rewrite latencies were recorded"
    );

    // The dashboard's queries against it. Target labels Prometheus adds are allowed.
    let mut target_labels: BTreeSet<String> = ["instance", "job"].map(String::from).into();
    for sc in job["static_configs"].as_array().into_iter().flatten() {
        if let Some(labels) = sc["labels"].as_object() {
            target_labels.extend(labels.keys().cloned());
        }
    }
    let dash = dashboard();
    let queries = dashboard_queries(&dash);
    assert!(queries.len() >= 10, "the dashboard has its panels");
    for (what, expr) in &queries {
        check_promql(what, expr, &live, &target_labels);
    }
    for v in dash["templating"]["list"].as_array().expect("variables") {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .expect("variable query");
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable query {q:?} is not label_values(…)"));
        let (selector, label) = inner.rsplit_once(',').expect("label_values(metric, label)");
        let what = format!("variable {}", v["name"]);
        check_promql(&what, selector, &live, &target_labels);
        let label = label.trim();
        let metric = &parse_promql(selector).metrics[0].0;
        assert!(
            target_labels.contains(label) || live[metric].iter().any(|s| s.contains_key(label)),
            "{what}: {metric} has no label {label}"
        );
    }
    drop(proxy);
}

#[test]
fn promql_lexer() {
    let s = parse_promql(
        r#"histogram_quantile(0.99, sum by (le, rule) (rate(heatsink_x_bucket{instance=~"$instance",outcome="a,b}"}[$__rate_interval]))) / on (job) heatsink_y"#,
    );
    assert_eq!(
        s.metrics,
        [
            (
                "heatsink_x_bucket".to_string(),
                vec![
                    ("instance".into(), "=~".into(), "$instance".into()),
                    ("outcome".into(), "=".into(), "a,b}".into())
                ]
            ),
            ("heatsink_y".to_string(), vec![])
        ]
    );
    assert_eq!(s.grouping, ["le", "rule", "job"]);
    let e = parse_exposition("# HELP a b\na_total{rule=\"x\\\"y\",outcome=\"ok\"} 3\nb 1.5\n");
    assert_eq!(e["a_total"][0]["rule"], "x\"y");
    assert_eq!(e["a_total"][0]["outcome"], "ok");
    assert!(e["b"][0].is_empty());
    assert_eq!(interpolate("a${X:-b}c$$"), "abc$");
    assert_eq!(duration_secs("1m30s"), 90.0);
}
