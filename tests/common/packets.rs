//! Decoders for the packets tests assert on: OK, ERR, EOF, column definitions, and a
//! hex dump for failure messages. Written from the protocol documentation, independent
//! of the proxy's code.

use std::fmt;

/// Server status flags (OK / EOF packets).
pub mod status {
    pub const IN_TRANS: u16 = 0x0001;
    pub const AUTOCOMMIT: u16 = 0x0002;
    pub const MORE_RESULTS_EXISTS: u16 = 0x0008;
    pub const NO_GOOD_INDEX_USED: u16 = 0x0010;
    pub const NO_INDEX_USED: u16 = 0x0020;
    pub const CURSOR_EXISTS: u16 = 0x0040;
    pub const LAST_ROW_SENT: u16 = 0x0080;
    pub const DB_DROPPED: u16 = 0x0100;
    pub const NO_BACKSLASH_ESCAPES: u16 = 0x0200;
    pub const METADATA_CHANGED: u16 = 0x0400;
    pub const QUERY_WAS_SLOW: u16 = 0x0800;
    pub const PS_OUT_PARAMS: u16 = 0x1000;
    pub const IN_TRANS_READONLY: u16 = 0x2000;
    pub const SESSION_STATE_CHANGED: u16 = 0x4000;
}

/// Column flags that follow the plan MariaDB picks for a read, not the table: a read
/// whose rows go through a temporary table (a join or subquery sorted there, a
/// grouped read) loses the key flags (PRI_KEY, UNIQUE_KEY, MULTIPLE_KEY, PART_KEY),
/// AUTO_INCREMENT and the group flag. Two tables of the same rows whose statistics
/// differ, or a rewritten read and the original, may be planned differently: either
/// form is the plain table's answer.
pub const FLAGS_BY_PLAN: u16 = 0x0002 | 0x0004 | 0x0008 | 0x0200 | 0x4000 | 0x8000;

/// [`FLAGS_BY_PLAN`] and BINARY, which the plan of a grouped read sets too.
pub const GROUPED_FLAGS_BY_PLAN: u16 = FLAGS_BY_PLAN | 0x0080;

/// One logical packet (fragments of a >= 16 MiB payload are joined; `seq` is the
/// sequence id of the first fragment).
#[derive(Clone, PartialEq, Eq)]
pub struct Packet {
    /// Sequence id as sent on the wire.
    pub seq: u8,
    /// Payload without the 4-byte header.
    pub payload: Vec<u8>,
}

impl Packet {
    /// First payload byte (0 for an empty payload).
    pub fn header(&self) -> u8 {
        self.payload.first().copied().unwrap_or(0)
    }

    /// OK packet (0x00 header, at least 7 bytes).
    pub fn is_ok(&self) -> bool {
        self.header() == 0x00 && self.payload.len() >= 7
    }

    /// ERR packet.
    pub fn is_err(&self) -> bool {
        self.header() == 0xFF
    }

    /// Classic EOF packet (0xFE header, shorter than 9 bytes).
    pub fn is_eof(&self) -> bool {
        self.header() == 0xFE && self.payload.len() < 9
    }

    /// Decodes as OK (header 0x00, or 0xFE for the OK that replaces EOF).
    pub fn ok(&self) -> Option<OkPacket> {
        parse_ok(&self.payload)
    }

    /// Decodes as ERR.
    pub fn err(&self) -> Option<ErrPacket> {
        parse_err(&self.payload)
    }
}

impl fmt::Debug for Packet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} {}", self.seq, describe(&self.payload))
    }
}

/// A decoded OK packet (without SESSION_TRACK: the rest of the payload is `info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OkPacket {
    pub header: u8,
    pub affected_rows: u64,
    pub last_insert_id: u64,
    pub status: u16,
    pub warnings: u16,
    pub info: String,
}

/// A decoded ERR packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrPacket {
    pub code: u16,
    /// Five characters, empty if the packet has no `#` marker.
    pub sqlstate: String,
    pub message: String,
}

impl fmt::Display for ErrPacket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ERROR {} ({}): {}",
            self.code, self.sqlstate, self.message
        )
    }
}

/// A decoded EOF packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EofPacket {
    pub warnings: u16,
    pub status: u16,
}

/// A decoded column definition (Protocol::ColumnDefinition41).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnDef {
    pub catalog: Vec<u8>,
    pub schema: Vec<u8>,
    pub table: Vec<u8>,
    pub org_table: Vec<u8>,
    pub name: Vec<u8>,
    pub org_name: Vec<u8>,
    pub charset: u16,
    pub length: u32,
    pub column_type: u8,
    pub flags: u16,
    pub decimals: u8,
}

/// Reads a length-encoded integer at `*pos`, advancing it. `None` for NULL (0xFB),
/// a 0xFF byte, or truncated input.
pub fn read_lenenc(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let first = *buf.get(*pos)?;
    let (len, value) = match first {
        0..=0xFA => return Some(advance(pos, 1, first as u64)),
        0xFC => (2, 0),
        0xFD => (3, 0),
        0xFE => (8, 0),
        _ => return None,
    };
    let bytes = buf.get(*pos + 1..*pos + 1 + len)?;
    let mut v = value;
    for (i, b) in bytes.iter().enumerate() {
        v |= (*b as u64) << (8 * i);
    }
    *pos += 1 + len;
    Some(v)
}

fn advance(pos: &mut usize, by: usize, value: u64) -> u64 {
    *pos += by;
    value
}

/// Reads a length-encoded string at `*pos`, advancing it.
pub fn read_lenenc_str<'a>(buf: &'a [u8], pos: &mut usize) -> Option<&'a [u8]> {
    let len = read_lenenc(buf, pos)? as usize;
    let s = buf.get(*pos..*pos + len)?;
    *pos += len;
    Some(s)
}

/// Encodes a length-encoded integer.
pub fn write_lenenc(out: &mut Vec<u8>, v: u64) {
    match v {
        0..=0xFA => out.push(v as u8),
        0xFB..=0xFFFF => {
            out.push(0xFC);
            out.extend_from_slice(&(v as u16).to_le_bytes());
        }
        0x1_0000..=0xFF_FFFF => {
            out.push(0xFD);
            out.extend_from_slice(&(v as u32).to_le_bytes()[..3]);
        }
        _ => {
            out.push(0xFE);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

fn u16_at(buf: &[u8], pos: usize) -> Option<u16> {
    Some(u16::from_le_bytes([*buf.get(pos)?, *buf.get(pos + 1)?]))
}

/// Decodes an OK packet (header 0x00 or 0xFE).
pub fn parse_ok(p: &[u8]) -> Option<OkPacket> {
    let header = *p.first()?;
    if header != 0x00 && header != 0xFE {
        return None;
    }
    let mut pos = 1;
    let affected_rows = read_lenenc(p, &mut pos)?;
    let last_insert_id = read_lenenc(p, &mut pos)?;
    let status = u16_at(p, pos)?;
    let warnings = u16_at(p, pos + 2)?;
    let info = String::from_utf8_lossy(p.get(pos + 4..).unwrap_or_default()).into_owned();
    Some(OkPacket {
        header,
        affected_rows,
        last_insert_id,
        status,
        warnings,
        info,
    })
}

/// Decodes an ERR packet.
pub fn parse_err(p: &[u8]) -> Option<ErrPacket> {
    if *p.first()? != 0xFF {
        return None;
    }
    let code = u16_at(p, 1)?;
    let (sqlstate, msg_start) = if p.get(3) == Some(&b'#') && p.len() >= 9 {
        (String::from_utf8_lossy(&p[4..9]).into_owned(), 9)
    } else {
        (String::new(), 3)
    };
    Some(ErrPacket {
        code,
        sqlstate,
        message: String::from_utf8_lossy(p.get(msg_start..).unwrap_or_default()).into_owned(),
    })
}

/// Decodes a classic EOF packet.
pub fn parse_eof(p: &[u8]) -> Option<EofPacket> {
    if *p.first()? != 0xFE || p.len() >= 9 {
        return None;
    }
    Some(EofPacket {
        warnings: u16_at(p, 1).unwrap_or(0),
        status: u16_at(p, 3).unwrap_or(0),
    })
}

/// Decodes a column definition packet.
pub fn parse_column_def(p: &[u8]) -> Option<ColumnDef> {
    let mut pos = 0;
    let catalog = read_lenenc_str(p, &mut pos)?.to_vec();
    let schema = read_lenenc_str(p, &mut pos)?.to_vec();
    let table = read_lenenc_str(p, &mut pos)?.to_vec();
    let org_table = read_lenenc_str(p, &mut pos)?.to_vec();
    let name = read_lenenc_str(p, &mut pos)?.to_vec();
    let org_name = read_lenenc_str(p, &mut pos)?.to_vec();
    let _fixed_len = read_lenenc(p, &mut pos)?;
    let charset = u16_at(p, pos)?;
    let length = u32::from_le_bytes(p.get(pos + 2..pos + 6)?.try_into().ok()?);
    Some(ColumnDef {
        catalog,
        schema,
        table,
        org_table,
        name,
        org_name,
        charset,
        length,
        column_type: *p.get(pos + 6)?,
        flags: u16_at(p, pos + 7)?,
        decimals: *p.get(pos + 9)?,
    })
}

/// Decodes a text-protocol row into cells (`None` = NULL).
pub fn parse_text_row(p: &[u8]) -> Option<Vec<Option<Vec<u8>>>> {
    let mut pos = 0;
    let mut cells = Vec::new();
    while pos < p.len() {
        if p[pos] == 0xFB {
            pos += 1;
            cells.push(None);
        } else {
            cells.push(Some(read_lenenc_str(p, &mut pos)?.to_vec()));
        }
    }
    Some(cells)
}

/// One-line summary of a payload: OK/ERR/EOF decoded, anything else as hex. Without
/// context a binary-protocol row (also 0x00) is shown as if it were an OK packet, and
/// a short 0xFE OK (DEPRECATE_EOF) as an EOF.
pub fn describe(p: &[u8]) -> String {
    if let Some(e) = parse_err(p) {
        return format!("ERR {e}");
    }
    if p.first() == Some(&0x00) {
        if let Some(ok) = parse_ok(p) {
            return format!(
                "OK affected={} last_id={} status=0x{:04x} warnings={} info={:?}",
                ok.affected_rows, ok.last_insert_id, ok.status, ok.warnings, ok.info
            );
        }
    }
    if let Some(eof) = parse_eof(p) {
        return format!("EOF status=0x{:04x} warnings={}", eof.status, eof.warnings);
    }
    let shown = &p[..p.len().min(48)];
    let more = if p.len() > 48 { "…" } else { "" };
    format!("[{} bytes] {}{more}", p.len(), hex_line(shown))
}

/// Space-separated hex bytes.
pub fn hex_line(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Classic 16-bytes-a-line hex dump with offsets and ASCII.
pub fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, chunk) in bytes.chunks(16).enumerate() {
        let ascii: String = chunk
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!(
            "{:06x}  {:<48} {ascii}\n",
            i * 16,
            hex_line(chunk)
        ));
    }
    out
}

/// The rows of the first text result set in `packets`, each cell as a string.
pub fn text_rows(packets: &[Packet]) -> Vec<Vec<Option<String>>> {
    let first = packets.first().expect("empty response");
    assert!(
        !first.is_err() && !first.is_ok(),
        "expected a result set, got {packets:?}"
    );
    let mut pos = 0;
    let columns = read_lenenc(&first.payload, &mut pos).expect("column count") as usize;
    let mut rest = &packets[1 + columns..];
    if rest.first().is_some_and(|p| p.is_eof()) {
        rest = &rest[1..];
    }
    rest.iter()
        .take_while(|p| p.header() != 0xFE && !p.is_err())
        .map(|p| {
            parse_text_row(&p.payload)
                .expect("text row")
                .into_iter()
                .map(|c| c.map(|b| String::from_utf8_lossy(&b).into_owned()))
                .collect()
        })
        .collect()
}
