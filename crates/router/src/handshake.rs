//! A listener for `axum::serve` (and the router's own server loop) whose connections have finished a
//! handshake, such as TLS, before they are handed on.
//!
//! The handshakes run off the accept loop: each on its own task, within [`HANDSHAKE_TIMEOUT`], at most
//! [`MAX_HANDSHAKES`] at once, so a client that connects and never finishes its handshake holds one slot
//! for a few seconds and never the loop. The handshake itself is the caller's (rustls here with the `tls`
//! feature, the system's OpenSSL in the app's headless server), so the bounded accept logic is written once.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};

/// Time a client has to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; further connections wait in the kernel's backlog.
pub const MAX_HANDSHAKES: usize = 256;

/// Connections that completed their handshake, in the order they did.
#[derive(Debug)]
pub struct HandshakeListener<S> {
    ready: mpsc::Receiver<(S, SocketAddr)>,
    local: SocketAddr,
}

impl<S> HandshakeListener<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Accepts on `listener` and runs `handshake` on every connection; the accept loop ends when the
    /// returned listener is dropped.
    pub fn new<F, Fut, E>(listener: TcpListener, handshake: F) -> std::io::Result<Self>
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<S, E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let local = listener.local_addr()?;
        let (sender, ready) = mpsc::channel(1024);
        let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else { return };
                let (stream, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(error) => {
                            // Out of file descriptors and the like: back off instead of spinning.
                            tracing::warn!(%error, "cannot accept a connection");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    () = sender.closed() => return,
                };
                let (shake, handed_to) = (handshake(stream), sender.clone());
                tokio::spawn(async move {
                    let _slot = slot;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, shake).await {
                        Ok(Ok(done)) => {
                            let _ = handed_to.send((done, peer)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "handshake failed"),
                        Err(_) => tracing::debug!(%peer, "handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { ready, local })
    }
}

impl<S> axum::serve::Listener for HandshakeListener<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Io = S;
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
