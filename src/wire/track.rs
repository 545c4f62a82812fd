//! Session state tracking in OK packets (CLIENT_SESSION_TRACK).
//!
//! With the capability negotiated, an OK packet (also the `0xFE` OK that ends a
//! result set under CLIENT_DEPRECATE_EOF) whose status has
//! `SERVER_SESSION_STATE_CHANGED` carries, after its info string, a list of
//! entries: a type byte, a length-encoded length and that many bytes of data.
//! The info string is length-encoded whether or not the capability is on (measured
//! on MariaDB 10.11), and it is left out when it is empty and no state follows.
//!
//! Here: parsing such a packet ([`TrackedOk::parse`]) and building it again with a
//! chosen subset of its entries ([`TrackedOk::rebuild`]), which is how a client that
//! did not ask for tracking gets exactly the OK packet it would have had without it.

use super::packets::{lenenc_int, put_lenenc_int, SESSION_STATE_CHANGED};

/// Entry type: a system variable and its new value.
pub const SYSTEM_VARIABLES: u8 = 0;
/// Entry type: the new default database.
pub const SCHEMA: u8 = 1;
/// Entry type: "some session state changed" (`session_track_state_change`).
pub const STATE_CHANGE: u8 = 2;

/// One entry of an OK packet's session state information.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Its type ([`SYSTEM_VARIABLES`], [`SCHEMA`], [`STATE_CHANGE`], or another).
    pub kind: u8,
    /// Its data, without the length.
    pub data: &'a [u8],
}

impl<'a> Entry<'a> {
    /// A system variable entry's name and value.
    pub fn variable(&self) -> Option<(&'a [u8], &'a [u8])> {
        if self.kind != SYSTEM_VARIABLES {
            return None;
        }
        let (name, rest) = lenenc_str(self.data)?;
        let (value, _) = lenenc_str(rest)?;
        Some((name, value))
    }

    /// A schema entry's database name.
    pub fn schema(&self) -> Option<&'a [u8]> {
        if self.kind != SCHEMA {
            return None;
        }
        lenenc_str(self.data).map(|(name, _)| name)
    }
}

/// An OK packet of a connection that negotiated CLIENT_SESSION_TRACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedOk<'a> {
    /// Header byte through the warning count.
    pub head: &'a [u8],
    /// The status flags.
    pub status: u16,
    /// The info string, without its length.
    pub info: &'a [u8],
    /// The session state entries (none unless the status says so).
    pub entries: Vec<Entry<'a>>,
}

impl<'a> TrackedOk<'a> {
    /// Parses an OK packet's payload (header `0x00` or `0xFE`). `None` when it is
    /// not well formed.
    pub fn parse(payload: &'a [u8]) -> Option<TrackedOk<'a>> {
        let mut pos = 1;
        pos += lenenc_int(payload.get(pos..)?)?.1;
        pos += lenenc_int(payload.get(pos..)?)?.1;
        let flags = payload.get(pos..pos + 4)?;
        let status = u16::from_le_bytes([flags[0], flags[1]]);
        pos += 4;
        let head = &payload[..pos];
        let rest = &payload[pos..];
        if rest.is_empty() {
            return Some(TrackedOk {
                head,
                status,
                info: &[],
                entries: Vec::new(),
            });
        }
        let (info, mut rest) = lenenc_str(rest)?;
        let mut entries = Vec::new();
        if status & SESSION_STATE_CHANGED != 0 && !rest.is_empty() {
            let (mut list, _) = lenenc_str(rest)?;
            while let Some((&kind, after)) = list.split_first() {
                let (data, next) = lenenc_str(after)?;
                entries.push(Entry { kind, data });
                list = next;
            }
            rest = &[];
        }
        let _ = rest;
        Some(TrackedOk {
            head,
            status,
            info,
            entries,
        })
    }

    /// The packet again with only the entries `keep` allows: with none left, the
    /// status flag is cleared and an empty info string left out, as the server
    /// writes an OK without state information.
    pub fn rebuild(&self, mut keep: impl FnMut(&Entry<'_>) -> bool) -> Vec<u8> {
        let kept: Vec<&Entry<'_>> = self.entries.iter().filter(|e| keep(e)).collect();
        let mut out = Vec::with_capacity(self.head.len() + 8 + self.info.len());
        out.extend_from_slice(self.head);
        let at = out.len() - 4;
        let status = if kept.is_empty() {
            self.status & !SESSION_STATE_CHANGED
        } else {
            self.status | SESSION_STATE_CHANGED
        };
        out[at..at + 2].copy_from_slice(&status.to_le_bytes());
        if kept.is_empty() {
            if !self.info.is_empty() {
                put_lenenc_int(&mut out, self.info.len() as u64);
                out.extend_from_slice(self.info);
            }
            return out;
        }
        put_lenenc_int(&mut out, self.info.len() as u64);
        out.extend_from_slice(self.info);
        let mut list = Vec::new();
        for e in kept {
            list.push(e.kind);
            put_lenenc_int(&mut list, e.data.len() as u64);
            list.extend_from_slice(e.data);
        }
        put_lenenc_int(&mut out, list.len() as u64);
        out.extend_from_slice(&list);
        out
    }
}

/// A length-encoded string and what follows it.
fn lenenc_str(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (n, used) = lenenc_int(b)?;
    let end = used.checked_add(usize::try_from(n).ok()?)?;
    Some((b.get(used..end)?, b.get(end..)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Packets captured from MariaDB 10.11.19, with and without the capability.
    #[test]
    fn parses_and_strips_what_mariadb_sends() {
        // SET STATEMENT time_zone='+01:00' FOR INSERT …, tracking on.
        let tracked = hex("00010002400000001600110974696d655f7a6f6e65062b30313a3030020131");
        let ok = TrackedOk::parse(&tracked).unwrap();
        assert_eq!(ok.status, 0x4002);
        assert_eq!(ok.info, b"");
        assert_eq!(ok.entries.len(), 2);
        assert_eq!(
            ok.entries[0].variable(),
            Some((&b"time_zone"[..], &b"+01:00"[..]))
        );
        assert_eq!(ok.entries[1].kind, STATE_CHANGE);
        // The same statement's OK without the capability.
        assert_eq!(ok.rebuild(|_| false), hex("00010002000000"));
        // Everything kept: the same bytes.
        assert_eq!(ok.rebuild(|_| true), tracked);
        // PREPARE: an info string, then the state.
        let prepared = hex("000000024000001253746174656d656e7420707265706172656403020131");
        let ok = TrackedOk::parse(&prepared).unwrap();
        assert_eq!(ok.info, b"Statement prepared");
        assert_eq!(
            ok.rebuild(|_| false),
            hex("000000020000001253746174656d656e74207072657061726564")
        );
        // Only the variable kept.
        let ok = TrackedOk::parse(&tracked).unwrap();
        let kept = ok.rebuild(|e| e.kind == SYSTEM_VARIABLES);
        let again = TrackedOk::parse(&kept).unwrap();
        assert_eq!(again.entries, vec![ok.entries[0]]);
    }

    #[test]
    fn schema_entries_and_malformed_packets() {
        let mut p = hex("0000000240000000");
        // list: type 1, data = lenenc "mysql"
        let data = [&[5u8][..], b"mysql"].concat();
        let mut list = vec![SCHEMA, data.len() as u8];
        list.extend_from_slice(&data);
        p.push(list.len() as u8);
        p.extend_from_slice(&list);
        let ok = TrackedOk::parse(&p).unwrap();
        assert_eq!(ok.entries[0].schema(), Some(&b"mysql"[..]));
        for bad in [&p[..p.len() - 1], &p[..3], &[0u8][..]] {
            assert!(TrackedOk::parse(bad).is_none() || bad.len() > 3);
        }
        assert!(TrackedOk::parse(&p[..p.len() - 1]).is_none());
    }
}
