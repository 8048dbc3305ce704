//! The what-if's fidelity, measured (`cargo xtask bench fidelity`): for each change A -> B, an emulated
//! fleet (fleet-sim replicas, KV events on, KV capacity tight) runs live under A through fleet-router with
//! its recording, the app's own what-if (`Control::start_whatif`: the router's running spec, every page of
//! its trace, the engine profile from the replicas' metrics) predicts B from A's recording, and then B runs
//! live from a cold fleet on the same seeded traffic. Prints predicted vs measured hit rate and TTFT p95 for
//! A (the self-check) and B, and writes the table the app shows next to its predictions.
//!
//! `cargo run --release -p fleet-demo --example fidelity -- [OUT.json] [REQUESTS]`
//!
//! Measured figures come from the router's recording of the first REQUESTS answered requests (cached over
//! prompt tokens as the replicas reported them in usage; time to the first streamed token as TTFT).

use std::time::Duration;

use anyhow::{Context, Result, bail};
use fleet_base::quantile::nearest_rank;
use fleet_demo::DemoConfig;
use fleet_sim::kv_publish::KvEventsConfig;
use fleet_sim::load::{LoadConfig, LoadStats};
use fleet_sim::{Fleet, ModelConfig};
use fleet_test_support::eventually;
use fleet_trace::TraceRecord;
use fleetdeck_api::{WhatIfArgs, WhatIfJobArgs, WhatIfResult};
use fleetdeck_control::routers::admin::AdminClient;
use fleetdeck_control::whatif::fidelity::{Figures, Pair, Table};
use fleetdeck_control::{Control, ControlConfig, RouterTarget};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "fidelity-bench-token";
const PAIRS: [(&str, &str); 3] = [
    ("round_robin", "cache_aware_approx"),
    ("cache_aware_approx", "kv_precise"),
    ("consistent_hash", "weighted_scorers"),
];

/// One live run: a cold fleet under `policy`, the seeded demo traffic until `requests` were answered.
struct Live {
    records: Vec<TraceRecord>,
    router_url: String,
    replica_urls: Vec<String>,
    cancel: CancellationToken,
}

async fn live(policy: &str, requests: usize, shape: &DemoConfig) -> Result<Live> {
    let cancel = CancellationToken::new();
    let mut listeners = Vec::new();
    for _ in 0..shape.replicas {
        listeners.push(TcpListener::bind("127.0.0.1:0").await?);
    }
    let mut model = ModelConfig::default();
    model.engine.num_gpu_blocks = shape.kv_blocks;
    let kv = KvEventsConfig::new("tcp://127.0.0.1:0".parse().map_err(anyhow::Error::msg)?);
    let fleet = Fleet::start(listeners, fleet_sim::DEFAULT_MODEL, &model, Some(&kv), &cancel).await?;
    let replicas: Vec<String> = fleet
        .urls
        .iter()
        .zip(&fleet.kv_endpoints)
        .map(|(url, kv)| format!("{url},kv={},kv_replay={}", kv.publish, kv.replay))
        .collect();
    let replica_urls = fleet.urls.clone();
    let router_listener = TcpListener::bind("127.0.0.1:0").await?;
    let router_url = format!("http://{}", router_listener.local_addr()?);
    let config = fleet_router::RouterConfig {
        replicas,
        policy: format!("policy: {policy}\n").parse().context("policy")?,
        admin_token: Some(TOKEN.into()),
        ..Default::default()
    };
    let stop = cancel.clone();
    tokio::spawn(async move { fleet_router::serve(router_listener, config, stop.cancelled_owned()).await });
    tokio::spawn(async move { fleet.join().await });
    let load_stop = cancel.child_token();
    let load = LoadConfig {
        target: router_url.clone(),
        rps: shape.rps,
        tenants: shape.tenants,
        system_prompt_bytes: shape.system_prompt_bytes,
        seed: 25,
        ..LoadConfig::default()
    };
    let client = reqwest::Client::builder().connect_timeout(Duration::from_secs(2)).build()?;
    tokio::spawn(fleet_sim::load::run(
        load,
        client,
        std::sync::Arc::new(LoadStats::default()),
        load_stop.clone(),
    ));
    let admin = AdminClient::new(reqwest::Client::new(), &router_url, Some(TOKEN.into()));
    let records =
        eventually(&format!("{requests} requests under {policy}"), Duration::from_secs(300), || {
            let admin = admin.clone();
            async move {
                let records = admin.trace_since(0).await?;
                let done = records.iter().filter(|r| r.status == Some(200)).count();
                Ok((done >= requests).then_some(records))
            }
        })
        .await?;
    load_stop.cancel();
    Ok(Live { records, router_url, replica_urls, cancel })
}

/// Hit rate and TTFT p95 (ms) of the first `requests` answered requests, by arrival.
fn measured(records: &[TraceRecord], requests: usize) -> (f64, f64) {
    let mut done: Vec<&TraceRecord> = records.iter().filter(|r| r.status == Some(200)).collect();
    done.sort_by_key(|r| r.timestamp);
    done.truncate(requests);
    let prompt: u64 = done.iter().map(|r| u64::from(r.input_length)).sum();
    let cached: u64 = done.iter().map(|r| u64::from(r.cached_tokens.unwrap_or(0))).sum();
    let mut ttft: Vec<f64> = done.iter().filter_map(|r| r.ttft_ms).collect();
    ttft.sort_by(f64::total_cmp);
    // Nearest rank, as the what-if's replay reports its p95: prediction and measure compare like for like.
    let p95 = nearest_rank(&ttft, 0.95).unwrap_or(0.0);
    (cached as f64 / prompt.max(1) as f64, p95)
}

async fn predict(run: &Live, candidate: &str, dir: &std::path::Path) -> Result<WhatIfResult> {
    let cancel = run.cancel.child_token();
    let mut config = ControlConfig::new(run.replica_urls.clone(), dir.join("history.db"));
    config.routers = vec![RouterTarget {
        url: run.router_url.clone(),
        token: Some(TOKEN.into()),
        ..RouterTarget::default()
    }];
    let control = Control::start(config, cancel.clone()).await?;
    // The app reads the router's replicas from its admin state, polled in the background.
    let started = eventually("the what-if to start", Duration::from_secs(30), || {
        let control = control.clone();
        let args = WhatIfArgs {
            text: format!("policy: {candidate}"),
            window_s: 3600,
            trace_path: None,
            replicas: None,
            profile: None,
            kv_blocks: None,
        };
        async move { Ok(control.whatif().start(args).await.ok()) }
    })
    .await?;
    let done = eventually("the what-if result", Duration::from_secs(300), || {
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
    cancel.cancel();
    done.result.context("no result")
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let out = args.next().unwrap_or_else(|| "crates/control/fidelity.json".to_owned());
    let requests: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(300);
    let shape = DemoConfig::default();
    let dir = tempfile::tempdir()?;
    let mut pairs = Vec::new();
    println!(
        "{:<40} {:>9} {:>9} {:>10} {:>10}",
        "policy (role)", "hit pred", "hit meas", "p95 pred", "p95 meas"
    );
    for (i, (from, to)) in PAIRS.iter().enumerate() {
        let a = live(from, requests, &shape).await?;
        let (a_hit, a_p95) = measured(&a.records, requests);
        let sub = dir.path().join(format!("pair{i}"));
        std::fs::create_dir_all(&sub)?;
        let predicted = predict(&a, to, &sub).await?;
        a.cancel.cancel();
        let b = live(to, requests, &shape).await?;
        let (b_hit, b_p95) = measured(&b.records, requests);
        b.cancel.cancel();
        let ms = |s: Option<f64>| s.unwrap_or(f64::NAN) * 1000.0;
        let pair = Pair {
            from: (*from).to_owned(),
            to: (*to).to_owned(),
            self_check: Figures {
                predicted_hit_rate: predicted.active.hit_rate.unwrap_or(f64::NAN),
                measured_hit_rate: a_hit,
                predicted_ttft_p95_ms: ms(predicted.active.ttft_p95_s),
                measured_ttft_p95_ms: a_p95,
            },
            candidate: Figures {
                predicted_hit_rate: predicted.candidate.hit_rate.unwrap_or(f64::NAN),
                measured_hit_rate: b_hit,
                predicted_ttft_p95_ms: ms(predicted.candidate.ttft_p95_s),
                measured_ttft_p95_ms: b_p95,
            },
        };
        for (role, f) in [
            (format!("{from} (A, self-check)"), &pair.self_check),
            (format!("{to} (B from A)"), &pair.candidate),
        ] {
            println!(
                "{role:<40} {:>8.1}% {:>8.1}% {:>8.0}ms {:>8.0}ms   hit {:+.1} pp, p95 {:+.0} %",
                f.predicted_hit_rate * 100.0,
                f.measured_hit_rate * 100.0,
                f.predicted_ttft_p95_ms,
                f.measured_ttft_p95_ms,
                f.hit_rate_error_pp(),
                f.ttft_p95_error_pct()
            );
        }
        println!(
            "  profile: {} ({})  coverage: {}  time outside the engine: {}",
            predicted.profile.name,
            predicted.profile.reason,
            predicted.coverage.summary,
            predicted.ttft_overhead_ms.map_or("not measured".to_owned(), |ms| format!("{ms:.1} ms"))
        );
        pairs.push(pair);
    }
    let table = Table {
        measured: std::env::var("FLEET_FIDELITY_DATE").unwrap_or_else(|_| "unknown date".to_owned()),
        setup: format!(
            "{} fleet-sim replicas of {} KV blocks, {} tenants' {}-byte prompts at {} req/s, {requests} requests a run",
            shape.replicas, shape.kv_blocks, shape.tenants, shape.system_prompt_bytes, shape.rps
        ),
        pairs,
    };
    std::fs::write(&out, serde_json::to_string_pretty(&table)? + "\n")?;
    println!("wrote {out}; goal: hit rate within 2 pp, TTFT p95 within 15 %");
    Ok(())
}
