//! What rule sections of every kind share: table names, identifiers, the `mode`
//! key and defaults. Each kind's own section is in `src/kinds/<kind>/spec.rs`.

use serde::Deserialize;

/// A table name: as written in a rule (`table` or `db.table`), as a rule is about it
/// (the engine matches the name ASCII case-insensitively; no database means a table
/// of this name in any database), or resolved to its database by schema work.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    /// Database, when the rule names one; otherwise the rule applies in any database.
    pub db: Option<String>,
    /// Table name.
    pub name: String,
}

impl TableName {
    /// A table name, optionally qualified by its database.
    pub fn new(db: Option<&str>, name: &str) -> Self {
        TableName {
            db: db.map(str::to_string),
            name: name.to_string(),
        }
    }

    /// Parses `table` or `db.table` (identifiers only: letters, digits, `_`, `$`).
    pub fn parse(s: &str) -> Result<TableName, String> {
        let parts: Vec<&str> = s.split('.').collect();
        let (db, name) = match parts.as_slice() {
            [name] => (None, *name),
            [db, name] => (Some(*db), *name),
            _ => {
                return Err(format!(
                    "`{s}` is not a table name (expected `table` or `db.table`)"
                ))
            }
        };
        for p in db.iter().chain(std::iter::once(&name)) {
            check_ident(p)?;
        }
        Ok(TableName {
            db: db.map(str::to_string),
            name: name.to_string(),
        })
    }

    /// Backquoted SQL form: `` `db`.`t` `` or `` `t` ``.
    pub fn quoted(&self) -> String {
        match &self.db {
            Some(db) => format!("{}.{}", quote(db), quote(&self.name)),
            None => quote(&self.name),
        }
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.db {
            Some(db) => write!(f, "{db}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// Backquotes an identifier.
pub fn quote(ident: &str) -> String {
    format!("`{}`", ident.replace('`', "``"))
}

/// Accepts the identifiers rules may use: non-empty, at most 64 characters, letters,
/// digits, `_` and `$`.
pub fn check_ident(s: &str) -> Result<(), String> {
    if s.is_empty()
        || s.len() > 64
        || !s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
    {
        return Err(format!(
            "`{s}` is not a valid identifier (letters, digits, `_` and `$`, at most 64 characters)"
        ));
    }
    Ok(())
}

/// Whether a rule rewrites or only reports what it would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Rewrite and reject as the rule says.
    #[default]
    On,
    /// Pass statements through unchanged; count and log what would have happened.
    Shadow,
}

/// Default of every kind's `coalesce` key: group commit on (it is what makes the
/// write rules pay off under contention).
pub fn default_coalesce() -> bool {
    true
}

/// Default of the `slot_column` keys.
pub fn default_slot_column() -> String {
    "slot".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        let t = TableName::parse("shop.hits").unwrap();
        assert_eq!(t.db.as_deref(), Some("shop"));
        assert_eq!(t.quoted(), "`shop`.`hits`");
        assert!(TableName::parse("").is_err());
    }
}
