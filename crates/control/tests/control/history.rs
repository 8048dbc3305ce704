//! Storing the scrapes never holds them up: with the history database locked by another connection, the
//! replicas are still scraped (fresh values in the fleet view), failed writes and shed rounds are counted
//! in the snapshot the fleet view polls and in the app's metrics, and writing resumes once the lock goes.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Result;
use fleet_test_support::{eventually, spawn_sim};
use fleetdeck_api::{FleetSnapshot, FleetSnapshotArgs, ScrapeState};
use fleetdeck_control::{Control, ControlConfig};
use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use tokio_util::sync::CancellationToken;

async fn snapshot(control: &Control) -> Result<FleetSnapshot> {
    Ok(control.fleet().snapshot(FleetSnapshotArgs { window_s: 60, synthetic: 0, skip_series: true }).await?)
}

/// The newest good scrape among the replicas.
fn newest_scrape(snapshot: &FleetSnapshot) -> i64 {
    snapshot
        .replicas
        .iter()
        .filter_map(|r| match r.scrape {
            ScrapeState::Ok { last_good_ms } => Some(last_good_ms),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_database_neither_stops_the_scrapes_nor_fails_silently() -> Result<()> {
    let sim = spawn_sim(2, Default::default()).await?;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("history.sqlite");
    let mut config = ControlConfig::new(sim.urls().to_vec(), db.clone());
    config.scrape_interval = Duration::from_millis(200);
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let control = Control::start(config, stop).await?;
    let wait = Duration::from_secs(60);
    eventually("the first rounds stored", wait, || async {
        let s = snapshot(&control).await?;
        Ok((s.history.written_rounds >= 2).then_some(()))
    })
    .await?;
    assert_eq!(snapshot(&control).await?.history.db_path, db.display().to_string());

    // Another process takes the write lock and keeps it.
    let options = SqliteConnectOptions::from_str("sqlite://")?.filename(&db);
    let mut holder = SqliteConnection::connect_with(&options).await?;
    sqlx::query("BEGIN EXCLUSIVE").execute(&mut holder).await?;
    let locked_at = fleet_base::time::unix_ms_now();

    let stuck = eventually("failed writes and shed rounds to show", wait, || async {
        let s = snapshot(&control).await?;
        Ok((s.history.failing && s.history.failed_writes >= 1 && s.history.shed_rounds >= 1).then_some(s))
    })
    .await?;
    let error = stuck.history.last_error.clone().unwrap_or_default();
    assert!(error.contains("locked") || error.contains("busy"), "{error}");
    // The scrapes went on all the while: the fleet view's values are newer than the lock.
    assert!(newest_scrape(&stuck) > locked_at + 1000, "scrapes stalled behind the database: {stuck:?}");
    let metrics = control.fleet().render_metrics();
    let value = |name: &str| -> f64 {
        metrics.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok())).unwrap_or(-1.0)
    };
    assert!(value("fleetdeck_history_rounds_shed_total ") >= 1.0, "{metrics}");
    assert!(value("fleetdeck_history_write_failures_total ") >= 1.0, "{metrics}");
    assert_eq!(value("fleetdeck_history_failing "), 1.0, "{metrics}");

    // The lock goes: writing resumes by itself.
    sqlx::query("ROLLBACK").execute(&mut holder).await?;
    holder.close().await?;
    let written = stuck.history.written_rounds;
    let recovered = eventually("writes to resume", wait, || async {
        let s = snapshot(&control).await?;
        Ok((!s.history.failing && s.history.written_rounds > written).then_some(s))
    })
    .await?;
    assert!(recovered.history.failed_writes >= stuck.history.failed_writes);
    Ok(())
}

/// One history transaction per scrape interval, however many replicas: 100 replicas found by discovery
/// join one scheduler and one batcher, so the writer gets one round per interval (it got one per replica
/// and interval when each discovered replica had a scheduler and a batcher of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_discovered_replicas_are_written_in_one_transaction_per_interval() -> Result<()> {
    const REPLICAS: usize = 100;
    let sim = spawn_sim(1, Default::default()).await?;
    // A hundred distinct targets, all served by one emulated replica's real vLLM exposition.
    let urls: Vec<String> = (0..REPLICAS).map(|i| format!("{}/metrics?replica={i}", sim.urls()[0])).collect();
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("fleet.json");
    std::fs::write(&file, serde_json::to_string(&urls)?)?;
    let mut config = ControlConfig::new(Vec::new(), dir.path().join("history.sqlite"));
    let interval = Duration::from_millis(500);
    config.scrape_interval = interval;
    config.discovery.push(fleetdeck_control::DiscoverySource::File(file));
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let started = std::time::Instant::now();
    let control = Control::start(config, stop).await?;
    let pool =
        sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("history.sqlite").display()))
            .await?;
    // Every replica stored at least three times.
    let samples = eventually("three samples of every replica", Duration::from_secs(60), || {
        let pool = pool.clone();
        async move {
            let per_replica: Vec<(i64,)> =
                sqlx::query_as("SELECT COUNT(*) FROM samples GROUP BY replica_id").fetch_all(&pool).await?;
            let enough = per_replica.len() == REPLICAS && per_replica.iter().all(|(n,)| *n >= 3);
            Ok(enough.then(|| per_replica.iter().map(|(n,)| *n).sum::<i64>()))
        }
    })
    .await?;
    let rounds = snapshot(&control).await?.history.written_rounds;
    // The batcher ticks at most once per interval (the first tick at once): this bound holds whatever the
    // machine's speed, and a batcher per replica would exceed it a hundredfold.
    let intervals = (started.elapsed().as_secs_f64() / interval.as_secs_f64()).floor() as u64 + 1;
    eprintln!(
        "{REPLICAS} discovered replicas: {rounds} history transactions in {intervals} scrape intervals"
    );
    assert!(
        rounds <= intervals,
        "{rounds} rounds written in {intervals} intervals for {REPLICAS} replicas ({samples} samples): \
         more than one transaction per interval"
    );
    assert!(samples >= 3 * REPLICAS as i64 && rounds >= 3, "{rounds} rounds, {samples} samples");
    Ok(())
}
