//! Changing the fleet safely: validation before anything is sent, push with compare-and-swap
//! (a stale version is refused and reported as such), drift, the audit trail, what-if replay of
//! recorded traffic, and a canary that rolls itself back when fleet-sim makes it slower.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use fleet_sim::Faults;
use fleet_sim::load::{LoadConfig, LoadStats};
use fleet_test_support::admin_router::{spawn_admin_router, spawn_router_with};
use fleet_test_support::{RouterHandle, SimFleet, eventually, spawn_sim};
use fleetdeck_api::{
    CanaryArgs, CanaryGuards, CheckSpecArgs, DriftBadge, PushArgs, PushResult, PushTarget, WhatIfArgs,
    WhatIfJobArgs,
};
use fleetdeck_control::routers::admin::AdminClient;
use fleetdeck_control::{Control, ControlConfig, RouterTarget};
use serde_json::Value;
use tokio_util::sync::{CancellationToken, DropGuard};

const TOKEN: &str = "rollout-test-token";

struct Setup {
    control: Control,
    sim: SimFleet,
    routers: Vec<RouterHandle>,
    _dir: tempfile::TempDir,
    _stop: DropGuard,
}

/// `replicas` emulated replicas split evenly over `routers` admin-enabled routers, and the app
/// watching them all.
async fn setup(replicas: usize, routers: usize) -> Result<Setup> {
    let sim = spawn_sim(replicas, Default::default()).await?;
    let per = replicas / routers;
    let mut handles = Vec::new();
    for r in 0..routers {
        handles.push(spawn_admin_router(&sim.urls()[r * per..(r + 1) * per], TOKEN).await?);
    }
    let dir = tempfile::tempdir()?;
    let mut config = ControlConfig::new(sim.urls().to_vec(), dir.path().join("history.db"));
    config.routers = handles
        .iter()
        .map(|h| RouterTarget {
            url: h.url(),
            token: Some(TOKEN.into()),
            token_file: None,
            metrics_url: None,
        })
        .collect();
    let stop = CancellationToken::new();
    let control = Control::start(config, stop.clone()).await?;
    Ok(Setup { control, sim, routers: handles, _dir: dir, _stop: stop.drop_guard() })
}

/// The router's policy as its admin API reports it: `(version, spec)`.
async fn router_policy(router: &RouterHandle) -> Result<(u64, Value)> {
    let body: Value = reqwest::Client::new()
        .get(format!("{}/admin/policy", router.url()))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(5))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok((body["version"].as_u64().context("no version")?, body["spec"].clone()))
}

/// Steady traffic through `router` until the guard drops.
pub(crate) fn traffic(router: &RouterHandle, rps: f64, seed: u64) -> DropGuard {
    let stop = CancellationToken::new();
    let config = LoadConfig {
        target: router.url(),
        rps,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_push_is_refused_and_an_invalid_spec_never_reaches_a_router() -> Result<()> {
    let s = setup(2, 2).await?;
    let (a, b) = (s.routers[0].url(), s.routers[1].url());
    let (v_a, _) = router_policy(&s.routers[0]).await?;

    // The operator sees the diff against the version each router runs.
    let text = "policy: consistent_hash\nparams:\n  load_factor: 1.5\n";
    let check = s.control.rollout().check_spec(CheckSpecArgs { text: text.into() }).await?;
    assert!(check.valid, "{:?}", check.problem);
    let diff_a = check.diffs.iter().find(|d| d.url == a).context("no diff for router a")?;
    assert_eq!(diff_a.version, Some(v_a));
    assert_eq!(diff_a.policy_change, Some(("round_robin".into(), "consistent_hash".into())));

    // Someone else changes router a after the operator looked.
    let other = s
        .control
        .rollout()
        .push_policy(PushArgs {
            text: "policy: least_load".into(),
            targets: vec![PushTarget { url: a.clone(), if_version: None }],
            operator: Some("someone-else".into()),
        })
        .await?;
    assert!(matches!(other.results[0].result, PushResult::Applied { .. }), "{other:?}");

    // The operator's confirmed push still names the version they saw: a is refused as stale, b applies.
    let push = s
        .control
        .rollout()
        .push_policy(PushArgs {
            text: text.into(),
            targets: vec![
                PushTarget { url: a.clone(), if_version: diff_a.version },
                PushTarget { url: b.clone(), if_version: None },
            ],
            operator: Some("ana".into()),
        })
        .await?;
    assert_eq!(push.author, "ana");
    let result = |url: &str| push.results.iter().find(|r| r.url == url).map(|r| r.result.clone());
    match result(&a) {
        Some(PushResult::Refused { status: 409, code, message }) => {
            assert_eq!(code, "version_conflict");
            let reviewed = diff_a.version.expect("a runs a version");
            assert!(message.starts_with("moved meanwhile"), "{message}");
            assert!(message.contains(&format!("you reviewed version {reviewed}")), "{message}");
        }
        other => bail!("router a should refuse a stale push, got {other:?}"),
    }
    let Some(PushResult::Applied { version: v_b }) = result(&b) else { bail!("router b: {:?}", result(&b)) };
    let (now_b, spec_b) = router_policy(&s.routers[1]).await?;
    assert_eq!((now_b, spec_b["policy"].as_str()), (v_b, Some("consistent_hash")));
    let (now_a, spec_a) = router_policy(&s.routers[0]).await?;
    assert_eq!(spec_a["policy"], "least_load", "the stale push must not have changed router a");

    // Drift: b runs the intended spec, a does not.
    let editor = s.control.rollout().policy_editor().await?;
    let badge = |url: &str| editor.routers.iter().find(|r| r.url == url).map(|r| r.drift.clone());
    assert_eq!(badge(&b), Some(DriftBadge::InSync { version: v_b }));
    assert!(
        matches!(badge(&a), Some(DriftBadge::Drifted { version, .. }) if version == now_a),
        "{:?}",
        badge(&a)
    );

    // An invalid spec is refused by the app, naming the field; no router version moves.
    let err = s
        .control
        .rollout()
        .push_policy(PushArgs {
            text: "policy: consistent_hash\nparams: {load_factor: 0.2}\n".into(),
            targets: vec![
                PushTarget { url: a.clone(), if_version: None },
                PushTarget { url: b.clone(), if_version: None },
            ],
            operator: None,
        })
        .await
        .expect_err("an invalid spec must be refused");
    assert_eq!(err.code, "invalid_spec");
    assert!(err.message.contains("params.load_factor"), "{}", err.message);
    assert_eq!(router_policy(&s.routers[0]).await?.0, now_a);
    assert_eq!(router_policy(&s.routers[1]).await?.0, now_b);

    // The audit trail has both versions, who pushed them and every outcome.
    let history = s.control.audit().policy_history().await?;
    assert_eq!(history.versions.len(), 2, "{history:?}");
    let ana = history.versions.iter().find(|v| v.author == "ana").context("ana's version")?;
    assert!(ana.spec.contains("consistent_hash"));
    assert!(
        ana.pushes.iter().any(|p| p.starts_with(&a) && p.contains("version_conflict")),
        "{:?}",
        ana.pushes
    );
    assert!(ana.pushes.iter().any(|p| p.starts_with(&b) && p.ends_with("applied")), "{:?}", ana.pushes);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_if_replays_recorded_traffic_under_both_policies() -> Result<()> {
    let s = setup(2, 1).await?;
    let _load = traffic(&s.routers[0], 40.0, 3);
    let control = s.control.clone();
    eventually("recorded traffic", Duration::from_secs(30), || {
        let router = s.routers[0].url();
        async move {
            let body = reqwest::Client::new()
                .get(format!("{router}/admin/trace?since=0"))
                .bearer_auth(TOKEN)
                .send()
                .await?
                .text()
                .await?;
            Ok((body.lines().count() >= 40).then_some(()))
        }
    })
    .await?;
    let started = control
        .whatif()
        .start(WhatIfArgs {
            text: "policy: consistent_hash".into(),
            window_s: 600,
            trace_path: None,
            replicas: Some(2),
            profile: None,
            kv_blocks: None,
            prefill_replicas: None,
        })
        .await?;
    let done = eventually("the what-if result", Duration::from_secs(60), || {
        let control = control.clone();
        async move {
            let status = control.whatif().status(WhatIfJobArgs { job: started.job }).await?;
            if status.state == "failed" {
                bail!("what-if failed: {:?}", status.message);
            }
            Ok((status.state == "done").then_some(status))
        }
    })
    .await?;
    let result = done.result.context("a finished what-if has a result")?;
    assert_eq!(result.candidate.policy, "consistent_hash");
    assert_eq!(result.active.policy, "round_robin");
    assert_eq!(result.candidate.requests, result.active.requests);
    assert!(result.requests >= 40);
    assert_eq!(result.candidate.per_replica_requests.len(), 2);
    assert!(result.candidate.ttft_p95_s.is_some() && result.active.hit_rate.is_some());

    // A new run replaces the previous one; cancelling an ended run is harmless.
    let cancelled = control.whatif().cancel(WhatIfJobArgs { job: started.job }).await?;
    assert_eq!(cancelled.state, "done");
    let bad = control
        .whatif()
        .start(WhatIfArgs {
            text: "policy: nope".into(),
            window_s: 600,
            trace_path: None,
            replicas: None,
            profile: None,
            kv_blocks: None,
            prefill_replicas: None,
        })
        .await
        .expect_err("invalid candidate");
    assert_eq!(bad.code, "invalid_spec");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_made_slower_by_fault_injection_rolls_back_by_itself() -> Result<()> {
    let s = setup(4, 2).await?;
    let (canary, baseline) = (s.routers[0].url(), s.routers[1].url());
    let (before, before_spec) = router_policy(&s.routers[0]).await?;
    let _load_a = traffic(&s.routers[0], 25.0, 1);
    let _load_b = traffic(&s.routers[1], 25.0, 2);

    let status = s
        .control
        .canary()
        .start(CanaryArgs {
            text: "policy: least_load".into(),
            canary: vec![canary.clone()],
            baseline: vec![baseline.clone()],
            observe_s: 120,
            guards: CanaryGuards {
                max_ttft_p95_ratio: Some(1.5),
                min_ttft_p95_increase_ms: Some(100.0),
                max_hit_rate_drop: Some(1.0),
                min_requests: Some(15),
                ..CanaryGuards::default()
            },
            check_every_ms: Some(500),
            operator: Some("ana".into()),
            reviewed: Vec::new(),
        })
        .await?;
    assert_eq!(status.phase, "canary_pushing");

    let control = s.control.clone();
    eventually("the canary to be observed", Duration::from_secs(20), || {
        let control = control.clone();
        async move { Ok(control.canary().status().await?.canary.filter(|c| c.phase == "observing")) }
    })
    .await?;
    let (during, spec) = router_policy(&s.routers[0]).await?;
    assert_eq!((during, spec["policy"].as_str()), (before + 1, Some("least_load")));
    assert_eq!(
        router_policy(&s.routers[1]).await?.1["policy"],
        "round_robin",
        "the baseline keeps its policy"
    );

    // The canary's own replicas get slow first tokens.
    for index in 0..2 {
        s.sim.fleet.set_faults(index, Faults { stall_ms: 400, ..Default::default() })?;
    }
    let finished = eventually("the canary to roll itself back", Duration::from_secs(90), || {
        let control = control.clone();
        async move { Ok(control.canary().status().await?.canary.filter(|c| c.finished)) }
    })
    .await?;
    assert_eq!(finished.phase, "rolled_back", "{finished:?}");
    let reason = finished.reason.clone().unwrap_or_default();
    assert!(reason.contains("TTFT"), "{reason}");
    assert!(finished.canary_side.ttft_p95_s > finished.baseline_side.ttft_p95_s, "{finished:?}");
    let phases: Vec<&str> = finished.steps.iter().map(|s| s.phase.as_str()).collect();
    assert!(phases.contains(&"observing") && phases.contains(&"rolling_back"), "{phases:?}");

    // The canary router runs its previous spec again, as a new version; the baseline never changed.
    let (after, after_spec) = router_policy(&s.routers[0]).await?;
    assert!(after > during);
    assert_eq!(after_spec, before_spec);
    assert_eq!(router_policy(&s.routers[1]).await?.1["policy"], "round_robin");

    // Every step reached the audit trail: the canary version, its rollback, who did it.
    let history = s.control.audit().policy_history().await?;
    let labels: Vec<&str> = history.versions.iter().map(|v| v.label.as_str()).collect();
    assert!(labels.iter().any(|l| l.starts_with("canary-least_load@")), "{labels:?}");
    assert!(labels.iter().any(|l| l.starts_with("rollback-of-canary-least_load@")), "{labels:?}");
    assert!(history.versions.iter().all(|v| v.author == "ana"));
    let canary_version =
        history.versions.iter().find(|v| v.label.starts_with("canary-")).context("canary")?;
    assert!(canary_version.active_from_ms.is_some() && canary_version.active_to_ms.is_some());
    Ok(())
}

#[tokio::test]
async fn a_router_trace_is_read_page_by_page_and_records_the_ring_dropped_are_reported() -> Result<()> {
    let sim = spawn_sim(1, Default::default()).await?;
    let router = spawn_router_with(fleet_router::RouterConfig {
        replicas: sim.urls().to_vec(),
        admin_token: Some(TOKEN.into()),
        record: fleet_router::RecordConfig { ring_capacity: 3, ..Default::default() },
        ..Default::default()
    })
    .await?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let admin = AdminClient::new(http.clone(), &router.url(), Some(TOKEN.into()));
    let send = |n: usize| {
        let (http, url) = (http.clone(), format!("{}/v1/completions", router.url()));
        async move {
            for i in 0..n {
                let prompt = format!("request {i}");
                let body = serde_json::json!({"prompt": prompt, "max_tokens": 1});
                http.post(&url).json(&body).send().await?.error_for_status()?.bytes().await?;
            }
            anyhow::Ok(())
        }
    };
    send(2).await?;
    let first = eventually("two recorded requests", Duration::from_secs(10), || async {
        let page = admin.trace_after(0, 0).await?;
        Ok((page.records.len() == 2).then_some(page))
    })
    .await?;
    assert_eq!((first.next, first.missed), (Some(2), 0));
    assert!(first.epoch.is_some(), "the router names its epoch");
    // Five more through a ring of three: two of them are gone before the next read.
    send(5).await?;
    let second = eventually("seven recorded requests", Duration::from_secs(10), || async {
        let page = admin.trace_after(0, 2).await?;
        Ok((page.next == Some(7)).then_some(page))
    })
    .await?;
    assert_eq!((second.records.len(), second.missed, second.epoch), (3, 2, first.epoch));
    Ok(())
}
