//! A real DNS server (Debian's dnsmasq) of the test's own on a loopback port, serving SRV records and the
//! A records of their targets; restarted with other records to make instances appear or leave.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::process::Command;

use crate::eventually;
use crate::process::ChildProcess;

/// One SRV instance: `service` (e.g. `_vllm._tcp.fleet.test`) has an instance at `host:port`, and `host`
/// resolves to `address`.
#[derive(Clone, Debug)]
pub struct SrvRecord {
    pub service: String,
    pub host: String,
    pub port: u16,
    pub address: std::net::Ipv4Addr,
}

fn dnsmasq() -> Result<PathBuf> {
    ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .context("dnsmasq is not installed; run `cargo xtask setup --test` (or apt-get install dnsmasq-base)")
}

/// dnsmasq on 127.0.0.1, stopped when dropped.
pub struct DnsServer {
    process: Option<ChildProcess>,
    port: u16,
}

impl DnsServer {
    /// Starts dnsmasq serving `records` on a free port (UDP and TCP), and waits until it answers.
    pub async fn start(records: &[SrvRecord]) -> Result<Self> {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut server = Self { process: None, port };
        server.serve(records).await?;
        Ok(server)
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Serves `records` instead (dnsmasq reads SRV records at start, so it is started again on its port).
    pub async fn serve(&mut self, records: &[SrvRecord]) -> Result<()> {
        self.process = None;
        let mut command = Command::new(dnsmasq()?);
        command.args([
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--listen-address=127.0.0.1",
            "--pid-file=",
        ]);
        command.arg(format!("--port={}", self.port));
        for record in records {
            command.arg(format!("--srv-host={},{},{}", record.service, record.host, record.port));
            command.arg(format!("--host-record={},{}", record.host, record.address));
        }
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        self.process = Some(ChildProcess::spawn(&mut command).context("cannot start dnsmasq")?);
        let addr = self.addr();
        // dnsmasq answers a question about anything (REFUSED or NXDOMAIN) once it listens.
        eventually("dnsmasq to answer", Duration::from_secs(20), || async move {
            let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
            socket.connect(addr).await?;
            let question =
                [0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 4, b't', b'e', b's', b't', 0, 0, 1, 0, 1];
            socket.send(&question).await?;
            let mut buffer = [0u8; 512];
            let answered = tokio::time::timeout(Duration::from_millis(300), socket.recv(&mut buffer))
                .await
                .is_ok_and(|r| r.is_ok());
            Ok(answered.then_some(()))
        })
        .await
    }
}
