//! The few packets the proxy reads or writes itself.
//!
//! Hot-path reads (status flags of a terminator) are decoded by hand: they are a few
//! fixed offsets. Packets the proxy builds (ERR, OK) go through `mysql_common`.

use mysql_common::io::ParseBuf;
use mysql_common::misc::raw::int::LenEnc;
use mysql_common::misc::raw::RawInt;
use mysql_common::packets::{ErrPacket, ServerError, SqlState};
use mysql_common::proto::MySerialize;

/// Header byte of an OK packet.
pub const OK: u8 = 0x00;
/// Header byte of an ERR packet.
pub const ERR: u8 = 0xFF;
/// Header byte of an EOF packet (and of an OK packet that ends a result set when
/// CLIENT_DEPRECATE_EOF is in use).
pub const EOF: u8 = 0xFE;
/// Header byte of a LOCAL INFILE request.
pub const LOCAL_INFILE: u8 = 0xFB;

/// Reads a length-encoded integer at the start of `b`: (value, bytes used).
pub fn lenenc_int(b: &[u8]) -> Option<(u64, usize)> {
    let first = *b.first()?;
    let (n, used) = match first {
        0..=0xFA => return Some((first as u64, 1)),
        0xFC => (2, 3),
        0xFD => (3, 4),
        0xFE => (8, 9),
        _ => return None,
    };
    if b.len() < used {
        return None;
    }
    let mut v = 0u64;
    for (i, byte) in b[1..=n].iter().enumerate() {
        v |= (*byte as u64) << (8 * i);
    }
    Some((v, used))
}

/// Appends a length-encoded integer.
pub fn put_lenenc_int(out: &mut Vec<u8>, v: u64) {
    RawInt::<LenEnc>::new(v).serialize(out);
}

/// The fields of an OK packet the relay looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OkSummary {
    pub affected_rows: u64,
    pub last_insert_id: u64,
    pub status: u16,
    pub warnings: u16,
}

/// The warning count of the packet that ends a result set: an EOF packet, or with
/// CLIENT_DEPRECATE_EOF an OK packet with the EOF header. `None` for another packet.
pub fn end_of_rows_warnings(last: &[u8], deprecate_eof: bool) -> Option<u16> {
    if last.first() != Some(&EOF) {
        return None;
    }
    if deprecate_eof && last.len() > 5 {
        Some(parse_ok(last)?.warnings)
    } else {
        let b = last.get(1..3)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }
}

/// Parses the leading fields of an OK packet (header 0x00 or 0xFE).
pub fn parse_ok(payload: &[u8]) -> Option<OkSummary> {
    let mut pos = 1;
    let (affected_rows, n) = lenenc_int(payload.get(pos..)?)?;
    pos += n;
    let (last_insert_id, n) = lenenc_int(payload.get(pos..)?)?;
    pos += n;
    let b = payload.get(pos..pos + 4)?;
    Some(OkSummary {
        affected_rows,
        last_insert_id,
        status: u16::from_le_bytes([b[0], b[1]]),
        warnings: u16::from_le_bytes([b[2], b[3]]),
    })
}

/// The info string of an OK packet (`Rows matched: …`), if any.
pub fn ok_info(payload: &[u8]) -> Option<Vec<u8>> {
    let mut pos = 1;
    pos += lenenc_int(payload.get(pos..)?)?.1;
    pos += lenenc_int(payload.get(pos..)?)?.1;
    pos += 4;
    let rest = payload.get(pos..)?;
    let (n, used) = lenenc_int(rest)?;
    let n = usize::try_from(n).ok()?;
    let info = rest.get(used..used.checked_add(n)?)?;
    (!info.is_empty()).then(|| info.to_vec())
}

/// The number after `label` in an OK packet's info (`Records: 3  Duplicates: 1
/// Warnings: 0`).
pub fn info_count(info: &[u8], label: &[u8]) -> Option<u64> {
    let at = info.windows(label.len()).position(|w| w == label)? + label.len();
    let digits: Vec<u8> = info[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .copied()
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// Status flag: session state information follows in the OK packet.
pub const SESSION_STATE_CHANGED: u16 = 0x4000;

/// Builds an OK packet payload (header 0x00). Session-state information is never
/// included, so its status flag is cleared. An info string ending in `Warnings: N`
/// (`Records: 3  Duplicates: 0  Warnings: 0`) gets the packet's warning count, as the
/// server's own info does.
pub fn ok_payload(o: &OkSummary, info: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + info.map_or(0, <[u8]>::len));
    out.push(OK);
    put_lenenc_int(&mut out, o.affected_rows);
    put_lenenc_int(&mut out, o.last_insert_id);
    out.extend_from_slice(&(o.status & !SESSION_STATE_CHANGED).to_le_bytes());
    out.extend_from_slice(&o.warnings.to_le_bytes());
    if let Some(i) = info.filter(|i| !i.is_empty()) {
        const WARNINGS: &[u8] = b"Warnings: ";
        let counted = i
            .windows(WARNINGS.len())
            .rposition(|w| w == WARNINGS)
            .map(|at| at + WARNINGS.len())
            .filter(|&at| at < i.len() && i[at..].iter().all(u8::is_ascii_digit));
        match counted {
            Some(at) => {
                let count = o.warnings.to_string();
                put_lenenc_int(&mut out, (at + count.len()) as u64);
                out.extend_from_slice(&i[..at]);
                out.extend_from_slice(count.as_bytes());
            }
            None => {
                put_lenenc_int(&mut out, i.len() as u64);
                out.extend_from_slice(i);
            }
        }
    }
    out
}

/// Physical→logical name pairs for a rewritten statement's messages (see
/// `Engine::message_names`): each `from` is replaced by its `to`.
pub type Renames = [(Vec<u8>, Vec<u8>)];

/// `text` with every `from` of `names` replaced by its `to`; `None` when nothing
/// matched.
pub fn renamed(text: &[u8], names: &Renames) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    for (from, to) in names {
        let src = out.as_deref().unwrap_or(text);
        if from.is_empty() || !src.windows(from.len()).any(|w| w == from.as_slice()) {
            continue;
        }
        let mut next = Vec::with_capacity(src.len() + to.len());
        let mut at = 0;
        while at < src.len() {
            if src[at..].starts_with(from) {
                next.extend_from_slice(to);
                at += from.len();
            } else {
                next.push(src[at]);
                at += 1;
            }
        }
        out = Some(next);
    }
    out
}

/// An ERR payload with `names` applied to its message (the code and SQLSTATE stay);
/// `None` when it is not an ERR or nothing matched.
pub fn renamed_err(payload: &[u8], names: &Renames) -> Option<Vec<u8>> {
    if payload.first() != Some(&ERR) {
        return None;
    }
    // 0xFF, code (2), then '#' and a five-character SQLSTATE (protocol 4.1).
    let head = if payload.get(3) == Some(&b'#') { 9 } else { 3 };
    let message = renamed(payload.get(head..)?, names)?;
    let mut out = payload[..head].to_vec();
    out.extend_from_slice(&message);
    Some(out)
}

/// Status flags of a result-set terminator: a 5-byte EOF packet or an OK packet with
/// the 0xFE header.
pub fn terminator_status(payload: &[u8], deprecate_eof: bool) -> Option<u16> {
    if deprecate_eof && payload.len() > 5 {
        parse_ok(payload).map(|o| o.status)
    } else {
        let b = payload.get(3..5)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }
}

/// The fields of an ERR packet, decoded (for logs and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrInfo {
    pub code: u16,
    pub state: String,
    pub message: String,
}

/// Decodes an ERR packet payload (protocol 4.1 layout).
pub fn parse_err(payload: &[u8]) -> Option<ErrInfo> {
    let mut buf = ParseBuf(payload);
    let p: ErrPacket<'_> = buf
        .parse(mysql_common::constants::CapabilityFlags::CLIENT_PROTOCOL_41)
        .ok()?;
    match p {
        ErrPacket::Error(e) => Some(ErrInfo {
            code: e.error_code(),
            state: e
                .sql_state_ref()
                .map(|s| String::from_utf8_lossy(&s.as_bytes()).into_owned())
                .unwrap_or_default(),
            message: e.message_str().into_owned(),
        }),
        ErrPacket::Progress(_) => None,
    }
}

/// Builds an ERR packet payload.
pub fn err_payload(code: u16, state: &[u8; 5], message: &str) -> Vec<u8> {
    let err = ErrPacket::Error(ServerError::new(
        code,
        Some(SqlState::new(*state)),
        message.as_bytes(),
    ));
    let mut out = Vec::with_capacity(9 + message.len());
    err.serialize(&mut out);
    out
}

/// Well-known errors the proxy itself reports.
pub mod errors {
    /// ER_CON_COUNT_ERROR.
    pub const TOO_MANY_CONNECTIONS: (u16, &[u8; 5]) = (1040, b"08004");
    /// The backend cannot be reached (message as the client library's 2003). A
    /// server-range code: clients treat client-range codes (2000–2999) arriving from
    /// a server as a malformed packet. SQLSTATE 08S01 marks a connection failure.
    pub const CANT_CONNECT: (u16, &[u8; 5]) = (1429, b"08S01");
    /// The backend went away during a command (ER_NET_READ_ERROR; message as the
    /// client library's 2013, SQLSTATE 08S01: communication link failure).
    pub const SERVER_LOST: (u16, &[u8; 5]) = (1158, b"08S01");
    /// ER_UNKNOWN_ERROR: used for rule rejections and proxy-side failures.
    pub const UNKNOWN: (u16, &[u8; 5]) = (1105, b"HY000");
    /// ER_HANDSHAKE_ERROR.
    pub const BAD_HANDSHAKE: (u16, &[u8; 5]) = (1043, b"08S01");
    /// ER_NET_PACKETS_OUT_OF_ORDER-style protocol violation from the client.
    pub const PROTOCOL: (u16, &[u8; 5]) = (1156, b"08S01");
}

/// Builds an ERR payload from one of [`errors`].
pub fn err_of(kind: (u16, &[u8; 5]), message: &str) -> Vec<u8> {
    err_payload(kind.0, kind.1, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn err_round_trip() {
        let p = err_payload(1105, b"HY000", "heatsink rule 'x': nope");
        let e = parse_err(&p).unwrap();
        assert_eq!(e.code, 1105);
        assert_eq!(e.state, "HY000");
        assert_eq!(e.message, "heatsink rule 'x': nope");
        assert_eq!(p[0], ERR);
    }

    #[test]
    fn ok_fields() {
        // OK, affected 0xFC 0x10 0x27 (10000), insert id 5, status 0x0003, warnings 2
        let p = [0x00, 0xFC, 0x10, 0x27, 5, 3, 0, 2, 0];
        let o = parse_ok(&p).unwrap();
        assert_eq!(o.affected_rows, 10000);
        assert_eq!(o.last_insert_id, 5);
        assert_eq!(o.status, 3);
        assert_eq!(o.warnings, 2);
        assert!(parse_ok(&p[..6]).is_none());
    }

    #[test]
    fn ok_build_and_info() {
        let o = OkSummary {
            affected_rows: 1,
            last_insert_id: 0,
            status: 0x4002,
            warnings: 0,
        };
        let p = ok_payload(&o, Some(b"Rows matched: 1  Changed: 1  Warnings: 0"));
        let back = parse_ok(&p).unwrap();
        assert_eq!(back.affected_rows, 1);
        assert_eq!(back.status, 0x0002);
        assert_eq!(
            ok_info(&p).unwrap(),
            b"Rows matched: 1  Changed: 1  Warnings: 0"
        );
        assert_eq!(ok_info(&ok_payload(&o, None)), None);
    }

    #[test]
    fn terminators() {
        let eof = [0xFE, 1, 0, 0x22, 0x00];
        assert_eq!(terminator_status(&eof, false), Some(0x22));
        assert_eq!(terminator_status(&eof, true), Some(0x22));
        let ok = [0xFE, 0, 0, 0x0A, 0x00, 0, 0];
        assert_eq!(terminator_status(&ok, true), Some(0x0A));
    }

    #[test]
    fn lenenc() {
        assert_eq!(lenenc_int(&[0xFA]), Some((250, 1)));
        assert_eq!(lenenc_int(&[0xFD, 1, 2, 3]), Some((0x030201, 4)));
        assert_eq!(lenenc_int(&[0xFE, 1, 0, 0, 0, 0, 0, 0]), None);
        assert_eq!(lenenc_int(&[0xFF]), None);
        let mut v = Vec::new();
        put_lenenc_int(&mut v, 70000);
        assert_eq!(lenenc_int(&v), Some((70000, 4)));
    }

    #[test]
    fn info_carries_the_warning_count() {
        let o = OkSummary {
            affected_rows: 3,
            last_insert_id: 0,
            status: 2,
            warnings: 12,
        };
        let p = ok_payload(&o, Some(b"Records: 3  Duplicates: 0  Warnings: 0"));
        assert_eq!(
            ok_info(&p).as_deref(),
            Some(&b"Records: 3  Duplicates: 0  Warnings: 12"[..])
        );
        let p = ok_payload(&o, Some(b"Rows matched: 1  Changed: 1"));
        assert_eq!(
            ok_info(&p).as_deref(),
            Some(&b"Rows matched: 1  Changed: 1"[..])
        );
    }

    #[test]
    fn messages_name_the_logical_table() {
        let names = vec![(b"`.`ring`.`".to_vec(), b"`.`log`.`".to_vec())];
        let p = err_payload(
            1366,
            b"22007",
            "Incorrect integer value: 'x' for column `db`.`ring`.`v` at row 1",
        );
        let e = parse_err(&renamed_err(&p, &names).unwrap()).unwrap();
        assert_eq!(e.code, 1366);
        assert_eq!(e.state, "22007");
        assert_eq!(
            e.message,
            "Incorrect integer value: 'x' for column `db`.`log`.`v` at row 1"
        );
        let other = err_payload(1146, b"42S02", "Table 'db.ring' doesn't exist");
        assert_eq!(renamed_err(&other, &names), None);
        assert_eq!(
            renamed(b"`.`ring`.`a, `.`ring`.`b", &names).unwrap(),
            b"`.`log`.`a, `.`log`.`b"
        );
    }
}
