//! Binary-protocol parameter values (COM_STMT_EXECUTE) as SQL literals.
//!
//! Merged writes (group commit) are text statements: a prepared ring insert can join
//! one only if each of its parameter values can be written as a literal that the
//! server reads back as the same value. Only types with an exact literal are
//! rendered; everything else (temporal values, TIME, BIT, GEOMETRY, JSON) is `None`
//! and the execute runs as a prepared statement of its own.

use super::packets::lenenc_int;
use super::resultset::{read_int, types};

/// Flag in the second byte of a parameter type: the integer is unsigned.
const UNSIGNED_PARAM: u8 = 0x80;

/// The character set of a handshake collation id, for a string introducer; `None`
/// for collations this table does not name.
pub fn charset_name(collation: u8) -> Option<&'static str> {
    Some(match collation {
        5 | 8 | 15 | 31 | 47 | 48 | 49 | 94 => "latin1",
        11 | 65 => "ascii",
        33 | 83 | 192..=215 | 223 => "utf8mb3",
        45 | 46 | 224..=247 | 255 => "utf8mb4",
        63 => "binary",
        _ => return None,
    })
}

/// One parameter value as a SQL literal: `type_` is the two-byte parameter type the
/// client bound, `value` the value's bytes (`None`: NULL), `charset` the name of the
/// connection's character set (strings are sent in it).
pub fn sql_literal(type_: [u8; 2], value: Option<&[u8]>, charset: &str) -> Option<String> {
    let Some(v) = value else {
        return Some("NULL".into());
    };
    let unsigned = type_[1] & UNSIGNED_PARAM != 0;
    match type_[0] {
        types::NULL => Some("NULL".into()),
        types::TINY | types::SHORT | types::YEAR | types::LONG | types::INT24 | types::LONGLONG => {
            read_int(type_[0], unsigned, v).map(|x| x.to_string())
        }
        types::FLOAT => {
            let f = f32::from_le_bytes(v.get(..4)?.try_into().ok()?);
            double(f64::from(f))
        }
        types::DOUBLE => double(f64::from_le_bytes(v.get(..8)?.try_into().ok()?)),
        types::DECIMAL | types::NEWDECIMAL => {
            let text = lenenc_bytes(v)?;
            let ok = !text.is_empty()
                && text
                    .iter()
                    .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E'));
            ok.then(|| String::from_utf8_lossy(text).into_owned())
        }
        // VARCHAR, ENUM, SET, the BLOB types, VAR_STRING, STRING: bytes in the
        // connection's character set, written as a hex literal with that set's
        // introducer (no escaping, whatever the bytes are).
        0x0f | 0xf7 | 0xf8 | 0xf9 | 0xfa | 0xfb | 0xfc | 0xfd | 0xfe => {
            let text = lenenc_bytes(v)?;
            let mut s = String::with_capacity(text.len() * 2 + charset.len() + 4);
            s.push('_');
            s.push_str(charset);
            s.push_str(" X'");
            for b in text {
                s.push_str(&format!("{b:02X}"));
            }
            s.push('\'');
            Some(s)
        }
        _ => None,
    }
}

/// A double as a literal the server parses back to the same double (scientific
/// notation makes it a DOUBLE literal, not DECIMAL).
fn double(f: f64) -> Option<String> {
    f.is_finite().then(|| format!("{f:e}"))
}

fn lenenc_bytes(v: &[u8]) -> Option<&[u8]> {
    let (n, used) = lenenc_int(v)?;
    v.get(used..used.checked_add(usize::try_from(n).ok()?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_of_parameter_values() {
        let lit = |t: u8, flags: u8, v: &[u8]| sql_literal([t, flags], Some(v), "utf8mb4");
        assert_eq!(lit(types::TINY, 0, &[0xff]).as_deref(), Some("-1"));
        assert_eq!(lit(types::TINY, 0x80, &[0xff]).as_deref(), Some("255"));
        assert_eq!(
            lit(types::LONGLONG, 0x80, &u64::MAX.to_le_bytes()).as_deref(),
            Some("18446744073709551615")
        );
        assert_eq!(
            lit(types::LONG, 0, &(-7i32).to_le_bytes()).as_deref(),
            Some("-7")
        );
        assert_eq!(
            lit(types::DOUBLE, 0, &0.1f64.to_le_bytes()).as_deref(),
            Some("1e-1")
        );
        let back: f64 = lit(types::DOUBLE, 0, &(1.0f64 / 3.0).to_le_bytes())
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(back, 1.0 / 3.0);
        assert_eq!(
            lit(types::NEWDECIMAL, 0, b"\x05-1.50").as_deref(),
            Some("-1.50")
        );
        assert_eq!(lit(types::NEWDECIMAL, 0, b"\x031;x"), None);
        assert_eq!(
            lit(0xfd, 0, b"\x04it's").as_deref(),
            Some("_utf8mb4 X'69742773'")
        );
        assert_eq!(lit(0xfe, 0, b"\x00").as_deref(), Some("_utf8mb4 X''"));
        assert_eq!(
            sql_literal([types::LONG, 0], None, "utf8mb4").as_deref(),
            Some("NULL")
        );
        // Temporal values and short values are not rendered.
        assert_eq!(lit(types::DATETIME, 0, b"\x04\xea\x07\x01\x02"), None);
        assert_eq!(lit(types::LONGLONG, 0, b"\x01"), None);
        assert_eq!(lit(0xfd, 0, b"\x05ab"), None);
        assert_eq!(charset_name(45), Some("utf8mb4"));
        assert_eq!(charset_name(28), None);
    }
}
