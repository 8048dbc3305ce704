//! The history store: replicas and their scraped signals in one SQLite file (WAL mode).
//!
//! Migrations live in the repository's top-level `migrations/` and are embedded at compile
//! time; opening a store applies any that are missing. Writes are batched: one transaction
//! per scrape round, so a crash loses at most the round in flight and never half of one.
//! Raw samples are summarised into 10 s and 1 min tiers and expired in the background
//! (`tiers`); `compare` answers "did it help?" from the fleet-level tiers; `audit` keeps
//! fleets, routers, policy versions, pushes and annotations. The store knows nothing of
//! scraping or the UI; it stores what it is given.

mod audit;
mod compare;
pub mod secrets;
mod series;
mod tiers;
pub mod timefmt;

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Row, migrate::Migrator};

pub use audit::{
    Annotation, AnnotationKind, NewAnnotation, NewPolicyVersion, PolicyVersion, PolicyWindow, PushOutcome,
    PushRecord, active_windows,
};
pub use compare::{
    CompareOptions, Comparison, FleetBucket, METRIC_NAMES, MetricDiff, WindowSpec, WindowSummary,
};
pub use series::{SeriesPoint, SeriesSource};
pub use tiers::{MaintenanceConfig, MaintenanceReport, Retention, Tier};
pub use timefmt::TimeWindow;

/// The schema, from `migrations/`.
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");

/// The fleet replicas and policies belong to unless told otherwise (created by migration 2).
pub const DEFAULT_FLEET: &str = "default";

/// Errors of the history store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the history database {path}: {source}")]
    Open { path: String, source: sqlx::Error },
    #[error("cannot make the history database {path} readable by its owner only (mode 0600): {source}")]
    Permissions { path: String, source: std::io::Error },
    #[error("cannot bring the history database {path} up to date: {source}")]
    Migrate { path: String, source: sqlx::migrate::MigrateError },
    #[error("history database error: {0}")]
    Query(#[from] sqlx::Error),
    #[error("no fleet named {name:?} in the history; known fleets: {}", known.join(", "))]
    UnknownFleet { name: String, known: Vec<String> },
    #[error("no policy version {label:?} in the history; known versions: {}", if known.is_empty() { "none recorded yet".to_string() } else { known.join(", ") })]
    UnknownPolicy { label: String, known: Vec<String> },
    #[error(
        "policy version {label:?} was never acknowledged by a router (no successful push reporting it), so it has no active window to compare; compare time windows with --a/--b instead"
    )]
    PolicyNeverActive { label: String },
    #[error("no router {url:?} is registered in the history; register it before recording pushes to it")]
    UnknownRouter { url: String },
    #[error("policy version {label:?} already exists; versions are immutable, record a new label")]
    DuplicatePolicy { label: String },
    #[error("the window {window} is empty or reversed: its start must come before its end")]
    BadWindow { window: String },
}

/// The signals a sample stores, one column each; `None` (NULL) means "not provided or no data in the
/// window", never zero. The store's own type, so the history does not change with the UI's contract.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SampleSignals {
    /// Requests waiting for admission.
    pub queue_depth: Option<f64>,
    /// Requests in the running batch.
    pub running: Option<f64>,
    /// KV-cache usage, 0..=1.
    pub kv_usage: Option<f64>,
    /// Prefix-cache hits / queries over the signal window.
    pub hit_rate: Option<f64>,
    /// TTFT median over the signal window, in seconds.
    pub ttft_p50_s: Option<f64>,
    /// TTFT 95th percentile over the signal window, in seconds.
    pub ttft_p95_s: Option<f64>,
}

/// One scrape's signals for one replica.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SampleRow {
    pub url: String,
    pub model: String,
    pub ts_ms: i64,
    pub signals: SampleSignals,
    /// Prompt (prefill) tokens per second since the previous scrape; `None`: not reported.
    pub prompt_tok_s: Option<f64>,
    /// Generated tokens per second since the previous scrape; `None`: not reported.
    pub gen_tok_s: Option<f64>,
}

/// A handle to the history database; cheap to clone.
///
/// Two pools over the one file: samples (and every read) go through `pool`, whose connections commit with
/// `synchronous=NORMAL` (in WAL mode durable across an application crash; an OS crash or power cut may
/// lose the last rounds, which telemetry can afford). The audit trail (fleets, routers, policy versions,
/// pushes, annotations) is written through `audit_pool`, one connection with `synchronous=FULL`, so an
/// acknowledged change of the fleet's policy survives a power cut too. `synchronous` is a per-connection
/// setting that cannot change inside a transaction, so a connection of its own is the one way to give
/// audit commits FULL without slowing every sample round (and it syncs the WAL up to its commit, samples
/// before it included).
#[derive(Debug, Clone)]
pub struct Store {
    pool: SqlitePool,
    audit_pool: SqlitePool,
    /// Replica ids by (url, model), filled only after the transaction that created them
    /// committed, so a rolled-back batch cannot leave a dangling id behind.
    replica_ids: Arc<Mutex<HashMap<(String, String), i64>>>,
}

/// Creates `path` (mode 0600) if it does not exist, and takes group and other permissions away from it and
/// from SQLite's `-wal` and `-shm` files beside it when they exist (Unix; elsewhere nothing to do).
fn owner_only(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        // `create` without `truncate`: an existing database is opened as it is, never emptied.
        std::fs::OpenOptions::new().append(true).create(true).mode(0o600).open(path)?;
        for suffix in ["", "-wal", "-shm"] {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            let file = std::path::PathBuf::from(name);
            match std::fs::metadata(&file) {
                Ok(meta) if meta.permissions().mode() & 0o077 != 0 => {
                    let mode = meta.permissions().mode() & 0o700;
                    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))?;
                }
                Ok(_) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

impl Store {
    /// Opens (creating if needed) the database at `path` and applies pending migrations. The file (and the
    /// WAL and shared-memory files SQLite makes beside it, which take its mode) is readable by its owner only
    /// (0600, as the token files): it holds the fleet's addresses, its policies and who pushed them. A file
    /// others could read is made 0600 first.
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        let shown = path.display().to_string();
        owner_only(path).map_err(|source| StoreError::Permissions { path: shown.clone(), source })?;
        let options = SqliteConnectOptions::from_str("sqlite://")
            .map_err(|source| StoreError::Open { path: shown.clone(), source })?
            .filename(path)
            .create_if_missing(true);
        Self::connect_with(options).await
    }

    /// Opens the database `options` point at with the store's settings (WAL, foreign keys,
    /// busy timeout) and applies pending migrations. Tests use it on fresh databases.
    pub async fn connect_with(options: SqliteConnectOptions) -> Result<Self, StoreError> {
        let shown = options.get_filename().display().to_string();
        let options = options
            .journal_mode(SqliteJournalMode::Wal)
            // NORMAL is durable across application crashes in WAL mode; only an OS crash
            // can lose the last transactions, which is acceptable for telemetry.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let audit_options = options.clone().synchronous(SqliteSynchronous::Full);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(|source| StoreError::Open { path: shown.clone(), source })?;
        MIGRATOR.run(&pool).await.map_err(|source| StoreError::Migrate { path: shown.clone(), source })?;
        let audit_pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(audit_options)
            .await
            .map_err(|source| StoreError::Open { path: shown, source })?;
        Ok(Self { pool, audit_pool, replica_ids: Arc::default() })
    }

    /// The pool audit rows are written through (`synchronous=FULL`), for tests that check it.
    pub fn audit_pool(&self) -> &SqlitePool {
        &self.audit_pool
    }

    /// The connection pool, for diagnostics and tests that inspect the schema.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Writes one batch of samples in a single transaction.
    pub async fn insert_samples(&self, batch: &[SampleRow]) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut known = self.replica_ids.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut created: Vec<((String, String), i64)> = Vec::new();
        let mut tx = self.pool.begin().await?;
        for row in batch {
            let key = (row.url.clone(), row.model.clone());
            let replica_id = match known.get(&key) {
                Some(id) => *id,
                None => {
                    sqlx::query(
                        "INSERT OR IGNORE INTO replicas (url, model, first_seen_ms) VALUES (?, ?, ?)",
                    )
                    .bind(&row.url)
                    .bind(&row.model)
                    .bind(row.ts_ms)
                    .execute(&mut *tx)
                    .await?;
                    let id: i64 = sqlx::query_scalar("SELECT id FROM replicas WHERE url = ? AND model = ?")
                        .bind(&row.url)
                        .bind(&row.model)
                        .fetch_one(&mut *tx)
                        .await?;
                    known.insert(key.clone(), id);
                    created.push((key, id));
                    id
                }
            };
            let s = &row.signals;
            sqlx::query(
                "INSERT OR REPLACE INTO samples
                   (replica_id, ts_ms, queue_depth, running, kv_usage, hit_rate, ttft_p50_s, ttft_p95_s,
                    prompt_tok_s, gen_tok_s)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(replica_id)
            .bind(row.ts_ms)
            .bind(s.queue_depth)
            .bind(s.running)
            .bind(s.kv_usage)
            .bind(s.hit_rate)
            .bind(s.ttft_p50_s)
            .bind(s.ttft_p95_s)
            .bind(row.prompt_tok_s)
            .bind(row.gen_tok_s)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        if !created.is_empty() {
            self.replica_ids.lock().unwrap_or_else(|p| p.into_inner()).extend(created);
        }
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

    /// Number of stored raw samples (for tests and diagnostics).
    pub async fn sample_count(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM samples").fetch_one(&self.pool).await?)
    }

    /// Closes the pool, checkpointing the WAL.
    pub async fn close(self) {
        self.pool.close().await;
    }
}

/// The wall clock in Unix milliseconds (where it is defined: [`fleet_base::time`]).
pub use fleet_base::time::unix_ms_now;

#[cfg(test)]
mod tests {
    use super::*;

    fn row(url: &str, ts_ms: i64, p95: Option<f64>) -> SampleRow {
        SampleRow {
            url: url.into(),
            model: "m".into(),
            ts_ms,
            signals: SampleSignals { ttft_p95_s: p95, queue_depth: Some(1.0), ..SampleSignals::default() },
            ..SampleRow::default()
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

    #[cfg(unix)]
    #[tokio::test]
    async fn the_database_and_its_wal_are_readable_by_their_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("history.sqlite");
        let store = Store::open(&path).await.unwrap();
        store.insert_samples(&[row("http://a", 1000, Some(0.2))]).await.unwrap();
        let wal = dir.path().join("sub").join("history.sqlite-wal");
        // Whatever the umask (the attack found 0644 under 022): 0600, and SQLite's WAL file takes its mode.
        assert_eq!((mode(&path), mode(&wal)), (0o600, 0o600));
        store.close().await;
        // A database others could read (made by an older version) is closed to them when opened.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let store = Store::open(&path).await.unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(store.sample_count().await.unwrap(), 1, "and kept whole");
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
