//! Binary-protocol parameter values (COM_STMT_EXECUTE) as SQL literals.
//!
//! Merged writes (group commit) are text statements: a prepared ring insert can join
//! one only if each of its parameter values can be written as a literal that the
//! server reads back as the same value. Only types with an exact literal are
//! rendered; everything else (BIT, GEOMETRY, JSON, and temporal values the server
//! would itself refuse or zero) is `None` and the execute runs as a prepared
//! statement of its own.
//!
//! Temporal parameters: the server makes a DATE, DATETIME or TIME parameter a
//! temporal constant with 6 fractional digits when its microseconds are not zero and
//! none otherwise; `DATE'…'`, `TIMESTAMP'…'` (a DATETIME literal) and `TIME'…'`
//! literals with the same digits are the same constants (tests/literal.rs stores both
//! into every column type and compares). A value the server would replace by a zero
//! date with a warning (month 13, hour 24), a date the calendar does not have (which
//! a literal refuses outright) and zero dates are not rendered. Nor are parameters
//! bound as MYSQL_TYPE_TIMESTAMP: MariaDB turns one outside the TIMESTAMP range of
//! the session's time zone into NULL, without a warning.

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

/// The introducer name of a client character set the server reported by name
/// (`@@character_set_client`), for the character sets [`charset_name`] knows.
pub fn charset_of_name(name: &str) -> Option<&'static str> {
    Some(match name.to_ascii_lowercase().as_str() {
        "latin1" => "latin1",
        "ascii" => "ascii",
        "utf8" | "utf8mb3" => "utf8mb3",
        "utf8mb4" => "utf8mb4",
        "binary" => "binary",
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
        types::DATE | types::DATETIME => date_time(type_[0], v),
        types::TIME => time(v),
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

/// A DATE or DATETIME parameter (length byte, then year as two bytes,
/// month, day, [hour, minute, second, [microseconds as four bytes]]).
fn date_time(type_: u8, v: &[u8]) -> Option<String> {
    let n = usize::from(*v.first()?);
    let b = v.get(1..1 + n)?;
    if !matches!(n, 4 | 7 | 11) {
        return None; // 0: the zero date
    }
    let year = u16::from_le_bytes([b[0], b[1]]);
    let (month, day) = (b[2], b[3]);
    let (hour, minute, second) = if n >= 7 {
        (b[4], b[5], b[6])
    } else {
        (0, 0, 0)
    };
    let micro = if n == 11 {
        u32::from_le_bytes([b[7], b[8], b[9], b[10]])
    } else {
        0
    };
    let valid = (1..=9999).contains(&year)
        && (1..=12).contains(&month)
        && day >= 1
        && day <= days_in_month(year, month)
        && hour <= 23
        && minute <= 59
        && second <= 59
        && micro <= 999_999;
    if !valid {
        return None;
    }
    // A DATE parameter is read as its date alone, whatever else was sent.
    if type_ == types::DATE {
        return Some(format!("DATE'{year:04}-{month:02}-{day:02}'"));
    }
    Some(format!(
        "TIMESTAMP'{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02}{}'",
        fraction(micro)
    ))
}

/// A TIME parameter (length byte, then sign, days as four bytes, hour, minute,
/// second, [microseconds as four bytes]).
fn time(v: &[u8]) -> Option<String> {
    let n = usize::from(*v.first()?);
    let b = v.get(1..1 + n)?;
    if n == 0 {
        return Some("TIME'00:00:00'".into());
    }
    if !matches!(n, 8 | 12) {
        return None;
    }
    let negative = b[0] != 0;
    let days = u32::from_le_bytes([b[1], b[2], b[3], b[4]]);
    let (hour, minute, second) = (b[5], b[6], b[7]);
    let micro = if n == 12 {
        u32::from_le_bytes([b[8], b[9], b[10], b[11]])
    } else {
        0
    };
    let hours = u64::from(days) * 24 + u64::from(hour);
    // Beyond 838:00:00 the server clips to its TIME range with a warning.
    let valid = hours < 838 && minute <= 59 && second <= 59 && micro <= 999_999;
    let zero = hours == 0 && minute == 0 && second == 0 && micro == 0;
    if !valid || (negative && zero) {
        return None;
    }
    Some(format!(
        "TIME'{}{hours:02}:{minute:02}:{second:02}{}'",
        if negative { "-" } else { "" },
        fraction(micro)
    ))
}

/// Microseconds as the server's parameter has them: six digits, or none when zero.
fn fraction(micro: u32) -> String {
    if micro == 0 {
        String::new()
    } else {
        format!(".{micro:06}")
    }
}

fn days_in_month(year: u16, month: u8) -> u8 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
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
        // Short values are not rendered.
        assert_eq!(lit(types::DATETIME, 0, b"\x04\xea\x07\x01"), None);
        assert_eq!(lit(types::LONGLONG, 0, b"\x01"), None);
        assert_eq!(lit(0xfd, 0, b"\x05ab"), None);
        assert_eq!(charset_name(45), Some("utf8mb4"));
        assert_eq!(charset_name(28), None);
    }

    #[test]
    fn literals_of_temporal_parameters() {
        let lit = |t: u8, v: &[u8]| sql_literal([t, 0], Some(v), "utf8mb4");
        let y = 2024u16.to_le_bytes();
        let dt = |len: u8, m: u8, d: u8, h: u8, us: u32| {
            let mut v = vec![len, y[0], y[1], m, d, h, 30, 59];
            v.extend_from_slice(&us.to_le_bytes());
            v.truncate(1 + len as usize);
            v
        };
        assert_eq!(
            lit(types::DATETIME, &dt(11, 2, 29, 23, 7)).as_deref(),
            Some("TIMESTAMP'2024-02-29 23:30:59.000007'")
        );
        assert_eq!(
            lit(types::DATETIME, &dt(11, 12, 31, 0, 0)).as_deref(),
            Some("TIMESTAMP'2024-12-31 00:30:59'")
        );
        // MYSQL_TYPE_TIMESTAMP parameters depend on the session's time zone.
        assert_eq!(lit(types::TIMESTAMP, &dt(11, 12, 31, 0, 0)), None);
        assert_eq!(
            lit(types::DATETIME, &dt(4, 1, 2, 0, 0)).as_deref(),
            Some("TIMESTAMP'2024-01-02 00:00:00'")
        );
        assert_eq!(
            lit(types::DATE, &dt(11, 1, 2, 5, 9)).as_deref(),
            Some("DATE'2024-01-02'")
        );
        // Zero dates, dates the calendar lacks, values the server would zero.
        assert_eq!(lit(types::DATETIME, b"\x00"), None);
        assert_eq!(lit(types::DATETIME, &dt(7, 2, 30, 1, 0)), None);
        assert_eq!(lit(types::DATETIME, &dt(7, 13, 1, 1, 0)), None);
        assert_eq!(lit(types::DATETIME, &dt(7, 1, 0, 1, 0)), None);
        assert_eq!(lit(types::DATETIME, &dt(7, 1, 1, 24, 0)), None);
        assert_eq!(lit(types::DATETIME, &dt(11, 1, 1, 1, 1_000_000)), None);
        assert_eq!(lit(types::DATETIME, &dt(5, 1, 1, 1, 0)), None);

        let t = |neg: u8, days: u32, h: u8, us: Option<u32>| {
            let mut v = vec![if us.is_some() { 12 } else { 8 }, neg];
            v.extend_from_slice(&days.to_le_bytes());
            v.extend_from_slice(&[h, 5, 6]);
            if let Some(us) = us {
                v.extend_from_slice(&us.to_le_bytes());
            }
            v
        };
        assert_eq!(
            lit(types::TIME, &t(0, 0, 1, None)).as_deref(),
            Some("TIME'01:05:06'")
        );
        assert_eq!(
            lit(types::TIME, &t(1, 2, 3, Some(120))).as_deref(),
            Some("TIME'-51:05:06.000120'")
        );
        assert_eq!(lit(types::TIME, b"\x00").as_deref(), Some("TIME'00:00:00'"));
        assert_eq!(lit(types::TIME, &t(0, 35, 0, None)), None);
    }
}
