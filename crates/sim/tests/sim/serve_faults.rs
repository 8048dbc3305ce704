//! Fault injection through the admin API of a real `fleet-sim serve` process: the token is
//! enforced, and every fault is observable by a plain HTTP client.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use fleet_test_support::eventually;
use fleet_test_support::process::ChildProcess;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::serve::{MODEL, client, prompt};

/// A `fleet-sim serve` child process and what it printed.
pub(crate) struct SimProcess {
    pub process: ChildProcess,
    pub replicas: Vec<String>,
    pub admin: Option<String>,
}

/// Starts the fleet-sim binary (`FLEET_SIM_BIN` if set, e.g. a release build to measure, else
/// this package's) with `args` after `serve`, reading its start-up lines until every replica
/// (and the admin API, if asked for) is listed.
pub(crate) async fn spawn_sim(args: &[&str], envs: &[(&str, &str)]) -> Result<SimProcess> {
    let replicas: usize = args
        .iter()
        .position(|a| *a == "--replicas")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(4);
    let wants_admin = args.contains(&"--admin-listen");
    let mut process = ChildProcess::spawn(
        tokio::process::Command::new(
            std::env::var("FLEET_SIM_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_fleet-sim").into()),
        )
        .arg("serve")
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit()),
    )?;
    let mut lines = BufReader::new(process.child.stdout.take().context("stdout")?).lines();
    let mut sim = SimProcess { process, replicas: Vec::new(), admin: None };
    tokio::time::timeout(Duration::from_secs(60), async {
        while sim.replicas.len() < replicas || (wants_admin && sim.admin.is_none()) {
            let line = lines.next_line().await?.context("fleet-sim exited during start-up")?;
            if let Some((_, url)) =
                line.split_once(" at ").filter(|_| line.starts_with("replica ") && line.contains(" serving "))
            {
                sim.replicas.push(url.to_string());
            } else if let Some(url) = line.strip_prefix("admin API at ") {
                sim.admin = Some(url.to_string());
            }
        }
        Ok::<_, anyhow::Error>(())
    })
    .await
    .context("fleet-sim did not start within 60 s")??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(sim)
}

async fn put_faults(admin: &str, token: &str, index: usize, faults: Value) -> Result<Value> {
    let response = client()
        .put(format!("{admin}/admin/replicas/{index}/faults"))
        .bearer_auth(token)
        .json(&faults)
        .send()
        .await?;
    ensure!(response.status().is_success(), "PUT faults: {}", response.status());
    Ok(response.json().await?)
}

async fn chat(url: &str, stream: bool) -> Result<reqwest::Response> {
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": prompt("faults", 2)}], "max_tokens": 10, "stream": stream});
    client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .with_context(|| format!("chat request (stream: {stream}) to {url}"))
}

#[tokio::test]
async fn the_admin_api_needs_the_token_and_every_fault_is_observable() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n")?;
    let token_path = token_file.to_string_lossy().into_owned();
    let sim = spawn_sim(
        &[
            "--replicas",
            "2",
            "--base-port",
            "0",
            "--admin-listen",
            "127.0.0.1:0",
            "--admin-token-file",
            &token_path,
        ],
        &[],
    )
    .await?;
    let admin = sim.admin.clone().context("admin url")?;
    let token = "s3cret-token";
    let url = sim.replicas[0].clone();

    // Authorisation.
    let anonymous = client().get(format!("{admin}/admin/replicas")).send().await?;
    assert_eq!(anonymous.status(), 401);
    let body: Value = anonymous.json().await?;
    assert_eq!(body["code"], "unauthorized");
    let wrong = client().get(format!("{admin}/admin/replicas")).bearer_auth("s3cret-tokeN").send().await?;
    assert_eq!(wrong.status(), 401);
    let wrong_put = client()
        .put(format!("{admin}/admin/replicas/0/faults"))
        .bearer_auth("nope")
        .json(&json!({"down": true}))
        .send()
        .await?;
    assert_eq!(wrong_put.status(), 401);
    let listed: Value =
        client().get(format!("{admin}/admin/replicas")).bearer_auth(token).send().await?.json().await?;
    assert_eq!(listed[1]["url"], sim.replicas[1].as_str());
    assert_eq!(listed[0]["faults"]["error_rate"], 0.0);
    let invalid = client()
        .put(format!("{admin}/admin/replicas/0/faults"))
        .bearer_auth(token)
        .json(&json!({"error_rate": 2}))
        .send()
        .await?;
    assert_eq!(invalid.status(), 422);
    let unknown = client()
        .put(format!("{admin}/admin/replicas/9/faults"))
        .bearer_auth(token)
        .json(&json!({}))
        .send()
        .await?;
    assert_eq!(unknown.status(), 404);

    // Error rate 1: every generation fails with a 5xx before any byte; the other replica is fine.
    put_faults(&admin, token, 0, json!({"error_rate": 1.0})).await?;
    assert_eq!(chat(&url, false).await?.status(), 500);
    assert_eq!(chat(&sim.replicas[1], false).await?.status(), 200);

    // Added latency: no answer sooner than the delay, on any route.
    put_faults(&admin, token, 0, json!({"added_latency_ms": 400})).await?;
    let start = Instant::now();
    assert_eq!(client().get(format!("{url}/health")).send().await?.status(), 200);
    assert!(start.elapsed() >= Duration::from_millis(400), "took {:?}", start.elapsed());

    // Stall: headers come, the first token does not until the stall is over.
    put_faults(&admin, token, 0, json!({"stall_ms": 500})).await?;
    let start = Instant::now();
    let response = chat(&url, true).await?;
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let first = stream.next().await.context("no first chunk")??;
    assert!(start.elapsed() >= Duration::from_millis(500), "first token after {:?}", start.elapsed());
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));

    // Dropped mid-stream: some tokens, then the connection breaks without [DONE].
    put_faults(&admin, token, 0, json!({"drop_mid_stream_rate": 1.0})).await?;
    let mut stream = chat(&url, true).await?.bytes_stream();
    let mut received = String::new();
    let mut broke = false;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) => received.push_str(&String::from_utf8_lossy(&bytes)),
            Err(_) => {
                broke = true;
                break;
            }
        }
    }
    assert!(broke, "the stream must end with a transport error: {received}");
    assert!(received.contains("data: {") && !received.contains("[DONE]"), "{received}");
    // A non-streamed answer breaks too: the client never gets a complete body (whether the
    // break lands before or after the headers left is up to the kernel's buffering).
    let complete_body = match chat(&url, false).await {
        Ok(response) => response.text().await.ok().filter(|t| serde_json::from_str::<Value>(t).is_ok()),
        Err(_) => None,
    };
    assert!(complete_body.is_none(), "a non-streamed body is cut too: {complete_body:?}");

    // Malformed metrics: a scraper's parser rejects the body.
    put_faults(&admin, token, 0, json!({"malformed_metrics": true})).await?;
    let text = client().get(format!("{url}/metrics")).send().await?.text().await?;
    assert!(fleet_telemetry::exposition::parse(&text).is_err(), "{text}");

    // Down: the port refuses connections; up again: it serves on the same port.
    put_faults(&admin, token, 0, json!({"down": true})).await?;
    let fresh =
        || reqwest::Client::builder().timeout(Duration::from_secs(2)).pool_max_idle_per_host(0).build();
    eventually("the port refuses connections", Duration::from_secs(10), || async {
        match fresh()?.get(format!("{url}/health")).send().await {
            Err(e) if e.is_connect() => Ok(Some(())),
            Err(e) => Err(e.into()),
            Ok(response) => Err(anyhow::anyhow!("still answering: {}", response.status())),
        }
    })
    .await?;
    let cleared =
        client().delete(format!("{admin}/admin/replicas/0/faults")).bearer_auth(token).send().await?;
    assert_eq!(cleared.status(), 200);
    eventually("the replica is up again", Duration::from_secs(10), || async {
        Ok(fresh()?.get(format!("{url}/health")).send().await.ok().filter(|r| r.status() == 200).map(|_| ()))
    })
    .await?;
    let text = client().get(format!("{url}/metrics")).send().await?.text().await?;
    assert!(fleet_telemetry::exposition::parse(&text).is_ok(), "faults cleared: metrics are valid again");
    assert_eq!(chat(&url, false).await?.status(), 200);
    drop(sim);
    Ok(())
}

#[tokio::test]
async fn the_command_line_explains_bad_flags() -> Result<()> {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_fleet-sim")).arg("serve").args(args).output()
    };
    let out = run(&["--flavor", "tgi"])?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("use vllm, vllm-legacy or sglang"));
    let out = run(&["--replicas", "0"])?;
    assert!(String::from_utf8_lossy(&out.stderr).contains("--replicas"));
    let out = run(&["--kv-events", "ipc:///tmp/x"])?;
    assert!(String::from_utf8_lossy(&out.stderr).contains("tcp://HOST:PORT"));
    let out = run(&["--profile", "no-such-profile", "--base-port", "0"])?;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("llama-3.1-8b-h100"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["--admin-listen", "127.0.0.1:0", "--base-port", "0"])?;
    assert!(String::from_utf8_lossy(&out.stderr).contains("--admin-token-file"));
    Ok(())
}
