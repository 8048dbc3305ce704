//! The router's Prometheus metrics: atomic counters on the hot path, rendered as text on scrape.
//!
//! Families (all prefixed `fleet_router_`): `requests_total{replica,status}`, `pick_duration_seconds`
//! (histogram), `policy_version`, `policy_info{policy}`, `decisions_total{branch}`, `prompt_blocks_total`,
//! `matched_blocks_total`, `estimated_hit_rate`, `retries_total`, `stream_errors_total`,
//! `replica_healthy{replica}`, `replica_outstanding{replica}`, `policy_swaps_total`, `kv_events_total{replica}`,
//! `kv_resyncs_total{replica}`, `index_predictions_total`, `index_predictions_within_block_total`,
//! `upstream_idle_connections{replica}`, `upstream_first_byte_seconds{replica}`
//! (histogram), `recorded_requests_total`; in P/D mode `pd_decisions_total{reason}`, `pd_fallbacks_total`,
//! `pd_prefill_leg_seconds` and `pd_decode_first_byte_seconds` (histograms).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_policy::{Branch, PdReason};

/// Upper bounds of the pick-latency buckets, in seconds.
const PICK_BUCKETS: &[f64] =
    &[1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 2.5e-2];

/// Upper bounds of the first-byte buckets, in seconds: from a cached short prompt's prefill to a long
/// prompt queued behind others.
const FIRST_BYTE_BUCKETS: &[f64] =
    &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// A Prometheus histogram of durations that observing never locks: one atomic per bucket, plus the
/// count and the sum.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket, not cumulative (an observation adds to one; `render` sums them).
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Adds one observation.
    pub fn observe(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        // Past the last bound an observation lands only in +Inf, which is the count.
        if let Some(bucket) = self.bounds.iter().position(|bound| seconds <= *bound) {
            self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The histogram as JSON for `/admin/state`: cumulative `buckets` as `[upper bound, count]` pairs
    /// (the `+Inf` bucket is `count`), `sum_s` and `count`, so a reader can take differences over time.
    pub fn state_json(&self) -> serde_json::Value {
        let mut cumulative = 0;
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(self.buckets.iter())
            .map(|(bound, bucket)| {
                cumulative += bucket.load(Ordering::Relaxed);
                (*bound, cumulative)
            })
            .collect();
        serde_json::json!({
            "buckets": buckets,
            "sum_s": self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            "count": self.count(),
        })
    }

    /// Writes the `_bucket`, `_sum` and `_count` samples of `name`, with `labels` (`key="value",`
    /// pairs, each followed by a comma) before `le`.
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (bound, bucket) in self.bounds.iter().zip(self.buckets.iter()) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {count}");
        let plain = labels.trim_end_matches(',');
        let braces = if plain.is_empty() { String::new() } else { format!("{{{plain}}}") };
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// Every branch, in a fixed order, with its label.
pub const BRANCHES: [(Branch, &str); 11] = [
    (Branch::RoundRobin, "round_robin"),
    (Branch::Random, "random"),
    (Branch::LeastLoad, "least_load"),
    (Branch::PowerOfTwo, "power_of_two"),
    (Branch::Hash, "hash"),
    (Branch::Balance, "balance"),
    (Branch::Cache, "cache"),
    (Branch::Cost, "cost"),
    (Branch::Sampled, "sampled"),
    (Branch::Score, "score"),
    (Branch::Fallback, "fallback"),
];

/// The label of a branch.
pub fn branch_label(branch: Branch) -> &'static str {
    BRANCHES.iter().find(|(b, _)| *b == branch).map_or("unknown", |(_, label)| label)
}

/// HTTP status codes are 100 to 999 (`http::StatusCode` holds no others).
const STATUS_SLOTS: usize = 900;

/// One replica's answers by HTTP status: a counter per possible status, so counting takes no lock.
#[derive(Debug)]
pub struct StatusCounts([AtomicU64; STATUS_SLOTS]);

impl Default for StatusCounts {
    fn default() -> Self {
        Self(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl StatusCounts {
    /// Counts one answer with `status`.
    pub fn count(&self, status: u16) {
        self.0[Self::slot(status)].fetch_add(1, Ordering::Relaxed);
    }

    /// Answers counted with `status`.
    pub fn get(&self, status: u16) -> u64 {
        self.0[Self::slot(status)].load(Ordering::Relaxed)
    }

    fn slot(status: u16) -> usize {
        usize::from(status.clamp(100, 999) - 100)
    }

    /// `(status, count)` of every status counted at least once, in status order.
    fn counted(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        (100..=999u16).map(|status| (status, self.get(status))).filter(|(_, count)| *count > 0)
    }
}

/// Counters updated by requests.
#[derive(Debug)]
pub struct Metrics {
    /// Replica URL -> its answers by status. A replica holds its own entry ([`Metrics::requests_of`]),
    /// so the hot path counts without this lock; the map outlives removed replicas (counters only grow).
    requests: Mutex<BTreeMap<String, Arc<StatusCounts>>>,
    /// Replica URL -> time to its answers' first byte; held by the replica like its status counts.
    first_byte: Mutex<BTreeMap<String, Arc<Histogram>>>,
    /// Time the policy took per pick.
    picks: Histogram,
    branches: [AtomicU64; BRANCHES.len()],
    /// Prompt blocks of routed requests.
    pub prompt_blocks: AtomicU64,
    /// Of those, blocks the chosen replica was estimated to hold.
    pub matched_blocks: AtomicU64,
    /// Extra attempts after a failed one.
    pub retries: AtomicU64,
    /// Streams ended with an error event.
    pub stream_errors: AtomicU64,
    /// Policy versions applied after the first.
    pub policy_swaps: AtomicU64,
    /// Requests whose cached tokens the index predicted and the engine reported.
    pub predictions: AtomicU64,
    /// Of those, predicted within one block of the engine's count.
    pub predictions_within_block: AtomicU64,
    /// Clients refused by the router itself, by [`Refusal`].
    refusals: [AtomicU64; Refusal::ALL.len()],
    /// P/D decisions by [`PdReason`] (in its `ALL` order).
    pd_decisions: [AtomicU64; PdReason::ALL.len()],
    /// Split requests served locally after all: the prefill leg or the transfer failed.
    pub pd_fallbacks: AtomicU64,
    /// Duration of prefill legs (sent to the prefill replica's answer read whole), failed ones included.
    pub pd_prefill_leg: Histogram,
    /// Time from a split request's arrival to its decode replica's first body byte.
    pub pd_decode_first_byte: Histogram,
}

/// Why the router refused a client before any replica saw its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The connection cap was reached (503, connection closed).
    ConnectionLimit,
    /// The body did not arrive within the body read timeout (408, connection closed).
    BodyReadTimeout,
    /// The body was over the size limit (413).
    BodyTooLarge,
}

impl Refusal {
    const ALL: [Refusal; 3] = [Refusal::ConnectionLimit, Refusal::BodyReadTimeout, Refusal::BodyTooLarge];

    fn label(self) -> &'static str {
        match self {
            Refusal::ConnectionLimit => "connection_limit",
            Refusal::BodyReadTimeout => "body_read_timeout",
            Refusal::BodyTooLarge => "body_too_large",
        }
    }
}

/// Per-replica values read at scrape time.
#[derive(Debug)]
pub struct ReplicaGauges {
    /// Base URL.
    pub url: String,
    /// In rotation.
    pub healthy: bool,
    /// Outstanding requests.
    pub outstanding: u64,
    /// KV events applied.
    pub kv_events: u64,
    /// Index resyncs after gaps.
    pub kv_resyncs: u64,
    /// Pooled connections to it, idle.
    pub idle_connections: u64,
    /// Its engine's own figures from its `/metrics`, with their age and whether they are stale.
    pub engine: Option<crate::engine_load::EngineView>,
    /// Engine-metrics scrapes that gave figures, and that failed.
    pub engine_scrapes: (u64, u64),
    /// Engine reads shared through etcd: ticks left to the replica's reader among the routers, and figures
    /// taken from another router's read.
    pub engine_shared: (u64, u64),
}

/// The entry of the replica at `url` in a per-replica map, made on first use and kept for as long as the
/// router runs (a replica removed and added again finds its own).
fn replica_entry<T>(map: &Mutex<BTreeMap<String, Arc<T>>>, url: &str, make: impl FnOnce() -> T) -> Arc<T> {
    let mut map = map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    map.entry(url.to_owned()).or_insert_with(|| Arc::new(make())).clone()
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Mutex::default(),
            first_byte: Mutex::default(),
            picks: Histogram::new(PICK_BUCKETS),
            branches: Default::default(),
            prompt_blocks: AtomicU64::new(0),
            matched_blocks: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            stream_errors: AtomicU64::new(0),
            policy_swaps: AtomicU64::new(0),
            predictions: AtomicU64::new(0),
            predictions_within_block: AtomicU64::new(0),
            refusals: Default::default(),
            pd_decisions: Default::default(),
            pd_fallbacks: AtomicU64::new(0),
            pd_prefill_leg: Histogram::new(FIRST_BYTE_BUCKETS),
            pd_decode_first_byte: Histogram::new(FIRST_BYTE_BUCKETS),
        }
    }
}

impl Metrics {
    /// Counts one P/D decision (a fallback after a failed split is counted again as `transfer_failed`).
    pub fn count_pd(&self, reason: PdReason) {
        if let Some(slot) = PdReason::ALL.iter().position(|r| *r == reason) {
            self.pd_decisions[slot].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The P/D counters and leg histograms for `/admin/state` (all cumulative since start).
    pub fn pd_state_json(&self) -> serde_json::Value {
        let decisions: serde_json::Map<String, serde_json::Value> =
            PdReason::ALL.iter().map(|r| (r.as_str().to_owned(), self.pd_decisions(*r).into())).collect();
        serde_json::json!({
            "decisions": decisions,
            "fallbacks": self.pd_fallbacks.load(Ordering::Relaxed),
            "prefill_leg": self.pd_prefill_leg.state_json(),
            "decode_first_byte": self.pd_decode_first_byte.state_json(),
        })
    }

    /// P/D decisions counted with `reason`.
    pub fn pd_decisions(&self, reason: PdReason) -> u64 {
        PdReason::ALL
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |slot| self.pd_decisions[slot].load(Ordering::Relaxed))
    }

    /// The time-to-first-byte histogram of the replica at `url` (kept, like [`Metrics::requests_of`], for
    /// as long as the router runs).
    pub fn first_byte_of(&self, url: &str) -> Arc<Histogram> {
        replica_entry(&self.first_byte, url, || Histogram::new(FIRST_BYTE_BUCKETS))
    }

    /// The answer counters of the replica at `url`: the same ones for as long as the router runs, so a
    /// replica removed and added again keeps counting where it left off.
    pub fn requests_of(&self, url: &str) -> Arc<StatusCounts> {
        replica_entry(&self.requests, url, StatusCounts::default)
    }

    /// Counts one client refused for `why`.
    pub fn count_refusal(&self, why: Refusal) {
        self.refusals[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Clients refused for `why` since start.
    pub fn refusals(&self, why: Refusal) -> u64 {
        self.refusals[why as usize].load(Ordering::Relaxed)
    }

    /// Counts one request whose predicted cached tokens met the engine's count: `within` one block or not.
    pub fn count_prediction(&self, within: bool) {
        self.predictions.fetch_add(1, Ordering::Relaxed);
        if within {
            self.predictions_within_block.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one pick: its latency, branch and estimated hit.
    pub fn count_pick(&self, latency: Duration, branch: Branch, prompt_blocks: u32, matched_blocks: u32) {
        self.picks.observe(latency);
        if let Some(i) = BRANCHES.iter().position(|(b, _)| *b == branch) {
            self.branches[i].fetch_add(1, Ordering::Relaxed);
        }
        self.prompt_blocks.fetch_add(u64::from(prompt_blocks), Ordering::Relaxed);
        self.matched_blocks.fetch_add(u64::from(matched_blocks.min(prompt_blocks)), Ordering::Relaxed);
    }

    /// Renders every family as Prometheus text (format 0.0.4).
    pub fn render(
        &self,
        policy: &str,
        policy_version: u64,
        replicas: &[ReplicaGauges],
        recorded: u64,
    ) -> String {
        let mut out = String::with_capacity(4096);
        family(
            &mut out,
            "fleet_router_requests_total",
            "counter",
            "Requests answered, by replica and HTTP status.",
        );
        {
            let requests = self.requests.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for (replica, counts) in requests.iter() {
                for (status, count) in counts.counted() {
                    let _ = writeln!(
                        out,
                        "fleet_router_requests_total{{replica=\"{}\",status=\"{status}\"}} {count}",
                        escape(replica)
                    );
                }
            }
        }
        family(
            &mut out,
            "fleet_router_pick_duration_seconds",
            "histogram",
            "Time the policy took to pick a replica.",
        );
        self.picks.render(&mut out, "fleet_router_pick_duration_seconds", "");
        family(
            &mut out,
            "fleet_router_upstream_first_byte_seconds",
            "histogram",
            "Time from a request's arrival to its replica's first body byte (the first token of a stream, \
             the whole answer otherwise), by the replica that answered.",
        );
        {
            let first_byte = self.first_byte.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for (replica, histogram) in first_byte.iter().filter(|(_, h)| h.count() > 0) {
                let labels = format!("replica=\"{}\",", escape(replica));
                histogram.render(&mut out, "fleet_router_upstream_first_byte_seconds", &labels);
            }
        }
        scalar(
            &mut out,
            "fleet_router_policy_version",
            "gauge",
            "Version of the policy in force.",
            policy_version,
        );
        family(&mut out, "fleet_router_policy_info", "gauge", "The policy in force (always 1).");
        let _ = writeln!(out, "fleet_router_policy_info{{policy=\"{}\"}} 1", escape(policy));
        let swaps = self.policy_swaps.load(Ordering::Relaxed);
        scalar(
            &mut out,
            "fleet_router_policy_swaps_total",
            "counter",
            "Policy versions applied since start.",
            swaps,
        );
        // The index's accuracy: predicted cached tokens against the engine's own count, per request.
        let predictions = self.predictions.load(Ordering::Relaxed);
        let within = self.predictions_within_block.load(Ordering::Relaxed);
        scalar(
            &mut out,
            "fleet_router_index_predictions_total",
            "counter",
            "Requests whose cached tokens the index predicted (token blocks, served by the pick) and the engine reported.",
            predictions,
        );
        scalar(
            &mut out,
            "fleet_router_index_predictions_within_block_total",
            "counter",
            "Of those, predicted within one block of the engine's count (index accuracy = this / predictions).",
            within,
        );
        family(
            &mut out,
            "fleet_router_decisions_total",
            "counter",
            "Picks by the rule that decided (cache, balance, fallback, ...).",
        );
        for ((_, label), count) in BRANCHES.iter().zip(&self.branches) {
            let _ = writeln!(
                out,
                "fleet_router_decisions_total{{branch=\"{label}\"}} {}",
                count.load(Ordering::Relaxed)
            );
        }
        let prompt = self.prompt_blocks.load(Ordering::Relaxed);
        let matched = self.matched_blocks.load(Ordering::Relaxed);
        let rate = if prompt == 0 { 0.0 } else { matched as f64 / prompt as f64 };
        let retries = self.retries.load(Ordering::Relaxed);
        let stream_errors = self.stream_errors.load(Ordering::Relaxed);
        for (name, kind, help, value) in [
            ("fleet_router_prompt_blocks_total", "counter", "Prompt blocks of routed requests.", prompt),
            (
                "fleet_router_matched_blocks_total",
                "counter",
                "Prompt blocks the chosen replica was estimated to hold.",
                matched,
            ),
            (
                "fleet_router_retries_total",
                "counter",
                "Attempts on another replica after a failure before the first byte.",
                retries,
            ),
            (
                "fleet_router_stream_errors_total",
                "counter",
                "Streams ended with an error event after they started.",
                stream_errors,
            ),
            (
                "fleet_router_recorded_requests_total",
                "counter",
                "Requests recorded to the trace ring.",
                recorded,
            ),
        ] {
            scalar(&mut out, name, kind, help, value);
        }
        family(
            &mut out,
            "fleet_router_refused_total",
            "counter",
            "Clients the router refused itself, by reason (connection cap, slow body, body too large).",
        );
        for why in Refusal::ALL {
            let _ = writeln!(
                out,
                "fleet_router_refused_total{{reason=\"{}\"}} {}",
                why.label(),
                self.refusals(why)
            );
        }
        family(
            &mut out,
            "fleet_router_pd_decisions_total",
            "counter",
            "P/D mode: requests split into a prefill and a decode leg or served locally, by reason \
             (split, no_prefill_replica, short_prompt, cached_at_decode, prefill_pool_busy; transfer_failed \
             counts split requests that fell back to a local prefill).",
        );
        for reason in PdReason::ALL {
            let _ = writeln!(
                out,
                "fleet_router_pd_decisions_total{{reason=\"{}\"}} {}",
                reason.as_str(),
                self.pd_decisions(reason)
            );
        }
        scalar(
            &mut out,
            "fleet_router_pd_fallbacks_total",
            "counter",
            "P/D mode: split requests served with a local prefill after the prefill leg or the transfer failed.",
            self.pd_fallbacks.load(Ordering::Relaxed),
        );
        family(
            &mut out,
            "fleet_router_pd_prefill_leg_seconds",
            "histogram",
            "P/D mode: duration of prefill legs, from sending to the prefill replica's whole answer (failed ones too).",
        );
        self.pd_prefill_leg.render(&mut out, "fleet_router_pd_prefill_leg_seconds", "");
        family(
            &mut out,
            "fleet_router_pd_decode_first_byte_seconds",
            "histogram",
            "P/D mode: time from a split request's arrival to its decode replica's first body byte.",
        );
        self.pd_decode_first_byte.render(&mut out, "fleet_router_pd_decode_first_byte_seconds", "");
        let rate_help = "Matched over prompt blocks since start (0 to 1).";
        scalar(&mut out, "fleet_router_estimated_hit_rate", "gauge", rate_help, rate);
        let per_replica: [PerReplicaFamily; 5] = [
            (
                "fleet_router_replica_healthy",
                "gauge",
                "Whether a replica is in rotation (1) or not (0).",
                |r| u64::from(r.healthy),
            ),
            (
                "fleet_router_replica_outstanding",
                "gauge",
                "Requests routed to a replica and not completed.",
                |r| r.outstanding,
            ),
            (
                "fleet_router_kv_events_total",
                "counter",
                "KV-cache events applied to the index, by replica.",
                |r| r.kv_events,
            ),
            (
                "fleet_router_kv_resyncs_total",
                "counter",
                "Index resyncs after lost KV events, by replica.",
                |r| r.kv_resyncs,
            ),
            (
                "fleet_router_upstream_idle_connections",
                "gauge",
                "Pooled connections to a replica, idle and ready for a request.",
                |r| r.idle_connections,
            ),
        ];
        for (name, kind, help, value) in per_replica {
            family(&mut out, name, kind, help);
            for replica in replicas {
                let _ = writeln!(out, "{name}{{replica=\"{}\"}} {}", escape(&replica.url), value(replica));
            }
        }
        render_engine_figures(&mut out, replicas);
        out
    }
}

/// The replicas' engine figures (scraped from their `/metrics` when `--engine-metrics-ms` is on): a figure
/// only for replicas whose engine gave it, the age and the stale flag for every scraped replica.
fn render_engine_figures(out: &mut String, replicas: &[ReplicaGauges]) {
    let scraped: Vec<(&ReplicaGauges, &crate::engine_load::EngineView)> =
        replicas.iter().filter_map(|r| r.engine.as_ref().map(|view| (r, view))).collect();
    if scraped.is_empty() {
        return;
    }
    type Figure = fn(&crate::engine_load::EngineFigures) -> Option<f64>;
    let figures: [(&str, &str, Figure); 3] = [
        (
            "fleet_router_replica_engine_waiting",
            "Requests waiting in a replica's queue, by its own /metrics.",
            |f| f.waiting,
        ),
        ("fleet_router_replica_engine_running", "Requests a replica is running, by its own /metrics.", |f| {
            f.running
        }),
        (
            "fleet_router_replica_engine_kv_usage",
            "A replica's KV-cache usage (0 to 1), by its own /metrics.",
            |f| f.kv_usage,
        ),
    ];
    for (name, help, value) in figures {
        family(out, name, "gauge", help);
        for (replica, view) in &scraped {
            if let Some(value) = view.figures.as_ref().and_then(value) {
                let _ = writeln!(out, "{name}{{replica=\"{}\"}} {value}", escape(&replica.url));
            }
        }
    }
    family(
        out,
        "fleet_router_replica_engine_metrics_age_seconds",
        "gauge",
        "Age of a replica's latest engine figures (absent until one scrape succeeded).",
    );
    for (replica, view) in &scraped {
        if let Some(age_ms) = view.age_ms {
            let _ = writeln!(
                out,
                "fleet_router_replica_engine_metrics_age_seconds{{replica=\"{}\"}} {}",
                escape(&replica.url),
                age_ms as f64 / 1000.0
            );
        }
    }
    family(
        out,
        "fleet_router_replica_engine_metrics_stale",
        "gauge",
        "Whether a replica's engine figures are missing or too old to count (1): the policy then uses the \
         router's own in-flight counts.",
    );
    for (replica, view) in &scraped {
        let _ = writeln!(
            out,
            "fleet_router_replica_engine_metrics_stale{{replica=\"{}\"}} {}",
            escape(&replica.url),
            u8::from(view.stale)
        );
    }
    family(
        out,
        "fleet_router_replica_engine_scrapes_total",
        "counter",
        "Scrapes of a replica's /metrics for its engine figures, by result.",
    );
    for (replica, _) in &scraped {
        let (ok, failed) = replica.engine_scrapes;
        let url = escape(&replica.url);
        let _ = writeln!(
            out,
            "fleet_router_replica_engine_scrapes_total{{replica=\"{url}\",result=\"ok\"}} {ok}"
        );
        let _ = writeln!(
            out,
            "fleet_router_replica_engine_scrapes_total{{replica=\"{url}\",result=\"failed\"}} {failed}"
        );
    }
    let shared: [PerReplicaFamily; 2] = [
        (
            "fleet_router_replica_engine_scrapes_delegated_total",
            "counter",
            "Scrape ticks this router left to the replica's reader among the fleet's routers (engine reads \
             shared through etcd).",
            |r| r.engine_shared.0,
        ),
        (
            "fleet_router_replica_engine_reads_received_total",
            "counter",
            "Engine figures of a replica taken from another router's read (shared through etcd).",
            |r| r.engine_shared.1,
        ),
    ];
    for (name, kind, help, value) in shared {
        family(out, name, kind, help);
        for (replica, _) in &scraped {
            let _ = writeln!(out, "{name}{{replica=\"{}\"}} {}", escape(&replica.url), value(replica));
        }
    }
}

pub(crate) fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A per-replica family: name, type, help and how to read its value.
type PerReplicaFamily = (&'static str, &'static str, &'static str, fn(&ReplicaGauges) -> u64);

/// A family with one unlabelled sample.
pub(crate) fn scalar(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    family(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

pub(crate) fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_buckets_and_rate() {
        let metrics = Metrics::default();
        let counts = metrics.requests_of("http://a");
        counts.count(200);
        metrics.requests_of("http://a").count(200);
        metrics.requests_of("http://b");
        metrics.count_pick(Duration::from_micros(3), Branch::Cache, 10, 4);
        metrics.count_pick(Duration::from_micros(30), Branch::Fallback, 10, 0);
        let gauges = [ReplicaGauges {
            url: "http://a".into(),
            healthy: true,
            outstanding: 2,
            kv_events: 0,
            kv_resyncs: 0,
            idle_connections: 3,
            engine: None,
            engine_scrapes: (0, 0),
            engine_shared: (0, 0),
        }];
        let text = metrics.render("cache_aware_approx", 3, &gauges, 7);
        assert!(
            text.contains("fleet_router_requests_total{replica=\"http://a\",status=\"200\"} 2"),
            "{text}"
        );
        assert!(text.contains("fleet_router_pick_duration_seconds_bucket{le=\"0.000005\"} 1"), "{text}");
        assert!(text.contains("fleet_router_pick_duration_seconds_bucket{le=\"0.00005\"} 2"), "{text}");
        assert!(text.contains("fleet_router_pick_duration_seconds_bucket{le=\"0.000001\"} 0"), "{text}");
        assert!(text.contains("fleet_router_pick_duration_seconds_bucket{le=\"+Inf\"} 2"), "{text}");
        assert!(text.contains("fleet_router_decisions_total{branch=\"cache\"} 1"));
        assert!(text.contains("fleet_router_estimated_hit_rate 0.2"));
        assert!(text.contains("fleet_router_policy_version 3"));
        assert!(text.contains("fleet_router_upstream_idle_connections{replica=\"http://a\"} 3"), "{text}");
        assert!(!text.contains("fleet_router_upstream_first_byte_seconds_count"), "none observed: {text}");

        let first_byte = metrics.first_byte_of("http://a");
        first_byte.observe(Duration::from_millis(20));
        metrics.first_byte_of("http://a").observe(Duration::from_secs(90));
        let text = metrics.render("cache_aware_approx", 3, &gauges, 7);
        let name = "fleet_router_upstream_first_byte_seconds";
        for sample in [
            format!("{name}_bucket{{replica=\"http://a\",le=\"0.01\"}} 0"),
            format!("{name}_bucket{{replica=\"http://a\",le=\"0.025\"}} 1"),
            format!("{name}_bucket{{replica=\"http://a\",le=\"60\"}} 1"),
            format!("{name}_bucket{{replica=\"http://a\",le=\"+Inf\"}} 2"),
            format!("{name}_sum{{replica=\"http://a\"}} 90.02"),
            format!("{name}_count{{replica=\"http://a\"}} 2"),
        ] {
            assert!(text.contains(&sample), "{sample} missing from:\n{text}");
        }
        assert_eq!(metrics.requests_of("http://a").get(200), 2);
        assert!(!text.contains("replica=\"http://b\",status"), "nothing counted, nothing rendered: {text}");
        assert_eq!((StatusCounts::slot(100), StatusCounts::slot(999)), (0, STATUS_SLOTS - 1));
    }
}
