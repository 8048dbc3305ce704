//! A real SGLang Model Gateway (`smg` 1.13.0, installed by `cargo xtask setup --test`) over fleet-sim
//! replicas, added to the app as a router: it is recognised, listed read-only with its workers, and its
//! policy and request count come from its own metrics once it has routed a request. In P/D mode over
//! fleet-sim's SGLang prefill and decode replicas, its own P/D figures and its workers' roles reach the app's
//! P/D view. llm-d's EPP and Dynamo's frontend, known by their metrics alone, are read the same way (fakes
//! serving their metric names: neither runs here).

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use fleet_sim::pd::{PdConfig, Role};
use fleet_sim::{Flavor, ModelConfig};
use fleet_test_support::endpoints::{MetricsMode, metrics_replica};
use fleet_test_support::process::ChildProcess;
use fleet_test_support::webdriver::free_port;
use fleet_test_support::{eventually, spawn_sim};
use fleetdeck_api::{DecisionsArgs, HeatMapArgs, PdViewArgs, RouterSource};
use fleetdeck_control::{Control, ControlConfig, RouterTarget};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A real `smg launch` on free ports with `args` after them, ready: its URL and metrics URL.
struct Smg {
    _process: ChildProcess,
    url: String,
    metrics_url: String,
}

async fn start_smg(args: &[&str]) -> Result<Smg> {
    let (port, metrics_port) = (free_port()?, free_port()?);
    let mut smg = tokio::process::Command::new(std::env::var("SMG_BIN").unwrap_or_else(|_| "smg".into()));
    smg.args(["launch", "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--prometheus-host", "127.0.0.1", "--prometheus-port", &metrics_port.to_string()])
        .args(["--log-level", "warn"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let process = ChildProcess::spawn(&mut smg)
        .context("cannot start `smg` (SGLang's gateway, PyPI smg==1.13.0); run `cargo xtask setup --test`")?;
    let url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    eventually("smg to be ready", Duration::from_secs(60), || async {
        Ok(client.get(format!("{url}/readiness")).send().await?.status().is_success().then_some(()))
    })
    .await?;
    Ok(Smg { _process: process, url, metrics_url: format!("http://127.0.0.1:{metrics_port}/metrics") })
}

/// The app over `replicas`, reading `router` (with its metrics URL) as a router.
async fn app_reading(replicas: Vec<String>, router: &str, metrics_url: &str) -> Result<(Control, App)> {
    let dir = tempfile::tempdir()?;
    let mut config = ControlConfig::new(replicas, dir.path().join("history.sqlite"));
    config.routers = vec![RouterTarget {
        url: router.to_owned(),
        token: None,
        token_file: None,
        metrics_url: Some(metrics_url.to_owned()),
    }];
    let stop = CancellationToken::new();
    let control = Control::start(config, stop.clone()).await?;
    Ok((control, App { _dir: dir, _stop: stop.drop_guard() }))
}

/// What keeps the app of [`app_reading`] running: its history folder and its stop.
struct App {
    _dir: tempfile::TempDir,
    _stop: tokio_util::sync::DropGuard,
}

#[tokio::test]
async fn an_smg_gateway_shows_as_a_read_only_router_with_its_workers_policy_and_metrics() -> Result<()> {
    let sim = spawn_sim(2, Default::default()).await?;
    let mut args = vec!["--policy", "cache_aware", "--worker-urls"];
    args.extend(sim.urls().iter().map(String::as_str));
    let smg = start_smg(&args).await?;
    let url = smg.url.clone();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let (control, _app) = app_reading(sim.urls().to_vec(), &url, &smg.metrics_url).await?;

    let source = |control: &Control| {
        let control = control.clone();
        async move {
            let heat = control.routers().heat_map(HeatMapArgs::default()).await?;
            Ok::<Option<RouterSource>, anyhow::Error>(heat.routers.into_iter().next())
        }
    };
    // Before it routed anything: recognised, read-only, both workers listed healthy, no policy made up.
    let listed = eventually("smg to be listed with its workers", Duration::from_secs(20), || async {
        let seen = source(&control).await?;
        match seen {
            // Its metrics read too: smg counts the 503s it answered the readiness polls above.
            Some(s) if s.kind == "smg" && s.workers.len() == 2 && s.errors_total.is_some() => Ok(Some(s)),
            other => Err(anyhow::anyhow!("the router is listed as {other:?}")),
        }
    })
    .await?;
    assert_eq!(listed.error, None);
    assert!(
        listed.read_only.as_deref().is_some_and(|r| r.starts_with("read-only: smg has no API")),
        "{listed:?}"
    );
    let mut workers: Vec<&str> = listed.workers.iter().map(|w| w.url.as_str()).collect();
    workers.sort_unstable();
    let mut replicas: Vec<&str> = sim.urls().iter().map(String::as_str).collect();
    replicas.sort_unstable();
    assert_eq!(workers, replicas);
    assert!(listed.workers.iter().all(|w| w.healthy == Some(true)), "{listed:?}");

    let body = json!({"model": fleet_sim::DEFAULT_MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2});
    client.post(format!("{url}/v1/chat/completions")).json(&body).send().await?.error_for_status()?;
    let routed = eventually("smg's policy and count from its metrics", Duration::from_secs(20), || async {
        let seen = source(&control).await?;
        match seen {
            Some(s) if s.policy.as_deref() == Some("cache_aware") => Ok(Some(s)),
            other => Err(anyhow::anyhow!("the router is listed as {other:?}")),
        }
    })
    .await?;
    assert!(routed.requests_total.is_some_and(|n| n >= 1.0), "{routed:?}");
    // The routed request added no 5xx (those counted before it answered the test's readiness polls).
    assert_eq!(routed.errors_total, listed.errors_total, "{routed:?}");
    // Views that need fleet-router's admin API skip it rather than fail.
    control.routers().decisions(DecisionsArgs { limit: 10 }).await?;
    Ok(())
}

#[tokio::test]
async fn smg_disaggregating_over_sglang_replicas_shows_its_own_figures_in_the_p_d_view() -> Result<()> {
    let sglang = |role| ModelConfig {
        flavor: Flavor::Sglang,
        pd: PdConfig { role, ..PdConfig::default() },
        ..ModelConfig::default()
    };
    let prefill = spawn_sim(1, sglang(Role::Prefill)).await?;
    let decode = spawn_sim(1, sglang(Role::Decode)).await?;
    // fleet-sim serves an SGLang prefill replica's bootstrap (its KV pulls) on its HTTP port.
    let bootstrap = prefill.fleet.replicas[0].addr.port().to_string();
    let (p, d) = (prefill.urls()[0].clone(), decode.urls()[0].clone());
    let args =
        ["--pd-disaggregation", "--policy", "round_robin", "--prefill", &p, &bootstrap, "--decode", &d];
    let smg = start_smg(&args).await?;
    let url = smg.url.clone();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let (control, _app) = app_reading(vec![p.clone(), d.clone()], &url, &smg.metrics_url).await?;
    let view = || {
        let control = control.clone();
        async move { control.disagg().view(PdViewArgs { window_s: 120, bucket_s: 10 }).await }
    };
    // Before any request: its workers' roles make a 1:1 P/D fleet, and its row reads zero.
    eventually("smg's row and roles in the P/D view", Duration::from_secs(30), || async {
        let v = view().await?;
        let ready = v.ratio.as_deref() == Some("1:1") && v.router_figures.iter().any(|r| r.kind == "smg");
        Ok(ready.then_some(()))
    })
    .await?;

    // Three long prompts through SMG: SMG sends each to both, the decode replica pulls the prompt's KV.
    for n in 0..3 {
        let prompt = format!("request {n} of a shared document; ").repeat(60);
        let body = json!({"model": fleet_sim::DEFAULT_MODEL, "prompt": prompt, "max_tokens": 3});
        let answer: serde_json::Value = client
            .post(format!("{url}/v1/completions"))
            .json(&body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        assert!(cached > 0, "the decode replica pulled the KV from the prefill replica: {answer}");
    }
    let seen = eventually("smg's three splits in the P/D view", Duration::from_secs(30), || async {
        let v = view().await?;
        let row = v.router_figures.iter().find(|r| r.kind == "smg").cloned();
        Ok(row.filter(|r| r.splits == 3 && r.ttft_mean_ms.is_some()).map(|row| (row, v)))
    })
    .await?;
    let (row, v) = seen;
    assert_eq!((row.url.as_str(), row.failures), (url.as_str(), 0), "{row:?}");
    let (ttft, prefill_ms) = (row.ttft_mean_ms.unwrap_or(0.0), row.prefill_mean_ms.context("prefill")?);
    assert!(prefill_ms > 0.0 && prefill_ms <= ttft, "the prefill is part of SMG's TTFT: {row:?}");
    assert_eq!(v.reasons.iter().find(|r| r.reason == "split").map(|r| r.count), Some(3), "{v:?}");
    let bucketed: u64 = v.over_time.iter().filter_map(|b| b.counts.get("split")).sum();
    assert_eq!(bucketed, 3);
    assert!(v.notes.iter().any(|n| n.contains("smg_pd_ttft_seconds")), "{:?}", v.notes);
    let decode_role = v.roles.iter().find(|r| r.role == "decode").context("the decode role")?;
    assert_eq!((decode_role.replicas, decode_role.healthy), (1, 1));
    Ok(())
}

/// llm-d's EPP counters at `splits` prefill-decode and `local` decode-only decisions.
fn llm_d_text(splits: u64, local: u64) -> String {
    format!(
        "# TYPE llm_d_inference_scheduler_disagg_decision_total counter\n\
         llm_d_inference_scheduler_disagg_decision_total{{model_name=\"m\",decision_type=\"prefill-decode\"}} {splits}\n\
         llm_d_inference_scheduler_disagg_decision_total{{model_name=\"m\",decision_type=\"decode-only\"}} {local}\n"
    )
}

/// Dynamo's frontend with two prefill workers and one decode worker.
const DYNAMO_TEXT: &str = "\
    dynamo_frontend_requests_total{model=\"m\",endpoint=\"chat_completions\",request_type=\"stream\",status=\"success\"} 9\n\
    dynamo_frontend_worker_active_prefill_tokens{worker_id=\"1\",dp_rank=\"0\",worker_type=\"prefill\"} 300\n\
    dynamo_frontend_worker_active_prefill_tokens{worker_id=\"2\",dp_rank=\"0\",worker_type=\"prefill\"} 200\n\
    dynamo_frontend_worker_active_decode_blocks{worker_id=\"3\",dp_rank=\"0\",worker_type=\"decode\"} 64\n\
    dynamo_frontend_worker_last_time_to_first_token_seconds{worker_id=\"1\",worker_type=\"prefill\"} 0.12\n";

#[tokio::test]
async fn llm_d_and_dynamo_known_by_their_metrics_alone_reach_the_p_d_view() -> Result<()> {
    // Fakes: llm-d's EPP (a Go service on Kubernetes) and Dynamo's frontend (with its NATS, etcd and GPU
    // workers) do not run here. These serve the metric names their sources define; neither has a /workers.
    let epp = metrics_replica("m", MetricsMode::Body(llm_d_text(2, 5))).await?;
    let dynamo = metrics_replica("m", MetricsMode::Body(DYNAMO_TEXT.to_owned())).await?;
    let dir = tempfile::tempdir()?;
    let mut config = ControlConfig::new(Vec::new(), dir.path().join("history.sqlite"));
    config.routers = [epp.url(), dynamo.url()]
        .into_iter()
        .map(|url| RouterTarget {
            metrics_url: Some(format!("{url}/metrics")),
            url,
            token: None,
            token_file: None,
        })
        .collect();
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let control = Control::start(config, stop).await?;
    let view = || {
        let control = control.clone();
        async move { control.disagg().view(PdViewArgs { window_s: 120, bucket_s: 10 }).await }
    };
    let first = eventually("both routers' rows", Duration::from_secs(30), || async {
        let v = view().await?;
        let kinds: Vec<&str> = v.router_figures.iter().map(|r| r.kind.as_str()).collect();
        Ok((kinds.contains(&"llm-d") && kinds.contains(&"dynamo")).then_some(v))
    })
    .await?;
    let listed: Vec<(String, bool)> =
        first.routers.iter().map(|r| (r.kind.clone(), r.read_only.is_some())).collect();
    assert!(listed.contains(&("llm-d".to_owned(), true)) && listed.contains(&("dynamo".to_owned(), true)));
    // Dynamo's workers by type: a 2:1 fleet, and its row shows the gauges as they stand.
    assert_eq!(first.ratio.as_deref(), Some("2:1"), "{first:?}");
    let dyn_row = first.router_figures.iter().find(|r| r.kind == "dynamo").context("Dynamo's row")?;
    let prefill = dyn_row.worker_types.iter().find(|t| t.worker_type == "prefill").context("prefill")?;
    assert_eq!((prefill.workers, prefill.active_prefill_tokens), (2, Some(500.0)));
    assert!(prefill.last_ttft_ms.is_some_and(|ms| (ms - 120.0).abs() < 1e-6), "{prefill:?}");

    // llm-d decides on: three more splits and four more decode-only decisions in the window.
    epp.set(MetricsMode::Body(llm_d_text(5, 9)));
    let row = eventually("llm-d's new decisions", Duration::from_secs(30), || async {
        let v = view().await?;
        Ok(v.router_figures.into_iter().find(|r| r.kind == "llm-d" && r.splits == 3 && r.local == 4))
    })
    .await?;
    assert_eq!(row.url, epp.url());
    let v = view().await?;
    let reasons: Vec<(&str, u64)> = v.reasons.iter().map(|r| (r.reason.as_str(), r.count)).collect();
    assert_eq!(reasons, [("local", 4), ("split", 3)]);
    Ok(())
}
