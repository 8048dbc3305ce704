//! Real browsers for UI tests: headless Chromium through chromedriver, and the Tauri
//! window through tauri-driver (WebKitWebDriver) on an Xvfb display.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use tokio::process::Command;

use crate::process::{ChildProcess, spawn_and_await_line};
use crate::wait::eventually;

/// A WebDriver server, stopped when dropped.
pub struct Driver {
    _process: ChildProcess,
    pub url: String,
    /// Holds the browser profile (Chromium) until the driver goes.
    _profile: Option<tempfile::TempDir>,
}

/// A free loopback port. WebDriver servers take a port number rather than a listener, so
/// the port is released before the server binds it; a clash is possible but unlikely.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Longest wait for a browser or the app window to start.
const SESSION_DEADLINE: Duration = Duration::from_secs(90);

fn connector() -> HttpConnector {
    HttpConnector::new()
}

/// Starts chromedriver (Debian's chromium-driver) on a free port.
pub async fn chromedriver() -> Result<Driver> {
    let port = free_port()?;
    let (process, _) = spawn_and_await_line(
        Path::new("chromedriver"),
        &[format!("--port={port}")],
        &[],
        "ChromeDriver was started successfully",
        Duration::from_secs(30),
    )
    .await
    .context("chromedriver did not start; install Debian's chromium and chromium-driver (cargo xtask setup --test)")?;
    Ok(Driver {
        _process: process,
        url: format!("http://127.0.0.1:{port}"),
        _profile: Some(tempfile::tempdir()?),
    })
}

/// Opens a headless Chromium session (as root it needs --no-sandbox; the other flags keep it
/// off the network, which this machine does not have).
pub async fn chromium_session(driver: &Driver) -> Result<Client> {
    let profile =
        driver._profile.as_ref().context("not a chromium driver")?.path().to_string_lossy().into_owned();
    let capabilities = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1280,800", format!("--user-data-dir={profile}"),
            ],
        },
    });
    connect(driver, capabilities).await
}

async fn connect(driver: &Driver, capabilities: Value) -> Result<Client> {
    let Value::Object(capabilities) = capabilities else { unreachable!("capabilities are an object") };
    let mut builder = ClientBuilder::new(connector());
    builder.capabilities(capabilities);
    tokio::time::timeout(SESSION_DEADLINE, builder.connect(&driver.url))
        .await
        .with_context(|| format!("no WebDriver session at {} within {SESSION_DEADLINE:?}", driver.url))?
        .with_context(|| format!("cannot open a WebDriver session at {}", driver.url))
}

/// An X virtual framebuffer, stopped when dropped.
pub struct Xvfb {
    _process: ChildProcess,
    /// The `DISPLAY` value, e.g. `:99`.
    pub display: String,
}

/// Starts Xvfb on a display number it picks itself (`-displayfd`), so tests never clash.
pub async fn xvfb() -> Result<Xvfb> {
    let args: Vec<String> = ["-displayfd", "1", "-screen", "0", "1280x800x24", "-nolisten", "tcp"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (process, number) = spawn_and_await_line(Path::new("Xvfb"), &args, &[], "", Duration::from_secs(30))
        .await
        .context("Xvfb did not start; install Debian's xvfb (cargo xtask setup --test)")?;
    Ok(Xvfb { _process: process, display: format!(":{number}") })
}

/// Starts tauri-driver (with WebKitWebDriver as its native driver) on `display`.
pub async fn tauri_driver(display: &str) -> Result<Driver> {
    let (port, native_port) = (free_port()?, free_port()?);
    let program = which("tauri-driver")?;
    // The driver, WebKitWebDriver and the app log to a file rather than to the test's own
    // output, which they must not hold open.
    let log = std::fs::File::create(crate::process::artifacts_dir()?.join("tauri-driver.log"))?;
    let process = ChildProcess::spawn(
        Command::new(&program)
            .args(["--port", &port.to_string(), "--native-port", &native_port.to_string()])
            .args(["--native-driver", "/usr/bin/WebKitWebDriver"])
            .env("DISPLAY", display)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log),
    )
    .with_context(|| format!("cannot start {}", program.display()))?;
    let url = format!("http://127.0.0.1:{port}");
    // tauri-driver listens before the WebKitWebDriver it spawned does, and answers a request
    // it cannot forward by closing the connection; so wait for both ports, not just its own.
    for (what, port) in [("tauri-driver", port), ("WebKitWebDriver", native_port)] {
        eventually(
            &format!("{what} to accept connections on port {port}"),
            Duration::from_secs(30),
            || async { Ok(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(|_| ())) },
        )
        .await?;
    }
    Ok(Driver { _process: process, url, _profile: None })
}

/// Opens a session that launches the Tauri `application` with `args` in a real window.
pub async fn tauri_session(driver: &Driver, application: &Path, args: &[String]) -> Result<Client> {
    let capabilities = json!({
        "browserName": "wry",
        "tauri:options": {"application": application, "args": args},
    });
    connect(driver, capabilities).await
}

/// Finds `name` on PATH or in cargo's bin folder (where `cargo install` puts it).
fn which(name: &str) -> Result<std::path::PathBuf> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")));
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(cargo_home.map(|c| c.join("bin")))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .with_context(|| format!("{name} is not installed; run `cargo xtask setup --test`"))
}
