//! Why a statement is refused: a [`Refusal`] is a reason in words together with its
//! [`RefusalClass`], one of a small closed set that says what a DBA can do about it.
//!
//! Planners ([`Rule::plan`](super::Rule::plan) and the helpers it calls) return
//! `Err(Refusal)`; the engine turns it into a [`Rejection`](super::Rejection), whose
//! message (`heatsink rule 'R': <reason>`) reaches the client as ERR 1105 and whose
//! class `SHOW REFUSALS` and the refusal metric show. Build one with the constructor
//! of its class (`Refusal::shape("…")`); there is deliberately no conversion from a
//! bare `String`, so every refusal names its class where it is made.

use std::fmt;

/// What kind of obstacle a refusal is, in a closed set (a metric label, a column of
/// `SHOW REFUSALS`), each with its own remedy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RefusalClass {
    /// The statement's form is one the rule cannot rewrite exactly (a clause, a join,
    /// a multi-row or multi-table form, an assignment the kind does not model).
    /// Remedy: write the statement in a form the rule documents, or send it to the
    /// physical tables directly.
    Shape,
    /// A value in the statement (a literal, a key, an increment) whose type,
    /// character set or `sql_mode` reading the rewrite cannot keep exact. Remedy:
    /// send a value of the column's own type, well-formed in the connection's
    /// character set.
    Value,
    /// A prepared statement's parameter sits where the rewrite needs a value it
    /// cannot check at execute. Remedy: send that value as a literal.
    Parameter,
    /// A setting of the session (its character set, a `sql_mode` flag, a `SET
    /// STATEMENT` variable) under which the rewrite cannot keep the statement's
    /// meaning. Remedy: change the session's setting for statements on the table.
    Session,
    /// The statement cannot be read: it does not lex or parse, holds several
    /// statements, nests too deep, or uses syntax the parser misreads. Remedy: send
    /// one statement in plainer syntax.
    Unreadable,
    /// Maintenance of the logical table (`ALTER`, `DROP`, `RENAME`, `TRUNCATE`,
    /// `LOCK TABLES`, `LOAD DATA`), which would put the physical tables out of step.
    /// Remedy: run it on the database directly, on the physical tables too.
    Ddl,
    /// What the rule must know of the table is missing or does not fit it: no
    /// database selected, a column the table lacks, a column type the rule cannot
    /// serve. Remedy: select a database, or fix the rule or the table.
    Schema,
    /// A fault of heatsink itself (a rewrite it cannot read back, a rule that
    /// failed). Remedy: report it.
    Internal,
}

impl RefusalClass {
    /// Every class, in the order of the enum (the metric's series).
    pub const ALL: [RefusalClass; 8] = [
        RefusalClass::Shape,
        RefusalClass::Value,
        RefusalClass::Parameter,
        RefusalClass::Session,
        RefusalClass::Unreadable,
        RefusalClass::Ddl,
        RefusalClass::Schema,
        RefusalClass::Internal,
    ];

    /// Its name in `SHOW REFUSALS` and the metric's `class` label.
    pub fn label(self) -> &'static str {
        match self {
            RefusalClass::Shape => "shape",
            RefusalClass::Value => "value",
            RefusalClass::Parameter => "parameter",
            RefusalClass::Session => "session",
            RefusalClass::Unreadable => "unreadable",
            RefusalClass::Ddl => "ddl",
            RefusalClass::Schema => "schema",
            RefusalClass::Internal => "internal",
        }
    }

    /// Its position in [`RefusalClass::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for RefusalClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Why a planner refuses a statement: its class and the reason, in words a DBA or
/// developer can act on (the reason reaches the client; it never quotes values the
/// statement holds unless the rule read them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    class: RefusalClass,
    reason: String,
}

impl Refusal {
    /// A refusal of `class`.
    pub fn new(class: RefusalClass, reason: impl Into<String>) -> Refusal {
        Refusal {
            class,
            reason: reason.into(),
        }
    }

    /// [`RefusalClass::Shape`]: a form the rule cannot rewrite exactly.
    pub fn shape(reason: impl Into<String>) -> Refusal {
        Refusal::new(RefusalClass::Shape, reason)
    }

    /// [`RefusalClass::Value`]: a value the rewrite cannot keep exact.
    pub fn value(reason: impl Into<String>) -> Refusal {
        Refusal::new(RefusalClass::Value, reason)
    }

    /// [`RefusalClass::Parameter`]: a parameter the rewrite cannot check.
    pub fn parameter(reason: impl Into<String>) -> Refusal {
        Refusal::new(RefusalClass::Parameter, reason)
    }

    /// [`RefusalClass::Session`]: a session setting the rewrite cannot keep.
    pub fn session(reason: impl Into<String>) -> Refusal {
        Refusal::new(RefusalClass::Session, reason)
    }

    /// [`RefusalClass::Unreadable`]: a statement that cannot be read.
    pub fn unreadable(reason: impl Into<String>) -> Refusal {
        Refusal::new(RefusalClass::Unreadable, reason)
    }

    /// [`RefusalClass::Ddl`]: maintenance of the logical table.
    pub fn ddl(reason: impl Into<String>) -> Refusal {
        Refusal::new(RefusalClass::Ddl, reason)
    }

    /// [`RefusalClass::Schema`]: what the rule must know of the table is missing.
    pub fn schema(reason: impl Into<String>) -> Refusal {
        Refusal::new(RefusalClass::Schema, reason)
    }

    /// [`RefusalClass::Internal`]: a fault of heatsink itself.
    pub fn internal(reason: impl Into<String>) -> Refusal {
        Refusal::new(RefusalClass::Internal, reason)
    }

    /// The class.
    pub fn class(&self) -> RefusalClass {
        self.class
    }

    /// The reason, in words.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The reason, owned.
    pub fn into_reason(self) -> String {
        self.reason
    }

    /// The same class with the reason rewritten by `f` (to add context: `format!("in
    /// the subquery: {r}")`).
    #[must_use]
    pub fn map_reason(self, f: impl FnOnce(String) -> String) -> Refusal {
        Refusal {
            class: self.class,
            reason: f(self.reason),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Refusal {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_set_the_class_and_keep_the_text() {
        let r = Refusal::shape("tuple assignments cannot be rewritten");
        assert_eq!(r.class(), RefusalClass::Shape);
        assert_eq!(r.to_string(), "tuple assignments cannot be rewritten");
        let r = Refusal::value(format!("a NULL key (`{}`) cannot be stored", "k"))
            .map_reason(|s| format!("{s} in the ring"));
        assert_eq!(r.class(), RefusalClass::Value);
        assert_eq!(r.reason(), "a NULL key (`k`) cannot be stored in the ring");
    }

    #[test]
    fn labels_are_distinct_and_in_order() {
        let labels: Vec<&str> = RefusalClass::ALL.iter().map(|c| c.label()).collect();
        let mut sorted = labels.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), labels.len());
        for (i, c) in RefusalClass::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
            assert_eq!(c.to_string(), c.label());
        }
    }
}
