//! The Prometheus HTTP API as a source, for fleets a laptop should not scrape itself: targets
//! from `/api/v1/targets`, engines and signals from PromQL over `/api/v1/query`.
//!
//! The PromQL is generated from the same engine profiles the local reader uses
//! (`engines.rs`), so a replica gives the same normalised signals either way: gauges summed
//! per instance (KV usage averaged), hit rate as `increase(hits) / increase(lookups)`, rates
//! with `rate()`, quantiles with `histogram_quantile` over bucket increases, all over the
//! source's window. Prometheus' own counter-reset handling replaces ours. Replicas are keyed by
//! the `instance` label; this source gives per-replica totals, not per-rank breakdowns.
//! Every request has a deadline and a size cap.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde_json::Value;

use crate::engines::{self, DETECTION_NAMES, HistSrc, Profile, Src};
use crate::scrape::{self, ScrapeError, ScrapeLimits};
use crate::signals::{EngineSignals, ReplicaSignals};

/// Why the Prometheus API could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PromError {
    #[error("Prometheus at {0}")]
    Http(#[from] ScrapeError),
    #[error("Prometheus answered {url} with HTTP {status}: {message}")]
    Api { url: String, status: u16, message: String },
    #[error("Prometheus answered {url} with something that is not its API's JSON ({detail})")]
    Shape { url: String, detail: String },
}

/// A query's answer: each series' labels and value.
pub type Vector = Vec<(BTreeMap<String, String>, f64)>;

/// One scrape target as Prometheus sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromTarget {
    pub scrape_url: String,
    pub job: String,
    /// The `instance` label signals are keyed by.
    pub instance: String,
    /// `up`, `down` or `unknown`.
    pub health: String,
    pub last_error: String,
}

/// Signals of one replica (an `instance`) from PromQL.
#[derive(Debug, Clone, PartialEq)]
pub struct PromReplica {
    pub instance: String,
    pub signals: ReplicaSignals,
}

/// A Prometheus server to read from.
#[derive(Debug, Clone)]
pub struct PromSource {
    base: String,
    client: reqwest::Client,
    limits: ScrapeLimits,
    window: Duration,
}

impl PromSource {
    /// `base_url` like `http://127.0.0.1:9090`; rates and quantiles cover `window` (give it at
    /// least two of Prometheus' scrape intervals).
    pub fn new(base_url: &str, client: reqwest::Client, limits: ScrapeLimits, window: Duration) -> Self {
        Self { base: base_url.trim_end_matches('/').to_string(), client, limits, window }
    }

    async fn get(&self, path_and_query: &str) -> Result<Value, PromError> {
        let url = format!("{}{path_and_query}", self.base);
        let (status, body) = scrape::fetch_any(&self.client, &url, "application/json", self.limits).await?;
        let json: Value = serde_json::from_str(&body).map_err(|e| {
            if (200..300).contains(&status) {
                PromError::Shape { url: url.clone(), detail: e.to_string() }
            } else {
                // Never the body: the URL may be anything the operator (or whoever reaches the app) typed.
                PromError::Api {
                    url: url.clone(),
                    status,
                    message: "the answer is not Prometheus' API JSON".into(),
                }
            }
        })?;
        if json["status"] != "success" {
            let message = scrape::short_reason(json["error"].as_str().unwrap_or("no error message"));
            return Err(PromError::Api { url, status, message });
        }
        Ok(json["data"].clone())
    }

    /// Active scrape targets (`/api/v1/targets?state=active`).
    pub async fn targets(&self) -> Result<Vec<PromTarget>, PromError> {
        let data = self.get("/api/v1/targets?state=active").await?;
        let shape = |detail: &str| PromError::Shape { url: self.base.clone(), detail: detail.to_string() };
        let active = data["activeTargets"].as_array().ok_or_else(|| shape("no activeTargets list"))?;
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        Ok(active
            .iter()
            .map(|t| PromTarget {
                scrape_url: text(&t["scrapeUrl"]),
                job: text(&t["labels"]["job"]),
                instance: text(&t["labels"]["instance"]),
                health: text(&t["health"]),
                last_error: text(&t["lastError"]),
            })
            .collect())
    }

    /// Runs an instant query; returns each series' labels and value (NaN and infinities,
    /// which PromQL gives for 0/0 and empty windows, are dropped: "no data").
    pub async fn query(&self, promql: &str) -> Result<Vector, PromError> {
        let data = self.get(&format!("/api/v1/query?query={}", percent_encode(promql))).await?;
        let shape = |detail: &str| PromError::Shape { url: self.base.clone(), detail: detail.to_string() };
        let result = data["result"].as_array().ok_or_else(|| shape("no result list"))?;
        let mut series = Vec::with_capacity(result.len());
        for item in result {
            let labels = item["metric"]
                .as_object()
                .ok_or_else(|| shape("a result without labels"))?
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect();
            let value = item["value"][1].as_str().ok_or_else(|| shape("a result without a value"))?;
            let value: f64 = value.parse().map_err(|_| shape("a value that is not a number"))?;
            if value.is_finite() {
                series.push((labels, value));
            }
        }
        Ok(series)
    }

    /// Engine of every instance with a known engine's metrics.
    async fn engines(&self) -> Result<BTreeMap<String, &'static Profile>, PromError> {
        let names = DETECTION_NAMES.join("|");
        let found = self.query(&format!("group by (instance, __name__) ({{__name__=~\"{names}\"}})")).await?;
        let mut by_instance: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (labels, _) in found {
            if let (Some(instance), Some(name)) = (labels.get("instance"), labels.get("__name__")) {
                by_instance.entry(instance.clone()).or_default().insert(name.clone());
            }
        }
        Ok(by_instance
            .into_iter()
            .filter_map(|(instance, names)| {
                let profile = engines::detect_by(
                    |prefix| names.iter().any(|n| n.starts_with(prefix)),
                    |name| names.contains(name),
                    || false,
                )?;
                Some((instance, profile))
            })
            .collect())
    }

    /// Signals of every instance whose engine is recognised, sorted by instance.
    pub async fn signals(&self) -> Result<Vec<PromReplica>, PromError> {
        let engines = self.engines().await?;
        let mut profiles: Vec<&'static Profile> = Vec::new();
        for profile in engines.values() {
            if !profiles.iter().any(|p| std::ptr::eq(*p, *profile)) {
                profiles.push(profile);
            }
        }
        let window = format!("{}s", self.window.as_secs().max(1));
        let mut replicas: BTreeMap<String, ReplicaSignals> = BTreeMap::new();
        for profile in profiles {
            let queries = queries(profile, &window);
            let answers =
                futures_util::future::join_all(queries.iter().map(|(_, promql)| self.query(promql))).await;
            let mut values: HashMap<Field, Vector> = HashMap::new();
            for ((field, _), answer) in queries.iter().zip(answers) {
                values.insert(*field, answer?);
            }
            for (instance, _) in engines.iter().filter(|(_, p)| std::ptr::eq(**p, profile)) {
                let value = |field: Field| {
                    values
                        .get(&field)?
                        .iter()
                        .find(|(l, _)| l.get("instance") == Some(instance))
                        .map(|(_, v)| *v)
                };
                let model = values.get(&Field::Model).and_then(|series| {
                    series
                        .iter()
                        .filter(|(l, _)| l.get("instance") == Some(instance))
                        .find_map(|(l, _)| profile.model_labels.iter().find_map(|name| l.get(*name)).cloned())
                });
                let kv_usage = value(Field::KvUsage)
                    .map(|u| if u > 1.0 && u <= 100.0 { u / 100.0 } else { u })
                    .map(|u| u.clamp(0.0, 1.0));
                let total = EngineSignals {
                    queue_depth: value(Field::Waiting),
                    running: value(Field::Running),
                    kv_usage,
                    hit_rate: value(Field::HitRate)
                        .or_else(|| {
                            // Counters present but idle mean "no data", not the gauge.
                            let counters = value(Field::PrefixLookups).is_some();
                            if counters { None } else { value(Field::HitRateGauge) }
                        })
                        .map(|r| r.clamp(0.0, 1.0)),
                    ttft_p50_s: value(Field::TtftP50),
                    ttft_p95_s: value(Field::TtftP95),
                    ttft_p99_s: value(Field::TtftP99),
                    itl_p50_s: value(Field::ItlP50),
                    itl_p95_s: value(Field::ItlP95),
                    itl_mean_s: value(Field::ItlMean),
                    prompt_tokens_per_s: value(Field::PromptRate),
                    generation_tokens_per_s: value(Field::GenerationRate),
                    preemptions_per_s: value(Field::PreemptionRate),
                    // Not asked of Prometheus yet: P/D transfer times come from direct scrapes.
                    kv_transfer_mean_s: None,
                };
                replicas.insert(
                    instance.clone(),
                    ReplicaSignals {
                        engine: profile.engine,
                        flavor: profile.flavor,
                        model,
                        total,
                        ranks: Vec::new(),
                    },
                );
            }
        }
        Ok(replicas.into_iter().map(|(instance, signals)| PromReplica { instance, signals }).collect())
    }
}

/// The signal a query answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Field {
    Model,
    Running,
    Waiting,
    KvUsage,
    HitRate,
    PrefixLookups,
    HitRateGauge,
    PromptRate,
    GenerationRate,
    PreemptionRate,
    TtftP50,
    TtftP95,
    TtftP99,
    ItlP50,
    ItlP95,
    ItlMean,
}

/// Matchers that skip tensor/pipeline-parallel peers (an absent label matches the empty string).
const PEERS: &str = "tp_rank=~\"0|\",pp_rank=~\"0|\",moe_ep_rank=~\"0|\",attn_tp_rank=~\"0|\"";

fn selector(name: &str, extra: Option<(&str, &str)>) -> String {
    match extra {
        Some((label, value)) => format!("{name}{{{label}=\"{value}\",{PEERS}}}"),
        None => format!("{name}{{{PEERS}}}"),
    }
}

/// How series of one source combine into a per-instance number.
#[derive(Clone, Copy)]
enum Agg<'a> {
    /// `sum by (instance)` of the current values.
    Sum,
    /// Average over ranks: a fraction.
    Mean,
    /// `sum by (instance)` of `increase(...[window])`.
    Increase(&'a str),
    /// `sum by (instance)` of `rate(...[window])`.
    Rate(&'a str),
}

fn expr(src: &Src, agg: Agg) -> String {
    let leaf = |sel: String| match agg {
        Agg::Sum => format!("sum by (instance) ({sel})"),
        Agg::Mean => format!("avg by (instance) ({sel})"),
        Agg::Increase(w) => format!("sum by (instance) (increase({sel}[{w}]))"),
        Agg::Rate(w) => format!("sum by (instance) (rate({sel}[{w}]))"),
    };
    match *src {
        Src::Metric(name) => leaf(selector(name, None)),
        Src::Select(name, label, value) => leaf(selector(name, Some((label, value)))),
        // A ratio of gauges is taken of their sums, whatever the aggregation asked.
        Src::Ratio(a, b) => format!("({}) / ({})", expr(a, Agg::Sum), expr(b, Agg::Sum)),
        Src::Minus(a, b) => format!("clamp_min(({}) - ({}), 0)", expr(a, agg), expr(b, agg)),
        Src::Plus(a, b) => format!("({}) + ({})", expr(a, agg), expr(b, agg)),
        Src::First(alternatives) => {
            alternatives.iter().map(|a| format!("({})", expr(a, agg))).collect::<Vec<_>>().join(" or ")
        }
    }
}

fn quantile(q: f64, sources: &[HistSrc], window: &str) -> Option<String> {
    let parts: Vec<String> = sources
        .iter()
        .filter_map(|s| match *s {
            HistSrc::Buckets { base, scale } => Some(format!(
                "(histogram_quantile({q}, sum by (instance, le) (increase({}[{window}]))) * {scale})",
                selector(&format!("{base}_bucket"), None)
            )),
            HistSrc::SumCount { .. } => None,
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(" or "))
}

/// The PromQL for every signal a profile provides.
pub(crate) fn queries(profile: &Profile, window: &str) -> Vec<(Field, String)> {
    let mut out = Vec::new();
    let mut gauge = |field, src: &Option<Src>, agg| {
        if let Some(src) = src {
            out.push((field, expr(src, agg)));
        }
    };
    gauge(Field::Running, &profile.running, Agg::Sum);
    gauge(Field::Waiting, &profile.waiting, Agg::Sum);
    gauge(Field::KvUsage, &profile.kv_usage, Agg::Mean);
    gauge(Field::HitRateGauge, &profile.hit_rate_gauge, Agg::Mean);
    gauge(Field::PromptRate, &profile.prompt_tokens, Agg::Rate(window));
    gauge(Field::GenerationRate, &profile.generation_tokens, Agg::Rate(window));
    gauge(Field::PreemptionRate, &profile.preemptions, Agg::Rate(window));
    if let Some((lookups, hits)) = &profile.prefix {
        let (lookups, hits) = (expr(lookups, Agg::Increase(window)), expr(hits, Agg::Increase(window)));
        out.push((Field::HitRate, format!("({hits}) / ({lookups})")));
        out.push((Field::PrefixLookups, lookups));
    }
    for (field, q) in [(Field::TtftP50, 0.5), (Field::TtftP95, 0.95), (Field::TtftP99, 0.99)] {
        out.extend(quantile(q, profile.ttft, window).map(|e| (field, e)));
    }
    for (field, q) in [(Field::ItlP50, 0.5), (Field::ItlP95, 0.95)] {
        out.extend(quantile(q, profile.itl, window).map(|e| (field, e)));
    }
    out.extend(mean_expr(profile.itl, window).map(|e| (Field::ItlMean, e)));
    let mut model_names = Vec::new();
    if let Some(running) = &profile.running {
        running.names(&mut model_names);
    }
    model_names.push(profile.marker);
    if !profile.model_labels.is_empty() {
        let by = profile.model_labels.join(", ");
        let union: Vec<String> =
            model_names.iter().map(|n| format!("group by (instance, {by}) ({n})")).collect();
        out.push((Field::Model, union.join(" or ")));
    }
    out
}

fn mean_expr(sources: &[HistSrc], window: &str) -> Option<String> {
    let increase = |name: &str| format!("sum by (instance) (increase({}[{window}]))", selector(name, None));
    let parts: Vec<String> = sources
        .iter()
        .map(|s| {
            let (sum, count, scale) = match *s {
                HistSrc::Buckets { base, scale } => (format!("{base}_sum"), format!("{base}_count"), scale),
                HistSrc::SumCount { sum, count, scale } => (sum.to_string(), count.to_string(), scale),
            };
            format!("(({}) / ({}) * {scale})", increase(&sum), increase(&count))
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(" or "))
}

/// Percent-encodes a query-string value (RFC 3986 unreserved characters stay).
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::VLLM;

    #[test]
    fn vllm_queries_mirror_the_local_reader() {
        let queries: HashMap<Field, String> = queries(&VLLM, "30s").into_iter().collect();
        assert_eq!(
            queries[&Field::Running],
            format!("sum by (instance) (vllm:num_requests_running{{{PEERS}}})")
        );
        assert!(
            queries[&Field::HitRate].contains("increase(vllm:prefix_cache_hits_total{"),
            "{}",
            queries[&Field::HitRate]
        );
        assert!(queries[&Field::TtftP95].starts_with("(histogram_quantile(0.95, sum by (instance, le) (increase(vllm:time_to_first_token_seconds_bucket{"));
        assert!(queries[&Field::KvUsage].contains("avg by (instance) (vllm:kv_cache_usage_perc{"));
        assert!(
            queries[&Field::Model].starts_with("group by (instance, model_name) (vllm:num_requests_running)")
        );
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(percent_encode("a b{c=\"d\"}[5s]"), "a%20b%7Bc%3D%22d%22%7D%5B5s%5D");
    }
}
