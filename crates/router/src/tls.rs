//! HTTPS with rustls (build feature `tls`): a listener that completes TLS handshakes off the accept loop.
//!
//! Handshakes run off the accept loop ([`crate::handshake`]), so a slow or silent client never holds up
//! others.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::server::TlsStream;

use crate::handshake::HandshakeListener;

/// Builds a rustls server configuration from PEM files (certificate chain, private key).
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<ServerConfig>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("cannot read --tls-cert {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("--tls-cert {} is not a PEM certificate chain", cert.display()))?;
    anyhow::ensure!(!certs.is_empty(), "--tls-cert {} holds no certificate", cert.display());
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| {
        format!("--tls-key {} is not a PEM private key (PKCS#8, PKCS#1 or SEC1)", key.display())
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("no TLS protocol version available")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the TLS certificate and key do not match")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A TLS listener for `axum::serve`: connections whose rustls handshake is done.
pub type TlsListener = HandshakeListener<TlsStream<TcpStream>>;

/// Accepts TCP connections on `listener` and completes their handshakes with `config`.
pub fn listener(listener: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<TlsListener> {
    let acceptor = TlsAcceptor::from(config);
    HandshakeListener::new(listener, move |stream: TcpStream| {
        // Streamed tokens are small writes: never hold one back for an ACK (Nagle).
        let _ = stream.set_nodelay(true);
        acceptor.accept(stream)
    })
}
