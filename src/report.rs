//! What the drivers and the kinds report to a DBA, and how: the words shared by
//! `check`, `explain`, `migrate` and every kind's checks, below all of them.

use serde::Serialize;

/// How bad a problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The rule set must not be deployed as it is.
    Error,
    /// Worth a look; does not fail the check.
    Warning,
}

/// Output of `check` and `explain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Lines for people.
    #[default]
    Human,
    /// JSON for CI: one document (`check`), one object per statement (`explain`).
    Json,
}
