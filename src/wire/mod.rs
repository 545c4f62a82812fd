//! The MySQL wire protocol, only as far as the proxy needs it.
//!
//! - [`io`]: packet framing over a buffered socket (read, write, split ≥ 16 MiB payloads).
//! - [`handshake`]: reading and patching the greeting and the client's handshake response.
//! - [`packets`]: the few packets the proxy reads or writes itself (OK, ERR, EOF).
//! - [`resultset`]: column definitions, binary and text rows, for patching rewritten reads
//!   and diagnostics.
//! - [`literal`]: binary-protocol parameter values as SQL literals (merged writes).
//!
//! Everything else is relayed as bytes and never decoded.

pub mod handshake;
pub mod io;
pub mod literal;
pub mod packets;
pub mod resultset;
pub mod track;

/// Largest payload one physical packet can carry; a payload this long continues in the
/// next packet.
pub const MAX_PAYLOAD: usize = 0xFF_FFFF;

/// Command bytes the proxy distinguishes (first payload byte of a client command).
pub mod cmd {
    pub const QUIT: u8 = 0x01;
    pub const INIT_DB: u8 = 0x02;
    pub const QUERY: u8 = 0x03;
    pub const FIELD_LIST: u8 = 0x04;
    pub const CREATE_DB: u8 = 0x05;
    pub const DROP_DB: u8 = 0x06;
    pub const REFRESH: u8 = 0x07;
    pub const SHUTDOWN: u8 = 0x08;
    pub const STATISTICS: u8 = 0x09;
    pub const PROCESS_INFO: u8 = 0x0a;
    pub const PROCESS_KILL: u8 = 0x0c;
    pub const DEBUG: u8 = 0x0d;
    pub const PING: u8 = 0x0e;
    pub const CHANGE_USER: u8 = 0x11;
    pub const STMT_PREPARE: u8 = 0x16;
    pub const STMT_EXECUTE: u8 = 0x17;
    pub const STMT_SEND_LONG_DATA: u8 = 0x18;
    pub const STMT_CLOSE: u8 = 0x19;
    pub const STMT_RESET: u8 = 0x1a;
    pub const SET_OPTION: u8 = 0x1b;
    pub const STMT_FETCH: u8 = 0x1c;
    pub const RESET_CONNECTION: u8 = 0x1f;
    /// MariaDB: COM_STMT_BULK_EXECUTE.
    pub const STMT_BULK_EXECUTE: u8 = 0xfa;
}

/// Capability flags (lower 32 bits as sent on the wire).
pub mod caps {
    pub const LONG_PASSWORD: u32 = 1;
    pub const CONNECT_WITH_DB: u32 = 1 << 3;
    pub const COMPRESS: u32 = 1 << 5;
    pub const LOCAL_FILES: u32 = 1 << 7;
    pub const PROTOCOL_41: u32 = 1 << 9;
    pub const SSL: u32 = 1 << 11;
    pub const TRANSACTIONS: u32 = 1 << 13;
    pub const SECURE_CONNECTION: u32 = 1 << 15;
    pub const MULTI_STATEMENTS: u32 = 1 << 16;
    pub const MULTI_RESULTS: u32 = 1 << 17;
    pub const PS_MULTI_RESULTS: u32 = 1 << 18;
    pub const PLUGIN_AUTH: u32 = 1 << 19;
    pub const CONNECT_ATTRS: u32 = 1 << 20;
    pub const PLUGIN_AUTH_LENENC_DATA: u32 = 1 << 21;
    pub const SESSION_TRACK: u32 = 1 << 23;
    pub const DEPRECATE_EOF: u32 = 1 << 24;
    pub const OPTIONAL_RESULTSET_METADATA: u32 = 1 << 25;
    pub const ZSTD_COMPRESSION: u32 = 1 << 26;
    pub const QUERY_ATTRIBUTES: u32 = 1 << 27;
    /// MariaDB: progress reports interleaved with responses (0xFF packets with code 0xFFFF).
    pub const PROGRESS: u32 = 1 << 29;

    /// Bits the relay does not implement: cleared in the greeting and in the client's
    /// response so that framing stays readable (compression, optional metadata, query
    /// attributes, progress packets). SSL is cleared unless TLS is terminated.
    pub const UNSUPPORTED: u32 =
        COMPRESS | OPTIONAL_RESULTSET_METADATA | ZSTD_COMPRESSION | QUERY_ATTRIBUTES | PROGRESS;
}

/// MariaDB's extended capabilities (the greeting's last four reserved bytes and the
/// client's last four filler bytes; bit 0 here is capability bit 32).
pub mod ext_caps {
    /// Progress reports interleaved with responses: breaks framing, never relayed.
    pub const PROGRESS: u32 = 1 << 0;
    /// COM_MULTI (obsolete): never relayed.
    pub const COM_MULTI: u32 = 1 << 1;
    /// COM_STMT_BULK_EXECUTE: relayed.
    pub const STMT_BULK_OPERATIONS: u32 = 1 << 2;
    /// Extended type information (`format=json`, `type=inet6`) in column
    /// definitions: relayed; the proxy's column-definition parser understands it.
    pub const EXTENDED_METADATA: u32 = 1 << 3;
    /// Result sets without metadata when it did not change: breaks framing, never
    /// relayed.
    pub const CACHE_METADATA: u32 = 1 << 4;
    /// Per-row results of bulk execution, sent as a result set: relayed.
    pub const BULK_UNIT_RESULTS: u32 = 1 << 5;

    /// The extended capabilities the relay passes through.
    pub const RELAYED: u32 = STMT_BULK_OPERATIONS | EXTENDED_METADATA | BULK_UNIT_RESULTS;
}

/// Server status flags found in OK and EOF packets.
pub mod status {
    pub const IN_TRANS: u16 = 0x0001;
    pub const AUTOCOMMIT: u16 = 0x0002;
    pub const MORE_RESULTS_EXISTS: u16 = 0x0008;
    pub const CURSOR_EXISTS: u16 = 0x0040;
    pub const LAST_ROW_SENT: u16 = 0x0080;
}
