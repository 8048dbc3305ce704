//! HTTPS for the headless server: an `axum::serve` listener whose connections have finished their
//! TLS handshake.
//!
//! The handshakes run on their own tasks, each bounded in time and in number, so a client that
//! opens a connection and never finishes its handshake holds one slot for a few seconds and never
//! the accept loop. TLS comes from the system's OpenSSL through native-tls, which the app already
//! links for its HTTPS clients, so serving HTTPS adds no crate to the build.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_native_tls::TlsStream;

/// Longest a client may take over its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; further connections wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 64;

/// Reads a PEM certificate chain and its PKCS#8 PEM private key.
pub fn acceptor(cert: &Path, key: &Path) -> Result<tokio_native_tls::TlsAcceptor> {
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
    Ok(tokio_native_tls::TlsAcceptor::from(acceptor))
}

/// Connections that completed their handshake, in the order they did.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `listener`; the accept loop ends when the returned listener is dropped.
    pub fn new(listener: TcpListener, acceptor: tokio_native_tls::TlsAcceptor) -> Result<Self> {
        let local = listener.local_addr()?;
        let (sender, ready) = mpsc::channel(MAX_HANDSHAKES);
        let acceptor = Arc::new(acceptor);
        let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(permit) = slots.clone().acquire_owned().await else { return };
                let (stream, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(error) => {
                            // Out of file descriptors and the like: pause rather than spin.
                            tracing::warn!(%error, "accepting a connection failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                    () = sender.closed() => return,
                };
                let (acceptor, sender) = (acceptor.clone(), sender.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = sender.send((tls, peer)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { ready, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop only ends when this listener is dropped, so this never resolves.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
