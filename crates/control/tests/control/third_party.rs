//! A real SGLang Model Gateway (`smg` 1.13.0, installed by `cargo xtask setup --test`) over fleet-sim
//! replicas, added to the app as a router: it is recognised, listed read-only with its workers, and its
//! policy and request count come from its own metrics once it has routed a request.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use fleet_test_support::process::ChildProcess;
use fleet_test_support::webdriver::free_port;
use fleet_test_support::{eventually, spawn_sim};
use fleetdeck_api::{DecisionsArgs, HeatMapArgs, RouterSource};
use fleetdeck_control::{Control, ControlConfig, RouterTarget};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn an_smg_gateway_shows_as_a_read_only_router_with_its_workers_policy_and_metrics() -> Result<()> {
    let sim = spawn_sim(2, Default::default()).await?;
    let (port, metrics_port) = (free_port()?, free_port()?);
    let mut smg = tokio::process::Command::new(std::env::var("SMG_BIN").unwrap_or_else(|_| "smg".into()));
    smg.args(["launch", "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--prometheus-host", "127.0.0.1", "--prometheus-port", &metrics_port.to_string()])
        .args(["--policy", "cache_aware", "--log-level", "warn", "--worker-urls"])
        .args(sim.urls())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let _smg = ChildProcess::spawn(&mut smg)
        .context("cannot start `smg` (SGLang's gateway, PyPI smg==1.13.0); run `cargo xtask setup --test`")?;
    let url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    eventually("smg to be ready", Duration::from_secs(60), || async {
        Ok(client.get(format!("{url}/readiness")).send().await?.status().is_success().then_some(()))
    })
    .await?;

    let dir = tempfile::tempdir()?;
    let mut config = ControlConfig::new(sim.urls().to_vec(), dir.path().join("history.sqlite"));
    config.routers = vec![RouterTarget {
        url: url.clone(),
        token: None,
        token_file: None,
        metrics_url: Some(format!("http://127.0.0.1:{metrics_port}/metrics")),
    }];
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let control = Control::start(config, stop).await?;

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
