//! TLS fixtures made with the real openssl command-line tool: a self-signed certificate for 127.0.0.1
//! and `openssl s_server -WWW`, an HTTPS server of a directory's files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::process::{ChildProcess, spawn_command_and_await_line};
use crate::webdriver::free_port;

/// A self-signed P-256 certificate for IP 127.0.0.1 in `dir`: (certificate, private key), PEM.
pub async fn self_signed_certificate(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let status = tokio::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
        .args(["-days", "1", "-subj", "/CN=fleetdeck test", "-addext", "subjectAltName=IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .context("cannot run openssl (Debian: apt-get install openssl)")?;
    anyhow::ensure!(status.success(), "openssl could not make a certificate");
    Ok((cert, key))
}

/// An HTTPS server of the files in `dir` (`GET /NAME` answers the file NAME), until dropped.
pub struct HttpsFiles {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    _process: ChildProcess,
}

/// Starts `openssl s_server -WWW` in `dir` with the certificate and key.
pub async fn https_file_server(dir: &Path, cert: &Path, key: &Path) -> Result<HttpsFiles> {
    let port = free_port()?;
    let mut command = tokio::process::Command::new("openssl");
    // s_server -WWW serves paths relative to its working directory.
    command.current_dir(dir).args(["s_server", "-WWW", "-accept", &format!("127.0.0.1:{port}")]);
    command.arg("-cert").arg(cert).arg("-key").arg(key);
    let (process, _) = spawn_command_and_await_line(&mut command, "ACCEPT", Duration::from_secs(20)).await?;
    Ok(HttpsFiles { url: format!("https://127.0.0.1:{port}"), _process: process })
}
