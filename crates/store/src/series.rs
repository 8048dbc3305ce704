//! One replica's signals over a window, averaged into at most a few hundred buckets: what the
//! replica detail charts draw.
//!
//! Windows within raw retention read raw samples (always up to the latest scrape, which the
//! tiers only reach after maintenance has run); longer ones read the 1 min tier. Either way
//! the averaging happens in SQL, so a day of 1 s samples costs one query and a few hundred
//! rows. NULLs stay out of the averages and a bucket without any value stays `None`.

use sqlx::Row;

use crate::{Store, StoreError, Tier};

/// Raw samples are kept this long by default; windows beyond it read the 1 min tier.
const RAW_REACH_MS: i64 = 24 * 3600 * 1000;

/// One bucket of one replica's history (the bucket's start and the means inside it).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SeriesPoint {
    pub ts_ms: i64,
    pub queue_depth: Option<f64>,
    pub kv_usage: Option<f64>,
    pub hit_rate: Option<f64>,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p95_s: Option<f64>,
    /// Prompt plus generated tokens per second (either alone when only one is reported).
    pub tokens_per_s: Option<f64>,
}

/// Where a series was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesSource {
    Raw,
    Tier(Tier),
}

impl SeriesSource {
    pub fn name(self) -> &'static str {
        match self {
            SeriesSource::Raw => "raw",
            SeriesSource::Tier(tier) => tier.name(),
        }
    }
}

impl Store {
    /// The history of replica `url` (every model it served) from `since_ms` to `until_ms`,
    /// averaged into buckets of at least `min_bucket_ms`, oldest first.
    pub async fn replica_series(
        &self,
        url: &str,
        since_ms: i64,
        until_ms: i64,
        min_bucket_ms: i64,
    ) -> Result<(SeriesSource, Vec<SeriesPoint>), StoreError> {
        let (source, table, ts) = if until_ms - since_ms <= RAW_REACH_MS {
            (SeriesSource::Raw, "samples", "ts_ms")
        } else {
            (SeriesSource::Tier(Tier::OneMinute), Tier::OneMinute.replica_table(), "bucket_ms")
        };
        let bucket = match source {
            SeriesSource::Raw => min_bucket_ms.max(1),
            SeriesSource::Tier(tier) => min_bucket_ms.max(tier.width_ms()),
        };
        // The SQL is assembled from this function's constants only; values are bound.
        let sql = format!(
            "SELECT (s.{ts} / ?1) * ?1 AS b, AVG(s.queue_depth), AVG(s.kv_usage), AVG(s.hit_rate),
                    AVG(s.ttft_p50_s), AVG(s.ttft_p95_s),
                    AVG(CASE WHEN s.prompt_tok_s IS NULL AND s.gen_tok_s IS NULL THEN NULL
                             ELSE COALESCE(s.prompt_tok_s, 0) + COALESCE(s.gen_tok_s, 0) END)
             FROM {table} s JOIN replicas r ON r.id = s.replica_id
             WHERE r.url = ?2 AND s.{ts} >= ?3 AND s.{ts} <= ?4
             GROUP BY b ORDER BY b"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(bucket)
            .bind(url)
            .bind(since_ms)
            .bind(until_ms)
            .fetch_all(&self.pool)
            .await?;
        let mut points = Vec::with_capacity(rows.len());
        for row in rows {
            points.push(SeriesPoint {
                ts_ms: row.try_get(0)?,
                queue_depth: row.try_get(1)?,
                kv_usage: row.try_get(2)?,
                hit_rate: row.try_get(3)?,
                ttft_p50_s: row.try_get(4)?,
                ttft_p95_s: row.try_get(5)?,
                tokens_per_s: row.try_get(6)?,
            });
        }
        Ok((source, points))
    }
}

#[cfg(test)]
mod tests {

    use crate::{SampleRow, SampleSignals};

    use super::*;

    fn sample(
        url: &str,
        ts_ms: i64,
        queue: Option<f64>,
        prompt: Option<f64>,
        gen_: Option<f64>,
    ) -> SampleRow {
        SampleRow {
            url: url.into(),
            model: "m".into(),
            ts_ms,
            signals: SampleSignals { queue_depth: queue, ..SampleSignals::default() },
            prompt_tok_s: prompt,
            gen_tok_s: gen_,
        }
    }

    #[tokio::test]
    async fn raw_series_average_into_buckets_and_keep_missing_values_missing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("h.sqlite")).await.unwrap();
        store
            .insert_samples(&[
                sample("http://a", 10_000, Some(1.0), Some(100.0), Some(10.0)),
                sample("http://b", 10_000, Some(9.0), None, None),
            ])
            .await
            .unwrap();
        store.insert_samples(&[sample("http://a", 11_000, Some(3.0), None, Some(20.0))]).await.unwrap();
        store.insert_samples(&[sample("http://a", 12_000, None, None, None)]).await.unwrap();
        store.insert_samples(&[sample("http://a", 25_000, Some(5.0), None, None)]).await.unwrap();

        let (source, points) = store.replica_series("http://a", 0, 30_000, 10_000).await.unwrap();
        assert_eq!(source, SeriesSource::Raw);
        assert_eq!(points.len(), 2, "{points:?}");
        assert_eq!(points[0].ts_ms, 10_000);
        assert_eq!(points[0].queue_depth, Some(2.0), "the NULL at 12 s is left out of the mean");
        assert_eq!(points[0].tokens_per_s, Some(65.0), "(110 + 20) / 2");
        assert_eq!(points[1].ts_ms, 20_000);
        assert_eq!(points[1].tokens_per_s, None, "no throughput reported is not zero");
        assert!(points[0].hit_rate.is_none());

        // The window bounds apply, and other replicas never leak in.
        let (_, points) = store.replica_series("http://a", 20_000, 30_000, 1).await.unwrap();
        assert_eq!(points.len(), 1);
        assert_eq!(points[0].queue_depth, Some(5.0));
        let (_, none) = store.replica_series("http://nobody", 0, 30_000, 1).await.unwrap();
        assert!(none.is_empty());
    }

    #[tokio::test]
    async fn windows_longer_than_raw_retention_read_the_minute_tier() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("h.sqlite")).await.unwrap();
        let (source, points) = store.replica_series("http://a", 0, 3 * RAW_REACH_MS, 1000).await.unwrap();
        assert_eq!(source, SeriesSource::Tier(Tier::OneMinute));
        assert_eq!(source.name(), "1m");
        assert!(points.is_empty());
    }
}
