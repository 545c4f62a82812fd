//! Running rewritten statements on the client's own backend connection, and shaping
//! the reply the original statement would have produced.
//!
//! - Several statements that must commit together run inside BEGIN … COMMIT when the
//!   client is in autocommit mode outside a transaction; inside the client's
//!   transaction they simply run (ROLLBACK undoes them with the rest).
//! - Deadlocks and lock-wait timeouts inside a rewrite the client did not wrap in a
//!   transaction are retried by the proxy, not surfaced.
//! - Prepared statements: the original is prepared once to learn its parameter count
//!   and column definitions (what the client must see), then the rewrite is prepared
//!   in its place; executes are re-mapped parameter by parameter, without decoding
//!   values.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;

use super::prepared::{
    original_execute, param_violation, remap_execute, LongData, PreparedMerge, PreparedProbe,
    PreparedRewrite, LONG_DATA_FALLBACK, LONG_DATA_LIMIT,
};
use super::response::{ResponseKind, ResponseParser};
use super::session::{Diagnostics, Session};
use crate::error::{Error, Result, Source};
use crate::rewrite::{
    Affected, ColumnPatch, Decision, Engine, PlanFlags, RenderedPrelude, Reply, Rewritten,
    PLAN_UNTOLD, PRELUDE_DECLINED,
};
use crate::wire::io::{frame_into, Logical, Packet};
use crate::wire::packets::{self, err_of, errors, lenenc_int, OkSummary, Renames};
use crate::wire::resultset::{text_cells, text_row, ColumnDef, RowRecode, UNSIGNED_FLAG};
use crate::wire::{cmd, status, MAX_PAYLOAD};

/// MySQL errors a retry of the whole rewrite resolves: ER_LOCK_DEADLOCK and
/// ER_LOCK_WAIT_TIMEOUT.
pub(super) const RETRYABLE: [u16; 2] = [1213, 1205];
/// Attempts of a rewrite before a lock conflict reaches the client.
pub(super) const MAX_ATTEMPTS: u32 = 8;
/// The same on a Galera node, where a hot row written through several nodes fails
/// certification far more often than a lock wait fails on one server (a failed
/// certification committed nothing, so retrying is always safe where a retry is).
pub(super) const MAX_ATTEMPTS_GALERA: u32 = 40;

/// One statement's response, read whole.
pub(super) struct Collected {
    pub(super) parser: ResponseParser,
    pub(super) packets: Vec<Packet>,
}

impl Collected {
    pub(super) fn err(&self) -> Option<&Packet> {
        self.packets
            .iter()
            .find(|p| p.payload.first() == Some(&packets::ERR))
            .filter(|_| self.parser.errored)
    }

    pub(super) fn err_code(&self) -> Option<u16> {
        let p = self.err()?;
        let b = p.payload.get(1..3)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }

    pub(super) fn ok(&self) -> Option<OkSummary> {
        let p = self.packets.first()?;
        (p.payload.first() == Some(&packets::OK))
            .then(|| packets::parse_ok(&p.payload))
            .flatten()
    }

    fn info(&self) -> Option<Vec<u8>> {
        packets::ok_info(&self.packets.first()?.payload)
    }

    /// The only row of a text result set that ended without warnings (its packet's
    /// index), and each column's type; `None` for anything else.
    fn quiet_row(&self, deprecate_eof: bool, extended: bool) -> Option<(usize, Vec<u8>)> {
        if self.parser.errored {
            return None;
        }
        let types: Vec<u8> = column_defs(&self.packets, extended)
            .iter()
            .map(|d| d.column_type)
            .collect();
        let rows = self.text_rows(deprecate_eof);
        if rows.len() != 1 || types.is_empty() {
            return None;
        }
        let warnings = packets::end_of_rows_warnings(&self.packets.last()?.payload, deprecate_eof)?;
        (warnings == 0).then_some((rows.start, types))
    }

    /// Which packets of a result set are rows: those after the column count, the
    /// definitions and (without DEPRECATE_EOF) an EOF, before the last packet. Empty
    /// for an OK or ERR response.
    pub(super) fn text_rows(&self, deprecate_eof: bool) -> std::ops::Range<usize> {
        let columns = self
            .packets
            .first()
            .filter(|p| !matches!(p.payload.first(), Some(&packets::OK) | Some(&packets::ERR)))
            .and_then(|p| packets::lenenc_int(&p.payload))
            .map_or(0, |(n, _)| n as usize);
        if columns == 0 {
            return 0..0;
        }
        let end = self.packets.len().saturating_sub(1);
        (1 + columns + usize::from(!deprecate_eof)).min(end)..end
    }
}

/// What one attempt of a rewrite ended with.
enum Attempt {
    /// The client has its answer.
    Answered,
    /// A lock conflict rolled the attempt back; this is the error, should retrying
    /// not be possible.
    Conflict(Vec<u8>),
    /// The attempt was undone without answering the client: the statement must run
    /// as sent (the server's answer to the rewrite's probes did not show it exact).
    Declined(&'static str),
}

/// How [`Session::run_commands`] runs a rewrite's commands.
#[derive(Clone, Copy)]
pub(super) struct Run {
    /// They must commit together (see [`Rewritten::atomic`]).
    pub atomic: bool,
    /// See [`Rewritten::as_sent_on_error`].
    pub as_sent_on_error: Option<&'static str>,
}

/// Whether the error in `payload` undid only the statement that raised it, and
/// says something about the values it wrote: a data exception (SQLSTATE class 22:
/// out of range, too long, an incorrect value), an integrity constraint (class 23:
/// a duplicate key, a foreign key, a CHECK, a NULL), a trigger's `SIGNAL` (class
/// 45), or a column without a default (1364). Other errors (a lock conflict, an
/// interruption, a lost connection, a missing grant) may have ended more than the
/// statement, or are the statement's own as much as the rewrite's.
pub(super) fn undone_alone(payload: &[u8]) -> bool {
    const NO_DEFAULT_FOR_FIELD: u16 = 1364;
    let class = match payload.get(3..6) {
        Some([b'#', a, b]) => [*a, *b],
        _ => return false,
    };
    matches!(&class, b"22" | b"23" | b"45") || err_code(payload) == Some(NO_DEFAULT_FOR_FIELD)
}

/// How [`Session::run_commands`] ended.
pub(super) enum Ran {
    /// The client has its answer.
    Answered,
    /// Nothing was kept and the client has no answer yet: the caller runs the
    /// client's own statement, counted as the rule's fallback for this reason.
    Declined(&'static str),
}

/// Waits before retry `attempt + 1` of a write that hit a lock conflict: a random
/// 1..2^(attempt+1) ms, so that the writers that collided do not collide again.
/// From the 8th retry on, the wait stays below 512 ms.
pub(super) async fn backoff(attempt: u32) {
    tokio::time::sleep(Duration::from_millis(rand::random_range(
        1..=(2u64 << attempt.min(8)),
    )))
    .await;
}

/// A text-protocol row with `names` applied to every value; `None` when nothing
/// matched or the row does not parse.
fn renamed_text_row(row: &[u8], names: &Renames) -> Option<Vec<u8>> {
    let cells = text_cells(row)?;
    let renamed: Vec<Option<Vec<u8>>> = cells
        .iter()
        .map(|c| c.and_then(|v| packets::renamed(v, names)))
        .collect();
    if renamed.iter().all(Option::is_none) {
        return None;
    }
    let cells: Vec<Option<&[u8]>> = cells
        .iter()
        .zip(&renamed)
        .map(|(c, r)| r.as_deref().or(*c))
        .collect();
    Some(text_row(&cells))
}

/// What the probes of an `INSERT … ON DUPLICATE KEY UPDATE` rewrite found so far
/// (see [`Affected::InsertedOrUpdated`]).
#[derive(Debug, PartialEq, Eq)]
enum Probed {
    /// The statement's row was inserted without a warning: the key probe is skipped.
    Inserted,
    /// The row was skipped by one duplicate-key warning with this message: the key
    /// probe must be skipped by the same.
    Duplicate(Vec<u8>),
    /// Anything else: the statement runs as sent.
    Declined,
}

/// The row probe and the key probe of an upsert's reply (see
/// [`Affected::InsertedOrUpdated`]), if it has them.
fn upsert_probes(reply: &Reply) -> Option<(usize, Option<usize>)> {
    match reply {
        Reply::Ok {
            affected_rows: Affected::InsertedOrUpdated { probe, key_probe },
            ..
        } => Some((*probe, *key_probe)),
        _ => None,
    }
}

/// MariaDB's ER_DUP_ENTRY.
const DUP_ENTRY: &[u8] = b"1062";

/// The (code, message) of each row of a `SHOW WARNINGS` answer, when it lists
/// exactly `count` warnings (`max_error_count` may keep fewer) and parses.
fn warning_rows(c: &Collected, count: u16, deprecate_eof: bool) -> Option<Vec<(&[u8], &[u8])>> {
    if c.parser.errored {
        return None;
    }
    let rows = c.text_rows(deprecate_eof);
    if rows.len() != usize::from(count) {
        return None;
    }
    c.packets
        .get(rows)?
        .iter()
        .map(|p| match text_cells(&p.payload)?[..] {
            [_, Some(code), Some(message)] => Some((code, message)),
            _ => None,
        })
        .collect()
}

/// The statement's row probe (`INSERT IGNORE` of the row) and its `SHOW WARNINGS`.
fn row_probed(probe: &Collected, warnings: &Collected, deprecate_eof: bool) -> Probed {
    let Some(o) = probe.ok() else {
        return Probed::Declined;
    };
    match (o.affected_rows, o.warnings) {
        (1, 0) => Probed::Inserted,
        (0, 1) => match warning_rows(warnings, 1, deprecate_eof).as_deref() {
            Some([(DUP_ENTRY, message)]) => Probed::Duplicate(message.to_vec()),
            _ => Probed::Declined,
        },
        _ => Probed::Declined,
    }
}

/// Whether the key probe (`INSERT IGNORE` of the key alone) was skipped by the
/// duplicate-key warning the row probe had (`message`): the row with the statement's
/// key exists, and the row probe collided with it. Other warnings of the key probe
/// (columns without a default) do not matter: it wrote nothing.
fn key_probed(
    probe: &Collected,
    warnings: &Collected,
    message: &[u8],
    deprecate_eof: bool,
) -> bool {
    probe.ok().is_some_and(|o| {
        o.affected_rows == 0
            && warning_rows(warnings, o.warnings, deprecate_eof).is_some_and(|rows| {
                rows.iter()
                    .any(|&(code, m)| code == DUP_ENTRY && m == message)
            })
    })
}

/// The error code of an ERR packet's payload.
fn err_code(payload: &[u8]) -> Option<u16> {
    payload.get(1..3).map(|b| u16::from_le_bytes([b[0], b[1]]))
}

/// A COM_QUERY payload.
fn query_payload(sql: &[u8]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(sql.len() + 1);
    payload.push(cmd::QUERY);
    payload.extend_from_slice(sql);
    payload
}

/// The document of an `EXPLAIN FORMAT=JSON` answer: its one row's one cell, of a
/// result that ended without warnings; `binary`: rows of the binary protocol (a
/// header byte and a NULL bitmap before the cell).
fn explain_document(c: &Collected, binary: bool, deprecate_eof: bool) -> Option<&[u8]> {
    if c.parser.errored {
        return None;
    }
    let first = c.packets.first()?;
    if lenenc_int(&first.payload)? != (1, 1) {
        return None;
    }
    let rows = c.text_rows(deprecate_eof);
    if rows.len() != 1 {
        return None;
    }
    let warnings = packets::end_of_rows_warnings(&c.packets.last()?.payload, deprecate_eof)?;
    if warnings != 0 {
        return None;
    }
    let row = &c.packets.get(rows.start)?.payload;
    let cell = match binary {
        // Header 0x00, then the NULL bitmap of one column (offset 2: bit 2).
        true => match row.get(..2)? {
            [0x00, bitmap] if bitmap & 0x04 == 0 => row.get(2..)?,
            _ => return None,
        },
        false => row.as_ref(),
    };
    let (len, used) = lenenc_int(cell)?;
    let end = used.checked_add(usize::try_from(len).ok()?)?;
    (end == cell.len()).then(|| cell.get(used..end)).flatten()
}

/// The column definitions in a collected result-set response.
fn column_defs(pkts: &[Packet], extended: bool) -> Vec<ColumnDef> {
    let Some(first) = pkts.first() else {
        return Vec::new();
    };
    let n = match lenenc_int(&first.payload) {
        Some((n, _)) if first.payload.first() != Some(&packets::OK) => n as usize,
        _ => return Vec::new(),
    };
    pkts.iter()
        .skip(1)
        .take(n)
        .filter_map(|p| ColumnDef::parse(&p.payload, extended))
        .collect()
}

impl Session {
    /// Decides what to do with a statement, answering rules' metadata questions on
    /// the way. `None`: the client has been answered already (the metadata query
    /// failed and its error is the statement's error).
    pub(super) async fn decide(
        &mut self,
        engine: &Engine,
        sql: &[u8],
        prepared: bool,
        cmd_seq: u8,
    ) -> Result<Option<Decision>> {
        for _ in 0..4 {
            let d = engine.decide(sql, &self.context(prepared));
            if d == Decision::NeedSessionState {
                if !self.learn_lexing(cmd_seq).await? {
                    return Ok(None);
                }
                continue;
            }
            let Decision::NeedMetadata(req) = d else {
                return Ok(Some(d));
            };
            let c = self.run_collect(req.sql.as_bytes()).await?;
            if let Some(e) = c.err() {
                let payload = e.payload.to_vec();
                self.reply(cmd_seq, &payload).await?;
                return Ok(None);
            }
            engine.provide_server_metadata(
                req.rule,
                req.db.as_deref(),
                &column_defs(&c.packets, self.link.extended_metadata),
            );
        }
        let msg = "heatsink: a rule could not learn the table's columns";
        self.reply(cmd_seq, &err_of(errors::UNKNOWN, msg)).await?;
        Ok(None)
    }

    /// Learns the session's character set and `sql_mode` flags on its own backend
    /// connection (`rewrite::SESSION_STATE_QUERY`). `false`: the client has been
    /// answered with the error instead.
    async fn learn_lexing(&mut self, cmd_seq: u8) -> Result<bool> {
        // The node's place in a cluster is asked for once per node and
        // `backends::CLUSTER_INFO_TTL`, not per session (the status lookup costs
        // ≈ 0.4 ms); with it known, the settings alone.
        let known = self.lease.cluster_info();
        let query = match known {
            Some(_) => crate::rewrite::SESSION_STATE_QUERY_PLAIN,
            None => crate::rewrite::SESSION_STATE_QUERY,
        };
        let mut c = self.run_collect(query.as_bytes()).await?;
        if known.is_none()
            && c.err_code()
                .is_some_and(|code| code == 1109 || code == 1146)
        {
            // A server without information_schema.GLOBAL_STATUS (MySQL 8): no
            // cluster, the settings alone.
            c = self
                .run_collect(crate::rewrite::SESSION_STATE_QUERY_PLAIN.as_bytes())
                .await?;
        }
        if let Some(e) = c.err() {
            let payload = e.payload.to_vec();
            self.reply(cmd_seq, &payload).await?;
            return Ok(false);
        }
        let rows = c.text_rows(self.link.deprecate_eof);
        let cells = c
            .packets
            .get(rows.start)
            .filter(|_| rows.len() == 1)
            .and_then(|p| crate::wire::resultset::text_cells(&p.payload));
        let learned = cells.as_ref().and_then(|cells| match cells[..] {
            [Some(charset), mode, ..] => Some(crate::rewrite::Lexing::from_server(
                charset,
                mode.unwrap_or_default(),
            )),
            _ => None,
        });
        let info = match known {
            Some(info) => info,
            None => {
                let cell = cells
                    .as_ref()
                    .and_then(|cells| cells.get(2).copied().flatten());
                let info = crate::rewrite::ClusterInfo::from_server(cell);
                if learned.is_some() {
                    self.lease.set_cluster_info(info);
                }
                info
            }
        };
        self.state.galera = info.galera;
        self.state.node_share = info.share;
        match learned {
            Some(l) => {
                self.state.lexing = Some(l);
                Ok(true)
            }
            None => {
                let msg = "heatsink: could not learn the session's character set and sql_mode";
                self.reply(cmd_seq, &err_of(errors::UNKNOWN, msg)).await?;
                Ok(false)
            }
        }
    }

    /// Sends one packet to the client as the answer to the command with `cmd_seq`.
    pub(super) async fn reply(&mut self, cmd_seq: u8, payload: &[u8]) -> Result<()> {
        match payload.first() {
            Some(&packets::ERR) => self.outcome.err = err_code(payload),
            Some(&packets::OK) => {
                self.outcome.err = None;
                self.outcome.affected += packets::parse_ok(payload).map_or(0, |o| o.affected_rows);
            }
            _ => {}
        }
        let renamed = self.renamed_err(payload);
        self.link
            .client
            .write_packet(
                cmd_seq.wrapping_add(1),
                renamed.as_deref().unwrap_or(payload),
            )
            .await?;
        Ok(())
    }

    /// An ERR of a rewritten statement as it would have named the logical table.
    fn renamed_err(&self, payload: &[u8]) -> Option<Vec<u8>> {
        packets::renamed_err(payload, self.rewrite_names.as_deref()?)
    }

    /// Relays the response to SHOW WARNINGS / SHOW ERRORS (`d`) after a rewritten
    /// statement: the backend's rows, or `own` instead (the rows of an insert
    /// answered from a merged write, with `d`'s level and LIMIT applied), with the
    /// rules' physical table names replaced by the logical ones. The backend's own
    /// answer supplies the column definitions and the end of the result, in this
    /// client's format.
    pub(super) async fn relay_diagnostics(
        &mut self,
        c: &Logical,
        d: Diagnostics,
        own: Option<&[Vec<u8>]>,
    ) -> Result<()> {
        let collected = self.run_command(&c.payload()).await?;
        let packets = &collected.packets;
        let rows = collected.text_rows(self.link.deprecate_eof);
        let names = self.rewrite_names.clone();
        let rename = |row: &[u8]| names.as_deref().and_then(|n| renamed_text_row(row, n));
        // Own rows go where the backend's rows were: before the last packet.
        let own: Option<Vec<&[u8]>> = own.filter(|_| rows.end > 0).map(|own| {
            own.iter()
                .map(Vec::as_slice)
                .filter(|r| {
                    !d.errors_only
                        || text_cells(r).is_some_and(|c| c.first() == Some(&Some(&b"Error"[..])))
                })
                .skip(d.offset)
                .take(d.limit.unwrap_or(usize::MAX))
                .collect()
        });
        let mut out = BytesMut::new();
        let mut seq = c.last_seq.wrapping_add(1);
        for (i, p) in packets.iter().enumerate() {
            if let Some(own) = &own {
                if i == rows.end {
                    for r in own {
                        let renamed = rename(r);
                        seq = frame_into(&mut out, seq, renamed.as_deref().unwrap_or(r));
                    }
                }
                if rows.contains(&i) {
                    continue;
                }
            }
            let renamed = if rows.contains(&i) {
                rename(&p.payload)
            } else {
                names
                    .as_deref()
                    .and_then(|n| packets::renamed_err(&p.payload, n))
            };
            seq = frame_into(&mut out, seq, renamed.as_deref().unwrap_or(&p.payload));
        }
        if let Some(st) = packets
            .last()
            .and_then(|p| packets::terminator_status(&p.payload, self.link.deprecate_eof))
        {
            self.state.set_status(st);
        }
        self.link.client.write_all(&out).await
    }

    /// Sends one command (a COM_QUERY or COM_STMT_EXECUTE payload) to the backend
    /// and reads its whole response.
    async fn run_command(&mut self, payload: &[u8]) -> Result<Collected> {
        self.link.backend.write_packet(0, payload).await?;
        let (parser, packets) = self.collect_response(ResponseKind::Generic).await?;
        Ok(Collected { parser, packets })
    }

    /// Sends one command and `SHOW WARNINGS` behind it in the same round trip, and
    /// reads both responses (the second lists the first's warnings).
    async fn run_with_warnings(&mut self, payload: &[u8]) -> Result<(Collected, Collected)> {
        self.link.backend.write_packet(0, payload).await?;
        self.link
            .backend
            .write_packet(0, &query_payload(b"SHOW WARNINGS"))
            .await?;
        let (parser, packets) = self.collect_response(ResponseKind::Generic).await?;
        let answered_error = self.answered_error;
        let (wp, wpackets) = self.collect_response(ResponseKind::Generic).await?;
        self.answered_error = answered_error;
        Ok((
            Collected { parser, packets },
            Collected {
                parser: wp,
                packets: wpackets,
            },
        ))
    }

    /// Runs one text statement on the backend and reads its whole response.
    pub(super) async fn run_collect(&mut self, sql: &[u8]) -> Result<Collected> {
        self.run_command(&query_payload(sql)).await
    }

    /// Attempts of a statement the proxy runs on its own before a lock conflict or
    /// certification failure reaches the client.
    pub(super) fn max_attempts(&self) -> u32 {
        if self.state.galera {
            MAX_ATTEMPTS_GALERA
        } else {
            MAX_ATTEMPTS
        }
    }

    /// Whether a failed attempt left nothing behind, so that it can be retried.
    pub(super) fn retry_safe(&self, statements: usize, wrapped: bool) -> bool {
        self.state.status & status::IN_TRANS == 0 && (wrapped || statements == 1)
    }

    /// Executes a rewritten text statement and answers the client: merged with
    /// concurrent executions when the rewrite allows it (see `relay::merge`), else
    /// on its own.
    pub(super) async fn run_rewrite(&mut self, rw: Rewritten, cmd_seq: u8) -> Result<()> {
        if let Some((key, part)) = self.merge_part(&rw) {
            if self.merge_table_free(&rw).await? {
                return self.run_merged(key, part, &rw, cmd_seq).await;
            }
        }
        self.run_alone(&rw, cmd_seq).await
    }

    /// Executes a rewritten text statement on this connection only.
    pub(super) async fn run_alone(&mut self, rw: &Rewritten, cmd_seq: u8) -> Result<()> {
        self.restore_insert_id().await?;
        if let Some(column) = self.returning_column(rw) {
            return self.run_returning(rw, &column, cmd_seq).await;
        }
        // The server's plan of the client's statement, asked in the prelude's round
        // trip (before its query) when there is one.
        let probed = match &rw.probe {
            Some(probe) => {
                self.link
                    .backend
                    .write_packet(0, &query_payload(&probe.explain))
                    .await?;
                if let Some(p) = &rw.prelude {
                    self.link
                        .backend
                        .write_packet(0, &query_payload(&p.query))
                        .await?;
                }
                Some(self.read_probe(probe.flags.as_ref(), false).await?)
            }
            None => None,
        };
        let with_literals = match &rw.prelude {
            Some(p) => match (self.read_prelude(p, rw.probe.is_some()).await?, &p.original) {
                (None, Some(original)) => {
                    // The one-step form is not exact for these values: the
                    // statement runs as the client sent it.
                    return self.run_original(original, PRELUDE_DECLINED, cmd_seq).await;
                }
                (literal, _) => literal,
            },
            None => None,
        };
        let probed_reply;
        let reply = match (probed, &rw.probe) {
            (Some(Some(patch)), _) => {
                probed_reply = Reply::Patched(patch);
                &probed_reply
            }
            (Some(None), Some(probe)) => {
                // The plan does not tell the column flags: the statement runs as
                // the client sent it.
                return self
                    .run_original(&probe.original, PLAN_UNTOLD, cmd_seq)
                    .await;
            }
            _ => &rw.reply,
        };
        let statements = with_literals.as_deref().unwrap_or(&rw.statements);
        let n = statements.len();
        // A single statement whose response is relayed is streamed; one whose
        // errors may name a physical table (answered with the logical name) and
        // that answers OK or ERR is read whole instead.
        let stream = match &rw.reply {
            Reply::Patched(_) => true,
            Reply::Last => self.rewrite_names.is_none(),
            _ => false,
        };
        if let (1, true, Some(sql)) = (n, stream, statements.first()) {
            let next = self
                .link
                .backend
                .write_packet(0, &query_payload(sql))
                .await?;
            let shift = cmd_seq.wrapping_add(1).wrapping_sub(next);
            return match reply {
                Reply::Patched(p) => self.relay_patched(p, false, cmd_seq).await,
                _ => self
                    .relay_response(ResponseKind::Generic, shift, cmd_seq)
                    .await
                    .map(|_| ()),
            };
        }
        let commands: Vec<Vec<u8>> = statements.iter().map(|sql| query_payload(sql)).collect();
        let how = Run {
            atomic: rw.atomic,
            as_sent_on_error: rw.as_sent_on_error,
        };
        if let Ran::Declined(reason) = self
            .run_commands(&rw.rule, &commands, reply, how, cmd_seq)
            .await?
        {
            // The session runs the client's statement (it holds its text).
            self.declined = Some(reason);
        }
        Ok(())
    }

    /// Forwards the client's own text statement in place of its rewrite, counted
    /// as the rule's fallback for `reason`.
    pub(super) async fn run_original(
        &mut self,
        original: &[u8],
        reason: &'static str,
        cmd_seq: u8,
    ) -> Result<()> {
        self.fell_back = Some(reason);
        let next = self
            .link
            .backend
            .write_packet(0, &query_payload(original))
            .await?;
        let shift = cmd_seq.wrapping_add(1).wrapping_sub(next);
        self.relay_response(ResponseKind::Generic, shift, cmd_seq)
            .await
            .map(|_| ())
    }

    /// Reads the answer to a rewrite's plan probe (already sent) and returns the
    /// reply's patch for the plan it describes, or `None` when it does not tell
    /// (an error, a warning, not one document). `binary`: the answer to an execute.
    /// The probe is the proxy's own question: an error in it is not the client's.
    async fn read_probe(
        &mut self,
        flags: &dyn PlanFlags,
        binary: bool,
    ) -> Result<Option<Arc<ColumnPatch>>> {
        let answered_error = self.answered_error;
        let (parser, packets) = self.collect_response(ResponseKind::Generic).await?;
        self.answered_error = answered_error;
        let c = Collected { parser, packets };
        let document = explain_document(&c, binary, self.link.deprecate_eof);
        let patch = document.and_then(|d| flags.patch(d));
        if patch.is_none() {
            tracing::debug!(
                explain = %String::from_utf8_lossy(document.unwrap_or_default()),
                "the server's plan does not tell the column flags: the statement runs as sent"
            );
        }
        Ok(patch)
    }

    /// Runs a rewrite's prelude query and returns its statements with the computed
    /// values written in, or `None` when the row does not allow them (the one-step
    /// form runs instead). A failing or warning query changed nothing: it is a
    /// `SELECT` of constants. `sent`: the query was written already (pipelined
    /// behind a plan probe).
    async fn read_prelude(
        &mut self,
        p: &RenderedPrelude,
        sent: bool,
    ) -> Result<Option<Vec<Vec<u8>>>> {
        let c = match sent {
            true => {
                let (parser, packets) = self.collect_response(ResponseKind::Generic).await?;
                Collected { parser, packets }
            }
            false => self.run_collect(&p.query).await?,
        };
        let out = c
            .quiet_row(self.link.deprecate_eof, self.link.extended_metadata)
            .and_then(|(at, types)| {
                let cells = text_cells(&c.packets.get(at)?.payload)?;
                (cells.len() == types.len())
                    .then(|| p.statements_for(&cells, &types))
                    .flatten()
            });
        let stats = &self.shared.stats;
        match out {
            Some(_) => stats.prelude_literal.fetch_add(1, Ordering::Relaxed),
            None => stats.prelude_declined.fetch_add(1, Ordering::Relaxed),
        };
        Ok(out)
    }

    /// Runs the commands of a rewrite — inside the proxy's own transaction when they
    /// must commit together and the client is in autocommit mode outside a
    /// transaction — retrying lock conflicts when a failed attempt left nothing
    /// behind, and answers the client as `reply` says, unless the attempt was
    /// declined ([`Ran::Declined`]: the caller answers).
    async fn run_commands(
        &mut self,
        rule: &str,
        commands: &[Vec<u8>],
        reply: &Reply,
        how: Run,
        cmd_seq: u8,
    ) -> Result<Ran> {
        let n = commands.len();
        let wrap = how.atomic
            && n > 1
            && self.state.status & status::IN_TRANS == 0
            && self.state.status & status::AUTOCOMMIT != 0;
        let retry = self.retry_safe(n, wrap);
        let mut attempt = 1;
        loop {
            match self.attempt(commands, reply, wrap, how, cmd_seq).await? {
                Attempt::Answered => return Ok(Ran::Answered),
                Attempt::Declined(reason) => return Ok(Ran::Declined(reason)),
                Attempt::Conflict(err) => {
                    if !retry || attempt >= self.max_attempts() {
                        self.reply(cmd_seq, &err).await?;
                        return Ok(Ran::Answered);
                    }
                    tracing::debug!(rule, attempt, "lock conflict in rewrite: retrying");
                    backoff(attempt).await;
                    attempt += 1;
                }
            }
        }
    }

    /// Undoes what an attempt ran: its own transaction (`wrap`), or back to its
    /// savepoint inside the client's (which fails harmlessly when a deadlock already
    /// rolled back the whole transaction).
    async fn undo_attempt(&mut self, wrap: bool, savepoint: bool) -> Result<()> {
        if wrap {
            self.run_collect(b"ROLLBACK").await?;
        } else if savepoint {
            self.run_collect(b"ROLLBACK TO SAVEPOINT heatsink_rewrite")
                .await?;
        }
        Ok(())
    }

    async fn attempt(
        &mut self,
        commands: &[Vec<u8>],
        reply: &Reply,
        wrap: bool,
        how: Run,
        cmd_seq: u8,
    ) -> Result<Attempt> {
        // Inside the client's transaction (or with autocommit off) a failing
        // statement undoes only itself: a savepoint makes the rewrite's statements
        // fail together, as the one statement they stand for would.
        let savepoint = how.atomic && !wrap && commands.len() > 1;
        let opening: &[u8] = if wrap {
            b"BEGIN"
        } else {
            b"SAVEPOINT heatsink_rewrite"
        };
        if wrap || savepoint {
            let c = self.run_collect(opening).await?;
            if let Some(e) = c.err() {
                let payload = e.payload.to_vec();
                self.reply(cmd_seq, &payload).await?;
                return Ok(Attempt::Answered);
            }
        }
        let probes = upsert_probes(reply);
        let mut probed = None;
        let mut results = Vec::with_capacity(commands.len());
        for (i, command) in commands.iter().enumerate() {
            let is_key_probe = probes.is_some_and(|(_, k)| k == Some(i));
            let is_probe = is_key_probe || probes.is_some_and(|(p, _)| i == p);
            if is_key_probe && probed == Some(Probed::Inserted) {
                // The row is new: nothing to tell apart, nothing run.
                results.push(Collected {
                    parser: ResponseParser::new(ResponseKind::Generic, self.link.deprecate_eof),
                    packets: Vec::new(),
                });
                continue;
            }
            let (c, warnings) = match is_probe {
                true => {
                    let (c, w) = self.run_with_warnings(command).await?;
                    (c, Some(w))
                }
                false => (self.run_command(command).await?, None),
            };
            if let Some(e) = c.err() {
                let payload = e.payload.to_vec();
                self.undo_attempt(wrap, savepoint).await?;
                if c.err_code().is_some_and(|code| RETRYABLE.contains(&code)) {
                    return Ok(Attempt::Conflict(payload));
                }
                if is_probe {
                    // A probe's error need not be the statement's: its IGNORE
                    // changes which check fails first (a NULL key is stored as ''
                    // before a CHECK fails, where the statement fails with 1048).
                    return Ok(Attempt::Declined(crate::rewrite::UPSERT_DECLINED));
                }
                if let Some(reason) = how.as_sent_on_error.filter(|_| undone_alone(&payload)) {
                    // The rewrite did something the statement would not (created a
                    // key's row) and that failed: the statement's own answer is
                    // the server's to give.
                    return Ok(Attempt::Declined(reason));
                }
                self.reply(cmd_seq, &payload).await?;
                return Ok(Attempt::Answered);
            }
            if let Some(w) = &warnings {
                let eof = self.link.deprecate_eof;
                probed = Some(match probed.take() {
                    None => row_probed(&c, w, eof),
                    Some(Probed::Duplicate(m)) if key_probed(&c, w, &m, eof) => {
                        Probed::Duplicate(m)
                    }
                    Some(_) => Probed::Declined,
                });
                if probed == Some(Probed::Declined) {
                    // The statement would have warned, failed or updated another
                    // row where the probes' IGNORE let them through: nothing is
                    // kept, and the statement runs as sent.
                    self.undo_attempt(wrap, savepoint).await?;
                    return Ok(Attempt::Declined(crate::rewrite::UPSERT_DECLINED));
                }
            }
            results.push(c);
        }
        if savepoint {
            self.run_collect(b"RELEASE SAVEPOINT heatsink_rewrite")
                .await?;
        }
        if wrap {
            let c = self.run_collect(b"COMMIT").await?;
            if let Some(e) = c.err() {
                let payload = e.payload.to_vec();
                if c.err_code().is_some_and(|code| RETRYABLE.contains(&code)) {
                    return Ok(Attempt::Conflict(payload));
                }
                self.reply(cmd_seq, &payload).await?;
                return Ok(Attempt::Answered);
            }
        }
        self.answer(reply, &results, cmd_seq).await?;
        Ok(Attempt::Answered)
    }

    /// Builds the client's answer from the collected responses of a rewrite.
    async fn answer(&mut self, reply: &Reply, results: &[Collected], cmd_seq: u8) -> Result<()> {
        // The probes of an upsert warn about the duplicate key (the row probe when
        // the row existed, the key probe always); the original statement would not
        // have.
        let probes = upsert_probes(reply);
        let warnings = results
            .iter()
            .enumerate()
            .filter(|(i, _)| probes.is_none_or(|(p, k)| *i != p && Some(*i) != k))
            .filter_map(|(_, c)| c.ok())
            .map(|o| o.warnings as u32)
            .sum::<u32>()
            .min(u16::MAX as u32) as u16;
        let ok = |affected_rows: u64, last_insert_id: u64| OkSummary {
            affected_rows,
            last_insert_id,
            status: self.state.status,
            warnings,
        };
        let (summary, info) = match reply {
            Reply::OkOf(i) => {
                let Some(c) = results.get(*i) else {
                    return Err(Error::new(
                        Source::Internal,
                        "rewrite reply names a missing statement",
                    ));
                };
                let o = c.ok().unwrap_or_default();
                // The other statements only keep the physical tables in step: their
                // warnings (the same WHERE compared again) are not the client's.
                let summary = OkSummary {
                    warnings: o.warnings,
                    ..ok(o.affected_rows, o.last_insert_id)
                };
                (summary, c.info())
            }
            Reply::Ok {
                affected_rows,
                info,
                last_insert_id,
            } => {
                let affected = match affected_rows {
                    Affected::Fixed(n) => *n,
                    Affected::InsertedOrUpdated { probe, .. } => {
                        match results.get(*probe).and_then(Collected::ok) {
                            Some(o) if o.affected_rows == 1 => 1,
                            _ => 2,
                        }
                    }
                    Affected::WrittenOf { probe, rows } => {
                        let c = results.get(*probe);
                        match c.and_then(Collected::ok) {
                            // One row: 0 skipped, 1 inserted, 2 updated.
                            Some(o) if *rows == 1 => u64::from(o.affected_rows > 0),
                            Some(o) => {
                                let dups = c
                                    .and_then(Collected::info)
                                    .and_then(|i| packets::info_count(&i, b"Duplicates: "))
                                    .unwrap_or(0);
                                o.affected_rows.saturating_sub(dups).min(*rows)
                            }
                            None => *rows,
                        }
                    }
                };
                let id = last_insert_id
                    .and_then(|i| results.get(i))
                    .and_then(Collected::ok)
                    .map_or(0, |o| o.last_insert_id);
                (
                    ok(affected, id),
                    info.as_ref().map(|s| s.as_bytes().to_vec()),
                )
            }
            Reply::Last | Reply::Patched(_) => {
                let Some(last) = results.last() else {
                    return Err(Error::new(Source::Internal, "rewrite has no statement"));
                };
                if let (Some(o), 1) = (last.ok(), last.packets.len()) {
                    (ok(o.affected_rows, o.last_insert_id), last.info())
                } else {
                    // A result set: relay it as it came, renumbered.
                    self.outcome.rows += last.parser.rows;
                    self.outcome.err = None;
                    let mut out = BytesMut::new();
                    let mut seq = cmd_seq.wrapping_add(1);
                    for p in &last.packets {
                        seq = frame_into(&mut out, seq, &p.payload);
                    }
                    return self.link.client.write_all(&out).await;
                }
            }
        };
        let payload = packets::ok_payload(&summary, info.as_deref());
        self.reply(cmd_seq, &payload).await
    }

    /// Relays a result set whose column definitions must be restored to the logical
    /// table's (and, in the binary protocol, whose row values must be re-encoded to
    /// the restored types).
    async fn relay_patched(
        &mut self,
        patch: &ColumnPatch,
        binary: bool,
        cmd_seq: u8,
    ) -> Result<()> {
        let mut out = BytesMut::with_capacity(16 * 1024);
        let mut seq = cmd_seq.wrapping_add(1);
        let first = self.link.backend.read_logical().await?;
        let payload = first.payload();
        let count = match payload.first() {
            Some(&packets::OK) | Some(&packets::ERR) | None => {
                self.answered_error |= payload.first() == Some(&packets::ERR);
                if payload.first() == Some(&packets::ERR) {
                    self.outcome.err = err_code(&payload);
                }
                if let Some(o) = packets::parse_ok(&payload).filter(|_| payload[0] == packets::OK) {
                    self.state.set_status(o.status);
                    self.outcome.affected += o.affected_rows;
                }
                let own = self.client_packet(&payload);
                let renamed = self.renamed_err(&payload);
                frame_into(
                    &mut out,
                    seq,
                    own.as_deref().or(renamed.as_deref()).unwrap_or(&payload),
                );
                return self.link.client.write_all(&out).await;
            }
            Some(_) => match lenenc_int(&payload) {
                Some((n, _)) => n as usize,
                None => return Err(Error::backend("malformed column count")),
            },
        };
        seq = frame_into(&mut out, seq, &payload);
        let mut recode = RowRecode {
            columns: Vec::with_capacity(count),
        };
        let mut defs = Vec::with_capacity(count);
        for _ in 0..count {
            let p = self.link.backend.read_logical().await?;
            let Some(def) = ColumnDef::parse(&p.payload(), self.link.extended_metadata) else {
                return Err(Error::backend("malformed column definition"));
            };
            defs.push(def);
        }
        let temporary = read_through_temporary_table(&defs, patch);
        for mut def in defs {
            let arriving = (def.column_type, def.flags & UNSIGNED_FLAG != 0);
            restore(&mut def, patch, temporary);
            recode.columns.push((
                arriving.0,
                arriving.1,
                def.column_type,
                def.flags & UNSIGNED_FLAG != 0,
            ));
            seq = frame_into(&mut out, seq, &def.serialize());
        }
        if !self.link.deprecate_eof {
            let p = self.link.backend.read_logical().await?;
            seq = frame_into(&mut out, seq, &p.payload());
        }
        let recode = (binary && !recode.is_identity()).then_some(recode);
        loop {
            let p = self.link.backend.read_logical().await?;
            let payload = p.payload();
            let first = payload.first().copied();
            let terminator = self.ends_rows(&payload);
            if terminator || first == Some(packets::ERR) {
                self.answered_error |= !terminator;
                if !terminator {
                    self.outcome.err = err_code(&payload);
                }
                let mut own = None;
                if terminator {
                    if let Some(st) = packets::terminator_status(&payload, self.link.deprecate_eof)
                    {
                        self.state.set_status(st);
                    }
                    own = self.client_packet(&payload);
                }
                let renamed = self.renamed_err(&payload);
                frame_into(
                    &mut out,
                    seq,
                    own.as_deref().or(renamed.as_deref()).unwrap_or(&payload),
                );
                return self.link.client.write_all(&out).await;
            }
            self.outcome.rows += 1;
            match &recode {
                Some(rc) => match rc.apply(&payload) {
                    Some(row) => seq = frame_into(&mut out, seq, &row),
                    None => {
                        // A value does not fit the logical column type: the client
                        // has part of a result; end it with an error.
                        let msg = "heatsink: a rewritten value does not fit the column type";
                        frame_into(&mut out, seq, &err_of(errors::UNKNOWN, msg));
                        self.answered_error = true;
                        self.outcome.err = Some(errors::UNKNOWN.0);
                        self.link.client.write_all(&out).await?;
                        // The backend is still sending this result: read it to its
                        // end so the next command's answer is the next command's.
                        return self.discard_rows().await;
                    }
                },
                None => seq = frame_into(&mut out, seq, &payload),
            }
            if out.len() >= 64 * 1024 {
                self.link.client.write_all(&out).await?;
                out.clear();
            }
        }
    }

    /// Whether a packet read where a row may come is the result set's terminator
    /// (EOF, or the OK that replaces it under CLIENT_DEPRECATE_EOF).
    fn ends_rows(&self, payload: &[u8]) -> bool {
        payload.first() == Some(&packets::EOF)
            && if self.link.deprecate_eof {
                payload.len() < MAX_PAYLOAD
            } else {
                payload.len() < 9
            }
    }

    /// Reads and drops the rest of a result set's rows, up to and including its
    /// terminator (EOF/OK) or ERR, keeping the session's status flags current.
    async fn discard_rows(&mut self) -> Result<()> {
        loop {
            let p = self.link.backend.read_logical().await?;
            let payload = p.payload();
            let first = payload.first().copied();
            let terminator = self.ends_rows(&payload);
            if terminator {
                if let Some(st) = packets::terminator_status(&payload, self.link.deprecate_eof) {
                    self.state.set_status(st);
                }
                self.client_packet(&payload);
                return Ok(());
            }
            if first == Some(packets::ERR) {
                return Ok(());
            }
        }
    }

    /// COM_STMT_PREPARE of a rewritten statement: the original is prepared first
    /// (its parameter count and column definitions are what the client must see) and
    /// closed, then every rewritten statement is prepared; the client's statement id
    /// is the first rewritten statement's.
    pub(super) async fn prepare_rewrite(
        &mut self,
        rw: Rewritten,
        c: &crate::wire::io::Logical,
    ) -> Result<()> {
        let cmd_seq = c.last_seq;
        self.link.backend.write_all(&c.raw).await?;
        let (orig, orig_pkts) = self.collect_response(ResponseKind::Prepare).await?;
        let Some(orig_ok) = orig.prepare_ok else {
            let payload = orig_pkts
                .first()
                .map(|p| p.payload.to_vec())
                .unwrap_or_default();
            return self.reply(cmd_seq, &payload).await;
        };
        self.close_backend_statement(orig_ok.statement_id).await?;

        let param_map = rw.param_map.clone().unwrap_or_default();
        let mut stmts: Vec<(u32, Vec<usize>)> = Vec::with_capacity(rw.statements.len());
        let mut used = 0usize;
        for sql in &rw.statements {
            let mut payload = vec![cmd::STMT_PREPARE];
            payload.extend_from_slice(sql);
            self.link.backend.write_packet(0, &payload).await?;
            let (new, new_pkts) = self.collect_response(ResponseKind::Prepare).await?;
            let Some(new_ok) = new.prepare_ok else {
                for (id, _) in &stmts {
                    self.close_backend_statement(*id).await?;
                }
                let payload = new_pkts
                    .first()
                    .map(|p| p.payload.to_vec())
                    .unwrap_or_default();
                return self.reply(cmd_seq, &payload).await;
            };
            let n = new_ok.params as usize;
            let Some(map) = param_map.get(used..used + n) else {
                return Err(Error::new(
                    Source::Internal,
                    format!(
                        "rule '{}': the rewrite's parameters do not match its plan",
                        rw.rule
                    ),
                ));
            };
            used += n;
            stmts.push((new_ok.statement_id, map.to_vec()));
        }
        let Some(&(client_id, _)) = stmts.first() else {
            return Err(Error::new(Source::Internal, "rewrite has no statement"));
        };
        // The plan probe: `EXPLAIN FORMAT=JSON` of the client's text, with its
        // parameters. One that does not prepare leaves the executes to run the
        // client's statement as sent.
        let probe = match &rw.probe {
            Some(probe) => {
                let mut payload = vec![cmd::STMT_PREPARE];
                payload.extend_from_slice(&probe.explain);
                self.link.backend.write_packet(0, &payload).await?;
                // The proxy's own statement: its error is not the client's.
                let answered_error = self.answered_error;
                let (prep, _) = self.collect_response(ResponseKind::Prepare).await?;
                self.answered_error = answered_error;
                let id = match prep.prepare_ok {
                    Some(ok) if ok.params == orig_ok.params => Some(ok.statement_id),
                    Some(ok) => {
                        self.close_backend_statement(ok.statement_id).await?;
                        None
                    }
                    None => None,
                };
                Some(PreparedProbe {
                    id,
                    flags: probe.flags.clone(),
                })
            }
            None => None,
        };
        // Answer with the client's statement id and everything else from the original.
        let mut out = BytesMut::new();
        let mut first = orig_pkts[0].payload.to_vec();
        first[1..5].copy_from_slice(&client_id.to_le_bytes());
        let mut seq = frame_into(&mut out, cmd_seq.wrapping_add(1), &first);
        for p in &orig_pkts[1..] {
            seq = frame_into(&mut out, seq, &p.payload);
        }
        self.last_prepared = Some(client_id);
        self.prepared.insert(
            client_id,
            PreparedRewrite {
                rule: rw.rule.clone(),
                stmts,
                client_params: orig_ok.params as usize,
                types: None,
                reply: rw.reply.clone(),
                atomic: rw.atomic,
                long_data: LongData::default(),
                original: self
                    .shared
                    .engine
                    .load()
                    .rule_runs_unread(&rw.rule)
                    .then(|| c.payload()[1..].to_vec()),
                text: std::sync::Arc::from(&c.payload()[1..]),
                mode: self.shape_mode(),
                checks: rw.param_checks.clone(),
                merge: rw
                    .merge
                    .clone()
                    .filter(|_| !rw.aux.is_empty() && rw.aux_holes.len() == rw.aux.len())
                    .map(|merger| PreparedMerge {
                        merger,
                        aux: rw.aux.clone(),
                        holes: rw.aux_holes.clone(),
                    }),
                probe,
                as_sent_on_error: rw.as_sent_on_error,
            },
        );
        self.link.client.write_all(&out).await
    }

    /// COM_STMT_EXECUTE of a prepared rewrite with long data, or with a parameter
    /// value a declining check does not take ([`crate::rewrite::ParamCheck::declines`];
    /// `chunks` then empty), whose rule lets its statements run as sent: the client's
    /// own statement is prepared on the server, given the long data as the client
    /// sent it, executed with the client's parameters, and closed. The client sees the server's answer to its own
    /// statement, as without the proxy; counted as the rule's fallback.
    async fn execute_original(
        &mut self,
        id: u32,
        c: &crate::wire::io::Logical,
        chunks: Vec<(u16, Vec<u8>)>,
    ) -> Result<()> {
        let Some(p) = self.prepared.get(&id) else {
            return Err(Error::new(Source::Internal, "prepared rewrite vanished"));
        };
        let Some(sql) = p.original.clone() else {
            return Err(Error::new(
                Source::Internal,
                "prepared rewrite lost its text",
            ));
        };
        self.execute_text(id, c, chunks, sql).await
    }

    /// [`Session::execute_original`] for a rewrite whose attempt was declined
    /// ([`Ran::Declined`]), whatever its rule: the client's statement is what the
    /// server answers exactly.
    pub(super) async fn execute_as_sent(
        &mut self,
        id: u32,
        c: &crate::wire::io::Logical,
    ) -> Result<()> {
        let Some(p) = self.prepared.get(&id) else {
            return Err(Error::new(Source::Internal, "prepared rewrite vanished"));
        };
        let sql = p.text.to_vec();
        self.execute_text(id, c, Vec::new(), sql).await
    }

    /// Prepares `sql` (the client's statement), sends it `chunks` of long data,
    /// executes it with the client's parameters and closes it.
    async fn execute_text(
        &mut self,
        id: u32,
        c: &crate::wire::io::Logical,
        chunks: Vec<(u16, Vec<u8>)>,
        sql: Vec<u8>,
    ) -> Result<()> {
        let cmd_seq = c.last_seq;
        let Some(p) = self.prepared.get(&id) else {
            return Err(Error::new(Source::Internal, "prepared rewrite vanished"));
        };
        let rule = p.rule.clone();
        self.restore_insert_id().await?;
        let mut prepare = Vec::with_capacity(sql.len() + 1);
        prepare.push(cmd::STMT_PREPARE);
        prepare.extend_from_slice(&sql);
        self.link.backend.write_packet(0, &prepare).await?;
        let (prep, pkts) = self.collect_response(ResponseKind::Prepare).await?;
        let Some(ok) = prep.prepare_ok else {
            // The statement no longer prepares (its table changed): the server's
            // own error.
            let payload = pkts.first().map(|p| p.payload.to_vec()).unwrap_or_default();
            return self.reply(cmd_seq, &payload).await;
        };
        for (param, data) in &chunks {
            let mut long = Vec::with_capacity(data.len() + 7);
            long.push(cmd::STMT_SEND_LONG_DATA);
            long.extend_from_slice(&ok.statement_id.to_le_bytes());
            long.extend_from_slice(&param.to_le_bytes());
            long.extend_from_slice(data);
            self.link.backend.write_packet(0, &long).await?;
        }
        let Some(p) = self.prepared.get_mut(&id) else {
            return Err(Error::new(Source::Internal, "prepared rewrite vanished"));
        };
        let execute = original_execute(&c.payload(), ok.statement_id, p);
        let next = self.link.backend.write_packet(0, &execute).await?;
        let shift = cmd_seq.wrapping_add(1).wrapping_sub(next);
        let relayed = self
            .relay_response(ResponseKind::execute(&execute), shift, cmd_seq)
            .await;
        self.close_backend_statement(ok.statement_id).await?;
        relayed?;
        // The rule's fallback, not one of its rewrites.
        self.execute_not_rewritten = true;
        if let Some(stats) = self.shared.rules.load().get(&rule) {
            stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// COM_STMT_CLOSE of a backend statement (no response).
    async fn close_backend_statement(&mut self, id: u32) -> Result<()> {
        let mut close = vec![cmd::STMT_CLOSE];
        close.extend_from_slice(&id.to_le_bytes());
        self.link.backend.write_packet(0, &close).await.map(|_| ())
    }

    /// Closes the backend statements of a rewritten prepared statement; false if `id`
    /// is not one.
    pub(super) async fn close_rewrite(&mut self, id: u32) -> Result<bool> {
        let Some(p) = self.prepared.remove(&id) else {
            return Ok(false);
        };
        for (backend_id, _) in p.stmts {
            self.close_backend_statement(backend_id).await?;
        }
        if let Some(id) = p.probe.and_then(|probe| probe.id) {
            self.close_backend_statement(id).await?;
        }
        Ok(true)
    }

    /// COM_STMT_EXECUTE of a rewritten prepared statement.
    pub(super) async fn execute_rewrite(
        &mut self,
        id: u32,
        c: &crate::wire::io::Logical,
    ) -> Result<()> {
        let cmd_seq = c.last_seq;
        let payload = c.payload();
        let Some(p) = self.prepared.get_mut(&id) else {
            return Err(Error::new(Source::Internal, "prepared rewrite vanished"));
        };
        if !p.long_data.is_empty() {
            let long_data = std::mem::take(&mut p.long_data);
            let why = if long_data.overflow {
                format!(
                    "more than {} MiB of COM_STMT_SEND_LONG_DATA for one execute",
                    LONG_DATA_LIMIT >> 20
                )
            } else if p.original.is_some() {
                self.execute_fell_back(id, LONG_DATA_FALLBACK);
                return self.execute_original(id, c, long_data.chunks).await;
            } else {
                "COM_STMT_SEND_LONG_DATA is not supported for statements this rule rewrites; send the value in the execute".to_string()
            };
            let msg = format!("heatsink rule '{}': {why}", p.rule);
            self.execute_refused(id, &why, crate::rewrite::RefusalClass::Parameter);
            return self.reply(cmd_seq, &err_of(errors::UNKNOWN, &msg)).await;
        }
        let strings = p
            .checks
            .iter()
            .any(|(_, c)| matches!(c, crate::rewrite::ParamCheck::String { .. }));
        // An execute that may become a text statement (merged, or run with
        // RETURNING) writes its string values as literals of the connection's
        // character set, which must then be known.
        let as_text = p.merge.is_some() && self.state.charset_changed();
        if (strings || as_text)
            && self.state.lexing.is_none()
            && !self.learn_lexing(cmd_seq).await?
        {
            return Ok(());
        }
        let charset = self.state.lexing.map(|l| l.charset);
        let Some(p) = self.prepared.get_mut(&id) else {
            return Err(Error::new(Source::Internal, "prepared rewrite vanished"));
        };
        if let Some(v) = param_violation(&payload, p, charset) {
            // A value the rewrite is not exact for, of a statement the server
            // answers as well as ever: the client's own statement runs.
            if v.declines && p.original.is_some() {
                self.execute_fell_back(id, &v.reason);
                return self.execute_original(id, c, Vec::new()).await;
            }
            let msg = format!(
                "heatsink rule '{}': {} cannot be rewritten with MariaDB's meaning",
                p.rule, v.message
            );
            let reason = format!("{} cannot be rewritten with MariaDB's meaning", v.reason);
            self.execute_refused(id, &reason, crate::rewrite::RefusalClass::Value);
            return self.reply(cmd_seq, &err_of(errors::UNKNOWN, &msg)).await;
        }
        // An execute that merges, or that needs RETURNING for its ids, runs as the
        // text statement its parameters make.
        if let Some(rw) = self.execute_as_text(id, &payload) {
            if let Some((key, part)) = self.merge_part(&rw) {
                if self.merge_table_free(&rw).await? {
                    return self.run_merged(key, part, &rw, cmd_seq).await;
                }
            }
            if self.returning_column(&rw).is_some() {
                return self.run_alone(&rw, cmd_seq).await;
            }
        }
        self.restore_insert_id().await?;
        let Some(p) = self.prepared.get_mut(&id) else {
            return Err(Error::new(Source::Internal, "prepared rewrite vanished"));
        };
        let commands = match remap_execute(&payload, p) {
            Ok(b) => b,
            Err(e) => {
                let answer = e.packet(&p.rule);
                return self.reply(cmd_seq, &answer).await;
            }
        };
        let (rule, reply) = (p.rule.clone(), p.reply.clone());
        let how = Run {
            atomic: p.atomic,
            as_sent_on_error: p.as_sent_on_error,
        };
        // The server's plan of the client's statement with these values, asked in
        // the same round trip as the rewrite.
        let probe = match p
            .probe
            .as_ref()
            .map(|probe| (probe.id, probe.flags.clone()))
        {
            Some((None, _)) => {
                self.execute_fell_back(id, PLAN_UNTOLD);
                return self.execute_original(id, c, Vec::new()).await;
            }
            Some((Some(explain_id), flags)) => {
                Some((original_execute(&payload, explain_id, p), flags))
            }
            None => None,
        };
        match (&reply, commands.as_slice(), probe) {
            (Reply::Patched(_), [one], Some((explain, flags))) => {
                self.link.backend.write_packet(0, &explain).await?;
                self.link.backend.write_packet(0, one).await?;
                match self.read_probe(flags.as_ref(), true).await? {
                    Some(patch) => self.relay_patched(&patch, true, cmd_seq).await,
                    None => {
                        // The plan does not tell the column flags: the rewrite's
                        // answer is dropped and the client's statement runs.
                        let answered_error = self.answered_error;
                        self.collect_response(ResponseKind::Generic).await?;
                        self.answered_error = answered_error;
                        self.execute_fell_back(id, PLAN_UNTOLD);
                        self.execute_original(id, c, Vec::new()).await
                    }
                }
            }
            (_, _, Some(_)) => Err(Error::new(
                Source::Internal,
                format!("rule '{rule}': a plan probe needs one patched statement"),
            )),
            (Reply::Patched(patch), [one], None) => {
                self.link.backend.write_packet(0, one).await?;
                self.relay_patched(patch, true, cmd_seq).await
            }
            (Reply::Last, [one], None) if self.rewrite_names.is_none() => {
                let next = self.link.backend.write_packet(0, one).await?;
                let shift = cmd_seq.wrapping_add(1).wrapping_sub(next);
                self.relay_response(ResponseKind::Generic, shift, cmd_seq)
                    .await
                    .map(|_| ())
            }
            _ => match self
                .run_commands(&rule, &commands, &reply, how, cmd_seq)
                .await?
            {
                Ran::Answered => Ok(()),
                Ran::Declined(reason) => {
                    self.execute_fell_back(id, reason);
                    self.execute_as_sent(id, c).await
                }
            },
        }
    }
}

/// Column flags a temporary table does not carry: PRI_KEY, UNIQUE_KEY, MULTIPLE_KEY,
/// AUTO_INCREMENT, PART_KEY.
const KEY_FLAGS: u16 = 0x0002 | 0x0004 | 0x0008 | 0x0200 | 0x4000;

/// Whether the server answered a rewritten read through a temporary table: a column
/// that carries key flags in its physical table arrived from it without any.
fn read_through_temporary_table(defs: &[ColumnDef], patch: &ColumnPatch) -> bool {
    defs.iter().any(|d| {
        d.flags & KEY_FLAGS == 0
            && names(&patch.materialized, &d.org_table)
            && names(&patch.keyed, origin_name(d))
    })
}

fn names(list: &[String], name: &[u8]) -> bool {
    let name = String::from_utf8_lossy(name);
    list.iter().any(|a| a.eq_ignore_ascii_case(&name))
}

/// The column's name in its table (its alias when the server gives no origin).
fn origin_name(def: &ColumnDef) -> &[u8] {
    if def.org_name.is_empty() {
        &def.name
    } else {
        &def.org_name
    }
}

/// Restores one column definition if it comes from a derived table the rewrite
/// introduced (its `org_table` is the derived table's alias, or the physical table
/// it reads) and names a logical column: everything but the name and table alias the
/// client gave is restored; the flags too unless the read went through a `temporary`
/// table.
fn restore(def: &mut ColumnDef, patch: &ColumnPatch, temporary: bool) {
    restore_origin(def, patch, temporary);
    if !patch.set_flags.is_empty() {
        let name = String::from_utf8_lossy(&def.name).to_ascii_lowercase();
        if let Some((_, set)) = patch.set_flags.iter().find(|(n, _)| *n == name) {
            def.flags |= set;
        }
    }
}

/// The `binary` character set: numbers and other values the session's
/// `character_set_results` does not convert.
const BINARY_CHARSET: u16 = 63;

/// The part of [`restore`] for columns of the rewrite's derived tables.
fn restore_origin(def: &mut ColumnDef, patch: &ColumnPatch, temporary: bool) {
    let is_alias = |t: &[u8]| names(&patch.tables, t);
    let materialized = names(&patch.materialized, &def.org_table);
    // Merged into a join, a computed column may lose its org_table and org_name;
    // the table alias and the name still say where it comes from.
    let derived = materialized
        || is_alias(&def.org_table)
        || (def.org_table.is_empty() && is_alias(&def.table));
    if !derived {
        return;
    }
    let name = String::from_utf8_lossy(origin_name(def)).to_ascii_lowercase();
    if let Some((_, computed)) = patch.computed.iter().find(|(n, _)| *n == name) {
        // The name is the client's; character set and length are those of the
        // session's character_set_results, as the server converted them.
        // The extended metadata block is there only when the session negotiated
        // it: keep the server's.
        let client_name = std::mem::take(&mut def.name);
        let extended = def.extended.take();
        let (charset, length) = (def.charset, def.length);
        *def = computed.clone();
        def.name = client_name;
        def.extended = extended;
        if computed.charset != BINARY_CHARSET {
            def.charset = charset;
            def.length = length;
        }
        return;
    }
    let Some((_, logical)) = patch.columns.iter().find(|(n, _)| *n == name) else {
        return;
    };
    def.org_table = logical.org_table.clone();
    def.org_name = logical.org_name.clone();
    const NOT_NULL: u16 = 1;
    if patch.flags_from_logical && !(temporary && materialized) {
        def.flags = (logical.flags & !NOT_NULL) | (def.flags & NOT_NULL);
    }
    if def.schema.is_empty() {
        // A computed column: restore the logical column's type. Nullability is
        // the query's (an outer join makes the column nullable).
        def.schema = logical.schema.clone();
        def.charset = logical.charset;
        def.length = logical.length;
        def.column_type = logical.column_type;
        def.flags = (logical.flags & !NOT_NULL) | (def.flags & NOT_NULL);
        def.decimals = logical.decimals;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_only_touches_rewritten_columns() {
        let mk = |schema: &str, org_table: &str, name: &str, t: u8| ColumnDef {
            catalog: b"def".to_vec(),
            schema: schema.into(),
            table: b"hits".to_vec(),
            org_table: org_table.into(),
            name: name.into(),
            org_name: name.into(),
            extended: None,
            charset: 63,
            length: 21,
            column_type: t,
            flags: 129,
            decimals: 0,
            fixed_len: 0x0c,
            tail: vec![0, 0],
        };
        let mut logical = mk("shop", "hits", "cnt", 3);
        logical.length = 11;
        logical.flags = 1;
        let patch = ColumnPatch {
            tables: vec!["hits".into()],
            columns: vec![("cnt".into(), logical.clone())],
            flags_from_logical: false,
            materialized: Vec::new(),
            keyed: Vec::new(),
            computed: Vec::new(),
            set_flags: Vec::new(),
        };
        let mut d = mk("", "hits", "cnt", 8);
        d.name = b"c".to_vec();
        restore(&mut d, &patch, false);
        assert_eq!(d.column_type, 3);
        assert_eq!(d.length, 11);
        assert_eq!(d.schema, b"shop");
        assert_eq!(d.name, b"c");
        let mut other = mk("", "other", "cnt", 8);
        restore(&mut other, &patch, false);
        assert_eq!(other.column_type, 8);
        let mut expr = mk("", "", "cnt", 8);
        expr.table = Vec::new();
        restore(&mut expr, &patch, false);
        assert_eq!(expr.column_type, 8);
    }

    #[test]
    fn keys_are_kept_only_when_read_through_a_temporary_table() {
        let mk = |org_table: &str, name: &str, flags: u16| ColumnDef {
            catalog: b"def".to_vec(),
            schema: b"shop".to_vec(),
            table: b"v".to_vec(),
            org_table: org_table.into(),
            name: name.into(),
            org_name: name.into(),
            extended: None,
            charset: 63,
            length: 11,
            column_type: 3,
            flags,
            decimals: 0,
            fixed_len: 0x0c,
            tail: vec![0, 0],
        };
        // The log: KEY (uid); the ring: PRIMARY KEY (uid, slot).
        let mut logical = mk("log", "uid", 1 | 0x0008 | 0x4000);
        logical.table = b"log".to_vec();
        let patch = ColumnPatch {
            tables: vec!["v".into()],
            columns: vec![("uid".into(), logical)],
            flags_from_logical: true,
            materialized: vec!["ring".into()],
            keyed: vec!["uid".into()],
            computed: Vec::new(),
            set_flags: Vec::new(),
        };
        // Straight from the ring (merged derived table or an index read).
        for org_table in ["v", "ring"] {
            let defs = [mk(org_table, "uid", 1 | 0x0002 | 0x4000)];
            let temporary = read_through_temporary_table(&defs, &patch);
            assert!(!temporary, "{org_table}");
            let mut d = defs[0].clone();
            restore(&mut d, &patch, temporary);
            assert_eq!(d.flags, 1 | 0x0008 | 0x4000, "{org_table}");
            assert_eq!(d.org_table, b"log");
        }
        // Through a temporary table: no key flags, as the log's column would report.
        let defs = [mk("ring", "uid", 1 | 0x1000)];
        assert!(read_through_temporary_table(&defs, &patch));
        let mut d = defs[0].clone();
        restore(&mut d, &patch, true);
        assert_eq!(d.flags, 1 | 0x1000);
        assert_eq!(d.org_table, b"log");
        // A column that has no key in the ring says nothing.
        let defs = [mk("ring", "visitor", 1)];
        assert!(!read_through_temporary_table(&defs, &patch));
    }
}
