//! Real llama.cpp servers (`llama-server`, built by `cargo xtask engines llamacpp`) on free loopback ports,
//! serving the small random-weight model, for tests that need a real engine rather than fleet-sim.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::eventually;
use crate::process::ChildProcess;

/// The name the servers answer to (`--alias`), what `/v1/models` lists and clients send as `model`.
pub const LLAMACPP_MODEL: &str = "tiny-llama";

/// The built engine: `bin/llama-server` and `models/*.gguf` under one folder.
#[derive(Debug, Clone)]
pub struct LlamaCppBuild {
    pub server: PathBuf,
    pub model: PathBuf,
}

/// `FLEETDECK_LLAMACPP_DIR` (set by `cargo xtask test`), else the engines cache beside or under the
/// target folder; an error saying how to build it when there is none.
pub fn llamacpp_build() -> Result<LlamaCppBuild> {
    let candidates = crate::engines::engine_dirs("FLEETDECK_LLAMACPP_DIR", "llamacpp-");
    for dir in &candidates {
        if let Some(build) = build_in(dir) {
            return Ok(build);
        }
    }
    bail!(
        "no llama.cpp build found (looked in {:?}); run `cargo xtask engines llamacpp` (cargo xtask test does) \
         and set FLEETDECK_LLAMACPP_DIR to the folder it prints",
        candidates
    )
}

fn build_in(dir: &Path) -> Option<LlamaCppBuild> {
    let server = dir.join("bin/llama-server");
    let model = std::fs::read_dir(dir.join("models"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "gguf"))?;
    server.exists().then_some(LlamaCppBuild { server, model })
}

/// How a test's servers are sized: small, so three run beside each other on two cores.
#[derive(Debug, Clone, Copy)]
pub struct LlamaCppOptions {
    /// `--parallel`: slots, each its own sequence with its own prompt cache.
    pub slots: u32,
    /// `--ctx-size`, shared by the slots.
    pub ctx: u32,
    /// `--threads`.
    pub threads: u32,
}

impl Default for LlamaCppOptions {
    fn default() -> Self {
        Self { slots: 2, ctx: 4096, threads: 1 }
    }
}

/// One running `llama-server`, killed when dropped.
pub struct LlamaServer {
    pub process: ChildProcess,
    pub url: String,
}

impl LlamaServer {
    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.process.child.start_kill();
    }
}

/// Starts `llama-server` on `127.0.0.1:0` (it binds any free port and logs which) with `/metrics` and
/// `/slots` on, and waits until `/health` says the model is loaded.
pub async fn spawn_llama_server(options: LlamaCppOptions) -> Result<LlamaServer> {
    let build = llamacpp_build()?;
    let mut command = Command::new(&build.server);
    command
        .arg("--model")
        .arg(&build.model)
        .args(["--alias", LLAMACPP_MODEL, "--host", "127.0.0.1", "--port", "0", "--metrics", "--slots"])
        .args(["--parallel", &options.slots.to_string(), "--ctx-size", &options.ctx.to_string()])
        .args(["--threads", &options.threads.to_string(), "--chat-template", "chatml", "--no-webui"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut process = ChildProcess::spawn(&mut command)
        .with_context(|| format!("cannot start {}", build.server.display()))?;
    let stderr = process.child.stderr.take().context("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let url = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if let Some((_, address)) = line.split_once("listening on ") {
                return Ok(Some(address.trim().trim_end_matches('/').to_owned()));
            }
            seen.push(line);
            if seen.len() > 40 {
                seen.remove(0);
            }
        }
        anyhow::Ok(None)
    })
    .await
    .context("llama-server logged no `listening on` line within 60 s")??;
    let Some(url) = url else {
        bail!("llama-server exited before listening; its last lines:\n{}", seen.join("\n"));
    };
    // Keep draining its log so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let health = format!("{url}/health");
    eventually("llama-server to load its model", Duration::from_secs(60), || async {
        Ok((client.get(&health).send().await?.status() == 200).then_some(()))
    })
    .await?;
    Ok(LlamaServer { process, url })
}

/// Starts `n` servers side by side.
pub async fn spawn_llama_servers(n: usize, options: LlamaCppOptions) -> Result<Vec<LlamaServer>> {
    let mut servers = Vec::with_capacity(n);
    for _ in 0..n {
        servers.push(spawn_llama_server(options).await?);
    }
    Ok(servers)
}
