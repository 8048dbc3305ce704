//! Routers other than fleet-router that operators run today: SGLang's Shepherd Model Gateway (`smg`) and
//! `vllm-router`. The app shows them beside its own routers, read-only: their workers from `GET /workers`,
//! and their policy and request counts from their own Prometheus metrics (`--prometheus-port`).
//!
//! Detection and parsing are pure and tested on the JSON and exposition text those routers serve (shapes
//! read from smg 1.13.0 and vllm-router 0.1.17 running over fleet-sim); [`probe`] does the bounded I/O.
//! Neither router has an API to change its policy, so the app says so rather than offering a push.

use fleet_telemetry::exposition;
use serde_json::Value;

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
}

impl PeerKind {
    pub fn name(self) -> &'static str {
        match self {
            PeerKind::Smg => "smg",
            PeerKind::VllmRouter => "vllm-router",
        }
    }

    /// Why the app cannot change this router's policy, shown in place of a push.
    pub fn read_only_reason(self) -> String {
        format!(
            "read-only: {} has no API to change its routing policy (it is set by --policy at launch), so the app \
             only reads its workers and metrics",
            self.name()
        )
    }

    fn metric_prefix(self) -> &'static str {
        match self {
            PeerKind::Smg => "smg_",
            PeerKind::VllmRouter => "vllm_router_",
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
            Some(PeerWorker {
                url: w.get("url")?.as_str()?.to_owned(),
                healthy: w.get("is_healthy").and_then(Value::as_bool),
                load: w.get("load").and_then(Value::as_f64),
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
        (PeerKind::VllmRouter, None) => None,
    };
    Ok(PeerMetrics { policy, requests_total: sum(requests), errors_total: errors })
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

/// Asks `base_url` whether it is a third-party router; None if `/workers` is not one of theirs.
pub async fn detect_at(http: &reqwest::Client, base_url: &str) -> Option<PeerKind> {
    let body = get(http, &format!("{base_url}/workers")).await.ok()?;
    if let Some(kind) = detect(&body, None) {
        return Some(kind);
    }
    let loads = get(http, &format!("{base_url}/get_loads")).await.ok()?;
    detect(&body, Some(&loads))
}

/// Reads a known third-party router: its workers, and its metrics when `metrics_url` is given.
pub async fn probe(
    http: &reqwest::Client,
    kind: PeerKind,
    base_url: &str,
    metrics_url: Option<&str>,
) -> Result<PeerState, String> {
    let body = get(http, &format!("{base_url}/workers"))
        .await
        .map_err(|e| format!("GET {base_url}/workers: {e}"))?;
    let workers = parse_workers(&body)?;
    let mut state = PeerState {
        kind,
        workers,
        policy: None,
        requests_total: None,
        errors_total: None,
        metrics_error: None,
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
}
