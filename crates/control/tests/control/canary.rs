//! The canary end to end through real fleet-router processes over fleet-sim replicas: a better policy is
//! promoted (and a router someone changed meanwhile is reported, not overwritten), and a canary whose
//! replicas fleet-sim makes fail is rolled back on its error rate.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use fleet_sim::Faults;
use fleet_sim::load::{LoadConfig, LoadStats};
use fleet_test_support::process::{ChildProcess, spawn_router_process};
use fleet_test_support::{SimFleet, eventually, spawn_sim};
use fleetdeck_api::{CanaryArgs, CanaryGuards, CanaryStatus, CheckSpecArgs, PushTarget};
use fleetdeck_control::{Control, ControlConfig, RouterTarget};
use serde_json::Value;
use tokio_util::sync::{CancellationToken, DropGuard};

const TOKEN: &str = "canary-e2e-token";

struct Fleet {
    control: Control,
    sim: SimFleet,
    /// `(process, url)` of each router.
    routers: Vec<(ChildProcess, String)>,
    _dir: tempfile::TempDir,
    _stop: DropGuard,
}

/// `2 * routers` replicas, two per fleet-router process, and the app watching them.
async fn fleet(routers: usize) -> Result<Fleet> {
    let sim = spawn_sim(2 * routers, Default::default()).await?;
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("router.token");
    fleet_store::secrets::write_token_file(&token_file, TOKEN)?;
    let mut handles = Vec::new();
    for r in 0..routers {
        let mut args = vec!["--listen".to_owned(), "127.0.0.1:0".to_owned()];
        for replica in &sim.urls()[2 * r..2 * r + 2] {
            args.extend(["--replica".to_owned(), replica.clone()]);
        }
        args.extend(["--admin-token-file".to_owned(), token_file.to_string_lossy().into_owned()]);
        args.extend(["--worker-threads".to_owned(), "1".to_owned()]);
        handles.push(spawn_router_process(&args).await?);
    }
    let mut config = ControlConfig::new(sim.urls().to_vec(), dir.path().join("history.db"));
    config.routers = handles
        .iter()
        .map(|(_, url)| RouterTarget {
            url: url.clone(),
            token: Some(TOKEN.into()),
            ..RouterTarget::default()
        })
        .collect();
    let stop = CancellationToken::new();
    let control = Control::start(config, stop.clone()).await?;
    Ok(Fleet { control, sim, routers: handles, _dir: dir, _stop: stop.drop_guard() })
}

fn admin(url: &str, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .request(method, format!("{url}{path}"))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(5))
}

async fn policy_of(url: &str) -> Result<(u64, String)> {
    let body: Value =
        admin(url, reqwest::Method::GET, "/admin/policy").send().await?.error_for_status()?.json().await?;
    Ok((
        body["version"].as_u64().context("no version")?,
        body["spec"]["policy"].as_str().unwrap_or_default().to_owned(),
    ))
}

/// Steady prefix-sharing traffic (streamed, with usage, so cached tokens are reported) through `url`.
fn traffic(url: &str, seed: u64) -> DropGuard {
    let stop = CancellationToken::new();
    let config = LoadConfig {
        target: url.to_owned(),
        rps: 15.0,
        tenants: 3,
        system_prompt_bytes: 2000,
        max_tokens: 4,
        seed,
        ..Default::default()
    };
    tokio::spawn(fleet_sim::load::run(
        config,
        reqwest::Client::new(),
        Arc::new(LoadStats::default()),
        stop.clone(),
    ));
    stop.drop_guard()
}

async fn finished(control: &Control, within: Duration) -> Result<CanaryStatus> {
    eventually("the canary to finish", within, || {
        let control = control.clone();
        async move { Ok(control.canary().status().await?.canary.filter(|c| c.finished)) }
    })
    .await
}

/// The versions the operator reviewed for `text`, from the editor's diff.
async fn reviewed(control: &Control, text: &str) -> Result<Vec<PushTarget>> {
    let check = control.rollout().check_spec(CheckSpecArgs { text: text.into() }).await?;
    Ok(check.diffs.iter().map(|d| PushTarget { url: d.url.clone(), if_version: d.version }).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_better_policy_is_promoted_through_router_processes_and_a_router_that_moved_is_left_alone()
-> Result<()> {
    let f = fleet(3).await?;
    let urls: Vec<String> = f.routers.iter().map(|(_, url)| url.clone()).collect();
    let _loads: Vec<DropGuard> = urls.iter().enumerate().map(|(i, url)| traffic(url, i as u64 + 1)).collect();
    let text = "policy: cache_aware_approx";
    let reviewed = reviewed(&f.control, text).await?;
    assert_eq!(reviewed.len(), 3);
    assert!(reviewed.iter().all(|r| r.if_version.is_some()), "{reviewed:?}");

    f.control
        .canary()
        .start(CanaryArgs {
            text: text.into(),
            canary: vec![urls[0].clone()],
            baseline: vec![urls[1].clone(), urls[2].clone()],
            observe_s: 6,
            guards: CanaryGuards { min_requests: Some(20), ..CanaryGuards::default() },
            check_every_ms: Some(500),
            operator: Some("ana".into()),
            reviewed,
        })
        .await?;
    let control = f.control.clone();
    eventually("the canary to be observed", Duration::from_secs(30), || {
        let control = control.clone();
        async move { Ok(control.canary().status().await?.canary.filter(|c| c.phase == "observing")) }
    })
    .await?;
    // Someone changes router c after the operator reviewed it.
    let (c_version, _) = policy_of(&urls[2]).await?;
    let changed = admin(&urls[2], reqwest::Method::PUT, "/admin/policy")
        .header("If-Match", format!("\"{c_version}\""))
        .body("policy: least_load\n")
        .send()
        .await?;
    assert!(changed.status().is_success(), "{}", changed.status());

    let done = finished(&f.control, Duration::from_secs(120)).await?;
    assert_eq!(done.phase, "promoted", "{done:?}");
    assert_eq!(done.verdict.as_deref(), Some("holding"), "{done:?}");
    let states: Vec<(&str, &str)> =
        done.readings.iter().map(|r| (r.guard.as_str(), r.state.as_str())).collect();
    assert_eq!(states, [("error_rate", "ok"), ("ttft_p95", "ok"), ("hit_rate", "ok")], "{done:?}");
    assert!(done.canary_side.requests >= 20 && done.baseline_side.requests >= 20, "{done:?}");
    assert!(done.canary_side.hit_rate.is_some() && done.baseline_side.hit_rate.is_some(), "{done:?}");
    assert_eq!((done.canary_side.errors, done.baseline_side.errors), (0, 0), "{done:?}");
    // The canary and the untouched baseline router run the candidate; router c keeps the other change.
    assert_eq!(policy_of(&urls[0]).await?.1, "cache_aware_approx");
    assert_eq!(policy_of(&urls[1]).await?.1, "cache_aware_approx");
    assert_eq!(
        policy_of(&urls[2]).await?.1,
        "least_load",
        "a router that moved meanwhile is not overwritten"
    );
    assert_eq!(done.moved.len(), 1, "{:?}", done.moved);
    let moved = &done.moved[0];
    assert_eq!((moved.url.as_str(), moved.step.as_str()), (urls[2].as_str(), "promotion"));
    assert_eq!((moved.expected_version, moved.current_version), (Some(c_version), Some(c_version + 1)));
    assert!(moved.message.contains("moved meanwhile"), "{}", moved.message);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_injected_by_fleet_sim_roll_the_canary_back_on_its_error_rate() -> Result<()> {
    let f = fleet(2).await?;
    let urls: Vec<String> = f.routers.iter().map(|(_, url)| url.clone()).collect();
    let (before, before_policy) = policy_of(&urls[0]).await?;
    let _loads: Vec<DropGuard> = urls.iter().enumerate().map(|(i, url)| traffic(url, i as u64 + 7)).collect();
    let text = "policy: least_load";
    f.control
        .canary()
        .start(CanaryArgs {
            text: text.into(),
            canary: vec![urls[0].clone()],
            baseline: vec![urls[1].clone()],
            observe_s: 600,
            // TTFT and hit rate cannot trip: only the error guard can roll this canary back.
            guards: CanaryGuards {
                min_requests: Some(20),
                max_ttft_p95_ratio: Some(100.0),
                min_ttft_p95_increase_ms: Some(60_000.0),
                max_hit_rate_drop: Some(1.0),
                ..CanaryGuards::default()
            },
            check_every_ms: Some(500),
            operator: Some("ana".into()),
            reviewed: reviewed(&f.control, text).await?,
        })
        .await?;
    let control = f.control.clone();
    let observing = eventually("the canary to hold with traffic", Duration::from_secs(60), || {
        let control = control.clone();
        async move {
            let c = control.canary().status().await?.canary;
            Ok(c.filter(|c| c.phase == "observing" && c.verdict.as_deref() == Some("holding")))
        }
    })
    .await?;
    assert_eq!(observing.canary_side.errors, 0, "{observing:?}");
    assert_eq!(policy_of(&urls[0]).await?, (before + 1, "least_load".to_owned()));

    // The canary's replicas fail: 500s before the first byte (the router retries, then answers 502) and
    // streams cut off mid-way.
    for replica in 0..2 {
        f.sim.fleet.set_faults(
            replica,
            Faults { error_rate: 0.7, drop_mid_stream_rate: 0.3, ..Faults::default() },
        )?;
    }
    let done = finished(&f.control, Duration::from_secs(120)).await?;
    assert_eq!(done.phase, "rolled_back", "{done:?}");
    let reason = done.reason.clone().unwrap_or_default();
    assert!(reason.contains("error rate"), "{reason}");
    assert_eq!(done.verdict.as_deref(), Some("crossed"));
    let error_guard = done.readings.iter().find(|r| r.guard == "error_rate").context("no error reading")?;
    assert_eq!(error_guard.state, "crossed", "{done:?}");
    assert!(done.canary_side.errors > 0 && done.baseline_side.errors == 0, "{done:?}");
    // The router's trace keeps each failure with its status and kind.
    let trace = admin(&urls[0], reqwest::Method::GET, "/admin/trace").send().await?.text().await?;
    assert!(trace.contains("\"error\":\"no_replica\""), "no recorded 502 in the trace");
    assert!(trace.contains("\"status\":502"));
    assert!(trace.contains("\"first_byte_ms\""));
    // The canary router runs its previous policy again; the baseline never changed.
    let (after, after_policy) = policy_of(&urls[0]).await?;
    assert!(after > before + 1 && after_policy == before_policy, "{after} {after_policy}");
    assert_eq!(policy_of(&urls[1]).await?.1, before_policy);
    assert!(done.moved.is_empty(), "{:?}", done.moved);
    Ok(())
}

/// The P/D thresholds are part of the policy document, so a canary of new thresholds pushes the prefill
/// and decode parts as one change and an abort rolls them back together, whatever else the document says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_of_pd_thresholds_pushes_and_rolls_back_them_as_one_change() -> Result<()> {
    let f = fleet(2).await?;
    let urls: Vec<String> = f.routers.iter().map(|(_, url)| url.clone()).collect();
    let spec_of = |url: String| async move {
        let body: Value = admin(&url, reqwest::Method::GET, "/admin/policy")
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        anyhow::Ok(body["spec"].clone())
    };
    let (version, _) = policy_of(&urls[0]).await?;
    let before = "policy: cache_aware_approx\npd:\n  min_prompt_tokens: 300\n";
    let put = admin(&urls[0], reqwest::Method::PUT, "/admin/policy")
        .header("If-Match", format!("\"{version}\""))
        .body(before)
        .send()
        .await?;
    assert!(put.status().is_success(), "{}", put.status());
    let original = spec_of(urls[0].clone()).await?;

    let text = "policy: cache_aware_approx\nparams:\n  cache_threshold: 0.3\n\
                pd:\n  min_prompt_tokens: 1024\n  min_uncached_tokens: 128\n  max_prefill_queue: 4\n";
    f.control
        .canary()
        .start(CanaryArgs {
            text: text.into(),
            canary: vec![urls[0].clone()],
            baseline: vec![urls[1].clone()],
            observe_s: 600,
            guards: CanaryGuards::default(),
            check_every_ms: Some(500),
            operator: Some("ana".into()),
            reviewed: reviewed(&f.control, text).await?,
        })
        .await?;
    let pushed = eventually("the canary router to run the new thresholds", Duration::from_secs(30), || {
        let url = urls[0].clone();
        async move {
            let spec = spec_of(url).await?;
            Ok((spec["pd"]["min_prompt_tokens"] == 1024).then_some(spec))
        }
    })
    .await?;
    assert_eq!(pushed["pd"]["min_uncached_tokens"], 128, "{pushed}");
    assert_eq!(pushed["pd"]["max_prefill_queue"], 4, "{pushed}");
    assert_eq!(pushed["params"]["cache_threshold"], 0.3, "{pushed}");

    f.control.canary().abort(fleetdeck_api::AbortCanaryArgs { reason: "the test aborts".into() }).await?;
    let done = finished(&f.control, Duration::from_secs(60)).await?;
    assert_eq!(done.phase, "rolled_back", "{done:?}");
    assert_eq!(spec_of(urls[0].clone()).await?, original, "every part of the document is back");
    Ok(())
}
