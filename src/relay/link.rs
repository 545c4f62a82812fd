//! The two legs of one session: the client's connection and its backend
//! connection, with the packet I/O that moves responses between them — streamed
//! in bulk straight out of the backend's read buffer, or read whole.

use bytes::Buf;
use tokio::io::{AsyncRead, AsyncWrite};

use super::response::{ResponseKind, ResponseParser, Step};
use super::state::SessionState;
use crate::error::{Error, Result, Source};
use crate::tls::Stream;
use crate::wire::io::{header, Packet, PacketIo};
use crate::wire::MAX_PAYLOAD;

/// A session's client and backend connections and how their responses are framed.
pub(super) struct Link {
    /// The application's connection (plain, or TLS terminated by the proxy).
    pub(super) client: PacketIo<Stream>,
    /// This session's own backend connection (plain or TLS).
    pub(super) backend: PacketIo<Stream>,
    /// CLIENT_DEPRECATE_EOF was negotiated (changes result-set framing).
    pub(super) deprecate_eof: bool,
    /// MariaDB extended metadata was negotiated (column definitions carry an extra
    /// block the patcher must skip).
    pub(super) extended_metadata: bool,
}

impl Link {
    /// Streams one response from the backend to the client (see [`relay_loop`]).
    pub(super) async fn relay(
        &mut self,
        parser: &mut ResponseParser,
        shift: u8,
        sent_any: &mut bool,
        state: &mut SessionState,
    ) -> Result<()> {
        relay_loop(
            &mut self.backend,
            &mut self.client,
            parser,
            shift,
            sent_any,
            state,
        )
        .await
    }

    /// Reads one whole response without forwarding it (steps of a rewrite, the
    /// proxy's own queries). OK packets carrying session state information are kept
    /// as the client is to see them: some collected packets are forwarded.
    pub(super) async fn collect(
        &mut self,
        kind: ResponseKind,
        state: &mut SessionState,
    ) -> Result<(ResponseParser, Vec<Packet>)> {
        let mut parser = ResponseParser::new(kind, self.deprecate_eof);
        let mut pkts = Vec::new();
        let mut continuing = false;
        while !parser.is_done() {
            let mut p = self.backend.read_packet().await?;
            let len = p.payload.len();
            if !continuing {
                match parser.feed(&p.payload, len) {
                    Ok(Step::LocalInfile) => {
                        return Err(Error::backend("unexpected LOCAL INFILE request"))
                    }
                    Ok(_) => {}
                    Err(v) => {
                        return Err(Error::with_cause(Source::Backend, "reading response", v))
                    }
                }
                if parser.take_tracked() {
                    // Kept as the client is to see it: some collected packets are
                    // forwarded (SHOW WARNINGS, a rewrite's answer).
                    if let Some(own) = state.tracked_ok(&p.payload, true) {
                        p.payload = bytes::BytesMut::from(&own[..]);
                    }
                }
            }
            continuing = len == MAX_PAYLOAD;
            pkts.push(p);
        }
        Ok((parser, pkts))
    }

    /// Turns the session into a plain bidirectional byte pipe until either side closes.
    pub(super) async fn raw_pipe(&mut self) -> Result<()> {
        if !self.client.buf.is_empty() {
            let b = self.client.buf.split();
            self.backend.write_all(&b).await?;
        }
        if !self.backend.buf.is_empty() {
            let b = self.backend.buf.split();
            self.client.write_all(&b).await?;
        }
        tokio::io::copy_bidirectional(&mut self.client.io, &mut self.backend.io)
            .await
            .map(|_| ())
            .map_err(|e| Error::with_cause(Source::Backend, "raw pipe", e))
    }
}

/// Streams one response from the backend to the client, forwarding complete
/// packets in bulk straight out of the read buffer. `shift` is added to every
/// sequence id (non-zero only when the command sent differs from the client's).
/// OK packets with session state information go as the client is to see them
/// ([`SessionState::tracked_ok`]).
async fn relay_loop<B, C>(
    backend: &mut PacketIo<B>,
    client: &mut PacketIo<C>,
    parser: &mut ResponseParser,
    shift: u8,
    sent_any: &mut bool,
    state: &mut SessionState,
) -> Result<()>
where
    B: AsyncRead + AsyncWrite + Unpin,
    C: AsyncRead + AsyncWrite + Unpin,
{
    // `ready`: bytes at the front of backend.buf already classified, to be forwarded.
    let mut ready = 0usize;
    // Bytes of the current packet still to pass through without looking at them.
    let mut skip = 0usize;
    // The next physical packet continues the current logical packet (pure data).
    let mut continuing = false;
    loop {
        if skip > 0 {
            let n = (backend.buf.len() - ready).min(skip);
            ready += n;
            skip -= n;
            if skip > 0 {
                flush(backend, client, &mut ready, sent_any).await?;
                backend.fill().await?;
                continue;
            }
        }
        if parser.is_done() && !continuing {
            break;
        }
        let avail = backend.buf.len() - ready;
        if avail < 4 {
            flush(backend, client, &mut ready, sent_any).await?;
            backend.fill().await?;
            continue;
        }
        let (len, _) = header(&backend.buf[ready..]);
        if shift != 0 {
            backend.buf[ready + 3] = backend.buf[ready + 3].wrapping_add(shift);
        }
        let next_continues = len == MAX_PAYLOAD;
        if continuing {
            ready += 4;
            skip = len;
            continuing = next_continues;
            continue;
        }
        let whole = len <= ResponseParser::WHOLE_PACKET_LIMIT;
        let need = if whole { 4 + len } else { 5 };
        if avail < need {
            if shift != 0 {
                // Undo: the header is looked at again after the read.
                backend.buf[ready + 3] = backend.buf[ready + 3].wrapping_sub(shift);
            }
            flush(backend, client, &mut ready, sent_any).await?;
            backend.fill_to(need).await?;
            continue;
        }
        let seen = if whole { len } else { 1 };
        let start = ready;
        let step = parser
            .feed(&backend.buf[start + 4..start + 4 + seen], len)
            .map_err(|v| Error::with_cause(Source::Backend, "relaying response", v))?;
        if whole {
            ready += 4 + len;
        } else {
            ready += 4;
            skip = len;
        }
        if whole && parser.take_tracked() {
            if let Some(own) = state.tracked_ok(&backend.buf[start + 4..start + 4 + len], true) {
                // An OK packet carrying session state information the client did not
                // ask for: what precedes it goes as it is, the packet as the client
                // is to see it.
                let seq = backend.buf[start + 3];
                let mut before = start;
                flush(backend, client, &mut before, sent_any).await?;
                backend.buf.advance(4 + len);
                ready = 0;
                let mut out = bytes::BytesMut::with_capacity(4 + own.len());
                crate::wire::io::frame_into(&mut out, seq, &own);
                client.write_all(&out).await?;
                *sent_any = true;
            }
        }
        continuing = next_continues;
        if step == Step::LocalInfile {
            if shift != 0 {
                return Err(Error::backend(
                    "LOCAL INFILE request to a rewritten statement",
                ));
            }
            flush(backend, client, &mut ready, sent_any).await?;
            relay_infile(client, backend).await?;
            parser.infile_sent();
        }
    }
    flush(backend, client, &mut ready, sent_any).await
}

/// Forwards the first `ready` bytes of the backend buffer to the client.
async fn flush<B, C>(
    backend: &mut PacketIo<B>,
    client: &mut PacketIo<C>,
    ready: &mut usize,
    sent_any: &mut bool,
) -> Result<()>
where
    B: AsyncRead + AsyncWrite + Unpin,
    C: AsyncRead + AsyncWrite + Unpin,
{
    if *ready > 0 {
        client.write_all(&backend.buf[..*ready]).await?;
        backend.buf.advance(*ready);
        *ready = 0;
        *sent_any = true;
    }
    Ok(())
}

/// Relays the client's LOCAL INFILE data packets to the backend, up to and including
/// the empty packet that ends them.
async fn relay_infile<B, C>(client: &mut PacketIo<C>, backend: &mut PacketIo<B>) -> Result<()>
where
    B: AsyncRead + AsyncWrite + Unpin,
    C: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        client.fill_to(4).await?;
        let (len, _) = header(&client.buf);
        let mut left = 4 + len;
        while left > 0 {
            if client.buf.is_empty() {
                client.fill().await?;
            }
            let n = client.buf.len().min(left);
            backend.write_all(&client.buf[..n]).await?;
            client.buf.advance(n);
            left -= n;
        }
        if len == 0 {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives relay_loop over in-memory streams: a result set split at awkward places
    /// arrives whole and in order, with sequence ids shifted.
    #[tokio::test]
    async fn relay_forwards_exact_bytes_with_shift() {
        use crate::wire::io::frame_into;
        let mut wire = bytes::BytesMut::new();
        let mut seq = frame_into(&mut wire, 1, &[1]);
        seq = frame_into(
            &mut wire,
            seq,
            b"\x03def\x00\x00\x00\x01a\x00\x0c\x3f\x00\x0b\x00\x00\x00\x03\x01\x00\x00\x00\x00",
        );
        seq = frame_into(&mut wire, seq, &[0xFE, 0, 0, 2, 0]);
        let big = vec![b'x'; MAX_PAYLOAD + 100];
        let mut row = vec![0xFE];
        row.extend_from_slice(&(big.len() as u64).to_le_bytes());
        row.extend_from_slice(&big);
        seq = frame_into(&mut wire, seq, &row);
        frame_into(&mut wire, seq, &[0xFE, 0, 0, 2, 0]);
        let (mut back_side, backend_peer) = tokio::io::duplex(64 * 1024);
        let (client_peer, mut client_side) = tokio::io::duplex(64 * 1024);
        let input = wire.to_vec();
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            back_side.write_all(&input).await.unwrap();
            back_side
        });
        let reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut out = Vec::new();
            let mut buf = vec![0u8; 65536];
            loop {
                let n = client_side.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
            }
            out
        });
        let mut backend = PacketIo::new(backend_peer, Source::Backend);
        let mut client = PacketIo::new(client_peer, Source::Client);
        let mut parser = ResponseParser::new(ResponseKind::Generic, false);
        let mut sent = false;
        let mut state = SessionState::new(false);
        relay_loop(
            &mut backend,
            &mut client,
            &mut parser,
            2,
            &mut sent,
            &mut state,
        )
        .await
        .unwrap();
        assert!(parser.is_done());
        drop(client);
        let _ = writer.await.unwrap();
        let out = reader.await.unwrap();
        assert_eq!(out.len(), wire.len());
        // Every header's sequence id is shifted by 2, every other byte is identical.
        let mut expected = wire.to_vec();
        let mut at = 0;
        while at < expected.len() {
            let (len, _) = header(&expected[at..]);
            expected[at + 3] = expected[at + 3].wrapping_add(2);
            at += 4 + len;
        }
        assert!(out == expected);
    }
}
