//! P/D mode: a router over fleet-sim prefill and decode replicas (vLLM's flow, and SGLang's bootstrap flow)
//! splits long prompts, serves short or cached ones locally, follows a live policy change, and falls back to a
//! local prefill when the prefill leg or the KV transfer fails; the decision log and `/metrics` say which
//! branch and why.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fleet_policy::PolicySpec;
use fleet_router::{HealthConfig, RouterConfig};
use fleet_sim::engine::{EngineConfig, LoadFailurePolicy};
use fleet_sim::pd::{PdConfig, Role};
use fleet_sim::{Faults, Flavor, ModelConfig};
use fleet_test_support::{SimFleet, spawn_sim};
use serde_json::{Value, json};

use crate::support::{TOKEN, TestRouter, client, router, sse_data};

const MODEL: &str = fleet_sim::DEFAULT_MODEL;

/// A prompt of `blocks` 64-byte blocks (16 tokens each, for the router's estimate and the sim alike).
fn prompt(seed: &str, blocks: usize) -> String {
    let unit = format!("{seed} shares this system prompt; ");
    unit.repeat(blocks * 64 / unit.len() + 1)[..blocks * 64].to_string()
}

fn sim_config(role: Role, policy: LoadFailurePolicy) -> ModelConfig {
    ModelConfig {
        engine: EngineConfig { kv_load_failure_policy: policy, ..EngineConfig::default() },
        pd: PdConfig { role, lease: Duration::from_secs(60), wait_timeout: Duration::from_millis(1_500) },
        ..ModelConfig::default()
    }
}

/// One prefill and one decode replica (the decode one failing loads as `policy` says), and a router over
/// them with `spec`, its health probes too slow to change anything during a test.
struct PdFleet {
    prefill: SimFleet,
    decode: SimFleet,
    router: TestRouter,
}

impl PdFleet {
    fn prefill_url(&self) -> &str {
        &self.prefill.urls()[0]
    }

    fn decode_url(&self) -> &str {
        &self.decode.urls()[0]
    }
}

async fn pd_fleet(policy: LoadFailurePolicy, spec: PolicySpec) -> Result<PdFleet> {
    let prefill = spawn_sim(1, sim_config(Role::Prefill, policy)).await?;
    let decode = spawn_sim(1, sim_config(Role::Decode, policy)).await?;
    let replicas = vec![
        format!("{},model={MODEL},role=prefill", prefill.urls()[0]),
        format!("{},model={MODEL},role=decode", decode.urls()[0]),
    ];
    let router = router_over(replicas, spec).await?;
    Ok(PdFleet { prefill, decode, router })
}

async fn router_over(replicas: Vec<String>, spec: PolicySpec) -> Result<TestRouter> {
    router(RouterConfig {
        replicas,
        policy: spec,
        admin_token: Some(TOKEN.into()),
        health: HealthConfig { interval: Duration::from_secs(600), ..HealthConfig::default() },
        ..RouterConfig::default()
    })
    .await
}

/// A completion through the router: (status, headers, body text).
async fn complete(router: &TestRouter, body: &Value) -> Result<(u16, reqwest::header::HeaderMap, String)> {
    let response = client().post(format!("{}/v1/completions", router.url)).json(body).send().await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    Ok((status, headers, response.text().await?))
}

fn header<'a>(headers: &'a reqwest::header::HeaderMap, name: &str) -> &'a str {
    headers.get(name).and_then(|value| value.to_str().ok()).unwrap_or("")
}

/// The sum of the samples of `name` (any labels) in `url`'s /metrics.
async fn metric(url: &str, name: &str) -> Result<f64> {
    let text = client().get(format!("{url}/metrics")).send().await?.text().await?;
    let samples: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    ensure!(!samples.is_empty(), "no {name} in {url}/metrics");
    Ok(samples.iter().sum())
}

/// The router's `fleet_router_pd_decisions_total{reason=REASON}`.
async fn decisions(router: &TestRouter, reason: &str) -> Result<f64> {
    let text = client().get(format!("{}/metrics", router.url)).send().await?.text().await?;
    let line = format!("fleet_router_pd_decisions_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|value| value.parse().ok())
        .with_context(|| format!("no {line} in the router's /metrics"))
}

/// The decision log's record of the request whose answer carried `headers`.
async fn decision(router: &TestRouter, headers: &reqwest::header::HeaderMap) -> Result<Value> {
    let id = header(headers, "x-fleet-request-id");
    let list = router.admin_get(&client(), &format!("/admin/decisions?request_id={id}")).await?;
    list.get(0).cloned().with_context(|| format!("no decision for request {id}: {list}"))
}

fn spec() -> PolicySpec {
    PolicySpec::named("cache_aware_approx")
}

#[tokio::test]
async fn a_long_prompt_is_split_streamed_in_order_and_its_kv_is_transferred() -> Result<()> {
    let fleet = pd_fleet(LoadFailurePolicy::Fail, spec()).await?;
    let router = &fleet.router;
    // 64 blocks = 1024 tokens: over min_prompt_tokens (256) and min_uncached_tokens (512).
    let body = json!({"model": MODEL, "prompt": prompt("split-stream", 64), "max_tokens": 8, "stream": true});
    let (status, headers, text) = complete(router, &body).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&headers, "x-fleet-pd"), "split");
    assert_eq!(header(&headers, "x-fleet-replica"), fleet.decode_url());
    assert_eq!(header(&headers, "x-fleet-prefill-replica"), fleet.prefill_url());
    let events = sse_data(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{text}");
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e)).collect::<Result<_, _>>()?;
    let tokens = chunks.iter().filter(|c| c["choices"][0]["finish_reason"].is_null()).count();
    assert_eq!(tokens, 8, "every token, in one stream: {text}");
    assert!(chunks.iter().all(|c| c.get("error").is_none()), "{text}");
    assert_eq!(chunks.last().map(|c| c["choices"][0]["finish_reason"].clone()), Some(json!("length")));

    // Not streamed: the decode replica's usage shows the prompt came over the wire.
    let body = json!({"model": MODEL, "prompt": prompt("split-whole", 64), "max_tokens": 4});
    let (status, headers, text) = complete(router, &body).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&headers, "x-fleet-pd"), "split");
    let answer: Value = serde_json::from_str(&text)?;
    assert_eq!(answer["usage"]["prompt_tokens"], 1024);
    assert_eq!(answer["usage"]["completion_tokens"], 4);
    assert_eq!(
        answer["usage"]["prompt_tokens_details"]["cached_tokens"], 1023,
        "all but the last token pulled"
    );
    assert!(answer.get("kv_transfer_params").is_none_or(Value::is_null), "{answer}");

    // Each replica did its leg: two one-token prefills there, two transfers into the decode replica.
    assert_eq!(metric(fleet.prefill_url(), "vllm:request_success_total").await?, 2.0);
    assert_eq!(metric(fleet.prefill_url(), "vllm:generation_tokens_total").await?, 2.0);
    assert_eq!(metric(fleet.decode_url(), "vllm:nixl_xfer_time_seconds_count").await?, 2.0);
    assert_eq!(metric(fleet.decode_url(), "vllm:request_success_total").await?, 2.0);

    let logged = decision(router, &headers).await?;
    assert_eq!(logged["replica"], fleet.decode_url());
    let pd = &logged["pd"];
    assert_eq!((pd["branch"].as_str(), pd["reason"].as_str()), (Some("split"), Some("split")), "{logged}");
    assert_eq!(pd["prefill_replica"], fleet.prefill_url());
    assert_eq!(pd["uncached_tokens"], 1024);
    assert!(pd["prefill"]["candidates"].as_array().is_some_and(|c| c.len() == 1), "{pd}");
    assert!(pd["prefill_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{pd}");
    assert!(pd["explanation"].as_str().is_some_and(|e| e.contains("min_uncached_tokens 512")), "{pd}");

    assert_eq!(decisions(router, "split").await?, 2.0);
    let text = client().get(format!("{}/metrics", router.url)).send().await?.text().await?;
    assert!(text.contains("fleet_router_pd_prefill_leg_seconds_count 2"), "{text}");
    assert!(text.contains("fleet_router_pd_decode_first_byte_seconds_count 2"), "{text}");
    assert!(text.contains("fleet_router_pd_fallbacks_total 0"), "{text}");
    // The same figures in `/admin/state`, where the app reads them.
    let state = router.admin_get(&client(), "/admin/state").await?;
    let pd = &state["pd"];
    assert_eq!(pd["decisions"]["split"], 2, "{pd}");
    assert_eq!(pd["decisions"]["short_prompt"], 0, "{pd}");
    assert_eq!(
        (pd["prefill_leg"]["count"].as_u64(), pd["decode_first_byte"]["count"].as_u64()),
        (Some(2), Some(2))
    );
    assert!(pd["prefill_leg"]["sum_s"].as_f64().is_some_and(|s| s > 0.0), "{pd}");
    let buckets = pd["prefill_leg"]["buckets"].as_array().cloned().unwrap_or_default();
    assert!(buckets.last().is_some_and(|b| b[1].as_u64() <= Some(2)), "cumulative, at most the count: {pd}");
    Ok(())
}

#[tokio::test]
async fn short_or_cached_prompts_stay_local_and_a_policy_put_moves_the_threshold_live() -> Result<()> {
    let fleet = pd_fleet(LoadFailurePolicy::Fail, spec()).await?;
    let router = &fleet.router;
    let http = client();
    // 8 blocks = 128 tokens: under min_prompt_tokens.
    let short = json!({"model": MODEL, "prompt": prompt("short", 8), "max_tokens": 2});
    let (status, headers, text) = complete(router, &short).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&headers, "x-fleet-pd"), "short_prompt");
    assert_eq!(header(&headers, "x-fleet-replica"), fleet.decode_url());
    assert!(headers.get("x-fleet-prefill-replica").is_none());
    let logged = decision(router, &headers).await?;
    assert_eq!(
        (logged["pd"]["branch"].as_str(), logged["pd"]["reason"].as_str()),
        (Some("local"), Some("short_prompt"))
    );
    assert!(
        logged["pd"]["explanation"].as_str().is_some_and(|e| e.contains("min_prompt_tokens 256")),
        "{logged}"
    );

    // A long prompt is split; the same prompt again is held by the decode replica now: local.
    let long = json!({"model": MODEL, "prompt": prompt("long", 64), "max_tokens": 2});
    let (_, headers, _) = complete(router, &long).await?;
    assert_eq!(header(&headers, "x-fleet-pd"), "split");
    let (status, headers, text) = complete(router, &long).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&headers, "x-fleet-pd"), "cached_at_decode");
    let answer: Value = serde_json::from_str(&text)?;
    assert!(
        answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().is_some_and(|c| c >= 1008),
        "{answer}"
    );
    assert_eq!(metric(fleet.prefill_url(), "vllm:request_success_total").await?, 1.0, "one prefill leg only");

    // Lower the thresholds live: the next short prompt is split.
    let current: Value =
        http.get(format!("{}/admin/policy", router.url)).bearer_auth(TOKEN).send().await?.json().await?;
    let version = current["version"].as_u64().context("a version")?;
    let put = "policy: cache_aware_approx\npd:\n  min_prompt_tokens: 64\n  min_uncached_tokens: 64\n";
    let response = http
        .put(format!("{}/admin/policy", router.url))
        .bearer_auth(TOKEN)
        .header("if-match", format!("\"{version}\""))
        .body(put)
        .send()
        .await?;
    assert_eq!(response.status(), 200, "{}", response.text().await?);
    let short = json!({"model": MODEL, "prompt": prompt("short-again", 8), "max_tokens": 2});
    let (status, headers, text) = complete(router, &short).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&headers, "x-fleet-pd"), "split");
    assert_eq!(metric(fleet.prefill_url(), "vllm:request_success_total").await?, 2.0);

    // A bad pd field is refused with its name and the policy stays.
    let response = http
        .put(format!("{}/admin/policy", router.url))
        .bearer_auth(TOKEN)
        .header("if-match", format!("\"{}\"", version + 1))
        .body("policy: cache_aware_approx\npd:\n  min_uncached_token: 1\n")
        .send()
        .await?;
    assert_eq!(response.status(), 422);
    assert!(response.text().await?.contains("did you mean min_uncached_tokens"));

    assert_eq!(decisions(router, "short_prompt").await?, 1.0);
    assert_eq!(decisions(router, "cached_at_decode").await?, 1.0);
    assert_eq!(decisions(router, "split").await?, 2.0);
    Ok(())
}

#[tokio::test]
async fn a_failed_transfer_or_prefill_leg_falls_back_to_a_local_prefill() -> Result<()> {
    let fleet = pd_fleet(LoadFailurePolicy::Fail, spec()).await?;
    let router = &fleet.router;

    // The decode replica fails the next load: 500 whole, an error event first when streamed.
    fleet.decode.fleet.set_faults(0, Faults { kv_transfer_fail_next: 2, ..Faults::default() })?;
    let body = json!({"model": MODEL, "prompt": prompt("transfer-fails", 64), "max_tokens": 4});
    let (status, headers, text) = complete(router, &body).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&headers, "x-fleet-pd"), "transfer_failed");
    assert_eq!(header(&headers, "x-fleet-replica"), fleet.decode_url());
    let answer: Value = serde_json::from_str(&text)?;
    assert_eq!(answer["usage"]["completion_tokens"], 4, "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "prefilled locally: {answer}");
    let logged = decision(router, &headers).await?;
    assert_eq!(logged["pd"]["branch"], "local");
    assert!(logged["pd"]["fallback"].as_str().is_some_and(|f| f.contains("decode leg failed")), "{logged}");

    let body = json!({"model": MODEL, "prompt": prompt("transfer-fails-streamed", 64), "max_tokens": 4, "stream": true});
    let (status, headers, text) = complete(router, &body).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&headers, "x-fleet-pd"), "transfer_failed");
    assert!(!text.contains("\"error\""), "the failed transfer never reaches the client: {text}");
    let events = sse_data(&text);
    assert_eq!(events.iter().filter(|e| e.contains("\"finish_reason\":null")).count(), 4, "{text}");
    assert_eq!(metric(fleet.decode_url(), "vllm:nixl_num_failed_transfers_total").await?, 2.0);

    // The prefill replica answers 500: the decode replica prefills, the client sees nothing of it.
    fleet.prefill.fleet.set_faults(0, Faults { error_rate: 1.0, ..Faults::default() })?;
    let body = json!({"model": MODEL, "prompt": prompt("prefill-fails", 64), "max_tokens": 3});
    let (status, headers, text) = complete(router, &body).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&headers, "x-fleet-pd"), "transfer_failed");
    let answer: Value = serde_json::from_str(&text)?;
    assert_eq!(answer["usage"]["completion_tokens"], 3);
    let logged = decision(router, &headers).await?;
    assert!(logged["pd"]["fallback"].as_str().is_some_and(|f| f.contains("prefill leg failed")), "{logged}");

    assert_eq!(decisions(router, "split").await?, 3.0);
    assert_eq!(decisions(router, "transfer_failed").await?, 3.0);
    let text = client().get(format!("{}/metrics", router.url)).send().await?.text().await?;
    assert!(text.contains("fleet_router_pd_fallbacks_total 3"), "{text}");
    let state = router.admin_get(&client(), "/admin/state").await?;
    assert_eq!(
        (state["pd"]["fallbacks"].as_u64(), state["pd"]["decisions"]["transfer_failed"].as_u64()),
        (Some(3), Some(3))
    );
    Ok(())
}

#[tokio::test]
async fn a_dead_prefill_replica_falls_back_and_then_leaves_the_pool() -> Result<()> {
    let decode = spawn_sim(1, sim_config(Role::Decode, LoadFailurePolicy::Fail)).await?;
    // A port nothing listens on.
    let dead = fleet_test_support::loopback_listener().await?;
    let dead_url = format!("http://{}", dead.local_addr()?);
    drop(dead);
    let replicas = vec![
        format!("{dead_url},model={MODEL},role=prefill"),
        format!("{},model={MODEL},role=decode", decode.urls()[0]),
    ];
    let router = router_over(replicas, spec()).await?;
    let body = json!({"model": MODEL, "prompt": prompt("dead-prefill", 64), "max_tokens": 3, "stream": true});
    let (status, headers, text) = complete(&router, &body).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&headers, "x-fleet-pd"), "transfer_failed");
    assert_eq!(sse_data(&text).iter().filter(|e| e.contains("\"finish_reason\":null")).count(), 3, "{text}");
    let logged = decision(&router, &headers).await?;
    assert!(logged["pd"]["fallback"].as_str().is_some_and(|f| f.contains("unreachable")), "{logged}");

    // Failures take it out of rotation (two, with the start-up probe's at most): then no split is tried.
    let mut reasons = Vec::new();
    for n in 0..2 {
        let body = json!({"model": MODEL, "prompt": prompt(&format!("dead-{n}"), 64), "max_tokens": 1});
        let (status, headers, text) = complete(&router, &body).await?;
        assert_eq!(status, 200, "{text}");
        reasons.push(header(&headers, "x-fleet-pd").to_owned());
    }
    assert_eq!(reasons.last().map(String::as_str), Some("no_prefill_replica"), "{reasons:?}");
    Ok(())
}

#[tokio::test]
async fn a_model_with_only_prefill_replicas_says_what_to_add_and_the_state_shows_roles() -> Result<()> {
    let prefill = spawn_sim(1, sim_config(Role::Prefill, LoadFailurePolicy::Fail)).await?;
    let router =
        router_over(vec![format!("{},model={MODEL},role=prefill", prefill.urls()[0])], spec()).await?;
    let body = json!({"model": MODEL, "prompt": prompt("alone", 64), "max_tokens": 1});
    let (status, _, text) = complete(&router, &body).await?;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("only prefill replicas") && text.contains("role=decode"), "{text}");
    let state = router.admin_get(&client(), "/admin/state").await?;
    assert_eq!(state["replicas"][0]["role"], "prefill", "{state}");
    assert_eq!(metric(prefill.urls()[0].as_str(), "vllm:request_success_total").await?, 0.0);
    Ok(())
}

#[tokio::test]
async fn a_busy_prefill_pool_serves_locally_while_its_leg_is_in_flight() -> Result<()> {
    let spec = spec().with_pd("max_prefill_queue", 0);
    let fleet = pd_fleet(LoadFailurePolicy::Fail, spec).await?;
    let router = &fleet.router;
    // The prefill replica answers slowly: the first split's leg stays outstanding a while.
    fleet.prefill.fleet.set_faults(0, Faults { added_latency_ms: 3_000, ..Faults::default() })?;
    let first = json!({"model": MODEL, "prompt": prompt("busy-first", 64), "max_tokens": 2});
    let url = router.url.clone();
    let in_flight = tokio::spawn(async move {
        let response = client().post(format!("{url}/v1/completions")).json(&first).send().await?;
        let reason = header(response.headers(), "x-fleet-pd").to_owned();
        anyhow::Ok((response.status().as_u16(), reason))
    });
    let prefill_url = fleet.prefill_url();
    fleet_test_support::eventually("the prefill leg is outstanding", Duration::from_secs(10), || async {
        let state = router.admin_get(&client(), "/admin/state").await?;
        let replicas = state["replicas"].as_array().cloned().unwrap_or_default();
        let busy = replicas.iter().any(|r| r["url"] == prefill_url && r["outstanding"] == 1);
        Ok(busy.then_some(()))
    })
    .await?;
    let second = json!({"model": MODEL, "prompt": prompt("busy-second", 64), "max_tokens": 2});
    let (status, headers, text) = complete(router, &second).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&headers, "x-fleet-pd"), "prefill_pool_busy");
    let logged = decision(router, &headers).await?;
    assert!(
        logged["pd"]["explanation"].as_str().is_some_and(|e| e.contains("max_prefill_queue 0")),
        "{logged}"
    );
    assert_eq!(in_flight.await??, (200, "split".to_owned()));
    assert_eq!(decisions(router, "prefill_pool_busy").await?, 1.0);
    Ok(())
}

#[tokio::test]
async fn the_prefill_pick_follows_the_prefix_over_the_prefill_pool() -> Result<()> {
    let prefill = spawn_sim(2, sim_config(Role::Prefill, LoadFailurePolicy::Fail)).await?;
    let decode = spawn_sim(1, sim_config(Role::Decode, LoadFailurePolicy::Fail)).await?;
    let mut replicas: Vec<String> =
        prefill.urls().iter().map(|url| format!("{url},model={MODEL},role=prefill")).collect();
    replicas.push(format!("{},model={MODEL},role=decode", decode.urls()[0]));
    let router = router_over(replicas, spec()).await?;
    // A shared 64-block head and 40-block tails: the decode replica lacks 640 tokens of the second, so it
    // is split too, and its prefill goes where the head is.
    let head = prompt("shared-head", 64);
    let mut picks = Vec::new();
    for (n, tail) in ["first-tail", "second-tail", "third-tail"].into_iter().enumerate() {
        let body = json!({"model": MODEL, "prompt": format!("{head}{}", prompt(tail, 40)), "max_tokens": 1});
        let (status, headers, text) = complete(&router, &body).await?;
        assert_eq!(status, 200, "{text}");
        assert_eq!(header(&headers, "x-fleet-pd"), "split", "{tail}");
        picks.push(header(&headers, "x-fleet-prefill-replica").to_owned());
        let logged = decision(&router, &headers).await?;
        assert_eq!(logged["pd"]["prefill"]["candidates"].as_array().map(Vec::len), Some(2), "{logged}");
        if n > 0 {
            // Not a tie broken the same way: the prefill engine followed the cached head.
            let pick = &logged["pd"]["prefill"];
            assert_eq!(pick["branch"], "cache", "{pick}");
            let chosen = pick["candidates"].as_array().and_then(|c| c.iter().find(|c| c["chosen"] == true));
            assert_eq!(chosen.map(|c| c["matched_blocks"].clone()), Some(json!(64)), "{pick}");
        }
    }
    assert!(picks.iter().all(|p| p == &picks[0]) && !picks[0].is_empty(), "{picks:?}");
    let cached = |url: String| async move { metric(&url, "vllm:prefix_cache_hits_total").await };
    let hits = cached(picks[0].clone()).await?;
    assert!(
        hits >= 2.0 * 64.0 * 16.0 - 16.0,
        "the head was cached at the prefill replica it went to: {hits}"
    );
    Ok(())
}

#[tokio::test]
async fn an_sglang_pair_gets_both_legs_at_once_in_one_room_and_either_leg_failing_falls_back() -> Result<()> {
    let sglang = |role| ModelConfig { flavor: Flavor::Sglang, ..sim_config(role, LoadFailurePolicy::Fail) };
    let prefill = spawn_sim(1, sglang(Role::Prefill)).await?;
    let decode = spawn_sim(1, sglang(Role::Decode)).await?;
    let (p, d) = (prefill.urls()[0].clone(), decode.urls()[0].clone());
    // fleet-sim serves its bootstrap (the KV pulls) on its HTTP port.
    let port = prefill.fleet.replicas[0].addr.port();
    let replicas = vec![
        format!("{p},model={MODEL},role=prefill,bootstrap={port}"),
        format!("{d},model={MODEL},role=decode"),
    ];
    let router = router_over(replicas, spec()).await?;

    let body =
        json!({"model": MODEL, "prompt": prompt("sglang-stream", 64), "max_tokens": 8, "stream": true});
    let (status, headers, text) = complete(&router, &body).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        (header(&headers, "x-fleet-pd"), header(&headers, "x-fleet-prefill-replica")),
        ("split", p.as_str())
    );
    let events = sse_data(&text);
    assert_eq!(events.iter().filter(|e| e.contains("\"finish_reason\":null")).count(), 8, "{text}");
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{text}");
    let logged = decision(&router, &headers).await?;
    let room = logged["pd"]["bootstrap_room"].as_u64().with_context(|| format!("no room: {logged}"))?;
    assert!(room <= i64::MAX as u64, "{logged}");

    let body = json!({"model": MODEL, "prompt": prompt("sglang-whole", 64), "max_tokens": 4});
    let (status, headers, text) = complete(&router, &body).await?;
    assert_eq!((status, header(&headers, "x-fleet-pd")), (200, "split"), "{text}");
    let answer: Value = serde_json::from_str(&text)?;
    assert_eq!(answer["usage"]["completion_tokens"], 4);
    assert_eq!(
        answer["usage"]["prompt_tokens_details"]["cached_tokens"], 1023,
        "pulled from the room: {answer}"
    );
    let second_room = decision(&router, &headers).await?["pd"]["bootstrap_room"].as_u64();
    assert!(second_room.is_some_and(|r| r != room), "a fresh room per request");
    // Two prefills of one token each at the prefill server, two pulls, no transfer failed.
    assert_eq!(metric(&p, "sglang:generation_tokens_total").await?, 2.0);
    assert!(metric(&p, "sglang:kv_transfer_latency_ms").await? > 0.0);
    assert_eq!(metric(&d, "sglang:num_transfer_failed_reqs_total").await?, 0.0);
    // The prefill legs end in their own tasks, maybe after the answers: their timings come in.
    fleet_test_support::eventually("both prefill legs timed", Duration::from_secs(10), || async {
        let state = router.admin_get(&client(), "/admin/state").await?;
        Ok((state["pd"]["prefill_leg"]["count"] == 2).then_some(()))
    })
    .await?;
    let state = router.admin_get(&client(), "/admin/state").await?;
    let tagged =
        state["replicas"].as_array().and_then(|r| r.iter().find(|r| r["url"] == p.as_str()).cloned());
    assert_eq!(tagged.map(|r| r["bootstrap_port"].clone()), Some(json!(port)), "{state}");

    // The decode server fails to load the room's KV: the same replica prefills, the client sees nothing.
    decode.fleet.set_faults(0, Faults { kv_transfer_fail_next: 1, ..Faults::default() })?;
    let body = json!({"model": MODEL, "prompt": prompt("sglang-transfer-fails", 64), "max_tokens": 3});
    let (status, headers, text) = complete(&router, &body).await?;
    assert_eq!((status, header(&headers, "x-fleet-pd")), (200, "transfer_failed"), "{text}");
    let answer: Value = serde_json::from_str(&text)?;
    assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "prefilled locally: {answer}");
    let logged = decision(&router, &headers).await?;
    let fallback = logged["pd"]["fallback"].as_str().unwrap_or_default();
    assert!(fallback.contains("decode leg failed"), "{logged}");

    // The prefill server answers 500: the decode attempt, which would wait for the room until its 1.5 s
    // deadline and then fail with a KV transfer error, is abandoned as soon as the prefill leg fails.
    prefill.fleet.set_faults(0, Faults { error_rate: 1.0, ..Faults::default() })?;
    let body = json!({"model": MODEL, "prompt": prompt("sglang-prefill-fails", 64), "max_tokens": 3, "stream": true});
    let (status, headers, text) = complete(&router, &body).await?;
    assert_eq!((status, header(&headers, "x-fleet-pd")), (200, "transfer_failed"), "{text}");
    assert!(!text.contains("\"error\""), "{text}");
    assert_eq!(sse_data(&text).iter().filter(|e| e.contains("\"finish_reason\":null")).count(), 3, "{text}");
    let logged = decision(&router, &headers).await?;
    let fallback = logged["pd"]["fallback"].as_str().unwrap_or_default();
    assert!(fallback.contains("prefill leg failed") && fallback.contains("500"), "{logged}");
    assert_eq!(decisions(&router, "transfer_failed").await?, 2.0);
    Ok(())
}
