//! The Prometheus HTTP API as a source, against a real Prometheus server (Debian's
//! `prometheus` package) that this test starts on a free loopback port with a temporary
//! config and storage, scraping emulated replicas every second.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use fleet_sim::ModelConfig;
use fleet_telemetry::prometheus::PromSource;
use fleet_telemetry::{Engine, EngineSignals, ScrapeLimits, Window};
use fleet_test_support::process::ChildProcess;
use fleet_test_support::webdriver::free_port;
use fleet_test_support::{eventually, spawn_sim};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// Requests through every replica until `stop` fires (bounded), so there are hits and TTFTs.
fn traffic(urls: Vec<String>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client");
        for i in 0..3000 {
            if stop.is_cancelled() {
                return;
            }
            let url = &urls[i % urls.len()];
            let prompt = format!("{} question {}", "shared tenant system prompt ".repeat(24), i % 7);
            let body = json!({"prompt": prompt, "max_tokens": 4});
            let _ = client.post(format!("{url}/v1/completions")).json(&body).send().await;
        }
    })
}

fn presence(s: &EngineSignals) -> [bool; 8] {
    [
        s.queue_depth.is_some(),
        s.running.is_some(),
        s.kv_usage.is_some(),
        s.hit_rate.is_some(),
        s.ttft_p95_s.is_some(),
        s.itl_p50_s.is_some(),
        s.prompt_tokens_per_s.is_some(),
        s.preemptions_per_s.is_some(),
    ]
}

#[tokio::test]
async fn prometheus_source_discovers_targets_and_gives_the_same_signals() -> Result<()> {
    anyhow::ensure!(
        std::path::Path::new(PROMETHEUS).exists(),
        "{PROMETHEUS} is missing; install Debian's prometheus package (cargo xtask setup --test does)"
    );
    let sim = spawn_sim(2, ModelConfig::default()).await?;
    let dir = tempfile::tempdir()?;
    let targets: Vec<String> =
        sim.urls().iter().map(|u| format!("'{}'", u.trim_start_matches("http://"))).collect();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: fleet-sim\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    )?;
    let port = free_port()?;
    let log = std::fs::File::create(dir.path().join("prometheus.log"))?;
    let _prometheus = ChildProcess::spawn(
        tokio::process::Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log),
    )
    .context("cannot start prometheus")?;

    let stop = CancellationToken::new();
    let _stop_traffic = stop.clone().drop_guard();
    let load = traffic(sim.urls().to_vec(), stop.clone());

    let client = fleet_telemetry::scrape::client(Duration::from_secs(2))?;
    let limits = ScrapeLimits { timeout: Duration::from_secs(5), max_bytes: 8 << 20 };
    let source =
        PromSource::new(&format!("http://127.0.0.1:{port}"), client.clone(), limits, Duration::from_secs(10));

    let discovered = eventually("Prometheus to report both replicas up", Duration::from_secs(30), || async {
        let targets = source.targets().await?;
        Ok((targets.len() == 2 && targets.iter().all(|t| t.health == "up")).then_some(targets))
    })
    .await?;
    // Prometheus lists targets in its own order.
    let mut scraped: Vec<String> = discovered.iter().map(|t| t.scrape_url.clone()).collect();
    scraped.sort();
    let mut expected: Vec<String> = sim.urls().iter().map(|u| format!("{u}/metrics")).collect();
    expected.sort();
    assert_eq!(scraped, expected);
    assert!(discovered.iter().all(|t| t.job == "fleet-sim" && t.last_error.is_empty()), "{discovered:?}");

    let replicas = eventually("hit rates and TTFTs through PromQL", Duration::from_secs(40), || async {
        let replicas = source.signals().await?;
        let ready = replicas.len() == 2
            && replicas
                .iter()
                .all(|r| r.signals.total.hit_rate.is_some() && r.signals.total.ttft_p95_s.is_some());
        Ok(ready.then_some(replicas))
    })
    .await?;

    // The same replica read directly, over a window of the same kind.
    let url = &sim.urls()[0];
    let local =
        eventually("a direct reading with traffic in its window", Duration::from_secs(20), || async {
            let mut window = Window::new(Duration::from_secs(10));
            for at in [0.0, 1.5] {
                if at > 0.0 {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
                window.push(at, &fleet_telemetry::scrape(&client, url, limits).await?);
            }
            let signals = window.signals().context("signals")?;
            Ok((signals.total.hit_rate.is_some() && signals.total.ttft_p95_s.is_some()).then_some(signals))
        })
        .await?;
    stop.cancel();
    load.await?;

    let remote = replicas
        .iter()
        .find(|r| *url == format!("http://{}", r.instance))
        .context("replica 0 among Prometheus' instances")?;
    assert_eq!(remote.signals.engine, Engine::Vllm);
    assert_eq!(local.engine, Engine::Vllm);
    assert_eq!(remote.signals.model.as_deref(), Some(fleet_sim::DEFAULT_MODEL));
    assert_eq!(remote.signals.model, local.model);
    assert_eq!(presence(&remote.signals.total), presence(&local.total), "{remote:?}\n{local:?}");
    let total = &remote.signals.total;
    assert!(total.kv_usage.is_some_and(|u| (0.0..=1.0).contains(&u)));
    assert!(total.hit_rate.is_some_and(|h| (0.0..=1.0).contains(&h)));
    assert!(total.prompt_tokens_per_s.is_some_and(|r| r > 0.0));
    assert!(total.ttft_p50_s.unwrap() <= total.ttft_p95_s.unwrap());
    assert!(total.preemptions_per_s.is_some_and(|p| p >= 0.0), "fleet-sim exports vLLM's preemption counter");
    Ok(())
}
