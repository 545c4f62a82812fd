//! Build script: the git commit the binary is built from, for `heatsink --version` and
//! the `heatsink_build_info` metric.
//!
//! `HEATSINK_GIT_COMMIT` in the build environment wins (container builds, where `.git`
//! is not in the context). Otherwise the commit is read from `.git` directly (a
//! checkout or a worktree; loose or packed refs), without running git and without the
//! network. When neither gives one, the commit is empty and the binary says `unknown`.

use std::fs;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=HEATSINK_GIT_COMMIT");
    let commit = match std::env::var("HEATSINK_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => clean(c.trim()),
        _ => from_git_dir().unwrap_or_default(),
    };
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let long = if commit.is_empty() {
        version
    } else {
        let short: String = commit.chars().take(12).collect();
        format!("{version} (commit {short})")
    };
    println!("cargo:rustc-env=HEATSINK_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=HEATSINK_VERSION_LONG={long}");
}

/// Keeps a commit id to hex digits, so it is safe in a metric label.
fn clean(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_hexdigit())
        .take(64)
        .collect()
}

/// Asks cargo to rerun this script when `path` changes, if it exists (a missing path
/// would make cargo rerun it on every build).
fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// The commit HEAD names, read from the checkout's `.git`.
fn from_git_dir() -> Option<String> {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let dot_git = root.join(".git");
    // A worktree or submodule has a `.git` file: `gitdir: <path>`.
    let git_dir = if dot_git.is_file() {
        let text = fs::read_to_string(&dot_git).ok()?;
        let dir = PathBuf::from(text.strip_prefix("gitdir:")?.trim());
        if dir.is_absolute() {
            dir
        } else {
            root.join(dir)
        }
    } else if dot_git.is_dir() {
        dot_git
    } else {
        return None;
    };
    // Branch refs live in the common directory (the main checkout's `.git`).
    let common = match fs::read_to_string(git_dir.join("commondir")) {
        Ok(c) => {
            let c = PathBuf::from(c.trim());
            if c.is_absolute() {
                c
            } else {
                git_dir.join(c)
            }
        }
        Err(_) => git_dir.clone(),
    };
    let head_path = git_dir.join("HEAD");
    watch(&head_path);
    // This checkout's reflog moves with every commit, checkout and reset here (and
    // only here: other worktrees' commits do not rebuild this one).
    watch(&git_dir.join("logs").join("HEAD"));
    let head = fs::read_to_string(&head_path).ok()?;
    let head = head.trim();
    let Some(reference) = head.strip_prefix("ref:") else {
        return Some(clean(head)).filter(|c| c.len() >= 7);
    };
    let reference = reference.trim();
    let packed = common.join("packed-refs");
    watch(&packed);
    for dir in [&git_dir, &common] {
        let loose = dir.join(reference);
        watch(&loose);
        if let Ok(id) = fs::read_to_string(&loose) {
            return Some(clean(id.trim())).filter(|c| c.len() >= 7);
        }
    }
    let packed = fs::read_to_string(packed).ok()?;
    packed
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('^'))
        .find_map(|l| {
            let (id, name) = l.split_once(' ')?;
            (name.trim() == reference).then(|| clean(id))
        })
        .filter(|c| c.len() >= 7)
}
