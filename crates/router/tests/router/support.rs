//! Shared pieces of the router tests: a router on port 0, fleet-sim processes, SSE parsing.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use fleet_router::{RouterConfig, RouterState};
use fleet_test_support::process::{ChildProcess, bin_path, spawn_and_await_line};
use serde_json::Value;
use tokio_util::sync::{CancellationToken, DropGuard};

/// The admin token the tests configure.
pub const TOKEN: &str = "test-admin-token-0123456789";

/// A router serving until dropped.
pub struct TestRouter {
    pub url: String,
    pub state: Arc<RouterState>,
    _stop: DropGuard,
}

impl TestRouter {
    /// `GET path` on the router's admin API with the test token, its body read as JSON.
    pub async fn admin_get(&self, http: &reqwest::Client, path: &str) -> Result<Value> {
        let response = http.get(format!("{}{path}", self.url)).bearer_auth(TOKEN).send().await?;
        Ok(response.json().await?)
    }
}

/// Starts a router with `config` on a free loopback port.
pub async fn router(config: RouterConfig) -> Result<TestRouter> {
    let listener = fleet_test_support::loopback_listener().await?;
    let url = format!("http://{}", listener.local_addr()?);
    let stop = CancellationToken::new();
    let token = stop.clone();
    let (state, _server) =
        fleet_router::start(listener, config, async move { token.cancelled().await }).await?;
    Ok(TestRouter { url, state, _stop: stop.drop_guard() })
}

/// A router over `replicas` with the admin token set and fast health probes.
pub async fn admin_router(replicas: &[String]) -> Result<TestRouter> {
    router(RouterConfig {
        replicas: replicas.to_vec(),
        admin_token: Some(TOKEN.into()),
        ..RouterConfig::default()
    })
    .await
}

/// An HTTP client with a deadline on every request.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("a client")
}

/// One `fleet-sim serve` process with one replica.
pub struct SimProcess {
    pub url: String,
    pub port: u16,
    _process: ChildProcess,
}

impl SimProcess {
    /// Starts a replica on `port` (0 = a free one) and waits until it serves.
    pub async fn start(port: u16) -> Result<Self> {
        let args: Vec<String> = ["serve", "--replicas", "1", "--base-port", &port.to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (process, rest) = spawn_and_await_line(
            &bin_path("fleet-sim")?,
            &args,
            &[],
            "replica 0 serving",
            Duration::from_secs(30),
        )
        .await?;
        let url = rest.rsplit(" at ").next().context("no URL in fleet-sim's line")?.trim().to_owned();
        let port =
            url.rsplit(':').next().and_then(|p| p.parse().ok()).context("no port in fleet-sim's URL")?;
        Ok(Self { url, port, _process: process })
    }

    /// Starts a replica that publishes vLLM-style KV events; returns it with its (PUB, replay) endpoints.
    pub async fn start_with_kv_events() -> Result<(Self, String, String)> {
        Self::start_with_kv_events_as("vllm").await
    }

    /// [`Self::start_with_kv_events`] with the batches in `encoding` (`--kv-events-encoding`).
    pub async fn start_with_kv_events_as(encoding: &str) -> Result<(Self, String, String)> {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let mut process = ChildProcess::spawn(
            tokio::process::Command::new(bin_path("fleet-sim")?)
                .args(["serve", "--replicas", "1", "--base-port", "0", "--kv-events", "tcp://127.0.0.1:0"])
                .args(["--kv-events-encoding", encoding])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::inherit()),
        )?;
        let stdout = process.child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let (mut url, mut endpoints) = (None, None);
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.strip_prefix("replica 0 serving") {
                    url = rest.rsplit(" at ").next().map(|u| u.trim().to_owned());
                }
                if let Some(rest) = line.strip_prefix("replica 0 kv events at ") {
                    endpoints =
                        rest.split_once(" replay ").map(|(p, r)| (p.trim().to_owned(), r.trim().to_owned()));
                }
                if url.is_some() && endpoints.is_some() {
                    break;
                }
            }
            anyhow::Ok(())
        })
        .await
        .context("fleet-sim did not print its URL and KV endpoints in 30 s")??;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let url = url.context("no URL line")?;
        let (publish, replay) = endpoints.context("no KV endpoint line")?;
        let port = url.rsplit(':').next().and_then(|p| p.parse().ok()).context("no port")?;
        Ok((Self { url, port, _process: process }, publish, replay))
    }

    /// Kills the process (SIGKILL of its group): in-flight connections break.
    pub fn kill(self) -> u16 {
        self.port
    }
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| event.lines().find_map(|line| line.strip_prefix("data: ")))
        .map(str::to_owned)
        .collect()
}

/// A chat request body.
pub fn chat(system: &str, user: &str, max_tokens: u32, stream: bool) -> Value {
    serde_json::json!({
        "model": fleet_sim::DEFAULT_MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}
