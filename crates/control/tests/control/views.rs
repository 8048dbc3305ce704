//! The read-only views' commands against a real fleet-router (admin API on, cache-aware policy)
//! over fleet-sim replicas: heat map and hotspots, the router's index accuracy, decisions with
//! candidates, headroom from the recorded trace, replica history with policy-change markers, and
//! settings that probe what is added and keep router tokens in 0600 files.

use std::time::Duration;

use anyhow::{Context, Result};
use fleet_router::RouterConfig;
use fleet_test_support::admin_router::spawn_router_with;
use fleet_test_support::endpoints::garbage_metrics;
use fleet_test_support::{eventually, spawn_sim};
use fleetdeck_api::{
    AddEndpointArgs, DecisionsArgs, EndpointKind, HeadroomArgs, HeatMapArgs, IndexAccuracy, PdViewArgs,
    RemoveEndpointArgs, ReplicaHistoryArgs, ScrapeIntervalArgs,
};
use fleetdeck_control::{Control, ControlConfig, RouterTarget};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "views-test-token";

/// The app watching `replicas` and reading `routers` with the test's token, its history in `dir`, set up
/// further by `tune`; it stops when the guard drops.
async fn app_over(
    replicas: Vec<String>,
    routers: &[String],
    dir: &std::path::Path,
    tune: impl FnOnce(&mut ControlConfig),
) -> Result<(Control, tokio_util::sync::DropGuard)> {
    let mut config = ControlConfig::new(replicas, dir.join("history.sqlite"));
    config.routers = routers
        .iter()
        .map(|url| RouterTarget {
            url: url.clone(),
            token: Some(TOKEN.into()),
            token_file: None,
            metrics_url: None,
        })
        .collect();
    tune(&mut config);
    let stop = CancellationToken::new();
    let guard = stop.clone().drop_guard();
    Ok((Control::start(config, stop).await?, guard))
}

async fn send(client: &reqwest::Client, router: &str, prompt: &str) -> Result<()> {
    client
        .post(format!("{router}/v1/completions"))
        .json(&json!({"prompt": prompt, "max_tokens": 2}))
        .send()
        .await?
        .error_for_status()?;
    Ok(())
}

#[tokio::test]
async fn heat_decisions_headroom_and_history_come_from_the_live_router() -> Result<()> {
    let sim = spawn_sim(3, Default::default()).await?;
    let router = spawn_router_with(RouterConfig {
        replicas: sim.urls().to_vec(),
        admin_token: Some(TOKEN.into()),
        policy: "policy: cache_aware_approx\n".parse()?,
        ..Default::default()
    })
    .await?;
    let dir = tempfile::tempdir()?;
    let (control, _stop) = app_over(sim.urls().to_vec(), &[router.url()], dir.path(), |_| {}).await?;

    // One tenant dominates: 30 requests sharing a long prefix, 6 of another.
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build()?;
    let hot = "You are the support bot of a very popular tenant. ".repeat(10);
    let cold = "A rarely used tenant prompt with its own words. ".repeat(10);
    for i in 0..30 {
        send(&client, &router.url(), &format!("{hot} q{i}")).await?;
        if i % 5 == 0 {
            send(&client, &router.url(), &format!("{cold} q{i}")).await?;
        }
    }

    let heat = eventually("the heat map to show both groups", Duration::from_secs(30), || async {
        let heat = control.routers().heat_map(HeatMapArgs { hotspot_share: 0.5 }).await?;
        Ok((heat.groups.len() >= 2).then_some(heat))
    })
    .await?;
    assert_eq!(heat.routers[0].error, None, "{:?}", heat.routers);
    assert_eq!(heat.routers[0].policy.as_deref(), Some("cache_aware_approx"));
    // The router's index accuracy, as its /admin/state says (fleet-sim's text prompts are not
    // token-exact, so its index predicted nothing: zero predictions, which is not "not reported").
    let state: serde_json::Value = client
        .get(format!("{}/admin/state", router.url()))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let reported = &state["index_accuracy"];
    assert_eq!(
        heat.routers[0].index_accuracy,
        Some(IndexAccuracy {
            predictions: reported["predictions"].as_u64().context("predictions")?,
            within_block: reported["within_block"].as_u64().context("within_block")?,
        }),
        "{state}"
    );
    assert_eq!(heat.routers[0].index_accuracy.and_then(|a| a.share()), None, "no share before a prediction");
    assert_eq!(heat.replicas.len(), 3);
    let top = &heat.groups[0];
    assert_eq!(top.requests, 30, "{heat:?}");
    assert!(
        top.cells.iter().map(|c| c.cached_blocks).max().unwrap_or(0) > 0,
        "the hot group is cached somewhere"
    );
    // Cache-aware routing keeps the hot group on one replica: 30 of 36 requests > 50%.
    assert_eq!(heat.hotspots.len(), 1, "{:?}", heat.hotspots);
    assert!(heat.hotspots[0].share > 0.5);
    let calm = control.routers().heat_map(HeatMapArgs { hotspot_share: 0.9 }).await?;
    assert!(calm.hotspots.is_empty(), "a higher threshold clears it");
    let bad = control.routers().heat_map(HeatMapArgs { hotspot_share: 0.0 }).await.unwrap_err();
    assert_eq!(bad.code, "bad_request");

    let log = control.routers().decisions(DecisionsArgs { limit: 10 }).await?;
    assert_eq!(log.decisions.len(), 10);
    assert!(log.decisions.windows(2).all(|w| w[0].ts_ms >= w[1].ts_ms), "newest first");
    let d = &log.decisions[0];
    assert_eq!(d.candidates.len(), 3, "{d:?}");
    assert_eq!(d.candidates.iter().filter(|c| c.chosen).count(), 1);
    assert!(sim.urls().contains(&d.replica), "the chosen replica is named by URL: {}", d.replica);
    assert!(d.candidates.iter().all(|c| sim.urls().contains(&c.replica)));
    assert!(!d.branch.is_empty() && !d.reason.is_empty());

    let headroom = control.routers().headroom(HeadroomArgs { window_s: 600 }).await?;
    assert_eq!(headroom.models.len(), 1, "{headroom:?}");
    let m = &headroom.models[0];
    assert_eq!(m.requests, 36);
    let bound = m.pooled_bound.context("a pooled bound")?;
    assert!(bound > 0.3, "30 requests share a prefix: {bound}");
    if let Some(achieved) = m.achieved {
        assert!(achieved <= bound + 1e-9, "achieved {achieved} > bound {bound}");
    }
    let best = m.best_policy_hit_rate.context("a what-if result")?;
    assert!(best <= bound + 1e-9 && best > 0.0, "best {best}, bound {bound}");

    // History of replica 0, and a marker when the router's policy changes.
    let history = eventually("replica 0's history", Duration::from_secs(30), || async {
        let h = control.fleet().replica_history(ReplicaHistoryArgs { id: 0, window_s: 300 }).await?;
        Ok((h.queue_depth.len() >= 2).then_some(h))
    })
    .await?;
    assert_eq!(history.url, sim.urls()[0]);
    assert_eq!(history.tier, "raw");
    let admin = reqwest::Client::new();
    let current: serde_json::Value =
        admin.get(format!("{}/admin/policy", router.url())).bearer_auth(TOKEN).send().await?.json().await?;
    let version = current["version"].as_u64().context("version")?;
    admin
        .put(format!("{}/admin/policy", router.url()))
        .bearer_auth(TOKEN)
        .header("if-match", format!("\"{version}\""))
        .header("content-type", "application/json")
        .body(r#"{"policy": "round_robin"}"#)
        .send()
        .await?
        .error_for_status()?;
    let marked = eventually("a policy-change marker", Duration::from_secs(30), || async {
        let h = control.fleet().replica_history(ReplicaHistoryArgs { id: 0, window_s: 300 }).await?;
        Ok(h.policy_changes.into_iter().find(|m| m.label.contains("round_robin")))
    })
    .await?;
    assert!(marked.label.contains(&format!("v{}", version + 1)), "{}", marked.label);
    let missing =
        control.fleet().replica_history(ReplicaHistoryArgs { id: 99, window_s: 300 }).await.unwrap_err();
    assert_eq!(missing.code, "not_found");
    Ok(())
}

#[tokio::test]
async fn settings_probe_at_once_persist_and_keep_tokens_in_0600_files() -> Result<()> {
    let sim = spawn_sim(1, Default::default()).await?;
    let garbage = garbage_metrics().await?;
    let router = spawn_router_with(RouterConfig {
        replicas: sim.urls().to_vec(),
        admin_token: Some(TOKEN.into()),
        ..Default::default()
    })
    .await?;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("history.sqlite");
    let stop = CancellationToken::new();
    let control = Control::start(ControlConfig::new(vec![], db.clone()), stop.clone()).await?;

    let add = |kind, url: String, token: Option<&str>| {
        let control = control.clone();
        let token = token.map(str::to_owned);
        async move { control.settings().add_endpoint(AddEndpointArgs { kind, url, token }).await }
    };
    let found = add(EndpointKind::Replica, sim.urls()[0].clone(), None).await?;
    assert_eq!(found.detected.as_deref(), Some("vllm"));
    assert_eq!(found.detail.as_deref(), Some(fleet_sim::DEFAULT_MODEL));
    let broken = add(EndpointKind::Replica, garbage.url(), None).await?;
    assert!(broken.error.as_deref().is_some_and(|e| e.contains("malformed")), "{broken:?}");
    let again = add(EndpointKind::Replica, sim.urls()[0].clone(), None).await.unwrap_err();
    assert_eq!(again.code, "bad_request");
    let typo = add(EndpointKind::Replica, "localhost:8000".into(), None).await.unwrap_err();
    assert!(typo.message.contains("http://"), "{}", typo.message);
    let no_token = add(EndpointKind::Router, router.url(), None).await.unwrap_err();
    assert!(no_token.message.contains("token"));
    let routed = add(EndpointKind::Router, router.url(), Some(TOKEN)).await?;
    assert_eq!(routed.detected.as_deref(), Some("fleet-router"), "{routed:?}");
    let wrong = add(EndpointKind::Router, router.url(), Some("wrong")).await?;
    assert!(wrong.error.as_deref().is_some_and(|e| e.contains("401")), "{wrong:?}");
    add(EndpointKind::Router, router.url(), Some(TOKEN)).await?;

    let token_file = dir.path().join("tokens").join(
        fleetdeck_control::settings::token_file_for(std::path::Path::new(""), &router.url())
            .file_name()
            .context("a file name")?,
    );
    assert_eq!(std::fs::read_to_string(&token_file)?, TOKEN);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&token_file)?.permissions().mode() & 0o777, 0o600);
    }
    // Neither the database nor the settings file holds the token.
    for entry in std::fs::read_dir(dir.path())? {
        let path = entry?.path();
        if path.is_file() {
            let bytes = std::fs::read(&path)?;
            assert!(
                !bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()),
                "token in {}",
                path.display()
            );
        }
    }

    let view = control.settings().view().await?;
    assert_eq!(view.replicas.len(), 2);
    assert_eq!(view.routers.len(), 1);
    assert_eq!(view.routers[0].token_file.as_deref(), Some(token_file.to_string_lossy().as_ref()));
    let bad = control.settings().set_scrape_interval(ScrapeIntervalArgs { seconds: 0.0 }).await.unwrap_err();
    assert!(bad.message.contains("pick"), "{}", bad.message);
    control.settings().set_scrape_interval(ScrapeIntervalArgs { seconds: 0.5 }).await?;
    control
        .settings()
        .remove_endpoint(RemoveEndpointArgs { kind: EndpointKind::Replica, url: garbage.url() })
        .await?;
    stop.cancel();

    // A restart keeps what was added (and still reads the router through its token file).
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let control = Control::start(ControlConfig::new(vec![], db), stop).await?;
    let view = control.settings().view().await?;
    assert_eq!(view.replicas.iter().map(|r| r.url.as_str()).collect::<Vec<_>>(), [sim.urls()[0].as_str()]);
    assert_eq!(view.scrape_interval_s, 0.5);
    eventually("the router to answer through its token file", Duration::from_secs(20), || async {
        let view = control.settings().view().await?;
        Ok((view.routers.len() == 1
            && view.routers[0].probe.error.is_none()
            && view.routers[0].probe.detected.is_some())
        .then_some(()))
    })
    .await?;

    // Removing the router removes its token: the file the app wrote is deleted with it.
    control
        .settings()
        .remove_endpoint(RemoveEndpointArgs { kind: EndpointKind::Router, url: router.url() })
        .await?;
    assert!(!token_file.exists(), "the removed router's token file {} is still there", token_file.display());
    assert!(control.settings().view().await?.routers.is_empty());
    Ok(())
}

/// Three routers whose approximate prefix trees learn only from their own traffic: two over replica 0, one
/// over replica 1. A prefix sent through all three is placed on different replicas, and the heat map's
/// placement view says so, naming each router's holder; a prefix only the first two routed agrees. The
/// group ids match across routers (the same prefix hashes alike everywhere), or nothing would compare.
#[tokio::test]
async fn the_heat_map_shows_which_routers_disagree_on_where_a_prefix_lives() -> Result<()> {
    let sim = spawn_sim(2, Default::default()).await?;
    let over = |replica: usize| {
        spawn_router_with(RouterConfig {
            replicas: vec![sim.urls()[replica].clone()],
            admin_token: Some(TOKEN.into()),
            policy: "policy: cache_aware_approx\n".parse().expect("a policy"),
            ..Default::default()
        })
    };
    let routers = [over(0).await?, over(0).await?, over(1).await?];
    let dir = tempfile::tempdir()?;
    let urls: Vec<String> = routers.iter().map(|r| r.url()).collect();
    let (control, _stop) = app_over(sim.urls().to_vec(), &urls, dir.path(), |_| {}).await?;

    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build()?;
    let everywhere = "Tenant nine's long system prompt, routed by every router. ".repeat(8);
    let two = "Tenant four's long system prompt, routed by two routers only. ".repeat(8);
    for i in 0..3 {
        for router in &routers {
            send(&client, &router.url(), &format!("{everywhere} q{i}")).await?;
        }
        for router in &routers[..2] {
            send(&client, &router.url(), &format!("{two} q{i}")).await?;
        }
    }
    let placement = eventually("both groups in the placement view", Duration::from_secs(30), || async {
        let heat = control.routers().heat_map(HeatMapArgs { hotspot_share: 0.9 }).await?;
        Ok((heat.prefix_placement.len() == 2).then_some(heat.prefix_placement))
    })
    .await?;
    let (split, shared) = (&placement[0], &placement[1]);
    assert!(split.disagree, "disagreements come first: {placement:?}");
    assert_eq!(split.routers.len(), 3, "{split:?}");
    assert_eq!(split.requests, 9);
    let holders: Vec<&[String]> = split.routers.iter().map(|r| r.holders.as_slice()).collect();
    assert_eq!(holders, [&sim.urls()[..1], &sim.urls()[..1], &sim.urls()[1..2]], "{split:?}");
    assert!(!shared.disagree, "{shared:?}");
    assert_eq!(shared.routers.len(), 2);
    assert!(shared.routers.iter().all(|r| r.holders == sim.urls()[..1]), "{shared:?}");
    Ok(())
}

/// A P/D fleet (one prefill and one decode fleet-sim replica, vLLM's flow) behind a P/D fleet-router: the
/// P/D view counts its decisions by reason, reads the 1:1 ratio and each role's figures, and divides a split
/// request's time to first token into the prefill leg, the engine-timed KV transfer and the first decode token.
#[tokio::test]
async fn the_pd_view_counts_decisions_by_reason_and_splits_ttft_into_its_legs() -> Result<()> {
    let fleet = fleet_test_support::admin_router::spawn_pd_fleet(TOKEN).await?;
    let (router, model) = (&fleet.router, fleet_sim::DEFAULT_MODEL);
    let dir = tempfile::tempdir()?;
    let fast_scrapes = |config: &mut ControlConfig| config.scrape_interval = Duration::from_millis(500);
    let (control, _stop) = app_over(fleet.replica_urls(), &[router.url()], dir.path(), fast_scrapes).await?;

    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build()?;
    let complete = |prompt: String| {
        let client = client.clone();
        let url = format!("{}/v1/completions", router.url());
        async move {
            let answer = client
                .post(url)
                .json(&json!({"model": model, "prompt": prompt, "max_tokens": 2}))
                .send()
                .await?
                .error_for_status()?;
            let branch = answer.headers().get("x-fleet-pd").and_then(|v| v.to_str().ok()).map(str::to_owned);
            anyhow::Ok(branch)
        }
    };
    // Two short prompts (under min_prompt_tokens, 256) stay local.
    for i in 0..2 {
        assert_eq!(complete(format!("short prompt {i}")).await?.as_deref(), Some("short_prompt"));
    }
    // Long unique prompts split; one more each round until the decode replica's transfer time is scraped
    // (the engines' figures are deltas between scrapes, so transfers before the first scrape do not show).
    let mut splits = 0;
    let view = eventually("a split request's TTFT by leg", Duration::from_secs(60), || {
        splits += 1;
        let prompt = format!("tenant {splits} has its own long system prompt here; ").repeat(64);
        let complete = &complete;
        let control = control.clone();
        async move {
            assert_eq!(complete(prompt).await?.as_deref(), Some("split"));
            let view = control.disagg().view(PdViewArgs { window_s: 120, bucket_s: 10 }).await?;
            // The router counts a split when it decides it and times the prefill leg when the leg ends: a
            // scrape between the two sees one split more than legs. Wait for a scrape that saw both.
            let splits_decided = view.reasons.iter().find(|r| r.reason == "split").map_or(0, |r| r.count);
            let ready = view.ttft.transfer_mean_ms.is_some()
                && view.reasons.iter().any(|r| r.reason == "short_prompt" && r.count == 2)
                && view.ttft.splits == splits_decided;
            Ok(ready.then_some(view))
        }
    })
    .await?;
    assert!(view.disaggregated);
    assert_eq!(view.ratio.as_deref(), Some("1:1"), "{view:?}");
    let count = |reason: &str| view.reasons.iter().find(|r| r.reason == reason).map_or(0, |r| r.count);
    assert!(count("split") >= 1 && count("split") <= splits, "{view:?}");
    assert_eq!(view.over_time.len(), 12);
    let bucketed: u64 = view.over_time.iter().flat_map(|b| b.counts.values()).sum();
    assert_eq!(bucketed, count("split") + count("short_prompt"), "every decision lands in one bucket");
    let t = &view.ttft;
    assert_eq!(t.splits, count("split"), "one prefill leg per split: {t:?}");
    let (leg, first_byte, transfer) = (
        t.prefill_leg_mean_ms.context("the prefill leg")?,
        t.decode_first_byte_mean_ms.context("the decode leg")?,
        t.transfer_mean_ms.context("the transfer")?,
    );
    assert!(leg > 0.0 && first_byte > 0.0 && transfer > 0.0, "{t:?}");
    assert!(t.prefill_leg_p95_ms.is_some_and(|p95| p95 >= leg * 0.5), "{t:?}");
    // The router times the decode side from arrival: the decode leg is what follows the prefill leg.
    assert!(first_byte >= leg, "the first byte comes after the prefill leg: {t:?}");
    assert_eq!(t.decode_leg_mean_ms, Some(first_byte - leg));
    assert_eq!(t.first_decode_token_mean_ms, Some((first_byte - leg - transfer).max(0.0)));
    let row = view.router_figures.first().context("the router's own row")?;
    assert_eq!((row.kind.as_str(), row.splits), ("fleet-router", count("split")), "{row:?}");
    let decode_role = view.roles.iter().find(|r| r.role == "decode").context("the decode role")?;
    assert_eq!((decode_role.replicas, decode_role.healthy), (1, 1));
    assert!(decode_role.kv_usage.is_some() && decode_role.transfer_ms.is_some(), "{decode_role:?}");
    assert_eq!(t.fallbacks, 0);
    Ok(())
}
