//! Engine load in the router: each replica's queue, running requests and KV usage read from its own
//! `/metrics` in the background, so a router sees the load other routers sent; figures that stop coming age
//! out (and are flagged stale), and a body that is garbage or too large is refused without touching routing.

use std::time::Duration;

use anyhow::{Context, Result};
use fleet_policy::PolicySpec;
use fleet_router::{EngineMetricsConfig, RouterConfig};
use fleet_sim::ModelConfig;
use fleet_test_support::endpoints::{MetricsMode, metrics_replica};
use fleet_test_support::{eventually, spawn_sim};
use serde_json::Value;

use crate::support::{TOKEN, TestRouter, chat, client, router};

/// Scrapes every 50 ms, each within 300 ms; figures count for 4 intervals (200 ms).
fn fast_scrapes() -> EngineMetricsConfig {
    EngineMetricsConfig {
        interval: Duration::from_millis(50),
        timeout: Duration::from_millis(300),
        ..EngineMetricsConfig::default()
    }
}

async fn router_over(replicas: Vec<String>, policy: &str) -> Result<TestRouter> {
    router_with(replicas, PolicySpec::named(policy)).await
}

async fn router_with(replicas: Vec<String>, policy: PolicySpec) -> Result<TestRouter> {
    router(RouterConfig {
        replicas,
        policy,
        admin_token: Some(TOKEN.into()),
        engine_metrics: fast_scrapes(),
        ..RouterConfig::default()
    })
    .await
}

/// The `/admin/state` entry of the replica at `url`.
async fn replica_state(router: &TestRouter, http: &reqwest::Client, url: &str) -> Result<Value> {
    let state = router.admin_get(http, "/admin/state").await?;
    state["replicas"]
        .as_array()
        .and_then(|replicas| replicas.iter().find(|r| r["url"] == url))
        .cloned()
        .with_context(|| format!("no replica {url} in {state}"))
}

/// Sends one short chat request through `router`; returns the replica that served it.
async fn served_by(router: &TestRouter, http: &reqwest::Client, user: &str) -> Result<String> {
    let response = http
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&chat("sys", user, 2, false))
        .send()
        .await?;
    anyhow::ensure!(response.status().is_success(), "status {}", response.status());
    let replica = response.headers()["x-fleet-replica"].to_str()?.to_owned();
    response.bytes().await?;
    Ok(replica)
}

#[tokio::test]
async fn load_sent_through_one_router_steers_another_routers_load_aware_picks() -> Result<()> {
    let sim = spawn_sim(2, ModelConfig::default()).await?;
    let http = client();
    // Router A pins one prompt to one replica (consistent hash, its load bound out of reach) and keeps long
    // generations there.
    let pinning = PolicySpec::named("consistent_hash").with("load_factor", 10.0);
    let a = router_with(sim.urls().to_vec(), pinning).await?;
    let long = chat(&"A long shared system prompt. ".repeat(20), "write forever", 4_000, true);
    let mut held = Vec::new();
    for _ in 0..6 {
        let response = http.post(format!("{}/v1/chat/completions", a.url)).json(&long).send().await?;
        anyhow::ensure!(response.status().is_success(), "status {}", response.status());
        held.push(response);
    }
    let busy = held[0].headers()["x-fleet-replica"].to_str()?.to_owned();
    assert!(held.iter().all(|r| r.headers()["x-fleet-replica"] == busy.as_str()), "A spread the prompt");
    let idle = sim.urls().iter().find(|u| **u != busy).context("two replicas")?.clone();
    for policy in ["least_load", "weighted_scorers", "cache_aware_approx"] {
        // Router B lists the busy replica first: on its own counts (0 and 0) every policy here ties to it.
        let b = router_over(vec![busy.clone(), idle.clone()], policy).await?;
        eventually(
            "router B to see A's requests in the busy replica's engine figures",
            Duration::from_secs(10),
            || async {
                let replica = replica_state(&b, &http, &busy).await?;
                let running = replica["engine"]["running"].as_f64().unwrap_or(0.0);
                Ok((running >= 6.0
                    && replica["engine"]["stale"] == false
                    && replica["load"]["source"] == "engine")
                    .then_some(()))
            },
        )
        .await?;
        let idle_state = replica_state(&b, &http, &idle).await?;
        assert_eq!(idle_state["load"]["source"], "engine", "{idle_state}");
        for i in 0..3 {
            let picked = served_by(&b, &http, &format!("question {i}")).await?;
            assert_eq!(picked, idle, "{policy}: router B sent request {i} to the replica A keeps busy");
        }
        let busy_state = replica_state(&b, &http, &busy).await?;
        assert!(busy_state["load"]["seen"].as_u64() >= Some(6), "{busy_state}");
        assert_eq!(busy_state["load"]["own"], 0, "{busy_state}");
    }
    drop(held);
    Ok(())
}

#[tokio::test]
async fn figures_from_a_replica_whose_metrics_stop_answering_age_out_and_are_flagged_stale() -> Result<()> {
    let model = fleet_sim::DEFAULT_MODEL;
    let flaky = metrics_replica(model, MetricsMode::Load { waiting: 3, running: 9, kv_usage: 0.5 }).await?;
    let steady = metrics_replica(model, MetricsMode::Load { waiting: 0, running: 0, kv_usage: 0.1 }).await?;
    let http = client();
    // least_load over [flaky, steady]: on the router's own counts (0 and 0) it ties to flaky, the first.
    let r = router_over(vec![flaky.url(), steady.url()], "least_load").await?;
    let fresh = eventually("flaky's figures to arrive", Duration::from_secs(10), || async {
        let replica = replica_state(&r, &http, &flaky.url()).await?;
        Ok((replica["engine"]["running"] == 9.0 && replica["engine"]["stale"] == false).then_some(replica))
    })
    .await?;
    assert_eq!(fresh["engine"]["waiting"], 3.0, "{fresh}");
    assert_eq!(fresh["load"]["seen"], 12, "{fresh}");
    assert_eq!(served_by(&r, &http, "while fresh").await?, steady.url(), "fresh figures: flaky holds 12");
    let metrics = http.get(format!("{}/metrics", r.url)).send().await?.text().await?;
    let flaky_label = format!("replica=\"{}\"", flaky.url());
    assert!(
        metrics.contains(&format!("fleet_router_replica_engine_running{{{flaky_label}}} 9")),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("fleet_router_replica_engine_metrics_stale{{{flaky_label}}} 0")),
        "{metrics}"
    );

    flaky.set(MetricsMode::Silent);
    let stale = eventually("flaky's figures to age out", Duration::from_secs(10), || async {
        let replica = replica_state(&r, &http, &flaky.url()).await?;
        Ok((replica["engine"]["stale"] == true).then_some(replica))
    })
    .await?;
    // The last figures stay on show with their age; the policy no longer counts them.
    assert_eq!(stale["engine"]["running"], 9.0, "{stale}");
    assert!(stale["engine"]["age_ms"].as_u64() > Some(200), "{stale}");
    assert_eq!(stale["load"]["source"], "own", "{stale}");
    assert_eq!(
        served_by(&r, &http, "after the figures aged out").await?,
        flaky.url(),
        "stale figures still counted"
    );
    eventually("the timed-out scrape to be counted with its error", Duration::from_secs(10), || async {
        let replica = replica_state(&r, &http, &flaky.url()).await?;
        let error = replica["engine"]["error"].as_str().unwrap_or_default().to_owned();
        Ok((replica["engine"]["scrapes_failed"].as_u64() >= Some(1) && error.contains("no answer"))
            .then_some(()))
    })
    .await?;
    let metrics = http.get(format!("{}/metrics", r.url)).send().await?.text().await?;
    assert!(
        metrics.contains(&format!("fleet_router_replica_engine_metrics_stale{{{flaky_label}}} 1")),
        "{metrics}"
    );

    // It comes back: fresh figures count again.
    flaky.set(MetricsMode::Load { waiting: 0, running: 7, kv_usage: 0.5 });
    eventually("flaky's figures to be fresh again", Duration::from_secs(10), || async {
        let replica = replica_state(&r, &http, &flaky.url()).await?;
        Ok((replica["engine"]["running"] == 7.0 && replica["engine"]["stale"] == false).then_some(()))
    })
    .await?;
    assert_eq!(served_by(&r, &http, "fresh again").await?, steady.url());
    Ok(())
}

#[tokio::test]
async fn garbage_or_oversized_metrics_are_refused_without_harming_routing() -> Result<()> {
    let model = fleet_sim::DEFAULT_MODEL;
    let garbage =
        metrics_replica(model, MetricsMode::Body("<html>502 Bad Gateway</html>\n{not: metrics}".into()))
            .await?;
    // 4 MiB of comment lines: valid exposition, but twice the size cap.
    let huge = metrics_replica(model, MetricsMode::Body("# padding\n".repeat(400_000))).await?;
    let http = client();
    let r = router_over(vec![garbage.url(), huge.url()], "round_robin").await?;
    for (replica, expected) in [(&garbage, "malformed"), (&huge, "more than")] {
        let seen =
            eventually("the bad body to be refused, with its reason", Duration::from_secs(10), || async {
                let state = replica_state(&r, &http, &replica.url()).await?;
                let error = state["engine"]["error"].as_str().unwrap_or_default().to_owned();
                Ok((state["engine"]["scrapes_failed"].as_u64() >= Some(2) && error.contains(expected))
                    .then_some(state))
            })
            .await?;
        assert_eq!(seen["engine"]["scrapes_ok"], 0, "{seen}");
        assert_eq!(seen["engine"]["stale"], true, "{seen}");
        assert_eq!(seen["engine"]["running"], Value::Null, "{seen}");
        assert_eq!(seen["load"]["source"], "own", "{seen}");
        assert!(seen["engine"]["error"].as_str().unwrap_or_default().len() <= 300, "{seen}");
    }
    // Routing goes on over both, as healthy replicas.
    let mut served = Vec::new();
    for i in 0..4 {
        served.push(served_by(&r, &http, &format!("q{i}")).await?);
    }
    assert!(served.contains(&garbage.url()) && served.contains(&huge.url()), "{served:?}");
    Ok(())
}
