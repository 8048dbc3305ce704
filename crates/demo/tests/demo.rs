//! The demo fleet: it shows why routing matters (under round_robin its replicas thrash their KV caches and
//! queue; under the cache-aware policy the same traffic hits the cache and answers sooner), and the app
//! starts it from an empty first window, under a history fleet of its own.

use std::time::Duration;

use anyhow::{Context, Result};
use fleet_demo::{DemoConfig, DemoFleet, Launcher};
use fleet_test_support::eventually;
use fleet_test_support::spawn_sim;
use fleetdeck_api::StartDemoArgs;
use fleetdeck_control::routers::admin::AdminClient;
use fleetdeck_control::{Control, ControlConfig};
use tokio_util::sync::CancellationToken;

/// Hit rate (cached over prompt tokens) and median TTFT (ms) of the requests the demo's router recorded
/// after the first `skip`, once at least `count` more have completed.
async fn measure(policy: &str, skip: usize, count: usize) -> Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let config = DemoConfig { policy: format!("policy: {policy}\n"), ..DemoConfig::default() };
    let demo = DemoFleet::start(&config, dir.path(), &cancel).await?;
    let token = std::fs::read_to_string(demo.router.token_file.as_ref().context("token file")?)?;
    let client = AdminClient::new(reqwest::Client::new(), &demo.router_url, Some(token.trim().into()));
    let records = eventually(&format!("{count} requests under {policy}"), Duration::from_secs(120), || {
        let client = client.clone();
        async move {
            let records = client.trace_since(0).await?;
            let done: Vec<_> = records.into_iter().filter(|r| r.status == Some(200)).collect();
            Ok((done.len() >= skip + count).then_some(done))
        }
    })
    .await?;
    let measured = &records[skip..];
    let prompt: u64 = measured.iter().map(|r| u64::from(r.input_length)).sum();
    let cached: u64 = measured.iter().map(|r| u64::from(r.cached_tokens.unwrap_or(0))).sum();
    let mut ttft: Vec<f64> = measured.iter().filter_map(|r| r.ttft_ms).collect();
    ttft.sort_by(f64::total_cmp);
    Ok((cached as f64 / prompt.max(1) as f64, ttft[ttft.len() / 2]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_the_demo_round_robin_thrashes_the_cache_and_cache_aware_routing_fixes_it() -> Result<()> {
    let (rr_hit, rr_ttft) = measure("round_robin", 60, 150).await?;
    let (ca_hit, ca_ttft) = measure("cache_aware_approx", 60, 150).await?;
    eprintln!(
        "round_robin: hit {rr_hit:.3} ttft p50 {rr_ttft:.1} ms; cache_aware_approx: hit {ca_hit:.3} ttft p50 {ca_ttft:.1} ms"
    );
    assert!(
        ca_hit >= rr_hit + 0.2,
        "hit rate {rr_hit:.3} -> {ca_hit:.3}: the demo must show the cache thrash"
    );
    assert!(
        ca_ttft <= rr_ttft * 0.7,
        "TTFT p50 {rr_ttft:.1} -> {ca_ttft:.1} ms: the demo must show queueing"
    );
    Ok(())
}

#[tokio::test]
async fn the_demo_starts_from_an_empty_app_once_and_is_not_saved() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let mut config = ControlConfig::new(vec![], dir.path().join("history.sqlite"));
    config.demo = Some(std::sync::Arc::new(Launcher));
    let control = Control::start(config, stop).await?;
    let args = fleetdeck_api::FleetSnapshotArgs { window_s: 60, synthetic: 0, skip_series: true };
    assert!(control.fleet().snapshot(args).await?.replicas.is_empty());

    let too_big = control.demo().start(StartDemoArgs { replicas: 1000 }).await.unwrap_err();
    assert_eq!(too_big.code, "bad_request");
    let demo = control.demo().start(StartDemoArgs { replicas: 2 }).await?;
    assert_eq!(demo.replicas.len(), 2);
    // A second click answers with the running demo instead of starting another.
    assert_eq!(control.demo().start(StartDemoArgs { replicas: 3 }).await?, demo);

    let snap = eventually("the demo replicas to be scraped", Duration::from_secs(30), || async {
        let snap = control.fleet().snapshot(args).await?;
        Ok(snap.replicas.iter().all(|r| r.engine.as_deref() == Some("vllm")).then_some(snap))
    })
    .await?;
    let mut watched: Vec<String> = snap.replicas.iter().map(|r| r.url.clone()).collect();
    watched.sort();
    let mut started = demo.replicas.clone();
    started.sort();
    assert_eq!(watched, started);
    let view = control.settings().view().await?;
    assert_eq!(view.routers.len(), 1, "the demo's router feeds the router views");
    // The demo's ports change every start, so nothing of it is kept for the next one.
    let saved = fleetdeck_control::settings::SavedSettings::load(&dir.path().join("settings.json"))?;
    assert_eq!(saved, Default::default());

    // Its history is the demo fleet's, never the default fleet's a real fleet will later write.
    let db = sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("history.sqlite").display()))
        .await?;
    let per_fleet = "SELECT f.name, COUNT(s.ts_ms) FROM samples s JOIN replicas r ON r.id = s.replica_id \
                     JOIN fleets f ON f.id = COALESCE(r.fleet_id, 1) GROUP BY f.name ORDER BY f.name";
    let counts: Vec<(String, i64)> =
        eventually("demo samples in the history", Duration::from_secs(30), || {
            let db = db.clone();
            async move {
                let counts: Vec<(String, i64)> = sqlx::query_as(per_fleet).fetch_all(&db).await?;
                Ok((!counts.is_empty()).then_some(counts))
            }
        })
        .await?;
    assert_eq!(counts.iter().map(|(fleet, _)| fleet.as_str()).collect::<Vec<_>>(), ["demo"], "{counts:?}");
    let routers: Vec<(String,)> =
        sqlx::query_as("SELECT f.name FROM routers r JOIN fleets f ON f.id = r.fleet_id")
            .fetch_all(&db)
            .await?;
    assert_eq!(routers, [("demo".to_owned(),)], "the demo's router is audited under the demo fleet");
    Ok(())
}

#[tokio::test]
async fn the_demo_refuses_to_join_an_app_that_watches_a_fleet() -> Result<()> {
    let sim = spawn_sim(1, Default::default()).await?;
    let dir = tempfile::tempdir()?;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let mut config = ControlConfig::new(sim.urls().to_vec(), dir.path().join("history.sqlite"));
    config.demo = Some(std::sync::Arc::new(Launcher));
    let control = Control::start(config, stop).await?;
    let refused = control.demo().start(StartDemoArgs { replicas: 2 }).await.unwrap_err();
    assert_eq!(refused.code, "conflict");
    assert!(refused.message.contains("fleetdeck --demo"), "{}", refused.message);
    Ok(())
}
