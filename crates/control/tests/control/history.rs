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
    Ok(control.fleet_snapshot(FleetSnapshotArgs { window_s: 60, synthetic: 0, skip_series: true }).await?)
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
    let metrics = control.render_metrics();
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
