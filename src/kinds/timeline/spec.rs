//! The `[[timeline]]` rule-file section and its validation.
//!
//! ```toml
//! [[timeline]]
//! name = "friends"
//! messages = "message"
//! message_author = "user_id"
//! follows = "follower"
//! follow_reader = "user_id"
//! follow_author = "follower_id"
//! mode = "pull"               # "pull", "push" or "hybrid"
//! mailbox = "mailbox"          # push and hybrid: per-reader message ids
//! fanout_limit = 1000          # hybrid: authors with more followers are not fanned out
//! mailbox_size = 1000          # push and hybrid: entries kept per reader
//! ```

use serde::Deserialize;

use crate::rules::spec::{check_ident, TableName};

/// How a timeline is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Serve {
    /// Merged at read time from each followee's newest messages.
    Pull,
    /// Fanned out at write time into a per-reader mailbox.
    Push,
    /// Push below `fanout_limit` followers, pull above.
    Hybrid,
}

/// `[[timeline]]`: friends timelines (messages of the authors a reader follows,
/// newest first) served without reading every followee's every message.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TimelineSpec {
    /// Unique rule name (metrics, logs, errors).
    pub name: String,
    /// The message table (`table` or `db.table`); its AUTO_INCREMENT id orders it.
    pub messages: String,
    /// The message table's author column.
    pub message_author: String,
    /// The follow table (`table` or `db.table`).
    pub follows: String,
    /// The follow table's reading-user column.
    pub follow_reader: String,
    /// The follow table's followed-author column.
    pub follow_author: String,
    /// `pull`, `push` or `hybrid`.
    pub mode: Serve,
    /// Per-reader message ids (push and hybrid).
    #[serde(default)]
    pub mailbox: Option<String>,
    /// Hybrid: authors with more followers are merged at read time.
    #[serde(default = "default_fanout_limit")]
    pub fanout_limit: u32,
    /// Push and hybrid: mailbox entries kept per reader (a follow copies this many
    /// of the author's newest messages; `heatsink maintain` trims to it).
    #[serde(default = "default_mailbox_size")]
    pub mailbox_size: u32,
    /// Shadow mode (`mode` names the serving strategy here): statements pass
    /// through, would-be rewrites are counted.
    #[serde(default)]
    pub shadow: bool,
}

fn default_fanout_limit() -> u32 {
    1000
}

fn default_mailbox_size() -> u32 {
    1000
}

/// Largest `fanout_limit` and `mailbox_size`.
const MAX_LIMIT: u32 = 1_000_000;

impl TimelineSpec {
    /// Everything that can be checked without a database.
    pub fn validate(&self) -> Result<(), String> {
        check_ident(&self.name).map_err(|e| format!("name: {e}"))?;
        let messages = TableName::parse(&self.messages).map_err(|e| format!("messages: {e}"))?;
        let follows = TableName::parse(&self.follows).map_err(|e| format!("follows: {e}"))?;
        if messages.name.eq_ignore_ascii_case(&follows.name) && messages.db == follows.db {
            return Err("messages and follows must be different tables".into());
        }
        for (key, col) in [
            ("message_author", &self.message_author),
            ("follow_reader", &self.follow_reader),
            ("follow_author", &self.follow_author),
        ] {
            check_ident(col).map_err(|e| format!("{key}: {e}"))?;
        }
        if self.follow_reader.eq_ignore_ascii_case(&self.follow_author) {
            return Err("follow_reader and follow_author must be different columns".into());
        }
        for (key, v) in [
            ("fanout_limit", self.fanout_limit),
            ("mailbox_size", self.mailbox_size),
        ] {
            if v == 0 || v > MAX_LIMIT {
                return Err(format!("{key} must be between 1 and {MAX_LIMIT}"));
            }
        }
        match (&self.mode, &self.mailbox) {
            (Serve::Pull, None) => Ok(()),
            (Serve::Pull, Some(_)) => {
                Err("mailbox is only for mode = \"push\" or \"hybrid\"".into())
            }
            (_, None) => Err(format!(
                "mode = \"{}\" needs a mailbox table (mailbox = \"…\")",
                self.mode.name()
            )),
            (_, Some(m)) => {
                let mailbox = TableName::parse(m).map_err(|e| format!("mailbox: {e}"))?;
                for (key, t) in [("messages", &messages), ("follows", &follows)] {
                    if mailbox.name.eq_ignore_ascii_case(&t.name) && mailbox.db == t.db {
                        return Err(format!("mailbox must be another table than {key}"));
                    }
                }
                Ok(())
            }
        }
    }

    /// The mailbox table (push and hybrid).
    pub fn mailbox_table(&self) -> Option<TableName> {
        self.mailbox
            .as_deref()
            .and_then(|m| TableName::parse(m).ok())
    }
}

impl Serve {
    /// As the rule file writes it.
    pub fn name(self) -> &'static str {
        match self {
            Serve::Pull => "pull",
            Serve::Push => "push",
            Serve::Hybrid => "hybrid",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: &str) -> Result<TimelineSpec, String> {
        let text = format!(
            "[[timeline]]\nname = \"friends\"\nmessages = \"message\"\nmessage_author = \"user_id\"\n\
             follows = \"follower\"\nfollow_reader = \"user_id\"\nfollow_author = \"follower_id\"\n{extra}"
        );
        let specs: Vec<TimelineSpec> =
            crate::kinds::entries(&text, "timeline").map_err(|e| e.to_string())?;
        let s = specs.into_iter().next().ok_or("no entry")?;
        s.validate()?;
        Ok(s)
    }

    #[test]
    fn modes_and_their_mailbox() {
        assert_eq!(spec("mode = \"pull\"").unwrap().mode, Serve::Pull);
        for mode in ["push", "hybrid"] {
            let s = spec(&format!("mode = \"{mode}\"\nmailbox = \"mailbox\"")).unwrap();
            assert_eq!(s.mode.name(), mode);
            assert_eq!(s.mailbox_table().unwrap().name, "mailbox");
            assert_eq!((s.fanout_limit, s.mailbox_size), (1000, 1000));
            let e = spec(&format!("mode = \"{mode}\"")).unwrap_err();
            assert!(e.contains("needs a mailbox"), "{e}");
            let e = spec(&format!("mode = \"{mode}\"\nmailbox = \"follower\"")).unwrap_err();
            assert!(e.contains("another table"), "{e}");
        }
        assert!(spec("mode = \"pull\"\nmailbox = \"m\"").is_err());
        assert!(spec("mode = \"hybrid\"\nmailbox = \"m\"\nfanout_limit = 0").is_err());
        assert!(spec("mode = \"push\"\nmailbox = \"m\"\nmailbox_size = 0").is_err());
        assert!(spec("").is_err(), "mode is required");
        assert!(spec("mode = \"pull\"\nfollow_author = \"user_id\"").is_err());
    }
}
