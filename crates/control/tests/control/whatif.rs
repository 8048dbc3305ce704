//! What-if provenance against real routers: the baseline is what each router runs (read from it, the
//! odd one flagged), every page of the window is read (or the sample is said to be one), an unreachable
//! router is reported while the others are replayed, and the engine profile comes from the replicas'
//! metrics unless the operator overrides it.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use fleet_router::RouterConfig;
use fleet_test_support::admin_router::{spawn_admin_router, spawn_router_with};
use fleet_test_support::{eventually, spawn_sim};
use fleetdeck_api::{WhatIfArgs, WhatIfJobArgs, WhatIfResult};
use fleetdeck_control::routers::admin::AdminClient;
use fleetdeck_control::{Control, ControlConfig, RouterTarget};
use tokio_util::sync::CancellationToken;

use crate::rollout::traffic;

const TOKEN: &str = "whatif-test-token";

async fn recorded(router: &str, at_least: usize) -> Result<()> {
    let router = router.to_owned();
    eventually("recorded traffic", Duration::from_secs(40), || {
        let router = router.clone();
        async move {
            let body = reqwest::Client::new()
                .get(format!("{router}/admin/trace?since=0&limit=50000"))
                .bearer_auth(TOKEN)
                .timeout(Duration::from_secs(5))
                .send()
                .await?
                .text()
                .await?;
            Ok((body.lines().count() >= at_least).then_some(()))
        }
    })
    .await
}

async fn run(control: &Control, args: WhatIfArgs) -> Result<WhatIfResult> {
    let started = control.whatif().start(args).await?;
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
    done.result.context("a finished what-if has a result")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_baseline_is_what_each_router_runs_and_an_unreachable_router_is_reported() -> Result<()> {
    let sim = spawn_sim(4, Default::default()).await?;
    let main = spawn_admin_router(&sim.urls()[..2], TOKEN).await?;
    let odd = spawn_router_with(RouterConfig {
        replicas: sim.urls()[2..].to_vec(),
        admin_token: Some(TOKEN.into()),
        policy: "policy: least_load".parse()?,
        // It reads the replicas' load less often than the busier router, which sets the replay's interval.
        engine_metrics: fleet_router::EngineMetricsConfig {
            interval: Duration::from_millis(1000),
            ..Default::default()
        },
        ..Default::default()
    })
    .await?;
    // A router that is not there: a port bound and closed again.
    let gone = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("http://{}", listener.local_addr()?)
    };
    let dir = tempfile::tempdir()?;
    let mut config = ControlConfig::new(sim.urls().to_vec(), dir.path().join("history.db"));
    config.routers = [main.url(), odd.url(), gone.clone()]
        .into_iter()
        .map(|url| RouterTarget { url, token: Some(TOKEN.into()), ..RouterTarget::default() })
        .collect();
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let control = Control::start(config, stop).await?;

    let _busy = traffic(&main, 30.0, 5);
    let _quiet = traffic(&odd, 5.0, 6);
    recorded(&main.url(), 40).await?;
    recorded(&odd.url(), 5).await?;

    let args = |profile: Option<&str>, kv_blocks: Option<u32>| WhatIfArgs {
        text: "policy: consistent_hash".into(),
        window_s: 600,
        trace_path: None,
        replicas: None,
        profile: profile.map(str::to_owned),
        kv_blocks,
        prefill_replicas: None,
    };
    let result = run(&control, args(None, None)).await?;
    // The busier router runs round_robin: that is the baseline, whatever the app last meant to push.
    assert_eq!(result.active.policy, "round_robin");
    // The time a request spends outside the engine model is measured from the recorded first tokens.
    let overhead = result.ttft_overhead_ms.context("the recording has first tokens under round_robin")?;
    assert!((0.0..1000.0).contains(&overhead), "{overhead}");
    let row = |url: &str| result.routers.iter().find(|r| r.url == url).cloned().context("router row");
    let (main_row, odd_row, gone_row) = (row(&main.url())?, row(&odd.url())?, row(&gone)?);
    assert_eq!((main_row.policy.as_deref(), main_row.differs), (Some("round_robin"), false));
    assert_eq!((odd_row.policy.as_deref(), odd_row.differs), (Some("least_load"), true));
    assert!(gone_row.error.is_some() && gone_row.requests == 0, "{gone_row:?}");
    let notes = result.baseline_notes.join("\n");
    assert!(notes.contains(&odd.url()) && notes.contains("least_load"), "{notes}");
    assert!(notes.contains(&gone) && notes.contains("not in the replay"), "{notes}");
    // Both answering routers' traffic was replayed; the total is unknown since one router was not read.
    assert_eq!(result.coverage.requests_read, main_row.requests + odd_row.requests);
    assert_eq!(result.requests, result.coverage.requests_read);
    assert_eq!(result.coverage.requests_in_window, None);
    assert!(result.coverage.summary.contains("missing"), "{}", result.coverage.summary);
    // The replicas' own metrics chose the profile: their model, their KV capacity.
    let reported = fleet_sim::ModelConfig::default().engine.num_gpu_blocks;
    assert_eq!(result.profile.name, "llama-3.1-8b-h100");
    assert_eq!((result.profile.kv_blocks, result.profile.block_tokens), (reported, 16));
    assert_eq!(result.profile.engine.as_deref(), Some("vllm"));
    assert!(!result.profile.overridden && result.profile.reason.contains("cache_config_info"));
    assert_eq!(result.replicas, 4);
    // The routers are replayed as deployed: the two that recorded traffic, each request through its own,
    // reading the replicas' load as often as the router of most traffic does (fleet-router's default).
    let model = &result.router_model;
    assert_eq!((model.routers, model.engine_metrics_ms), (2, Some(250)), "{model:?}");
    assert!(model.summary.starts_with("2 routers"), "{}", model.summary);
    // Each side's spread: the main replay and seven with other draws, metrics phases and arrival times, the main
    // figures inside the range.
    for side in [&result.candidate, &result.active] {
        let spread = side.spread.as_ref().context("a short window is replayed eight times")?;
        let (hit, p95) = (side.hit_rate.context("hit rate")?, side.ttft_p95_s.context("p95")?);
        assert_eq!(spread.replays, 8);
        assert!((spread.hit_rate_min..=spread.hit_rate_max).contains(&hit), "{spread:?} {hit}");
        assert!((spread.ttft_p95_min_s..=spread.ttft_p95_max_s).contains(&p95), "{spread:?} {p95}");
    }
    assert!(
        notes.contains("every 1000 ms, every 250 ms") || notes.contains("every 250 ms, every 1000 ms"),
        "{notes}"
    );

    // The operator's override wins and is said to.
    let result = run(&control, args(Some("llama-3.1-8b-a100"), Some(300))).await?;
    assert_eq!((result.profile.name.as_str(), result.profile.kv_blocks), ("llama-3.1-8b-a100", 300));
    assert!(result.profile.overridden);
    let refused =
        control.whatif().start(args(Some("no-such-profile"), None)).await.expect_err("unknown profile");
    assert!(refused.code == "bad_request" && refused.message.contains("llama-3.1-8b-h100"), "{refused:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_of_a_routers_window_is_read_up_to_the_limit() -> Result<()> {
    let sim = spawn_sim(2, Default::default()).await?;
    let router = spawn_admin_router(sim.urls(), TOKEN).await?;
    let _load = traffic(&router, 40.0, 9);
    recorded(&router.url(), 30).await?;
    let client = AdminClient::new(reqwest::Client::new(), &router.url(), Some(TOKEN.into()));
    let _stop_load = _load;
    // Everything in one big page, then the same window page by page.
    let whole = client.trace_page(0, 0, 50_000).await?;
    let total = whole.records.len();
    assert!(total >= 30 && whole.more == 0);
    let cutoff = whole.next.context("the router numbers its records")?;
    // Only what was recorded up to the big page counts: the load keeps adding records.
    let paged = client.trace_window_paged(0, 100_000, 7).await?;
    let mut arrivals: Vec<u64> = paged.records.iter().map(|r| r.timestamp).collect();
    arrivals.truncate(total);
    let expected: Vec<u64> = whole.records.iter().map(|r| r.timestamp).collect();
    assert_eq!(arrivals, expected, "pages must read the records in order, none lost or repeated");
    assert!(paged.pages as usize >= total.div_ceil(7), "{} pages for {total} records", paged.pages);
    assert_eq!(paged.unread, 0);
    assert!(cutoff > 0);
    // A read that stops at its limit says how much it left.
    let sample = client.trace_window_paged(0, 10, 4).await?;
    assert_eq!(sample.records.len(), 10);
    assert!(sample.unread as usize >= total - 10, "{} unread of {total}", sample.unread);
    Ok(())
}

/// A P/D fleet's recorded traffic replayed with both pools: the routers' roles set the P:D split, the
/// candidate's `pd:` thresholds change what is split, and another split of the same replicas is replayed
/// on request (a split that leaves nothing to decode is refused with the fix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pd_fleet_is_replayed_with_its_prefill_pool_under_other_thresholds_and_splits() -> Result<()> {
    let fleet = fleet_test_support::admin_router::spawn_pd_fleet(TOKEN).await?;
    let (router, model) = (&fleet.router, fleet_sim::DEFAULT_MODEL);
    let dir = tempfile::tempdir()?;
    let mut config = ControlConfig::new(fleet.replica_urls(), dir.path().join("history.db"));
    config.routers =
        vec![RouterTarget { url: router.url(), token: Some(TOKEN.into()), ..RouterTarget::default() }];
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let control = Control::start(config, stop).await?;
    eventually("the router's roles", Duration::from_secs(20), || async {
        let view = control.disagg().view(Default::default()).await?;
        Ok(view.disaggregated.then_some(()))
    })
    .await?;

    // Long prompts of their own (split live) and short ones (local).
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build()?;
    for i in 0..12 {
        let prompt = if i % 3 == 0 {
            format!("short question {i}")
        } else {
            format!("tenant {i} sends a long document of its own to summarise; ").repeat(48)
        };
        client
            .post(format!("{}/v1/completions", router.url()))
            .json(&serde_json::json!({"model": model, "prompt": prompt, "max_tokens": 4}))
            .send()
            .await?
            .error_for_status()?;
    }
    recorded(&router.url(), 12).await?;

    let args = |text: &str, prefill_replicas: Option<u32>| WhatIfArgs {
        text: text.into(),
        window_s: 600,
        trace_path: None,
        replicas: None,
        profile: None,
        kv_blocks: None,
        prefill_replicas,
    };
    let never = "policy: cache_aware_approx\npd:\n  min_prompt_tokens: 1000000\n";
    let result = run(&control, args(never, None)).await?;
    assert_eq!((result.prefill_replicas, result.replicas), (Some(1), 1), "the routers' roles: 1 P, 1 D");
    let (candidate, active) =
        (result.candidate.pd.context("P/D figures")?, result.active.pd.context("P/D figures")?);
    assert_eq!(candidate.split_share, 0.0, "{candidate:?}");
    assert_eq!(candidate.decisions.get("short_prompt"), Some(&12));
    // The routers' own thresholds (the defaults) split the 8 long prompts, as they did live.
    assert_eq!(active.decisions.get("split"), Some(&8), "{active:?}");
    assert!(active.transfer_mean_ms > 0.0 && active.prefill_leg_mean_ms > 0.0, "{active:?}");

    // Another split of the same two replicas: none prefills, both decode.
    let result = run(&control, args("policy: cache_aware_approx", Some(0))).await?;
    assert_eq!((result.prefill_replicas, result.replicas), (Some(0), 2));
    let pd = result.candidate.pd.context("P/D figures")?;
    assert_eq!(pd.decisions.get("no_prefill_replica"), Some(&12), "{pd:?}");
    let refused =
        control.whatif().start(args("policy: cache_aware_approx", Some(2))).await.expect_err("no decode");
    assert!(
        refused.code == "bad_request" && refused.message.contains("leave at least one to decode"),
        "{refused:?}"
    );
    Ok(())
}
