//! Disaggregated prefill/decode over real HTTP on 127.0.0.1: vLLM's flow (the prefill leg answers with
//! `kv_transfer_params`, the decode leg pulls) and SGLang's (both legs at once, meeting in a bootstrap room),
//! transfer time by size, failed transfers as the engines report them, and held blocks freed by the lease.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fleet_sim::engine::{EngineConfig, LoadFailurePolicy, TransferCost};
use fleet_sim::pd::{PdConfig, Role};
use fleet_sim::{Faults, Flavor, ReplicaConfig};
use fleet_test_support::eventually;
use serde_json::{Value, json};

use super::serve::{MODEL, TestFleet, client, prompt, promtool_check, start_fleet};

/// 1 KiB of KV per token over 1 Gbit/s: a token's KV takes 8.192 us on the wire, a transfer 2 ms more.
fn transfer() -> TransferCost {
    TransferCost { bytes_per_token: 1024, gbps: 1.0, latency_us: 2_000 }
}

fn config(flavor: Flavor, role: Role, policy: LoadFailurePolicy, lease: Duration) -> ReplicaConfig {
    ReplicaConfig {
        engine: EngineConfig {
            kv_transfer: transfer(),
            kv_load_failure_policy: policy,
            ..EngineConfig::default()
        },
        flavor,
        pd: PdConfig { role, lease, wait_timeout: Duration::from_millis(1_500) },
        ..ReplicaConfig::default()
    }
}

async fn pair(flavor: Flavor, policy: LoadFailurePolicy, lease: Duration) -> Result<(TestFleet, TestFleet)> {
    let prefill = start_fleet(1, config(flavor, Role::Prefill, policy, lease), None).await?;
    let decode = start_fleet(1, config(flavor, Role::Decode, policy, lease), None).await?;
    Ok((prefill, decode))
}

async fn post(url: &str, body: &Value) -> Result<(u16, Value)> {
    let response = client().post(format!("{url}/v1/completions")).json(body).send().await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await.context("a JSON body")?))
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

/// The value of the sample of `name` whose labels contain `needle`.
async fn labelled(url: &str, name: &str, needle: &str) -> Result<f64> {
    let text = client().get(format!("{url}/metrics")).send().await?.text().await?;
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(needle))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .with_context(|| format!("no {name} with {needle} in {url}/metrics"))
}

/// vLLM's toy proxy's prefill leg.
fn prefill_leg(text: &str) -> Value {
    json!({
        "model": MODEL, "prompt": text, "max_tokens": 1, "stream": false,
        "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
                               "remote_block_ids": null, "remote_host": null, "remote_port": null},
    })
}

fn decode_leg(text: &str, params: &Value, max_tokens: u32) -> Value {
    json!({"model": MODEL, "prompt": text, "max_tokens": max_tokens, "kv_transfer_params": params})
}

/// Transfer seconds the engine model gives `tokens` tokens.
fn seconds(tokens: u32) -> f64 {
    transfer().duration_us(tokens) as f64 / 1e6
}

#[tokio::test]
async fn vllm_flow_pulls_the_prompt_once_and_decodes_without_recomputing_it() -> Result<()> {
    let (prefill, decode) = pair(Flavor::Vllm, LoadFailurePolicy::Fail, Duration::from_secs(60)).await?;
    let (p, d) = (prefill.url(0), decode.url(0));
    let text = prompt("pd-vllm", 32); // 32 blocks of 16 tokens

    let (status, answer) = post(p, &prefill_leg(&text)).await?;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 1);
    let params = answer["kv_transfer_params"].clone();
    assert_eq!(params["do_remote_prefill"], true, "{params}");
    assert_eq!(params["do_remote_decode"], false);
    assert_eq!(params["remote_port"], u64::from(prefill.fleet.replicas[0].addr.port()));
    assert_eq!(params["remote_num_tokens"], 512);
    assert!(params["remote_engine_id"].as_str().is_some_and(|e| !e.is_empty()));
    assert_eq!(params["remote_block_ids"][0].as_array().map(Vec::len), Some(32));
    assert!(metric(p, "vllm:kv_cache_usage_perc").await? > 0.0, "the prefill replica holds the blocks");

    let (status, answer) = post(d, &decode_leg(&text, &params, 8)).await?;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens"], 512);
    assert_eq!(answer["usage"]["completion_tokens"], 8);
    assert_eq!(
        answer["usage"]["prompt_tokens_details"]["cached_tokens"], 511,
        "every prompt token but the last came over the wire"
    );
    assert_eq!(metric(d, "vllm:nixl_xfer_time_seconds_count").await?, 1.0);
    assert!((metric(d, "vllm:nixl_xfer_time_seconds_sum").await? - seconds(512)).abs() < 1e-9);
    assert_eq!(metric(d, "vllm:nixl_bytes_transferred_sum").await?, 512.0 * 1024.0);
    eventually("the pulled blocks are freed on the prefill replica", Duration::from_secs(5), || async {
        Ok((metric(p, "vllm:kv_cache_usage_perc").await? == 0.0).then_some(()))
    })
    .await?;

    // The same params again: nothing is held any more, so the load fails as vLLM's does under
    // kv_load_failure_policy=fail: a 500, never a hang.
    let (status, answer) = post(d, &decode_leg(&text, &params, 8)).await?;
    assert_eq!(status, 500, "{answer}");
    assert_eq!(answer["error"]["message"], "Internal server error");
    assert_eq!(answer["error"]["type"], "InternalServerError");
    assert_eq!(metric(d, "vllm:nixl_num_failed_transfers_total").await?, 1.0);
    assert_eq!(labelled(d, "vllm:request_success_total", r#"finished_reason="length""#).await?, 1.0);
    assert_eq!(labelled(d, "vllm:request_success_total", r#"finished_reason="error""#).await?, 1.0);
    Ok(())
}

#[tokio::test]
async fn transfer_time_scales_with_the_uncached_prompt() -> Result<()> {
    let (prefill, decode) = pair(Flavor::Vllm, LoadFailurePolicy::Fail, Duration::from_secs(60)).await?;
    let (p, d) = (prefill.url(0), decode.url(0));
    let mut sums = Vec::new();
    for (seed, blocks) in [("short", 8), ("long", 64)] {
        let text = prompt(seed, blocks);
        let (_, answer) = post(p, &prefill_leg(&text)).await?;
        let before = metric(d, "vllm:nixl_xfer_time_seconds_sum").await?;
        let (status, answer) = post(d, &decode_leg(&text, &answer["kv_transfer_params"], 2)).await?;
        assert_eq!(status, 200, "{answer}");
        sums.push(metric(d, "vllm:nixl_xfer_time_seconds_sum").await? - before);
    }
    assert!((sums[0] - seconds(128)).abs() < 1e-9, "{sums:?}");
    assert!((sums[1] - seconds(1024)).abs() < 1e-9, "{sums:?}");
    let wire = |s: f64| s - transfer().latency_us as f64 / 1e6;
    assert!((wire(sums[1]) / wire(sums[0]) - 8.0).abs() < 0.01, "8x the tokens, 8x the wire time: {sums:?}");

    // A prompt whose head the decode replica has cached pulls only the rest.
    let shared = prompt("long", 64);
    let text = format!("{shared}{}", prompt("tail", 4));
    let (_, answer) = post(p, &prefill_leg(&text)).await?;
    let bytes = metric(d, "vllm:nixl_bytes_transferred_sum").await?;
    let (status, answer) = post(d, &decode_leg(&text, &answer["kv_transfer_params"], 2)).await?;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], 68 * 16 - 1);
    assert_eq!(metric(d, "vllm:nixl_bytes_transferred_sum").await? - bytes, 4.0 * 16.0 * 1024.0);
    Ok(())
}

#[tokio::test]
async fn a_failed_transfer_is_a_500_an_error_event_or_a_local_prefill_as_the_policy_says() -> Result<()> {
    let (prefill, decode) = pair(Flavor::Vllm, LoadFailurePolicy::Fail, Duration::from_secs(60)).await?;
    let (p, d) = (prefill.url(0), decode.url(0));
    decode.fleet.set_faults(0, Faults { kv_transfer_fail_next: 2, ..Faults::default() })?;
    let text = prompt("pd-fail", 8);
    let (_, answer) = post(p, &prefill_leg(&text)).await?;
    let (status, body) = post(d, &decode_leg(&text, &answer["kv_transfer_params"], 4)).await?;
    assert_eq!((status, body["error"]["message"].as_str()), (500, Some("Internal server error")), "{body}");

    // Streamed: the headers are out, so the stream ends with an error event, as vLLM's does.
    let (_, answer) = post(p, &prefill_leg(&text)).await?;
    let mut leg = decode_leg(&text, &answer["kv_transfer_params"], 4);
    leg["stream"] = json!(true);
    let response = client().post(format!("{d}/v1/completions")).json(&leg).send().await?;
    assert_eq!(response.status(), 200);
    let events = response.text().await?;
    assert!(events.contains(r#""message":"Internal server error""#), "{events}");
    assert!(!events.contains(r#""text""#), "no token before the error: {events}");
    assert_eq!(metric(d, "vllm:nixl_num_failed_transfers_total").await?, 2.0);
    assert_eq!(labelled(d, "vllm:request_success_total", r#"finished_reason="error""#).await?, 2.0);

    // kv_load_failure_policy=recompute: the decode replica computes the prompt itself.
    let (prefill, decode) = pair(Flavor::Vllm, LoadFailurePolicy::Recompute, Duration::from_secs(60)).await?;
    decode.fleet.set_faults(0, Faults { kv_transfer_fail_rate: 1.0, ..Faults::default() })?;
    let (_, answer) = post(prefill.url(0), &prefill_leg(&text)).await?;
    let (status, body) = post(decode.url(0), &decode_leg(&text, &answer["kv_transfer_params"], 4)).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "computed locally");
    assert_eq!(body["usage"]["completion_tokens"], 4);
    Ok(())
}

#[tokio::test]
async fn held_blocks_are_freed_when_the_lease_runs_out() -> Result<()> {
    let (prefill, decode) = pair(Flavor::Vllm, LoadFailurePolicy::Fail, Duration::from_millis(2_000)).await?;
    let (p, d) = (prefill.url(0), decode.url(0));
    let text = prompt("pd-lease", 16);
    let (_, answer) = post(p, &prefill_leg(&text)).await?;
    assert!(metric(p, "vllm:kv_cache_usage_perc").await? > 0.0);
    eventually("the lease frees the held blocks", Duration::from_secs(10), || async {
        Ok((metric(p, "vllm:kv_cache_usage_perc").await? == 0.0).then_some(()))
    })
    .await?;
    assert_eq!(metric(p, "vllm:nixl_num_kv_expired_reqs_total").await?, 1.0);
    let (status, body) = post(d, &decode_leg(&text, &answer["kv_transfer_params"], 4)).await?;
    assert_eq!(status, 500, "a pull after the lease fails: {body}");
    Ok(())
}

#[tokio::test]
async fn sglang_flow_sends_both_legs_at_once_and_meets_in_the_room() -> Result<()> {
    let (prefill, decode) = pair(Flavor::Sglang, LoadFailurePolicy::Fail, Duration::from_secs(60)).await?;
    let (p, d) = (prefill.url(0), decode.url(0));
    let port = prefill.fleet.replicas[0].addr.port();
    let text = prompt("pd-sglang", 16);
    let leg = |room: u64, max_tokens: u32| {
        json!({"model": MODEL, "prompt": text, "max_tokens": max_tokens,
               "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room})
    };
    // The decode leg goes first: it waits for the room, bounded.
    let body = leg(42, 6);
    let (decoded, prefilled) = tokio::join!(post(d, &body), post(p, &body));
    let ((d_status, d_body), (p_status, p_body)) = (decoded?, prefilled?);
    assert_eq!((p_status, d_status), (200, 200), "{p_body} {d_body}");
    assert_eq!(p_body["usage"]["completion_tokens"], 1, "the prefill server samples the first token only");
    assert_eq!(d_body["usage"]["completion_tokens"], 6);
    assert_eq!(d_body["usage"]["prompt_tokens_details"]["cached_tokens"], 255);
    assert!(metric(p, "sglang:kv_transfer_latency_ms").await? > 0.0);
    assert!((metric(p, "sglang:kv_transfer_latency_ms").await? - seconds(256) * 1e3).abs() < 1e-6);
    assert!(metric(p, "sglang:kv_transfer_speed_gb_s").await? > 0.0);
    assert_eq!(metric(d, "sglang:num_decode_transfer_queue_reqs").await?, 0.0);
    assert_eq!(metric(p, "sglang:num_prefill_inflight_queue_reqs").await?, 0.0, "pulled, so no longer held");

    // A room no prefill ever serves: the decode leg gives up at its deadline with SGLang's error.
    let (status, body) = post(d, &leg(7, 6)).await?;
    assert_eq!(status, 500, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("KVTransferError(bootstrap_room=7)"), "{message}");
    assert_eq!(metric(d, "sglang:num_transfer_failed_reqs_total").await?, 1.0);
    assert_eq!(metric(p, "sglang:num_bootstrap_failed_reqs_total").await?, 1.0);

    // An injected failure during the transfer fails the request the same way.
    decode.fleet.set_faults(0, Faults { kv_transfer_fail_next: 1, ..Faults::default() })?;
    let body = leg(43, 6);
    let (decoded, prefilled) = tokio::join!(post(d, &body), post(p, &body));
    let ((d_status, d_body), (p_status, _)) = (decoded?, prefilled?);
    assert_eq!((p_status, d_status), (200, 500), "{d_body}");
    assert!(d_body["error"]["message"].as_str().is_some_and(|m| m.contains("bootstrap_room=43")), "{d_body}");
    Ok(())
}

#[tokio::test]
async fn roles_show_and_malformed_params_are_refused() -> Result<()> {
    let (prefill, decode) = pair(Flavor::Vllm, LoadFailurePolicy::Fail, Duration::from_secs(60)).await?;
    let both = start_fleet(1, ReplicaConfig::default(), None).await?;
    for (fleet, role, kv_role) in
        [(&prefill, "prefill", "kv_producer"), (&decode, "decode", "kv_consumer"), (&both, "both", "kv_both")]
    {
        let info: Value = client().get(format!("{}/server_info", fleet.url(0))).send().await?.json().await?;
        assert_eq!((info["role"].as_str(), info["kv_role"].as_str()), (Some(role), Some(kv_role)), "{info}");
        let text = client().get(format!("{}/metrics", fleet.url(0))).send().await?.text().await?;
        assert!(
            text.contains(&format!("fleet_sim_replica_info{{model_name=\"{MODEL}\",role=\"{role}\"")),
            "{role}"
        );
        assert_eq!(
            text.contains("vllm:nixl_xfer_time_seconds"),
            role != "both",
            "NIXL metrics only with a connector"
        );
        promtool_check(&text).with_context(|| format!("role {role}"))?;
    }
    let text = prompt("pd-bad", 2);
    for params in [
        json!("decode please"),
        json!({"do_remote_prefill": true, "remote_host": "127.0.0.1"}),
        json!({"do_remote_prefill": "yes"}),
    ] {
        let (status, body) = post(decode.url(0), &decode_leg(&text, &params, 2)).await?;
        assert_eq!(status, 400, "{params}: {body}");
        assert_eq!(body["error"]["param"], "kv_transfer_params");
        assert!(
            body["error"]["message"].as_str().is_some_and(|m| m.contains("kv_transfer_params")),
            "{body}"
        );
    }
    // A replica without a role serves such a request as any other (an engine without a KV connector).
    let (status, _) = post(both.url(0), &decode_leg(&text, &json!("decode please"), 2)).await?;
    assert_eq!(status, 200);
    // A pull for nothing is refused, not waited on.
    let response = client()
        .post(format!("{}/fleet_sim/kv/pull", prefill.url(0)))
        .json(&json!({"request_id": 999_999}))
        .send()
        .await?;
    assert_eq!(response.status(), 404);
    Ok(())
}
