//! A real etcd (Debian's `etcd-server`) of the test's own: one member on loopback ports of its own and a
//! temporary data folder, never the system's service. It can be killed and started again on the same
//! ports and data, as an outage looks to its clients.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use fleet_etcd::{EtcdClient, EtcdConfig};
use tokio::process::Command;

use crate::eventually;
use crate::process::ChildProcess;

/// Where Debian installs etcd (`cargo xtask setup --test` installs `etcd-server`).
fn etcd_binary() -> Result<PathBuf> {
    ["/usr/bin/etcd", "/usr/local/bin/etcd"].iter().map(PathBuf::from).find(|p| p.exists()).context(
        "etcd is not installed; run `cargo xtask setup --test` (or apt-get install etcd-server etcd-client)",
    )
}

/// A free loopback port (bound and released: etcd takes it a moment later).
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One etcd member on loopback, stopped when dropped.
pub struct EtcdServer {
    process: Option<ChildProcess>,
    client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
}

impl EtcdServer {
    /// Starts etcd on free ports with a fresh data folder and waits until it answers.
    pub async fn start() -> Result<Self> {
        let mut server = Self {
            process: None,
            client_port: free_port()?,
            peer_port: free_port()?,
            dir: tempfile::tempdir()?,
        };
        server.restart().await?;
        Ok(server)
    }

    /// The client URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// A client for it.
    pub fn client(&self) -> Result<EtcdClient> {
        Ok(EtcdClient::new(EtcdConfig::new(&self.url()))?)
    }

    /// The data folder.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Kills it (SIGKILL: as a crash looks to clients).
    pub fn kill(&mut self) {
        self.process = None;
    }

    /// Starts it (again) on the same ports and data, and waits until it answers.
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        let client = self.url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let data = self.data_dir();
        let log = std::fs::File::create(self.dir.path().join("etcd.log"))?;
        let mut command = Command::new(etcd_binary()?);
        command
            .args(["--name", "test", "--data-dir"])
            .arg(&data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        self.process = Some(ChildProcess::spawn(&mut command).context("cannot start etcd")?);
        let probe = self.client()?;
        eventually("etcd to answer", Duration::from_secs(30), || {
            let probe = probe.clone();
            async move { Ok(probe.get("/").await.ok().map(|_| ())) }
        })
        .await
        .with_context(|| format!("etcd's log: {}", self.log()))?;
        Ok(())
    }

    /// etcd's own log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// The temporary folder (for files beside etcd, e.g. credentials).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
