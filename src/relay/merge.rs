//! Executing merged writes (group commit, see `relay::coalesce`) on a session's
//! backend connection, and answering each member as its own statement would have
//! been answered.
//!
//! The rule kind's [`Merger`] (`kinds/<kind>/merge.rs`, carried by the rewrite)
//! says what an execution contributes and to which group, builds the merged
//! statement of a batch and derives each member's OK from the write's response;
//! everything else is here and the same for every kind:
//!
//! - The leader writes the merged statement on its connection. When the merger
//!   names a column to return ([`Merger::returning`], MariaDB ≥ 10.5), the
//!   statement ends in `RETURNING <column>`: MariaDB returns one value per item in
//!   statement order, from which each member learns its last_insert_id, and that
//!   member's `LAST_INSERT_ID()` is set to it before its next statement that is not
//!   itself merged (`Session::pending_insert_id`). Without `RETURNING` support such
//!   executions do not merge.
//! - Prepared executes merge too: each execute's parameter values are written as
//!   literals into the rewrite's pieces (`wire::literal`; values without an exact
//!   literal, such as BIT or MYSQL_TYPE_TIMESTAMP ones, keep the execute a prepared
//!   statement of its own), and the merger rebuilds the text statement from them.
//!   The OK of an INSERT is the same in both protocols.
//! - A merged write that warned, of a kind whose warnings are routed by row
//!   ([`Merger::routes_warnings`]), is followed by `SHOW WARNINGS` on the leader's
//!   connection: a warning `at row N` goes to the member holding row N (renumbered
//!   within its rows), one without a row number to every member, so each OK
//!   carries its own count and a SHOW WARNINGS right after lists its own rows
//!   (`Session::merged_warnings`; none when the write did not warn).
//! - A merged write that fails with a lock conflict is retried; one that fails
//!   otherwise wrote nothing (one statement in autocommit mode) and may have failed
//!   because of one member's values, so every member then runs its own statement
//!   alone and gets its own answer (or, as the merger decides
//!   ([`Merger::alone_after_failure`]), gets the write's error).
//! - An execution running alone whose answer needs every row's value
//!   ([`Merger::returning_alone`]) runs with `RETURNING` too.

use std::sync::atomic::Ordering;

use super::coalesce::{LeaderGuard, Outcome, Part, Role, Signal};
use super::prepared::execute_params;
use super::session::Session;
use super::splice::{backoff, Collected, RETRYABLE};
use super::state::AloneReason;
use crate::error::Result;
use crate::rewrite::merge::{Limits, Member, Written};
use crate::rewrite::{Merger, Reply, Rewritten};
use crate::wire::literal;
use crate::wire::packets::{self, err_of, errors, lenenc_int, OkSummary};
use crate::wire::resultset::{text_cells, text_row};

impl Session {
    /// The group a rewrite may be merged into (group key, this execution's part), or
    /// `None` when it runs alone: not mergeable, or the session cannot be shown
    /// equivalent to the others ([`super::state::SessionState::merge_class`], counted by reason).
    /// A merged write runs with the leader's privileges and session, so the group
    /// key holds the user, character set, default database and the session's class
    /// (the system variables its `SET`s changed); and on the leader's backend node,
    /// so it holds the node too (a node that dies must fail only its own sessions'
    /// writes, and each node writes its own share of a counter's slots).
    pub(super) fn merge_part(&self, rw: &Rewritten) -> Option<(Vec<u8>, Part)> {
        let m = rw.merge.as_ref()?;
        let class = match self.state.merge_class() {
            Ok(class) => class,
            Err(reason) => {
                self.count_alone(reason);
                return None;
            }
        };
        let (target, part) = m.part(&rw.aux)?;
        // Per-item values come back only through RETURNING.
        if m.returning(&rw.aux).is_some() && !self.returning {
            return None;
        }
        let mut key = Vec::with_capacity(128);
        let session = [
            rw.rule.as_bytes(),
            &self.identity,
            class,
            self.state.current_db.as_deref().unwrap_or("").as_bytes(),
            self.lease.addr().as_bytes(),
        ];
        for piece in session.into_iter().chain(target) {
            key.extend_from_slice(&(piece.len() as u32).to_le_bytes());
            key.extend_from_slice(piece);
        }
        let lanes = m.lanes().max(1);
        if lanes > 1 {
            key.extend_from_slice(&(self.backend_id % lanes).to_le_bytes());
        }
        Some((key, part))
    }

    /// Counts a write that could have merged and ran alone.
    pub(super) fn count_alone(&self, reason: AloneReason) {
        self.shared.stats.merge_alone[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// A prepared execute as the text rewrite it makes, each parameter written as a
    /// literal (`wire::literal`) into the rewrite's pieces, for a merged write or a
    /// run with `RETURNING`. `None` when the statement has no pieces, a value has no
    /// exact literal, or the session's character set is not known (string
    /// parameters are sent in it).
    pub(super) fn execute_as_text(&mut self, id: u32, payload: &[u8]) -> Option<Rewritten> {
        // String parameters arrive in the connection's character set: the one the
        // server last reported, else the handshake's while nothing may have changed
        // it.
        let charset = match self.state.lexing {
            Some(l) => literal::charset_of_name(l.charset.name)?,
            None if !self.state.charset_changed() => literal::charset_name(*self.identity.last()?)?,
            None => return None,
        };
        let p = self.prepared.get_mut(&id)?;
        p.merge.as_ref()?;
        let values = execute_params(payload, p).ok()?;
        let m = p.merge.as_ref()?;
        let types = p.types.as_deref().unwrap_or_default();
        let mut aux = Vec::with_capacity(m.aux.len());
        for (text, holes) in m.aux.iter().zip(&m.holes) {
            let mut out = Vec::with_capacity(text.len() + 16 * holes.len());
            let mut at = 0;
            for &(offset, j) in holes {
                out.extend_from_slice(text.get(at..offset)?);
                let t = [*types.get(2 * j)?, *types.get(2 * j + 1)?];
                out.extend_from_slice(
                    literal::sql_literal(t, *values.get(j)?, charset)?.as_bytes(),
                );
                at = offset + 1;
            }
            out.extend_from_slice(text.get(at..)?);
            aux.push(out);
        }
        let sql = m.merger.statement(&aux)?;
        Some(Rewritten {
            rule: p.rule.clone(),
            statements: vec![sql],
            param_map: None,
            reply: p.reply.clone(),
            atomic: false,
            aux,
            aux_holes: Vec::new(),
            param_checks: Vec::new(),
            merge: Some(m.merger.clone()),
            prelude: None,
            probe: None,
            as_sent_on_error: p.as_sent_on_error,
        })
    }

    /// Joins the group of `key` with `part`: writes the batch as its leader, or
    /// waits for the write holding it; runs alone when the group cannot take it.
    pub(super) async fn run_merged(
        &mut self,
        key: Vec<u8>,
        part: Part,
        rw: &Rewritten,
        cmd_seq: u8,
    ) -> Result<()> {
        let coalescer = self.shared.coalescer.clone();
        let limits = rw.merge.as_ref().map_or(Limits::NONE, |m| m.limits());
        match coalescer.join(&key, part, limits) {
            Some(Role::Lead(batch, me)) => {
                self.lead(LeaderGuard::new(coalescer, key, batch), me, rw, cmd_seq)
                    .await
            }
            Some(Role::Wait(rx)) => self.follow(rx, key, rw, cmd_seq).await,
            None => self.run_alone(rw, cmd_seq).await,
        }
    }

    /// Writes a merged batch on this connection, tells every member its outcome and
    /// answers this session's client (member `me`).
    async fn lead(
        &mut self,
        guard: LeaderGuard,
        me: usize,
        rw: &Rewritten,
        cmd_seq: u8,
    ) -> Result<()> {
        let mine = self.write_merged(guard, me, rw).await?;
        self.answer_member(mine, rw, cmd_seq).await
    }

    /// Waits for the merged write holding this session's part. A client that goes
    /// away meanwhile ends the session at once, so that its backend connection
    /// (and any lock it holds) is released rather than kept for a write whose
    /// answer nobody reads.
    async fn follow(
        &mut self,
        mut rx: tokio::sync::oneshot::Receiver<Signal>,
        key: Vec<u8>,
        rw: &Rewritten,
        cmd_seq: u8,
    ) -> Result<()> {
        let signal = loop {
            // Input the client sends meanwhile stays buffered for the next command;
            // past a bound it is not read until the answer went out.
            let watching = self.link.client.buf.len() < WATCH_LIMIT;
            tokio::select! {
                s = &mut rx => break s,
                r = self.link.client.fill(), if watching => {
                    r?;
                }
            }
        };
        match signal {
            Ok(Signal::Lead(batch, me)) => {
                let guard = LeaderGuard::new(self.shared.coalescer.clone(), key, batch);
                Box::pin(self.lead(guard, me, rw, cmd_seq)).await
            }
            Ok(signal) => self.answer_member(signal, rw, cmd_seq).await,
            Err(_) => {
                let msg = "heatsink: the group commit of this statement was interrupted; it may or may not have been applied";
                self.reply(cmd_seq, &err_of(errors::SERVER_LOST, msg)).await
            }
        }
    }

    /// Runs `sql`, retrying lock conflicts when `retry` (deadlocks and lock wait
    /// timeouts; only deadlocks for a merged write, whose lock waits are bounded on
    /// purpose, see [`MERGE_LOCK_WAIT`]). `Err` carries the last ERR payload.
    async fn run_retrying(
        &mut self,
        sql: &[u8],
        retry: bool,
        merged: bool,
    ) -> Result<std::result::Result<Collected, Vec<u8>>> {
        let mut attempt = 1;
        loop {
            let c = self.run_collect(sql).await?;
            let Some(e) = c.err() else {
                return Ok(Ok(c));
            };
            let conflict = c.err_code().is_some_and(|code| {
                RETRYABLE.contains(&code) && !(merged && code == LOCK_WAIT_TIMEOUT)
            });
            if !conflict || !retry || attempt >= self.max_attempts() {
                return Ok(Err(e.payload.to_vec()));
            }
            attempt += 1;
            backoff(attempt).await;
        }
    }

    /// Writes the batch as the merger merges it, tells every member its outcome
    /// and returns this session's (member `me`).
    async fn write_merged(
        &mut self,
        guard: LeaderGuard,
        me: usize,
        rw: &Rewritten,
    ) -> Result<Signal> {
        let parts = guard.parts();
        let members = parts.len();
        let merged = rw
            .merge
            .as_ref()
            .and_then(|m| Some((m, m.merged(&rw.aux, parts, guard.sums())?)));
        let Some((m, merged)) = merged else {
            // Not pieces the merger knows: every member runs its own statement.
            guard.resolve_each(|_| Signal::Alone);
            return Ok(Signal::Alone);
        };
        // Each part's first item, counted in statement order.
        let items: Vec<u64> = parts.iter().map(|p| p.items).collect();
        let mut first = vec![0u64; members];
        let mut total = 0u64;
        for &i in &merged.order {
            if let Some(f) = first.get_mut(i) {
                *f = total;
            }
            total += items.get(i).copied().unwrap_or(0);
        }
        let returning = m.returning(&rw.aux);
        // A batch of this session alone is its own statement on its own connection:
        // it waits as the statement would. Only a write holding other sessions'
        // statements is bounded (`SET STATEMENT` costs the server 15–25 µs a
        // statement, measured).
        let sql = self.bounded(&merged.sql, returning, members > 1);
        self.state.before_proxy_statement();
        let written = match self.run_retrying(&sql, true, true).await? {
            Ok(c) if returning.is_none() => c.ok().map(|o| Written {
                ids: Vec::new(),
                warnings: o.warnings,
            }),
            Ok(c) => returned_ids(&c.packets, self.link.deprecate_eof)
                .filter(|(ids, _)| ids.len() as u64 == total)
                .map(|(ids, warnings)| Written { ids, warnings }),
            // The write waited for a lock longer than its bound (a member's own
            // table lock, a long transaction): nothing was written, and every member
            // runs its own statement on its own connection, waiting there as long
            // as its own session says. No client waits on its own lock through
            // another session's connection.
            Err(payload) if err_code(&payload) == Some(LOCK_WAIT_TIMEOUT) => {
                tracing::debug!(
                    id = self.backend_id,
                    members,
                    "merged write timed out on a lock: members run alone"
                );
                for _ in 0..members {
                    self.count_alone(AloneReason::LockTimeout);
                }
                guard.resolve_each(|_| Signal::Alone);
                return Ok(Signal::Alone);
            }
            // Nothing was written (one statement in autocommit), and the error may
            // be one member's doing: each member runs its own statement, so only a
            // statement that fails alone gets an error.
            // A lone member whose rewrite runs as sent on such an error does so
            // alone too (`Plan::as_sent_on_error`): its failed write says nothing
            // about its own statement.
            Err(payload)
                if m.alone_after_failure(members)
                    || (rw.as_sent_on_error.is_some() && super::splice::undone_alone(&payload)) =>
            {
                for _ in 0..members {
                    self.count_alone(AloneReason::WriteFailed);
                }
                guard.resolve_each(|_| Signal::Alone);
                return Ok(Signal::Alone);
            }
            Err(payload) => {
                self.count_merged(m.as_ref(), members, total);
                let outcome: Outcome = Err(payload);
                guard.resolve(outcome.clone());
                return Ok(Signal::Done(outcome));
            }
        };
        let own_warnings = match &written {
            Some(w) if w.warnings > 0 && m.routes_warnings() => {
                // The rows are written: whatever happens here, every member gets its
                // OK (with the write's count if need be).
                match self.warnings_by_part(&first, &items, w.warnings).await {
                    Ok(counts) => counts,
                    Err(e) => {
                        tracing::warn!(id = self.backend_id, error = %e, "could not read a merged write's warnings");
                        None
                    }
                }
            }
            _ => None,
        };
        let signal = |i: usize| -> Signal {
            let member = Member {
                first: first.get(i).copied().unwrap_or(0),
                items: items.get(i).copied().unwrap_or(0),
            };
            match m.answer(written.as_ref(), member) {
                Ok(ok) => match own_warnings.as_ref().and_then(|w| w.get(i)) {
                    Some(rows) => Signal::Warned(
                        OkSummary {
                            warnings: rows.len().min(usize::from(u16::MAX)) as u16,
                            ..ok
                        },
                        rows.clone(),
                    ),
                    None => Signal::Done(Ok(ok)),
                },
                Err(message) => Signal::Done(Err(err_of(errors::UNKNOWN, message))),
            }
        };
        let mine = signal(me);
        self.count_merged(m.as_ref(), members, total);
        guard.resolve_each(signal);
        Ok(mine)
    }

    /// Counts a merged write of `members` members that wrote `items` items.
    fn count_merged(&self, merger: &dyn Merger, members: usize, items: u64) {
        if members > 1 {
            let stats = &self.shared.stats;
            stats.coalesced_writes.fetch_add(1, Ordering::Relaxed);
            stats.coalesced_items.add(merger.metric(), items);
        }
    }

    /// Each part's own SHOW WARNINGS rows after a merged write that warned,
    /// from the write's `SHOW WARNINGS` on this connection: a warning `at row N`
    /// belongs to the part holding row N (parts start at `first_row`, 0-based, and
    /// hold `rows_of` rows) and is renumbered within it, one without a row number
    /// goes to every part, as each part's own statement would have had it too.
    /// `None` when the list is not complete (more warnings than `max_error_count`
    /// keeps) or does not parse: then every part reports the write's count.
    async fn warnings_by_part(
        &mut self,
        first_row: &[u64],
        rows_of: &[u64],
        total: u16,
    ) -> Result<Option<Vec<Vec<Vec<u8>>>>> {
        let c = self.run_collect(b"SHOW WARNINGS").await?;
        let rows = c.text_rows(self.link.deprecate_eof);
        if rows.len() != usize::from(total) {
            return Ok(None);
        }
        let mut own: Vec<Vec<Vec<u8>>> = vec![Vec::new(); first_row.len()];
        for p in &c.packets[rows] {
            let Some(cells) = text_cells(&p.payload) else {
                return Ok(None);
            };
            let Some(Some(message)) = cells.get(2).copied() else {
                return Ok(None);
            };
            let Some((row, at)) = warning_row(message) else {
                own.iter_mut()
                    .for_each(|rows| rows.push(p.payload.to_vec()));
                continue;
            };
            let Some(i) = (0..first_row.len())
                .find(|&i| row > first_row[i] && row <= first_row[i] + rows_of[i])
            else {
                return Ok(None);
            };
            let mut local = message[..at].to_vec();
            local.extend_from_slice((row - first_row[i]).to_string().as_bytes());
            let mut cells = cells;
            cells[2] = Some(&local);
            own[i].push(text_row(&cells));
        }
        Ok(Some(own))
    }

    /// Answers one member of a merged write as its own statement would have been.
    async fn answer_member(&mut self, signal: Signal, rw: &Rewritten, cmd_seq: u8) -> Result<()> {
        let signal = match signal {
            Signal::Warned(o, rows) => {
                self.merged_warnings = Some(rows);
                Signal::Done(Ok(o))
            }
            Signal::Done(Ok(o)) => {
                // This session's backend did not run the statement (or ran everyone's):
                // a SHOW WARNINGS right after must show its own, here none.
                self.merged_warnings = (o.warnings == 0).then(Vec::new);
                Signal::Done(Ok(o))
            }
            other => other,
        };
        match signal {
            Signal::Done(Ok(o)) => {
                let info = match &rw.reply {
                    Reply::Ok { info, .. } => info.clone(),
                    _ => None,
                };
                if rw
                    .merge
                    .as_ref()
                    .is_some_and(|m| m.returning(&rw.aux).is_some())
                {
                    // The write ran on the leader's connection: this session's
                    // LAST_INSERT_ID() still has its old value.
                    self.pending_insert_id = Some(o.last_insert_id);
                }
                let ok = OkSummary {
                    status: self.state.status,
                    ..o
                };
                self.reply(
                    cmd_seq,
                    &packets::ok_payload(&ok, info.as_deref().map(str::as_bytes)),
                )
                .await
            }
            Signal::Done(Err(payload)) => self.reply(cmd_seq, &payload).await,
            Signal::Alone | Signal::Lead(..) | Signal::Warned(..) => {
                self.run_alone(rw, cmd_seq).await
            }
        }
    }

    /// The column to return when the rewrite runs alone and its answer needs every
    /// row's value ([`Merger::returning_alone`]; for example the OK packet of an
    /// upsert of several rows reports the id of its first row that took a new slot
    /// rather than its first row's, `RETURNING` gives every row's).
    pub(super) fn returning_column(&self, rw: &Rewritten) -> Option<Vec<u8>> {
        let column = rw.merge.as_ref()?.returning_alone(&rw.aux)?;
        (self.returning && rw.statements.len() == 1 && rw.param_map.is_none())
            .then(|| column.to_vec())
    }

    /// `statement [RETURNING column]` as the proxy runs it on its own:
    /// - a merged write of several sessions (`merged`) under `SET STATEMENT
    ///   lock_wait_timeout = … FOR`, so that it gives up on a metadata lock (`LOCK
    ///   TABLES`, `FLUSH TABLES WITH READ LOCK`, `BACKUP STAGE` of any session) after
    ///   [`MERGE_LOCK_WAIT`] (its members then run alone, see `write_merged`). Row
    ///   locks are not bounded: only a transaction holds them past its statement,
    ///   and a session in one never merges, so a merged write waits for row locks
    ///   only where each member's own statement would wait too;
    /// - with `RETURNING` on a Galera node, with the server's own retry of an
    ///   autocommit statement that failed certification switched off
    ///   (`wsrep_retry_autocommit = 0`): the server sends the failed attempt's rows
    ///   and then the retry's (measured on MariaDB 10.11 with galera-4: 6 ids for a
    ///   3-row insert), so the ids could not be told apart. The conflict then reaches
    ///   the proxy as 1213 and the proxy retries the statement.
    fn bounded(&self, statement: &[u8], returning: Option<&[u8]>, merged: bool) -> Vec<u8> {
        let mut sql = Vec::with_capacity(statement.len() + 128);
        let mut settings: Vec<String> = Vec::new();
        if merged {
            settings.push(format!(
                "lock_wait_timeout = {}",
                MERGE_LOCK_WAIT.as_secs().max(1)
            ));
        }
        if returning.is_some() && self.state.galera {
            settings.push("wsrep_retry_autocommit = 0".to_string());
        }
        if !settings.is_empty() {
            sql.extend_from_slice(b"SET STATEMENT ");
            sql.extend_from_slice(settings.join(", ").as_bytes());
            sql.extend_from_slice(b" FOR ");
        }
        sql.extend_from_slice(statement);
        if let Some(column) = returning {
            sql.extend_from_slice(b" RETURNING ");
            sql.extend_from_slice(column);
        }
        sql
    }

    /// Runs a rewrite's single statement with `RETURNING column` (lock conflicts
    /// retried outside a client transaction, as any rewrite) and answers as the
    /// original statement would have, as the merger derives it: its rows, its first
    /// row's id.
    pub(super) async fn run_returning(
        &mut self,
        rw: &Rewritten,
        column: &[u8],
        cmd_seq: u8,
    ) -> Result<()> {
        let sql = self.bounded(&rw.statements[0], Some(column), false);
        if self.state.galera {
            // Its `SET STATEMENT wsrep_retry_autocommit` is the only change.
            self.state.before_proxy_statement();
        }
        let retry = self.retry_safe(1, false);
        let c = match self.run_retrying(&sql, retry, false).await? {
            Ok(c) => c,
            Err(payload) => return self.reply(cmd_seq, &payload).await,
        };
        let written = returned_ids(&c.packets, self.link.deprecate_eof)
            .map(|(ids, warnings)| Written { ids, warnings });
        let answer = match &rw.merge {
            Some(m) => m.answer_alone(written.as_ref()),
            None => Err("heatsink: internal error: a rewrite without a merger ran with RETURNING"),
        };
        let ok = match answer {
            Ok(ok) => ok,
            Err(message) => return self.reply(cmd_seq, &err_of(errors::UNKNOWN, message)).await,
        };
        self.pending_insert_id = Some(ok.last_insert_id);
        let info = match &rw.reply {
            Reply::Ok { info, .. } => info.clone(),
            _ => None,
        };
        let ok = OkSummary {
            status: self.state.status,
            ..ok
        };
        self.reply(
            cmd_seq,
            &packets::ok_payload(&ok, info.as_deref().map(str::as_bytes)),
        )
        .await
    }

    /// Sets the session's `LAST_INSERT_ID()` to what the last merged write that
    /// returned ids (or run with `RETURNING`) would have left, before a statement
    /// that might read it.
    pub(super) async fn restore_insert_id(&mut self) -> Result<()> {
        if let Some(id) = self.pending_insert_id.take() {
            let c = self
                .run_collect(format!("DO LAST_INSERT_ID({id})").as_bytes())
                .await?;
            if let Some(e) = c.err() {
                tracing::warn!(
                    id = self.backend_id,
                    error = ?packets::parse_err(&e.payload),
                    "could not restore LAST_INSERT_ID() after a merged write"
                );
            }
        }
        Ok(())
    }
}

/// How long a merged write of several sessions waits for a metadata lock before it
/// gives up and its members run alone on their own connections.
pub(super) const MERGE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How much client input a session waiting for a merged write buffers while it
/// watches for the client going away.
const WATCH_LIMIT: usize = 64 * 1024;

/// ER_LOCK_WAIT_TIMEOUT.
const LOCK_WAIT_TIMEOUT: u16 = 1205;

/// The error code of an ERR payload.
fn err_code(payload: &[u8]) -> Option<u16> {
    (payload.first() == Some(&packets::ERR))
        .then(|| payload.get(1..3).map(|b| u16::from_le_bytes([b[0], b[1]])))
        .flatten()
}

/// The 1-based row number a warning message ends with (`… at row 12`), and where
/// its digits start.
fn warning_row(message: &[u8]) -> Option<(u64, usize)> {
    const AT_ROW: &[u8] = b" at row ";
    let at = message.windows(AT_ROW.len()).rposition(|w| w == AT_ROW)? + AT_ROW.len();
    let digits = &message[at..];
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some((std::str::from_utf8(digits).ok()?.parse().ok()?, at))
}

/// The ids of a `… RETURNING id` result set (one column), and its warning count.
fn returned_ids(pkts: &[crate::wire::io::Packet], deprecate_eof: bool) -> Option<(Vec<u64>, u16)> {
    let first = pkts.first()?;
    if first.payload.first() == Some(&packets::OK) {
        return None;
    }
    let (columns, _) = lenenc_int(&first.payload)?;
    if columns != 1 {
        return None;
    }
    let skip = 2 + usize::from(!deprecate_eof);
    let (last, rows) = pkts.get(skip..)?.split_last()?;
    let warnings = packets::end_of_rows_warnings(&last.payload, deprecate_eof)?;
    let mut ids = Vec::with_capacity(rows.len());
    for r in rows {
        let (len, used) = lenenc_int(&r.payload)?;
        let text = r.payload.get(used..used + usize::try_from(len).ok()?)?;
        ids.push(std::str::from_utf8(text).ok()?.parse().ok()?);
    }
    Some((ids, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::io::Packet;

    fn pkt(b: &[u8]) -> Packet {
        Packet {
            seq: 0,
            payload: bytes::BytesMut::from(b),
        }
    }

    #[test]
    fn row_numbers_of_warnings() {
        let m = b"Incorrect integer value: 'x' for column `d`.`t`.`c` at row 12";
        assert_eq!(warning_row(m), Some((12, m.len() - 2)));
        assert_eq!(
            warning_row(b"Data truncated for column 'c' at row 1"),
            Some((1, 37))
        );
        assert_eq!(warning_row(b"'VALUES function' is deprecated"), None);
        assert_eq!(warning_row(b"at row 3x"), None);
    }

    #[test]
    fn ids_from_a_returning_result_set() {
        let def = pkt(
            b"\x03def\x00\x00\x00\x02id\x00\x0c\x3f\x00\x14\x00\x00\x00\x08\x23\x42\x00\x00\x00",
        );
        let rows = [pkt(b"\x0217"), pkt(b"\x0218")];
        let eof = pkt(b"\xfe\x02\x00\x02\x00");
        let ok_eof = pkt(b"\xfe\x00\x00\x02\x00\x01\x00");
        let mut with_eof = vec![pkt(b"\x01"), def.clone(), eof.clone()];
        with_eof.extend(rows.iter().cloned());
        with_eof.push(eof);
        assert_eq!(returned_ids(&with_eof, false), Some((vec![17, 18], 2)));
        let mut deprecated = vec![pkt(b"\x01"), def];
        deprecated.extend(rows.iter().cloned());
        deprecated.push(ok_eof);
        assert_eq!(returned_ids(&deprecated, true), Some((vec![17, 18], 1)));
        assert_eq!(
            returned_ids(&[pkt(b"\x00\x01\x00\x02\x00\x00\x00")], true),
            None
        );
    }
}
