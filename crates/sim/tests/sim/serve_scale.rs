//! One `fleet-sim serve` process with 256 replicas, each scraped once a second for 30 s (staggered
//! across the second, as a scrape scheduler does) with a deadline per scrape and light traffic
//! on the side: no scrape may fail. The process's CPU time over the run is printed (the figure
//! the issue asks for; measured, never asserted).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;

use super::serve::{MODEL, prompt};
use super::serve_faults::spawn_sim;

const REPLICAS: usize = 256;
const SECONDS: u64 = 30;

/// utime + stime of `pid` in seconds (Linux /proc; clock ticks of 100 Hz).
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let after = stat.rsplit_once(')').context("stat format")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    Ok(ticks as f64 / 100.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_serves_256_replicas_scraped_every_second_for_30_s_without_a_miss() -> Result<()> {
    let replicas = REPLICAS.to_string();
    let sim = spawn_sim(&["--replicas", &replicas, "--base-port", "0"], &[]).await?;
    assert_eq!(sim.replicas.len(), REPLICAS);
    let pid = sim.process.child.id().context("pid")?;
    let client =
        reqwest::Client::builder().timeout(Duration::from_secs(1)).pool_max_idle_per_host(1).build()?;

    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let cpu_before = cpu_seconds(pid)?;
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let mut scrapers = Vec::new();
    for (i, url) in sim.replicas.iter().enumerate() {
        let (client, ok, failed) = (client.clone(), ok.clone(), failed.clone());
        let url = format!("{url}/metrics");
        let offset = Duration::from_secs(1) * i as u32 / REPLICAS as u32;
        scrapers.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(start + offset, Duration::from_secs(1));
            for _ in 0..SECONDS {
                ticks.tick().await;
                let good = match client.get(&url).send().await {
                    Ok(response) if response.status() == 200 => {
                        response.text().await.is_ok_and(|t| t.contains("vllm:num_requests_running{"))
                    }
                    _ => false,
                };
                if good { &ok } else { &failed }.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Light traffic beside the scrapes: two short completions a second across the fleet.
    let traffic = {
        let (client, urls) = (client.clone(), sim.replicas.clone());
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis(500));
            for i in 0..SECONDS * 2 {
                ticks.tick().await;
                let url = format!("{}/v1/completions", urls[(i as usize * 37) % urls.len()]);
                let body = json!({"model": MODEL, "prompt": prompt("scale", 8), "max_tokens": 8});
                let _ = client.post(url).json(&body).send().await;
            }
        })
    };
    for scraper in scrapers {
        scraper.await?;
    }
    traffic.abort();
    let cpu = cpu_seconds(pid)? - cpu_before;
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!(
        "fleet-sim with {REPLICAS} replicas, each scraped at 1 Hz for {SECONDS} s: {ok} scrapes ok, {failed} failed; \
         process CPU {cpu:.2} s = {:.1}% of one core",
        100.0 * cpu / SECONDS as f64
    );
    assert_eq!(failed, 0, "missed scrapes");
    assert_eq!(ok, REPLICAS as u64 * SECONDS);
    Ok(())
}
