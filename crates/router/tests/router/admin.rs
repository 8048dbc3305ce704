//! The admin API: auth, compare-and-swap, validation, rollback, replicas, and the read endpoints showing
//! real traffic; `/metrics` passing `promtool check metrics`.

use std::time::Duration;

use anyhow::Result;
use fleet_router::RouterConfig;
use fleet_sim::ModelConfig;
use fleet_test_support::endpoints::{failing_replica, peer_recording_replica};
use fleet_test_support::{eventually, spawn_sim};
use serde_json::{Value, json};

use crate::support::{TOKEN, admin_router, chat, client, router};

#[tokio::test]
async fn admin_routes_need_the_token_and_are_off_without_one() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let with_token = admin_router(sim.urls()).await?;
    let http = client();
    let routes = [
        ("GET", "/admin/policy"),
        ("PUT", "/admin/policy"),
        ("POST", "/admin/policy/rollback"),
        ("GET", "/admin/replicas"),
        ("POST", "/admin/replicas"),
        ("DELETE", "/admin/replicas/0"),
        ("GET", "/admin/state"),
        ("GET", "/admin/decisions?limit=5"),
        ("GET", "/admin/trace?since=0"),
    ];
    for (method, path) in routes {
        let url = format!("{}{path}", with_token.url);
        let method: reqwest::Method = method.parse()?;
        for auth in [
            None,
            Some("Bearer wrong-token"),
            Some("Basic dXNlcjpwYXNz"),
            Some(&format!("Bearer {TOKEN}x")[..]),
        ] {
            let mut request = http.request(method.clone(), &url);
            if let Some(auth) = auth {
                request = request.header("authorization", auth);
            }
            let response = request.send().await?;
            assert_eq!(response.status(), 401, "{method} {path} with {auth:?}");
            let body: Value = response.json().await?;
            assert_eq!(body["code"], "unauthorized");
            assert!(!body["message"].as_str().unwrap_or_default().contains(TOKEN), "the token leaked");
        }
    }
    let ok = http.get(format!("{}/admin/policy", with_token.url)).bearer_auth(TOKEN).send().await?;
    assert_eq!(ok.status(), 200);
    // The token guards the admin routes only: a mistyped public path is a 404, not a 401.
    let typo = http.get(format!("{}/v1/model", with_token.url)).send().await?;
    assert_eq!(typo.status(), 404);

    let without = router(RouterConfig { replicas: sim.urls().to_vec(), ..RouterConfig::default() }).await?;
    let response = http.get(format!("{}/admin/policy", without.url)).bearer_auth(TOKEN).send().await?;
    assert_eq!(response.status(), 403);
    let body: Value = response.json().await?;
    assert_eq!(body["code"], "admin_disabled");
    assert!(body["message"].as_str().unwrap().contains("--admin-token-file"));
    // /metrics is not an admin route.
    assert_eq!(http.get(format!("{}/metrics", without.url)).send().await?.status(), 200);
    Ok(())
}

#[tokio::test]
async fn policy_changes_are_compare_and_swap_validated_and_roll_back() -> Result<()> {
    let sim = spawn_sim(2, ModelConfig::default()).await?;
    let router = admin_router(sim.urls()).await?;
    let http = client();
    let policy_url = format!("{}/admin/policy", router.url);

    let current = http.get(&policy_url).bearer_auth(TOKEN).send().await?;
    assert_eq!(current.headers()["etag"], "\"1\"");
    let current: Value = current.json().await?;
    assert_eq!(current["version"], 1);
    assert_eq!(current["spec"]["policy"], "round_robin");

    // No If-Match: 428, nothing changes.
    let response = http.put(&policy_url).bearer_auth(TOKEN).body("policy: random\n").send().await?;
    assert_eq!(response.status(), 428);

    // YAML body with the right version: 200 and version 2.
    let yaml = "policy: cache_aware_approx\nparams:\n  cache_threshold: 0.5\n";
    let response =
        http.put(&policy_url).bearer_auth(TOKEN).header("if-match", "\"1\"").body(yaml).send().await?;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["etag"], "\"2\"");
    let body: Value = response.json().await?;
    assert_eq!(
        (body["version"].as_u64(), body["spec"]["params"]["cache_threshold"].as_f64()),
        (Some(2), Some(0.5))
    );

    // A stale version: 409 with the current one, and the policy stays.
    let response = http
        .put(&policy_url)
        .bearer_auth(TOKEN)
        .header("if-match", "\"1\"")
        .json(&json!({"policy": "random"}))
        .send()
        .await?;
    assert_eq!(response.status(), 409);
    let body: Value = response.json().await?;
    assert_eq!(
        (body["code"].as_str(), body["current_version"].as_u64()),
        (Some("version_conflict"), Some(2))
    );

    // Invalid specs: 422 naming the field and the reason; the policy stays.
    for (spec, field) in [
        (json!({"policy": "cache_aware_approx", "params": {"cache_threshold": 7}}), "params.cache_threshold"),
        (json!({"policy": "round_robbin"}), "policy"),
        (json!({"policy": "least_load", "params": {"load_metrc": "requests"}}), "params.load_metrc"),
    ] {
        let response =
            http.put(&policy_url).bearer_auth(TOKEN).header("if-match", "\"2\"").json(&spec).send().await?;
        assert_eq!(response.status(), 422, "{spec}");
        let body: Value = response.json().await?;
        assert_eq!(body["code"], "invalid_spec");
        assert_eq!(body["field"], field, "{body}");
        assert!(!body["reason"].as_str().unwrap_or_default().is_empty());
    }
    let response =
        http.put(&policy_url).bearer_auth(TOKEN).header("if-match", "\"2\"").body("{not json").send().await?;
    assert_eq!(response.status(), 422);
    let now: Value = http.get(&policy_url).bearer_auth(TOKEN).send().await?.json().await?;
    assert_eq!(
        (now["version"].as_u64(), now["spec"]["policy"].as_str()),
        (Some(2), Some("cache_aware_approx"))
    );

    // Traffic is routed by the policy in force.
    let response = http
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&chat("sys", "hi", 2, false))
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-fleet-policy-version"], "2");

    // Rollback: a new version with the previous spec; then round_robin; then nothing left.
    let rollback = format!("{}/admin/policy/rollback", router.url);
    // Conditioned on a version no longer in force (someone moved on since): refused, nothing changes.
    let response = http.post(&rollback).bearer_auth(TOKEN).header("if-match", "\"1\"").send().await?;
    assert_eq!(response.status(), 409);
    let body: Value = response.json().await?;
    assert_eq!(
        (body["code"].as_str(), body["current_version"].as_u64()),
        (Some("version_conflict"), Some(2))
    );
    let response = http.post(&rollback).bearer_auth(TOKEN).header("if-match", "two").send().await?;
    assert_eq!(response.status(), 400);
    let body: Value =
        http.post(&rollback).bearer_auth(TOKEN).header("if-match", "\"2\"").send().await?.json().await?;
    assert_eq!((body["version"].as_u64(), body["spec"]["policy"].as_str()), (Some(3), Some("round_robin")));
    let response = http.post(&rollback).bearer_auth(TOKEN).send().await?;
    assert_eq!(response.status(), 409);
    let body: Value = response.json().await?;
    assert_eq!(body["code"], "no_previous_version");
    let metrics = http.get(format!("{}/metrics", router.url)).send().await?.text().await?;
    assert!(metrics.contains("fleet_router_policy_version 3"), "{metrics}");
    Ok(())
}

#[tokio::test]
async fn replicas_are_listed_added_and_removed() -> Result<()> {
    let sim = spawn_sim(2, ModelConfig::default()).await?;
    let router = admin_router(&sim.urls()[..1]).await?;
    let http = client();
    let replicas_url = format!("{}/admin/replicas", router.url);
    let listed: Value = http.get(&replicas_url).bearer_auth(TOKEN).send().await?.json().await?;
    assert_eq!(listed.as_array().map(Vec::len), Some(1));
    assert_eq!(listed[0]["url"], sim.urls()[0].as_str());
    assert_eq!(listed[0]["model"], fleet_sim::DEFAULT_MODEL, "the model is learned from /v1/models");
    assert_eq!(listed[0]["healthy"], true);

    let response =
        http.post(&replicas_url).bearer_auth(TOKEN).json(&json!({"url": sim.urls()[1]})).send().await?;
    assert_eq!(response.status(), 201);
    let added: Value = response.json().await?;
    let id = added["id"].as_u64().expect("an id");
    let again =
        http.post(&replicas_url).bearer_auth(TOKEN).json(&json!({"url": sim.urls()[1]})).send().await?;
    assert_eq!(again.status(), 409);
    for url in ["ftp://x", "http://127.0.0.1:notaport"] {
        let bad = http.post(&replicas_url).bearer_auth(TOKEN).json(&json!({"url": url})).send().await?;
        assert_eq!(bad.status(), 422, "{url}");
        let body: Value = bad.json().await?;
        assert_eq!(
            (body["code"].as_str(), body["field"].as_str()),
            (Some("invalid_replica"), Some("url")),
            "{body}"
        );
    }

    // Round robin now alternates over both.
    let mut served = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let response = http
            .post(format!("{}/v1/completions", router.url))
            .json(&json!({"prompt": "x", "max_tokens": 1}))
            .send()
            .await?;
        served.insert(response.headers()["x-fleet-replica"].to_str()?.to_owned());
    }
    assert_eq!(served.len(), 2);

    assert_eq!(http.delete(format!("{replicas_url}/{id}")).bearer_auth(TOKEN).send().await?.status(), 204);
    assert_eq!(http.delete(format!("{replicas_url}/{id}")).bearer_auth(TOKEN).send().await?.status(), 404);
    for _ in 0..3 {
        let response = http
            .post(format!("{}/v1/completions", router.url))
            .json(&json!({"prompt": "x", "max_tokens": 1}))
            .send()
            .await?;
        assert_eq!(response.headers()["x-fleet-replica"], sim.urls()[0].as_str());
    }
    Ok(())
}

#[tokio::test]
async fn decisions_state_trace_and_metrics_show_the_traffic() -> Result<()> {
    let sim = spawn_sim(3, ModelConfig::default()).await?;
    let config = RouterConfig {
        replicas: sim.urls().to_vec(),
        admin_token: Some(TOKEN.into()),
        policy: "policy: cache_aware_approx\n".parse()?,
        ..RouterConfig::default()
    };
    let router = router(config).await?;
    let http = client();
    let since = fleet_router::state::unix_ms();
    let system = "You are the support assistant of ACME. Answer briefly and politely. ".repeat(8);
    let mut served = Vec::new();
    for i in 0..6 {
        let response = http
            .post(format!("{}/v1/chat/completions", router.url))
            .header("x-session-id", "alice")
            .json(&chat(&system, &format!("question {i}"), 3, i % 2 == 0))
            .send()
            .await?;
        assert_eq!(response.status(), 200);
        served.push(response.headers()["x-fleet-replica"].to_str()?.to_owned());
        response.bytes().await?;
    }
    // cache_aware_approx keeps the shared prefix on one replica.
    assert!(served.iter().all(|url| *url == served[0]), "{served:?}");

    let decisions = router.admin_get(&http, "/admin/decisions?limit=4").await?;
    let decisions = decisions.as_array().expect("a list");
    assert_eq!(decisions.len(), 4);
    assert!(decisions[0]["request_id"].as_u64() > decisions[1]["request_id"].as_u64(), "newest first");
    let newest = &decisions[0];
    assert_eq!(newest["replica"], served[0].as_str());
    assert_eq!(newest["policy"], "cache_aware_approx");
    assert_eq!(newest["policy_version"], 1);
    assert_eq!(newest["decision"]["branch"], "cache");
    assert_eq!(newest["decision"]["candidates"].as_array().map(Vec::len), Some(3));
    assert!(newest["decision"]["reason"].as_str().is_some_and(|r| !r.is_empty()));

    let state = router.admin_get(&http, "/admin/state").await?;
    assert_eq!(state["policy"]["name"], "cache_aware_approx");
    let replicas = state["replicas"].as_array().expect("replicas");
    assert_eq!(replicas.len(), 3);
    let hot = replicas.iter().find(|r| r["url"] == served[0].as_str()).expect("the hot replica");
    assert_eq!(hot["routed_total"], 6);
    assert!(hot["indexed_blocks"].as_u64() > Some(0));
    let group = &state["prefix_groups"][0];
    assert_eq!(group["requests"], 6);
    assert_eq!(group["share"], 1.0);
    assert_eq!(group["replicas"][0]["requests"], 6);
    assert!(group["replicas"][0]["cached_blocks"].as_u64() > Some(0));
    assert!(group["replicas"][0]["hit_share"].as_f64() >= Some(5.0 / 6.0));

    // The trace holds only hashes and counts, one record per request.
    let trace = eventually("six recorded requests", Duration::from_secs(10), || {
        let http = http.clone();
        let url = format!("{}/admin/trace?since={since}", router.url);
        async move {
            let response = http.get(url).bearer_auth(TOKEN).send().await?;
            anyhow::ensure!(response.headers()["content-type"] == "application/x-ndjson");
            let text = response.text().await?;
            Ok((text.lines().count() == 6).then_some(text))
        }
    })
    .await?;
    assert!(!trace.contains("ACME") && !trace.contains("question"), "prompt text was recorded");
    let records = fleet_trace::read_trace(trace.as_bytes())?;
    let first = &records.records[0];
    assert!(first.hash_ids.len() >= 8);
    assert!(first.chained, "the router records its policy's chained hashes and says so");
    assert_eq!(first.output_length, 3);
    assert_eq!(first.replica.as_deref(), Some(served[0].as_str()));
    assert_eq!(first.status, Some(200));
    assert!(first.session.is_some());
    assert!(
        records.records.iter().all(|r| r.hash_ids[..4] == first.hash_ids[..4]),
        "shared prefix, shared hashes"
    );
    let later: Value = http
        .get(format!("{}/admin/trace?since={}", router.url, fleet_router::state::unix_ms() + 60_000))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .text()
        .await
        .map(|text| Value::from(text.lines().count()))?;
    assert_eq!(later, 0);
    // A cursor (the previous answer's x-fleet-trace-next) pages on from the last record seen.
    let page = |after: u64| {
        let request = http.get(format!("{}/admin/trace?after={after}", router.url)).bearer_auth(TOKEN);
        async move {
            let response = request.send().await?;
            let next: u64 = response.headers()["x-fleet-trace-next"].to_str()?.parse()?;
            anyhow::Ok((next, response.text().await?.lines().count()))
        }
    };
    assert_eq!(page(0).await?, (6, 6));
    assert_eq!(page(6).await?, (6, 0), "nothing new after the newest record");
    assert_eq!(page(4).await?, (6, 2));

    // /metrics: requests by replica and status, branches, hit rate; promtool accepts it.
    let metrics = http.get(format!("{}/metrics", router.url)).send().await?.text().await?;
    assert!(
        metrics
            .contains(&format!("fleet_router_requests_total{{replica=\"{}\",status=\"200\"}} 6", served[0])),
        "{metrics}"
    );
    assert!(metrics.contains("fleet_router_decisions_total{branch=\"cache\"} 5"), "{metrics}");
    assert!(metrics.contains("fleet_router_pick_duration_seconds_count 6"));
    let first_bytes =
        format!("fleet_router_upstream_first_byte_seconds_count{{replica=\"{}\"}} 6", served[0]);
    assert!(metrics.contains(&first_bytes), "every answer's first byte is timed: {metrics}");
    let hit_rate = metrics
        .lines()
        .find_map(|line| line.strip_prefix("fleet_router_estimated_hit_rate "))
        .and_then(|value| value.parse::<f64>().ok())
        .expect("a hit rate");
    assert!(hit_rate > 0.5, "{hit_rate}");
    promtool_check(&metrics).await?;
    Ok(())
}

#[tokio::test]
async fn an_answers_request_id_finds_its_decision_served_or_failed() -> Result<()> {
    let working = peer_recording_replica().await?;
    let (broken_a, broken_b) = (failing_replica().await?, failing_replica().await?);
    let router = router(RouterConfig {
        replicas: vec![
            format!("{},model=served", working.endpoint.url()),
            format!("{},model=broken", broken_a.url()),
            format!("{},model=broken", broken_b.url()),
        ],
        admin_token: Some(TOKEN.into()),
        ..RouterConfig::default()
    })
    .await?;
    let http = client();
    let decision_of = |id: String| {
        let (http, router) = (http.clone(), &router);
        async move {
            let found = router.admin_get(&http, &format!("/admin/decisions?request_id={id}")).await?;
            let found = found.as_array().cloned().unwrap_or_default();
            assert_eq!(found.len(), 1, "{found:?}");
            anyhow::Ok(found[0].clone())
        }
    };
    let ask = |model: &str| {
        http.post(format!("{}/v1/completions", router.url))
            .json(&json!({"model": model, "prompt": "which replica?", "max_tokens": 1}))
            .send()
    };

    let served = ask("served").await?;
    assert_eq!(served.status(), 200);
    let id = served.headers()["x-fleet-request-id"].to_str()?.to_owned();
    let replica = served.headers()["x-fleet-replica"].to_str()?.to_owned();
    let decision = decision_of(id.clone()).await?;
    assert_eq!(
        (decision["request_id"].to_string(), decision["replica"].as_str()),
        (id, Some(replica.as_str()))
    );
    assert!(decision.get("error").is_none(), "{decision}");

    // Both replicas of `broken` answer 500: the client gets a 502, and its id leads to every attempt.
    let failed = ask("broken").await?;
    assert_eq!(failed.status(), 502);
    let id = failed.headers()["x-fleet-request-id"].to_str()?.to_owned();
    let decision = decision_of(id).await?;
    let attempts: Vec<&str> =
        decision["attempts"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    assert_eq!(attempts.len(), 2, "{decision}");
    assert!(attempts.contains(&broken_a.url().as_str()) && attempts.contains(&broken_b.url().as_str()));
    assert!(decision["error"].as_str().is_some_and(|e| e.contains("500")), "{decision}");
    // Nothing was served, so the prefix heat does not count it.
    let state = router.admin_get(&http, "/admin/state").await?;
    let counted: u64 =
        state["prefix_groups"].as_array().into_iter().flatten().filter_map(|g| g["requests"].as_u64()).sum();
    assert_eq!(counted, 1, "only the served request: {}", state["prefix_groups"]);

    let unknown = router.admin_get(&http, "/admin/decisions?request_id=999999").await?;
    assert_eq!(unknown, json!([]), "an id the log does not hold is an empty list");
    Ok(())
}

/// Runs `promtool check metrics` on `text` (Debian's prometheus package provides promtool).
pub(crate) async fn promtool_check(text: &str) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|error| anyhow::anyhow!("cannot run promtool (apt-get install prometheus): {error}"))?;
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(text.as_bytes()).await?;
    drop(stdin);
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output()).await??;
    anyhow::ensure!(
        output.status.success(),
        "promtool check metrics failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}
