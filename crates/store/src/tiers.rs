//! Downsampling and retention: raw samples are summarised into 10 s and 1 min tiers (per
//! replica and per fleet) and each tier expires after its own retention.
//!
//! Work happens in short transactions of at most `chunk_ms` of history each, so a pass never
//! holds SQLite's single write lock for long and scrape rounds keep landing while it runs
//! (WAL readers never block the writer either). A tier is built up to `now - grace`, so
//! the rounds still in flight are not summarised before they arrive; samples older than
//! a tier's progress mark when they arrive are kept raw but not summarised. Raw samples
//! are expired only once both tiers have summarised them.

use std::future::Future;
use std::time::Duration;

use sqlx::AssertSqlSafe;

// Dynamic SQL here (and in `compare`) is assembled only from this module's constants and
// `Tier`'s fixed table names; every value travels as a bound parameter.
use crate::{Store, StoreError, unix_ms_now};

/// A summary tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    TenSeconds,
    OneMinute,
}

impl Tier {
    pub const ALL: [Tier; 2] = [Tier::TenSeconds, Tier::OneMinute];

    /// Bucket width in milliseconds.
    pub fn width_ms(self) -> i64 {
        match self {
            Tier::TenSeconds => 10_000,
            Tier::OneMinute => 60_000,
        }
    }

    /// The name kept in `downsample_progress` and shown to operators.
    pub fn name(self) -> &'static str {
        match self {
            Tier::TenSeconds => "10s",
            Tier::OneMinute => "1m",
        }
    }

    pub(crate) fn replica_table(self) -> &'static str {
        match self {
            Tier::TenSeconds => "samples_10s",
            Tier::OneMinute => "samples_1m",
        }
    }

    pub(crate) fn fleet_table(self) -> &'static str {
        match self {
            Tier::TenSeconds => "fleet_10s",
            Tier::OneMinute => "fleet_1m",
        }
    }
}

/// How long each tier is kept, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub raw_ms: i64,
    pub ten_seconds_ms: i64,
    pub one_minute_ms: i64,
}

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;

impl Default for Retention {
    /// Raw for 24 h, 10 s means for 7 days, 1 min means for 90 days.
    fn default() -> Self {
        Self { raw_ms: DAY_MS, ten_seconds_ms: 7 * DAY_MS, one_minute_ms: 90 * DAY_MS }
    }
}

impl Retention {
    pub fn of(&self, tier: Tier) -> i64 {
        match tier {
            Tier::TenSeconds => self.ten_seconds_ms,
            Tier::OneMinute => self.one_minute_ms,
        }
    }
}

/// Settings of the background maintenance.
#[derive(Debug, Clone, PartialEq)]
pub struct MaintenanceConfig {
    pub retention: Retention,
    /// Buckets younger than this are not summarised yet (rounds may still be on their way).
    pub grace_ms: i64,
    /// Most history one transaction summarises; a multiple of one minute.
    pub chunk_ms: i64,
    /// Most rows one retention statement deletes.
    pub delete_batch: i64,
    /// Time between passes of the background task.
    pub interval: Duration,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        Self {
            retention: Retention::default(),
            grace_ms: 30_000,
            chunk_ms: 10 * 60_000,
            delete_batch: 5_000,
            interval: Duration::from_secs(30),
        }
    }
}

/// What one maintenance pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// Per-replica buckets written, for the 10 s and the 1 min tier.
    pub buckets_10s: u64,
    pub buckets_1m: u64,
    /// Rows expired from raw samples and from the two tiers (per-replica and fleet rows).
    pub expired_raw: u64,
    pub expired_10s: u64,
    pub expired_1m: u64,
}

/// Rounds `ms` down to a multiple of `width` (also for times before 1970).
pub(crate) fn floor_to(ms: i64, width: i64) -> i64 {
    ms.div_euclid(width) * width
}

/// Per-replica means over raw samples in `[?2, ?3)`, bucketed by `?1` ms; the shape of the
/// per-replica tier tables. Shared by the downsampler and by comparisons that reach past
/// the tiers' progress into raw samples.
pub(crate) const PER_REPLICA_FROM_RAW: &str = "
    SELECT s.replica_id AS replica_id, (s.ts_ms - (s.ts_ms % ?1)) AS bucket_ms, COUNT(*) AS n,
           AVG(s.queue_depth) AS queue_depth, AVG(s.running) AS running, AVG(s.kv_usage) AS kv_usage,
           AVG(s.hit_rate) AS hit_rate, AVG(s.ttft_p50_s) AS ttft_p50_s, AVG(s.ttft_p95_s) AS ttft_p95_s,
           AVG(s.prompt_tok_s) AS prompt_tok_s, AVG(s.gen_tok_s) AS gen_tok_s
    FROM samples s
    WHERE s.ts_ms >= ?2 AND s.ts_ms < ?3
    GROUP BY s.replica_id, bucket_ms";

/// Fleet-level values per bucket from per-replica rows `t` (a tier table or
/// `PER_REPLICA_FROM_RAW`); `{source}` is substituted and `{filter}` restricts `t`.
/// Load is queue + running, throughput prompt + generated tokens/s; each is NULL for a
/// replica that reports neither part, so a silent replica never counts as idle.
pub(crate) const FLEET_FROM_REPLICAS: &str = "
    SELECT COALESCE(r.fleet_id, 1) AS fleet_id, t.bucket_ms AS bucket_ms, COUNT(*) AS replicas,
           SUM(t.n) AS samples, AVG(t.hit_rate) AS hit_rate, AVG(t.ttft_p50_s) AS ttft_p50_s,
           AVG(t.ttft_p95_s) AS ttft_p95_s, AVG(t.queue_depth) AS queue_depth,
           SUM(CASE WHEN t.prompt_tok_s IS NULL AND t.gen_tok_s IS NULL THEN NULL
                    ELSE COALESCE(t.prompt_tok_s, 0) + COALESCE(t.gen_tok_s, 0) END) AS throughput_tok_s,
           COUNT(CASE WHEN t.queue_depth IS NULL AND t.running IS NULL THEN NULL ELSE 1 END) AS load_n,
           AVG(CASE WHEN t.queue_depth IS NULL AND t.running IS NULL THEN NULL
                    ELSE COALESCE(t.queue_depth, 0) + COALESCE(t.running, 0) END) AS load_mean,
           AVG(CASE WHEN t.queue_depth IS NULL AND t.running IS NULL THEN NULL
                    ELSE (COALESCE(t.queue_depth, 0) + COALESCE(t.running, 0))
                       * (COALESCE(t.queue_depth, 0) + COALESCE(t.running, 0)) END) AS load_sq_mean
    FROM ({source}) t JOIN replicas r ON r.id = t.replica_id
    {filter}
    GROUP BY COALESCE(r.fleet_id, 1), t.bucket_ms";

const FLEET_COLUMNS: &str = "fleet_id, bucket_ms, replicas, samples, hit_rate, ttft_p50_s, ttft_p95_s, \
     queue_depth, throughput_tok_s, load_n, load_mean, load_sq_mean";

impl Store {
    /// How far `tier` has been built: raw samples before this are summarised in it.
    pub async fn tier_progress(&self, tier: Tier) -> Result<Option<i64>, StoreError> {
        Ok(sqlx::query_scalar("SELECT done_until_ms FROM downsample_progress WHERE tier = ?")
            .bind(tier.name())
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Summarises raw samples into `tier` up to `now_ms - grace_ms`, in transactions of at
    /// most `chunk_ms` of history each; returns the number of per-replica buckets written.
    pub async fn downsample(
        &self,
        tier: Tier,
        now_ms: i64,
        grace_ms: i64,
        chunk_ms: i64,
    ) -> Result<u64, StoreError> {
        let width = tier.width_ms();
        let chunk = floor_to(chunk_ms, width).max(width);
        let upto = floor_to(now_ms.saturating_sub(grace_ms), width);
        let mut start = self.tier_progress(tier).await?.unwrap_or(i64::MIN);
        let mut written = 0;
        while start < upto {
            // Skip stretches without samples (the app was not running) in one step.
            let next: Option<i64> = sqlx::query_scalar("SELECT MIN(ts_ms) FROM samples WHERE ts_ms >= ?")
                .bind(start)
                .fetch_one(&self.pool)
                .await?;
            let begin = match next {
                Some(ts) if ts < upto => floor_to(ts, width).max(start),
                _ => {
                    self.set_progress(tier, upto).await?;
                    break;
                }
            };
            let end = (begin + chunk).min(upto);
            let mut tx = self.pool.begin().await?;
            let replica_sql = format!(
                "INSERT OR REPLACE INTO {} (replica_id, bucket_ms, n, queue_depth, running, kv_usage, hit_rate,
                    ttft_p50_s, ttft_p95_s, prompt_tok_s, gen_tok_s) {PER_REPLICA_FROM_RAW}",
                tier.replica_table()
            );
            written += sqlx::query(AssertSqlSafe(replica_sql))
                .bind(width)
                .bind(begin)
                .bind(end)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            let fleet_sql = format!(
                "INSERT OR REPLACE INTO {} ({FLEET_COLUMNS}) {}",
                tier.fleet_table(),
                FLEET_FROM_REPLICAS
                    .replace("{source}", &format!("SELECT * FROM {}", tier.replica_table()))
                    .replace("{filter}", "WHERE t.bucket_ms >= ?1 AND t.bucket_ms < ?2")
            );
            sqlx::query(AssertSqlSafe(fleet_sql)).bind(begin).bind(end).execute(&mut *tx).await?;
            upsert_progress(&mut tx, tier, end).await?;
            tx.commit().await?;
            start = end;
        }
        Ok(written)
    }

    async fn set_progress(&self, tier: Tier, done_until_ms: i64) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        upsert_progress(&mut tx, tier, done_until_ms).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Expires what is older than its retention at `now_ms`, in statements of at most
    /// `delete_batch` rows. Raw samples not yet summarised by both tiers are kept.
    pub async fn expire(
        &self,
        now_ms: i64,
        retention: &Retention,
        delete_batch: i64,
    ) -> Result<(u64, u64, u64), StoreError> {
        let mut raw_cut = now_ms.saturating_sub(retention.raw_ms);
        for tier in Tier::ALL {
            raw_cut = raw_cut.min(self.tier_progress(tier).await?.unwrap_or(i64::MIN));
        }
        let raw = self
            .delete_before(
                "DELETE FROM samples WHERE (replica_id, ts_ms) IN
                   (SELECT replica_id, ts_ms FROM samples WHERE ts_ms < ?1 ORDER BY ts_ms LIMIT ?2)",
                raw_cut,
                delete_batch,
            )
            .await?;
        let mut tiers = [0u64; 2];
        for (i, tier) in Tier::ALL.into_iter().enumerate() {
            let cut = now_ms.saturating_sub(retention.of(tier));
            let replica = format!(
                "DELETE FROM {t} WHERE (replica_id, bucket_ms) IN
                   (SELECT replica_id, bucket_ms FROM {t} WHERE bucket_ms < ?1 ORDER BY bucket_ms LIMIT ?2)",
                t = tier.replica_table()
            );
            let fleet = format!(
                "DELETE FROM {t} WHERE (fleet_id, bucket_ms) IN
                   (SELECT fleet_id, bucket_ms FROM {t} WHERE bucket_ms < ?1 ORDER BY bucket_ms LIMIT ?2)",
                t = tier.fleet_table()
            );
            tiers[i] = self.delete_before(&replica, cut, delete_batch).await?
                + self.delete_before(&fleet, cut, delete_batch).await?;
        }
        Ok((raw, tiers[0], tiers[1]))
    }

    async fn delete_before(&self, sql: &str, cut: i64, batch: i64) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            // Each statement is its own short transaction, so ingestion interleaves.
            let n = sqlx::query(AssertSqlSafe(sql))
                .bind(cut)
                .bind(batch)
                .execute(&self.pool)
                .await?
                .rows_affected();
            total += n;
            if n < u64::try_from(batch).unwrap_or(u64::MAX) {
                return Ok(total);
            }
        }
    }

    /// One maintenance pass at `now_ms`: summarise both tiers, then expire.
    pub async fn maintain(
        &self,
        now_ms: i64,
        config: &MaintenanceConfig,
    ) -> Result<MaintenanceReport, StoreError> {
        let buckets_10s = self.downsample(Tier::TenSeconds, now_ms, config.grace_ms, config.chunk_ms).await?;
        let buckets_1m = self.downsample(Tier::OneMinute, now_ms, config.grace_ms, config.chunk_ms).await?;
        let (expired_raw, expired_10s, expired_1m) =
            self.expire(now_ms, &config.retention, config.delete_batch).await?;
        Ok(MaintenanceReport { buckets_10s, buckets_1m, expired_raw, expired_10s, expired_1m })
    }

    /// Runs `maintain` every `config.interval` (reading the wall clock) until `stop`
    /// completes. A failed pass is logged and retried at the next interval.
    pub fn spawn_maintenance<F>(&self, config: MaintenanceConfig, stop: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let store = self.clone();
        tokio::spawn(async move {
            tokio::pin!(stop);
            let mut ticks = tokio::time::interval(config.interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = &mut stop => return,
                    _ = ticks.tick() => {}
                }
                match store.maintain(unix_ms_now(), &config).await {
                    Ok(report) => tracing::debug!(?report, "history maintenance pass"),
                    Err(error) => tracing::warn!(%error, "history maintenance pass failed; retrying later"),
                }
            }
        })
    }
}

async fn upsert_progress(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    tier: Tier,
    done_until_ms: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO downsample_progress (tier, done_until_ms) VALUES (?, ?)
         ON CONFLICT (tier) DO UPDATE SET done_until_ms = MAX(done_until_ms, excluded.done_until_ms)",
    )
    .bind(tier.name())
    .bind(done_until_ms)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
