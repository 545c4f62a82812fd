//! Packet framing over a buffered socket.
//!
//! A MySQL packet is a 3-byte little-endian payload length, a 1-byte sequence id and
//! the payload. Payloads of [`MAX_PAYLOAD`] bytes or more continue in the next packet.
//! [`PacketIo`] keeps its own read buffer so the relay can look at packet headers in
//! place and forward many packets with one write.

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::MAX_PAYLOAD;
use crate::error::{Error, Result, Source};

/// Initial read buffer size; it grows only while a single large packet is buffered.
const READ_CHUNK: usize = 32 * 1024;

/// A socket plus its read buffer.
pub struct PacketIo<S> {
    /// The socket (plain TCP or TLS, see `tls::Stream`; any byte stream works).
    pub io: S,
    /// Bytes read from the socket and not consumed yet (may hold several packets).
    pub buf: BytesMut,
    /// Which side this socket faces, for error attribution.
    side: Source,
}

/// One physical packet, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Sequence id from the header.
    pub seq: u8,
    /// The payload without the header.
    pub payload: BytesMut,
}

/// One logical packet as received: the raw bytes (headers included, ready to forward
/// unchanged) and the joined payload.
#[derive(Debug)]
pub struct Logical {
    /// Every physical packet's header and payload, exactly as read.
    pub raw: BytesMut,
    /// Sequence id of the first physical packet.
    pub seq: u8,
    /// Sequence id of the last physical packet (responses continue from it).
    pub last_seq: u8,
    /// Payload range of the first physical packet inside `raw`.
    first: (usize, usize),
    /// Payload ranges of continuation packets (empty, so unallocated, in the common case).
    more: Vec<(usize, usize)>,
}

impl Logical {
    /// The payload; borrowed when the packet was a single physical packet (the common
    /// case), joined otherwise.
    pub fn payload(&self) -> std::borrow::Cow<'_, [u8]> {
        let (s, e) = self.first;
        if self.more.is_empty() {
            std::borrow::Cow::Borrowed(&self.raw[s..e])
        } else {
            let mut v = Vec::with_capacity(self.raw.len());
            v.extend_from_slice(&self.raw[s..e]);
            for &(s, e) in &self.more {
                v.extend_from_slice(&self.raw[s..e]);
            }
            std::borrow::Cow::Owned(v)
        }
    }

    /// First payload byte (the command byte for client commands).
    pub fn first_byte(&self) -> Option<u8> {
        let (s, e) = self.first;
        (s < e).then(|| self.raw[s])
    }
}

/// The outcome of [`PacketIo::read_logical_max`].
#[derive(Debug)]
pub enum Framed {
    /// The whole logical packet.
    Whole(Logical),
    /// Its payload reaches the limit: the physical packet with sequence id `seq`
    /// (whose header was read, not its payload) brought it there. Nothing was
    /// consumed: the packets before it are still in the buffer.
    TooLarge {
        /// Sequence id of the physical packet that reached the limit.
        seq: u8,
    },
}

/// Reads the 4-byte header at the start of `b`: (payload length, sequence id).
#[inline]
pub fn header(b: &[u8]) -> (usize, u8) {
    (
        b[0] as usize | (b[1] as usize) << 8 | (b[2] as usize) << 16,
        b[3],
    )
}

/// Appends `payload` framed as one or more packets starting at sequence `seq`;
/// returns the next sequence id.
pub fn frame_into(out: &mut BytesMut, mut seq: u8, payload: &[u8]) -> u8 {
    let mut rest = payload;
    loop {
        let n = rest.len().min(MAX_PAYLOAD);
        out.reserve(4 + n);
        out.put_uint_le(n as u64, 3);
        out.put_u8(seq);
        out.put_slice(&rest[..n]);
        seq = seq.wrapping_add(1);
        rest = &rest[n..];
        if n < MAX_PAYLOAD {
            return seq;
        }
    }
}

/// Adds `delta` to the sequence id of every physical packet in `raw` (whole packets,
/// headers included). Used while one leg of the connection phase counts one packet
/// more than the other (an SSLRequest on one side only).
pub fn shift_seq(raw: &mut [u8], delta: u8) {
    if delta == 0 {
        return;
    }
    let mut at = 0;
    while at + 4 <= raw.len() {
        let (len, seq) = header(&raw[at..]);
        raw[at + 3] = seq.wrapping_add(delta);
        at += 4 + len;
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> PacketIo<S> {
    /// Wraps a socket facing `side`.
    pub fn new(io: S, side: Source) -> Self {
        PacketIo {
            io,
            buf: BytesMut::with_capacity(READ_CHUNK),
            side,
        }
    }

    fn io_err(&self, what: &str, e: std::io::Error) -> Error {
        Error::with_cause(self.side, what.to_string(), e)
    }

    /// Reads more bytes into the buffer. End of stream is an `UnexpectedEof` error.
    pub async fn fill(&mut self) -> Result<usize> {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 4 {
            self.buf.reserve(READ_CHUNK);
        }
        match self.io.read_buf(&mut self.buf).await {
            Ok(0) => Err(self.io_err(
                "connection closed",
                std::io::ErrorKind::UnexpectedEof.into(),
            )),
            Ok(n) => Ok(n),
            Err(e) => Err(self.io_err("read failed", e)),
        }
    }

    /// Reads until the buffer holds at least `n` bytes.
    pub async fn fill_to(&mut self, n: usize) -> Result<()> {
        if self.buf.len() < n {
            self.buf.reserve(n - self.buf.len());
        }
        while self.buf.len() < n {
            self.fill().await?;
        }
        Ok(())
    }

    /// Reads one physical packet. Cancel-safe: partial input stays buffered.
    pub async fn read_packet(&mut self) -> Result<Packet> {
        self.fill_to(4).await?;
        let (len, seq) = header(&self.buf);
        self.fill_to(4 + len).await?;
        let mut p = self.buf.split_to(4 + len);
        p.advance(4);
        Ok(Packet { seq, payload: p })
    }

    /// Reads one logical packet (joining continuation packets), keeping raw bytes.
    pub async fn read_logical(&mut self) -> Result<Logical> {
        match self.read_logical_max(usize::MAX).await? {
            Framed::Whole(l) => Ok(l),
            Framed::TooLarge { .. } => Err(Error::new(self.side, "packet too large")),
        }
    }

    /// Reads one logical packet whose payload is shorter than `limit` bytes. The
    /// limit is checked at each physical packet's header, before its payload is
    /// read, so no more than `limit` bytes of payload are ever buffered. Cancel-safe.
    pub async fn read_logical_max(&mut self, limit: usize) -> Result<Framed> {
        let mut first = (0, 0);
        let mut more = Vec::new();
        let mut total = 0usize;
        let mut payload = 0usize;
        let mut seq = 0;
        let mut last_seq;
        loop {
            self.fill_to(total + 4).await?;
            let (len, s) = header(&self.buf[total..]);
            if total == 0 {
                seq = s;
            }
            last_seq = s;
            payload += len;
            if payload >= limit {
                return Ok(Framed::TooLarge { seq: s });
            }
            self.fill_to(total + 4 + len).await?;
            if total == 0 {
                first = (4, 4 + len);
            } else {
                more.push((total + 4, total + 4 + len));
            }
            total += 4 + len;
            if len < MAX_PAYLOAD {
                break;
            }
        }
        let raw = self.buf.split_to(total);
        Ok(Framed::Whole(Logical {
            raw,
            seq,
            last_seq,
            first,
            more,
        }))
    }

    /// Drops everything buffered and reads and discards whatever else the peer
    /// sends, in small chunks, until it closes or `limit` has passed. Used after an
    /// answer that ends the connection, so that closing with unread input (which
    /// sends a TCP reset) does not destroy that answer before the peer reads it.
    pub async fn discard_input(&mut self, limit: std::time::Duration) {
        self.buf = BytesMut::new();
        let mut sink = vec![0u8; 64 * 1024];
        let _ = tokio::time::timeout(limit, async {
            while let Ok(n) = self.io.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
    }

    /// Writes bytes and flushes.
    pub async fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        if let Err(e) = self.io.write_all(bytes).await {
            return Err(self.io_err("write failed", e));
        }
        Ok(())
    }

    /// Frames `payload` starting at `seq` and writes it; returns the next sequence id.
    pub async fn write_packet(&mut self, seq: u8, payload: &[u8]) -> Result<u8> {
        let mut out = BytesMut::with_capacity(payload.len() + 4);
        let next = frame_into(&mut out, seq, payload);
        self.write_all(&out).await?;
        Ok(next)
    }

    /// Shuts the write side down (best effort).
    pub async fn shutdown(&mut self) {
        let _ = self.io.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_and_reads_large_payloads() {
        let payload: Vec<u8> = (0..(MAX_PAYLOAD * 2 + 10)).map(|i| i as u8).collect();
        let mut out = BytesMut::new();
        let next = frame_into(&mut out, 5, &payload);
        assert_eq!(next, 8);
        let mut io = PacketIo::new(std::io::Cursor::new(out.to_vec()), Source::Client);
        let l = io.read_logical().await.unwrap();
        assert_eq!(l.seq, 5);
        assert_eq!(l.last_seq, 7);
        assert_eq!(&l.payload()[..], &payload[..]);
        assert_eq!(&l.raw[..], &out[..]);
    }

    #[tokio::test]
    async fn limit_is_checked_at_each_header() {
        let payload = vec![7u8; MAX_PAYLOAD * 2 + 10];
        let mut out = BytesMut::new();
        frame_into(&mut out, 3, &payload);
        let bytes = out.to_vec();
        // The limit is reached by the third physical packet's header.
        let mut io = PacketIo::new(std::io::Cursor::new(bytes.clone()), Source::Client);
        match io.read_logical_max(payload.len()).await.unwrap() {
            Framed::TooLarge { seq } => assert_eq!(seq, 5),
            Framed::Whole(_) => panic!("over the limit"),
        }
        // The first header alone can reach it.
        let mut io = PacketIo::new(std::io::Cursor::new(bytes.clone()), Source::Client);
        assert!(matches!(
            io.read_logical_max(1024).await.unwrap(),
            Framed::TooLarge { seq: 3 }
        ));
        // One byte more is enough, and a refused read consumed nothing.
        match io.read_logical_max(payload.len() + 1).await.unwrap() {
            Framed::Whole(l) => assert_eq!(&l.payload()[..], &payload[..]),
            Framed::TooLarge { .. } => panic!("under the limit"),
        }
        let mut io = PacketIo::new(std::io::Cursor::new(vec![1, 0, 0, 0, 9]), Source::Client);
        assert!(matches!(
            io.read_logical_max(1).await.unwrap(),
            Framed::TooLarge { seq: 0 }
        ));
    }

    #[tokio::test]
    async fn exact_multiple_ends_with_empty_packet() {
        let payload = vec![7u8; MAX_PAYLOAD];
        let mut out = BytesMut::new();
        frame_into(&mut out, 0, &payload);
        assert_eq!(out.len(), 4 + MAX_PAYLOAD + 4);
        let mut io = PacketIo::new(std::io::Cursor::new(out.to_vec()), Source::Client);
        let l = io.read_logical().await.unwrap();
        assert_eq!(l.payload().len(), MAX_PAYLOAD);
        assert_eq!(l.last_seq, 1);
    }

    #[test]
    fn shift_seq_rewrites_every_header() {
        let mut out = BytesMut::new();
        let next = frame_into(&mut out, 2, &vec![1u8; MAX_PAYLOAD + 3]);
        frame_into(&mut out, next, b"ab");
        let before = out.clone();
        shift_seq(&mut out, 0u8.wrapping_sub(1));
        assert_eq!(out[3], 1);
        assert_eq!(out[4 + MAX_PAYLOAD + 3], 2);
        assert_eq!(out[4 + MAX_PAYLOAD + 4 + 3 + 3], 3);
        shift_seq(&mut out, 1);
        assert!(out == before);
    }

    #[tokio::test]
    async fn eof_is_an_error_with_side() {
        let mut io = PacketIo::new(std::io::Cursor::new(vec![1u8, 0]), Source::Backend);
        let e = io.read_packet().await.unwrap_err();
        assert_eq!(e.source, Source::Backend);
        assert!(e.is_disconnect());
    }
}
