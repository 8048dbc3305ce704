//! Downsampling into the 10 s and 1 min tiers, retention, and maintenance beside ingestion.

use fleet_store::{MaintenanceConfig, Retention, SampleRow, SampleSignals, Tier};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

use crate::common::{DAY_MS, HOUR_MS, T0, count, fill, open, sample};

fn no_grace() -> MaintenanceConfig {
    MaintenanceConfig { grace_ms: 0, ..MaintenanceConfig::default() }
}

/// Replica 0 reports queue = second within the minute (0..59) and a hit rate; replica 1
/// reports queue 10 and no hit rate (an engine without a prefix cache).
fn two_replicas(r: usize, ts: i64, _k: i64) -> SampleRow {
    let second = ((ts - T0) / 1000 % 60) as f64;
    let signals = if r == 0 {
        SampleSignals {
            queue_depth: Some(second),
            running: Some(1.0),
            hit_rate: Some(0.5),
            ..SampleSignals::default()
        }
    } else {
        SampleSignals { queue_depth: Some(10.0), running: Some(1.0), ..SampleSignals::default() }
    };
    sample(r, ts, signals)
}

#[sqlx::test(migrations = false)]
async fn raw_samples_become_10s_and_1m_means_per_replica_and_per_fleet(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store = open(options).await;
    fill(&store, 2, T0, T0 + 60_000, 1000, two_replicas).await;
    let report = store.maintain(T0 + 60_000, &no_grace()).await.unwrap();
    assert_eq!((report.buckets_10s, report.buckets_1m), (12, 2));

    // Replica 0's first 10 s bucket averages queue 0..9 = 4.5 over 10 samples.
    let first: (i64, f64, Option<f64>) = sqlx::query_as(
        "SELECT n, queue_depth, hit_rate FROM samples_10s t JOIN replicas r ON r.id = t.replica_id
         WHERE r.url = 'http://replica-0' AND bucket_ms = ?",
    )
    .bind(T0)
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(first, (10, 4.5, Some(0.5)));
    // A replica that never reports a hit rate keeps NULL, not 0.
    let missing: Option<f64> = sqlx::query_scalar(
        "SELECT hit_rate FROM samples_1m t JOIN replicas r ON r.id = t.replica_id WHERE r.url = 'http://replica-1'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(missing, None);
    // The fleet minute: hit rate only from replica 0; queue mean of 29.5 and 10.
    let fleet: (i64, i64, Option<f64>, f64) =
        sqlx::query_as("SELECT replicas, samples, hit_rate, queue_depth FROM fleet_1m WHERE bucket_ms = ?")
            .bind(T0)
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(fleet, (2, 120, Some(0.5), 19.75));
    assert_eq!(store.tier_progress(Tier::TenSeconds).await.unwrap(), Some(T0 + 60_000));

    // A second pass finds nothing new to summarise.
    let again = store.maintain(T0 + 60_000, &no_grace()).await.unwrap();
    assert_eq!((again.buckets_10s, again.buckets_1m), (0, 0));
}

#[sqlx::test(migrations = false)]
async fn buckets_inside_the_grace_period_wait_for_late_rounds(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store = open(options).await;
    fill(&store, 1, T0, T0 + 30_000, 1000, two_replicas).await;
    let config = MaintenanceConfig { grace_ms: 15_000, ..MaintenanceConfig::default() };
    store.maintain(T0 + 30_000, &config).await.unwrap();
    // Only [T0, T0 + 10 s) is older than now - grace (T0 + 15 s) for a whole bucket.
    assert_eq!(count(&store, "SELECT COUNT(*) FROM samples_10s").await, 1);
    assert_eq!(store.tier_progress(Tier::TenSeconds).await.unwrap(), Some(T0 + 10_000));
    store.maintain(T0 + 45_000, &config).await.unwrap();
    assert_eq!(count(&store, "SELECT COUNT(*) FROM samples_10s").await, 3);
}

#[sqlx::test(migrations = false)]
async fn each_tier_expires_after_its_retention_and_raw_waits_for_summaries(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store = open(options).await;
    // One round a minute for 2 h, then one round "now" 100 days later.
    fill(&store, 2, T0, T0 + 2 * HOUR_MS, 60_000, two_replicas).await;
    let config = MaintenanceConfig {
        retention: Retention { raw_ms: HOUR_MS, ten_seconds_ms: 3 * HOUR_MS, one_minute_ms: 5 * HOUR_MS },
        ..no_grace()
    };
    // Nothing has been summarised yet: expiring alone must keep every raw sample.
    let (raw, _, _) = store.expire(T0 + 10 * HOUR_MS, &config.retention, 1000).await.unwrap();
    assert_eq!(raw, 0);
    assert_eq!(store.sample_count().await.unwrap(), 240);

    // At T0 + 2.5 h: raw older than T0 + 1.5 h goes, both tiers are still complete.
    let report = store.maintain(T0 + 2 * HOUR_MS + 30 * 60_000, &config).await.unwrap();
    assert_eq!(report.expired_raw, 2 * 90);
    assert_eq!(store.sample_count().await.unwrap(), 2 * 30);
    assert_eq!(count(&store, "SELECT COUNT(*) FROM samples_10s").await, 240);
    assert_eq!(count(&store, "SELECT MIN(ts_ms) FROM samples").await, T0 + 90 * 60_000);

    // At T0 + 4 h the 10 s tier keeps its last 3 h; the 1 min tier still has everything.
    store.maintain(T0 + 4 * HOUR_MS, &config).await.unwrap();
    assert_eq!(count(&store, "SELECT COUNT(*) FROM samples").await, 0);
    assert_eq!(count(&store, "SELECT MIN(bucket_ms) FROM samples_10s").await, T0 + HOUR_MS);
    assert_eq!(count(&store, "SELECT MIN(bucket_ms) FROM fleet_10s").await, T0 + HOUR_MS);
    assert_eq!(count(&store, "SELECT COUNT(*) FROM samples_1m").await, 240);

    // Far later, everything old is gone but replicas keep their identity.
    store.maintain(T0 + 100 * DAY_MS, &config).await.unwrap();
    for table in ["samples_10s", "samples_1m", "fleet_10s", "fleet_1m"] {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(n, 0, "{table} still has rows past its retention");
    }
    assert_eq!(count(&store, "SELECT COUNT(*) FROM replicas").await, 2);
}

#[sqlx::test(migrations = false)]
async fn ingestion_keeps_landing_while_maintenance_runs(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store = open(options).await;
    // A backlog of 6 h at 10 replicas for maintenance to chew through in small chunks.
    fill(&store, 10, T0, T0 + 6 * HOUR_MS, 10_000, two_replicas).await;
    let config = MaintenanceConfig { chunk_ms: 10 * 60_000, delete_batch: 500, ..no_grace() };
    let maintenance = {
        let store = store.clone();
        tokio::spawn(async move { store.maintain(T0 + 30 * HOUR_MS, &config).await })
    };
    // Rounds written meanwhile (after the summarised range) all commit.
    fill(&store, 10, T0 + 30 * HOUR_MS, T0 + 30 * HOUR_MS + 200_000, 1000, two_replicas).await;
    let report = maintenance.await.unwrap().unwrap();
    assert_eq!(report.expired_raw, 10 * 6 * 360, "the whole backlog is past raw retention");
    assert_eq!(store.sample_count().await.unwrap(), 10 * 200);
}
