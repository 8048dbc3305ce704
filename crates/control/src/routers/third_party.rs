//! Routers other than fleet-router that operators run today: SGLang's Shepherd Model Gateway (`smg`),
//! `vllm-router`, llm-d's inference scheduler (its endpoint picker, EPP) and Dynamo's frontend. The app
//! shows them beside its own routers, read-only: SMG's and vllm-router's workers from `GET /workers`, and
//! every one's policy, request counts and P/D figures from its own Prometheus metrics. llm-d's EPP and
//! Dynamo's frontend have no worker list the app can read, so they are known by their metrics alone: llm-d
//! by its P/D decision counters (`llm_d_inference_scheduler_pd_decision_total`, newer
//! `..._disagg_decision_total`), Dynamo by its per-worker gauges labelled `worker_type`
//! (`dynamo_frontend_worker_active_prefill_tokens`, `..._active_decode_blocks`,
//! `..._last_time_to_first_token_seconds`). Their names are read from their sources (llm-d
//! `pkg/metrics`, Dynamo `prometheus_names.rs` and `kv_router` worker monitor); neither runs here, so their
//! fixtures are written from those names, and say so.
//!
//! Detection and parsing are pure and tested on the JSON and exposition text those routers serve (shapes
//! read from smg 1.13.0 and vllm-router 0.1.17 running over fleet-sim, and SMG's P/D metrics recorded from
//! it disaggregating over fleet-sim's SGLang prefill and decode replicas); [`probe`] does the bounded I/O.
//! Neither router has an API to change its policy, so the app says so rather than offering a push.

use fleet_telemetry::exposition::{self, Exposition};
use serde_json::Value;

use fleetdeck_api::PdWorkerType;

use super::admin::LegHistogram;

use fleet_base::http::{BodyError, read_limited};

/// Largest `/workers` or `/metrics` body read from a third-party router.
const MAX_BODY: usize = 4 << 20;
/// Deadline of one call.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(4);

/// Which third-party router answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerKind {
    Smg,
    VllmRouter,
    /// llm-d's inference scheduler (the EPP behind its gateway).
    LlmD,
    /// Dynamo's HTTP frontend (its router inside).
    Dynamo,
}

impl PeerKind {
    pub fn name(self) -> &'static str {
        match self {
            PeerKind::Smg => "smg",
            PeerKind::VllmRouter => "vllm-router",
            PeerKind::LlmD => "llm-d",
            PeerKind::Dynamo => "dynamo",
        }
    }

    /// Whether it lists its workers at `GET /workers` (else they come from its metrics, if at all).
    fn lists_workers(self) -> bool {
        matches!(self, PeerKind::Smg | PeerKind::VllmRouter)
    }

    /// Why the app cannot change this router's policy, shown in place of a push.
    pub fn read_only_reason(self) -> String {
        format!(
            "read-only: {} has no API to change its routing policy (it is set at launch), so the app only reads \
             its workers and metrics",
            self.name()
        )
    }

    fn metric_prefix(self) -> &'static str {
        match self {
            PeerKind::Smg => "smg_",
            PeerKind::VllmRouter => "vllm_router_",
            PeerKind::LlmD => "llm_d_inference_scheduler_",
            PeerKind::Dynamo => "dynamo_frontend_",
        }
    }
}

/// One worker (replica) as the router lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerWorker {
    pub url: String,
    pub healthy: Option<bool>,
    /// Requests the router counts as outstanding on it.
    pub load: Option<f64>,
    /// Its part in P/D disaggregation as the router lists it: `prefill`, `decode`, or `both` (SMG's
    /// `regular`, and any worker listed without a type).
    pub role: String,
}

/// What a third-party router says about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerState {
    pub kind: PeerKind,
    pub workers: Vec<PeerWorker>,
    /// The routing policy, read from the router's per-policy decision counters; None before it routed anything
    /// or without its metrics URL.
    pub policy: Option<String>,
    pub requests_total: Option<f64>,
    pub errors_total: Option<f64>,
    /// Why the metrics could not be read (the workers still show).
    pub metrics_error: Option<String>,
    /// Its cumulative P/D figures, when it disaggregates.
    pub pd: Option<PeerPd>,
}

/// A third-party router's cumulative P/D figures, as it times them itself (SMG's `smg_pd_*`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeerPd {
    /// Requests sent to a prefill worker (its prefill worker selections).
    pub splits: u64,
    /// Bootstrap, KV-transfer and rendezvous failures: SMG answers these as errors (no local fallback).
    pub failures: u64,
    /// Prefill dispatch to the first decode token.
    pub ttft: LegHistogram,
    /// Prefill dispatch to the end of the prefill answer.
    pub prefill: LegHistogram,
    /// The KV transfer, where it times it (SMG's gRPC path).
    pub transfer: LegHistogram,
    /// The decode side's own time to first token (SMG's gRPC path).
    pub decode_ttft: LegHistogram,
    /// Requests it decided to serve without a split, where it counts them (llm-d's `decode-only`).
    pub local: u64,
    /// Its workers' figures by `worker_type` (Dynamo's per-worker gauges), as they stand: the P/D view
    /// shows them as read.
    pub worker_types: Vec<PdWorkerType>,
}

/// Recognises a third-party router from its `GET /workers` body and, when that cannot tell (no workers
/// yet), its `GET /get_loads` body. Both list `workers` with `total` and `stats` (vllm-router derives from
/// SGLang's router); SMG's workers also carry `id`, `runtime_type`, `models` or `engine_load`, and SMG's
/// loads name its version (`smg-1.13.0`).
pub fn detect(workers_body: &[u8], loads_body: Option<&[u8]>) -> Option<PeerKind> {
    let value: Value = serde_json::from_slice(workers_body).ok()?;
    let workers = value.get("workers")?.as_array()?;
    if value.get("stats").is_none() || value.get("total").is_none() {
        return None;
    }
    let smg_fields = ["id", "runtime_type", "models", "engine_load"];
    if workers.iter().any(|w| smg_fields.iter().any(|f| w.get(f).is_some())) {
        return Some(PeerKind::Smg);
    }
    if !workers.is_empty() {
        return Some(PeerKind::VllmRouter);
    }
    let loads: Value = serde_json::from_slice(loads_body?).ok()?;
    let smg = loads.get("version").and_then(Value::as_str).is_some_and(|v| v.starts_with("smg"));
    Some(if smg { PeerKind::Smg } else { PeerKind::VllmRouter })
}

/// The workers of a `GET /workers` body (both routers name them by `url`).
pub fn parse_workers(body: &[u8]) -> Result<Vec<PeerWorker>, String> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| format!("/workers is not JSON: {}", super::admin::json_error_shape(&e)))?;
    let workers = value.get("workers").and_then(Value::as_array).ok_or("/workers has no `workers` list")?;
    let mut out: Vec<PeerWorker> = workers
        .iter()
        .filter_map(|w| {
            let role = match w.get("worker_type").and_then(Value::as_str) {
                Some("prefill") => "prefill",
                Some("decode") => "decode",
                _ => "both",
            };
            Some(PeerWorker {
                url: w.get("url")?.as_str()?.to_owned(),
                healthy: w.get("is_healthy").and_then(Value::as_bool),
                load: w.get("load").and_then(Value::as_f64),
                role: role.to_owned(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.url.cmp(&b.url));
    Ok(out)
}

/// A third-party router's own figures, from its metrics.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PeerMetrics {
    pub policy: Option<String>,
    pub requests_total: Option<f64>,
    pub errors_total: Option<f64>,
    pub pd: Option<PeerPd>,
    /// Workers known from its metrics (Dynamo's per-worker gauges), for routers with no worker list.
    pub workers: Vec<PeerWorker>,
}

/// Which third-party router a metrics text comes from, for routers known by their metrics alone.
pub fn detect_metrics(text: &str) -> Option<PeerKind> {
    let parsed = exposition::parse(text).ok()?;
    [PeerKind::LlmD, PeerKind::Dynamo].into_iter().find(|kind| parsed.has_prefix(kind.metric_prefix()))
}

/// The router's own figures from its metrics text: the policy (the `policy` label of its decision counters,
/// the most used if several), requests and error counts.
pub fn read_metrics(kind: PeerKind, text: &str) -> Result<PeerMetrics, String> {
    let parsed = exposition::parse(text).map_err(|e| format!("the metrics are not Prometheus text: {e}"))?;
    if !parsed.has_prefix(kind.metric_prefix()) {
        return Err(format!(
            "no {}* metrics here; is this the router's --prometheus-port?",
            kind.metric_prefix()
        ));
    }
    let (decisions, requests, errors): (&str, &str, Option<&str>) = match kind {
        PeerKind::Smg => ("smg_worker_selection_total", "smg_router_requests_total", None),
        PeerKind::VllmRouter => (
            "vllm_router_policy_decisions_total",
            "vllm_router_requests_total",
            Some("vllm_router_request_errors_total"),
        ),
        PeerKind::LlmD => return Ok(llm_d_metrics(&parsed)),
        PeerKind::Dynamo => return Ok(dynamo_metrics(&parsed)),
    };
    let mut by_policy: Vec<(String, f64)> = Vec::new();
    for sample in parsed.samples_named(decisions) {
        if let Some(policy) = sample.label("policy") {
            match by_policy.iter_mut().find(|(p, _)| p == policy) {
                Some((_, n)) => *n += sample.value,
                None => by_policy.push((policy.to_owned(), sample.value)),
            }
        }
    }
    let policy = by_policy.into_iter().max_by(|a, b| a.1.total_cmp(&b.1)).map(|(p, _)| p);
    let sum = |name: &str| {
        let mut samples = parsed.samples_named(name).peekable();
        samples.peek().is_some().then(|| samples.map(|s| s.value).sum::<f64>())
    };
    let errors = match (kind, errors) {
        (_, Some(name)) => sum(name),
        // SMG counts answers by status code.
        (PeerKind::Smg, None) => {
            let mut samples = parsed
                .samples_named("smg_http_responses_total")
                .filter(|s| s.label("status_code").is_some_and(|c| c.starts_with('5')))
                .peekable();
            Some(if samples.peek().is_some() { samples.map(|s| s.value).sum() } else { 0.0 })
        }
        (PeerKind::VllmRouter | PeerKind::LlmD | PeerKind::Dynamo, None) => None,
    };
    let pd = match kind {
        PeerKind::Smg => smg_pd(&parsed),
        _ => None,
    };
    Ok(PeerMetrics { policy, requests_total: sum(requests), errors_total: errors, pd, workers: Vec::new() })
}

/// llm-d's EPP: its P/D decisions by `decision_type` (the newer `disagg_decision_total` when it has one,
/// which also counts encode stages; else `pd_decision_total`). A decision with a prefill stage is a split.
fn llm_d_metrics(parsed: &Exposition) -> PeerMetrics {
    const PREFIX: &str = "llm_d_inference_scheduler_";
    let newer = format!("{PREFIX}disagg_decision_total");
    let name = if parsed.has(&newer) { newer } else { format!("{PREFIX}pd_decision_total") };
    let (mut splits, mut local) = (0.0, 0.0);
    let mut seen = false;
    for sample in parsed.samples_named(&name) {
        seen = true;
        match sample.label("decision_type") {
            Some(kind) if kind.contains("prefill") => splits += sample.value,
            _ => local += sample.value,
        }
    }
    let pd = seen.then(|| PeerPd { splits: splits as u64, local: local as u64, ..PeerPd::default() });
    PeerMetrics { requests_total: seen.then_some(splits + local), pd, ..PeerMetrics::default() }
}

/// Dynamo's frontend: requests by status, its TTFT histogram, and its workers by `worker_type` from the
/// per-worker gauges (each worker once per `worker_id`, whatever its data-parallel ranks).
fn dynamo_metrics(parsed: &Exposition) -> PeerMetrics {
    let requests: Vec<&exposition::Sample> = parsed.samples_named("dynamo_frontend_requests_total").collect();
    let requests_total = (!requests.is_empty()).then(|| requests.iter().map(|s| s.value).sum::<f64>());
    let errors_total = (!requests.is_empty()).then(|| {
        requests.iter().filter(|s| s.label("status").is_some_and(|v| v != "success")).map(|s| s.value).sum()
    });
    // worker_type -> worker_id -> (prefill tokens, decode blocks, last TTFT)
    type Gauges = (Option<f64>, Option<f64>, Option<f64>);
    let mut by_type: std::collections::BTreeMap<String, std::collections::BTreeMap<String, Gauges>> =
        Default::default();
    let gauges = [
        "dynamo_frontend_worker_active_prefill_tokens",
        "dynamo_frontend_worker_active_decode_blocks",
        "dynamo_frontend_worker_last_time_to_first_token_seconds",
    ];
    for (slot, name) in gauges.into_iter().enumerate() {
        for sample in parsed.samples_named(name) {
            let (Some(kind), Some(worker)) = (sample.label("worker_type"), sample.label("worker_id")) else {
                continue;
            };
            let entry = by_type.entry(kind.to_owned()).or_default().entry(worker.to_owned()).or_default();
            let field = match slot {
                0 => &mut entry.0,
                1 => &mut entry.1,
                _ => &mut entry.2,
            };
            *field = Some(match (slot, *field) {
                // The latest TTFT of a worker with several ranks: its slowest rank's.
                (2, Some(seen)) => seen.max(sample.value),
                (_, seen) => seen.unwrap_or(0.0) + sample.value,
            });
        }
    }
    let mut workers = Vec::new();
    let worker_types: Vec<PdWorkerType> = by_type
        .into_iter()
        .map(|(worker_type, members)| {
            let sum = |pick: fn(&Gauges) -> Option<f64>| {
                members.values().filter_map(pick).fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
            };
            let ttfts: Vec<f64> = members.values().filter_map(|g| g.2).collect();
            let role = match worker_type.as_str() {
                "prefill" | "decode" => worker_type.clone(),
                _ => "both".to_owned(),
            };
            workers.extend(members.keys().map(|id| PeerWorker {
                url: format!("dynamo worker {id}"),
                healthy: Some(true),
                load: None,
                role: role.clone(),
            }));
            PdWorkerType {
                workers: members.len() as u32,
                active_prefill_tokens: sum(|g| g.0),
                active_decode_blocks: sum(|g| g.1),
                last_ttft_ms: (!ttfts.is_empty())
                    .then(|| ttfts.iter().sum::<f64>() / ttfts.len() as f64 * 1e3),
                worker_type,
            }
        })
        .collect();
    let ttft = histogram(parsed, "dynamo_frontend_time_to_first_token_seconds");
    let disaggregated = worker_types.iter().any(|t| t.worker_type == "prefill");
    let pd = disaggregated.then(|| PeerPd { ttft, worker_types, ..PeerPd::default() });
    PeerMetrics { requests_total, errors_total, pd, workers, ..PeerMetrics::default() }
}

/// SMG's P/D figures: `None` unless it has selected a prefill worker or timed a P/D request.
fn smg_pd(parsed: &Exposition) -> Option<PeerPd> {
    let total = |name: &str| parsed.samples_named(name).map(|s| s.value).sum::<f64>() as u64;
    let splits = parsed
        .samples_named("smg_worker_selection_total")
        .filter(|s| s.label("worker_type") == Some("prefill"))
        .map(|s| s.value)
        .sum::<f64>() as u64;
    let pd = PeerPd {
        splits,
        failures: total("smg_pd_bootstrap_failures_total")
            + total("smg_pd_kv_transfer_failures_total")
            + total("smg_pd_rendezvous_failures_total"),
        ttft: histogram(parsed, "smg_pd_ttft_seconds"),
        prefill: histogram(parsed, "smg_pd_prefill_duration_seconds"),
        transfer: histogram(parsed, "smg_pd_kv_transfer_duration_seconds"),
        decode_ttft: histogram(parsed, "smg_pd_decode_ttft_seconds"),
        ..PeerPd::default()
    };
    (pd.splits > 0 || pd.ttft.count > 0 || pd.failures > 0).then_some(pd)
}

/// A histogram summed over its label sets: cumulative finite buckets, sum and count.
fn histogram(parsed: &Exposition, name: &str) -> LegHistogram {
    let mut buckets: Vec<(f64, u64)> = Vec::new();
    for sample in parsed.samples_named(&format!("{name}_bucket")) {
        let Some(le) = sample.label("le").and_then(|le| le.parse::<f64>().ok()).filter(|le| le.is_finite())
        else {
            continue;
        };
        match buckets.iter_mut().find(|(bound, _)| *bound == le) {
            Some((_, n)) => *n += sample.value as u64,
            None => buckets.push((le, sample.value as u64)),
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let sum = |suffix: &str| parsed.samples_named(&format!("{name}_{suffix}")).map(|s| s.value).sum::<f64>();
    LegHistogram { buckets, sum_s: sum("sum"), count: sum("count") as u64 }
}

/// GETs `url` within the deadline and size cap; the body of a 2xx answer.
async fn get(http: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let work = async {
        let response = http.get(url).send().await.map_err(|e| super::admin::connect_detail(&e))?;
        let status = response.status();
        let body = read_limited(response, MAX_BODY).await.map_err(|e| match e {
            BodyError::TooLarge => format!("more than {MAX_BODY} bytes"),
            BodyError::Broken(detail) => detail,
        })?;
        if status.is_success() { Ok(body) } else { Err(format!("HTTP {}", status.as_u16())) }
    };
    tokio::time::timeout(TIMEOUT, work).await.unwrap_or_else(|_| Err(format!("no answer within {TIMEOUT:?}")))
}

/// Asks `base_url` whether it is a third-party router: by its `/workers` (SMG, vllm-router), else by its
/// metrics at `metrics_url` (llm-d's EPP, Dynamo's frontend); None if neither is one of theirs.
pub async fn detect_at(
    http: &reqwest::Client,
    base_url: &str,
    metrics_url: Option<&str>,
) -> Option<PeerKind> {
    if let Ok(body) = get(http, &format!("{base_url}/workers")).await {
        if let Some(kind) = detect(&body, None) {
            return Some(kind);
        }
        if let Ok(loads) = get(http, &format!("{base_url}/get_loads")).await
            && let Some(kind) = detect(&body, Some(&loads))
        {
            return Some(kind);
        }
    }
    let text = get(http, metrics_url?).await.ok()?;
    detect_metrics(&String::from_utf8_lossy(&text))
}

/// Reads a known third-party router: its workers, and its metrics when `metrics_url` is given.
pub async fn probe(
    http: &reqwest::Client,
    kind: PeerKind,
    base_url: &str,
    metrics_url: Option<&str>,
) -> Result<PeerState, String> {
    let workers = if kind.lists_workers() {
        let body = get(http, &format!("{base_url}/workers"))
            .await
            .map_err(|e| format!("GET {base_url}/workers: {e}"))?;
        parse_workers(&body)?
    } else {
        Vec::new()
    };
    let mut state = PeerState {
        kind,
        workers,
        policy: None,
        requests_total: None,
        errors_total: None,
        metrics_error: None,
        pd: None,
    };
    match metrics_url {
        None => {
            state.metrics_error = Some(format!(
                "its policy and counts come from its metrics: add the router as URL,metrics=http://HOST:PORT/metrics \
                 (the port of {}'s --prometheus-port)",
                kind.name()
            ))
        }
        Some(url) => match get(http, url).await.and_then(|body| {
            read_metrics(kind, &String::from_utf8_lossy(&body)).map_err(|e| format!("{url}: {e}"))
        }) {
            Ok(metrics) => {
                state.policy = metrics.policy;
                state.requests_total = metrics.requests_total;
                state.errors_total = metrics.errors_total;
                if !kind.lists_workers() {
                    state.workers = metrics.workers;
                }
                // A router with prefill workers disaggregates: a zero reading before its first split lets
                // the P/D view count that split.
                let disaggregates = state.workers.iter().any(|w| w.role == "prefill");
                state.pd = metrics.pd.or_else(|| disaggregates.then(PeerPd::default));
            }
            Err(error) => state.metrics_error = Some(format!("metrics {url}: {error}")),
        },
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shapes as smg 1.13.0 and vllm-router 0.1.17 serve them (trimmed).
    const SMG_WORKERS: &str = r#"{"workers":[{"id":"01a2","model_id":"m","url":"http://127.0.0.1:18101",
        "models":[{"id":"m"}],"worker_type":"regular","connection_mode":"http","runtime_type":"vllm",
        "is_healthy":true,"status":"ready","load":0},{"id":"01a3","url":"http://127.0.0.1:18100","runtime_type":"vllm",
        "is_healthy":false,"load":2}],"total":2,"stats":{"prefill_count":0,"decode_count":0,"regular_count":2}}"#;
    const VLLM_WORKERS: &str = r#"{"workers":[{"url":"http://127.0.0.1:18101","model_id":"unknown",
        "worker_type":"regular","is_healthy":true,"load":0,"connection_mode":"Http","priority":50,"cost":1.0}],
        "total":1,"stats":{"prefill_count":0,"decode_count":0,"regular_count":1}}"#;

    #[test]
    fn the_two_routers_are_told_apart_and_others_are_not_taken_for_them() {
        assert_eq!(detect(SMG_WORKERS.as_bytes(), None), Some(PeerKind::Smg));
        assert_eq!(detect(VLLM_WORKERS.as_bytes(), None), Some(PeerKind::VllmRouter));
        assert_eq!(detect(br#"{"error":"not found"}"#, None), None);
        assert_eq!(detect(b"<html>", None), None);
        assert_eq!(detect(br#"{"workers":[{"name":"x"}]}"#, None), None);
        // No workers yet: the loads tell.
        let empty = br#"{"workers":[],"total":0,"stats":{}}"#;
        assert_eq!(detect(empty, None), None);
        let smg_loads = br#"{"timestamp":"t","version":"smg-1.13.0","dp_rank_count":0,"loads":[]}"#;
        assert_eq!(detect(empty, Some(smg_loads)), Some(PeerKind::Smg));
        assert_eq!(detect(empty, Some(br#"{"workers":[]}"#)), Some(PeerKind::VllmRouter));
    }

    #[test]
    fn workers_are_read_with_health_and_load() {
        let workers = parse_workers(SMG_WORKERS.as_bytes()).unwrap();
        assert_eq!(workers.len(), 2);
        assert_eq!(workers[0].url, "http://127.0.0.1:18100");
        assert_eq!((workers[0].healthy, workers[0].load), (Some(false), Some(2.0)));
        assert!(parse_workers(b"[]").is_err());
    }

    fn metrics(policy: &str, requests: f64, errors: f64) -> PeerMetrics {
        PeerMetrics {
            policy: Some(policy.into()),
            requests_total: Some(requests),
            errors_total: Some(errors),
            pd: None,
            workers: Vec::new(),
        }
    }

    #[test]
    fn policy_and_counts_come_from_the_routers_own_metrics() {
        let smg = "# TYPE smg_worker_selection_total counter\n\
            smg_worker_selection_total{worker_type=\"regular\",model=\"m\",policy=\"cache_aware\"} 7\n\
            smg_router_requests_total{endpoint=\"chat\",model=\"m\"} 5\n\
            smg_router_requests_total{endpoint=\"completions\",model=\"m\"} 2\n\
            smg_http_responses_total{path=\"/v1/chat/completions\",status_code=\"200\"} 5\n\
            smg_http_responses_total{path=\"/v1/chat/completions\",status_code=\"502\"} 1\n";
        assert_eq!(read_metrics(PeerKind::Smg, smg), Ok(metrics("cache_aware", 7.0, 1.0)));
        let vllm = "vllm_router_policy_decisions_total{policy=\"cache_aware\",worker=\"a\"} 3\n\
            vllm_router_policy_decisions_total{policy=\"cache_aware\",worker=\"b\"} 2\n\
            vllm_router_requests_total{route=\"/v1/chat/completions\"} 5\n\
            vllm_router_request_errors_total{route=\"/policy\",error_type=\"backend_error\"} 1\n";
        assert_eq!(read_metrics(PeerKind::VllmRouter, vllm), Ok(metrics("cache_aware", 5.0, 1.0)));
        // Before any request: no policy yet, said as None, not made up.
        assert_eq!(
            read_metrics(PeerKind::Smg, "smg_http_rate_limit_total 0\n"),
            Ok(PeerMetrics { errors_total: Some(0.0), ..PeerMetrics::default() })
        );
        assert!(
            read_metrics(PeerKind::Smg, "vllm:num_requests_running 1\n")
                .unwrap_err()
                .contains("--prometheus-port")
        );
    }

    /// SMG 1.13.0 in P/D mode (`--pd-disaggregation`, one SGLang prefill and one decode replica of fleet-sim)
    /// after three requests: its whole exposition, as recorded.
    const SMG_PD: &str = include_str!("fixtures/smg-1.13.0-pd.prom");

    #[test]
    fn smg_p_d_figures_come_from_its_own_histograms_and_worker_selections() {
        let metrics = read_metrics(PeerKind::Smg, SMG_PD).unwrap();
        assert_eq!(metrics.policy.as_deref(), Some("round_robin"));
        let pd = metrics.pd.expect("SMG disaggregated");
        assert_eq!((pd.splits, pd.failures), (3, 0));
        assert_eq!((pd.ttft.count, pd.prefill.count), (3, 3));
        assert!((pd.ttft.sum_s - 0.161_621_278).abs() < 1e-9, "{pd:?}");
        assert!(pd.prefill.sum_s < pd.ttft.sum_s, "the prefill is part of the TTFT: {pd:?}");
        // Cumulative finite buckets: +Inf is the count, not a bucket.
        assert!(pd.ttft.buckets.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "{pd:?}");
        assert_eq!(pd.ttft.buckets.last().map(|b| b.1), Some(3));
        assert!(pd.ttft.buckets.iter().all(|b| b.0.is_finite()));
        // Over HTTP SMG times neither the transfer nor the decode side alone: said as empty, not zero.
        assert_eq!((pd.transfer.count, pd.decode_ttft.count), (0, 0));
        // A router that does not disaggregate has no P/D figures.
        let plain = "smg_worker_selection_total{worker_type=\"regular\",policy=\"cache_aware\"} 7\n";
        assert_eq!(read_metrics(PeerKind::Smg, plain).unwrap().pd, None);
        let failing = "smg_worker_selection_total{worker_type=\"prefill\",policy=\"random\"} 2\n\
            smg_pd_bootstrap_failures_total{model=\"m\"} 1\nsmg_pd_kv_transfer_failures_total 2\n";
        let pd = read_metrics(PeerKind::Smg, failing).unwrap().pd.unwrap();
        assert_eq!((pd.splits, pd.failures), (2, 3));
    }

    #[test]
    fn smg_workers_carry_their_p_d_role() {
        let body = br#"{"workers":[{"id":"a","url":"http://p:1","worker_type":"prefill","bootstrap_port":1},
            {"id":"b","url":"http://d:1","worker_type":"decode"},{"id":"c","url":"http://r:1","worker_type":"regular"},
            {"url":"http://x:1"}],"total":4,"stats":{}}"#;
        let roles: Vec<String> = parse_workers(body).unwrap().into_iter().map(|w| w.role).collect();
        // Sorted by URL.
        assert_eq!(roles, ["decode", "prefill", "both", "both"].map(String::from));
    }

    /// llm-d's EPP: its decision counters as `pkg/metrics` names them (written from its source: no EPP runs
    /// here). The newer counter wins when both are served.
    const LLM_D: &str = "# TYPE llm_d_inference_scheduler_pd_decision_total counter\n\
        llm_d_inference_scheduler_pd_decision_total{decision_type=\"decode-only\"} 30\n\
        llm_d_inference_scheduler_pd_decision_total{decision_type=\"prefill-decode\"} 12\n";
    const LLM_D_NEWER: &str = "# TYPE llm_d_inference_scheduler_disagg_decision_total counter\n\
        llm_d_inference_scheduler_disagg_decision_total{model_name=\"m\",decision_type=\"decode-only\"} 5\n\
        llm_d_inference_scheduler_disagg_decision_total{model_name=\"m\",decision_type=\"prefill-decode\"} 3\n\
        llm_d_inference_scheduler_disagg_decision_total{model_name=\"m\",decision_type=\"encode-prefill-decode\"} 1\n\
        llm_d_inference_scheduler_disagg_decision_total{model_name=\"m\",decision_type=\"encode-decode\"} 2\n\
        llm_d_inference_scheduler_pd_decision_total{decision_type=\"prefill-decode\"} 99\n";

    #[test]
    fn llm_d_is_known_by_its_decision_counters_and_splits_are_decisions_with_a_prefill_stage() {
        assert_eq!(detect_metrics(LLM_D), Some(PeerKind::LlmD));
        let pd = read_metrics(PeerKind::LlmD, LLM_D).unwrap().pd.unwrap();
        assert_eq!((pd.splits, pd.local), (12, 30));
        let metrics = read_metrics(PeerKind::LlmD, LLM_D_NEWER).unwrap();
        let pd = metrics.pd.unwrap();
        assert_eq!((pd.splits, pd.local), (4, 7), "the newer counter, not the older one's 99");
        assert_eq!(metrics.requests_total, Some(11.0));
        assert!(read_metrics(PeerKind::LlmD, "smg_x 1\n").is_err());
    }

    /// Dynamo's frontend in a disaggregated deployment: per-worker gauges labelled `worker_type` (written
    /// from `prometheus_names.rs` and the KV router's worker monitor: no Dynamo runs here).
    const DYNAMO: &str = "\
        dynamo_frontend_requests_total{model=\"m\",endpoint=\"chat_completions\",request_type=\"stream\",status=\"success\"} 40\n\
        dynamo_frontend_requests_total{model=\"m\",endpoint=\"chat_completions\",request_type=\"stream\",status=\"error\"} 2\n\
        dynamo_frontend_time_to_first_token_seconds_bucket{model=\"m\",le=\"0.1\"} 30\n\
        dynamo_frontend_time_to_first_token_seconds_bucket{model=\"m\",le=\"1\"} 40\n\
        dynamo_frontend_time_to_first_token_seconds_bucket{model=\"m\",le=\"+Inf\"} 40\n\
        dynamo_frontend_time_to_first_token_seconds_sum{model=\"m\"} 4\n\
        dynamo_frontend_time_to_first_token_seconds_count{model=\"m\"} 40\n\
        dynamo_frontend_worker_active_prefill_tokens{worker_id=\"7\",dp_rank=\"0\",worker_type=\"prefill\"} 900\n\
        dynamo_frontend_worker_active_prefill_tokens{worker_id=\"8\",dp_rank=\"0\",worker_type=\"prefill\"} 100\n\
        dynamo_frontend_worker_active_decode_blocks{worker_id=\"9\",dp_rank=\"0\",worker_type=\"decode\"} 40\n\
        dynamo_frontend_worker_active_decode_blocks{worker_id=\"9\",dp_rank=\"1\",worker_type=\"decode\"} 60\n\
        dynamo_frontend_worker_last_time_to_first_token_seconds{worker_id=\"7\",worker_type=\"prefill\"} 0.2\n\
        dynamo_frontend_worker_last_time_to_first_token_seconds{worker_id=\"8\",worker_type=\"prefill\"} 0.4\n";

    #[test]
    fn dynamo_is_known_by_its_frontend_and_its_workers_come_by_worker_type() {
        assert_eq!(detect_metrics(DYNAMO), Some(PeerKind::Dynamo));
        let metrics = read_metrics(PeerKind::Dynamo, DYNAMO).unwrap();
        assert_eq!((metrics.requests_total, metrics.errors_total), (Some(42.0), Some(2.0)));
        let roles: Vec<&str> = metrics.workers.iter().map(|w| w.role.as_str()).collect();
        assert_eq!(roles, ["decode", "prefill", "prefill"], "one per worker id, its ranks together");
        let pd = metrics.pd.expect("a prefill worker type: disaggregated");
        assert_eq!((pd.ttft.count, pd.ttft.buckets.len()), (40, 2));
        let prefill = pd.worker_types.iter().find(|t| t.worker_type == "prefill").unwrap();
        assert_eq!((prefill.workers, prefill.active_prefill_tokens), (2, Some(1000.0)));
        assert!(prefill.last_ttft_ms.is_some_and(|ms| (ms - 300.0).abs() < 1e-6), "{prefill:?}");
        let decode = pd.worker_types.iter().find(|t| t.worker_type == "decode").unwrap();
        assert_eq!(
            (decode.workers, decode.active_decode_blocks, decode.last_ttft_ms),
            (1, Some(100.0), None)
        );
        // Aggregated (no prefill workers): no P/D figures.
        let aggregated = "dynamo_frontend_worker_active_decode_blocks{worker_id=\"1\",dp_rank=\"0\",worker_type=\"decode\"} 3\n";
        assert_eq!(read_metrics(PeerKind::Dynamo, aggregated).unwrap().pd, None);
        assert_eq!(detect_metrics("vllm:num_requests_running 1\n"), None);
    }
}
