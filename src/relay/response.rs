//! Where does a response end?
//!
//! [`ResponseParser`] follows the command/response state machine one packet at a time,
//! looking only at the first bytes of each packet. The relay forwards bytes as they
//! arrive and asks the parser when to stop reading. Rows are never decoded.

use crate::wire::packets::{self, lenenc_int, EOF, ERR, LOCAL_INFILE, OK};
use crate::wire::status;

/// The shape of response a command produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseKind {
    /// OK, ERR, LOCAL INFILE request or result set(s): COM_QUERY, COM_PROCESS_INFO,
    /// COM_STMT_BULK_EXECUTE, and the proxy's own statements (a rewritten
    /// COM_STMT_EXECUTE never asks for a cursor). Status flags other than
    /// MORE_RESULTS_EXISTS never end it.
    Generic,
    /// The response to a client's COM_STMT_EXECUTE: like [`ResponseKind::Generic`],
    /// except that when `cursor` (the client asked for one) a result set may end after
    /// its column definitions because the server opened a cursor (see
    /// [`ResponseKind::execute`]).
    Execute {
        /// The command's flags ask for a cursor (CURSOR_TYPE_READ_ONLY and kin).
        cursor: bool,
    },
    /// Rows then a terminator: COM_STMT_FETCH.
    Fetch,
    /// COM_STMT_PREPARE: prepare-OK, parameter and column definitions.
    Prepare,
    /// Column definitions then a terminator: COM_FIELD_LIST.
    FieldList,
    /// Exactly one packet of any content: COM_STATISTICS, COM_PING, COM_INIT_DB, …
    Single,
}

impl ResponseKind {
    /// The kind of response to the COM_STMT_EXECUTE `payload` (command byte first):
    /// [`ResponseKind::Execute`] with `cursor` from its flags byte.
    pub fn execute(payload: &[u8]) -> ResponseKind {
        ResponseKind::Execute {
            cursor: payload.get(5).is_some_and(|f| f & CURSOR_TYPE_MASK != 0),
        }
    }

    /// OK, ERR, LOCAL INFILE request or any number of result sets.
    fn multi_result(self) -> bool {
        matches!(self, ResponseKind::Generic | ResponseKind::Execute { .. })
    }
}

/// COM_STMT_EXECUTE flag bits asking for a cursor: READ_ONLY, FOR_UPDATE, SCROLLABLE.
const CURSOR_TYPE_MASK: u8 = 0x07;

/// What the caller should do after a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Keep reading packets of this response.
    More,
    /// The response is complete.
    Done,
    /// The server asked for a LOCAL INFILE: relay the client's file packets (up to an
    /// empty one), then keep reading.
    LocalInfile,
}

/// A packet that does not fit the protocol state (the backend broke framing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected packet in {state}: {detail}")]
pub struct ProtocolViolation {
    pub state: &'static str,
    pub detail: String,
}

/// The prepare-OK fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareOk {
    pub statement_id: u32,
    pub columns: u16,
    pub params: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    First,
    Columns(u64),
    ColumnsEof,
    Rows,
    PrepareParams(u16, u16),
    PrepareParamsEof(u16),
    PrepareColumns(u16),
    PrepareColumnsEof,
    FieldDefs,
    Finished,
}

/// Follows one response; see the module docs.
#[derive(Debug, Clone)]
pub struct ResponseParser {
    state: State,
    kind: ResponseKind,
    /// CLIENT_DEPRECATE_EOF was negotiated: no EOF after column definitions, and result
    /// sets end with an OK packet carrying the 0xFE header.
    deprecate_eof: bool,
    /// Status flags of the last OK/EOF seen (transaction state for the session).
    pub last_status: Option<u16>,
    /// The response contained an ERR packet.
    pub errored: bool,
    /// Number of OK packets (statement results without rows) seen.
    pub oks: u32,
    /// Number of result sets seen.
    pub result_sets: u32,
    /// Set for [`ResponseKind::Prepare`] when the prepare succeeded.
    pub prepare_ok: Option<PrepareOk>,
    /// Rows of the result sets seen (query digests).
    pub rows: u64,
    /// Affected rows of the OK packets seen (query digests).
    pub affected: u64,
    /// The code of the ERR packet, when the response had one.
    pub err_code: Option<u16>,
    /// The packet just fed was an OK packet (or the OK that ends a result set under
    /// CLIENT_DEPRECATE_EOF) with SERVER_SESSION_STATE_CHANGED: on a connection that
    /// negotiated CLIENT_SESSION_TRACK it carries session state information (see
    /// `wire::track`). Taken with [`ResponseParser::take_tracked`].
    tracked: bool,
}

impl ResponseParser {
    /// A parser for one response of `kind`.
    pub fn new(kind: ResponseKind, deprecate_eof: bool) -> Self {
        ResponseParser {
            state: match kind {
                ResponseKind::Fetch => State::Rows,
                ResponseKind::FieldList => State::FieldDefs,
                _ => State::First,
            },
            kind,
            deprecate_eof,
            last_status: None,
            errored: false,
            oks: 0,
            result_sets: 0,
            prepare_ok: None,
            rows: 0,
            affected: 0,
            err_code: None,
            tracked: false,
        }
    }

    /// Whether the packet just fed carries session state information (see
    /// [`ResponseParser::tracked`]); asking clears it.
    pub fn take_tracked(&mut self) -> bool {
        std::mem::take(&mut self.tracked)
    }

    /// Notes an OK-shaped packet's status flags.
    fn ok_status(&mut self, status: Option<u16>) {
        self.tracked = status.is_some_and(|s| s & packets::SESSION_STATE_CHANGED != 0);
    }

    /// True once the response is complete.
    pub fn is_done(&self) -> bool {
        self.state == State::Finished
    }

    /// Packets bigger than this are rows (or continuation data): the caller may feed
    /// only their first bytes. Everything smaller must be fed whole.
    pub const WHOLE_PACKET_LIMIT: usize = 1 << 20;

    fn is_terminator(&self, first: u8, len: usize) -> bool {
        first == EOF
            && if self.deprecate_eof {
                len < crate::wire::MAX_PAYLOAD
            } else {
                len < 9
            }
    }

    fn violation(&self, detail: String) -> ProtocolViolation {
        ProtocolViolation {
            state: match self.state {
                State::First => "response start",
                State::Columns(_) | State::ColumnsEof => "column definitions",
                State::Rows => "rows",
                State::PrepareParams(..) | State::PrepareParamsEof(_) => "prepare parameters",
                State::PrepareColumns(_) | State::PrepareColumnsEof => "prepare columns",
                State::FieldDefs => "field list",
                State::Finished => "finished response",
            },
            detail,
        }
    }

    /// After a statement result: more results follow, or the response is done.
    fn after_result(&mut self, status_flags: Option<u16>) -> Step {
        if status_flags.is_some() {
            self.last_status = status_flags;
        }
        if status_flags.unwrap_or(0) & status::MORE_RESULTS_EXISTS != 0 && self.kind.multi_result()
        {
            self.state = State::First;
            Step::More
        } else {
            self.state = State::Finished;
            Step::Done
        }
    }

    fn finish_err(&mut self, payload: &[u8]) -> Step {
        self.errored = true;
        self.err_code = payload.get(1..3).map(|b| u16::from_le_bytes([b[0], b[1]]));
        self.state = State::Finished;
        Step::Done
    }

    /// Feeds one physical packet that starts a logical packet. `payload` is the whole
    /// payload when `len <= WHOLE_PACKET_LIMIT`, else at least its first byte.
    pub fn feed(&mut self, payload: &[u8], len: usize) -> Result<Step, ProtocolViolation> {
        if self.kind == ResponseKind::Single {
            return Ok(self.feed_single(payload));
        }
        // No response packet of any state is empty (a row has at least one column).
        let Some(&first) = payload.first() else {
            return Err(self.violation("empty packet".into()));
        };
        match self.state {
            State::First => self.feed_first(payload, len, first),
            State::Columns(n) => {
                if first == ERR {
                    return Ok(self.finish_err(payload));
                }
                self.state = if n > 1 {
                    State::Columns(n - 1)
                } else if self.deprecate_eof {
                    State::Rows
                } else {
                    State::ColumnsEof
                };
                Ok(Step::More)
            }
            State::ColumnsEof => self.feed_columns_eof(payload, len, first),
            State::Rows => {
                if first == ERR && len <= Self::WHOLE_PACKET_LIMIT {
                    return Ok(self.finish_err(payload));
                }
                if self.is_terminator(first, len) {
                    let st = packets::terminator_status(payload, self.deprecate_eof);
                    if self.deprecate_eof && payload.len() > 5 {
                        self.ok_status(st);
                    }
                    return Ok(self.after_result(st));
                }
                self.rows += 1;
                Ok(Step::More)
            }
            State::FieldDefs => {
                if first == ERR {
                    return Ok(self.finish_err(payload));
                }
                if self.is_terminator(first, len) {
                    self.last_status = packets::terminator_status(payload, self.deprecate_eof)
                        .or(self.last_status);
                    self.state = State::Finished;
                    return Ok(Step::Done);
                }
                Ok(Step::More)
            }
            State::PrepareParams(n, cols) => {
                self.state = State::PrepareParams(n.saturating_sub(1), cols);
                if n == 0 {
                    return Err(self.violation("too many parameter definitions".into()));
                }
                if n == 1 {
                    self.state = if self.deprecate_eof {
                        State::PrepareColumns(cols)
                    } else {
                        State::PrepareParamsEof(cols)
                    };
                    return Ok(self.prepare_next());
                }
                Ok(Step::More)
            }
            State::PrepareParamsEof(cols) => {
                if !self.is_terminator(first, len) {
                    return Err(self.violation(format!("expected EOF, got {first:#04x}")));
                }
                self.state = State::PrepareColumns(cols);
                Ok(self.prepare_next())
            }
            State::PrepareColumns(n) => {
                if n == 0 {
                    return Err(self.violation("too many column definitions".into()));
                }
                self.state = if n > 1 {
                    State::PrepareColumns(n - 1)
                } else if self.deprecate_eof {
                    State::Finished
                } else {
                    State::PrepareColumnsEof
                };
                Ok(if self.is_done() {
                    Step::Done
                } else {
                    Step::More
                })
            }
            State::PrepareColumnsEof => {
                if !self.is_terminator(first, len) {
                    return Err(self.violation(format!("expected EOF, got {first:#04x}")));
                }
                self.state = State::Finished;
                Ok(Step::Done)
            }
            State::Finished => Err(self.violation("data after the end of a response".into())),
        }
    }

    /// [`ResponseParser::feed`] for a response of a single packet (OK or ERR).
    fn feed_single(&mut self, payload: &[u8]) -> Step {
        if let Some(&b) = payload.first() {
            if b == OK || b == EOF {
                let ok = packets::parse_ok(payload).map(|o| o.status);
                if b == OK {
                    self.ok_status(ok);
                }
                self.last_status = ok.or_else(|| packets::terminator_status(payload, false));
            }
            self.errored = b == ERR;
            if self.errored {
                self.err_code = payload.get(1..3).map(|c| u16::from_le_bytes([c[0], c[1]]));
            }
        }
        self.state = State::Finished;
        Step::Done
    }

    /// [`ResponseParser::feed`] for the first packet of a response: OK (or a prepare
    /// OK), ERR, a LOCAL INFILE request, or a result set's column count. `first` is
    /// the payload's first byte.
    fn feed_first(
        &mut self,
        payload: &[u8],
        len: usize,
        first: u8,
    ) -> Result<Step, ProtocolViolation> {
        match first {
            OK if self.kind == ResponseKind::Prepare => {
                if payload.len() < 9 {
                    return Err(self.violation("short prepare OK".into()));
                }
                let p = PrepareOk {
                    statement_id: u32::from_le_bytes([
                        payload[1], payload[2], payload[3], payload[4],
                    ]),
                    columns: u16::from_le_bytes([payload[5], payload[6]]),
                    params: u16::from_le_bytes([payload[7], payload[8]]),
                };
                self.prepare_ok = Some(p);
                self.state = State::PrepareParams(p.params, p.columns);
                Ok(self.prepare_next())
            }
            OK => {
                self.oks += 1;
                let ok = packets::parse_ok(payload);
                let st = ok.map(|o| o.status);
                let Some(ok) = ok else {
                    return Err(self.violation("short OK packet".into()));
                };
                self.affected = self.affected.saturating_add(ok.affected_rows);
                self.ok_status(st);
                Ok(self.after_result(st))
            }
            ERR => Ok(self.finish_err(payload)),
            LOCAL_INFILE if self.kind.multi_result() => Ok(Step::LocalInfile),
            _ if self.kind.multi_result() && len <= Self::WHOLE_PACKET_LIMIT => {
                match lenenc_int(payload) {
                    Some((n, used)) if n > 0 && used == payload.len() => {
                        self.result_sets += 1;
                        self.state = State::Columns(n);
                        Ok(Step::More)
                    }
                    _ => Err(self.violation(format!(
                        "expected OK, ERR or column count, got {first:#04x} ({len} bytes)"
                    ))),
                }
            }
            _ => Err(self.violation(format!("unexpected first byte {first:#04x}"))),
        }
    }

    /// [`ResponseParser::feed`] for the EOF packet after a result set's column
    /// definitions (or an ERR in its place). `first` is the payload's first byte.
    fn feed_columns_eof(
        &mut self,
        payload: &[u8],
        len: usize,
        first: u8,
    ) -> Result<Step, ProtocolViolation> {
        if first == ERR {
            return Ok(self.finish_err(payload));
        }
        if !self.is_terminator(first, len) {
            return Err(self.violation(format!("expected EOF, got {first:#04x}")));
        }
        let st = packets::terminator_status(payload, false);
        self.last_status = st.or(self.last_status);
        if self.cursor_opened(st.unwrap_or(0)) {
            self.state = State::Finished;
            return Ok(Step::Done);
        }
        self.state = State::Rows;
        Ok(Step::More)
    }

    /// Whether the status flags of the EOF after a result set's column definitions say
    /// that the server opened a cursor, so that no rows follow (they come later through
    /// COM_STMT_FETCH).
    ///
    /// CURSOR_EXISTS means that only in the response to a COM_STMT_EXECUTE that asked
    /// for a cursor, and only without MORE_RESULTS_EXISTS (a cursor is opened for a
    /// statement with a single result set). Elsewhere the server sets it whenever a
    /// cursor of a stored procedure is open: the result sets of `CALL p()` carry it in
    /// both EOF packets, with MORE_RESULTS_EXISTS, over the text and the binary
    /// protocol alike, with or without a cursor requested, and their rows follow.
    fn cursor_opened(&self, status_flags: u16) -> bool {
        matches!(self.kind, ResponseKind::Execute { cursor: true })
            && status_flags & status::CURSOR_EXISTS != 0
            && status_flags & status::MORE_RESULTS_EXISTS == 0
    }

    /// Called after the LOCAL INFILE data was relayed: the server answers OK or ERR.
    pub fn infile_sent(&mut self) {
        self.state = State::First;
    }

    /// Skips empty sections of a prepare response.
    fn prepare_next(&mut self) -> Step {
        loop {
            match self.state {
                State::PrepareParams(0, cols) => self.state = State::PrepareColumns(cols),
                State::PrepareColumns(0) => {
                    self.state = State::Finished;
                    return Step::Done;
                }
                _ => return Step::More,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p: &mut ResponseParser, packets: &[&[u8]]) -> Vec<Step> {
        packets
            .iter()
            .map(|pk| p.feed(pk, pk.len()).unwrap())
            .collect()
    }

    const COLDEF: &[u8] =
        b"\x03def\x00\x00\x00\x01a\x00\x0c\x3f\x00\x0b\x00\x00\x00\x03\x01\x00\x00\x00\x00";
    const EOF_PKT: &[u8] = &[0xFE, 0, 0, 0x02, 0x00];
    const EOF_MORE: &[u8] = &[0xFE, 0, 0, 0x0A, 0x00];
    const OK_PKT: &[u8] = &[0x00, 1, 0, 0x02, 0x00, 0, 0];
    const OK_MORE: &[u8] = &[0x00, 1, 0, 0x0A, 0x00, 0, 0];
    const OK_TERM: &[u8] = &[0xFE, 0, 0, 0x02, 0x00, 0, 0];

    #[test]
    fn ok_and_err() {
        let mut p = ResponseParser::new(ResponseKind::Generic, false);
        assert_eq!(run(&mut p, &[OK_PKT]), vec![Step::Done]);
        assert_eq!(p.last_status, Some(2));
        let mut p = ResponseParser::new(ResponseKind::Generic, false);
        let err = packets::err_payload(1146, b"42S02", "no table");
        assert_eq!(run(&mut p, &[&err]), vec![Step::Done]);
        assert!(p.errored);
    }

    #[test]
    fn result_set_with_and_without_eof() {
        let mut p = ResponseParser::new(ResponseKind::Generic, false);
        let steps = run(
            &mut p,
            &[&[2], COLDEF, COLDEF, EOF_PKT, b"\x011\x012", EOF_PKT],
        );
        assert_eq!(steps.last(), Some(&Step::Done));
        assert!(steps[..5].iter().all(|s| *s == Step::More));
        let mut p = ResponseParser::new(ResponseKind::Generic, true);
        let steps = run(&mut p, &[&[1], COLDEF, b"\x011", OK_TERM]);
        assert_eq!(steps, vec![Step::More, Step::More, Step::More, Step::Done]);
    }

    #[test]
    fn multiple_results() {
        let mut p = ResponseParser::new(ResponseKind::Generic, false);
        let steps = run(
            &mut p,
            &[OK_MORE, &[1], COLDEF, EOF_PKT, b"\x011", EOF_MORE, OK_PKT],
        );
        assert_eq!(steps.last(), Some(&Step::Done));
        assert_eq!(steps.iter().filter(|s| **s == Step::Done).count(), 1);
        assert_eq!(p.result_sets, 1);
        assert_eq!(p.oks, 2);
    }

    #[test]
    fn row_starting_with_fe_is_data() {
        // A text row whose first value is ≥ 16 MiB starts with 0xFE but is long.
        let mut p = ResponseParser::new(ResponseKind::Generic, true);
        run(&mut p, &[&[1], COLDEF]);
        let big = [0xFEu8, 0, 0, 0, 1, 0, 0, 0, 0];
        assert_eq!(
            p.feed(&big[..1], crate::wire::MAX_PAYLOAD).unwrap(),
            Step::More
        );
        let mut p = ResponseParser::new(ResponseKind::Generic, false);
        run(&mut p, &[&[1], COLDEF, EOF_PKT]);
        assert_eq!(p.feed(&big, big.len()).unwrap(), Step::More);
    }

    #[test]
    fn err_in_the_middle_of_rows() {
        let mut p = ResponseParser::new(ResponseKind::Generic, false);
        let err = packets::err_payload(1317, b"70100", "interrupted");
        let steps = run(&mut p, &[&[1], COLDEF, EOF_PKT, b"\x011", &err]);
        assert_eq!(steps.last(), Some(&Step::Done));
        assert!(p.errored);
    }

    #[test]
    fn local_infile() {
        let mut p = ResponseParser::new(ResponseKind::Generic, false);
        assert_eq!(run(&mut p, &[b"\xFB/tmp/x.csv"]), vec![Step::LocalInfile]);
        p.infile_sent();
        assert_eq!(run(&mut p, &[OK_PKT]), vec![Step::Done]);
    }

    #[test]
    fn prepare_variants() {
        let prep = |cols: u16, params: u16| {
            let mut v = vec![0u8, 7, 0, 0, 0];
            v.extend_from_slice(&cols.to_le_bytes());
            v.extend_from_slice(&params.to_le_bytes());
            v.extend_from_slice(&[0, 0, 0]);
            v
        };
        let mut p = ResponseParser::new(ResponseKind::Prepare, false);
        assert_eq!(run(&mut p, &[&prep(0, 0)]), vec![Step::Done]);
        assert_eq!(p.prepare_ok.unwrap().statement_id, 7);
        let mut p = ResponseParser::new(ResponseKind::Prepare, false);
        let s = run(
            &mut p,
            &[&prep(1, 2), COLDEF, COLDEF, EOF_PKT, COLDEF, EOF_PKT],
        );
        assert_eq!(s.last(), Some(&Step::Done));
        assert_eq!(s.iter().filter(|x| **x == Step::Done).count(), 1);
        let mut p = ResponseParser::new(ResponseKind::Prepare, true);
        let s = run(&mut p, &[&prep(1, 2), COLDEF, COLDEF, COLDEF]);
        assert_eq!(s, vec![Step::More, Step::More, Step::More, Step::Done]);
        let mut p = ResponseParser::new(ResponseKind::Prepare, true);
        let s = run(&mut p, &[&prep(0, 1), COLDEF]);
        assert_eq!(s, vec![Step::More, Step::Done]);
    }

    #[test]
    fn cursor_ends_after_metadata() {
        // A COM_STMT_EXECUTE that asked for a cursor, answered by an opened cursor:
        // column definitions, then an EOF with CURSOR_EXISTS and nothing more.
        let eof_cursor: &[u8] = &[0xFE, 0, 0, 0x42, 0x00];
        let mut p = ResponseParser::new(ResponseKind::Execute { cursor: true }, false);
        let s = run(&mut p, &[&[1], COLDEF, eof_cursor]);
        assert_eq!(s, vec![Step::More, Step::More, Step::Done]);
        assert_eq!(p.last_status, Some(0x42));
        // Under DEPRECATE_EOF MariaDB ends the metadata with the 0xFE OK packet
        // (measured) or a classic EOF; either ends the response.
        for term in [&[0xFE, 0, 0, 0x42, 0x00, 0, 0][..], eof_cursor] {
            let mut p = ResponseParser::new(ResponseKind::Execute { cursor: true }, true);
            let s = run(&mut p, &[&[1], COLDEF, term]);
            assert_eq!(s, vec![Step::More, Step::More, Step::Done], "{term:?}");
        }
        // The rows come with COM_STMT_FETCH.
        let mut p = ResponseParser::new(ResponseKind::Fetch, false);
        let s = run(&mut p, &[b"\x00\x00\x01", &[0xFE, 0, 0, 0xC2, 0]]);
        assert_eq!(s, vec![Step::More, Step::Done]);
    }

    /// `CALL p()` of `CREATE PROCEDURE p() BEGIN DECLARE c CURSOR FOR SELECT a FROM t;
    /// OPEN c; SELECT 4; CLOSE c; END`, as MariaDB 10.11 answers it: CURSOR_EXISTS
    /// (0x40) with MORE_RESULTS_EXISTS in both EOF packets of the SELECT's result set,
    /// whose row follows, then the CALL's OK.
    const CALL_EOF: &[u8] = &[0xFE, 0, 0, 0x69, 0x00];
    const CALL_OK: &[u8] = &[0x00, 0, 0, 0x21, 0x00, 0, 0];

    #[test]
    fn cursor_flag_of_a_procedure_does_not_end_a_text_result() {
        let mut p = ResponseParser::new(ResponseKind::Generic, false);
        let s = run(
            &mut p,
            &[&[1], COLDEF, CALL_EOF, b"\x014", CALL_EOF, CALL_OK],
        );
        assert_eq!(s.iter().filter(|x| **x == Step::Done).count(), 1);
        assert_eq!(s.last(), Some(&Step::Done));
        assert_eq!((p.result_sets, p.oks), (1, 1));
        assert_eq!(p.last_status, Some(0x21));
        // Under DEPRECATE_EOF: no EOF after the metadata, an OK-shaped terminator.
        let mut p = ResponseParser::new(ResponseKind::Generic, true);
        let term: &[u8] = &[0xFE, 0, 0, 0x69, 0x00, 0, 0];
        let s = run(&mut p, &[&[1], COLDEF, b"\x014", term, CALL_OK]);
        assert_eq!(
            s,
            vec![Step::More, Step::More, Step::More, Step::More, Step::Done]
        );
        // Without MORE_RESULTS_EXISTS too: a text result never opens a cursor.
        let eof_cursor: &[u8] = &[0xFE, 0, 0, 0x42, 0x00];
        let mut p = ResponseParser::new(ResponseKind::Generic, false);
        let s = run(&mut p, &[&[1], COLDEF, eof_cursor, b"\x014", eof_cursor]);
        assert_eq!(
            s,
            vec![Step::More, Step::More, Step::More, Step::More, Step::Done]
        );
    }

    #[test]
    fn cursor_flag_of_a_procedure_does_not_end_an_execute() {
        // A prepared CALL: the same flags with binary rows, whether the execute asked
        // for a cursor or not (the server opens none for a CALL).
        let row: &[u8] = b"\x00\x00\x04\x00\x00\x00";
        for cursor in [false, true] {
            let mut p = ResponseParser::new(ResponseKind::Execute { cursor }, false);
            let s = run(&mut p, &[&[1], COLDEF, CALL_EOF, row, CALL_EOF, CALL_OK]);
            assert_eq!(
                s.iter().filter(|x| **x == Step::Done).count(),
                1,
                "{cursor}"
            );
            assert_eq!(s.last(), Some(&Step::Done), "{cursor}");
            let mut p = ResponseParser::new(ResponseKind::Execute { cursor }, true);
            let term: &[u8] = &[0xFE, 0, 0, 0x69, 0x00, 0, 0];
            let s = run(&mut p, &[&[1], COLDEF, row, term, CALL_OK]);
            assert_eq!(s.last(), Some(&Step::Done), "{cursor}");
            assert_eq!(
                s.iter().filter(|x| **x == Step::Done).count(),
                1,
                "{cursor}"
            );
        }
        // No cursor asked for: CURSOR_EXISTS alone does not end the metadata either.
        let eof_cursor: &[u8] = &[0xFE, 0, 0, 0x42, 0x00];
        let mut p = ResponseParser::new(ResponseKind::Execute { cursor: false }, false);
        let s = run(&mut p, &[&[1], COLDEF, eof_cursor, row, EOF_PKT]);
        assert_eq!(
            s,
            vec![Step::More, Step::More, Step::More, Step::More, Step::Done]
        );
    }

    #[test]
    fn execute_kind_reads_the_cursor_flags() {
        let exec = |flags: u8| [0x17, 1, 0, 0, 0, flags, 1, 0, 0, 0];
        assert_eq!(
            ResponseKind::execute(&exec(0)),
            ResponseKind::Execute { cursor: false }
        );
        for flags in [1, 2, 4, 0x09] {
            assert_eq!(
                ResponseKind::execute(&exec(flags)),
                ResponseKind::Execute { cursor: true },
                "{flags}"
            );
        }
        assert_eq!(
            ResponseKind::execute(&exec(0x08)),
            ResponseKind::Execute { cursor: false }
        );
        // A short command (the server answers it with an error).
        assert_eq!(
            ResponseKind::execute(&[0x17, 1]),
            ResponseKind::Execute { cursor: false }
        );
    }

    #[test]
    fn field_list_and_single() {
        let mut p = ResponseParser::new(ResponseKind::FieldList, false);
        assert_eq!(
            run(&mut p, &[COLDEF, COLDEF, EOF_PKT]).last(),
            Some(&Step::Done)
        );
        let mut p = ResponseParser::new(ResponseKind::Single, false);
        assert_eq!(run(&mut p, &[b"Uptime: 5  Threads: 1"]), vec![Step::Done]);
    }

    #[test]
    fn garbage_is_a_violation_not_a_panic() {
        for junk in [&[][..], &[0xFE][..], &[0xFC, 1][..], &[0x00][..]] {
            let mut p = ResponseParser::new(ResponseKind::Generic, false);
            assert!(p.feed(junk, junk.len()).is_err(), "{junk:?}");
        }
        let mut p = ResponseParser::new(ResponseKind::Prepare, false);
        assert!(p.feed(&[0, 1], 2).is_err());
        let mut p = ResponseParser::new(ResponseKind::Generic, false);
        run(&mut p, &[OK_PKT]);
        assert!(p.feed(OK_PKT, OK_PKT.len()).is_err());
    }
}
