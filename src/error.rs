//! Errors, each tagged with where it came from.
//!
//! Every failure in the proxy is attributed to one [`Source`]: the client broke the
//! protocol or went away, the backend did, a rule file is wrong, or the proxy itself
//! has a bug. The source decides what the client is told and what is logged.

use std::fmt;

/// Who is responsible for an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The client: malformed packets, protocol violations, disconnects.
    Client,
    /// The backend MySQL/MariaDB server: connect failures, disconnects, bad packets.
    Backend,
    /// Rule files: syntax, validation, planning.
    Rules,
    /// The proxy itself: configuration and internal invariants.
    Internal,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Client => "client",
            Source::Backend => "backend",
            Source::Rules => "rules",
            Source::Internal => "internal",
        })
    }
}

/// An error with its source, a human context string and an optional cause.
#[derive(Debug)]
pub struct Error {
    /// Who is responsible (decides logging level and what the client sees).
    pub source: Source,
    /// What the proxy was doing, e.g. "reading command packet".
    pub context: String,
    /// The underlying cause, if any.
    pub cause: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Error {
    /// Builds an error without an underlying cause.
    pub fn new(source: Source, context: impl Into<String>) -> Self {
        Error {
            source,
            context: context.into(),
            cause: None,
        }
    }

    /// Builds an error wrapping `cause`.
    pub fn with_cause(
        source: Source,
        context: impl Into<String>,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error {
            source,
            context: context.into(),
            cause: Some(cause.into()),
        }
    }

    /// Shorthand for a client-side error.
    pub fn client(context: impl Into<String>) -> Self {
        Self::new(Source::Client, context)
    }

    /// Shorthand for a backend-side error.
    pub fn backend(context: impl Into<String>) -> Self {
        Self::new(Source::Backend, context)
    }

    /// True when the error is an I/O error meaning the peer simply went away.
    pub fn is_disconnect(&self) -> bool {
        match self
            .cause
            .as_ref()
            .and_then(|c| c.downcast_ref::<std::io::Error>())
        {
            Some(e) => matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            ),
            None => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} error: {}", self.source, self.context)?;
        if let Some(c) = &self.cause {
            write!(f, ": {c}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_ref()
            .map(|c| c.as_ref() as &(dyn std::error::Error + 'static))
    }
}

/// Result alias used across the crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Attaches a source and a context to any error: `conn.query(…).await.or_err(
/// Source::Backend, || format!("rule {name}: reading {table}"))?`. The context is built
/// only when there is an error.
pub trait OrErr<T> {
    /// Wraps the error as an [`Error`] from `source`, caused by the original error.
    fn or_err<C: Into<String>>(self, source: Source, context: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E> OrErr<T> for std::result::Result<T, E>
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn or_err<C: Into<String>>(self, source: Source, context: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| Error::with_cause(source, context(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn or_err_keeps_the_cause_and_adds_context() {
        let r: std::result::Result<(), std::io::Error> = Err(std::io::Error::other("disk on fire"));
        let e = r
            .or_err(Source::Rules, || "reading rule file r.toml")
            .unwrap_err();
        assert_eq!(e.source, Source::Rules);
        assert_eq!(
            e.to_string(),
            "rules error: reading rule file r.toml: disk on fire"
        );
        assert!(std::error::Error::source(&e).is_some());
    }
}
