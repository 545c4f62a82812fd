//! Column definitions and binary-protocol rows, for the few result sets the proxy
//! must patch (reads of rewritten tables). Passthrough results never come here.

use super::packets::{lenenc_int, put_lenenc_int};

/// Column types (the `type` byte of a column definition) the patcher cares about.
pub mod types {
    pub const DECIMAL: u8 = 0x00;
    pub const TINY: u8 = 0x01;
    pub const SHORT: u8 = 0x02;
    pub const LONG: u8 = 0x03;
    pub const FLOAT: u8 = 0x04;
    pub const DOUBLE: u8 = 0x05;
    pub const NULL: u8 = 0x06;
    pub const TIMESTAMP: u8 = 0x07;
    pub const LONGLONG: u8 = 0x08;
    pub const INT24: u8 = 0x09;
    pub const DATE: u8 = 0x0a;
    pub const TIME: u8 = 0x0b;
    pub const DATETIME: u8 = 0x0c;
    pub const YEAR: u8 = 0x0d;
    pub const NEWDECIMAL: u8 = 0xf6;
}

/// Column flag: UNSIGNED.
pub const UNSIGNED_FLAG: u16 = 0x0020;

/// A protocol-4.1 column definition, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnDef {
    pub catalog: Vec<u8>,
    pub schema: Vec<u8>,
    pub table: Vec<u8>,
    pub org_table: Vec<u8>,
    pub name: Vec<u8>,
    pub org_name: Vec<u8>,
    /// MariaDB extended type information (`format=json`, `type=inet6`), present when
    /// MARIADB_CLIENT_EXTENDED_METADATA was negotiated; kept verbatim.
    pub extended: Option<Vec<u8>>,
    pub charset: u16,
    pub length: u32,
    pub column_type: u8,
    pub flags: u16,
    pub decimals: u8,
    /// Length of the fixed-size block (0x0c in every known server).
    pub fixed_len: u8,
    /// Bytes after the decimals byte (filler, COM_FIELD_LIST default values), verbatim.
    pub tail: Vec<u8>,
}

fn lenenc_str(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (n, used) = lenenc_int(b)?;
    let end = used.checked_add(usize::try_from(n).ok()?)?;
    Some((b.get(used..end)?, &b[end..]))
}

fn put_lenenc_str(out: &mut Vec<u8>, s: &[u8]) {
    put_lenenc_int(out, s.len() as u64);
    out.extend_from_slice(s);
}

impl ColumnDef {
    /// Decodes a column definition payload; `extended`: MariaDB extended metadata
    /// was negotiated (an extra block follows `org_name`).
    pub fn parse(p: &[u8], extended: bool) -> Option<ColumnDef> {
        let (catalog, r) = lenenc_str(p)?;
        let (schema, r) = lenenc_str(r)?;
        let (table, r) = lenenc_str(r)?;
        let (org_table, r) = lenenc_str(r)?;
        let (name, r) = lenenc_str(r)?;
        let (org_name, r) = lenenc_str(r)?;
        let (ext, r) = if extended {
            let (e, r) = lenenc_str(r)?;
            (Some(e.to_vec()), r)
        } else {
            (None, r)
        };
        let (fixed_len, used) = lenenc_int(r)?;
        let r = &r[used..];
        if !(10..=0xFA).contains(&fixed_len) || r.len() < 10 {
            return None;
        }
        Some(ColumnDef {
            catalog: catalog.to_vec(),
            schema: schema.to_vec(),
            table: table.to_vec(),
            org_table: org_table.to_vec(),
            name: name.to_vec(),
            org_name: org_name.to_vec(),
            extended: ext,
            charset: u16::from_le_bytes([r[0], r[1]]),
            length: u32::from_le_bytes([r[2], r[3], r[4], r[5]]),
            column_type: r[6],
            flags: u16::from_le_bytes([r[7], r[8]]),
            decimals: r[9],
            fixed_len: fixed_len as u8,
            tail: r[10..].to_vec(),
        })
    }

    /// Encodes the definition (inverse of [`ColumnDef::parse`]).
    pub fn serialize(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        for s in [
            &self.catalog,
            &self.schema,
            &self.table,
            &self.org_table,
            &self.name,
            &self.org_name,
        ] {
            put_lenenc_str(&mut out, s);
        }
        if let Some(e) = &self.extended {
            put_lenenc_str(&mut out, e);
        }
        out.push(self.fixed_len);
        out.extend_from_slice(&self.charset.to_le_bytes());
        out.extend_from_slice(&self.length.to_le_bytes());
        out.push(self.column_type);
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.push(self.decimals);
        out.extend_from_slice(&self.tail);
        out
    }
}

/// Byte length of one non-NULL binary-protocol value of `column_type` at the start of
/// `b`, or `None` if `b` is too short.
pub fn binary_value_len(column_type: u8, b: &[u8]) -> Option<usize> {
    use types::*;
    let n = match column_type {
        TINY => 1,
        SHORT | YEAR => 2,
        LONG | INT24 | FLOAT => 4,
        LONGLONG | DOUBLE => 8,
        NULL => 0,
        DATE | DATETIME | TIMESTAMP | TIME => 1 + *b.first()? as usize,
        _ => {
            let (n, used) = lenenc_int(b)?;
            used.checked_add(usize::try_from(n).ok()?)?
        }
    };
    (b.len() >= n).then_some(n)
}

/// Reads an integer value of an integer `column_type` (little-endian, `unsigned` per
/// the column flags) as i128.
pub(crate) fn read_int(column_type: u8, unsigned: bool, v: &[u8]) -> Option<i128> {
    use types::*;
    let width = match column_type {
        TINY => 1,
        SHORT | YEAR => 2,
        LONG | INT24 => 4,
        LONGLONG => 8,
        _ => return None,
    };
    let mut x: u64 = 0;
    for (i, b) in v.get(..width)?.iter().enumerate() {
        x |= (*b as u64) << (8 * i);
    }
    Some(if unsigned {
        x as i128
    } else {
        let shift = 64 - 8 * width as u32;
        (((x << shift) as i64) >> shift) as i128
    })
}

/// Writes `x` as an integer of `column_type`; `None` if it does not fit.
fn write_int(column_type: u8, unsigned: bool, x: i128, out: &mut Vec<u8>) -> Option<()> {
    use types::*;
    let width: u32 = match column_type {
        TINY => 1,
        SHORT | YEAR => 2,
        LONG | INT24 => 4,
        LONGLONG => 8,
        _ => return None,
    };
    let bits = 8 * width;
    let (lo, hi) = if unsigned {
        (0i128, (1i128 << bits) - 1)
    } else {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    };
    if x < lo || x > hi {
        return None;
    }
    let bytes = (x as i64 as u64).to_le_bytes();
    out.extend_from_slice(&bytes[..width as usize]);
    Some(())
}

/// How to turn a binary row of the rewritten statement into the row the original
/// statement would have produced: for each column, the type it arrives as and the
/// type the client expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowRecode {
    /// (arriving type, arriving unsigned, wanted type, wanted unsigned) per column.
    pub columns: Vec<(u8, bool, u8, bool)>,
}

impl RowRecode {
    /// True when no column changes its binary encoding.
    pub fn is_identity(&self) -> bool {
        self.columns
            .iter()
            .all(|&(a, _, w, _)| a == w || !is_int(a) || !is_int(w))
    }

    /// Re-encodes one binary row payload (`0x00`, NULL bitmap, values). `None` if the
    /// row is malformed or a value does not fit the wanted type.
    pub fn apply(&self, row: &[u8]) -> Option<Vec<u8>> {
        let n = self.columns.len();
        let bitmap_len = (n + 7 + 2) / 8;
        if row.first() != Some(&0) || row.len() < 1 + bitmap_len {
            return None;
        }
        let bitmap = &row[1..1 + bitmap_len];
        let mut out = Vec::with_capacity(row.len());
        out.extend_from_slice(&row[..1 + bitmap_len]);
        let mut rest = &row[1 + bitmap_len..];
        for (i, &(at, au, wt, wu)) in self.columns.iter().enumerate() {
            let bit = i + 2;
            if bitmap[bit / 8] & (1 << (bit % 8)) != 0 {
                continue;
            }
            let len = binary_value_len(at, rest)?;
            let v = &rest[..len];
            if at != wt && is_int(at) && is_int(wt) {
                write_int(wt, wu, read_int(at, au, v)?, &mut out)?;
            } else {
                out.extend_from_slice(v);
            }
            rest = &rest[len..];
        }
        rest.is_empty().then_some(out)
    }
}

fn is_int(t: u8) -> bool {
    use types::*;
    matches!(t, TINY | SHORT | YEAR | LONG | INT24 | LONGLONG)
}

/// A text-protocol row of these values (`None`: NULL).
pub fn text_row(cells: &[Option<&[u8]>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(cells.iter().map(|c| c.map_or(1, |v| v.len() + 9)).sum());
    for cell in cells {
        match cell {
            None => out.push(0xFB),
            Some(v) => {
                put_lenenc_int(&mut out, v.len() as u64);
                out.extend_from_slice(v);
            }
        }
    }
    out
}

/// The values of a text-protocol row (`None`: NULL); `None` when it does not parse.
pub fn text_cells(row: &[u8]) -> Option<Vec<Option<&[u8]>>> {
    let mut cells = Vec::new();
    let mut at = 0;
    while at < row.len() {
        if row[at] == 0xFB {
            cells.push(None);
            at += 1;
            continue;
        }
        let (n, used) = lenenc_int(row.get(at..)?)?;
        let start = at + used;
        let end = start.checked_add(usize::try_from(n).ok()?)?;
        cells.push(Some(row.get(start..end)?));
        at = end;
    }
    Some(cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(name: &str, t: u8, flags: u16) -> ColumnDef {
        ColumnDef {
            catalog: b"def".to_vec(),
            schema: b"shop".to_vec(),
            table: b"hits".to_vec(),
            org_table: b"hits".to_vec(),
            name: name.as_bytes().to_vec(),
            org_name: name.as_bytes().to_vec(),
            extended: None,
            charset: 63,
            length: 11,
            column_type: t,
            flags,
            decimals: 0,
            fixed_len: 0x0c,
            tail: vec![0, 0],
        }
    }

    #[test]
    fn column_def_round_trip() {
        let d = def("cnt", types::LONG, 1);
        let bytes = d.serialize();
        assert_eq!(ColumnDef::parse(&bytes, false), Some(d.clone()));
        assert!(ColumnDef::parse(&bytes[..bytes.len() - 5], false).is_none());
        assert!(ColumnDef::parse(&[0xFF], false).is_none());
        let mut e = d;
        e.extended = Some(b"\x01\x04json".to_vec());
        let bytes = e.serialize();
        assert_eq!(ColumnDef::parse(&bytes, true), Some(e));
    }

    #[test]
    fn recode_longlong_to_long_and_keeps_others() {
        // columns: varchar 'home', bigint 11 -> int, NULL bigint -> int
        let rc = RowRecode {
            columns: vec![
                (0xfd, false, 0xfd, false),
                (types::LONGLONG, false, types::LONG, false),
                (types::LONGLONG, false, types::LONG, false),
            ],
        };
        assert!(!rc.is_identity());
        let mut row = vec![0u8, 0b0001_0000];
        row.extend_from_slice(b"\x04home");
        row.extend_from_slice(&(-11i64).to_le_bytes());
        let out = rc.apply(&row).unwrap();
        let mut want = vec![0u8, 0b0001_0000];
        want.extend_from_slice(b"\x04home");
        want.extend_from_slice(&(-11i32).to_le_bytes());
        assert_eq!(out, want);
    }

    #[test]
    fn recode_refuses_overflow_and_garbage() {
        let rc = RowRecode {
            columns: vec![(types::LONGLONG, false, types::TINY, false)],
        };
        let mut row = vec![0u8, 0];
        row.extend_from_slice(&300i64.to_le_bytes());
        assert!(rc.apply(&row).is_none());
        assert!(rc.apply(&[0u8, 0, 1]).is_none());
        assert!(rc.apply(&[1u8]).is_none());
    }

    #[test]
    fn value_lengths() {
        assert_eq!(
            binary_value_len(types::DATETIME, &[7, 1, 2, 3, 4, 5, 6, 7]),
            Some(8)
        );
        assert_eq!(binary_value_len(types::NEWDECIMAL, b"\x0212"), Some(3));
        assert_eq!(binary_value_len(types::LONG, &[1, 2]), None);
    }

    #[test]
    fn text_rows_round_trip() {
        let cells: [Option<&[u8]>; 3] = [Some(b"Warning"), None, Some(&[b'x'; 300])];
        let row = text_row(&cells);
        assert_eq!(text_cells(&row).unwrap(), cells.to_vec());
        assert_eq!(text_cells(&row[..row.len() - 1]), None);
    }
}
