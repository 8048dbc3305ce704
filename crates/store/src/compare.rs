//! Before/after comparison: fleet-level aggregates over two windows, their difference, and
//! a bootstrap confidence interval on it, so "did it help?" comes with "how sure are we?".
//!
//! Each window is read as a series of fleet buckets: 10 s, or 1 min when a window is longer
//! than `fine_max_ms` (6 h) or reaches past the 10 s tier's retention; both windows always
//! use the same resolution, which the answer reports. Buckets
//! come from the fleet tiers up to the tier's progress mark and are computed from raw
//! samples beyond it, with the same SQL, so a fresh database compares correctly too.
//!
//! A metric's value for a window is the mean over its buckets that have the metric:
//! - `hit_rate`: mean over replicas of their prefix-cache hit rate;
//! - `ttft_p50_s`, `ttft_p95_s`: mean over replicas of their TTFT quantile (the pooled
//!   quantile cannot be rebuilt from per-replica quantiles, so this is the typical one);
//! - `queue_depth`: mean queue per replica;
//! - `throughput_tok_s`: prompt + generated tokens per second, summed over replicas;
//! - `imbalance`: coefficient of variation (std / mean) of load (queue + running) across
//!   replicas; 0 is perfectly even; buckets with fewer than two replicas or no load are
//!   left out.
//!
//! Neighbouring buckets are correlated (queues and caches persist), so the interval comes
//! from a circular moving-block bootstrap of each window's bucket series (block length
//! about n^(1/3)), resampled independently per window with a seeded RNG: the same data and
//! seed always give the same interval.

use fleet_base::quantile::interpolated;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sqlx::{AssertSqlSafe, Row};

use crate::tiers::{FLEET_FROM_REPLICAS, PER_REPLICA_FROM_RAW, Retention, Tier, floor_to};
use crate::timefmt::{TimeWindow, format_rfc3339};
use crate::{Store, StoreError};

/// The metrics a comparison reports, in order.
pub const METRIC_NAMES: [&str; 6] =
    ["hit_rate", "ttft_p50_s", "ttft_p95_s", "queue_depth", "throughput_tok_s", "imbalance"];

/// What one side of a comparison covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowSpec {
    Time(TimeWindow),
    /// The active window of a policy version (see `Store::policy_window`).
    Policy(String),
}

/// How to compare.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareOptions {
    pub fleet: String,
    pub resamples: u32,
    /// Two-sided coverage of the interval, e.g. 0.95.
    pub confidence: f64,
    pub seed: u64,
    /// Decides which tier still covers a window.
    pub retention: Retention,
    /// Windows longer than this are compared at 1 min: past a few hours, 10 s buckets add
    /// reading time but little precision, as neighbouring buckets are strongly correlated.
    pub fine_max_ms: i64,
}

impl Default for CompareOptions {
    fn default() -> Self {
        Self {
            fleet: crate::DEFAULT_FLEET.to_string(),
            resamples: 1000,
            confidence: 0.95,
            seed: 0x5eed_f1ee_7dec,
            retention: Retention::default(),
            fine_max_ms: 6 * 3_600_000,
        }
    }
}

/// Fleet-level values of one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FleetBucket {
    pub bucket_ms: i64,
    pub replicas: i64,
    pub samples: i64,
    pub hit_rate: Option<f64>,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p95_s: Option<f64>,
    pub queue_depth: Option<f64>,
    pub throughput_tok_s: Option<f64>,
    pub imbalance: Option<f64>,
}

impl FleetBucket {
    fn metric(&self, index: usize) -> Option<f64> {
        [
            self.hit_rate,
            self.ttft_p50_s,
            self.ttft_p95_s,
            self.queue_depth,
            self.throughput_tok_s,
            self.imbalance,
        ][index]
    }
}

/// One side of a comparison as it was read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowSummary {
    pub from: String,
    pub to: String,
    pub from_ms: i64,
    pub to_ms: i64,
    /// The policy version whose active window this is, if chosen by policy.
    pub policy: Option<String>,
    pub resolution_s: i64,
    pub buckets: usize,
    pub samples: i64,
    /// Most replicas seen in one bucket.
    pub max_replicas: i64,
}

/// One metric compared: `delta = b - a`, with its confidence interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricDiff {
    pub name: &'static str,
    pub a: Option<f64>,
    pub b: Option<f64>,
    pub delta: Option<f64>,
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    /// Buckets behind `a` and `b`.
    pub n_a: usize,
    pub n_b: usize,
}

/// The answer to "did it change, and how sure are we?".
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub a: WindowSummary,
    pub b: WindowSummary,
    pub confidence: f64,
    pub resamples: u32,
    pub seed: u64,
    pub metrics: Vec<MetricDiff>,
}

impl Comparison {
    /// The metrics as CSV (header first); empty cells where there is no data.
    pub fn to_csv(&self) -> String {
        let mut out = String::from("metric,a,b,delta,ci_low,ci_high,n_a,n_b,a_from,a_to,b_from,b_to\n");
        let cell = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
        for m in &self.metrics {
            out.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{}\n",
                m.name,
                cell(m.a),
                cell(m.b),
                cell(m.delta),
                cell(m.ci_low),
                cell(m.ci_high),
                m.n_a,
                m.n_b,
                self.a.from,
                self.a.to,
                self.b.from,
                self.b.to
            ));
        }
        out
    }
}

impl Store {
    /// Compares window `b` against window `a` at `now_ms` (which decides what is still in
    /// the 10 s tier and where a still-active policy window ends).
    pub async fn compare(
        &self,
        a: &WindowSpec,
        b: &WindowSpec,
        now_ms: i64,
        options: &CompareOptions,
    ) -> Result<Comparison, StoreError> {
        let fleet_id = self.fleet_id(&options.fleet).await?;
        let (window_a, policy_a) = self.resolve(a, now_ms).await?;
        let (window_b, policy_b) = self.resolve(b, now_ms).await?;
        let oldest = window_a.from_ms.min(window_b.from_ms);
        let longest = (window_a.to_ms - window_a.from_ms).max(window_b.to_ms - window_b.from_ms);
        let tier = if oldest >= now_ms.saturating_sub(options.retention.ten_seconds_ms)
            && longest <= options.fine_max_ms
        {
            Tier::TenSeconds
        } else {
            Tier::OneMinute
        };
        let buckets_a = self.fleet_buckets(fleet_id, tier, window_a).await?;
        let buckets_b = self.fleet_buckets(fleet_id, tier, window_b).await?;
        let mut rng = StdRng::seed_from_u64(options.seed);
        let metrics = METRIC_NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let xa: Vec<f64> = buckets_a.iter().filter_map(|b| b.metric(i)).collect();
                let xb: Vec<f64> = buckets_b.iter().filter_map(|b| b.metric(i)).collect();
                diff(name, &xa, &xb, options, &mut rng)
            })
            .collect();
        Ok(Comparison {
            a: summary(window_a, policy_a, tier, &buckets_a),
            b: summary(window_b, policy_b, tier, &buckets_b),
            confidence: options.confidence,
            resamples: options.resamples,
            seed: options.seed,
            metrics,
        })
    }

    async fn resolve(
        &self,
        spec: &WindowSpec,
        now_ms: i64,
    ) -> Result<(TimeWindow, Option<String>), StoreError> {
        match spec {
            WindowSpec::Time(window) => {
                if window.from_ms >= window.to_ms {
                    return Err(StoreError::BadWindow {
                        window: format!(
                            "{}..{}",
                            format_rfc3339(window.from_ms),
                            format_rfc3339(window.to_ms)
                        ),
                    });
                }
                Ok((*window, None))
            }
            WindowSpec::Policy(label) => {
                let active = self.policy_window(label, now_ms).await?;
                Ok((TimeWindow { from_ms: active.from_ms, to_ms: active.to_ms }, Some(label.clone())))
            }
        }
    }

    /// The fleet buckets of `fleet_id` starting in `window`, oldest first: from the tier
    /// table up to its progress mark, computed from raw samples after it.
    pub async fn fleet_buckets(
        &self,
        fleet_id: i64,
        tier: Tier,
        window: TimeWindow,
    ) -> Result<Vec<FleetBucket>, StoreError> {
        let width = tier.width_ms();
        // Buckets are aligned to the tier; a window takes those that start inside it.
        let from = floor_to(window.from_ms + width - 1, width);
        let to = window.to_ms;
        let done = self.tier_progress(tier).await?.unwrap_or(i64::MIN).clamp(from, to.max(from));
        let columns = "bucket_ms, replicas, samples, hit_rate, ttft_p50_s, ttft_p95_s, queue_depth, \
                       throughput_tok_s, load_n, load_mean, load_sq_mean";
        let mut rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {columns} FROM {} WHERE fleet_id = ?1 AND bucket_ms >= ?2 AND bucket_ms < ?3
             ORDER BY bucket_ms",
            tier.fleet_table()
        )))
        .bind(fleet_id)
        .bind(from)
        .bind(done)
        .fetch_all(&self.pool)
        .await?;
        if done < to {
            let fleet_sql = FLEET_FROM_REPLICAS
                .replace("{source}", PER_REPLICA_FROM_RAW)
                .replace("{filter}", "WHERE COALESCE(r.fleet_id, 1) = ?4");
            rows.extend(
                sqlx::query(AssertSqlSafe(format!("SELECT {columns} FROM ({fleet_sql}) ORDER BY bucket_ms")))
                    .bind(width)
                    .bind(done)
                    .bind(to)
                    .bind(fleet_id)
                    .fetch_all(&self.pool)
                    .await?,
            );
        }
        rows.iter()
            .map(|row| {
                let load_n: i64 = row.try_get("load_n")?;
                let load_mean: Option<f64> = row.try_get("load_mean")?;
                let load_sq_mean: Option<f64> = row.try_get("load_sq_mean")?;
                Ok(FleetBucket {
                    bucket_ms: row.try_get("bucket_ms")?,
                    replicas: row.try_get("replicas")?,
                    samples: row.try_get("samples")?,
                    hit_rate: row.try_get("hit_rate")?,
                    ttft_p50_s: row.try_get("ttft_p50_s")?,
                    ttft_p95_s: row.try_get("ttft_p95_s")?,
                    queue_depth: row.try_get("queue_depth")?,
                    throughput_tok_s: row.try_get("throughput_tok_s")?,
                    imbalance: imbalance(load_n, load_mean, load_sq_mean),
                })
            })
            .collect()
    }
}

/// Coefficient of variation of per-replica load from its first two moments.
fn imbalance(n: i64, mean: Option<f64>, sq_mean: Option<f64>) -> Option<f64> {
    let (mean, sq_mean) = (mean?, sq_mean?);
    if n < 2 || mean <= 0.0 {
        return None;
    }
    // Rounding can make the variance a hair negative when all loads are equal.
    Some((sq_mean - mean * mean).max(0.0).sqrt() / mean)
}

fn summary(window: TimeWindow, policy: Option<String>, tier: Tier, buckets: &[FleetBucket]) -> WindowSummary {
    WindowSummary {
        from: format_rfc3339(window.from_ms),
        to: format_rfc3339(window.to_ms),
        from_ms: window.from_ms,
        to_ms: window.to_ms,
        policy,
        resolution_s: tier.width_ms() / 1000,
        buckets: buckets.len(),
        samples: buckets.iter().map(|b| b.samples).sum(),
        max_replicas: buckets.iter().map(|b| b.replicas).max().unwrap_or(0),
    }
}

fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

fn diff(
    name: &'static str,
    xa: &[f64],
    xb: &[f64],
    options: &CompareOptions,
    rng: &mut StdRng,
) -> MetricDiff {
    let (a, b) = (mean(xa), mean(xb));
    let delta = a.zip(b).map(|(a, b)| b - a);
    let (mut ci_low, mut ci_high) = (None, None);
    // One bucket has no spread to resample: an interval from it would claim certainty.
    if xa.len() >= 2 && xb.len() >= 2 && options.resamples > 0 {
        let (ba, bb) = (BlockBootstrap::new(xa), BlockBootstrap::new(xb));
        let mut deltas: Vec<f64> =
            (0..options.resamples).map(|_| bb.resampled_mean(rng) - ba.resampled_mean(rng)).collect();
        deltas.sort_by(f64::total_cmp);
        let tail = (1.0 - options.confidence.clamp(0.0, 1.0)) / 2.0;
        // `deltas` holds `resamples` (> 0) values, so both are Some.
        ci_low = interpolated(&deltas, tail);
        ci_high = interpolated(&deltas, 1.0 - tail);
    }
    MetricDiff { name, a, b, delta, ci_low, ci_high, n_a: xa.len(), n_b: xb.len() }
}

/// Circular moving-block bootstrap of the mean, with block sums from prefix sums so a
/// resample costs n / block draws rather than n.
struct BlockBootstrap {
    n: usize,
    block: usize,
    /// prefix[i] = sum of the first i values of the series wrapped once around.
    prefix: Vec<f64>,
}

impl BlockBootstrap {
    fn new(xs: &[f64]) -> Self {
        let n = xs.len();
        let block = ((n as f64).cbrt().round() as usize).clamp(1, n);
        let mut prefix = Vec::with_capacity(n + block);
        prefix.push(0.0);
        let mut sum = 0.0;
        for i in 0..n + block {
            sum += xs[i % n];
            prefix.push(sum);
        }
        Self { n, block, prefix }
    }

    fn resampled_mean<R: Rng>(&self, rng: &mut R) -> f64 {
        let mut left = self.n;
        let mut sum = 0.0;
        while left > 0 {
            let len = left.min(self.block);
            let start = rng.random_range(0..self.n);
            sum += self.prefix[start + len] - self.prefix[start];
            left -= len;
        }
        sum / self.n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_of_a_constant_series_has_no_spread() {
        let boot = BlockBootstrap::new(&[2.0; 50]);
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..10 {
            assert!((boot.resampled_mean(&mut rng) - 2.0).abs() < 1e-12);
        }
    }

    #[test]
    fn interval_covers_a_clear_shift_and_excludes_zero() {
        let mut rng = StdRng::seed_from_u64(7);
        let xa: Vec<f64> = (0..300).map(|_| rng.random_range(0.0..1.0)).collect();
        let xb: Vec<f64> = (0..300).map(|_| 0.5 + rng.random_range(0.0..1.0)).collect();
        let d = diff("x", &xa, &xb, &CompareOptions::default(), &mut StdRng::seed_from_u64(3));
        let (low, high, delta) = (d.ci_low.unwrap(), d.ci_high.unwrap(), d.delta.unwrap());
        assert!(low < delta && delta < high, "{d:?}");
        assert!(low > 0.3 && high < 0.7, "{d:?}");
    }

    #[test]
    fn one_bucket_gives_a_value_but_no_interval() {
        let d = diff("x", &[1.0], &[2.0, 3.0], &CompareOptions::default(), &mut StdRng::seed_from_u64(3));
        assert_eq!((d.a, d.b, d.delta), (Some(1.0), Some(2.5), Some(1.5)));
        assert_eq!((d.ci_low, d.ci_high), (None, None));
    }

    #[test]
    fn imbalance_is_the_coefficient_of_variation() {
        // Loads 1 and 3: mean 2, variance 1, CV 0.5.
        assert_eq!(imbalance(2, Some(2.0), Some(5.0)), Some(0.5));
        assert_eq!(imbalance(1, Some(2.0), Some(4.0)), None);
        assert_eq!(imbalance(3, Some(0.0), Some(0.0)), None);
    }
}
