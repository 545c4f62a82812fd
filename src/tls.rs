//! TLS towards clients (the proxy terminates it) and towards the backend.
//!
//! MySQL starts every connection in plain text: the server's greeting offers
//! CLIENT_SSL, a client that wants TLS answers with a 32-byte SSLRequest, and both
//! peers then run a TLS handshake on the same socket before the real handshake
//! response follows, encrypted. The proxy plays the server towards its clients and
//! the client towards the backend, and upgrades each leg on its own (the handshake
//! itself is in `relay::session`).
//!
//! [`Stream`] is the socket type of both legs: plain TCP, a Unix socket (clients of a
//! sidecar on the same host, a backend on the same host), or TLS over TCP, one enum
//! dispatch per read or write, no allocation on the data path. A Unix socket is never
//! upgraded: it does not leave the host.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::{BackendTlsMode, Config};
use crate::error::{Error, Result, Source};
use crate::wire::io::PacketIo;

/// ER_SECURE_TRANSPORT_REQUIRED: a plain client while TLS is required.
pub const ERR_INSECURE_TRANSPORT: (u16, &[u8; 5]) = (3159, b"HY000");
/// ER_CONNECT_TO_FOREIGN_DATA_SOURCE ("Unable to connect to foreign data source"):
/// TLS towards the backend failed. A server-range code on purpose: libmariadb reports
/// an ERR packet carrying a client-range code (2026 CR_SSL_CONNECTION_ERROR) as a
/// malformed packet.
pub const ERR_BACKEND_TLS: (u16, &[u8; 5]) = (1429, b"HY000");

/// One leg's socket: plain TCP, or TLS over TCP in either role.
pub enum Stream {
    /// Plain TCP (the default, and every connection before an upgrade).
    Plain(TcpStream),
    /// A Unix domain socket (never upgraded).
    Unix(UnixStream),
    /// A client connection whose TLS the proxy terminated (boxed: the TLS state is a
    /// few kilobytes, allocated once per connection).
    Server(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// The backend connection, upgraded to TLS by the proxy.
    Client(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// No socket: only while a connection is being upgraded (reads see end of stream,
    /// writes fail).
    Closed,
}

impl Stream {
    /// True for a Unix domain socket (a peer on the same host).
    pub fn is_unix(&self) -> bool {
        matches!(self, Stream::Unix(_))
    }

    /// True when the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Server(_) | Stream::Client(_))
    }

    /// The negotiated protocol version and cipher suite, for logs.
    pub fn describe(&self) -> Option<String> {
        let (version, suite) = match self {
            Stream::Server(s) => {
                let c = s.get_ref().1;
                (c.protocol_version(), c.negotiated_cipher_suite())
            }
            Stream::Client(s) => {
                let c = s.get_ref().1;
                (c.protocol_version(), c.negotiated_cipher_suite())
            }
            _ => return None,
        };
        Some(format!("{:?} {:?}", version?, suite.map(|s| s.suite())?))
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "connection is being upgraded")
}

impl AsyncRead for Stream {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Closed => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncWrite for Stream {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Closed => Poll::Ready(Err(closed())),
        }
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Stream::Closed => Poll::Ready(Err(closed())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Unix(s) => s.is_write_vectored(),
            Stream::Server(s) => s.is_write_vectored(),
            Stream::Client(s) => s.is_write_vectored(),
            Stream::Closed => false,
        }
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Closed => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Closed => Poll::Ready(Ok(())),
        }
    }
}

/// TLS towards the backend.
pub struct BackendTls {
    /// `required`: a backend that does not offer TLS is refused; `preferred`: it is
    /// used in plain text.
    pub required: bool,
    /// Client-side TLS settings (trusted CA, or no verification).
    pub connector: TlsConnector,
    /// The name the backend's certificate must carry.
    pub server_name: ServerName<'static>,
}

/// The TLS material loaded at startup; everything off by default.
#[derive(Default)]
pub struct Tls {
    /// Terminates TLS from clients; `None` when no certificate is configured (the
    /// greeting then does not offer TLS).
    pub acceptor: Option<TlsAcceptor>,
    /// Plain clients are refused (ERR 3159).
    pub required: bool,
    /// TLS towards the backend; `None` when off.
    pub backend: Option<BackendTls>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_err(what: String, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::with_cause(Source::Internal, format!("TLS: {what}"), e)
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let ctx = || format!("reading {what} {}", path.display());
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_err(ctx(), e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| tls_err(ctx(), e))?;
    if certs.is_empty() {
        return Err(Error::new(
            Source::Internal,
            format!("TLS: {}: no PEM certificate found", ctx()),
        ));
    }
    Ok(certs)
}

impl Tls {
    /// Loads certificates and keys named by `config`. Every problem (missing file, no
    /// PEM block, key not matching the certificate) is an error naming the file.
    pub fn load(config: &Config) -> Result<Tls> {
        let mut tls = Tls {
            required: config.tls_required,
            ..Tls::default()
        };
        if let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) {
            let chain = read_certs(cert, "certificate file")?;
            let key_der = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| tls_err(format!("reading private key {}", key.display()), e))?;
            let server = rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| tls_err("protocol versions".into(), e))?
                .with_no_client_auth()
                .with_single_cert(chain, key_der)
                .map_err(|e| {
                    tls_err(
                        format!("certificate {} with key {}", cert.display(), key.display()),
                        e,
                    )
                })?;
            tls.acceptor = Some(TlsAcceptor::from(Arc::new(server)));
        }
        if config.backend_tls != BackendTlsMode::Off {
            let builder = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| tls_err("protocol versions".into(), e))?;
            let client = if config.backend_tls_insecure {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(NoVerification(provider())))
                    .with_no_client_auth()
            } else {
                let Some(ca) = &config.backend_tls_ca else {
                    return Err(Error::new(
                        Source::Internal,
                        "TLS: backend_tls_ca is required to verify the backend",
                    ));
                };
                let mut roots = rustls::RootCertStore::empty();
                for c in read_certs(ca, "CA file")? {
                    roots
                        .add(c)
                        .map_err(|e| tls_err(format!("CA file {}", ca.display()), e))?;
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            };
            let name = match &config.backend_tls_server_name {
                Some(n) => n.clone(),
                None => backend_host(&config.backend).to_string(),
            };
            let server_name = ServerName::try_from(name.clone()).map_err(|e| {
                tls_err(
                    format!("backend server name '{name}' is not a DNS name or IP"),
                    e,
                )
            })?;
            tls.backend = Some(BackendTls {
                required: config.backend_tls == BackendTlsMode::Required,
                connector: TlsConnector::from(Arc::new(client)),
                server_name,
            });
        }
        Ok(tls)
    }
}

/// The host part of a `host:port` address (brackets of an IPv6 literal removed).
fn backend_host(addr: &str) -> &str {
    let host = match addr.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => addr,
    };
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// Accepts anything the backend presents (`backend_tls_insecure`); handshake
/// signatures are still checked, so the connection is encrypted, but not authenticated.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Takes the plain socket out of `io` for an upgrade.
fn take_plain(io: &mut PacketIo<Stream>, side: Source) -> Result<TcpStream> {
    match std::mem::replace(&mut io.io, Stream::Closed) {
        Stream::Plain(s) => Ok(s),
        other => {
            io.io = other;
            Err(Error::new(side, "TLS requested twice"))
        }
    }
}

/// Runs the server side of a TLS handshake on the client connection (after its
/// SSLRequest). Bytes the client sent right behind the SSLRequest, already in the read
/// buffer, are handed to the TLS engine first.
pub async fn accept(acceptor: &TlsAcceptor, io: &mut PacketIo<Stream>) -> Result<()> {
    let tcp = take_plain(io, Source::Client)?;
    let early = io.buf.split();
    let mut injected: Option<rustls::Error> = None;
    let handshake = acceptor.accept_with(tcp, |conn| {
        let mut rest = &early[..];
        while !rest.is_empty() {
            if let Err(e) = conn.read_tls(&mut rest) {
                injected = Some(rustls::Error::General(e.to_string()));
                return;
            }
            if let Err(e) = conn.process_new_packets() {
                injected = Some(e);
                return;
            }
        }
    });
    if let Some(e) = injected {
        return Err(Error::with_cause(Source::Client, "TLS handshake", e));
    }
    match handshake.await {
        Ok(s) => {
            io.io = Stream::Server(Box::new(s));
            Ok(())
        }
        Err(e) => Err(Error::with_cause(Source::Client, "TLS handshake", e)),
    }
}

/// Runs the client side of a TLS handshake on the backend connection (after the
/// proxy's SSLRequest).
pub async fn connect(backend: &BackendTls, io: &mut PacketIo<Stream>) -> Result<()> {
    if !io.buf.is_empty() {
        return Err(Error::backend("backend sent data before the TLS handshake"));
    }
    let tcp = take_plain(io, Source::Backend)?;
    match backend
        .connector
        .connect(backend.server_name.clone(), tcp)
        .await
    {
        Ok(s) => {
            io.io = Stream::Client(Box::new(s));
            Ok(())
        }
        Err(e) => Err(Error::with_cause(Source::Backend, "TLS handshake", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_host_parts() {
        assert_eq!(backend_host("127.0.0.1:3306"), "127.0.0.1");
        assert_eq!(backend_host("db.example:3306"), "db.example");
        assert_eq!(backend_host("[::1]:3306"), "::1");
        assert_eq!(backend_host("db"), "db");
    }

    #[test]
    fn stream_enum_stays_small() {
        // The TLS variants are boxed: the plain path does not carry their size.
        assert!(std::mem::size_of::<Stream>() <= std::mem::size_of::<TcpStream>() + 8);
    }
}
