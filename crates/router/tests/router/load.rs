//! The load test: 2,000 streaming requests per second for 60 s through the router, the policy swapped every
//! 100 ms, one replica (a separate fleet-sim process) killed and restarted on the same port mid-run.
//! Zero requests may be lost before they started streaming, and every started stream must end with a
//! terminal event (`[DONE]` or the router's error event). The generator is open-loop on a 2,000 req/s
//! schedule and prints the rate it achieved (2,000 req/s in the last measured run); the rate is not
//! asserted, since speed belongs in `cargo xtask bench router`.
//!
//! `FLEET_ROUTER_LOAD_RPS` and `FLEET_ROUTER_LOAD_SECS` change the rate and duration (defaults 2000 and 60).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use fleet_router::RouterConfig;
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::support::{SimProcess, TOKEN, router, sse_data};

#[derive(Default)]
struct Outcomes {
    sent: AtomicU64,
    completed: AtomicU64,
    /// Streams that ended with the router's error event (their replica died mid-stream).
    ended_with_error_event: AtomicU64,
    /// Requests that got no stream (an error status or a transport error before the response).
    lost_before_streaming: AtomicU64,
    /// Streams that started and ended without a terminal event.
    unterminated: AtomicU64,
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Requests in flight at most: far above what 2,000 req/s of short streams keep open, a guard
/// against running out of sockets when the machine is overloaded.
const MAX_IN_FLIGHT: usize = 3000;

const POLICIES: [&str; 5] = [
    "policy: cache_aware_approx\n",
    "policy: least_load\n",
    "policy: power_of_two\n",
    "policy: consistent_hash\n",
    "policy: round_robin\n",
];

async fn one_request(http: reqwest::Client, url: String, i: u64, outcomes: Arc<Outcomes>) {
    let tenant = i % 8;
    let body = json!({
        "model": fleet_sim::DEFAULT_MODEL,
        "messages": [
            {"role": "system", "content": format!("Tenant {tenant} system prompt. ").repeat(6)},
            {"role": "user", "content": format!("question {i}")},
        ],
        "max_tokens": 2,
        "stream": true,
    });
    outcomes.sent.fetch_add(1, Ordering::Relaxed);
    let response = match http.post(&url).json(&body).send().await {
        Ok(response) if response.status().is_success() => response,
        Ok(response) => {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            eprintln!("request {i} lost before streaming: {status} {text}");
            outcomes.lost_before_streaming.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Err(error) => {
            if outcomes.lost_before_streaming.load(Ordering::Relaxed) < 5 {
                eprintln!("request {i} lost before streaming: {:#}", anyhow::Error::from(error));
            }
            outcomes.lost_before_streaming.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let mut stream = response.bytes_stream();
    let mut text = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => text.extend_from_slice(&chunk),
            Err(error) => {
                eprintln!("request {i}: stream broke without a terminal event: {error}");
                outcomes.unterminated.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    let text = String::from_utf8_lossy(&text);
    let events = sse_data(&text);
    match events.last().map(String::as_str) {
        Some("[DONE]") => {
            outcomes.completed.fetch_add(1, Ordering::Relaxed);
        }
        Some(last) if serde_json::from_str::<Value>(last).is_ok_and(|v| v["error"].is_object()) => {
            outcomes.ended_with_error_event.fetch_add(1, Ordering::Relaxed);
        }
        _ => {
            eprintln!("request {i}: stream ended without a terminal event: {text}");
            outcomes.unterminated.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_requests_per_second_survive_policy_swaps_and_a_replica_restart() -> Result<()> {
    let rps = env_or("FLEET_ROUTER_LOAD_RPS", 2000);
    let seconds = env_or("FLEET_ROUTER_LOAD_SECS", 60);
    let mut sims = Vec::new();
    for _ in 0..3 {
        sims.push(Some(SimProcess::start(0).await?));
    }
    let urls: Vec<String> = sims.iter().flatten().map(|s| s.url.clone()).collect();
    let router = router(RouterConfig {
        replicas: urls.clone(),
        admin_token: Some(TOKEN.into()),
        read_timeout: Duration::from_secs(20),
        ..RouterConfig::default()
    })
    .await?;
    let http =
        reqwest::Client::builder().timeout(Duration::from_secs(60)).pool_max_idle_per_host(512).build()?;
    let outcomes = Arc::new(Outcomes::default());
    let chat_url = format!("{}/v1/chat/completions", router.url);

    // Policy swaps every 100 ms, compare-and-swap on the version just read.
    let swapping = tokio_util::sync::CancellationToken::new();
    let swaps = {
        let (http, url, stop) = (http.clone(), format!("{}/admin/policy", router.url), swapping.clone());
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_millis(100));
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let (mut applied, mut version) = (0u64, 1u64);
            while !stop.is_cancelled() {
                ticker.tick().await;
                let spec = POLICIES[(applied as usize) % POLICIES.len()];
                let response = http
                    .put(&url)
                    .bearer_auth(TOKEN)
                    .header("if-match", format!("\"{version}\""))
                    .body(spec)
                    .send()
                    .await?;
                anyhow::ensure!(response.status() == 200, "policy swap refused: {}", response.status());
                let body: Value = response.json().await?;
                version = body["version"].as_u64().unwrap_or(version);
                applied += 1;
            }
            Ok(applied)
        })
    };

    let start = Instant::now();
    let victim_at = Duration::from_secs(seconds / 3);
    let restart_at = Duration::from_secs(seconds / 2);
    let mut victim_port = None;
    let mut requests = tokio::task::JoinSet::new();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let mut ticker = tokio::time::interval(Duration::from_millis(10));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let total = rps * seconds;
    let mut issued = 0u64;
    while issued < total {
        ticker.tick().await;
        let elapsed = start.elapsed();
        if victim_port.is_none() && elapsed >= victim_at {
            victim_port = sims[1].take().map(SimProcess::kill);
            eprintln!("killed replica 1 at {elapsed:?}");
        }
        if let (Some(port), true) = (victim_port, elapsed >= restart_at && sims[1].is_none()) {
            sims[1] = Some(SimProcess::start(port).await?);
            eprintln!("restarted replica 1 at {:?}", start.elapsed());
        }
        // Open loop: issue what the schedule says by now, however long earlier requests take.
        let due = ((start.elapsed().as_secs_f64() * rps as f64) as u64).min(total);
        while issued < due {
            // A bound on requests in flight keeps an overloaded machine from running out of sockets; when it
            // binds, the schedule slips and the achieved rate printed below says so.
            let permit = in_flight.clone().acquire_owned().await?;
            let (http, url, outcomes) = (http.clone(), chat_url.clone(), outcomes.clone());
            requests.spawn(async move {
                one_request(http, url, issued, outcomes).await;
                drop(permit);
            });
            issued += 1;
        }
        while requests.try_join_next().is_some() {}
    }
    let issuing_took = start.elapsed();
    while requests.join_next().await.is_some() {}
    swapping.cancel();
    let swaps_applied = swaps.await??;

    let sent = outcomes.sent.load(Ordering::Relaxed);
    let completed = outcomes.completed.load(Ordering::Relaxed);
    let error_events = outcomes.ended_with_error_event.load(Ordering::Relaxed);
    let lost = outcomes.lost_before_streaming.load(Ordering::Relaxed);
    let unterminated = outcomes.unterminated.load(Ordering::Relaxed);
    eprintln!(
        "sent {sent} in {issuing_took:?} ({:.0} req/s), completed {completed}, error events {error_events}, \
         lost {lost}, unterminated {unterminated}, policy swaps {swaps_applied}",
        sent as f64 / issuing_took.as_secs_f64()
    );
    assert_eq!(sent, total);
    assert_eq!(lost, 0, "requests lost before they started streaming");
    assert_eq!(unterminated, 0, "started streams without a terminal event");
    assert_eq!(completed + error_events, sent);
    // The achieved rate is reported above, not asserted: on a loaded 2-core CI machine the open-loop generator
    // may slip behind its schedule, and speed belongs in `cargo xtask bench router`, not in a test. What must
    // hold is that swaps kept coming during the whole run (a stalled admin path would fail this by far): a tick
    // whose swap is still in flight is skipped, so ask for one in ten of the 100 ms ticks.
    assert!(swaps_applied >= seconds, "only {swaps_applied} policy swaps in {seconds} s");
    let version = router.state.policy.load().version;
    assert_eq!(version, swaps_applied + 1);
    // The restarted replica is back in rotation and serving.
    let metrics = reqwest::get(format!("{}/metrics", router.url)).await?.text().await?;
    assert!(
        metrics.contains(&format!("fleet_router_replica_healthy{{replica=\"{}\"}} 1", urls[1])),
        "{metrics}"
    );
    Ok(())
}
