//! Running the workspace's binaries as child processes, the way users run them.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Where cargo put the workspace's binaries: `FLEETDECK_BIN_DIR` (set by `cargo xtask
/// test`), else the profile folder above this test executable (`target/debug/deps/..`).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FLEETDECK_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default()
}

/// Path of workspace binary `name`, or an error saying how to build it.
pub fn bin_path(name: &str) -> Result<PathBuf> {
    let path = bin_dir().join(name);
    if !path.exists() {
        bail!(
            "{} does not exist; build it first with `cargo build --workspace --bins` (cargo xtask test does)",
            path.display()
        );
    }
    Ok(path)
}

/// Folder for screenshots and other things tests leave for people to look at.
pub fn artifacts_dir() -> Result<PathBuf> {
    let dir = bin_dir().parent().map(|t| t.join("test-artifacts")).context("no target folder")?;
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The resident set size of process `pid` in bytes (`VmRSS` in `/proc/PID/status`): what tests that bound a
/// program's memory measure.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .with_context(|| format!("no VmRSS in /proc/{pid}/status"))?;
    Ok(kib * 1024)
}

/// CPU seconds (user + system) process `pid` has used (`/proc/PID/stat`, `self` for this process; clock
/// ticks of 1/100 s, Linux's `USER_HZ`): what benchmarks that report a program's CPU read.
pub fn cpu_seconds(pid: &str) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    // The fields after the command name (which may hold spaces) start after its closing parenthesis;
    // utime and stime are the 12th and 13th of them.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |index: usize| fields.get(index).and_then(|field| field.parse::<u64>().ok());
    let ticks = tick(11)
        .zip(tick(12))
        .map(|(user, system)| user + system)
        .with_context(|| format!("no utime and stime in /proc/{pid}/stat"))?;
    Ok(ticks as f64 / 100.0)
}

/// Open file descriptors of process `pid` (entries of `/proc/PID/fd`).
pub fn open_fds(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("cannot list /proc/{pid}/fd"))?
        .count())
}

/// A child process, killed with every process it started when dropped.
///
/// Children run in their own process group so that helpers they spawn (tauri-driver starts
/// WebKitWebDriver, which starts the app) die with them instead of outliving the test and
/// holding its output pipes open.
pub struct ChildProcess {
    pub child: Child,
}

impl ChildProcess {
    /// Starts `command` as the leader of a new process group.
    pub fn spawn(command: &mut Command) -> std::io::Result<Self> {
        Ok(Self { child: command.process_group(0).kill_on_drop(true).spawn()? })
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            // Signal the whole group (negative pid); `kill` keeps this crate free of unsafe.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Starts `program` and reads its stdout until a line starts with `marker`; returns the
/// process and the rest of that line. Fails if the process exits or `deadline` passes first.
pub async fn spawn_and_await_line(
    program: &Path,
    args: &[String],
    envs: &[(&str, &str)],
    marker: &str,
    deadline: Duration,
) -> Result<(ChildProcess, String)> {
    let mut command = Command::new(program);
    command.args(args).envs(envs.iter().copied());
    spawn_command_and_await_line(&mut command, marker, deadline).await
}

/// [`spawn_and_await_line`] for a command set up by the caller (working directory and all).
pub async fn spawn_command_and_await_line(
    command: &mut Command,
    marker: &str,
    deadline: Duration,
) -> Result<(ChildProcess, String)> {
    let program = PathBuf::from(command.as_std().get_program());
    let mut process =
        ChildProcess::spawn(command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit()))
            .with_context(|| format!("cannot start {}", program.display()))?;
    let stdout = process.child.stdout.take().context("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let found = tokio::time::timeout(deadline, async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.strip_prefix(marker) {
                return Ok::<_, anyhow::Error>(Some(rest.trim().to_string()));
            }
        }
        Ok(None)
    })
    .await
    .with_context(|| {
        format!("{} printed no line starting with {marker:?} within {deadline:?}", program.display())
    })??;
    let Some(rest) = found else {
        let status = process.child.wait().await?;
        bail!("{} exited ({status}) before printing {marker:?}", program.display());
    };
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((process, rest))
}

/// The headless app, serving its UI and API until dropped.
pub struct HeadlessApp {
    pub process: ChildProcess,
    /// Base URL of the UI, e.g. `http://127.0.0.1:40123/`.
    pub url: String,
    /// The launch secret from the URL the app printed (`?token=`).
    pub token: String,
}

impl HeadlessApp {
    /// URL of API command `command`.
    pub fn api(&self, command: &str) -> String {
        format!("{}api/{command}", self.url)
    }

    /// The sign-in URL a browser opens, landing on `fragment` (e.g. `#/fleet`): the app swaps the
    /// token for its session cookie and redirects, and the browser keeps the fragment.
    pub fn page(&self, fragment: &str) -> String {
        format!("{}?token={}{fragment}", self.url, self.token)
    }

    /// The URL of `fragment` in a browser already signed in with [`HeadlessApp::page`]: a change of
    /// fragment alone, so the UI keeps its state as when the operator clicks a tab.
    pub fn view(&self, fragment: &str) -> String {
        format!("{}{fragment}", self.url)
    }

    /// An HTTP client signed in as a script is: the launch secret as a bearer token on every request.
    pub fn client(&self) -> Result<reqwest::Client> {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {}", self.token).parse()?);
        Ok(reqwest::Client::builder().default_headers(headers).timeout(Duration::from_secs(20)).build()?)
    }
}

/// Starts `fleetdeck --headless --listen 127.0.0.1:0` with `extra` arguments and environment, and reads
/// the sign-in URL it prints.
pub async fn spawn_headless(extra: &[String], envs: &[(&str, &str)]) -> Result<HeadlessApp> {
    spawn_headless_at(&bin_path("fleetdeck")?, extra, envs).await
}

/// [`spawn_headless`] with the `fleetdeck` binary at `program` (e.g. one installed from the package).
pub async fn spawn_headless_at(
    program: &Path,
    extra: &[String],
    envs: &[(&str, &str)],
) -> Result<HeadlessApp> {
    let mut args = vec!["--headless".to_string(), "--listen".into(), "127.0.0.1:0".into()];
    args.extend_from_slice(extra);
    let (process, printed) =
        spawn_and_await_line(program, &args, envs, "Fleetdeck UI at", Duration::from_secs(90)).await?;
    let link = sign_in_link(&printed)?;
    let (url, token) = link
        .split_once("?token=")
        .with_context(|| format!("the app's sign-in link {link:?} has no ?token= to sign in with"))?;
    Ok(HeadlessApp { process, url: url.to_owned(), token: token.to_owned() })
}

/// The sign-in link from the rest of the app's `Fleetdeck UI at` line: the link itself (printed to a
/// terminal), or read from the 0600 file the line names (stdout not a terminal, as under a test).
pub fn sign_in_link(printed: &str) -> Result<String> {
    if printed.contains("?token=") {
        return Ok(printed.trim().to_owned());
    }
    let file = printed
        .split_once(" is in ")
        .and_then(|(_, rest)| rest.rsplit_once(", readable only by you)"))
        .map(|(file, _)| file)
        .with_context(|| {
            format!("the app printed {printed:?}: neither a sign-in link nor the file holding it")
        })?;
    let link =
        std::fs::read_to_string(file).with_context(|| format!("cannot read the sign-in file {file}"))?;
    Ok(link.trim().to_owned())
}

/// Starts `fleetdeck --headless` on a free loopback port watching `replicas`.
pub async fn spawn_headless_app(replicas: &[String], db: &Path) -> Result<HeadlessApp> {
    spawn_headless_app_at(&bin_path("fleetdeck")?, replicas, db).await
}

/// [`spawn_headless_app`] with the `fleetdeck` binary at `program` (e.g. one installed from the
/// package).
pub async fn spawn_headless_app_at(program: &Path, replicas: &[String], db: &Path) -> Result<HeadlessApp> {
    let mut args = vec!["--db".to_string(), db.to_string_lossy().into_owned()];
    for replica in replicas {
        args.push("--replica".into());
        args.push(replica.clone());
    }
    spawn_headless_at(program, &args, &[]).await
}

/// Starts the `fleet-router` binary with `args` (add `--listen 127.0.0.1:0` for a free port) and waits until
/// it listens; returns it and its base URL.
pub async fn spawn_router_process(args: &[String]) -> Result<(ChildProcess, String)> {
    let (process, rest) = spawn_and_await_line(
        &bin_path("fleet-router")?,
        args,
        &[("RUST_LOG", "warn")],
        "fleet-router listening on ",
        Duration::from_secs(60),
    )
    .await?;
    let url = rest.split_whitespace().next().context("no URL in fleet-router's first line")?.to_owned();
    Ok((process, url))
}
