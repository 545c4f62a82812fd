//! A minimal MySQL client that speaks raw packets, used as the test oracle.
//!
//! It shares no code with the proxy: framing, handshake and response boundaries are
//! implemented here from the protocol documentation. Every response packet is returned
//! as received (sequence id + payload), so two servers' answers can be compared byte
//! for byte.
//!
//! ```ignore
//! let opts = ConnectOpts::new(USER, PASSWORD).db("heatsink_test").deprecate_eof(false);
//! let mut c = RawClient::connect(mariadb().addr(), &opts).unwrap();
//! let packets = c.query("SELECT 1").unwrap();
//! let (id, _) = c.prepare("SELECT ?").unwrap();
//! let packets = c.execute(id, &[RawParam::Int(7)]).unwrap();
//! ```
//!
//! Only mysql_native_password is implemented (including an auth switch to it). Reads
//! and writes time out (20 s by default) so a stuck peer fails the test instead of
//! hanging it.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

pub use super::packets::Packet;
use super::packets::{parse_eof, parse_ok, read_lenenc, status, write_lenenc};
use super::sha1::native_password;

/// Capability flags.
pub mod caps {
    pub const LONG_PASSWORD: u32 = 1; // also "CLIENT_MYSQL" for MariaDB
    pub const FOUND_ROWS: u32 = 1 << 1;
    pub const LONG_FLAG: u32 = 1 << 2;
    pub const CONNECT_WITH_DB: u32 = 1 << 3;
    pub const NO_SCHEMA: u32 = 1 << 4;
    pub const COMPRESS: u32 = 1 << 5;
    pub const ODBC: u32 = 1 << 6;
    pub const LOCAL_FILES: u32 = 1 << 7;
    pub const IGNORE_SPACE: u32 = 1 << 8;
    pub const PROTOCOL_41: u32 = 1 << 9;
    pub const INTERACTIVE: u32 = 1 << 10;
    pub const SSL: u32 = 1 << 11;
    pub const IGNORE_SIGPIPE: u32 = 1 << 12;
    pub const TRANSACTIONS: u32 = 1 << 13;
    pub const RESERVED: u32 = 1 << 14;
    pub const SECURE_CONNECTION: u32 = 1 << 15;
    pub const MULTI_STATEMENTS: u32 = 1 << 16;
    pub const MULTI_RESULTS: u32 = 1 << 17;
    pub const PS_MULTI_RESULTS: u32 = 1 << 18;
    pub const PLUGIN_AUTH: u32 = 1 << 19;
    pub const CONNECT_ATTRS: u32 = 1 << 20;
    pub const PLUGIN_AUTH_LENENC_CLIENT_DATA: u32 = 1 << 21;
    pub const CAN_HANDLE_EXPIRED_PASSWORDS: u32 = 1 << 22;
    pub const SESSION_TRACK: u32 = 1 << 23;
    pub const DEPRECATE_EOF: u32 = 1 << 24;
    pub const OPTIONAL_RESULTSET_METADATA: u32 = 1 << 25;
    pub const ZSTD_COMPRESSION: u32 = 1 << 26;
    pub const QUERY_ATTRIBUTES: u32 = 1 << 27;
    pub const SSL_VERIFY_SERVER_CERT: u32 = 1 << 30;
    pub const REMEMBER_OPTIONS: u32 = 1 << 31;

    /// What the oracle asks for by default (DEPRECATE_EOF is chosen per connection;
    /// CONNECT_WITH_DB is set automatically when a database is given).
    pub const DEFAULT: u32 = LONG_PASSWORD
        | LONG_FLAG
        | LOCAL_FILES
        | PROTOCOL_41
        | TRANSACTIONS
        | SECURE_CONNECTION
        | MULTI_STATEMENTS
        | MULTI_RESULTS
        | PS_MULTI_RESULTS
        | PLUGIN_AUTH;
}

/// Command bytes.
pub mod cmd {
    pub const QUIT: u8 = 0x01;
    pub const INIT_DB: u8 = 0x02;
    pub const QUERY: u8 = 0x03;
    pub const FIELD_LIST: u8 = 0x04;
    pub const STATISTICS: u8 = 0x09;
    pub const PROCESS_INFO: u8 = 0x0a;
    pub const PING: u8 = 0x0e;
    pub const CHANGE_USER: u8 = 0x11;
    pub const STMT_PREPARE: u8 = 0x16;
    pub const STMT_EXECUTE: u8 = 0x17;
    pub const STMT_SEND_LONG_DATA: u8 = 0x18;
    pub const STMT_CLOSE: u8 = 0x19;
    pub const STMT_RESET: u8 = 0x1a;
    pub const SET_OPTION: u8 = 0x1b;
    pub const STMT_FETCH: u8 = 0x1c;
    pub const STMT_BULK_EXECUTE: u8 = 0xfa;
    pub const RESET_CONNECTION: u8 = 0x1f;
}

/// Column / parameter type codes used by [`RawParam`].
pub mod types {
    pub const DOUBLE: u8 = 0x05;
    pub const NULL: u8 = 0x06;
    pub const TIMESTAMP: u8 = 0x07;
    pub const LONGLONG: u8 = 0x08;
    pub const DATE: u8 = 0x0a;
    pub const TIME: u8 = 0x0b;
    pub const DATETIME: u8 = 0x0c;
    pub const NEWDECIMAL: u8 = 0xf6;
    pub const BLOB: u8 = 0xfc;
    pub const VAR_STRING: u8 = 0xfd;
    pub const STRING: u8 = 0xfe;
}

const NATIVE: &str = "mysql_native_password";
const MAX_PAYLOAD: usize = 0xFF_FFFF;

/// MariaDB extended capability flags (the handshake's last 4 reserved bytes).
pub mod mariadb_caps {
    pub const STMT_BULK_OPERATIONS: u32 = 1 << 2;
}

/// How to connect.
#[derive(Clone, Debug)]
pub struct ConnectOpts {
    pub user: String,
    pub password: String,
    /// Sent with CONNECT_WITH_DB when set.
    pub db: Option<String>,
    /// Requested capabilities; the client sends `caps & server capabilities`.
    pub caps: u32,
    /// Collation id in the handshake response (default 45, utf8mb4_general_ci).
    pub charset: u8,
    /// MariaDB extended capabilities requested (`& the server's`); when any is,
    /// CLIENT_MYSQL (bit 0) is cleared so the server reads them.
    pub mariadb_caps: u32,
    /// Connect, read and write timeout.
    pub timeout: Duration,
}

impl ConnectOpts {
    /// [`caps::DEFAULT`] plus DEPRECATE_EOF, charset 45, 20 s timeouts.
    pub fn new(user: &str, password: &str) -> Self {
        ConnectOpts {
            user: user.into(),
            password: password.into(),
            db: None,
            caps: caps::DEFAULT | caps::DEPRECATE_EOF,
            charset: 45,
            mariadb_caps: 0,
            timeout: Duration::from_secs(20),
        }
    }

    /// Requests MariaDB extended capabilities (`mariadb_caps::…`).
    pub fn mariadb_caps(mut self, caps: u32) -> Self {
        self.mariadb_caps = caps;
        self
    }

    /// Connect with this default database.
    pub fn db(mut self, db: &str) -> Self {
        self.db = Some(db.into());
        self
    }

    /// Replaces the requested capability flags.
    pub fn caps(mut self, caps: u32) -> Self {
        self.caps = caps;
        self
    }

    /// Turns CLIENT_DEPRECATE_EOF on or off.
    pub fn deprecate_eof(mut self, on: bool) -> Self {
        if on {
            self.caps |= caps::DEPRECATE_EOF;
        } else {
            self.caps &= !caps::DEPRECATE_EOF;
        }
        self
    }

    /// Collation id for the connection.
    pub fn charset(mut self, charset: u8) -> Self {
        self.charset = charset;
        self
    }

    /// Connect / read / write timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// The server's initial handshake packet (protocol version 10), decoded.
#[derive(Clone, Debug)]
pub struct Greeting {
    /// The payload exactly as received.
    pub raw: Vec<u8>,
    pub protocol_version: u8,
    pub server_version: String,
    pub connection_id: u32,
    /// Both auth-data parts, without the trailing NUL (20 bytes for MariaDB).
    pub scramble: Vec<u8>,
    /// Lower and upper capability words.
    pub capabilities: u32,
    /// MariaDB extended capabilities (bytes 6..10 of the reserved area; 0 for MySQL).
    pub mariadb_capabilities: u32,
    pub charset: u8,
    pub status: u16,
    pub auth_plugin: String,
    /// Byte offset of the connection id in `raw`.
    pub connection_id_offset: usize,
    /// Byte ranges of the two scramble parts in `raw`.
    pub scramble_ranges: [std::ops::Range<usize>; 2],
    /// Byte offsets of the lower and upper capability words and the MariaDB word.
    pub capability_offsets: [usize; 3],
}

impl Greeting {
    /// Decodes a HandshakeV10 payload.
    pub fn parse(raw: &[u8]) -> Option<Greeting> {
        let protocol_version = *raw.first()?;
        let nul = 1 + raw.get(1..)?.iter().position(|&b| b == 0)?;
        let server_version = String::from_utf8_lossy(&raw[1..nul]).into_owned();
        let mut pos = nul + 1;
        let connection_id_offset = pos;
        let connection_id = u32::from_le_bytes(raw.get(pos..pos + 4)?.try_into().ok()?);
        pos += 4;
        let part1 = pos..pos + 8;
        pos += 8 + 1; // part 1 + filler
        let cap_low_at = pos;
        let cap_low = u16::from_le_bytes(raw.get(pos..pos + 2)?.try_into().ok()?) as u32;
        let charset = *raw.get(pos + 2)?;
        let status = u16::from_le_bytes(raw.get(pos + 3..pos + 5)?.try_into().ok()?);
        let cap_high_at = pos + 5;
        let cap_high = u16::from_le_bytes(raw.get(pos + 5..pos + 7)?.try_into().ok()?) as u32;
        let auth_len = *raw.get(pos + 7)? as usize;
        let mariadb_at = pos + 8 + 6;
        let mariadb_capabilities =
            u32::from_le_bytes(raw.get(mariadb_at..mariadb_at + 4)?.try_into().ok()?);
        pos += 8 + 10;
        let capabilities = cap_low | (cap_high << 16);
        let part2_len = if capabilities & caps::SECURE_CONNECTION != 0 {
            auth_len.saturating_sub(8).max(13)
        } else {
            0
        };
        let part2 = pos..pos + part2_len;
        raw.get(part2.clone())?;
        pos += part2_len;
        let mut scramble = raw[part1.clone()].to_vec();
        let mut p2 = raw[part2.clone()].to_vec();
        if p2.last() == Some(&0) {
            p2.pop();
        }
        scramble.extend_from_slice(&p2);
        let auth_plugin = raw
            .get(pos..)
            .map(|rest| {
                let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
                String::from_utf8_lossy(&rest[..end]).into_owned()
            })
            .unwrap_or_default();
        Some(Greeting {
            raw: raw.to_vec(),
            protocol_version,
            server_version,
            connection_id,
            scramble,
            capabilities,
            mariadb_capabilities,
            charset,
            status,
            auth_plugin,
            connection_id_offset,
            scramble_ranges: [part1, part2],
            capability_offsets: [cap_low_at, cap_high_at, mariadb_at],
        })
    }

    /// `raw` with the connection id and the scramble zeroed (they differ per connection).
    pub fn normalized(&self) -> Vec<u8> {
        let mut out = self.raw.clone();
        out[self.connection_id_offset..self.connection_id_offset + 4].fill(0);
        for r in &self.scramble_ranges {
            out[r.clone()].fill(0);
        }
        out
    }

    /// [`Greeting::normalized`] with all capability words zeroed too.
    pub fn normalized_without_caps(&self) -> Vec<u8> {
        let mut out = self.normalized();
        let [low, high, mdb] = self.capability_offsets;
        out[low..low + 2].fill(0);
        out[high..high + 2].fill(0);
        out[mdb..mdb + 4].fill(0);
        out
    }
}

/// Why a connection attempt failed.
#[derive(Debug)]
pub enum ConnectError {
    /// Socket error or malformed packet.
    Io(io::Error),
    /// The server answered with ERR; `packets` are all packets after the greeting.
    Rejected {
        greeting: Box<Greeting>,
        packets: Vec<Packet>,
    },
    /// The server asked for an authentication method this client does not implement.
    Unsupported {
        greeting: Box<Greeting>,
        packets: Vec<Packet>,
        plugin: String,
    },
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Io(e) => write!(f, "I/O error: {e}"),
            ConnectError::Rejected { packets, .. } => {
                write!(f, "rejected: {:?}", packets.last())
            }
            ConnectError::Unsupported { plugin, .. } => {
                write!(f, "unsupported auth plugin {plugin:?}")
            }
        }
    }
}

impl std::error::Error for ConnectError {}

impl From<io::Error> for ConnectError {
    fn from(e: io::Error) -> Self {
        ConnectError::Io(e)
    }
}

/// A binary-protocol parameter for COM_STMT_EXECUTE.
#[derive(Clone, Debug, PartialEq)]
pub enum RawParam {
    /// Sent through the NULL bitmap (type MYSQL_TYPE_NULL).
    Null,
    /// MYSQL_TYPE_LONGLONG.
    Int(i64),
    /// MYSQL_TYPE_LONGLONG with the unsigned flag.
    UInt(u64),
    /// MYSQL_TYPE_DOUBLE.
    Double(f64),
    /// MYSQL_TYPE_STRING, length-encoded.
    Bytes(Vec<u8>),
    /// Any type: `value` is sent verbatim (already encoded for that type).
    Typed {
        ty: u8,
        unsigned: bool,
        value: Vec<u8>,
    },
}

impl RawParam {
    /// Convenience for a string parameter.
    pub fn str(s: &str) -> RawParam {
        RawParam::Bytes(s.as_bytes().to_vec())
    }

    fn type_bytes(&self) -> [u8; 2] {
        match self {
            RawParam::Null => [types::NULL, 0],
            RawParam::Int(_) => [types::LONGLONG, 0],
            RawParam::UInt(_) => [types::LONGLONG, 0x80],
            RawParam::Double(_) => [types::DOUBLE, 0],
            RawParam::Bytes(_) => [types::STRING, 0],
            RawParam::Typed { ty, unsigned, .. } => [*ty, if *unsigned { 0x80 } else { 0 }],
        }
    }

    fn encode_value(&self, out: &mut Vec<u8>) {
        match self {
            RawParam::Null => {}
            RawParam::Int(v) => out.extend_from_slice(&v.to_le_bytes()),
            RawParam::UInt(v) => out.extend_from_slice(&v.to_le_bytes()),
            RawParam::Double(v) => out.extend_from_slice(&v.to_le_bytes()),
            RawParam::Bytes(b) => {
                write_lenenc(out, b.len() as u64);
                out.extend_from_slice(b);
            }
            RawParam::Typed { value, .. } => out.extend_from_slice(value),
        }
    }
}

/// How a command's response ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// No response (COM_QUIT, COM_STMT_CLOSE, COM_STMT_SEND_LONG_DATA).
    None,
    /// Exactly one packet (OK, ERR, EOF or a plain string).
    Single,
    /// OK / ERR / LOCAL INFILE / result sets, following SERVER_MORE_RESULTS_EXISTS.
    Results {
        /// An execute that asked for a cursor.
        cursor: bool,
    },
    /// COM_STMT_PREPARE response.
    Prepare,
    /// Packets up to an EOF (or 0xFE OK) or ERR: COM_FIELD_LIST, COM_STMT_FETCH.
    UntilEof,
    /// COM_CHANGE_USER: OK / ERR, possibly after an auth switch.
    Auth,
}

/// A connected raw client.
pub struct RawClient {
    stream: TcpStream,
    /// The server greeting.
    pub greeting: Greeting,
    /// Every server packet between the handshake response and the final OK.
    pub handshake: Vec<Packet>,
    /// Negotiated capabilities (requested & server).
    caps: u32,
    /// Sequence id for the next packet written.
    seq: u8,
    /// Parameter count per prepared statement id (from the prepare response).
    stmt_params: HashMap<u32, u16>,
    /// Sent when the server asks for a LOCAL INFILE.
    local_infile: Vec<u8>,
    /// Connect options (password reused by `change_user` callers).
    opts: ConnectOpts,
}

impl RawClient {
    /// Connects and authenticates. The server's ERR becomes [`ConnectError::Rejected`].
    pub fn connect(
        addr: impl ToSocketAddrs,
        opts: &ConnectOpts,
    ) -> Result<RawClient, ConnectError> {
        let addr: SocketAddr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address"))?;
        let stream = TcpStream::connect_timeout(&addr, opts.timeout)?;
        stream.set_read_timeout(Some(opts.timeout))?;
        stream.set_write_timeout(Some(opts.timeout))?;
        stream.set_nodelay(true)?;
        let mut stream = stream;
        let (first, _) = read_packet_from(&mut stream)?;
        if first.is_err() {
            return Err(io::Error::other(format!("server refused: {first:?}")).into());
        }
        let greeting = Greeting::parse(&first.payload)
            .ok_or_else(|| io::Error::other(format!("bad greeting: {first:?}")))?;
        let mut client = RawClient {
            stream,
            greeting,
            handshake: Vec::new(),
            caps: 0,
            seq: 1,
            stmt_params: HashMap::new(),
            local_infile: Vec::new(),
            opts: opts.clone(),
        };
        let mut caps = opts.caps & client.greeting.capabilities;
        caps &= !(caps::SSL | caps::COMPRESS | caps::CONNECT_ATTRS);
        if opts.db.is_some() {
            caps |= caps::CONNECT_WITH_DB & client.greeting.capabilities;
        } else {
            caps &= !caps::CONNECT_WITH_DB;
        }
        let mariadb_caps = opts.mariadb_caps & client.greeting.mariadb_capabilities;
        if mariadb_caps != 0 {
            caps &= !caps::LONG_PASSWORD;
        }
        client.caps = caps;

        let auth = native_password(opts.password.as_bytes(), &client.greeting.scramble);
        let mut resp = Vec::new();
        resp.extend_from_slice(&caps.to_le_bytes());
        resp.extend_from_slice(&(64u32 << 20).to_le_bytes());
        resp.push(opts.charset);
        resp.extend_from_slice(&[0u8; 19]);
        resp.extend_from_slice(&mariadb_caps.to_le_bytes());
        resp.extend_from_slice(opts.user.as_bytes());
        resp.push(0);
        push_auth(&mut resp, caps, &auth);
        if caps & caps::CONNECT_WITH_DB != 0 {
            resp.extend_from_slice(opts.db.as_deref().unwrap_or("").as_bytes());
            resp.push(0);
        }
        if caps & caps::PLUGIN_AUTH != 0 {
            resp.extend_from_slice(NATIVE.as_bytes());
            resp.push(0);
        }
        client.write_packet(&resp)?;
        let mut packets = Vec::new();
        match client.finish_auth(&mut packets)? {
            AuthEnd::Ok => {
                client.handshake = packets;
                Ok(client)
            }
            AuthEnd::Err => Err(ConnectError::Rejected {
                greeting: Box::new(client.greeting.clone()),
                packets,
            }),
            AuthEnd::Unsupported(plugin) => Err(ConnectError::Unsupported {
                greeting: Box::new(client.greeting.clone()),
                packets,
                plugin,
            }),
        }
    }

    /// Negotiated capability flags.
    pub fn caps(&self) -> u32 {
        self.caps
    }

    /// True if CLIENT_DEPRECATE_EOF was negotiated.
    pub fn deprecate_eof(&self) -> bool {
        self.caps & caps::DEPRECATE_EOF != 0
    }

    /// Bytes to send the next time the server asks for a LOCAL INFILE (default: empty).
    pub fn set_local_infile(&mut self, data: impl Into<Vec<u8>>) {
        self.local_infile = data.into();
    }

    /// The underlying socket (e.g. to shut it down half-way in a test).
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// COM_QUERY; returns every packet of the response (all result sets).
    pub fn query(&mut self, sql: impl AsRef<[u8]>) -> io::Result<Vec<Packet>> {
        self.command(&[&[cmd::QUERY], sql.as_ref()].concat())
    }

    /// COM_STMT_PREPARE; returns the statement id (0 on ERR) and all response packets.
    pub fn prepare(&mut self, sql: impl AsRef<[u8]>) -> io::Result<(u32, Vec<Packet>)> {
        let packets = self.command(&[&[cmd::STMT_PREPARE], sql.as_ref()].concat())?;
        let id = prepare_ok_id(&packets).unwrap_or(0);
        Ok((id, packets))
    }

    /// COM_STMT_EXECUTE with types bound (new-params-bound = 1), no cursor.
    pub fn execute(&mut self, stmt_id: u32, params: &[RawParam]) -> io::Result<Vec<Packet>> {
        self.execute_with(stmt_id, params, true, 0)
    }

    /// COM_STMT_EXECUTE with explicit new-params-bound and cursor flags. The NULL bitmap
    /// covers the statement's parameter count from its prepare response (or
    /// `params.len()` for an unknown id).
    pub fn execute_with(
        &mut self,
        stmt_id: u32,
        params: &[RawParam],
        bind_types: bool,
        flags: u8,
    ) -> io::Result<Vec<Packet>> {
        let count = self
            .stmt_params
            .get(&stmt_id)
            .map(|&n| n as usize)
            .unwrap_or(params.len());
        let mut p = vec![cmd::STMT_EXECUTE];
        p.extend_from_slice(&stmt_id.to_le_bytes());
        p.push(flags);
        p.extend_from_slice(&1u32.to_le_bytes());
        if count > 0 {
            let mut bitmap = vec![0u8; count.div_ceil(8)];
            for (i, param) in params.iter().enumerate().take(count) {
                if *param == RawParam::Null {
                    bitmap[i / 8] |= 1 << (i % 8);
                }
            }
            p.extend_from_slice(&bitmap);
            p.push(bind_types as u8);
            if bind_types {
                for param in params.iter().take(count) {
                    p.extend_from_slice(&param.type_bytes());
                }
            }
            for param in params.iter().take(count) {
                param.encode_value(&mut p);
            }
        }
        self.command(&p)
    }

    /// MariaDB's COM_STMT_BULK_EXECUTE: `rows` of parameters (each value sent with
    /// indicator 0, NULL with indicator 1), the types taken from the first row
    /// (STMT_BULK_FLAG_SEND_TYPES). Needs `mariadb_caps::STMT_BULK_OPERATIONS`.
    pub fn bulk_execute(
        &mut self,
        stmt_id: u32,
        rows: &[Vec<RawParam>],
    ) -> io::Result<Vec<Packet>> {
        let mut p = vec![cmd::STMT_BULK_EXECUTE];
        p.extend_from_slice(&stmt_id.to_le_bytes());
        p.extend_from_slice(&128u16.to_le_bytes());
        for param in rows.first().map(Vec::as_slice).unwrap_or_default() {
            p.extend_from_slice(&param.type_bytes());
        }
        for row in rows {
            for param in row {
                if *param == RawParam::Null {
                    p.push(1);
                } else {
                    p.push(0);
                    param.encode_value(&mut p);
                }
            }
        }
        self.command(&p)
    }

    /// COM_STMT_CLOSE (no response).
    pub fn close_stmt(&mut self, stmt_id: u32) -> io::Result<()> {
        self.stmt_params.remove(&stmt_id);
        self.command(&[&[cmd::STMT_CLOSE], &stmt_id.to_le_bytes()[..]].concat())
            .map(drop)
    }

    /// COM_STMT_RESET.
    pub fn reset_stmt(&mut self, stmt_id: u32) -> io::Result<Vec<Packet>> {
        self.command(&[&[cmd::STMT_RESET], &stmt_id.to_le_bytes()[..]].concat())
    }

    /// COM_STMT_SEND_LONG_DATA (no response).
    pub fn send_long_data(&mut self, stmt_id: u32, param: u16, data: &[u8]) -> io::Result<()> {
        let mut p = vec![cmd::STMT_SEND_LONG_DATA];
        p.extend_from_slice(&stmt_id.to_le_bytes());
        p.extend_from_slice(&param.to_le_bytes());
        p.extend_from_slice(data);
        self.command(&p).map(drop)
    }

    /// COM_PING.
    pub fn ping(&mut self) -> io::Result<Vec<Packet>> {
        self.command(&[cmd::PING])
    }

    /// COM_INIT_DB.
    pub fn init_db(&mut self, db: &str) -> io::Result<Vec<Packet>> {
        self.command(&[&[cmd::INIT_DB], db.as_bytes()].concat())
    }

    /// COM_RESET_CONNECTION (forgets prepared statement ids).
    pub fn reset_connection(&mut self) -> io::Result<Vec<Packet>> {
        self.command(&[cmd::RESET_CONNECTION])
    }

    /// COM_CHANGE_USER with mysql_native_password; returns every packet of the exchange
    /// (auth switch requests included) up to the final OK or ERR.
    pub fn change_user(
        &mut self,
        user: &str,
        password: &str,
        db: Option<&str>,
    ) -> io::Result<Vec<Packet>> {
        let auth = native_password(password.as_bytes(), &self.greeting.scramble);
        let mut p = vec![cmd::CHANGE_USER];
        p.extend_from_slice(user.as_bytes());
        p.push(0);
        if self.caps & caps::SECURE_CONNECTION != 0 {
            p.push(auth.len() as u8);
            p.extend_from_slice(&auth);
        } else {
            p.extend_from_slice(&auth);
            p.push(0);
        }
        p.extend_from_slice(db.unwrap_or("").as_bytes());
        p.push(0);
        p.extend_from_slice(&(self.opts.charset as u16).to_le_bytes());
        if self.caps & caps::PLUGIN_AUTH != 0 {
            p.extend_from_slice(NATIVE.as_bytes());
            p.push(0);
        }
        self.opts.user = user.into();
        self.opts.password = password.into();
        self.command(&p)
    }

    /// COM_FIELD_LIST.
    pub fn field_list(&mut self, table: &str, wildcard: &str) -> io::Result<Vec<Packet>> {
        let mut p = vec![cmd::FIELD_LIST];
        p.extend_from_slice(table.as_bytes());
        p.push(0);
        p.extend_from_slice(wildcard.as_bytes());
        self.command(&p)
    }

    /// COM_QUIT; then waits (bounded by the read timeout) for the server to close.
    pub fn quit(mut self) -> io::Result<()> {
        self.command(&[cmd::QUIT])?;
        let mut buf = [0u8; 64];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends any command payload (first byte = command) and reads its whole response,
    /// whose shape is chosen by the command byte.
    pub fn command(&mut self, payload: &[u8]) -> io::Result<Vec<Packet>> {
        let shape = match payload.first().copied() {
            Some(cmd::QUIT | cmd::STMT_CLOSE | cmd::STMT_SEND_LONG_DATA) => Shape::None,
            // MariaDB opens a cursor only when an execute asks for one (flags byte).
            Some(cmd::STMT_EXECUTE) => Shape::Results {
                cursor: payload.get(5).is_some_and(|f| f & 0x07 != 0),
            },
            Some(cmd::QUERY | cmd::PROCESS_INFO) => Shape::Results { cursor: false },
            Some(cmd::STMT_PREPARE) => Shape::Prepare,
            Some(cmd::FIELD_LIST | cmd::STMT_FETCH) => Shape::UntilEof,
            Some(cmd::CHANGE_USER) => Shape::Auth,
            _ => Shape::Single,
        };
        if let Some(cmd::RESET_CONNECTION | cmd::CHANGE_USER) = payload.first().copied() {
            self.stmt_params.clear();
        }
        self.seq = 0;
        self.write_packet(payload)?;
        let mut out = Vec::new();
        match shape {
            Shape::None => {}
            Shape::Single => out.push(self.read_packet()?),
            Shape::Results { cursor } => self.read_results(&mut out, cursor)?,
            Shape::Prepare => self.read_prepare(&mut out)?,
            Shape::UntilEof => {
                self.read_until_eof(&mut out)?;
            }
            Shape::Auth => {
                self.finish_auth(&mut out)?;
            }
        }
        Ok(out)
    }

    /// Writes one command packet without reading anything (for pipelining tests).
    pub fn send_command(&mut self, payload: &[u8]) -> io::Result<()> {
        self.seq = 0;
        self.write_packet(payload)
    }

    /// Reads one logical packet.
    pub fn read_packet(&mut self) -> io::Result<Packet> {
        let (packet, next_seq) = read_packet_from(&mut self.stream)?;
        self.seq = next_seq;
        Ok(packet)
    }

    /// Writes one logical packet with the current sequence id (split at 16 MiB).
    pub fn write_packet(&mut self, payload: &[u8]) -> io::Result<()> {
        let mut buf = Vec::with_capacity(payload.len() + 8);
        let mut rest = payload;
        loop {
            let n = rest.len().min(MAX_PAYLOAD);
            buf.extend_from_slice(&(n as u32).to_le_bytes()[..3]);
            buf.push(self.seq);
            self.seq = self.seq.wrapping_add(1);
            buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if n < MAX_PAYLOAD {
                break;
            }
        }
        self.stream.write_all(&buf)
    }

    /// Reads OK, ERR, LOCAL INFILE exchanges and result sets up to the last result.
    /// `cursor`: the command was an execute that asked for a cursor, so a result set
    /// may end after its column definitions with CURSOR_EXISTS (and no
    /// MORE_RESULTS_EXISTS). Elsewhere CURSOR_EXISTS only says that a stored
    /// procedure's cursor is open (`CALL p()`), and the rows follow.
    fn read_results(&mut self, out: &mut Vec<Packet>, cursor: bool) -> io::Result<()> {
        let deprecate_eof = self.deprecate_eof();
        loop {
            let p = self.read_packet()?;
            match p.header() {
                0x00 => {
                    let more = parse_ok(&p.payload)
                        .map(|ok| ok.status & status::MORE_RESULTS_EXISTS != 0)
                        .unwrap_or(false);
                    out.push(p);
                    if !more {
                        return Ok(());
                    }
                }
                0xFF => {
                    out.push(p);
                    return Ok(());
                }
                0xFB => {
                    out.push(p);
                    let data = std::mem::take(&mut self.local_infile);
                    for chunk in data.chunks(MAX_PAYLOAD - 1) {
                        self.write_packet(chunk)?;
                    }
                    self.write_packet(&[])?;
                    // The OK / ERR that follows is handled by the next iteration.
                }
                _ => {
                    let mut pos = 0;
                    let columns = read_lenenc(&p.payload, &mut pos)
                        .ok_or_else(|| io::Error::other(format!("bad column count {p:?}")))?;
                    out.push(p);
                    for _ in 0..columns {
                        out.push(self.read_packet()?);
                    }
                    if !deprecate_eof {
                        let eof = self.read_packet()?;
                        let opened = parse_eof(&eof.payload)
                            .map(|e| {
                                e.status & status::CURSOR_EXISTS != 0
                                    && e.status & status::MORE_RESULTS_EXISTS == 0
                            })
                            .unwrap_or(false);
                        out.push(eof);
                        if cursor && opened {
                            return Ok(());
                        }
                    }
                    match self.read_rows(out)? {
                        RowsEnd::More => continue,
                        RowsEnd::Done => return Ok(()),
                    }
                }
            }
        }
    }

    /// Reads rows up to the terminating EOF / OK (0xFE) or ERR.
    fn read_rows(&mut self, out: &mut Vec<Packet>) -> io::Result<RowsEnd> {
        loop {
            let r = self.read_packet()?;
            if r.is_err() {
                out.push(r);
                return Ok(RowsEnd::Done);
            }
            if r.header() == 0xFE && r.payload.len() < MAX_PAYLOAD {
                // MariaDB ends some result sets with a classic EOF even under
                // DEPRECATE_EOF (e.g. the OUT-parameter set of a CALL), so decide by size.
                let st = if r.payload.len() < 9 {
                    parse_eof(&r.payload).map(|e| e.status)
                } else {
                    parse_ok(&r.payload).map(|o| o.status)
                }
                .unwrap_or(0);
                out.push(r);
                return Ok(if st & status::MORE_RESULTS_EXISTS != 0 {
                    RowsEnd::More
                } else {
                    RowsEnd::Done
                });
            }
            out.push(r);
        }
    }

    fn read_until_eof(&mut self, out: &mut Vec<Packet>) -> io::Result<RowsEnd> {
        self.read_rows(out)
    }

    fn read_prepare(&mut self, out: &mut Vec<Packet>) -> io::Result<()> {
        let first = self.read_packet()?;
        if first.header() != 0x00 || first.payload.len() < 9 {
            out.push(first);
            return Ok(());
        }
        let p = &first.payload;
        let id = u32::from_le_bytes([p[1], p[2], p[3], p[4]]);
        let columns = u16::from_le_bytes([p[5], p[6]]);
        let params = u16::from_le_bytes([p[7], p[8]]);
        self.stmt_params.insert(id, params);
        out.push(first);
        for count in [params, columns] {
            if count == 0 {
                continue;
            }
            for _ in 0..count {
                out.push(self.read_packet()?);
            }
            if !self.deprecate_eof() {
                out.push(self.read_packet()?);
            }
        }
        Ok(())
    }

    /// Reads the server's answers to an authentication attempt, answering auth switch
    /// requests to mysql_native_password, until OK or ERR.
    fn finish_auth(&mut self, out: &mut Vec<Packet>) -> io::Result<AuthEnd> {
        loop {
            let p = self.read_packet()?;
            let header = p.header();
            match header {
                0x00 => {
                    out.push(p);
                    return Ok(AuthEnd::Ok);
                }
                0xFF => {
                    out.push(p);
                    return Ok(AuthEnd::Err);
                }
                0xFE => {
                    let body = &p.payload[1..];
                    let nul = body.iter().position(|&b| b == 0).unwrap_or(body.len());
                    let plugin = String::from_utf8_lossy(&body[..nul]).into_owned();
                    let mut data = body.get(nul + 1..).unwrap_or_default().to_vec();
                    if data.last() == Some(&0) {
                        data.pop();
                    }
                    out.push(p);
                    if plugin != NATIVE {
                        return Ok(AuthEnd::Unsupported(plugin));
                    }
                    let auth = native_password(self.opts.password.as_bytes(), &data);
                    self.write_packet(&auth)?;
                }
                _ => {
                    out.push(p);
                    return Ok(AuthEnd::Unsupported(format!(
                        "unexpected auth packet 0x{header:02x}"
                    )));
                }
            }
        }
    }
}

/// Reads one logical packet; returns it and the sequence id that follows it.
fn read_packet_from(stream: &mut TcpStream) -> io::Result<(Packet, u8)> {
    let mut header = [0u8; 4];
    stream.read_exact(&mut header)?;
    let seq = header[3];
    let mut len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload)?;
    let mut last_seq = seq;
    while len == MAX_PAYLOAD {
        stream.read_exact(&mut header)?;
        last_seq = header[3];
        len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
        let start = payload.len();
        payload.resize(start + len, 0);
        stream.read_exact(&mut payload[start..])?;
    }
    Ok((Packet { seq, payload }, last_seq.wrapping_add(1)))
}

enum RowsEnd {
    More,
    Done,
}

enum AuthEnd {
    Ok,
    Err,
    Unsupported(String),
}

fn push_auth(out: &mut Vec<u8>, caps: u32, auth: &[u8]) {
    if caps & caps::PLUGIN_AUTH_LENENC_CLIENT_DATA != 0 {
        write_lenenc(out, auth.len() as u64);
        out.extend_from_slice(auth);
    } else if caps & caps::SECURE_CONNECTION != 0 {
        out.push(auth.len() as u8);
        out.extend_from_slice(auth);
    } else {
        out.extend_from_slice(auth);
        out.push(0);
    }
}

/// Statement id of a COM_STMT_PREPARE_OK among `packets`.
pub fn prepare_ok_id(packets: &[Packet]) -> Option<u32> {
    let p = &packets.first()?.payload;
    if p.first() == Some(&0x00) && p.len() >= 9 {
        Some(u32::from_le_bytes([p[1], p[2], p[3], p[4]]))
    } else {
        None
    }
}
