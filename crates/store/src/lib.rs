//! The history store: replicas and their scraped signals in one SQLite file (WAL mode).
//!
//! Migrations live in the repository's top-level `migrations/` and are embedded at compile
//! time; opening a store applies any that are missing. Writes are batched: one transaction
//! per scrape round, so a crash loses at most the round in flight and never half of one.
//! The store knows nothing of scraping or the UI; it stores what it is given.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use fleetdeck_api::Signals;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Row, migrate::Migrator};

/// The schema, from `migrations/`.
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");

/// Errors of the history store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the history database {path}: {source}")]
    Open { path: String, source: sqlx::Error },
    #[error("cannot bring the history database {path} up to date: {source}")]
    Migrate { path: String, source: sqlx::migrate::MigrateError },
    #[error("history database error: {0}")]
    Query(#[from] sqlx::Error),
}

/// One scrape's signals for one replica.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleRow {
    pub url: String,
    pub model: String,
    pub ts_ms: i64,
    pub signals: Signals,
}

/// A handle to the history database; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: SqlitePool,
}

impl Store {
    /// Opens (creating if needed) the database at `path` and applies pending migrations.
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        let shown = path.display().to_string();
        let options = SqliteConnectOptions::from_str("sqlite://")
            .map_err(|source| StoreError::Open { path: shown.clone(), source })?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // NORMAL is durable across application crashes in WAL mode; only an OS crash
            // can lose the last transactions, which is acceptable for telemetry.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(|source| StoreError::Open { path: shown.clone(), source })?;
        MIGRATOR.run(&pool).await.map_err(|source| StoreError::Migrate { path: shown, source })?;
        Ok(Self { pool })
    }

    /// Writes one batch of samples in a single transaction.
    pub async fn insert_samples(&self, batch: &[SampleRow]) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        for row in batch {
            sqlx::query("INSERT OR IGNORE INTO replicas (url, model, first_seen_ms) VALUES (?, ?, ?)")
                .bind(&row.url)
                .bind(&row.model)
                .bind(row.ts_ms)
                .execute(&mut *tx)
                .await?;
            let s = &row.signals;
            sqlx::query(
                "INSERT OR REPLACE INTO samples
                   (replica_id, ts_ms, queue_depth, running, kv_usage, hit_rate, ttft_p50_s, ttft_p95_s)
                 SELECT id, ?, ?, ?, ?, ?, ?, ? FROM replicas WHERE url = ? AND model = ?",
            )
            .bind(row.ts_ms)
            .bind(s.queue_depth)
            .bind(s.running)
            .bind(s.kv_usage)
            .bind(s.hit_rate)
            .bind(s.ttft_p50_s)
            .bind(s.ttft_p95_s)
            .bind(&row.url)
            .bind(&row.model)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// TTFT p95 since `since_ms`, per replica URL (oldest point first); intervals without
    /// traffic (NULL) are left out rather than drawn as zero.
    pub async fn ttft_p95_series(&self, since_ms: i64) -> Result<Vec<(String, Vec<(i64, f64)>)>, StoreError> {
        let rows = sqlx::query(
            "SELECT r.url, s.ts_ms, s.ttft_p95_s FROM samples s JOIN replicas r ON r.id = s.replica_id
             WHERE s.ts_ms >= ? AND s.ttft_p95_s IS NOT NULL ORDER BY r.url, s.ts_ms",
        )
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?;
        let mut series: Vec<(String, Vec<(i64, f64)>)> = Vec::new();
        for row in rows {
            let url: String = row.try_get(0)?;
            let point = (row.try_get::<i64, _>(1)?, row.try_get::<f64, _>(2)?);
            match series.last_mut() {
                Some((last, points)) if *last == url => points.push(point),
                _ => series.push((url, vec![point])),
            }
        }
        Ok(series)
    }

    /// Number of stored samples (for tests and diagnostics).
    pub async fn sample_count(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM samples").fetch_one(&self.pool).await?)
    }

    /// Closes the pool, checkpointing the WAL.
    pub async fn close(self) {
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(url: &str, ts_ms: i64, p95: Option<f64>) -> SampleRow {
        SampleRow {
            url: url.into(),
            model: "m".into(),
            ts_ms,
            signals: Signals { ttft_p95_s: p95, queue_depth: Some(1.0), ..Signals::default() },
        }
    }

    #[tokio::test]
    async fn samples_survive_reopening_and_series_skip_idle_intervals() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.sqlite");
        let store = Store::open(&path).await.unwrap();
        store
            .insert_samples(&[row("http://a", 1000, Some(0.2)), row("http://b", 1000, Some(0.5))])
            .await
            .unwrap();
        store.insert_samples(&[row("http://a", 2000, None), row("http://a", 3000, Some(0.3))]).await.unwrap();
        store.close().await;

        let store = Store::open(&path).await.unwrap();
        assert_eq!(store.sample_count().await.unwrap(), 4);
        let series = store.ttft_p95_series(0).await.unwrap();
        assert_eq!(
            series,
            vec![
                ("http://a".to_string(), vec![(1000, 0.2), (3000, 0.3)]),
                ("http://b".to_string(), vec![(1000, 0.5)]),
            ]
        );
        assert_eq!(store.ttft_p95_series(2500).await.unwrap()[0].1, vec![(3000, 0.3)]);
    }

    #[tokio::test]
    async fn opening_a_file_that_is_not_a_database_says_which_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not-a-db.sqlite");
        std::fs::write(&path, b"this is not sqlite, just text that fills the header page").unwrap();
        let err = Store::open(&path).await.unwrap_err();
        assert!(err.to_string().contains("not-a-db.sqlite"), "{err}");
    }
}
