//! HTTPS for the headless server: the router's handshake listener ([`fleet_router::handshake`]: bounded
//! handshakes off the accept loop) with TLS from the system's OpenSSL through native-tls, which the app
//! already links for its HTTPS clients, so serving HTTPS adds no crate to the build.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use fleet_router::handshake::HandshakeListener;
use tokio::net::{TcpListener, TcpStream};
use tokio_native_tls::{TlsAcceptor, TlsStream};

/// The listener `axum::serve` runs on for HTTPS.
pub type TlsListener = HandshakeListener<TlsStream<TcpStream>>;

/// Reads a PEM certificate chain and its PKCS#8 PEM private key.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor> {
    let cert_pem =
        std::fs::read(cert).with_context(|| format!("cannot read --tls-cert {}", cert.display()))?;
    let key_pem = std::fs::read(key).with_context(|| format!("cannot read --tls-key {}", key.display()))?;
    let identity = native_tls::Identity::from_pkcs8(&cert_pem, &key_pem).with_context(|| {
        format!(
            "--tls-cert {} and --tls-key {} are not a PEM certificate and its PKCS#8 PEM key \
             (convert a key with `openssl pkcs8 -topk8 -nocrypt -in KEY -out key.pem`)",
            cert.display(),
            key.display()
        )
    })?;
    let acceptor =
        native_tls::TlsAcceptor::new(identity).context("cannot set up TLS with this certificate")?;
    Ok(TlsAcceptor::from(acceptor))
}

/// Accepts on `listener`, completing each connection's TLS handshake with `acceptor`.
pub fn listener(listener: TcpListener, acceptor: TlsAcceptor) -> Result<TlsListener> {
    let acceptor = Arc::new(acceptor);
    Ok(HandshakeListener::new(listener, move |stream: TcpStream| {
        let acceptor = acceptor.clone();
        async move { acceptor.accept(stream).await }
    })?)
}
