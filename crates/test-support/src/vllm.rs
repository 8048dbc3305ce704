//! Real vLLM servers (vLLM's CPU build in the venv `cargo xtask engines vllm` installs) on free loopback
//! ports, serving the small random-weight model made there, with prefix caching, KV-cache events over
//! ZMQ and per-request cached-token counts on, for tests that need the engine most fleets run.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::process::Command;

use crate::process::ChildProcess;

/// The name the servers answer to (`--served-model-name`), what clients send as `model`.
pub const VLLM_MODEL: &str = "tiny-llama3";

/// The block size the servers run with (vLLM's CPU attention takes multiples of 32 only).
pub const VLLM_BLOCK_SIZE: u32 = 32;

/// How long a server may take to load (30-60 s measured on two quiet cores; more beside other builds).
const STARTUP: Duration = Duration::from_secs(300);

/// The installed engine: the venv's Python and the model folder.
#[derive(Debug, Clone)]
pub struct VllmBuild {
    pub python: PathBuf,
    pub model: PathBuf,
}

impl VllmBuild {
    /// The model's `tokenizer.json` (what fleet-router's `--tokenizer` takes).
    pub fn tokenizer(&self) -> PathBuf {
        self.model.join("tokenizer.json")
    }
}

/// `FLEETDECK_VLLM_DIR` (set by `cargo xtask test`), else the engines cache beside or under the target
/// folder; an error saying how to install it when there is none.
pub fn vllm_build() -> Result<VllmBuild> {
    let candidates = crate::engines::engine_dirs("FLEETDECK_VLLM_DIR", "vllm-");
    for dir in &candidates {
        if let Some(build) = build_in(dir) {
            return Ok(build);
        }
    }
    bail!(
        "no vLLM install found (looked in {:?}); run `cargo xtask engines vllm` (cargo xtask test does) \
         and set FLEETDECK_VLLM_DIR to the folder it prints",
        candidates
    )
}

fn build_in(dir: &Path) -> Option<VllmBuild> {
    let python = dir.join("venv/bin/python");
    if !python.exists() || !dir.join("venv/.fleetdeck-complete").exists() {
        return None;
    }
    let model = std::fs::read_dir(dir.join("models"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("model.safetensors").exists() && p.join("tokenizer.json").exists())?;
    Some(VllmBuild { python, model })
}

/// The `sitecustomize.py` every server here runs with: vLLM's workers wait for a step instead of spinning a
/// core for a second after each one (the file says why and how).
pub const VLLM_SITECUSTOMIZE: &str = include_str!("../vllm/sitecustomize.py");

/// A folder holding [`VLLM_SITECUSTOMIZE`] as `sitecustomize.py`, for a server's PYTHONPATH: beside the venv,
/// rewritten (through a rename, so that servers starting at once never read half a file) when it differs.
pub fn sitecustomize_dir(build: &VllmBuild) -> Result<PathBuf> {
    let venv =
        build.python.parent().and_then(Path::parent).context("the venv's python has no venv folder")?;
    let dir = venv.join("fleetdeck-site");
    let file = dir.join("sitecustomize.py");
    if std::fs::read_to_string(&file).ok().as_deref() != Some(VLLM_SITECUSTOMIZE) {
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let partial = tempfile::NamedTempFile::new_in(&dir)?;
        std::fs::write(partial.path(), VLLM_SITECUSTOMIZE)?;
        partial.persist(&file).with_context(|| format!("cannot write {}", file.display()))?;
    }
    Ok(dir)
}

/// How a test's servers are sized: small, so two run beside each other on two cores.
#[derive(Debug, Clone)]
pub struct VllmOptions {
    /// `--max-model-len`.
    pub max_model_len: u32,
    /// `--num-gpu-blocks-override`: the KV cache's size in blocks (`None`: what `kv_cache_gib` holds).
    pub kv_blocks: Option<u32>,
    /// `VLLM_CPU_KVCACHE_SPACE` in GiB.
    pub kv_cache_gib: u32,
    /// `--max-num-seqs`.
    pub max_num_seqs: u32,
    /// A KV connector (`--kv-transfer-config`), for disaggregated prefill/decode.
    pub kv_connector: Option<KvConnector>,
}

/// vLLM's `ExampleConnector`: KV saved to, and loaded from, files under a folder both servers share, found by
/// the prompt's tokens. The one connector of vLLM 0.32 that runs on its CPU build (NIXL needs UCX and a
/// `nixl` build; Mooncake, LMCache and the others need their own services or a GPU).
#[derive(Debug, Clone)]
pub struct KvConnector {
    /// `kv_producer` (a prefill server), `kv_consumer` (a decode server) or `kv_both`.
    pub role: &'static str,
    /// The shared folder (`shared_storage_path`).
    pub path: std::path::PathBuf,
}

impl Default for VllmOptions {
    fn default() -> Self {
        Self { max_model_len: 4096, kv_blocks: None, kv_cache_gib: 1, max_num_seqs: 8, kv_connector: None }
    }
}

/// One running vLLM server, killed when dropped.
pub struct VllmServer {
    pub process: ChildProcess,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The ZMQ PUB endpoint of its KV events, `tcp://127.0.0.1:PORT`.
    pub kv_endpoint: String,
    port: u16,
    kv_port: u16,
    options: VllmOptions,
    /// Its log (stdout and stderr), kept for error messages.
    log: tempfile::NamedTempFile,
}

impl VllmServer {
    /// Kills the server at once (SIGKILL to its process group: the API server, the engine core and its
    /// worker), as a crash would.
    pub fn kill(&mut self) {
        if let Some(pid) = self.process.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }

    /// Kills the server and starts a new one on the same ports (a restart as an operator does it), waiting
    /// until it is ready again.
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        let _ = tokio::time::timeout(Duration::from_secs(30), self.process.child.wait()).await;
        // The ports are free once the group is gone; the new server binds the same ones.
        let (process, log) = start(self.port, self.kv_port, self.options.clone()).await?;
        self.process = process;
        self.log = log;
        Ok(())
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(self.log.path(), lines)
    }
}

fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// What vLLM's log says when a port it was given is no longer free (ZMQ's and uvicorn's wording).
const PORT_TAKEN: &str = "Address already in use";

fn free_port() -> Result<u16> {
    // vLLM logs the port it was given, not the one it bound, so it gets a port that was free a moment ago.
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts a vLLM server on free loopback ports (HTTP and KV events) and waits until `/health` answers.
///
/// vLLM binds its KV-event socket half a minute after it was given the port, while it loads the model;
/// in that time another process can take the port (an outgoing connection's ephemeral port, another
/// test's server). Then it starts again on other ports, as the etcd helper does.
pub async fn spawn_vllm_server(options: VllmOptions) -> Result<VllmServer> {
    const ATTEMPTS: usize = 3;
    let mut attempt = 1;
    let (port, kv_port, process, log) = loop {
        let (port, kv_port) = (free_port()?, free_port()?);
        match start(port, kv_port, options.clone()).await {
            Ok((process, log)) => break (port, kv_port, process, log),
            Err(error) if attempt < ATTEMPTS && format!("{error:#}").contains(PORT_TAKEN) => attempt += 1,
            Err(error) => return Err(error),
        }
    };
    Ok(VllmServer {
        process,
        url: format!("http://127.0.0.1:{port}"),
        kv_endpoint: format!("tcp://127.0.0.1:{kv_port}"),
        port,
        kv_port,
        options,
        log,
    })
}

/// Starts `n` servers one after the other (their loads would only compete for the two cores).
pub async fn spawn_vllm_servers(n: usize, options: VllmOptions) -> Result<Vec<VllmServer>> {
    let mut servers = Vec::with_capacity(n);
    for _ in 0..n {
        servers.push(spawn_vllm_server(options.clone()).await?);
    }
    Ok(servers)
}

async fn start(
    port: u16,
    kv_port: u16,
    options: VllmOptions,
) -> Result<(ChildProcess, tempfile::NamedTempFile)> {
    let build = vllm_build()?;
    let log = tempfile::Builder::new().prefix("vllm-").suffix(".log").tempfile()?;
    // vLLM binds its PUB socket only for a wildcard endpoint (`tcp://*:PORT`); `tcp://HOST:PORT` would make it
    // connect to a subscriber that binds.
    let kv_events = format!(
        r#"{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:{kv_port}","topic":"kv-events"}}"#
    );
    let mut command = Command::new(&build.python);
    command
        .args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
        .arg(&build.model)
        .args(["--served-model-name", VLLM_MODEL, "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--dtype", "bfloat16", "--max-model-len", &options.max_model_len.to_string()])
        .args(["--enable-prefix-caching", "--block-size", &VLLM_BLOCK_SIZE.to_string()])
        .args(["--max-num-seqs", &options.max_num_seqs.to_string(), "--enable-prompt-tokens-details"])
        .args(["--kv-events-config", &kv_events])
        .env("PYTHONPATH", sitecustomize_dir(&build)?)
        .env("VLLM_CPU_KVCACHE_SPACE", options.kv_cache_gib.to_string())
        .env("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        // One compute thread: two or three servers with torch's thread per core oversubscribe the cores;
        // in `cargo xtask bench real --engine vllm` that stalled every server at once, most likely OpenMP
        // threads spinning at barriers (one thread, or idle threads that sleep, ended it).
        .env("OMP_NUM_THREADS", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("DO_NOT_TRACK", "1")
        .stdin(Stdio::null())
        .stdout(log.reopen()?)
        .stderr(log.reopen()?);
    if let Some(blocks) = options.kv_blocks {
        command.args(["--num-gpu-blocks-override", &blocks.to_string()]);
    }
    if let Some(connector) = &options.kv_connector {
        let config = serde_json::json!({
            "kv_connector": "ExampleConnector",
            "kv_role": connector.role,
            "kv_connector_extra_config": {"shared_storage_path": connector.path},
        });
        command.args(["--kv-transfer-config", &config.to_string()]);
    }
    let mut process = ChildProcess::spawn(&mut command)
        .with_context(|| format!("cannot start vLLM with {}", build.python.display()))?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let health = format!("http://127.0.0.1:{port}/health");
    // Polled with a deadline like `eventually`, but a server that exits fails at once, with its log.
    let started = Instant::now();
    loop {
        if let Some(status) = process.child.try_wait()? {
            bail!(
                "vLLM exited ({status}) before it was ready; its last lines:\n{}",
                log_tail(log.path(), 30)
            );
        }
        if client.get(&health).send().await.is_ok_and(|response| response.status() == 200) {
            break;
        }
        if started.elapsed() > STARTUP {
            bail!(
                "vLLM did not answer {health} within {STARTUP:?}; its last lines:\n{}",
                log_tail(log.path(), 30)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok((process, log))
}
