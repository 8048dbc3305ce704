//! `fleet-sim bench`: replays a trace open-loop against any OpenAI endpoint and measures what clients see.
//!
//! Each record of the trace is sent at its own timestamp (divided by the speed-up), from its own task, so a
//! slow answer never delays the next arrival (open loop, as real traffic behaves). Its prompt is text
//! synthesised from its block ids ([`prompt`]), so requests the trace says share a prefix share it for real
//! and the replicas' prefix caches hit. Every request streams (`stream: true`, with the usage chunk), and its
//! time to first token, the gaps between tokens and its end-to-end time are taken on the client ([`sse`],
//! [`report`]). The prefix hit rate comes from the replicas' own `/metrics` (`--metrics`), read before and
//! after the run with fleet-telemetry's engine tables, so it is what the engines counted, whatever routed.
//!
//! Bounds: requests in flight are capped (`max_in_flight`); an arrival over the cap is counted as overflow
//! and not sent, so a stalled target shows up in the report instead of in the client's memory. Every request
//! has a deadline, a limit on silence between chunks and a limit on the bytes it may receive.

pub mod prompt;
pub mod report;
pub mod sse;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_base::error::error_chain;
use fleet_base::http::read_limited;
use fleet_telemetry::{ScrapeLimits, scrape};
use fleet_trace::Trace;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use report::{Completed, Outcome, PrefixCache, Report, Slo, Tally, cache_delta};
use sse::{SseReader, classify};

/// Which OpenAI route the requests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Api {
    /// `/v1/chat/completions`, the prompt as one user message.
    #[default]
    Chat,
    /// `/v1/completions`, the prompt as is.
    Completions,
}

impl std::str::FromStr for Api {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "chat" => Ok(Api::Chat),
            "completions" => Ok(Api::Completions),
            other => Err(format!("unknown API {other:?}: use chat or completions")),
        }
    }
}

/// What to run and its bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchConfig {
    /// Base URL of the OpenAI endpoint (a router, a gateway or one replica).
    pub target: String,
    /// More endpoints of the same fleet (several routers): the clients are spread over `target` and these,
    /// a trace session always to the same one (its conversation stays with one router), a request without
    /// a session by its index.
    pub also_targets: Vec<String>,
    pub api: Api,
    /// The `model` every request names; None asks the target's `/v1/models` (and leaves it out if that fails).
    pub model: Option<String>,
    /// Arrivals this many times faster than the trace's timestamps.
    pub speedup: f64,
    /// Send only the trace's first N records.
    pub max_requests: Option<usize>,
    /// Replicas' metrics endpoints (base URLs get `/metrics`) to read the prefix hit rate from.
    pub metrics: Vec<String>,
    /// Requests waiting for their answer at most; arrivals beyond it are counted as overflow.
    pub max_in_flight: usize,
    /// Deadline of one request, from sending to its last byte.
    pub request_timeout: Duration,
    /// Longest silence tolerated before the first byte and between chunks.
    pub idle_timeout: Duration,
    pub connect_timeout: Duration,
    /// Largest answer read; a larger one fails as `too_large`.
    pub max_response_bytes: usize,
    /// Ask engines to generate exactly the trace's output length (vLLM's and SGLang's `ignore_eos`).
    pub ignore_eos: bool,
    pub slo: Slo,
    /// How often progress goes to stderr (None: quiet).
    pub progress_every: Option<Duration>,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            target: "http://127.0.0.1:8080".into(),
            also_targets: Vec::new(),
            api: Api::Chat,
            model: None,
            speedup: 1.0,
            max_requests: None,
            metrics: Vec::new(),
            max_in_flight: 2048,
            request_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(5),
            max_response_bytes: 64 << 20,
            ignore_eos: true,
            slo: Slo::default(),
            progress_every: Some(Duration::from_secs(5)),
        }
    }
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("invalid setting: {0}")]
    Config(String),
    #[error(
        "cannot reach the target {url}: {detail}; is it running, and is the URL its base (http://HOST:PORT)?"
    )]
    Unreachable { url: String, detail: String },
    #[error("cannot read the replicas' metrics before the run: {0}; fix or drop that --metrics URL")]
    Metrics(#[from] fleet_telemetry::ScrapeError),
    #[error("cannot build an HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

impl BenchConfig {
    pub fn validate(&self) -> Result<(), BenchError> {
        let fail = |message: &str| Err(BenchError::Config(message.to_owned()));
        if !(self.speedup.is_finite() && self.speedup > 0.0) {
            return fail("--speedup must be a positive number (2 replays twice as fast)");
        }
        if self.max_in_flight == 0 {
            return fail("--max-in-flight must be at least 1");
        }
        if self.max_requests == Some(0) {
            return fail("--max-requests must be at least 1");
        }
        if !(self.target.starts_with("http://") || self.target.starts_with("https://")) {
            return fail("--target must be an http:// or https:// base URL, e.g. http://127.0.0.1:8080");
        }
        if self.also_targets.iter().any(|t| !(t.starts_with("http://") || t.starts_with("https://"))) {
            return fail("--also-target must be an http:// or https:// base URL, e.g. http://127.0.0.1:8081");
        }
        Ok(())
    }

    /// The generation route of every target: `target` first, then `also_targets`.
    fn routes(&self) -> Vec<Arc<String>> {
        std::iter::once(&self.target).chain(&self.also_targets).map(|t| Arc::new(self.route_of(t))).collect()
    }

    fn route_of(&self, target: &str) -> String {
        let base = target.trim_end_matches('/');
        match self.api {
            Api::Chat => format!("{base}/v1/chat/completions"),
            Api::Completions => format!("{base}/v1/completions"),
        }
    }
}

/// Live counters, for progress lines.
#[derive(Debug, Default)]
struct Progress {
    sent: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    overflow: AtomicU64,
}

/// Runs the benchmark: `trace_name` only labels the report. Cancelling stops new arrivals and abandons
/// requests in flight (counted as `cancelled`).
pub async fn run(
    config: &BenchConfig,
    trace: &Trace,
    trace_name: &str,
    cancel: CancellationToken,
) -> Result<Report, BenchError> {
    config.validate()?;
    let client = reqwest::Client::builder()
        .connect_timeout(config.connect_timeout)
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(config.max_in_flight)
        .build()?;
    let model = match &config.model {
        Some(model) => Some(model.clone()),
        None => discover_model(&client, config).await?,
    };
    let metrics_client = fleet_telemetry::scrape::client(config.connect_timeout)?;
    let limits = ScrapeLimits { timeout: Duration::from_secs(10), ..ScrapeLimits::default() };
    let before =
        futures_util::future::join_all(config.metrics.iter().map(|url| scrape(&metrics_client, url, limits)))
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;

    let records = &trace.records[..config.max_requests.unwrap_or(usize::MAX).min(trace.len())];
    let block_tokens = trace.block_tokens();
    let routes = config.routes();
    let progress = Arc::new(Progress::default());
    let in_flight = Arc::new(Semaphore::new(config.max_in_flight));
    let stop_progress = CancellationToken::new();
    if let Some(every) = config.progress_every {
        tokio::spawn(report_progress(progress.clone(), records.len(), every, stop_progress.clone()));
    }
    let mut tasks = JoinSet::new();
    let mut tally = Tally::default();
    let start = Instant::now();
    let first_ms = records.first().map_or(0, |r| r.timestamp);
    let mut max_lag = Duration::ZERO;
    for (index, record) in records.iter().enumerate() {
        let offset = Duration::from_secs_f64((record.timestamp - first_ms) as f64 / 1000.0 / config.speedup);
        let due = start + offset;
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep_until(due.into()) => {}
        }
        max_lag = max_lag.max(Instant::now().saturating_duration_since(due));
        while let Some(done) = tasks.try_join_next() {
            tally.outcomes.push(done.unwrap_or_else(|_| Outcome::Failed("cancelled".into())));
        }
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            progress.overflow.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        progress.sent.fetch_add(1, Ordering::Relaxed);
        let request = RequestSpec {
            prompt_ids: record.hash_ids.clone(),
            block_tokens,
            input_length: record.input_length,
            max_tokens: record.output_length.max(1),
            index: index as u64,
        };
        let url = routes[client_of(index, record.session, routes.len())].clone();
        let (client, model, progress) = (client.clone(), model.clone(), progress.clone());
        let limits = RequestLimits::of(config);
        let (api, ignore_eos) = (config.api, config.ignore_eos);
        tasks.spawn(async move {
            let body = request.body(api, model.as_deref(), ignore_eos);
            let outcome = send(&client, &url, body, limits).await;
            let counter =
                if matches!(outcome, Outcome::Completed(_)) { &progress.completed } else { &progress.failed };
            counter.fetch_add(1, Ordering::Relaxed);
            drop(permit);
            outcome
        });
    }
    loop {
        tokio::select! {
            () = cancel.cancelled() => {
                tasks.abort_all();
                while let Some(done) = tasks.join_next().await {
                    tally.outcomes.push(done.unwrap_or_else(|_| Outcome::Failed("cancelled".into())));
                }
                break;
            }
            done = tasks.join_next() => match done {
                Some(done) => tally.outcomes.push(done.unwrap_or_else(|_| Outcome::Failed("cancelled".into()))),
                None => break,
            }
        }
    }
    let duration_s = start.elapsed().as_secs_f64();
    stop_progress.cancel();

    let after =
        futures_util::future::join_all(config.metrics.iter().map(|url| scrape(&metrics_client, url, limits)))
            .await;
    let replicas = config
        .metrics
        .iter()
        .zip(before.iter().zip(after))
        .map(|(url, (before, after))| match after {
            Ok(after) => cache_delta(url, before, &after),
            Err(error) => report::ReplicaCache {
                metrics_url: url.clone(),
                engine: before.engine.name().to_owned(),
                queries: None,
                hits: None,
                hit_rate: None,
                note: Some(format!("reading its metrics after the run failed: {error}")),
            },
        })
        .collect();

    let mut report = tally.summarise(duration_s, config.slo);
    report.target = config.target.clone();
    report.trace = trace_name.to_owned();
    report.speedup = config.speedup;
    report.requests = records.len() as u64;
    report.overflow = progress.overflow.load(Ordering::Relaxed);
    report.max_send_lag_ms = max_lag.as_secs_f64() * 1e3;
    report.prefix_cache = PrefixCache::from_replicas(replicas, report.prefix_cache.usage_cached_share);
    Ok(report)
}

/// Asks the target which model it serves: the first of `/v1/models`. A target without that route still
/// gets the run (without a `model` field); one that cannot be reached at all stops it here.
async fn discover_model(
    client: &reqwest::Client,
    config: &BenchConfig,
) -> Result<Option<String>, BenchError> {
    let url = format!("{}/v1/models", config.target.trim_end_matches('/'));
    let unreachable = |detail: String| BenchError::Unreachable { url: config.target.clone(), detail };
    let response =
        tokio::time::timeout(config.connect_timeout + Duration::from_secs(5), client.get(&url).send())
            .await
            .map_err(|_| unreachable(format!("no answer to GET {url} within {:?}", config.connect_timeout)))?
            .map_err(|error| unreachable(error_chain(&error)))?;
    if !response.status().is_success() {
        eprintln!(
            "bench: GET {url} answered {}; requests go without a `model` (set --model to name one)",
            response.status()
        );
        return Ok(None);
    }
    let body = read_limited(response, 1 << 20).await.unwrap_or_default();
    let model = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.pointer("/data/0/id").and_then(Value::as_str).map(str::to_owned));
    if model.is_none() {
        eprintln!(
            "bench: GET {url} listed no model; requests go without a `model` (set --model to name one)"
        );
    }
    Ok(model)
}

async fn report_progress(progress: Arc<Progress>, total: usize, every: Duration, stop: CancellationToken) {
    let start = Instant::now();
    let mut ticks = tokio::time::interval(every);
    ticks.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (sent, completed, failed) =
            (load(&progress.sent), load(&progress.completed), load(&progress.failed));
        eprintln!(
            "bench: {:>5.0} s  sent {sent}/{total}  completed {completed}  failed {failed}  in flight {}  overflow {}",
            start.elapsed().as_secs_f64(),
            sent - completed - failed,
            load(&progress.overflow)
        );
    }
}

/// One request's content, turned into its JSON body on its own task (prompts can be megabytes).
struct RequestSpec {
    prompt_ids: Vec<u64>,
    block_tokens: u32,
    input_length: u32,
    max_tokens: u32,
    index: u64,
}

impl RequestSpec {
    fn body(&self, api: Api, model: Option<&str>, ignore_eos: bool) -> Vec<u8> {
        let text = prompt::prompt_text(&self.prompt_ids, self.block_tokens, self.input_length, self.index);
        let mut body = match api {
            Api::Chat => json!({"messages": [{"role": "user", "content": text}]}),
            Api::Completions => json!({"prompt": text}),
        };
        body["max_tokens"] = json!(self.max_tokens);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        if ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        if let Some(model) = model {
            body["model"] = json!(model);
        }
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

/// The bounds of one request.
#[derive(Debug, Clone, Copy)]
struct RequestLimits {
    total: Duration,
    idle: Duration,
    max_bytes: usize,
}

impl RequestLimits {
    fn of(config: &BenchConfig) -> Self {
        Self {
            total: config.request_timeout,
            idle: config.idle_timeout,
            max_bytes: config.max_response_bytes,
        }
    }
}

/// Sends one request and reads its stream to `[DONE]`, timing every chunk that carries text.
async fn send(client: &reqwest::Client, url: &str, body: Vec<u8>, limits: RequestLimits) -> Outcome {
    let sent = Instant::now();
    let deadline = sent + limits.total;
    let wait = |now: Instant| limits.idle.min(deadline.saturating_duration_since(now));
    let request =
        client.post(url).header(reqwest::header::CONTENT_TYPE, "application/json").body(body).send();
    let response = match tokio::time::timeout(wait(sent), request).await {
        Err(_) => return Outcome::Failed("timeout".into()),
        Ok(Err(error)) if error.is_connect() => return Outcome::Failed("connect".into()),
        Ok(Err(_)) => return Outcome::Failed("send".into()),
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    if !status.is_success() {
        return Outcome::Failed(format!("http_{}", status.as_u16()));
    }
    let is_sse = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_sse {
        return Outcome::Failed("not_streamed".into());
    }
    let mut chunks = response.bytes_stream();
    let mut reader = SseReader::default();
    let mut received = 0usize;
    let mut done = Completed::default();
    let (mut first, mut last, mut text_chunks) = (None::<Instant>, sent, 0u64);
    loop {
        let chunk = match tokio::time::timeout(wait(Instant::now()), chunks.next()).await {
            Err(_) => return Outcome::Failed("timeout".into()),
            Ok(None) => return Outcome::Failed("truncated".into()),
            Ok(Some(Err(_))) => return Outcome::Failed("stream_broken".into()),
            Ok(Some(Ok(chunk))) => chunk,
        };
        let now = Instant::now();
        received += chunk.len();
        if received > limits.max_bytes || reader.pending_len() > limits.max_bytes {
            return Outcome::Failed("too_large".into());
        }
        for data in reader.push(&chunk) {
            let event = classify(&data);
            if event.error.is_some() {
                return Outcome::Failed("stream_error".into());
            }
            if event.text_bytes > 0 {
                match first {
                    None => first = Some(now),
                    Some(_) => done.itl_s.push((now - last).as_secs_f64()),
                }
                last = now;
                text_chunks += 1;
            }
            if let Some(usage) = event.usage {
                done.output_tokens = usage.completion_tokens;
                done.prompt_tokens = Some(usage.prompt_tokens);
                done.cached_tokens = usage.cached_tokens;
            }
            if event.done {
                done.e2e_s = (now - sent).as_secs_f64();
                done.ttft_s = (first.unwrap_or(now) - sent).as_secs_f64();
                if done.output_tokens == 0 {
                    done.output_tokens = text_chunks;
                }
                return Outcome::Completed(done);
            }
        }
    }
}

/// Which of `clients` (the targets of a run, or a replay's routers) sends request `index`: a session's
/// requests always go through the same one, as a client keeps its connection; a request without a session
/// by its arrival index.
pub fn client_of(index: usize, session: Option<u64>, clients: usize) -> usize {
    let key = session.map_or(index as u64, |session| session.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32);
    (key % clients.max(1) as u64) as usize
}
