//! The plan cache: what was decided for a statement shape, reusable for every
//! statement of that shape.
//!
//! Keys are byte strings: a header (key kind, protocol, current database) followed by
//! the fingerprint, the fingerprint plus the values of the literals a rule read, or
//! the exact statement text. Values are [`Cached`] outcomes; a rewrite is stored as a
//! [`Template`] that is rendered with the literal bytes of each new statement.

use std::io::Write as _;
use std::sync::Arc;

use moka::sync::Cache;

use super::sqltok::{self, LexMode, Slot, Token, TokenKind};
use super::{Dynamic, Refusal, Rejection, Rewritten};

/// One piece of a rewritten statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// Text printed by the parser from the rule's output.
    Text(Box<[u8]>),
    /// The bytes of the original statement's literal #i, copied verbatim.
    Literal(usize),
    /// A `?` taking the value of the original statement's parameter #j.
    Param(usize),
    /// A value the proxy chooses when rendering.
    Dynamic(Dynamic),
}

/// The template of a [`crate::rewrite::Prelude`].
#[derive(Clone, Debug)]
pub struct PreludeTemplate {
    /// The query.
    pub query: Vec<Segment>,
    /// How its row becomes literals.
    pub values: Arc<dyn crate::rewrite::PreludeValues>,
    /// The statements.
    pub statements: Vec<Vec<Segment>>,
    /// Forward the original statement when the row declines the literals.
    pub original_on_decline: bool,
}

impl PartialEq for PreludeTemplate {
    fn eq(&self, other: &Self) -> bool {
        self.query == other.query
            && *self.values == *other.values
            && self.statements == other.statements
            && self.original_on_decline == other.original_on_decline
    }
}

impl Eq for PreludeTemplate {}

/// A rewrite with holes for the values of the statement being executed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    /// The segments of each rewritten statement, in order.
    pub statements: Vec<Vec<Segment>>,
    /// Auxiliary texts rendered alongside (see [`crate::rewrite::Plan::aux`]).
    pub aux: Vec<Vec<Segment>>,
    /// How the reply is built (copied into every rendering).
    pub reply: crate::rewrite::Reply,
    /// The statements commit together.
    pub atomic: bool,
    /// Concurrent executions may be merged (see [`crate::rewrite::Plan::merge`]).
    pub merge: Option<std::sync::Arc<dyn crate::rewrite::Merger>>,
    /// Checks of each execute's parameters (see [`crate::rewrite::Plan::param_checks`]).
    pub param_checks: Vec<(usize, crate::rewrite::ParamCheck)>,
    /// The two-step form (see [`crate::rewrite::Prelude`]): the query, its values,
    /// then the statements with holes for them.
    pub prelude: Option<Box<PreludeTemplate>>,
    /// The reply's flags follow the server's plan (see [`crate::rewrite::Plan::plan_flags`]).
    pub plan_flags: Option<std::sync::Arc<dyn crate::rewrite::PlanFlags>>,
    /// Runs as sent when it fails (see [`crate::rewrite::Plan::as_sent_on_error`]).
    pub as_sent_on_error: Option<&'static str>,
}

impl Template {
    /// Split the parser's printed output on the markers. Marker `?k` stands for
    /// `slots[k - 1]` when `k <= slots.len()`, else for
    /// `dynamics[k - slots.len() - 1]`.
    pub fn build(
        printed: &[String],
        slots: &[Slot],
        dynamics: &[Dynamic],
    ) -> Result<Template, Refusal> {
        let mut statements = Vec::with_capacity(printed.len());
        for text in printed {
            let bytes = text.as_bytes();
            let toks = sqltok::lex_markers(bytes).map_err(|e| {
                Refusal::internal(format!("the rewritten statement cannot be read back ({e})"))
            })?;
            let mut segs = Vec::new();
            let mut at = 0;
            for t in &toks {
                let seg =
                    match t.kind {
                        TokenKind::Marker(k) => {
                            let k = k as usize;
                            if k == 0 {
                                return Err(Refusal::internal(
                                    "the rewritten statement holds an unknown marker",
                                ));
                            }
                            match slots.get(k - 1) {
                                Some(Slot::Literal(i)) => Segment::Literal(*i),
                                Some(Slot::Param(j)) => Segment::Param(*j),
                                None => match dynamics.get(k - 1 - slots.len()) {
                                    Some(d) => Segment::Dynamic(*d),
                                    None => {
                                        return Err(Refusal::internal(
                                            "the rewritten statement holds an unknown marker",
                                        ))
                                    }
                                },
                            }
                        }
                        TokenKind::Param => return Err(Refusal::internal(
                            "the rewrite adds a `?` parameter the original statement does not have",
                        )),
                        _ => continue,
                    };
                if t.start > at {
                    segs.push(Segment::Text(bytes[at..t.start].into()));
                }
                segs.push(seg);
                at = t.end;
            }
            if at < bytes.len() {
                segs.push(Segment::Text(bytes[at..].into()));
            }
            statements.push(segs);
        }
        Ok(Template {
            statements,
            aux: Vec::new(),
            reply: crate::rewrite::Reply::Last,
            atomic: false,
            merge: None,
            param_checks: Vec::new(),
            prelude: None,
            plan_flags: None,
            as_sent_on_error: None,
        })
    }

    /// The statements for one execution: literal bytes from `sql` (whose literal
    /// tokens are `literals`, in order), parameters as `?` (with their original
    /// indices in the returned map when `prepared`), dynamic values chosen now.
    pub fn render(
        &self,
        rule: &Arc<str>,
        sql: &[u8],
        literals: &[Token],
        prepared: bool,
        share: Option<crate::rewrite::NodeShare>,
    ) -> Result<Rewritten, Refusal> {
        let mut params = Vec::new();
        let mut statements = Vec::with_capacity(self.statements.len());
        for segs in &self.statements {
            let mut holes = Vec::new();
            statements.push(render_segments(
                segs, sql, literals, &mut holes, None, share,
            )?);
            params.extend(holes.into_iter().map(|(_, j)| j));
        }
        let mut aux = Vec::with_capacity(self.aux.len());
        let mut aux_holes = Vec::new();
        for segs in &self.aux {
            let mut holes = Vec::new();
            aux.push(render_segments(
                segs, sql, literals, &mut holes, None, share,
            )?);
            if prepared {
                aux_holes.push(holes);
            }
        }
        // A prepared statement's values arrive with each execute: it keeps the
        // one-step form.
        let prelude = match self.prelude.as_deref() {
            Some(PreludeTemplate {
                query,
                values,
                statements: then,
                original_on_decline,
            }) if !prepared => {
                let mut holes = Vec::new();
                let query = render_segments(query, sql, literals, &mut holes, None, share)?;
                let mut statements = Vec::with_capacity(then.len());
                for segs in then {
                    let mut computed = Vec::new();
                    let text = render_segments(
                        segs,
                        sql,
                        literals,
                        &mut holes,
                        Some(&mut computed),
                        share,
                    )?;
                    statements.push((text, computed));
                }
                if !holes.is_empty() {
                    return Err(Refusal::internal("the rewrite's prelude holds a parameter"));
                }
                Some(Arc::new(crate::rewrite::RenderedPrelude {
                    query,
                    values: values.clone(),
                    statements,
                    original: original_on_decline.then(|| sql.to_vec()),
                }))
            }
            _ => None,
        };
        Ok(Rewritten {
            rule: rule.clone(),
            statements,
            param_map: prepared.then_some(params),
            reply: self.reply.clone(),
            atomic: self.atomic,
            aux,
            aux_holes,
            merge: self.merge.clone(),
            param_checks: if prepared {
                self.param_checks.clone()
            } else {
                Vec::new()
            },
            prelude,
            as_sent_on_error: self.as_sent_on_error,
            probe: self
                .plan_flags
                .as_ref()
                .map(|f| Arc::new(crate::rewrite::Probe::of(sql, f.clone()))),
        })
    }
}

/// Renders one templated text: literal bytes from `sql`, parameters as `?` (each one's
/// byte offset in the text and original index appended to `holes`), dynamic values
/// chosen now, and holes for a prelude's values (byte offset and value index
/// appended to `computed`, which only a prelude's statements have).
fn render_segments(
    segs: &[Segment],
    sql: &[u8],
    literals: &[Token],
    holes: &mut Vec<(usize, usize)>,
    mut computed: Option<&mut Vec<(usize, u16)>>,
    share: Option<crate::rewrite::NodeShare>,
) -> Result<Vec<u8>, Refusal> {
    let mut out = Vec::with_capacity(sql.len() + 64);
    for seg in segs {
        match seg {
            Segment::Text(t) => out.extend_from_slice(t),
            Segment::Literal(i) => {
                let t = literals.get(*i).ok_or_else(|| {
                    Refusal::internal("the statement has fewer literals than its plan")
                })?;
                out.extend_from_slice(&sql[t.start..t.end]);
            }
            Segment::Param(j) => {
                holes.push((out.len(), *j));
                out.push(b'?');
            }
            Segment::Dynamic(Dynamic::RandomBelow(n)) => {
                let v = crate::rewrite::NodeShare::pick_below(share, *n);
                let _ = write!(out, "{v}");
            }
            Segment::Dynamic(Dynamic::Computed(i)) => match computed.as_deref_mut() {
                Some(c) => c.push((out.len(), *i)),
                None => {
                    return Err(Refusal::internal(
                        "a prelude value outside the prelude's statements",
                    ))
                }
            },
        }
    }
    Ok(out)
}

/// A decision as kept in the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cached {
    /// Forward the statement untouched.
    Passthrough,
    /// Refuse it.
    Reject(Rejection),
    /// Forward it untouched, counted as this rule's fallback.
    Fallback(crate::rewrite::Fallback),
    /// Render this template.
    Rewrite {
        /// The rule that produced it.
        rule: Arc<str>,
        /// The rewrite with holes for the statement's values.
        template: Template,
    },
    /// Under a fingerprint key: the plan depends on the values of these literals
    /// (ascending indices); look up the key that adds their bytes.
    DependsOn(Box<[usize]>),
    /// Under a fingerprint key: literals of this shape cannot be marked; look up the
    /// exact statement text.
    ExactText,
}

/// Which kind of key a buffer holds (its first byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum KeyKind {
    /// Header + fingerprint.
    Fingerprint = b'F',
    /// Header + fingerprint + values of the literals a plan depends on.
    Depends = b'D',
    /// Header + exact statement bytes.
    Exact = b'T',
}

/// Start a key: kind, protocol, lexer mode and current database, unambiguously encoded.
pub fn key_header(
    out: &mut Vec<u8>,
    kind: KeyKind,
    prepared: bool,
    mode: LexMode,
    db: Option<&str>,
) {
    out.push(kind as u8);
    out.push(u8::from(prepared));
    // A plan made under one reading of quotes and backslashes never serves another.
    out.push(mode.bits());
    match db {
        None => out.push(0),
        Some(db) => {
            out.push(1);
            out.extend_from_slice(&(db.len() as u32).to_le_bytes());
            out.extend_from_slice(db.as_bytes());
        }
    }
}

/// Turn a fingerprint key into the key of its value-dependent entry: the fingerprint
/// key, then each listed literal's index and bytes, all length-prefixed.
pub fn depends_key(
    fp_key: &[u8],
    sql: &[u8],
    literals: &[Token],
    tokens: &[Token],
    deps: &[usize],
) -> Vec<u8> {
    let mut key = Vec::with_capacity(fp_key.len() + 40);
    key.push(KeyKind::Depends as u8);
    key.extend_from_slice(&(fp_key.len() as u32).to_le_bytes());
    key.extend_from_slice(fp_key);
    for &i in deps {
        if i == super::SPELLING {
            // The select list as spelt (see `PlanContext::spelt_item`).
            key.extend_from_slice(&u32::MAX.to_le_bytes());
            match sqltok::select_list(sql, tokens) {
                Some(items) => {
                    for r in items {
                        key.extend_from_slice(&(r.len() as u32).to_le_bytes());
                        key.extend_from_slice(&sql[r]);
                    }
                }
                None => key.extend_from_slice(&u32::MAX.to_le_bytes()),
            }
            continue;
        }
        key.extend_from_slice(&(i as u32).to_le_bytes());
        match literals.get(i) {
            Some(t) => {
                let v = &sql[t.start..t.end];
                key.extend_from_slice(&(v.len() as u32).to_le_bytes());
                key.extend_from_slice(v);
            }
            None => key.extend_from_slice(&u32::MAX.to_le_bytes()),
        }
    }
    key
}

/// A bounded, concurrent map from key to cached outcome.
pub struct PlanCache {
    /// `None` when the capacity is zero: nothing is cached.
    inner: Option<Cache<Vec<u8>, Arc<Cached>>>,
}

impl std::fmt::Debug for PlanCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanCache")
            .field("entries", &self.inner.as_ref().map(|c| c.entry_count()))
            .finish()
    }
}

/// Keys longer than this (statements of this size or more) are not cached: planning
/// them again costs less than letting a few huge statements crowd out the others.
pub const MAX_KEY: usize = 64 * 1024;

impl Cached {
    /// Approximate heap bytes held by the outcome.
    fn size(&self) -> usize {
        match self {
            Cached::Rewrite { template, .. } => template
                .statements
                .iter()
                .chain(
                    template
                        .prelude
                        .iter()
                        .flat_map(|p| std::iter::once(&p.query).chain(&p.statements)),
                )
                .flatten()
                .map(|s| match s {
                    Segment::Text(t) => t.len() + 16,
                    _ => 16,
                })
                .sum(),
            Cached::Reject(r) => r.reason.len(),
            Cached::DependsOn(d) => d.len() * 8,
            Cached::Passthrough | Cached::ExactText | Cached::Fallback(_) => 0,
        }
    }
}

impl PlanCache {
    /// A cache of at most `capacity` weight units (least recently and least
    /// frequently used entries are evicted first). An entry weighs one unit per
    /// started KiB of key and outcome, so a typical plan weighs 1 and the capacity is
    /// roughly a number of plans.
    pub fn new(capacity: u64) -> Self {
        PlanCache {
            inner: (capacity > 0).then(|| {
                Cache::builder()
                    .max_capacity(capacity)
                    .weigher(|k: &Vec<u8>, v: &Arc<Cached>| {
                        u32::try_from(1 + (k.len() + v.size()) / 1024).unwrap_or(u32::MAX)
                    })
                    .build()
            }),
        }
    }

    /// The cached outcome for `key`.
    pub fn get(&self, key: &[u8]) -> Option<Arc<Cached>> {
        self.inner.as_ref()?.get(key)
    }

    /// Remember an outcome (unless the key is longer than [`MAX_KEY`]).
    pub fn insert(&self, key: Vec<u8>, value: Arc<Cached>) {
        if let Some(c) = &self.inner {
            if key.len() <= MAX_KEY {
                c.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_splits_on_markers_only() {
        let slots = [Slot::Literal(0), Slot::Param(0), Slot::Literal(1)];
        let dyns = [Dynamic::RandomBelow(1)];
        let printed =
            vec!["UPDATE t SET a = ?1, s = '?2', `?3` = ?3 + ?4 WHERE id = ?2".to_string()];
        let t = Template::build(&printed, &slots, &dyns).unwrap();
        assert_eq!(
            t.statements[0],
            vec![
                Segment::Text((*b"UPDATE t SET a = ").into()),
                Segment::Literal(0),
                Segment::Text((*b", s = '?2', `?3` = ").into()),
                Segment::Literal(1),
                Segment::Text((*b" + ").into()),
                Segment::Dynamic(Dynamic::RandomBelow(1)),
                Segment::Text((*b" WHERE id = ").into()),
                Segment::Param(0),
            ]
        );
        let sql = b"x 'it''s' 7 \xe9";
        let lits = sqltok::lex(sql, LexMode::default()).unwrap();
        let lits: Vec<Token> = lits
            .into_iter()
            .filter(|t| matches!(t.kind, TokenKind::Literal(_)))
            .collect();
        let r = t.render(&Arc::from("r"), sql, &lits, true, None).unwrap();
        assert_eq!(
            r.statements,
            vec![b"UPDATE t SET a = 'it''s', s = '?2', `?3` = 7 + 0 WHERE id = ?".to_vec()]
        );
        assert_eq!(r.param_map, Some(vec![0]));
        let r = t.render(&Arc::from("r"), sql, &lits, false, None).unwrap();
        assert_eq!(r.param_map, None);
        // Unknown markers and bare parameters are refused.
        assert!(Template::build(&["SELECT ?9".into()], &slots, &dyns).is_err());
        assert!(Template::build(&["SELECT ?".into()], &slots, &dyns).is_err());
    }

    #[test]
    fn keys_are_unambiguous() {
        let mut a = Vec::new();
        key_header(
            &mut a,
            KeyKind::Fingerprint,
            false,
            LexMode::default(),
            Some("ab"),
        );
        a.extend_from_slice(b"c");
        let mut b = Vec::new();
        key_header(
            &mut b,
            KeyKind::Fingerprint,
            false,
            LexMode::default(),
            Some("a"),
        );
        b.extend_from_slice(b"bc");
        assert_ne!(a, b);
        let mut c = Vec::new();
        key_header(
            &mut c,
            KeyKind::Fingerprint,
            true,
            LexMode::default(),
            Some("ab"),
        );
        c.extend_from_slice(b"c");
        assert_ne!(a, c);
        let mut d = Vec::new();
        key_header(
            &mut d,
            KeyKind::Fingerprint,
            false,
            LexMode::default(),
            None,
        );
        d.extend_from_slice(b"c");
        assert_ne!(a, d);
        let nbe = LexMode {
            no_backslash_escapes: true,
            ansi_quotes: false,
        };
        let mut e = Vec::new();
        key_header(&mut e, KeyKind::Fingerprint, false, nbe, Some("ab"));
        e.extend_from_slice(b"c");
        assert_ne!(a, e);
    }
}
