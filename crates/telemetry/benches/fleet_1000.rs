//! The fleet-scale benchmark: 1,000 emulated replicas (fleet-sim, in this process on their own
//! runtime thread) scraped once a second by the scheduler on a single-threaded runtime, and
//! the scheduler thread's CPU time measured from `/proc/thread-self/schedstat` over a fixed
//! number of rounds. The goal is at most 30 % of one core; the bench prints the figure and
//! fails above it, or when fewer than 95 % of the due scrapes succeeded.
//!
//! `cargo bench -p fleet-telemetry --bench fleet_1000` runs it in full (about 30 s).
//! Run without `--bench` (as `cargo test --benches` does) it makes a 20-target smoke run.
//! `FLEET_BENCH_TARGETS` and `FLEET_BENCH_ROUNDS` override the size.

use std::process::ExitCode;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use fleet_sim::{Fleet, ModelConfig};
use fleet_telemetry::ScrapeLimits;
use fleet_telemetry::scheduler::{Scheduler, SchedulerConfig, TargetSpec};
use tokio_util::sync::CancellationToken;

const CPU_LIMIT: f64 = 0.30;

/// Nanoseconds this thread has run on a CPU (first field of schedstat).
fn thread_cpu_ns() -> Result<u64, String> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")
        .map_err(|e| format!("cannot read /proc/thread-self/schedstat ({e}); this bench needs Linux"))?;
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("unexpected schedstat contents: {text:?}"))
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> ExitCode {
    let full = std::env::args().any(|a| a == "--bench");
    let targets = env_or("FLEET_BENCH_TARGETS", if full { 1000 } else { 20 });
    let rounds = env_or("FLEET_BENCH_ROUNDS", if full { 20 } else { 2 });
    match run(targets, rounds) {
        Ok(report) => {
            println!("{}", report.text);
            if report.pass { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(error) => {
            eprintln!("fleet_1000 bench failed: {error}");
            ExitCode::FAILURE
        }
    }
}

struct Report {
    text: String,
    pass: bool,
}

fn run(targets: usize, rounds: usize) -> Result<Report, String> {
    let stop = CancellationToken::new();
    let (urls_tx, urls_rx) = std_mpsc::channel();
    let sim_stop = stop.clone();
    // The emulated fleet gets its own runtime and thread, so its CPU is not counted.
    let sim = std::thread::Builder::new()
        .name("fleet-sim".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let mut listeners = Vec::with_capacity(targets);
                for _ in 0..targets {
                    listeners
                        .push(tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?);
                }
                let fleet =
                    Fleet::spawn(listeners, fleet_sim::DEFAULT_MODEL, &ModelConfig::default(), &sim_stop)
                        .map_err(|e| e.to_string())?;
                let _ = urls_tx.send(fleet.urls.clone());
                sim_stop.cancelled().await;
                Ok::<(), String>(())
            })
        })
        .map_err(|e| e.to_string())?;
    let urls: Vec<String> = urls_rx.recv().map_err(|_| "the emulated fleet did not start".to_string())?;

    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let result = runtime.block_on(async {
        let specs: Vec<TargetSpec> = urls
            .iter()
            .map(|u| TargetSpec {
                url: u.clone(),
                interval: Duration::from_secs(1),
                limits: ScrapeLimits { timeout: Duration::from_secs(2), max_bytes: 1 << 20 },
            })
            .collect();
        let client = fleet_telemetry::scrape::client(Duration::from_secs(2)).map_err(|e| e.to_string())?;
        let (scheduler, mut observations) =
            Scheduler::start(specs, SchedulerConfig::default(), client, stop.clone());
        // Consume observations as a history writer would.
        tokio::spawn(async move { while observations.recv().await.is_some() {} });

        // Warm up: every target scraped at least twice (connections open, windows filled).
        let warm_deadline = Instant::now() + Duration::from_secs(30);
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if scheduler.statuses().iter().all(|s| s.scrapes_ok >= 2) {
                break;
            }
            if Instant::now() > warm_deadline {
                let bad: Vec<String> = scheduler
                    .statuses()
                    .into_iter()
                    .filter(|s| s.scrapes_ok < 2)
                    .map(|s| format!("{}: {:?}", s.url, s.error))
                    .take(3)
                    .collect();
                return Err(format!("targets not scraped within 30 s of start: {bad:?}"));
            }
        }
        let count = |s: &Scheduler| {
            s.statuses()
                .iter()
                .map(|t| (t.scrapes_ok, t.scrapes_failed))
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
        };
        let (ok0, failed0) = count(&scheduler);
        let (cpu0, wall0) = (thread_cpu_ns()?, Instant::now());
        tokio::time::sleep(Duration::from_secs(rounds as u64)).await;
        let (cpu1, wall) = (thread_cpu_ns()?, wall0.elapsed());
        let (ok1, failed1) = count(&scheduler);
        Ok::<_, String>((cpu1 - cpu0, wall, ok1 - ok0, failed1 - failed0))
    });
    stop.cancel();
    let _ = sim.join();
    let (cpu_ns, wall, ok, failed) = result?;
    let share = cpu_ns as f64 / wall.as_nanos() as f64;
    let due = (targets * rounds) as f64;
    let pass = share <= CPU_LIMIT && ok as f64 >= 0.95 * due;
    Ok(Report {
        text: format!(
            "fleet_1000: {targets} targets at 1 Hz for {rounds} rounds ({:.1} s): {ok} scrapes ok ({:.0}/s), {failed} failed; \
             scheduler thread CPU {:.3} s = {:.1} % of one core (limit {:.0} %): {}",
            wall.as_secs_f64(),
            ok as f64 / wall.as_secs_f64(),
            cpu_ns as f64 / 1e9,
            share * 100.0,
            CPU_LIMIT * 100.0,
            if pass { "PASS" } else { "FAIL" }
        ),
        pass,
    })
}
