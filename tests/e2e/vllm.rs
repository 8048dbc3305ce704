//! vLLM in the loop: real vLLM servers (the CPU build in the venv `cargo xtask engines vllm` installs,
//! a small random-weight model with a trained BPE tokenizer and a Llama-3-style chat template) serving
//! chat with prefix caching, per-request cached tokens and `/metrics` that fleet-telemetry reads.

use std::time::Duration;

use anyhow::{Context, Result};
use fleet_telemetry::Engine;
use fleet_telemetry::exposition::parse;
use fleet_test_support::vllm::{VLLM_BLOCK_SIZE, VLLM_MODEL, VllmOptions, spawn_vllm_server};
use serde_json::{Value, json};

/// A system prompt long enough for a few 32-token blocks.
pub fn system_prompt(topic: &str) -> String {
    (0..30)
        .map(|i| format!("rule {i} of the {topic} fleet says the cache stays warm"))
        .collect::<Vec<_>>()
        .join(". ")
}

/// POSTs `body` to `url` and returns the JSON answer, failing on any status but 200.
pub async fn post_json(client: &reqwest::Client, url: &str, body: &Value) -> Result<Value> {
    let response = client.post(url).json(body).send().await?;
    let status = response.status();
    let text = response.text().await?;
    anyhow::ensure!(status == 200, "{url} answered {status}: {text}");
    serde_json::from_str(&text).with_context(|| format!("{url} answered no JSON: {text}"))
}

/// `usage.prompt_tokens_details.cached_tokens` of an answer.
pub fn cached_tokens(answer: &Value) -> Option<u64> {
    answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64()
}

#[tokio::test]
async fn vllm_serves_chat_from_its_prefix_cache_and_its_metrics_read_as_vllm() -> Result<()> {
    let server = spawn_vllm_server(VllmOptions::default()).await?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let chat = format!("{}/v1/chat/completions", server.url);
    let system = system_prompt("first");
    let mut answers = Vec::new();
    for question in ["what is the first rule", "what is the second rule"] {
        let body = json!({
            "model": VLLM_MODEL,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 4,
        });
        answers.push(post_json(&client, &chat, &body).await?);
    }
    let prompt_tokens = answers[1]["usage"]["prompt_tokens"].as_u64().context("prompt_tokens")?;
    assert!(prompt_tokens > 3 * u64::from(VLLM_BLOCK_SIZE), "{}", answers[1]);
    assert_eq!(cached_tokens(&answers[0]), Some(0), "a cold cache: {}", answers[0]);
    let cached = cached_tokens(&answers[1]).context("cached_tokens reported")?;
    assert!(
        cached >= 2 * u64::from(VLLM_BLOCK_SIZE),
        "the shared system prompt is served from the cache: {}",
        answers[1]
    );
    assert_eq!(cached % u64::from(VLLM_BLOCK_SIZE), 0, "whole blocks: {}", answers[1]);

    // Its exposition reads as vLLM (V1 names), with the prefix-cache counters the hit rate comes from.
    let text = client.get(format!("{}/metrics", server.url)).send().await?.text().await?;
    let reading = fleet_telemetry::read(&parse(&text)?)?;
    assert_eq!(reading.engine, Engine::Vllm, "{}", reading.flavor);
    assert_eq!(reading.model.as_deref(), Some(VLLM_MODEL));
    assert_eq!(reading.ranks.len(), 1, "one engine rank, labelled engine=\"0\"");
    assert!(text.contains("vllm:prefix_cache_hits_total"), "{text}");
    Ok(())
}
