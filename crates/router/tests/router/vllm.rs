//! kv_precise on real vLLM (build feature `tokenizer`): vLLM servers (the venv of `cargo xtask engines vllm`)
//! publish their KV events over ZMQ; the router renders chats with the model's own chat template, tokenises
//! with its tokenizer, and its index's predicted cached tokens are checked against the `cached_tokens` vLLM
//! reports for every request: chat and completions, after evictions from a small KV cache, and after a
//! restart. At most two servers run at once (the tests take turns). And P/D on real vLLM, through the one
//! KV connector its CPU build runs.

use std::time::Duration;

use anyhow::{Context, Result};
use fleet_router::RouterConfig;
use fleet_test_support::eventually;
use fleet_test_support::vllm::{
    KvConnector, VLLM_BLOCK_SIZE, VLLM_MODEL, VllmOptions, VllmServer, spawn_vllm_server, spawn_vllm_servers,
    vllm_build,
};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::support::{TOKEN, TestRouter, router};

/// The tests take turns: two vLLM servers at a time on two cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

async fn kv_router(servers: &[&VllmServer]) -> Result<TestRouter> {
    let build = vllm_build()?;
    let replicas =
        servers.iter().map(|s| format!("{},model={VLLM_MODEL},kv={}", s.url, s.kv_endpoint)).collect();
    router(RouterConfig {
        replicas,
        policy: format!(r#"{{"policy": "kv_precise", "params": {{"block_tokens": {VLLM_BLOCK_SIZE}}}}}"#)
            .parse()?,
        admin_token: Some(TOKEN.into()),
        tokenizer: Some(build.tokenizer()),
        ..RouterConfig::default()
    })
    .await
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(180)).build().expect("a client")
}

/// Sends requests to each server directly until the router has applied KV events from all of them: the
/// subscriptions are live, so no later event is missed. Each attempt's prompt is new (a repeated one would be
/// a cache hit and publish nothing), so events published before a subscription was live (as after a restart,
/// when the router resubscribes within a second of the engine's publisher starting) are made up for.
async fn await_subscriptions(router: &TestRouter, servers: &[&VllmServer]) -> Result<()> {
    let client = http();
    let attempt = std::sync::atomic::AtomicU64::new(0);
    eventually("the router to apply KV events from every vLLM server", Duration::from_secs(60), || async {
        let state = router.state.state_document();
        let replicas = state["replicas"].as_array().context("replicas")?;
        if replicas.iter().all(|r| r["indexed_blocks"].as_u64() > Some(0)) {
            return Ok(Some(()));
        }
        let n = attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for server in servers {
            let prompt = format!("warm up the event stream, attempt {n}: ").repeat(12);
            let body = json!({"model": VLLM_MODEL, "prompt": prompt, "max_tokens": 2});
            client.post(format!("{}/v1/completions", server.url)).json(&body).send().await?.bytes().await?;
        }
        Ok(None)
    })
    .await
}

fn system_prompt(topic: usize) -> String {
    (0..14)
        .map(|i| format!("rule {i} of fleet {topic} says the cache stays warm"))
        .collect::<Vec<_>>()
        .join(". ")
}

/// One request through the router: a chat (streamed with usage, or not) or a completion. Returns vLLM's
/// `cached_tokens`.
async fn send(router: &TestRouter, chat: bool, stream: bool, topic: usize, question: usize) -> Result<u64> {
    let client = http();
    let (path, mut body) = if chat {
        let messages = json!([
            {"role": "system", "content": system_prompt(topic)},
            {"role": "user", "content": format!("  question {question}: which rule comes first?  ")},
        ]);
        ("/v1/chat/completions", json!({"model": VLLM_MODEL, "messages": messages, "max_tokens": 3}))
    } else {
        let prompt = format!("{}\nquestion {question}", system_prompt(topic + 100));
        ("/v1/completions", json!({"model": VLLM_MODEL, "prompt": prompt, "max_tokens": 3}))
    };
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let response = client.post(format!("{}{path}", router.url)).json(&body).send().await?;
    let status = response.status();
    let text = response.text().await?;
    anyhow::ensure!(status == 200, "{status}: {text}");
    let usage = if stream {
        text.lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str::<Value>(data).ok())
            .find_map(|event| event.get("usage").filter(|u| !u.is_null()).cloned())
            .context("no usage in the stream")?
    } else {
        serde_json::from_str::<Value>(&text)?["usage"].clone()
    };
    usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .with_context(|| format!("no cached_tokens: {usage}"))
}

/// `(requests predicted, of them within one block)` from the router's `/metrics`.
async fn accuracy(router: &TestRouter) -> Result<(u64, u64)> {
    let text = http().get(format!("{}/metrics", router.url)).send().await?.text().await?;
    let value = |name: &str| -> Result<u64> {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .with_context(|| format!("no {name}"))?;
        Ok(line.rsplit(' ').next().context("a value")?.parse()?)
    };
    Ok((
        value("fleet_router_index_predictions_total")?,
        value("fleet_router_index_predictions_within_block_total")?,
    ))
}

/// The decisions whose prediction missed the engine's count by more than a block.
async fn misses(router: &TestRouter) -> Result<Vec<Value>> {
    let decisions: Value = http()
        .get(format!("{}/admin/decisions?limit=1000", router.url))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .json()
        .await?;
    Ok(decisions
        .as_array()
        .context("a list")?
        .iter()
        .filter(|d| d["cached_tokens"]["within_block"] == json!(false))
        .map(|d| json!({"request_id": d["request_id"], "replica": d["replica"], "cached_tokens": d["cached_tokens"]}))
        .collect())
}

/// Checks the index's predictions over the `sent` requests since the counters read `before`: every request
/// gets one (but the `retried`, for which no prediction is made: the pick did not serve them), and 99 % are
/// within one block of what vLLM reports. A prediction is counted when the router has relayed the whole
/// answer, which can be just after the client read its last byte, so the counters are read until they
/// hold every request (the check fails after 10 s).
async fn check(router: &TestRouter, phase: &str, before: (u64, u64), sent: u64, retried: u64) -> Result<()> {
    let what = format!("{phase}: a prediction and a count for every request ({sent})");
    let (predicted, within) = eventually(&what, Duration::from_secs(10), || async {
        let now = accuracy(router).await?;
        let delta = (now.0 - before.0, now.1 - before.1);
        anyhow::ensure!(delta.0 + retried >= sent, "{} predictions counted, {retried} retried", delta.0);
        Ok(Some(delta))
    })
    .await?;
    println!("index accuracy, {phase}: {within}/{predicted} within one block ({sent} requests)");
    let misses = misses(router).await?;
    assert!(
        within as f64 >= 0.99 * predicted as f64,
        "{phase}: {within}/{predicted} within one block; misses: {misses:?}"
    );
    Ok(())
}

#[tokio::test]
async fn kv_precise_predicts_vllms_cached_tokens_for_chat_and_completions() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let servers = spawn_vllm_servers(2, VllmOptions::default()).await?;
    let refs: Vec<&VllmServer> = servers.iter().collect();
    let router = kv_router(&refs).await?;
    await_subscriptions(&router, &refs).await?;
    let before = accuracy(&router).await?;
    let (mut sent, mut cached_total, mut hits) = (0, 0, 0);
    for round in 0..4 {
        for topic in 0..6 {
            let chat = topic % 3 != 2;
            let cached = send(&router, chat, (round + topic) % 2 == 0, topic, round).await?;
            sent += 1;
            cached_total += cached;
            hits += u64::from(cached > 0);
        }
    }
    check(&router, "chat and completions", before, sent, 0).await?;
    // Not trivially right: the shared prefixes were served from vLLM's cache, on the replica that held them.
    assert!(hits >= 18, "rounds 1-3 hit the cache: {hits} hits of {sent}");
    assert!(cached_total >= 18 * 3 * u64::from(VLLM_BLOCK_SIZE), "{cached_total} cached tokens");
    // The repeated system prompts' ids came from the tokenizer's memo (on by default), and the
    // predictions above, checked against vLLM's own counts, were made from those ids.
    let text = http().get(format!("{}/metrics", router.url)).send().await?.text().await?;
    let memoised: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("fleet_router_tokenizer_tokens_total{source=\"memo\"} "))
        .context("no memo figures in /metrics")?
        .parse()?;
    assert!(memoised >= 18 * 100, "{memoised} tokens from the memo");
    Ok(())
}

#[tokio::test]
async fn kv_precise_stays_accurate_through_vllm_evictions_and_a_restart() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    // 40 blocks of 32 tokens: the topics' prefixes (5-6 blocks each) do not all fit, so vLLM evicts.
    let options = VllmOptions { max_model_len: 1024, kv_blocks: Some(40), ..VllmOptions::default() };
    let mut server = spawn_vllm_server(options).await?;
    let router = kv_router(&[&server]).await?;
    await_subscriptions(&router, &[&server]).await?;
    let before = accuracy(&router).await?;
    let (mut sent, mut misses_of_cache) = (0, 0);
    for round in 0..3 {
        for topic in 0..10 {
            let cached = send(&router, topic % 2 == 0, false, topic, round).await?;
            sent += 1;
            misses_of_cache += u64::from(round > 0 && cached == 0);
        }
    }
    check(&router, "evictions", before, sent, 0).await?;
    assert!(misses_of_cache > 0, "the small cache evicted prefixes that were sent before");

    // A restart empties vLLM's cache; the router clears that replica's index when the publisher goes.
    let resyncs = |router: &TestRouter| {
        router.state.fleet.load().replicas[0].kv_resyncs.load(std::sync::atomic::Ordering::Relaxed)
    };
    let resyncs_before = resyncs(&router);
    server.restart().await?;
    eventually("the router to clear the restarted replica's index", Duration::from_secs(60), || async {
        Ok((resyncs(&router) > resyncs_before).then_some(()))
    })
    .await?;
    // Events published before the router resubscribes (within a second of the engine's publisher starting)
    // are missed; a request straight to the engine shows when the subscription is live again.
    await_subscriptions(&router, &[&server]).await?;
    let before = accuracy(&router).await?;
    let mut restarted_sent = 0;
    for round in 0..2 {
        for topic in 0..6 {
            send(&router, topic % 2 == 1, true, topic, round + 10).await?;
            restarted_sent += 1;
        }
    }
    // The first request after the restart may find a pooled connection to the old process and be retried.
    check(&router, "after a restart", before, restarted_sent, 1).await?;
    Ok(())
}

/// The decode server's prompt tokens that came over its KV connector, from its own `/metrics`.
async fn external_kv_tokens(server: &VllmServer) -> Result<f64> {
    let text = http().get(format!("{}/metrics", server.url)).send().await?.text().await?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("vllm:prompt_tokens_by_source_total{") && l.contains("external_kv_transfer")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// P/D on real vLLM (issue 36, item 5): a prefill server and a decode server whose KV connector is vLLM's
/// `ExampleConnector` (a store both share, found by the prompt: the one connector vLLM 0.32 runs on its CPU
/// build), behind fleet-router in P/D mode with `pd.kv_handoff: prompt`. A long prompt is split: the prefill
/// server computes it, the decode server loads all but its last block from the store and computes the rest.
/// With the default handoff (`params`) the same answer carries no `kv_transfer_params`, and the router prefills
/// locally, saying which setting fits.
#[tokio::test]
async fn pd_on_vllm_hands_the_kv_over_by_the_prompt_through_the_example_connector() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let store = tempfile::tempdir()?;
    let connector = |role| VllmOptions {
        kv_connector: Some(KvConnector { role, path: store.path().to_owned() }),
        ..VllmOptions::default()
    };
    let prefill = spawn_vllm_server(connector("kv_producer")).await?;
    let decode = spawn_vllm_server(connector("kv_consumer")).await?;
    let pd_router = |handoff: &'static str| {
        let replicas = vec![
            format!("{},model={VLLM_MODEL},role=prefill", prefill.url),
            format!("{},model={VLLM_MODEL},role=decode", decode.url),
        ];
        let spec = format!(
            r#"{{"policy": "cache_aware_approx",
                "pd": {{"min_prompt_tokens": 0, "min_uncached_tokens": 0, "kv_handoff": "{handoff}"}}}}"#
        );
        async move {
            router(RouterConfig {
                replicas,
                policy: spec.parse()?,
                admin_token: Some(TOKEN.into()),
                ..RouterConfig::default()
            })
            .await
        }
    };
    let complete = |router: &TestRouter, topic: &str| {
        let prompt: Vec<String> =
            (0..60).map(|i| format!("the {topic} document says item {i} is blue;")).collect();
        let body = json!({"model": VLLM_MODEL, "prompt": prompt.join(" "), "max_tokens": 8});
        let request = http().post(format!("{}/v1/completions", router.url)).json(&body);
        async move {
            let response = request.send().await?.error_for_status()?;
            let header = |name| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let (pd, id) = (header("x-fleet-pd"), header("x-fleet-request-id"));
            let answer: Value = response.json().await?;
            anyhow::Ok((pd, id, answer))
        }
    };

    let by_prompt = pd_router("prompt").await?;
    let before = external_kv_tokens(&decode).await?;
    let (pd, _, answer) = complete(&by_prompt, "shared").await?;
    assert_eq!(pd.as_deref(), Some("split"), "{answer}");
    let prompt_tokens = answer["usage"]["prompt_tokens"].as_u64().context("prompt tokens")?;
    let cached =
        answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().context("cached tokens")?;
    // All but the prompt's last (partial) block came from the prefill server's store.
    assert!(cached + u64::from(VLLM_BLOCK_SIZE) > prompt_tokens && cached > 0, "{answer}");
    let loaded = external_kv_tokens(&decode).await? - before;
    assert_eq!(loaded, cached as f64, "the decode server loaded them over its connector");
    assert_eq!(answer["usage"]["completion_tokens"], 8);

    // The default handoff wants kv_transfer_params, which this connector does not give: local, said why.
    let by_params = pd_router("params").await?;
    let (pd, id, answer) = complete(&by_params, "other").await?;
    assert_eq!(pd.as_deref(), Some("transfer_failed"), "{answer}");
    let id = id.context("a request id")?;
    let decisions = by_params.admin_get(&http(), &format!("/admin/decisions?request_id={id}")).await?;
    let fallback = decisions[0]["pd"]["fallback"].as_str().unwrap_or_default().to_owned();
    assert!(fallback.contains("pd.kv_handoff: prompt"), "{decisions}");
    Ok(())
}
