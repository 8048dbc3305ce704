//! A real DNS server (Debian's dnsmasq) of the test's own on a loopback port, serving SRV records and the
//! A records of their targets; restarted with other records to make instances appear or leave.

use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
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

/// What dnsmasq prints when the port it was given is taken (for UDP or TCP), before it exits.
const PORT_TAKEN: &str = "Address already in use";

/// A loopback port free for both UDP and TCP a moment ago: dnsmasq binds both. A port free for TCP whose
/// UDP side is taken is passed over for another.
fn free_port() -> Result<u16> {
    const TRIES: usize = 20;
    for _ in 0..TRIES {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = tcp.local_addr()?.port();
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no loopback port was free for both TCP and UDP in {TRIES} tries")
}

impl DnsServer {
    /// Starts dnsmasq serving `records` on a free port (UDP and TCP), and waits until it answers.
    ///
    /// Between picking the port and dnsmasq binding it another process can take it (an outgoing
    /// connection's ephemeral port, another test's server); dnsmasq then exits, and it starts again on
    /// another port.
    pub async fn start(records: &[SrvRecord]) -> Result<Self> {
        const ATTEMPTS: usize = 5;
        let mut attempt = 1;
        loop {
            let mut server = Self { process: None, port: free_port()? };
            match server.serve(records).await {
                Ok(()) => return Ok(server),
                Err(error) if attempt < ATTEMPTS && format!("{error:#}").contains(PORT_TAKEN) => attempt += 1,
                Err(error) => return Err(error),
            }
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Serves `records` instead (dnsmasq reads SRV records at start, so it is started again on its port).
    /// Fails with dnsmasq's own words if it exits instead of answering.
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
        // dnsmasq says why it could not start on stderr and says nothing there once it runs.
        let stderr = tempfile::tempfile().context("cannot make a file for dnsmasq's stderr")?;
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr.try_clone()?);
        let mut process = ChildProcess::spawn(&mut command).context("cannot start dnsmasq")?;
        let addr = self.addr();
        // dnsmasq answers a question about anything (REFUSED or NXDOMAIN) once it listens.
        let answering = eventually("dnsmasq to answer", Duration::from_secs(20), || async move {
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
        });
        tokio::select! {
            answered = answering => answered?,
            status = process.child.wait() => {
                let mut said = String::new();
                let _ = stderr.try_clone().and_then(|mut file| {
                    file.seek(SeekFrom::Start(0))?;
                    file.read_to_string(&mut said)
                });
                bail!("dnsmasq exited ({}) instead of answering on {addr}: {}", status?, said.trim());
            }
        }
        self.process = Some(process);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dnsmasq_whose_port_is_taken_says_so_at_once_and_start_moves_to_another_port() -> Result<()> {
        let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
        let mut server = DnsServer { process: None, port: taken.local_addr()?.port() };
        let error = server.serve(&[]).await.expect_err("the port is taken");
        assert!(format!("{error:#}").contains(PORT_TAKEN), "{error:#}");

        let server = DnsServer::start(&[]).await?;
        assert_ne!(server.addr().port(), taken.local_addr()?.port());
        Ok(())
    }
}
