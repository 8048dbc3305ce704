//! How fast a new policy reaches a fleet of routers: from the app's push to the last router's swap, through
//! etcd (one guarded txn; every router watches the key) against the app's per-router HTTP push (read the
//! version, then PUT with If-Match, to every router at once), over the same routers and specs.
//!
//! Run by `cargo xtask bench etcd` (release build, FLEETDECK_BIN_DIR pointing at its binaries); a real etcd
//! (Debian's etcd-server) and fleet-router processes with one worker thread each on loopback.
//!
//! Each sample is `max over routers (applied_at_us) - t0`: `t0` is taken right before the app's push call
//! (so it includes the txn or the HTTP calls themselves), `applied_at_us` is the time each router put the
//! version in force, as it reports in `/admin/state` (the same machine's clock). Routers are read after
//! every router reports the version, so polling never delays a swap's timestamp. Percentiles are nearest
//! rank: over 20 pushes, p99 is the slowest push.
//!
//! ```text
//! cargo run --release -p fleetdeck-control --example etcd_fanout -- [--routers 50] [--pushes 20]
//! ```

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use fleet_base::quantile::nearest_rank;
use fleet_test_support::etcd::EtcdServer;
use fleet_test_support::process::{ChildProcess, spawn_router_process};
use fleet_test_support::spawn_sim;
use fleetdeck_api::{EtcdKeyArgs, EtcdPushArgs, PushArgs, PushResult, PushTarget};
use fleetdeck_control::fleet_etcd::EtcdConfig;
use fleetdeck_control::{Control, ControlConfig, EtcdPolicyConfig, RouterTarget};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const KEY: &str = "/fleetdeck/bench/policy";
const TOKEN: &str = "etcd-fanout-bench-token";
/// The p99 target of issue 26 for the etcd path.
const TARGET_P99: Duration = Duration::from_secs(1);

fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

fn spec(i: usize) -> String {
    format!(r#"{{"policy": "{}"}}"#, ["least_load", "power_of_two", "random", "round_robin"][i % 4])
}

fn flag(args: &[String], name: &str, default: usize) -> Result<usize> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => {
            args.get(i + 1).and_then(|v| v.parse().ok()).with_context(|| format!("{name} needs a number"))
        }
    }
}

struct Fleet {
    urls: Vec<String>,
    _processes: Vec<ChildProcess>,
}

async fn routers(n: usize, replica: &str, token_file: &std::path::Path, etcd: Option<&str>) -> Result<Fleet> {
    let token_file = token_file.to_string_lossy().into_owned();
    let mut args: Vec<String> =
        ["--listen", "127.0.0.1:0", "--replica", replica, "--admin-token-file", &token_file]
            .map(str::to_owned)
            .to_vec();
    args.extend(["--worker-threads", "1", "--health-interval-ms", "5000"].map(str::to_owned));
    if let Some(etcd) = etcd {
        args.extend(["--policy-etcd", etcd, "--policy-key", KEY].map(str::to_owned));
    }
    let started = futures_util::future::join_all((0..n).map(|_| spawn_router_process(&args))).await;
    let (processes, urls) = started.into_iter().collect::<Result<Vec<_>>>()?.into_iter().unzip();
    Ok(Fleet { urls, _processes: processes })
}

/// Waits until every router reports `done(state)`, then returns their `applied_at_us`.
async fn applied_at(
    http: &reqwest::Client,
    urls: &[String],
    done: impl Fn(&str, &Value) -> bool,
) -> Result<Vec<u64>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let reads = urls.iter().map(|url| async move {
            let response = http.get(format!("{url}/admin/state")).bearer_auth(TOKEN).send().await?;
            anyhow::Ok(response.error_for_status()?.json::<Value>().await?)
        });
        let states: Vec<Value> =
            futures_util::future::join_all(reads).await.into_iter().collect::<Result<_>>()?;
        if urls.iter().zip(&states).all(|(url, state)| done(url, state)) {
            return states
                .iter()
                .map(|s| s["policy"]["applied_at_us"].as_u64().context("a router without applied_at_us"))
                .collect();
        }
        if Instant::now() > deadline {
            bail!("the routers did not all take the push within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn control(
    dir: &std::path::Path,
    urls: &[String],
    store: Option<EtcdPolicyConfig>,
    stop: &CancellationToken,
) -> Result<Control> {
    let mut config = ControlConfig::new(Vec::new(), dir.join("history.db"));
    config.routers = urls
        .iter()
        .map(|url| RouterTarget { url: url.clone(), token: Some(TOKEN.into()), ..RouterTarget::default() })
        .collect();
    config.etcd_policy = store;
    Control::start(config, stop.child_token()).await
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n = flag(&args, "--routers", 50)?;
    let pushes = flag(&args, "--pushes", 20)?;
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN)?;
    let sim = spawn_sim(1, Default::default()).await?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();

    // Through etcd.
    let etcd = EtcdServer::start().await?;
    etcd.client()?.put(KEY, spec(0).as_bytes()).await?;
    let fleet = routers(n, &sim.urls()[0], &token_file, Some(&etcd.url())).await?;
    let store = EtcdPolicyConfig { etcd: EtcdConfig::new(&etcd.url()), key: KEY.into() };
    let app = control(&dir.path().join("etcd"), &fleet.urls, Some(store), &stop).await?;
    let mut via_etcd = Vec::new();
    // The app's own call (the guarded txn, acknowledged once etcd has it on disk): part of each sample.
    let mut txn = Vec::new();
    for i in 1..=pushes {
        let reviewed = app.etcd().policy(EtcdKeyArgs::default()).await?;
        let t0 = unix_us();
        let report = app
            .etcd()
            .push(EtcdPushArgs { text: spec(i), if_revision: reviewed.revision, key: None, operator: None })
            .await?;
        txn.push(Duration::from_micros(unix_us().saturating_sub(t0)));
        let applied = applied_at(&http, &fleet.urls, |_, s| {
            s["policy"]["store_revision"].as_i64() == Some(report.revision)
        })
        .await?;
        via_etcd.push(Duration::from_micros(applied.into_iter().max().unwrap_or(t0).saturating_sub(t0)));
    }
    drop(fleet);

    // Per-router HTTP push, the app's path for fleets without a store.
    let fleet = routers(n, &sim.urls()[0], &token_file, None).await?;
    let app = control(&dir.path().join("http"), &fleet.urls, None, &stop).await?;
    let mut via_http = Vec::new();
    for i in 1..=pushes {
        let targets: Vec<PushTarget> =
            fleet.urls.iter().map(|url| PushTarget { url: url.clone(), if_version: None }).collect();
        let t0 = unix_us();
        let report = app.rollout().push_policy(PushArgs { text: spec(i), targets, operator: None }).await?;
        if let Some(failed) = report.results.iter().find(|r| !matches!(r.result, PushResult::Applied { .. }))
        {
            bail!("the HTTP push did not reach every router: {failed:?}");
        }
        // The PUT answers once the router swapped, so every router is on its version already.
        let version = |url: &str| {
            report.results.iter().find(|r| r.url == url).and_then(|r| match r.result {
                PushResult::Applied { version } => Some(version),
                _ => None,
            })
        };
        let applied =
            applied_at(&http, &fleet.urls, |url, s| s["policy"]["version"].as_u64() == version(url)).await?;
        via_http.push(Duration::from_micros(applied.into_iter().max().unwrap_or(t0).saturating_sub(t0)));
    }

    // Milliseconds, ascending (nearest rank picks a measured sample, so converting first changes nothing).
    let sorted_ms = |samples: &[Duration]| {
        let mut values: Vec<f64> = samples.iter().copied().map(ms).collect();
        values.sort_by(f64::total_cmp);
        values
    };
    let (via_etcd, txn, via_http) = (sorted_ms(&via_etcd), sorted_ms(&txn), sorted_ms(&via_http));
    let percentile = |sorted: &[f64], q: f64| nearest_rank(sorted, q).unwrap_or(f64::NAN);
    println!(
        "policy fan-out to {n} routers (--worker-threads 1), {pushes} pushes each, push call to last router's swap:"
    );
    println!("{:<34} {:>9} {:>9} {:>9}", "path", "p50 ms", "p99 ms", "min ms");
    for (name, samples) in
        [("etcd: one txn, routers watch", &via_etcd), ("HTTP: GET + PUT per router", &via_http)]
    {
        println!(
            "{name:<34} {:>9.1} {:>9.1} {:>9.1}",
            percentile(samples, 0.5),
            percentile(samples, 0.99),
            samples[0]
        );
    }
    println!(
        "the app's txn call alone (answered once etcd has it on disk; routers may swap before it returns): p50 {:.1} ms, p99 {:.1} ms",
        percentile(&txn, 0.5),
        percentile(&txn, 0.99)
    );
    let (e50, h50) = (percentile(&via_etcd, 0.5), percentile(&via_http, 0.5));
    let (e99, h99) = (percentile(&via_etcd, 0.99), percentile(&via_http, 0.99));
    println!("ratio HTTP / etcd: p50 {:.2}, p99 {:.2}", h50 / e50.max(1e-3), h99 / e99.max(1e-3));
    let verdict = if e99 <= ms(TARGET_P99) { "met" } else { "MISSED" };
    println!(
        "target: all {n} routers on a new version within {} ms p99 through etcd: {verdict}",
        TARGET_P99.as_millis()
    );
    Ok(())
}
