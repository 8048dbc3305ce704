//! A real etcd (Debian's `etcd-server`) of the test's own: one member on loopback ports of its own and a
//! temporary data folder, never the system's service. It can be killed and started again on the same
//! ports and data, as an outage looks to its clients.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
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

/// PEM files of an etcd that serves https and asks clients for a certificate (`--client-cert-auth`), made
/// with the openssl command-line tool: a CA, etcd's certificate for 127.0.0.1, and a client's (PKCS#8 key).
#[derive(Clone, Debug)]
pub struct EtcdTls {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

async fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let output = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .await
        .context("cannot run openssl (Debian: apt-get install openssl)")?;
    anyhow::ensure!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

impl EtcdTls {
    /// Makes a CA and the certificates it signs in `dir`.
    pub async fn make(dir: &Path) -> Result<Self> {
        let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        openssl(
            dir,
            &[
                &["req", "-x509"][..],
                &key,
                &["-days", "1", "-subj", "/CN=fleetdeck test CA", "-keyout", "ca.key", "-out", "ca.pem"],
            ]
            .concat(),
        )
        .await?;
        // etcd's JSON gateway calls etcd's own gRPC port with the server certificate as its client
        // certificate, so under --client-cert-auth that certificate must allow client auth too.
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
        )?;
        std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n")?;
        for (name, subject) in [("server", "/CN=etcd"), ("client", "/CN=fleet-router")] {
            let (key_file, csr, pem, ext) =
                (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
            openssl(
                dir,
                &[&["req"][..], &key, &["-subj", subject, "-keyout", &key_file, "-out", &csr]].concat(),
            )
            .await?;
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "1",
                    "-extfile",
                    &ext,
                    "-out",
                    &pem,
                ],
            )
            .await?;
        }
        Ok(Self {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
        })
    }
}

/// What etcd logs when a port it was told to listen on is taken.
const PORT_TAKEN: &str = "address already in use";

/// One etcd member on loopback, stopped when dropped.
pub struct EtcdServer {
    process: Option<ChildProcess>,
    client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
    tls: Option<EtcdTls>,
}

impl EtcdServer {
    /// Starts etcd on free ports with a fresh data folder and waits until it answers.
    pub async fn start() -> Result<Self> {
        let server = Self {
            process: None,
            client_port: free_port()?,
            peer_port: free_port()?,
            dir: tempfile::tempdir()?,
            tls: None,
        };
        server.start_on_free_ports().await
    }

    /// Starts etcd serving https that trusts only client certificates signed by its test CA.
    pub async fn start_tls() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let tls = EtcdTls::make(dir.path()).await?;
        let server =
            Self { process: None, client_port: free_port()?, peer_port: free_port()?, dir, tls: Some(tls) };
        server.start_on_free_ports().await
    }

    /// Starts it, on other free ports with a clean data folder when a port it was given was taken between
    /// picking and binding it (another test bound it first).
    async fn start_on_free_ports(mut self) -> Result<Self> {
        const ATTEMPTS: usize = 5;
        for attempt in 1..=ATTEMPTS {
            match self.restart().await {
                Ok(()) => return Ok(self),
                Err(_) if attempt < ATTEMPTS && self.log().contains(PORT_TAKEN) => {
                    self.kill();
                    self.client_port = free_port()?;
                    self.peer_port = free_port()?;
                    let _ = std::fs::remove_dir_all(self.data_dir());
                }
                Err(error) => return Err(error),
            }
        }
        unreachable!("the last attempt returns")
    }

    /// Its TLS files, when it serves https.
    pub fn tls(&self) -> Option<&EtcdTls> {
        self.tls.as_ref()
    }

    /// The client URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// A client for it (plain http only: a TLS client needs fleet-etcd's `tls` feature, see [`Self::config`]).
    pub fn client(&self) -> Result<EtcdClient> {
        Ok(EtcdClient::new(self.config())?)
    }

    /// A client configuration for it, with the CA and the client certificate when it serves https.
    pub fn config(&self) -> EtcdConfig {
        let mut config = EtcdConfig::new(&self.url());
        if let Some(tls) = &self.tls {
            config.tls = fleet_etcd::TlsFiles {
                ca: Some(tls.ca.clone()),
                cert: Some(tls.client_cert.clone()),
                key: Some(tls.client_key.clone()),
            };
        }
        config
    }

    /// Its process id while it runs (for CPU and memory readings).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(|process| process.child.id())
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
            .args(["--logger", "zap", "--log-level", "warn"]);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.server_cert)
                .arg("--key-file")
                .arg(&tls.server_key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        self.process = Some(ChildProcess::spawn(&mut command).context("cannot start etcd")?);
        let url = self.url();
        let tls = self.tls.clone();
        let log_path = self.dir.path().join("etcd.log");
        eventually("etcd to answer", Duration::from_secs(30), || {
            let (url, tls, log_path) = (url.clone(), tls.clone(), log_path.clone());
            // etcdctl, a client of etcd's own, so the probe needs no TLS in this crate's build.
            async move {
                // A port taken under it: etcd has exited, no need to wait out the deadline.
                if std::fs::read_to_string(&log_path).is_ok_and(|log| log.contains(PORT_TAKEN)) {
                    return Ok(Some(false));
                }
                let mut etcdctl = Command::new("etcdctl");
                etcdctl.env("ETCDCTL_API", "3").args([
                    "--endpoints",
                    &url,
                    "--dial-timeout",
                    "1s",
                    "endpoint",
                    "health",
                ]);
                if let Some(tls) = &tls {
                    etcdctl
                        .arg("--cacert")
                        .arg(&tls.ca)
                        .arg("--cert")
                        .arg(&tls.client_cert)
                        .arg("--key")
                        .arg(&tls.client_key);
                }
                let output =
                    etcdctl.output().await.context("cannot run etcdctl; run `cargo xtask setup --test`")?;
                Ok(output.status.success().then_some(true))
            }
        })
        .await
        .with_context(|| format!("etcd's log: {}", self.log()))
        .and_then(|answered| {
            if answered { Ok(()) } else { bail!("etcd could not bind its ports; etcd's log: {}", self.log()) }
        })
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
