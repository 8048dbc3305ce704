//! Serve mode's interfaces: /metrics of every flavor against promtool, Python's prometheus_client
//! and fleet-telemetry's detection; SSE read raw with reqwest and with the official `openai`
//! client; `usage.cached_tokens` against an independent run of the engine model.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fleet_sim::engine::{EngineEvent, EngineModel, EngineRequest, tokenize};
use fleet_sim::{Flavor, Fleet, KvEventsConfig, ReplicaConfig};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, DropGuard};

pub(crate) const MODEL: &str = fleet_sim::DEFAULT_MODEL;

/// An in-process fleet on free loopback ports, stopped when dropped.
pub(crate) struct TestFleet {
    pub fleet: Fleet,
    _stop: DropGuard,
}

impl TestFleet {
    pub fn url(&self, i: usize) -> &str {
        &self.fleet.urls[i]
    }
}

pub(crate) async fn start_fleet(
    n: usize,
    config: ReplicaConfig,
    kv: Option<KvEventsConfig>,
) -> Result<TestFleet> {
    let stop = CancellationToken::new();
    let mut listeners = Vec::new();
    for _ in 0..n {
        listeners.push(TcpListener::bind("127.0.0.1:0").await?);
    }
    let fleet = Fleet::start(listeners, MODEL, &config, kv.as_ref(), &stop).await?;
    Ok(TestFleet { fleet, _stop: stop.drop_guard() })
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("reqwest client")
}

/// Runs `python3 -c script args...` with `stdin`, returning stdout; fails with stderr.
pub(crate) fn python(script: &str, args: &[&str], stdin: &str) -> Result<String> {
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("python3 must be installed with prometheus_client, openai, pyzmq and msgpack")?;
    child.stdin.take().context("stdin")?.write_all(stdin.as_bytes())?;
    let output = child.wait_with_output()?;
    ensure!(output.status.success(), "python failed: {}", String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8(output.stdout)?)
}

/// A prompt of `blocks` full 16-token blocks (64 bytes each) derived from `seed`.
pub(crate) fn prompt(seed: &str, blocks: usize) -> String {
    let unit = format!("{seed} shares this system prompt; ");
    unit.repeat(blocks * 64 / unit.len() + 1)[..blocks * 64].to_string()
}

pub(crate) async fn complete(url: &str, prompt: &str, max_tokens: u32) -> Result<Value> {
    let response = client()
        .post(format!("{url}/v1/completions"))
        .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}))
        .send()
        .await?;
    let status = response.status();
    let body: Value = response.json().await?;
    ensure!(status.is_success(), "completion failed with {status}: {body}");
    Ok(body)
}

const PARSE_WITH_PROMETHEUS_CLIENT: &str = r#"
import sys, json
from prometheus_client.parser import text_string_to_metric_families
families = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    families[family.name] = {"type": family.type, "samples": len(family.samples),
                              "labels": sorted({k for s in family.samples for k in s.labels})}
print(json.dumps(families))
"#;

/// Lint findings that the real engines' own metrics produce too: vLLM and SGLang put a colon in
/// every name (Prometheus reserves colons for recording rules), vLLM names a histogram
/// `iteration_tokens_total`, and SGLang's P/D gauges end in `_ms` and `_gb_s`. Anything else
/// promtool says is a failure.
const ENGINE_LINTS: [&str; 3] = [
    "metric names should not contain ':'",
    "non-counter metrics should not have \"_total\" suffix",
    "metric names should not contain abbreviated units",
];

/// `promtool check metrics`: exit 0 (clean) or 3 (lint findings only, each one the engines' own);
/// 1 means the text does not parse.
pub(crate) fn promtool_check(text: &str) -> Result<String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("promtool (Debian package prometheus) must be installed")?;
    child.stdin.take().context("stdin")?.write_all(text.as_bytes())?;
    let output = child.wait_with_output()?;
    let report =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    let only_engine_lints = report.lines().all(|line| ENGINE_LINTS.iter().any(|lint| line.ends_with(lint)));
    match output.status.code() {
        Some(0) => Ok(report),
        Some(3) if only_engine_lints => Ok(report),
        _ => anyhow::bail!("promtool check metrics failed ({}):\n{report}", output.status),
    }
}

#[tokio::test]
async fn metrics_of_every_flavor_pass_promtool_parse_in_python_and_are_detected() -> Result<()> {
    let cases = [
        (
            Flavor::Vllm,
            "vllm:kv_cache_usage_perc",
            "vllm:prefix_cache_hits",
            fleet_telemetry::Engine::Vllm,
            "current",
        ),
        (
            Flavor::VllmLegacy,
            "vllm:gpu_cache_usage_perc",
            "vllm:gpu_prefix_cache_hits",
            fleet_telemetry::Engine::Vllm,
            "legacy",
        ),
        (
            Flavor::Sglang,
            "sglang:token_usage",
            "sglang:cached_tokens",
            fleet_telemetry::Engine::Sglang,
            "SGLang",
        ),
    ];
    for (flavor, gauge, hits, engine, flavor_word) in cases {
        let fleet = start_fleet(1, ReplicaConfig { flavor, ..ReplicaConfig::default() }, None).await?;
        let text = prompt("flavor", 4);
        complete(fleet.url(0), &text, 4).await?;
        complete(fleet.url(0), &text, 4).await?;
        let metrics = client().get(format!("{}/metrics", fleet.url(0))).send().await?.text().await?;

        promtool_check(&metrics).with_context(|| format!("{flavor:?}"))?;

        let families: Value = serde_json::from_str(&python(PARSE_WITH_PROMETHEUS_CLIENT, &[], &metrics)?)?;
        assert_eq!(families[gauge]["type"], "gauge", "{flavor:?}: {gauge}");
        assert_eq!(families[hits]["type"], "counter", "{flavor:?}: {hits}");
        let ttft = if flavor == Flavor::Sglang {
            "sglang:time_to_first_token_seconds"
        } else {
            "vllm:time_to_first_token_seconds"
        };
        assert_eq!(families[ttft]["type"], "histogram", "{flavor:?}");
        if flavor == Flavor::Sglang {
            assert_eq!(
                families["sglang:num_running_reqs"]["labels"],
                json!(["engine_type", "model_name", "pp_rank", "tp_rank"])
            );
        } else {
            assert_eq!(
                families["vllm:request_success"]["labels"],
                json!(["engine", "finished_reason", "model_name"])
            );
            assert!(
                families["vllm:cache_config_info"]["labels"]
                    .as_array()
                    .is_some_and(|l| l.contains(&json!("num_gpu_blocks")))
            );
        }

        // What `fleetdeck probe` does: parse, detect the engine, read the signals.
        let exposition = fleet_telemetry::exposition::parse(&metrics)?;
        let reading = fleet_telemetry::read(&exposition)?;
        assert_eq!(reading.engine, engine, "{flavor:?}");
        assert!(reading.flavor.contains(flavor_word), "{flavor:?} detected as {:?}", reading.flavor);
        assert_eq!(reading.model.as_deref(), Some(MODEL));
        // The second request hit the first one's 3 cacheable blocks (the last block is never a hit).
        assert_eq!(
            (reading.total.prefix_queries, reading.total.prefix_hits),
            (Some(128.0), Some(48.0)),
            "{flavor:?}"
        );
    }
    Ok(())
}

/// Reads a streamed response as raw bytes and splits it into SSE `data:` payloads.
async fn raw_sse(url: &str, body: Value) -> Result<Vec<String>> {
    let response = client().post(url).json(&body).send().await?;
    ensure!(response.status().is_success(), "status {}", response.status());
    let content_type =
        response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    ensure!(content_type.starts_with("text/event-stream"), "content-type {content_type}");
    let mut stream = response.bytes_stream();
    let mut raw = Vec::new();
    use futures_util::StreamExt;
    while let Some(chunk) = stream.next().await {
        raw.extend_from_slice(&chunk?);
    }
    let text = String::from_utf8(raw)?;
    ensure!(text.ends_with("\n\n"), "stream must end with a complete event: {text:?}");
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|event| {
            event
                .strip_prefix("data: ")
                .map(str::to_string)
                .with_context(|| format!("not a data event: {event:?}"))
        })
        .collect()
}

#[tokio::test]
async fn chat_streams_as_sse_with_usage_and_matches_the_non_streamed_text() -> Result<()> {
    let fleet = start_fleet(1, ReplicaConfig::default(), None).await?;
    let url = format!("{}/v1/chat/completions", fleet.url(0));
    let messages =
        json!([{"role": "system", "content": prompt("sse", 6)}, {"role": "user", "content": "hello"}]);
    let events = raw_sse(
        &url,
        json!({"model": MODEL, "messages": messages, "max_tokens": 12, "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await?;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e)).collect::<Result<_, _>>()?;
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let tokens: Vec<&str> =
        chunks.iter().filter_map(|c| c["choices"].get(0)?.get("delta")?.get("content")?.as_str()).collect();
    assert_eq!(tokens.len(), 12);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = &chunks[chunks.len() - 1]["usage"];
    assert_eq!(usage["completion_tokens"], 12);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    let streamed: String = tokens.concat();

    let full: Value = client()
        .post(&url)
        .json(&json!({"model": MODEL, "messages": messages, "max_tokens": 12}))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(full["choices"][0]["message"]["content"], streamed);
    assert_eq!(full["usage"]["prompt_tokens"], usage["prompt_tokens"]);
    assert!(
        full["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0),
        "the repeat hits: {full}"
    );
    Ok(())
}

const OPENAI_STREAM: &str = r#"
import sys, json
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", timeout=30, max_retries=0)
stream = client.chat.completions.create(model=sys.argv[2], messages=[{"role": "user", "content": "tell me about caches"}],
                                        max_tokens=8, stream=True, stream_options={"include_usage": True})
text, usage, finish = "", None, None
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage:
        usage = chunk.usage.model_dump()
completion = client.completions.create(model=sys.argv[2], prompt="tell me", max_tokens=3)
print(json.dumps({"text": text, "finish": finish, "usage": usage, "completion": completion.choices[0].text,
                  "models": [m.id for m in client.models.list()]}))
"#;

#[tokio::test]
async fn the_openai_python_client_streams_chat_and_reads_completions_and_models() -> Result<()> {
    let fleet = start_fleet(1, ReplicaConfig::default(), None).await?;
    let url = fleet.url(0).to_string();
    let out = tokio::task::spawn_blocking(move || python(OPENAI_STREAM, &[&url, MODEL], "")).await??;
    let result: Value = serde_json::from_str(&out)?;
    assert_eq!(result["finish"], "length");
    assert_eq!(result["usage"]["completion_tokens"], 8);
    assert_eq!(result["text"].as_str().map(|t| t.split(' ').count()), Some(8));
    assert_eq!(result["completion"].as_str().map(|t| t.split(' ').count()), Some(3));
    assert_eq!(result["models"], json!([MODEL]));
    Ok(())
}

#[tokio::test]
async fn reported_cached_tokens_equal_an_independent_run_of_the_model() -> Result<()> {
    // Small cache so that eviction matters: 48 blocks, prompts of 10-20 blocks.
    let mut config = ReplicaConfig::default();
    config.engine.num_gpu_blocks = 48;
    let fleet = start_fleet(1, config.clone(), None).await?;
    let prompts: Vec<String> = [("a", 10), ("a", 14), ("b", 20), ("a", 12), ("c", 16), ("b", 20), ("a", 10)]
        .iter()
        .map(|(seed, blocks)| prompt(seed, *blocks))
        .collect();
    let mut served = Vec::new();
    for text in &prompts {
        let body = complete(fleet.url(0), text, 4).await?;
        served
            .push(body["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().context("cached_tokens")?);
    }

    // The same requests, one after another, through a fresh engine on a virtual clock.
    let mut engine = EngineModel::new(config.engine.clone())?;
    let mut expected = Vec::new();
    let mut now = 0;
    for (id, text) in prompts.iter().enumerate() {
        let mut cached = None;
        let request =
            EngineRequest::new(id as u64, tokenize::prompt_of_text(text, config.engine.block_tokens), 4);
        engine.add_request(request, now, &mut |_| {})?;
        while cached.is_none() {
            let at = engine.next_step_at().context("the engine stalled")?;
            now = at;
            engine.advance_to(at, &mut |e| {
                if let EngineEvent::Finished { cached_tokens, .. } = e {
                    cached = Some(u64::from(cached_tokens));
                }
            });
        }
        expected.push(cached.unwrap_or_default());
    }
    assert_eq!(served, expected);
    assert!(expected.iter().any(|&c| c > 0), "some requests must hit: {expected:?}");
    Ok(())
}

#[tokio::test]
async fn bad_requests_get_errors_that_say_what_to_fix() -> Result<()> {
    let config = ReplicaConfig { max_model_len: 256, ..ReplicaConfig::default() };
    let fleet = start_fleet(1, config, None).await?;
    let url = format!("{}/v1/completions", fleet.url(0));
    let too_long =
        client().post(&url).json(&json!({"prompt": "x".repeat(2000), "max_tokens": 10})).send().await?;
    assert_eq!(too_long.status(), 400);
    let body: Value = too_long.json().await?;
    assert!(
        body["error"]["message"].as_str().is_some_and(|m| m.contains("maximum context length is 256")),
        "{body}"
    );
    let wrong_model = client().post(&url).json(&json!({"model": "nope", "prompt": "x"})).send().await?;
    assert_eq!(wrong_model.status(), 404);
    let not_json = client().post(&url).body("{").send().await?;
    assert_eq!(not_json.status(), 400);
    let body: Value = not_json.json().await?;
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("not a valid completions request")));
    Ok(())
}

/// Successful requests a replica counted (every `vllm:request_success_total` series summed).
async fn requests_served(http: &reqwest::Client, url: &str) -> Result<f64> {
    let text = http.get(format!("{url}/metrics")).send().await?.text().await?;
    Ok(text
        .lines()
        .filter(|line| line.starts_with("vllm:request_success_total"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

#[tokio::test]
async fn load_spreads_its_requests_over_every_target() -> Result<()> {
    let fleet = start_fleet(3, ReplicaConfig::default(), None).await?;
    let stats = std::sync::Arc::new(fleet_sim::load::LoadStats::default());
    let stop = CancellationToken::new();
    let config = fleet_sim::load::LoadConfig {
        target: fleet.url(0).to_owned(),
        also_targets: vec![fleet.url(1).to_owned(), fleet.url(2).to_owned()],
        rps: 200.0,
        max_tokens: 2,
        ..fleet_sim::load::LoadConfig::default()
    };
    let load =
        tokio::spawn(fleet_sim::load::run(config, reqwest::Client::new(), stats.clone(), stop.clone()));
    let http = reqwest::Client::new();
    let served =
        fleet_test_support::eventually("every target to serve requests", Duration::from_secs(30), || {
            let http = http.clone();
            let urls: Vec<String> = fleet.fleet.urls.clone();
            async move {
                let mut served = Vec::new();
                for url in &urls {
                    served.push(requests_served(&http, url).await?);
                }
                Ok((served.iter().sum::<f64>() >= 60.0).then_some(served))
            }
        })
        .await?;
    stop.cancel();
    load.await?;
    // 60 draws of three: each target's share is 20 on average; below 5 has odds under one in ten thousand.
    assert!(served.iter().all(|&n| n >= 5.0), "requests served by each target: {served:?}");
    Ok(())
}
