//! The connection-phase packets the proxy reads and patches.
//!
//! The greeting (HandshakeV10) and the client's HandshakeResponse41 are relayed, with
//! only capability bits the relay does not implement cleared in place: every other byte
//! (scramble, plugin names, attributes) stays as the peers sent it, so authentication
//! is end to end between client and backend.

use super::{caps, ext_caps};

/// What the proxy learns from the backend's greeting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    /// Server version string, e.g. "10.11.19-MariaDB-0+deb12u1".
    pub server_version: String,
    /// The backend's connection id (thread id) for this session.
    pub connection_id: u32,
    /// Lower 32 capability bits after patching.
    pub capabilities: u32,
    /// Lower 32 capability bits as the backend sent them (before patching): whether
    /// the backend itself offers TLS.
    pub backend_capabilities: u32,
    /// MariaDB extended capabilities after patching (0 for MySQL servers).
    pub ext_capabilities: u32,
}

/// What the proxy learns from the client's handshake response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientHello {
    /// Capability bits after patching (what client and server agreed on).
    pub capabilities: u32,
    /// MariaDB extended capabilities after patching.
    pub ext_capabilities: u32,
    /// User name (for logs and session listings).
    pub user: String,
    /// Initial database, when CLIENT_CONNECT_WITH_DB was used.
    pub database: Option<String>,
    /// True when this is only an SSLRequest (32 bytes): TLS follows.
    pub ssl_request: bool,
}

/// Why a handshake packet could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("greeting is not protocol 10 (first byte {0:#04x})")]
    BadProtocol(u8),
    #[error("{0} packet is truncated")]
    Truncated(&'static str),
    #[error("client does not speak protocol 4.1")]
    OldClient,
}

/// Patches the greeting in place, clearing `clear` from its capability bits, setting
/// `set` (CLIENT_SSL when the proxy itself terminates TLS), and clearing the MariaDB
/// extended capabilities the relay cannot follow (everything outside
/// [`ext_caps::RELAYED`]); returns what the proxy needs to know.
pub fn patch_greeting(
    payload: &mut [u8],
    clear: u32,
    set: u32,
) -> Result<Greeting, HandshakeError> {
    let proto = *payload
        .first()
        .ok_or(HandshakeError::Truncated("greeting"))?;
    if proto != 10 {
        return Err(HandshakeError::BadProtocol(proto));
    }
    let vend = payload[1..]
        .iter()
        .position(|&b| b == 0)
        .map(|p| p + 1)
        .ok_or(HandshakeError::Truncated("greeting"))?;
    let server_version = String::from_utf8_lossy(&payload[1..vend]).into_owned();
    let id_at = vend + 1;
    let caps_lo_at = id_at + 4 + 8 + 1;
    let caps_hi_at = caps_lo_at + 2 + 1 + 2;
    let reserved_at = caps_hi_at + 2 + 1;
    if payload.len() < caps_lo_at + 2 {
        return Err(HandshakeError::Truncated("greeting"));
    }
    let connection_id = u32::from_le_bytes([
        payload[id_at],
        payload[id_at + 1],
        payload[id_at + 2],
        payload[id_at + 3],
    ]);
    let mut capabilities =
        u16::from_le_bytes([payload[caps_lo_at], payload[caps_lo_at + 1]]) as u32;
    let has_upper = payload.len() >= caps_hi_at + 2;
    if has_upper {
        capabilities |=
            (u16::from_le_bytes([payload[caps_hi_at], payload[caps_hi_at + 1]]) as u32) << 16;
    }
    let backend_capabilities = capabilities;
    capabilities = (capabilities & !clear) | set;
    payload[caps_lo_at..caps_lo_at + 2].copy_from_slice(&(capabilities as u16).to_le_bytes());
    if has_upper {
        payload[caps_hi_at..caps_hi_at + 2]
            .copy_from_slice(&((capabilities >> 16) as u16).to_le_bytes());
    }
    // MariaDB puts extended capabilities in the last 4 reserved bytes when it does not
    // set CLIENT_LONG_PASSWORD ("CLIENT_MYSQL").
    let mut ext_capabilities = 0;
    if capabilities & caps::LONG_PASSWORD == 0 && payload.len() >= reserved_at + 10 {
        let at = reserved_at + 6;
        let ext = u32::from_le_bytes([
            payload[at],
            payload[at + 1],
            payload[at + 2],
            payload[at + 3],
        ]);
        ext_capabilities = ext & ext_caps::RELAYED;
        payload[at..at + 4].copy_from_slice(&ext_capabilities.to_le_bytes());
    }
    Ok(Greeting {
        server_version,
        connection_id,
        capabilities,
        backend_capabilities,
        ext_capabilities,
    })
}

/// Sets or clears CLIENT_SSL in a (patched) handshake response before it goes to the
/// backend: the bit must say whether the backend connection itself is TLS.
pub fn set_client_ssl(payload: &mut [u8], on: bool) {
    if payload.len() >= 4 {
        let mut c = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
        if on {
            c |= caps::SSL;
        } else {
            c &= !caps::SSL;
        }
        payload[0..4].copy_from_slice(&c.to_le_bytes());
    }
}

fn take_cstr(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let p = b.iter().position(|&c| c == 0)?;
    Some((&b[..p], &b[p + 1..]))
}

/// Patches the client's HandshakeResponse41 (or SSLRequest) in place: capability bits
/// (and MariaDB extended capabilities) not offered by the patched greeting are
/// cleared. Returns what the proxy needs to know.
pub fn patch_client_hello(
    payload: &mut [u8],
    server_caps: u32,
    server_ext_caps: u32,
) -> Result<ClientHello, HandshakeError> {
    if payload.len() < 32 {
        if payload.len() >= 2
            && u16::from_le_bytes([payload[0], payload[1]]) as u32 & caps::PROTOCOL_41 == 0
        {
            return Err(HandshakeError::OldClient);
        }
        return Err(HandshakeError::Truncated("handshake response"));
    }
    let raw = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
    if raw & caps::PROTOCOL_41 == 0 {
        return Err(HandshakeError::OldClient);
    }
    // Keep LONG_PASSWORD as the client sent it: MariaDB reads it as "CLIENT_MYSQL".
    let capabilities = raw & (server_caps | caps::LONG_PASSWORD) & !caps::UNSUPPORTED;
    payload[0..4].copy_from_slice(&capabilities.to_le_bytes());
    let ext = u32::from_le_bytes([payload[28], payload[29], payload[30], payload[31]]);
    let ext_capabilities = if capabilities & caps::LONG_PASSWORD == 0 {
        ext & server_ext_caps
    } else {
        0
    };
    payload[28..32].copy_from_slice(&ext_capabilities.to_le_bytes());
    if payload.len() == 32 {
        return Ok(ClientHello {
            capabilities,
            ext_capabilities,
            ssl_request: true,
            ..Default::default()
        });
    }
    let rest = &payload[32..];
    let (user, rest) = take_cstr(rest).ok_or(HandshakeError::Truncated("handshake response"))?;
    let user = String::from_utf8_lossy(user).into_owned();
    let rest = if capabilities & caps::PLUGIN_AUTH_LENENC_DATA != 0 {
        let (n, used) = super::packets::lenenc_int(rest)
            .ok_or(HandshakeError::Truncated("handshake response"))?;
        rest.get(used + n as usize..)
    } else if capabilities & caps::SECURE_CONNECTION != 0 {
        let n = *rest
            .first()
            .ok_or(HandshakeError::Truncated("handshake response"))? as usize;
        rest.get(1 + n..)
    } else {
        take_cstr(rest).map(|(_, r)| r)
    }
    .ok_or(HandshakeError::Truncated("handshake response"))?;
    let database = if capabilities & caps::CONNECT_WITH_DB != 0 {
        take_cstr(rest)
            .map(|(db, _)| String::from_utf8_lossy(db).into_owned())
            .filter(|d| !d.is_empty())
    } else {
        None
    };
    Ok(ClientHello {
        capabilities,
        ext_capabilities,
        user,
        database,
        ssl_request: false,
    })
}

/// Whether a server of this version has `INSERT … RETURNING` (MariaDB ≥ 10.5; old
/// MariaDB servers prefix their version with `5.5.5-`).
pub fn has_returning(version: &str) -> bool {
    if !version.contains("MariaDB") {
        return false;
    }
    let v = version.strip_prefix("5.5.5-").unwrap_or(version);
    let mut nums = v
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let major = nums.next().unwrap_or(0);
    let minor = nums.next().unwrap_or(0);
    (major, minor) >= (10, 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greeting(caps_lo: u16, caps_hi: u16, ext: [u8; 4]) -> Vec<u8> {
        let mut g = vec![10];
        g.extend_from_slice(b"10.11.19-MariaDB\0");
        g.extend_from_slice(&42u32.to_le_bytes());
        g.extend_from_slice(b"abcdefgh\0");
        g.extend_from_slice(&caps_lo.to_le_bytes());
        g.push(45);
        g.extend_from_slice(&2u16.to_le_bytes());
        g.extend_from_slice(&caps_hi.to_le_bytes());
        g.push(21);
        g.extend_from_slice(&[0; 6]);
        g.extend_from_slice(&ext);
        g.extend_from_slice(b"ijklmnopqrst\0mysql_native_password\0");
        g
    }

    #[test]
    fn greeting_clears_only_unsupported_bits() {
        let lo = (caps::PROTOCOL_41 | caps::COMPRESS | caps::SSL | caps::SECURE_CONNECTION) as u16;
        let hi = ((caps::DEPRECATE_EOF | caps::PROGRESS | caps::PLUGIN_AUTH) >> 16) as u16;
        let mut g = greeting(lo, hi, [0x3f, 0, 0, 0]);
        let before = g.clone();
        let info = patch_greeting(&mut g, caps::UNSUPPORTED | caps::SSL, 0).unwrap();
        assert_eq!(info.connection_id, 42);
        assert_eq!(info.server_version, "10.11.19-MariaDB");
        assert!(has_returning(&info.server_version));
        assert!(has_returning("5.5.5-10.5.2-MariaDB-log"));
        assert!(!has_returning("10.4.31-MariaDB"));
        assert!(!has_returning("8.0.36"));
        assert_eq!(
            info.capabilities,
            caps::PROTOCOL_41 | caps::SECURE_CONNECTION | caps::DEPRECATE_EOF | caps::PLUGIN_AUTH
        );
        assert_eq!(info.ext_capabilities, ext_caps::RELAYED);
        let diffs: Vec<usize> = (0..g.len()).filter(|&i| g[i] != before[i]).collect();
        // caps low byte 0 (COMPRESS), byte 1 (SSL), caps high (PROGRESS), ext caps byte.
        assert_eq!(diffs.len(), 4, "{diffs:?}");
        assert_eq!(&g[g.len() - 35..], &before[before.len() - 35..]);
        assert_ne!(info.backend_capabilities & caps::SSL, 0);
    }

    #[test]
    fn greeting_offers_ssl_when_the_proxy_terminates_it() {
        let lo = (caps::PROTOCOL_41 | caps::SECURE_CONNECTION) as u16;
        let mut g = greeting(lo, 0, [0; 4]);
        let info = patch_greeting(&mut g, caps::UNSUPPORTED, caps::SSL).unwrap();
        assert_ne!(info.capabilities & caps::SSL, 0);
        assert_eq!(info.backend_capabilities & caps::SSL, 0);
        let mut p = hello(caps::PROTOCOL_41 | caps::SSL, None);
        set_client_ssl(&mut p, false);
        assert_eq!(
            u32::from_le_bytes([p[0], p[1], p[2], p[3]]),
            caps::PROTOCOL_41
        );
        set_client_ssl(&mut p, true);
        assert_ne!(p[1] & 0x08, 0);
    }

    #[test]
    fn greeting_rejects_garbage() {
        assert_eq!(
            patch_greeting(&mut [9, 1, 2], 0, 0),
            Err(HandshakeError::BadProtocol(9))
        );
        assert!(patch_greeting(&mut [10, b'x'], 0, 0).is_err());
        assert!(patch_greeting(&mut [10, b'x', 0, 1], 0, 0).is_err());
        assert!(patch_greeting(&mut [], 0, 0).is_err());
    }

    fn hello(capabilities: u32, db: Option<&str>) -> Vec<u8> {
        let mut p = capabilities.to_le_bytes().to_vec();
        p.extend_from_slice(&(1u32 << 24).to_le_bytes());
        p.push(45);
        p.extend_from_slice(&[0; 19]);
        p.extend_from_slice(&[1, 2, 3, 4]);
        p.extend_from_slice(b"app\0");
        p.push(20);
        p.extend_from_slice(&[9; 20]);
        if let Some(db) = db {
            p.extend_from_slice(db.as_bytes());
            p.push(0);
        }
        p.extend_from_slice(b"mysql_native_password\0");
        p
    }

    #[test]
    fn client_hello_reads_user_and_db_and_clears_bits() {
        let c = caps::PROTOCOL_41
            | caps::SECURE_CONNECTION
            | caps::CONNECT_WITH_DB
            | caps::COMPRESS
            | caps::PLUGIN_AUTH;
        let server = c & !caps::COMPRESS;
        let mut p = hello(c, Some("shop"));
        let h = patch_client_hello(&mut p, server, ext_caps::EXTENDED_METADATA).unwrap();
        assert_eq!(h.user, "app");
        assert_eq!(h.database.as_deref(), Some("shop"));
        assert_eq!(h.capabilities & caps::COMPRESS, 0);
        // The hello asked for ext bits 1,2,3 (0x0201 0403 little-endian bytes 1,2,3,4):
        // only what the greeting offered survives.
        assert_eq!(
            h.ext_capabilities,
            ext_caps::EXTENDED_METADATA & 0x0403_0201
        );
        assert_eq!(&p[28..32], &h.ext_capabilities.to_le_bytes());
        assert_eq!(u32::from_le_bytes([p[0], p[1], p[2], p[3]]), h.capabilities);
    }

    #[test]
    fn client_hello_truncated_is_an_error() {
        let c = caps::PROTOCOL_41 | caps::SECURE_CONNECTION | caps::CONNECT_WITH_DB;
        let mut p = hello(c, Some("shop"));
        p.truncate(40);
        assert!(patch_client_hello(&mut p, c, 0).is_err());
        let mut short = vec![0u8; 10];
        assert!(patch_client_hello(&mut short, c, 0).is_err());
    }

    #[test]
    fn ssl_request_is_recognised() {
        let c = caps::PROTOCOL_41 | caps::SSL;
        let mut p = hello(c, None);
        p.truncate(32);
        let h = patch_client_hello(&mut p, c, 0).unwrap();
        assert!(h.ssl_request);
    }
}
