//! A MySQL server that does nothing: it greets, accepts any login, and answers every
//! command with an OK packet (1 row affected) at once, without a database behind it.
//!
//! The benchmarks use it as a ceiling (`scripts/bench-sysbench.sh`, the `_null`
//! legs): a client sending statements to it pays what any server or relay that
//! answers each statement must make it pay — its own driver, one loopback send and
//! one wake-up per answer — and nothing else. No proxy that answers every client
//! statement can serve a client more statements per second than this server does on
//! the same machine, since it reads each statement and writes its answer as a proxy
//! must, on the same runtime (tokio, one worker per core), and does nothing else.
//! Each read takes whatever the socket holds and each batch of answers is one write:
//! one `recvfrom` and one `sendto` per statement, heatsink's own floor for a merged
//! increment.
//!
//! ```text
//! cargo run --release --example null_server -- --listen 127.0.0.1:3399 [--unix PATH]
//! ```
//!
//! It prints `listening on …` once ready. It is a measuring tool, not a server: it
//! does not split a command of 16 MiB or more across packets, and answers
//! `COM_STMT_PREPARE` with an OK that no driver accepts as a prepared statement.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};

/// Capabilities offered: protocol 4.1 with plugin authentication, the flags drivers
/// expect of a MariaDB server; no TLS, no compression.
const CAPS: u32 = 0x0000_0001 // LONG_PASSWORD
    | 0x0000_0002 // FOUND_ROWS
    | 0x0000_0004 // LONG_FLAG
    | 0x0000_0008 // CONNECT_WITH_DB
    | 0x0000_0200 // PROTOCOL_41
    | 0x0000_2000 // TRANSACTIONS
    | 0x0000_8000 // SECURE_CONNECTION
    | 0x0001_0000 // MULTI_STATEMENTS
    | 0x0002_0000 // MULTI_RESULTS
    | 0x0004_0000 // PS_MULTI_RESULTS
    | 0x0008_0000 // PLUGIN_AUTH
    | 0x0010_0000 // CONNECT_ATTRS
    | 0x0020_0000; // PLUGIN_AUTH_LENENC_CLIENT_DATA

const COM_QUIT: u8 = 0x01;
/// `SERVER_STATUS_AUTOCOMMIT`.
const AUTOCOMMIT: u16 = 2;

fn greeting(id: u32) -> Vec<u8> {
    let scramble = *b"0123456789abcdefghij";
    let mut g = vec![10];
    g.extend_from_slice(b"10.11.0-null\0");
    g.extend_from_slice(&id.to_le_bytes());
    g.extend_from_slice(&scramble[..8]);
    g.push(0);
    g.extend_from_slice(&(CAPS as u16).to_le_bytes());
    g.push(45); // utf8mb4_general_ci
    g.extend_from_slice(&AUTOCOMMIT.to_le_bytes());
    g.extend_from_slice(&((CAPS >> 16) as u16).to_le_bytes());
    g.push(21);
    g.extend_from_slice(&[0; 10]);
    g.extend_from_slice(&scramble[8..]);
    g.push(0);
    g.extend_from_slice(b"mysql_native_password\0");
    g
}

/// An OK packet with `affected` rows (below 251: one length byte), framed.
fn ok(seq: u8, affected: u8) -> [u8; 11] {
    let [s0, s1] = AUTOCOMMIT.to_le_bytes();
    [7, 0, 0, seq, 0, affected, 0, s0, s1, 0, 0]
}

fn frame(seq: u8, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_le_bytes();
    let mut out = vec![len[0], len[1], len[2], seq];
    out.extend_from_slice(payload);
    out
}

/// Reads one packet during the handshake: its sequence number.
async fn read_packet<S: AsyncRead + Unpin>(s: &mut S) -> io::Result<u8> {
    let mut h = [0u8; 4];
    s.read_exact(&mut h).await?;
    let len = u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await?;
    Ok(h[3])
}

async fn session<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, id: u32) -> io::Result<()> {
    s.write_all(&frame(0, &greeting(id))).await?;
    let seq = read_packet(&mut s).await?;
    s.write_all(&ok(seq.wrapping_add(1), 0)).await?;
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut out: Vec<u8> = Vec::with_capacity(4 * 1024);
    loop {
        // One read takes whatever the socket holds; every whole packet in it is
        // answered, and the answers go out in one write.
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(64 * 1024);
        }
        if s.read_buf(&mut buf).await? == 0 {
            return Ok(());
        }
        let mut at = 0;
        while let Some(h) = buf.get(at..at + 4) {
            let len = u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize;
            let Some(payload) = buf.get(at + 4..at + 4 + len) else {
                break;
            };
            if payload.first() == Some(&COM_QUIT) {
                s.write_all(&out).await?;
                return Ok(());
            }
            out.extend_from_slice(&ok(h[3].wrapping_add(1), 1));
            at += 4 + len;
        }
        buf.drain(..at);
        if !out.is_empty() {
            s.write_all(&out).await?;
            out.clear();
        }
    }
}

#[tokio::main]
async fn main() -> io::Result<()> {
    let mut listen = None;
    let mut unix = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next(),
            "--unix" => unix = args.next(),
            _ => {
                eprintln!("usage: null_server --listen ADDR [--unix PATH]");
                std::process::exit(2);
            }
        }
    }
    let Some(listen) = listen else {
        eprintln!("usage: null_server --listen ADDR [--unix PATH]");
        std::process::exit(2);
    };
    let tcp = TcpListener::bind(&listen).await?;
    if let Some(path) = &unix {
        let _ = std::fs::remove_file(path);
        let ul = UnixListener::bind(path)?;
        tokio::spawn(async move {
            let mut id = 1u32 << 31;
            while let Ok((s, _)) = ul.accept().await {
                id = id.wrapping_add(1);
                tokio::spawn(session(s, id));
            }
        });
    }
    eprintln!(
        "listening on {listen}{}",
        unix.map(|p| format!(" and {p}")).unwrap_or_default()
    );
    let mut id = 0u32;
    loop {
        let (s, _) = tcp.accept().await?;
        s.set_nodelay(true)?;
        id = id.wrapping_add(1);
        tokio::spawn(session(s, id));
    }
}
