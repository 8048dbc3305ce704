//! Helpers shared by the store's tests: opening fresh databases and making sample rounds.

use fleet_store::{SampleRow, SampleSignals, Store};
use sqlx::sqlite::SqliteConnectOptions;

/// 2025-06-01T00:00:00Z: a fixed "now" so that every test is deterministic.
pub const T0: i64 = 1_748_736_000_000;
pub const HOUR_MS: i64 = 3_600_000;
pub const DAY_MS: i64 = 24 * HOUR_MS;

pub async fn open(options: SqliteConnectOptions) -> Store {
    Store::connect_with(options).await.expect("open a fresh history database")
}

/// A sample of replica `r` at `ts_ms` with the given signals.
pub fn sample(r: usize, ts_ms: i64, signals: SampleSignals) -> SampleRow {
    SampleRow {
        url: format!("http://replica-{r}"),
        model: "m".into(),
        ts_ms,
        signals,
        ..SampleRow::default()
    }
}

/// Stores one round per `step_ms` in `[from, to)`, each built by `make(replica, ts, k)`.
pub async fn fill(
    store: &Store,
    replicas: usize,
    from: i64,
    to: i64,
    step_ms: i64,
    make: impl Fn(usize, i64, i64) -> SampleRow,
) {
    let (mut ts, mut k) = (from, 0);
    while ts < to {
        let round: Vec<SampleRow> = (0..replicas).map(|r| make(r, ts, k)).collect();
        store.insert_samples(&round).await.unwrap();
        ts += step_ms;
        k += 1;
    }
}

pub async fn count(store: &Store, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(store.pool()).await.unwrap()
}
