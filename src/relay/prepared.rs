//! Prepared statements whose text was rewritten: what the session keeps of each
//! (the backend statements, parameter order, the types the client bound, the
//! checks every execute must pass, the pieces a merge rebuilds), and the reading of
//! a COM_STMT_EXECUTE — its parameters sliced by type and re-ordered for the
//! backend statements without decoding a value.

use std::sync::Arc;

use crate::rewrite::Reply;
use crate::wire::cmd;
use crate::wire::packets::{self, err_of, errors};
use crate::wire::resultset::binary_value_len;

/// A prepared statement whose text was rewritten.
#[derive(Debug)]
pub struct PreparedRewrite {
    /// The rule that rewrote it.
    pub rule: Arc<str>,
    /// The backend statements, in order: id, and for each of its `?` the client's
    /// parameter index. The client uses the first one's id.
    pub stmts: Vec<(u32, Vec<usize>)>,
    /// The statements commit together (see [`Rewritten::atomic`]).
    pub atomic: bool,
    /// Parameters the client's statement has.
    pub client_params: usize,
    /// Parameter types the client bound last (two bytes each); later executes may
    /// omit them.
    pub types: Option<Vec<u8>>,
    /// How replies are shaped.
    pub reply: Reply,
    /// COM_STMT_SEND_LONG_DATA chunks the client sent since the last execute or
    /// COM_STMT_RESET, in order: (parameter, bytes). The next execute runs the
    /// client's own statement with them (see [`PreparedRewrite::original`]), or
    /// fails with a clear error when the rule cannot allow that.
    pub long_data: LongData,
    /// The client's statement text, when its rule lets it run as sent
    /// ([`crate::rewrite::Rule::runs_unread`]): an execute with long data runs it as
    /// the server's own prepared statement.
    pub original: Option<Vec<u8>>,
    /// The client's statement text and how it was read (`None`: a character set
    /// the lexer cannot read), for `SHOW REFUSALS` / `SHOW FALLBACKS` when an
    /// execute is refused or falls back.
    pub text: Arc<[u8]>,
    /// See [`PreparedRewrite::text`].
    pub mode: Option<crate::rewrite::LexMode>,
    /// Checks of each execute's parameter values (see [`Rewritten::param_checks`]).
    pub checks: Vec<(usize, crate::rewrite::ParamCheck)>,
    /// A rewrite with a merger: the plan's pieces, with holes for the parameters
    /// (see [`Rewritten::aux_holes`]), from which an execute becomes a text
    /// statement when it merges or needs `RETURNING`.
    pub merge: Option<PreparedMerge>,
    /// The reply's column flags follow the server's plan of the client's statement
    /// (see [`crate::rewrite::Plan::plan_flags`]).
    pub probe: Option<PreparedProbe>,
    /// Runs as sent when it fails (see [`crate::rewrite::Plan::as_sent_on_error`]).
    pub as_sent_on_error: Option<&'static str>,
}

/// The plan probe of a prepared rewrite: `EXPLAIN FORMAT=JSON` of the client's
/// statement, prepared on the server, executed with each execute's parameters in
/// the same round trip as the rewrite.
#[derive(Debug)]
pub struct PreparedProbe {
    /// The backend statement; `None` when it did not prepare (every execute then
    /// runs the client's statement as sent).
    pub id: Option<u32>,
    /// The reply's patch for a plan.
    pub flags: Arc<dyn crate::rewrite::PlanFlags>,
}

/// Long data of a prepared rewrite, buffered until its execute (the command has no
/// response, so nothing can be refused when it arrives).
#[derive(Debug, Default)]
pub struct LongData {
    /// (parameter, bytes) of each COM_STMT_SEND_LONG_DATA, in order.
    pub chunks: Vec<(u16, Vec<u8>)>,
    /// Bytes buffered in all.
    pub bytes: usize,
    /// More than [`LONG_DATA_LIMIT`] bytes were sent: the chunks were dropped and
    /// the execute fails.
    pub overflow: bool,
}

/// Why an execute with long data ran the client's own statement (`SHOW FALLBACKS`).
pub(super) const LONG_DATA_FALLBACK: &str =
    "parameter values sent as COM_STMT_SEND_LONG_DATA run the client's statement as sent";

/// A prepared statement a rule in shadow mode would have rewritten: what its
/// executes are checked against, so that `SHOW REFUSALS` / `SHOW FALLBACKS` list
/// the executes the rule would refuse or let through unchanged.
#[derive(Debug)]
pub struct ShadowPrepared {
    /// The rule.
    pub rule: Arc<str>,
    /// Checks of each execute's parameter values (the plan's).
    pub checks: Vec<(usize, crate::rewrite::ParamCheck)>,
    /// The rule lets its statements run as sent: a declining check falls back.
    pub runs_unread: bool,
    /// Parameters the statement has.
    pub params: usize,
    /// Parameter types the client bound last.
    pub types: Option<Vec<u8>>,
    /// The client's statement text.
    pub text: Arc<[u8]>,
    /// How it was read (see [`PreparedRewrite::mode`]).
    pub mode: Option<crate::rewrite::LexMode>,
}

/// The most long data buffered for one prepared rewrite between two executes.
pub const LONG_DATA_LIMIT: usize = 64 << 20;

impl LongData {
    /// Buffers the payload of a COM_STMT_SEND_LONG_DATA (command byte, statement id,
    /// parameter, data); a payload too short to name a parameter is ignored, as
    /// the server ignores it.
    pub fn add(&mut self, payload: &[u8]) {
        let (Some(param), Some(data)) = (payload.get(5..7), payload.get(7..)) else {
            return;
        };
        if self.overflow {
            return;
        }
        self.bytes += data.len();
        if self.bytes > LONG_DATA_LIMIT {
            self.chunks = Vec::new();
            self.overflow = true;
            return;
        }
        self.chunks
            .push((u16::from_le_bytes([param[0], param[1]]), data.to_vec()));
    }

    /// Whether anything was sent since the last execute or reset.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty() && !self.overflow
    }
}

/// The client's COM_STMT_EXECUTE for the server's own statement `id` of the client's
/// text: the statement id replaced, cursor flags cleared (the client fetches from
/// its own statement id, not this one), and the parameter types put in when the
/// execute relies on types bound earlier (the new statement has none). Records the
/// types when the execute binds them. Values are not read: parameters sent as long
/// data have none in the packet.
pub(super) fn original_execute(payload: &[u8], id: u32, p: &mut PreparedRewrite) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 2 * p.client_params + 8);
    out.push(cmd::STMT_EXECUTE);
    out.extend_from_slice(&id.to_le_bytes());
    let Some(flags_iter) = payload.get(5..10) else {
        // Malformed: the server answers it.
        out.extend_from_slice(payload.get(5..).unwrap_or_default());
        return out;
    };
    out.push(flags_iter[0] & !CURSOR_TYPE_MASK);
    out.extend_from_slice(&flags_iter[1..]);
    let n = p.client_params;
    let bitmap_end = 10 + n.div_ceil(8);
    match (n, payload.get(bitmap_end)) {
        (1.., Some(&1)) => {
            if let Some(t) = payload.get(bitmap_end + 1..bitmap_end + 1 + 2 * n) {
                p.types = Some(t.to_vec());
            }
            out.extend_from_slice(&payload[10..]);
        }
        (1.., Some(&0)) if p.types.is_some() => {
            out.extend_from_slice(&payload[10..bitmap_end]);
            out.push(1);
            out.extend_from_slice(p.types.as_deref().unwrap_or_default());
            out.extend_from_slice(&payload[bitmap_end + 1..]);
        }
        _ => out.extend_from_slice(&payload[10..]),
    }
    out
}

/// The merge pieces of a prepared rewrite.
#[derive(Debug, Clone)]
pub struct PreparedMerge {
    /// The kind's merger (it may only serve `RETURNING`: see
    /// [`crate::rewrite::Merger::returning_alone`]).
    pub merger: std::sync::Arc<dyn crate::rewrite::Merger>,
    /// `aux` of the rewrite, `?` where parameters go.
    pub aux: Vec<Vec<u8>>,
    /// Per `aux` text: (byte offset of a `?`, client parameter index).
    pub holes: Vec<Vec<(usize, usize)>>,
}

/// An execute's parameter value that fails its statement's checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ParamViolation {
    /// Why, for the client's error message (may name the value).
    pub message: String,
    /// Why, without the value ([`crate::rewrite::ParamCheck::violation_reason`]):
    /// the reason `SHOW REFUSALS` / `SHOW FALLBACKS` group and show.
    pub reason: String,
    /// The failing check declines ([`crate::rewrite::ParamCheck::declines`]: the
    /// execute then runs the client's own statement).
    pub declines: bool,
}

/// Why an execute's parameter values fail the rewrite's checks, if they do. A
/// malformed execute passes here and is refused where it is sliced.
pub(super) fn param_violation(
    payload: &[u8],
    p: &mut PreparedRewrite,
    charset: Option<crate::rewrite::Charset>,
) -> Option<ParamViolation> {
    check_params(payload, p.client_params, &mut p.types, &p.checks, charset)
}

/// [`param_violation`] for a statement of `n` parameters whose types were last
/// bound as `types` (updated when the execute binds new ones).
pub(super) fn check_params(
    payload: &[u8],
    n: usize,
    types: &mut Option<Vec<u8>>,
    checks: &[(usize, crate::rewrite::ParamCheck)],
    charset: Option<crate::rewrite::Charset>,
) -> Option<ParamViolation> {
    if checks.is_empty() {
        return None;
    }
    let values = execute_values(payload, n, types).ok()?;
    let types = types.as_deref()?;
    checks.iter().find_map(|&(j, check)| {
        let ty = [*types.get(2 * j)?, *types.get(2 * j + 1)?];
        let value = *values.get(j)?;
        let message = check.violation(ty, value, charset)?;
        Some(ParamViolation {
            message,
            reason: check.violation_reason(ty, value, charset)?,
            declines: check.declines(),
        })
    })
}

/// COM_STMT_EXECUTE flag bits asking for a cursor: READ_ONLY, FOR_UPDATE, SCROLLABLE.
const CURSOR_TYPE_MASK: u8 = 0x07;

/// Rebuilds the client's COM_STMT_EXECUTE payload for each backend statement:
/// parameter values are sliced by type (never decoded) and re-ordered per each
/// statement's parameter map.
pub(super) fn remap_execute(
    payload: &[u8],
    p: &mut PreparedRewrite,
) -> std::result::Result<Vec<Vec<u8>>, ExecuteError> {
    // Flags (1 byte) and iteration count (4 bytes) after the statement id.
    let flags_iter = payload.get(5..10).ok_or(ExecuteError::Malformed)?;
    let values = execute_params(payload, p)?;
    let mut out = Vec::with_capacity(p.stmts.len());
    for (id, map) in &p.stmts {
        let mut cmd = Vec::with_capacity(payload.len() + 16);
        cmd.push(cmd::STMT_EXECUTE);
        cmd.extend_from_slice(&id.to_le_bytes());
        // No server-side cursor: the proxy reshapes the whole result as it streams
        // by, and a cursor would leave the rows on the server until COM_STMT_FETCH.
        // Without CURSOR_EXISTS in the final status, clients read the rows at once
        // (as they do for any statement the server opens no cursor for).
        cmd.push(flags_iter[0] & !CURSOR_TYPE_MASK);
        cmd.extend_from_slice(&flags_iter[1..]);
        let m = map.len();
        if m > 0 {
            let types = p.types.as_deref().ok_or(ExecuteError::WrongArguments)?;
            let mut bitmap = vec![0u8; m.div_ceil(8)];
            for (k, &j) in map.iter().enumerate() {
                let v = values
                    .get(j)
                    .ok_or(ExecuteError::Internal("parameter map out of range"))?;
                if v.is_none() {
                    bitmap[k / 8] |= 1 << (k % 8);
                }
            }
            cmd.extend_from_slice(&bitmap);
            cmd.push(1);
            for &j in map {
                cmd.extend_from_slice(&types[2 * j..2 * j + 2]);
            }
            for &j in map {
                if let Some(Some(v)) = values.get(j) {
                    cmd.extend_from_slice(v);
                }
            }
        }
        out.push(cmd);
    }
    Ok(out)
}

/// Why the parameters of a COM_STMT_EXECUTE could not be sliced, answered the way
/// MariaDB 10.11 answers the same bytes (`tests/limits.rs` compares them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ExecuteError {
    /// Shorter than statement id, flags and iteration count, or fewer parameter
    /// types than parameters: ER_MALFORMED_PACKET (1835, HY000).
    Malformed,
    /// No NULL bitmap or new-params-bound flag, types never bound, or a parameter
    /// value missing: ER_WRONG_ARGUMENTS (1210, HY000).
    WrongArguments,
    /// A value whose declared length runs past the end of the packet. MariaDB
    /// executes with the value cut to the bytes present; a rewrite cannot promise
    /// that meaning, so it is refused (1105) and nothing runs.
    CutShort,
    /// The proxy's own bookkeeping failed (1105).
    Internal(&'static str),
}

impl ExecuteError {
    /// The ERR payload for the client of a statement rewritten by `rule`.
    pub(super) fn packet(self, rule: &str) -> Vec<u8> {
        match self {
            ExecuteError::Malformed => {
                packets::err_payload(1835, b"HY000", "Malformed communication packet")
            }
            ExecuteError::WrongArguments => packets::err_payload(
                1210,
                b"HY000",
                "Incorrect arguments to mysqld_stmt_execute",
            ),
            ExecuteError::CutShort => err_of(
                errors::UNKNOWN,
                &format!(
                    "heatsink rule '{rule}': a parameter value is longer than the rest of the COM_STMT_EXECUTE packet"
                ),
            ),
            ExecuteError::Internal(why) => {
                err_of(errors::UNKNOWN, &format!("heatsink rule '{rule}': {why}"))
            }
        }
    }
}

/// The client's parameter values of a COM_STMT_EXECUTE (`None`: NULL), sliced by
/// type, never decoded; remembers the types when the execute binds them.
pub(super) fn execute_params<'a>(
    payload: &'a [u8],
    p: &mut PreparedRewrite,
) -> std::result::Result<Vec<Option<&'a [u8]>>, ExecuteError> {
    execute_values(payload, p.client_params, &mut p.types)
}

/// [`execute_params`] for a statement of `n` parameters whose types were last
/// bound as `bound_types`.
fn execute_values<'a>(
    payload: &'a [u8],
    n: usize,
    bound_types: &mut Option<Vec<u8>>,
) -> std::result::Result<Vec<Option<&'a [u8]>>, ExecuteError> {
    payload.get(5..10).ok_or(ExecuteError::Malformed)?;
    let mut values: Vec<Option<&[u8]>> = Vec::with_capacity(n);
    if n > 0 {
        let bitmap_len = n.div_ceil(8);
        let bitmap = payload
            .get(10..10 + bitmap_len)
            .ok_or(ExecuteError::WrongArguments)?;
        let bound = *payload
            .get(10 + bitmap_len)
            .ok_or(ExecuteError::WrongArguments)?;
        let mut rest = &payload[11 + bitmap_len..];
        if bound == 1 {
            let t = rest.get(..2 * n).ok_or(ExecuteError::Malformed)?;
            *bound_types = Some(t.to_vec());
            rest = &rest[2 * n..];
        }
        let types = bound_types.as_deref().ok_or(ExecuteError::WrongArguments)?;
        for j in 0..n {
            if bitmap[j / 8] & (1 << (j % 8)) != 0 {
                values.push(None);
                continue;
            }
            let t = *types.get(2 * j).ok_or(ExecuteError::WrongArguments)?;
            let Some(len) = binary_value_len(t, rest) else {
                return Err(if rest.is_empty() || fixed_size(t) {
                    ExecuteError::WrongArguments
                } else {
                    ExecuteError::CutShort
                });
            };
            values.push(Some(&rest[..len]));
            rest = &rest[len..];
        }
    }
    Ok(values)
}

/// Binary-protocol types whose values have a fixed size (no length prefix).
fn fixed_size(column_type: u8) -> bool {
    use crate::wire::resultset::types::*;
    matches!(
        column_type,
        TINY | SHORT | YEAR | LONG | INT24 | FLOAT | LONGLONG | DOUBLE | NULL
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(param_map: Vec<usize>, client_params: usize) -> PreparedRewrite {
        PreparedRewrite {
            rule: Arc::from("r"),
            stmts: vec![(7, param_map)],
            client_params,
            types: None,
            reply: Reply::Last,
            atomic: false,
            long_data: LongData::default(),
            original: None,
            text: Arc::from(&b"SELECT 1"[..]),
            mode: None,
            checks: Vec::new(),
            merge: None,
            probe: None,
            as_sent_on_error: None,
        }
    }

    #[test]
    fn execute_params_are_reordered_without_decoding() {
        // Client: (inc BIGINT 5, slug VARCHAR 'home'); backend wants (slug, inc).
        let mut p = prepared(vec![1, 0], 2);
        let mut pl = vec![cmd::STMT_EXECUTE, 7, 0, 0, 0, 0, 1, 0, 0, 0];
        pl.push(0); // null bitmap
        pl.push(1); // bound
        pl.extend_from_slice(&[0x08, 0, 0xfd, 0]);
        pl.extend_from_slice(&5i64.to_le_bytes());
        pl.extend_from_slice(b"\x04home");
        let out = remap_execute(&pl, &mut p).unwrap().remove(0);
        let mut want = vec![cmd::STMT_EXECUTE, 7, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1];
        want.extend_from_slice(&[0xfd, 0, 0x08, 0]);
        want.extend_from_slice(b"\x04home");
        want.extend_from_slice(&5i64.to_le_bytes());
        assert_eq!(out, want);
        // A later execute without types reuses the remembered ones; NULLs move too.
        let mut pl2 = vec![cmd::STMT_EXECUTE, 7, 0, 0, 0, 0, 1, 0, 0, 0];
        pl2.push(0b01);
        pl2.push(0);
        pl2.extend_from_slice(b"\x05about");
        let out2 = remap_execute(&pl2, &mut p).unwrap().remove(0);
        let mut want2 = vec![cmd::STMT_EXECUTE, 7, 0, 0, 0, 0, 1, 0, 0, 0, 0b10, 1];
        want2.extend_from_slice(&[0xfd, 0, 0x08, 0]);
        want2.extend_from_slice(b"\x05about");
        assert_eq!(out2, want2);
    }

    #[test]
    fn cursor_flags_are_cleared() {
        let mut p = prepared(vec![], 0);
        for flags in [0x01u8, 0x02, 0x04, 0x07] {
            let pl = vec![cmd::STMT_EXECUTE, 7, 0, 0, 0, flags, 1, 0, 0, 0];
            let out = remap_execute(&pl, &mut p).unwrap().remove(0);
            assert_eq!(out, vec![cmd::STMT_EXECUTE, 7, 0, 0, 0, 0, 1, 0, 0, 0]);
        }
    }

    #[test]
    fn malformed_executes_are_refused() {
        let mut p = prepared(vec![0], 1);
        assert!(remap_execute(&[cmd::STMT_EXECUTE, 1], &mut p).is_err());
        let pl = vec![cmd::STMT_EXECUTE, 7, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0];
        assert_eq!(
            remap_execute(&pl, &mut p).unwrap_err(),
            ExecuteError::WrongArguments
        );
        let pl = vec![
            cmd::STMT_EXECUTE,
            7,
            0,
            0,
            0,
            0,
            1,
            0,
            0,
            0,
            0,
            1,
            0x08,
            0,
            1,
            2,
        ];
        assert_eq!(
            remap_execute(&pl, &mut p).unwrap_err(),
            ExecuteError::WrongArguments
        );
        assert_eq!(
            remap_execute(&[cmd::STMT_EXECUTE, 7, 0, 0, 0], &mut p).unwrap_err(),
            ExecuteError::Malformed
        );
        // Fewer types than parameters.
        let mut p2 = prepared(vec![0, 1], 2);
        let head = [cmd::STMT_EXECUTE, 7, 0, 0, 0, 0, 1, 0, 0, 0];
        let short_types = [&head[..], &[0, 1, 0x08, 0]].concat();
        assert_eq!(
            remap_execute(&short_types, &mut p2).unwrap_err(),
            ExecuteError::Malformed
        );
        // The second value missing, or its declared length past the end.
        let one = [&head[..], &[0, 1, 0x08, 0, 0xfd, 0], &5i64.to_le_bytes()].concat();
        assert_eq!(
            remap_execute(&one, &mut p2).unwrap_err(),
            ExecuteError::WrongArguments
        );
        let cut = [&one[..], b"\x05ho"].concat();
        assert_eq!(
            remap_execute(&cut, &mut p2).unwrap_err(),
            ExecuteError::CutShort
        );
        assert!(String::from_utf8_lossy(&ExecuteError::CutShort.packet("r"))
            .contains("heatsink rule 'r'"));
    }
}
