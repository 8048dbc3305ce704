//! The attack round's findings against fleet-router, each replayed on a real router (the binary where its
//! memory or its one worker thread is what the attack measures): client data of unbounded size kept in the
//! rings, a policy spec built to be slow, a replica down at start, the scheme's case, hyper's own answers.
//! Resource bounds are measured (RSS, page size, time) against the limits stated in each test.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fleet_router::RouterConfig;
use fleet_sim::ModelConfig;
use fleet_test_support::endpoints::refusing_replica;
use fleet_test_support::etcd::EtcdServer;
use fleet_test_support::process::{rss_bytes, spawn_router_process};
use fleet_test_support::{eventually, spawn_sim};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{TOKEN, client, router};

const MIB: u64 = 1 << 20;

/// A router process over `replica` with the admin token in a file; its URL and the process.
async fn router_process(
    replica: &str,
    extra: &[&str],
) -> Result<(fleet_test_support::process::ChildProcess, String, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN)?;
    let mut args: Vec<String> = ["--listen", "127.0.0.1:0", "--replica", replica, "--admin-token-file"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(token.to_string_lossy().into_owned());
    args.extend(extra.iter().map(|s| s.to_string()));
    let (process, url) = spawn_router_process(&args).await?;
    Ok((process, url, dir))
}


/// The JSON lines of a trace page.
fn trace_lines(page: &[u8]) -> Result<Vec<Value>> {
    std::str::from_utf8(page)?
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).context("a trace line is not JSON"))
        .collect()
}


#[tokio::test]
async fn a_spec_built_to_be_slow_is_refused_at_once_while_traffic_flows() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    // One worker thread: a parse on it would stop every request (a 130 KB spec held traffic for 52 s).
    let (_process, url, _dir) = router_process(&sim.urls()[0], &["--worker-threads", "1"]).await?;
    let http = client();
    let attacks = [
        ("130 KB of brackets", format!("policy: {}", "[".repeat(130_000)), "65536"),
        ("65,000 brackets", format!("policy: {}", "[".repeat(65_000)), "levels deep"),
        ("aliases", "policy: random\na: &a [1, 1]\nb: [*a, *a]\n".to_owned(), "alias"),
    ];
    for (name, spec, named) in attacks {
        let put = http
            .put(format!("{url}/admin/policy"))
            .bearer_auth(TOKEN)
            .header("if-match", "\"1\"")
            .body(spec.clone());
        let started = Instant::now();
        // Traffic at the same moment: answered while the spec is looked at.
        let request = json!({"model": fleet_sim::DEFAULT_MODEL, "prompt": "hello", "max_tokens": 1});
        let traffic = http.post(format!("{url}/v1/completions")).json(&request).send();
        let (answer, served) = tokio::join!(put.send(), traffic);
        let took = started.elapsed();
        let answer = answer?;
        assert_eq!(answer.status(), 422, "{name}");
        let error: Value = answer.json().await?;
        assert_eq!((error["code"].as_str(), error["field"].as_str()), (Some("invalid_spec"), Some("body")));
        let reason = error["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(named), "{name}: {reason}");
        assert_eq!(served?.status(), 200, "{name}: traffic was served");
        eprintln!("{name}: refused in {took:?}");
        // Limit: refused (and the request beside it served) within 2 s on a shared 2-core box.
        assert!(took < Duration::from_secs(2), "{name} took {took:?}");
    }
    let policy: Value =
        http.get(format!("{url}/admin/policy")).bearer_auth(TOKEN).send().await?.json().await?;
    assert_eq!(policy["version"], 1, "nothing was applied");
    Ok(())
}

#[tokio::test]
async fn a_slow_spec_written_to_the_etcd_key_is_refused_and_counted() -> Result<()> {
    let etcd = EtcdServer::start().await?;
    let store = etcd.client()?;
    const KEY: &str = "/fleetdeck/attack/policy";
    store.put(KEY, br#"{"policy": "least_load"}"#).await?;
    let mut source = fleet_router::EtcdPolicySource::new(&etcd.url(), KEY);
    source.check_every = Duration::from_millis(500);
    let router = router(RouterConfig {
        admin_token: Some(TOKEN.into()),
        policy_etcd: Some(source),
        ..Default::default()
    })
    .await?;
    let http = client();
    let started = Instant::now();
    let bad = store.put(KEY, format!("policy: {}", "[".repeat(65_000)).as_bytes()).await?;
    let state = eventually("the router to refuse the value", Duration::from_secs(20), || async {
        let state = router.admin_get(&http, "/admin/state").await?;
        Ok((state["policy_store"]["last_rejected"]["revision"].as_i64() == Some(bad)).then_some(state))
    })
    .await?;
    eprintln!("etcd value refused within {:?}", started.elapsed());
    let reason = state["policy_store"]["last_rejected"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("levels deep"), "{reason}");
    assert_eq!(state["policy"]["name"], "least_load", "the policy in force stays");
    assert_eq!(state["policy_store"]["rejected_total"], 1);
    Ok(())
}



