//! What the shared load (`--peer-load-prefix`) asks of etcd as the routers multiply: N publishers each write
//! a load summary every interval, as a busy fleet-router does (its summary changes every tick), on a lease
//! kept alive every second, and N watchers of the prefix (every router watches all the others) read every
//! summary and parse it as fleet-router does. Per N it reports the writes a second asked for and done, the
//! put latency, how late a summary reaches the other routers (p50/p99, from before its put to its parse, on
//! this machine's one clock), the share of summaries delivered, and the CPU etcd and the clients used.
//!
//! The publishers and watchers are tasks of this process using fleet-router's etcd client and summary type,
//! one client per router; not N router processes, since N busy routers would need N times the traffic,
//! which two cores cannot drive. A summary names 8 replicas by URL (about 0.7 KB) and carries a routed
//! prompt's marks (32 hashes) at `--prompts-per-s` per router.
//!
//! ```text
//! cargo xtask bench peer-load [--routers 4,16,50] [--interval-ms 25] [--seconds 10] [--prompts-per-s 3]
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use fleet_base::quantile::nearest_rank;
use fleet_etcd::{EtcdClient, WatchEvent, WatchFrame};
use fleet_policy::PeerLoad;
use fleet_router::peer_load::{LEASE_TTL_S, LoadSummary, SharedPrompt};
use fleet_test_support::etcd::EtcdServer;
use fleet_test_support::process::cpu_seconds;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

const PREFIX: &str = "/fleetdeck/bench/load/";
const REPLICAS: usize = 8;
const MARKS: u64 = 32;

fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

fn flag<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Result<T> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => {
            args.get(i + 1).and_then(|v| v.parse().ok()).with_context(|| format!("{name} needs a value"))
        }
    }
}

/// Router `index`'s summary at `tick`, named `index@SENT_US` so a watcher can tell how late it came.
fn summary(index: usize, tick: u64, with_prompt: bool) -> LoadSummary {
    let replicas: BTreeMap<String, PeerLoad> = (0..REPLICAS)
        .map(|r| {
            let load = PeerLoad {
                requests: (tick + r as u64) % 7,
                prefill_blocks: 1_000 + (tick * 37 + r as u64) % 9_000,
                decode_blocks: 1_000 + (tick * 53 + r as u64) % 9_000,
            };
            (format!("http://10.0.{}.{}:8000", r / 250, r % 250 + 1), load)
        })
        .collect();
    let routed = if with_prompt {
        let marks = (0..MARKS).map(|m| (tick << 20 | m).wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
        vec![SharedPrompt { request: tick, replica: "http://10.0.0.1:8000".to_owned(), marks }]
    } else {
        Vec::new()
    };
    LoadSummary {
        router: format!("{index}@{}", unix_us()),
        replicas,
        in_prefill: Vec::new(),
        routed,
        engine: None,
    }
}

#[derive(Default)]
struct Samples {
    put_us: Vec<f64>,
    lag_us: Vec<f64>,
}

async fn publish(
    client: EtcdClient,
    index: usize,
    interval: Duration,
    prompts_per_s: f64,
    stop: CancellationToken,
    samples: Arc<Mutex<Samples>>,
    puts: Arc<AtomicU64>,
) -> Result<()> {
    let key = format!("{PREFIX}r{index}");
    let lease = client.grant_lease(LEASE_TTL_S).await?.id;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut keep_alive_at = Instant::now() + Duration::from_secs(1);
    let mut latencies = Vec::new();
    let per_tick = prompts_per_s * interval.as_secs_f64();
    for n in 0u64.. {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        // A prompt on the ticks where the running count of prompts passes a whole number.
        let with_prompt = ((n + 1) as f64 * per_tick).floor() > (n as f64 * per_tick).floor();
        let value = serde_json::to_vec(&summary(index, n, with_prompt))?;
        let started = Instant::now();
        client.put_with_lease(&key, &value, lease).await?;
        latencies.push(started.elapsed().as_micros() as f64);
        puts.fetch_add(1, Ordering::Relaxed);
        if Instant::now() >= keep_alive_at {
            client.keep_alive(lease).await?;
            keep_alive_at = Instant::now() + Duration::from_secs(1);
        }
    }
    samples.lock().await.put_us.extend(latencies);
    let _ = client.revoke_lease(lease).await;
    Ok(())
}

async fn watch(
    client: EtcdClient,
    index: usize,
    revision: i64,
    stop: CancellationToken,
    samples: Arc<Mutex<Samples>>,
    received: Arc<AtomicU64>,
) -> Result<()> {
    let mut watch = client.watch_prefix(PREFIX, revision).await?;
    let own = format!("{PREFIX}r{index}");
    let mut lags = Vec::new();
    loop {
        let frame = tokio::select! {
            _ = stop.cancelled() => break,
            frame = watch.next() => frame?,
        };
        let Some(WatchFrame::Events { events, .. }) = frame else { continue };
        for event in events {
            let WatchEvent::Put(kv) = event else { continue };
            if kv.key == own.as_bytes() {
                continue;
            }
            let summary = LoadSummary::parse(&kv.value).map_err(anyhow::Error::msg)?;
            let sent: u64 = summary.router.rsplit_once('@').context("a stamp")?.1.parse()?;
            lags.push(unix_us().saturating_sub(sent) as f64);
            received.fetch_add(1, Ordering::Relaxed);
        }
    }
    samples.lock().await.lag_us.extend(lags);
    Ok(())
}

fn ms(sorted: &[f64], q: f64) -> String {
    nearest_rank(sorted, q).map_or_else(|| "-".to_owned(), |us| format!("{:.1}", us / 1e3))
}

async fn run(routers: usize, interval: Duration, seconds: u64, prompts_per_s: f64) -> Result<()> {
    let etcd = EtcdServer::start().await?;
    let etcd_pid = etcd.pid().context("etcd's pid")?.to_string();
    let clients: Vec<EtcdClient> = (0..routers).map(|_| etcd.client()).collect::<Result<_>>()?;
    let revision = clients[0].get_prefix(PREFIX).await?.revision + 1;
    let (stop_publishing, stop_watching) = (CancellationToken::new(), CancellationToken::new());
    let samples = Arc::new(Mutex::new(Samples::default()));
    let (puts, received) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut watchers = Vec::new();
    for (index, client) in clients.iter().enumerate() {
        let task =
            watch(client.clone(), index, revision, stop_watching.clone(), samples.clone(), received.clone());
        watchers.push(tokio::spawn(task));
    }
    let (etcd_cpu, own_cpu, started) = (cpu_seconds(&etcd_pid)?, cpu_seconds("self")?, Instant::now());
    let mut publishers = Vec::new();
    for (index, client) in clients.iter().enumerate() {
        let task = publish(
            client.clone(),
            index,
            interval,
            prompts_per_s,
            stop_publishing.clone(),
            samples.clone(),
            puts.clone(),
        );
        publishers.push(tokio::spawn(task));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop_publishing.cancel();
    for publisher in publishers {
        publisher.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (etcd_cpu, own_cpu) = (cpu_seconds(&etcd_pid)? - etcd_cpu, cpu_seconds("self")? - own_cpu);
    // Every put is in etcd now; the watchers get what is still on its way, or are cut off after 5 s.
    let written = puts.load(Ordering::Relaxed);
    let expected = written * (routers as u64 - 1);
    let drain = Instant::now();
    while received.load(Ordering::Relaxed) < expected && drain.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_watching.cancel();
    for watcher in watchers {
        watcher.await??;
    }
    let mut samples = std::mem::take(&mut *samples.lock().await);
    samples.put_us.sort_by(f64::total_cmp);
    samples.lag_us.sort_by(f64::total_cmp);
    let asked = routers as f64 / interval.as_secs_f64();
    println!(
        "| {routers} | {:.0} / {:.0} | {} / {} | {} / {} | {:.1} % | {:.0} % | {:.0} % |",
        asked,
        written as f64 / elapsed,
        ms(&samples.put_us, 0.5),
        ms(&samples.put_us, 0.99),
        ms(&samples.lag_us, 0.5),
        ms(&samples.lag_us, 0.99),
        100.0 * received.load(Ordering::Relaxed) as f64 / expected.max(1) as f64,
        100.0 * etcd_cpu / elapsed,
        100.0 * own_cpu / elapsed,
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let routers: String = flag(&args, "--routers", "4,16,50".to_owned())?;
    let interval = Duration::from_millis(flag(&args, "--interval-ms", 25)?);
    let seconds: u64 = flag(&args, "--seconds", 10)?;
    let prompts_per_s: f64 = flag(&args, "--prompts-per-s", 3.0)?;
    println!(
        "summaries every {interval:?} per router for {seconds} s, {prompts_per_s} routed prompts/s per router, \
         one etcd (Debian's etcd-server) on this machine"
    );
    println!(
        "| routers | writes/s asked / done | put p50 / p99 ms | to the others p50 / p99 ms | delivered | etcd CPU | clients CPU |"
    );
    println!("|---|---|---|---|---|---|---|");
    for count in routers.split(',') {
        let count: usize =
            count.trim().parse().with_context(|| format!("--routers: {count:?} is no number"))?;
        anyhow::ensure!(count >= 2, "--routers: at least 2 routers share load");
        run(count, interval, seconds, prompts_per_s).await?;
    }
    Ok(())
}
