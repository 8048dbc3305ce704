//! The canary runner: a candidate goes to some routers, both sides are measured from the routers' recorded
//! traffic each tick, and fleet-rollout's state machine (pure) decides to keep watching, promote or roll
//! back. [`Canary`] performs each step it returns through [`Rollout`] (conditioned pushes and rollbacks,
//! over HTTP or through etcd keys) and writes every step to the audit trail.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_rollout::{
    Action, Canary as CanaryMachine, CanaryPlan, Guards, Phase, PushOutcome, SideWindow, Verdict,
};
use fleet_trace::TraceRecord;
use fleetdeck_api::{
    AbortCanaryArgs, ApiError, CanaryArgs, CanaryGuards, CanaryStatus, CanaryStep, CanaryView,
    GuardReadingView, MovedRouter, SideFigures,
};
use tokio_util::sync::CancellationToken;

use super::{Rollout, operator_name};
use crate::routers::admin::TracePage;
use crate::{lock, unix_ms_now};

/// Default time between two measurements of a canary.
pub const DEFAULT_CHECK_EVERY: Duration = Duration::from_secs(2);
/// Longest observation a canary may be given (a day).
const MAX_OBSERVE_S: u64 = 86_400;

/// The guards as the UI shows them, every one set.
pub(crate) fn guards_view(guards: &Guards) -> CanaryGuards {
    CanaryGuards {
        max_ttft_p95_ratio: Some(guards.max_ttft_p95_ratio),
        min_ttft_p95_increase_ms: Some(guards.min_ttft_p95_increase_ms),
        max_hit_rate_drop: Some(guards.max_hit_rate_drop),
        min_requests: Some(guards.min_requests),
        max_error_rate_ratio: Some(guards.max_error_rate_ratio),
        min_error_rate_increase: Some(guards.min_error_rate_increase),
        require_hit_rate: Some(guards.require_hit_rate),
    }
}

/// The guards the operator asked for, each one left unset taking the runner's default.
pub(crate) fn guards_of(asked: &CanaryGuards) -> Guards {
    let default = Guards::default();
    Guards {
        max_ttft_p95_ratio: asked.max_ttft_p95_ratio.unwrap_or(default.max_ttft_p95_ratio),
        min_ttft_p95_increase_ms: asked.min_ttft_p95_increase_ms.unwrap_or(default.min_ttft_p95_increase_ms),
        max_hit_rate_drop: asked.max_hit_rate_drop.unwrap_or(default.max_hit_rate_drop),
        min_requests: asked.min_requests.unwrap_or(default.min_requests),
        max_error_rate_ratio: asked.max_error_rate_ratio.unwrap_or(default.max_error_rate_ratio),
        min_error_rate_increase: asked.min_error_rate_increase.unwrap_or(default.min_error_rate_increase),
        require_hit_rate: asked.require_hit_rate.unwrap_or(default.require_hit_rate),
    }
}

/// The fields of a recorded request that a canary's guards read (hashes and the rest are not kept).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observed {
    /// Arrival (Unix ms).
    pub arrival_ms: u64,
    /// Prompt tokens, in the replica's own count when it reported one (what `cached_tokens` counts in).
    pub input_tokens: u32,
    /// Prompt tokens the replica served from its cache, when it said.
    pub cached_tokens: Option<u32>,
    /// Time to first token, when measured.
    pub ttft_ms: Option<f64>,
    /// The request failed: a 5xx (the router's 502s included) or a stream ended by an error event.
    pub failed: bool,
    /// The request succeeded (2xx, not ended by an error): only these have a TTFT worth judging; a fast 4xx
    /// is neither a good first token nor a server error.
    pub succeeded: bool,
}

impl From<&TraceRecord> for Observed {
    fn from(record: &TraceRecord) -> Self {
        let status = record.status.unwrap_or(200);
        let failed = status >= 500 || record.error.is_some();
        Self {
            arrival_ms: record.timestamp,
            input_tokens: record.engine_prompt_tokens(),
            cached_tokens: record.cached_tokens,
            ttft_ms: record.ttft_ms,
            failed,
            succeeded: !failed && (200..300).contains(&status),
        }
    }
}

/// What a canary has read of one router's recorded traffic: its cursor and every request since the canary
/// began. Each check reads only what the router added since the last one: a canary of an hour on a busy
/// fleet would otherwise download hours of records every few seconds, and soon more than a body may hold.
#[derive(Debug, Default)]
pub struct RouterTraffic {
    next: Option<u64>,
    epoch: Option<u64>,
    observed: Vec<Observed>,
}

impl RouterTraffic {
    /// The cursor to read the next page with.
    pub fn cursor(&self) -> u64 {
        self.next.unwrap_or(0)
    }

    /// Takes in a page read with [`Self::cursor`]. A router that restarted (new epoch, or a cursor that went
    /// back) answered with everything it holds, and a router too old to page (no cursor) with the whole
    /// window: both replace what was kept rather than add to it.
    pub fn absorb(&mut self, page: TracePage) {
        let restarted = self.epoch.is_some() && page.epoch != self.epoch
            || matches!((self.next, page.next), (Some(before), Some(now)) if now < before);
        if page.next.is_none() || restarted {
            self.observed.clear();
        }
        self.observed.extend(page.records.iter().map(Observed::from));
        (self.next, self.epoch) = (page.next, page.epoch);
    }
}

/// One side's figures from the routers' recorded requests that arrived at or after `since_ms`:
/// failed requests counted as errors, TTFT p95 (nearest rank) over the successful requests' `ttft_ms`, hit
/// rate = sum cached tokens / sum prompt tokens over the requests that report cached tokens.
pub fn side_window<'a>(observed: impl IntoIterator<Item = &'a Observed>, since_ms: u64) -> SideWindow {
    let recent: Vec<&Observed> = observed.into_iter().filter(|r| r.arrival_ms >= since_ms).collect();
    let errors = recent.iter().filter(|r| r.failed).count() as u64;
    let mut ttfts: Vec<f64> =
        recent.iter().filter(|r| r.succeeded).filter_map(|r| r.ttft_ms).filter(|t| t.is_finite()).collect();
    ttfts.sort_by(f64::total_cmp);
    // Nearest rank, as the what-if's replay reports its p95: the canary and the what-if agree by construction.
    let ttft_p95_s = fleet_base::quantile::nearest_rank(&ttfts, 0.95).map(|ms| ms / 1000.0);
    let (cached, input) = recent
        .iter()
        .filter_map(|r| r.cached_tokens.map(|c| (u64::from(c), u64::from(r.input_tokens))))
        .fold((0u64, 0u64), |(c, i), (rc, ri)| (c + rc, i + ri));
    let hit_rate = (input > 0).then(|| cached as f64 / input as f64);
    SideWindow { requests: recent.len() as u64, errors, ttft_p95_s, hit_rate }
}

fn figures(side: &SideWindow) -> SideFigures {
    SideFigures {
        requests: side.requests,
        errors: side.errors,
        ttft_p95_s: side.ttft_p95_s,
        hit_rate: side.hit_rate,
    }
}

#[derive(Debug)]
struct CanaryRun {
    status: CanaryStatus,
    abort: CancellationToken,
    abort_reason: Option<String>,
}

/// The canary runner: at most one canary at a time, and the last one's status. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Canary {
    inner: Arc<CanaryInner>,
}

#[derive(Debug)]
struct CanaryInner {
    rollout: Rollout,
    /// The running (or last) canary.
    run: Mutex<Option<CanaryRun>>,
    next_id: AtomicU64,
    /// The app's lifetime: a canary's own abort token is a child of it.
    cancel: CancellationToken,
}

impl Canary {
    pub(crate) fn new(rollout: Rollout, cancel: CancellationToken) -> Self {
        let inner = CanaryInner { rollout, run: Mutex::default(), next_id: AtomicU64::new(0), cancel };
        Self { inner: Arc::new(inner) }
    }

    /// Starts a canary: the candidate goes to `args.canary`, is watched against `args.baseline`,
    /// then promoted or rolled back by itself. One canary runs at a time.
    pub async fn start(&self, args: CanaryArgs) -> Result<CanaryStatus, ApiError> {
        let spec = super::spec_or_api_error(&args.text).await?;
        if args.observe_s == 0 || args.observe_s > MAX_OBSERVE_S {
            return Err(ApiError::new(
                "bad_request",
                format!("observe_s is {}; watch the canary for 1 to {MAX_OBSERVE_S} seconds", args.observe_s),
            ));
        }
        let check_every =
            Duration::from_millis(args.check_every_ms.unwrap_or(DEFAULT_CHECK_EVERY.as_millis() as u64));
        if !(Duration::from_millis(200)..=Duration::from_secs(600)).contains(&check_every) {
            return Err(ApiError::new(
                "bad_request",
                format!("check_every_ms is {}; measure every 200 to 600000 ms", check_every.as_millis()),
            ));
        }
        let canary_clients = self.inner.rollout.routers().clients_for(&args.canary)?;
        let baseline_clients = self.inner.rollout.routers().clients_for(&args.baseline)?;
        let plan = CanaryPlan {
            candidate: spec.clone(),
            canary: canary_clients.iter().map(|c| c.url.clone()).collect(),
            baseline: baseline_clients.iter().map(|c| c.url.clone()).collect(),
            observe_ms: args.observe_s * 1000,
            guards: guards_of(&args.guards),
        };
        let reviewed: HashMap<String, u64> = args
            .reviewed
            .iter()
            .filter_map(|t| Some((t.url.trim_end_matches('/').to_owned(), t.if_version?)))
            .collect();
        plan.validate().map_err(|e| ApiError::new("bad_request", e.to_string()))?;
        {
            let running = lock(&self.inner.run);
            if let Some(run) = running.as_ref().filter(|r| !r.status.finished) {
                return Err(ApiError::new(
                    "canary_running",
                    format!(
                        "canary {} is still {}; wait for it or abort it first",
                        run.status.label, run.status.phase
                    ),
                ));
            }
        }
        let author = operator_name(args.operator.as_deref());
        let all: Vec<String> = plan.canary.iter().chain(&plan.baseline).cloned().collect();
        let label = self
            .inner
            .rollout
            .audit()
            .record_version(&spec, &author, &all, &format!("canary-{}", spec.policy))
            .await?;
        let started_ms = unix_ms_now();
        let (canary, first) = CanaryMachine::start(plan.clone(), started_ms as u64)
            .map_err(|e| ApiError::new("bad_request", e.to_string()))?;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let abort = self.inner.cancel.child_token();
        let status = CanaryStatus {
            id,
            phase: "canary_pushing".to_owned(),
            reason: None,
            finished: false,
            policy: spec.policy.clone(),
            label: label.clone(),
            canary: plan.canary.clone(),
            baseline: plan.baseline.clone(),
            observe_s: args.observe_s,
            guards: guards_view(&plan.guards),
            started_ms,
            canary_side: SideFigures::default(),
            baseline_side: SideFigures::default(),
            measure_error: None,
            steps: Vec::new(),
            verdict: None,
            missing: Vec::new(),
            readings: Vec::new(),
            moved: Vec::new(),
        };
        *lock(&self.inner.run) =
            Some(CanaryRun { status: status.clone(), abort: abort.clone(), abort_reason: None });
        let control = self.clone();
        tokio::spawn(async move {
            control.run(canary, first, label, author, check_every, abort, reviewed).await;
        });
        Ok(status)
    }

    /// The current (or last) canary.
    pub async fn status(&self) -> Result<CanaryView, ApiError> {
        Ok(CanaryView { canary: lock(&self.inner.run).as_ref().map(|r| r.status.clone()) })
    }

    /// Stops the running canary; whatever took the candidate is rolled back.
    pub async fn abort(&self, args: AbortCanaryArgs) -> Result<CanaryView, ApiError> {
        {
            let mut canary = lock(&self.inner.run);
            match canary.as_mut() {
                Some(run) if !run.status.finished => {
                    run.abort_reason = Some(args.reason.trim().to_owned()).filter(|r| !r.is_empty());
                    run.abort.cancel();
                }
                _ => return Err(ApiError::new("no_canary", "no canary is running")),
            }
        }
        self.status().await
    }

    /// Updates the status the UI reads from the state machine.
    fn publish(
        &self,
        canary: &CanaryMachine,
        sides: Option<(SideWindow, SideWindow)>,
        measure_error: Option<String>,
    ) {
        let mut slot = lock(&self.inner.run);
        let Some(run) = slot.as_mut() else { return };
        let status = &mut run.status;
        let phase = canary.phase();
        status.phase = phase.name().to_owned();
        status.reason = match phase {
            Phase::RollingBack { reason } | Phase::RolledBack { reason } | Phase::Failed { reason } => {
                Some(reason.clone())
            }
            _ => None,
        };
        status.finished = phase.is_terminal();
        if let Some((c, b)) = sides {
            status.canary_side = figures(&c);
            status.baseline_side = figures(&b);
        }
        if measure_error.is_some() || sides.is_some() {
            status.measure_error = measure_error;
        }
        if let Some(judgement) = canary.judgement() {
            status.verdict = Some(judgement.verdict.name().to_owned());
            status.missing = match &judgement.verdict {
                Verdict::NotEnoughData { missing } => missing.clone(),
                _ => Vec::new(),
            };
            status.readings = judgement
                .readings
                .iter()
                .map(|r| GuardReadingView {
                    guard: r.guard.clone(),
                    canary: r.canary,
                    baseline: r.baseline,
                    state: r.state.clone(),
                    detail: r.detail.clone(),
                })
                .collect();
        }
        status.steps = canary
            .log()
            .iter()
            .map(|s| CanaryStep { at_ms: s.at_ms as i64, phase: s.phase.clone(), detail: s.detail.clone() })
            .collect();
    }

    /// Both sides' figures since `since_ms`, from every router's recorded traffic: reads what each router
    /// added since the last check into `traffic`. A router that cannot be read fails the measurement (the
    /// others' pages are kept; its own cursor stays, so nothing is lost). Also returns a line for each
    /// router whose ring dropped records before they were read.
    async fn measure(
        &self,
        plan: &CanaryPlan,
        since_ms: u64,
        traffic: &mut HashMap<String, RouterTraffic>,
    ) -> Result<(SideWindow, SideWindow, Vec<String>), String> {
        let urls: Vec<String> = plan.canary.iter().chain(&plan.baseline).cloned().collect();
        let clients = self.inner.rollout.routers().clients_for(&urls).map_err(|e| e.message)?;
        let pages = futures_util::future::join_all(clients.iter().map(|client| {
            let after = traffic.get(&client.url).map_or(0, RouterTraffic::cursor);
            client.trace_after(since_ms as i64, after)
        }))
        .await;
        let mut failure = None;
        let mut gaps = Vec::new();
        for (client, page) in clients.iter().zip(pages) {
            match page {
                Ok(page) => {
                    if page.missed > 0 {
                        gaps.push(format!(
                            "the router at {} dropped {} recorded requests before the canary read them \
                             (its trace ring is full between checks); the guards judge the rest, a sample",
                            client.url, page.missed
                        ));
                    }
                    traffic.entry(client.url.clone()).or_default().absorb(page);
                }
                Err(error) => failure = failure.or(Some(error.to_string())),
            }
        }
        if let Some(error) = failure {
            return Err(error);
        }
        let side = |urls: &[String]| {
            let kept = urls.iter().filter_map(|url| traffic.get(url.trim_end_matches('/')));
            side_window(kept.flat_map(|router| &router.observed), since_ms)
        };
        Ok((side(&plan.canary), side(&plan.baseline), gaps))
    }

    /// Adds routers that moved meanwhile to the status the UI reads.
    fn report_moved(&self, moved: Vec<MovedRouter>) {
        if moved.is_empty() {
            return;
        }
        if let Some(run) = lock(&self.inner.run).as_mut() {
            run.status.moved.extend(moved);
        }
    }

    /// Drives one canary to its end, performing each action the state machine returns. Every change is
    /// conditioned: pushes on the version the operator reviewed (`reviewed`, by router URL), rollbacks on
    /// the version the canary put in force.
    #[allow(clippy::too_many_arguments)] // one canary's settings, each from the operator's request
    async fn run(
        &self,
        mut canary: CanaryMachine,
        mut action: Action,
        label: String,
        author: String,
        check_every: Duration,
        abort: CancellationToken,
        reviewed: HashMap<String, u64>,
    ) {
        let mut logged = 0;
        let mut aborted = false;
        let mut traffic = HashMap::new();
        let mut applied_versions: HashMap<String, u64> = HashMap::new();
        loop {
            // Every new step goes to the audit trail as it happens.
            for step in &canary.log()[logged..] {
                self.inner
                    .rollout
                    .audit()
                    .note(&author, &format!("canary {label}: {}: {}", step.phase, step.detail))
                    .await;
            }
            logged = canary.log().len();
            let now = || unix_ms_now() as u64;
            if abort.is_cancelled() && !aborted && !canary.phase().is_terminal() {
                aborted = true;
                let reason = lock(&self.inner.run)
                    .as_ref()
                    .and_then(|r| r.abort_reason.clone())
                    .unwrap_or_else(|| "stopped".to_owned());
                if matches!(canary.phase(), Phase::Observing { .. } | Phase::CanaryPushing) {
                    action = canary.abort(&reason, now());
                    self.publish(&canary, None, None);
                    continue;
                }
            }
            match action {
                Action::Finished => {
                    self.publish(&canary, None, None);
                    return;
                }
                Action::Push { routers, spec } => {
                    let step =
                        if matches!(canary.phase(), Phase::Promoting) { "promotion" } else { "canary push" };
                    let (outcomes, moved) =
                        self.inner.rollout.push_to(&routers, &spec, &label, &reviewed, step).await;
                    self.report_moved(moved);
                    for (url, outcome) in &outcomes {
                        if let PushOutcome::Applied { version } = outcome {
                            applied_versions.insert(url.clone(), *version);
                        }
                    }
                    action = canary.on_push_outcomes(&outcomes, now());
                    if matches!(canary.phase(), Phase::Promoted) {
                        self.inner.rollout.set_intended(&label, spec);
                    }
                }
                Action::Rollback { routers } => {
                    let (outcomes, moved) =
                        self.inner.rollout.roll_back(&routers, &label, &author, &applied_versions).await;
                    self.report_moved(moved);
                    action = canary.on_rollback_outcomes(&outcomes, now());
                }
                Action::Observe => {
                    tokio::select! {
                        _ = abort.cancelled(), if !aborted => continue,
                        _ = tokio::time::sleep(check_every) => {}
                    }
                    let Phase::Observing { since_ms } = canary.phase().clone() else { continue };
                    match self.measure(canary.plan(), since_ms, &mut traffic).await {
                        Ok((c, b, gaps)) => {
                            for gap in gaps {
                                self.inner
                                    .rollout
                                    .audit()
                                    .note(&author, &format!("canary {label}: {gap}"))
                                    .await;
                            }
                            action = canary.on_observation(&c, &b, now());
                            self.publish(&canary, Some((c, b)), None);
                            continue;
                        }
                        Err(error) => {
                            // An unmeasurable window is not a verdict; keep watching, and show why.
                            self.publish(&canary, None, Some(error));
                            action =
                                canary.on_observation(&SideWindow::default(), &SideWindow::default(), now());
                            continue;
                        }
                    }
                }
            }
            self.publish(&canary, None, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ts: u64, input: u32, cached: Option<u32>, ttft_ms: Option<f64>) -> TraceRecord {
        serde_json::from_value(serde_json::json!({
            "timestamp": ts, "input_length": input, "output_length": 4, "hash_ids": [1],
            "cached_tokens": cached, "ttft_ms": ttft_ms,
        }))
        .unwrap()
    }

    #[test]
    fn a_side_counts_only_requests_since_the_canary_began() {
        let mut records: Vec<TraceRecord> =
            (1..=20).map(|i| record(1000 + i, 100, Some(50), Some(i as f64 * 10.0))).collect();
        records.push(record(10, 100, Some(0), Some(9999.0)));
        let records: Vec<Observed> = records.iter().map(Observed::from).collect();
        let side = side_window(&records, 1000);
        assert_eq!(side.requests, 20);
        assert_eq!(side.hit_rate, Some(0.5));
        // Nearest rank: the 19th of 20 sorted values.
        assert_eq!(side.ttft_p95_s, Some(0.19));
        let empty = side_window(&records, 5000);
        assert_eq!(empty, SideWindow { requests: 0, errors: 0, ttft_p95_s: None, hit_rate: None });
        let unknown = side_window(&[Observed::from(&record(2000, 100, None, None))], 0);
        assert_eq!((unknown.requests, unknown.hit_rate, unknown.ttft_p95_s), (1, None, None));
    }

    #[test]
    fn failed_answers_are_errors_and_never_good_first_tokens() {
        let answer = |status: u16, error: Option<&str>, ttft: Option<f64>| {
            let mut r = record(2000, 100, Some(50), ttft);
            r.status = Some(status);
            r.error = error.map(str::to_owned);
            Observed::from(&r)
        };
        let mut observed: Vec<Observed> = (0..18).map(|_| answer(200, None, Some(400.0))).collect();
        // Fast failures: a 500 passed on, the router's 502, a stream ended by the replica's error event,
        // a stream the replica broke off, and a 404 (the client's error: not a server error, no TTFT).
        observed.push(answer(500, None, Some(1.0)));
        observed.push(answer(502, Some("no_replica"), None));
        observed.push(answer(200, Some("stream_error"), Some(2.0)));
        observed.push(answer(502, Some("stream_broken"), Some(3.0)));
        observed.push(answer(404, None, Some(1.0)));
        let side = side_window(&observed, 0);
        assert_eq!((side.requests, side.errors), (23, 4));
        // Every fast failure left out: the p95 is the successful answers' 400 ms, not a millisecond.
        assert_eq!(side.ttft_p95_s, Some(0.4));
        // A record from a router too old to say its status counts as a success.
        let mut old = record(2000, 100, None, Some(10.0));
        old.status = None;
        assert!(Observed::from(&old).succeeded);
    }

    #[test]
    fn a_router_is_read_page_by_page_and_from_scratch_after_a_restart() {
        let page = |arrivals: &[u64], next: Option<u64>, epoch: Option<u64>| TracePage {
            records: arrivals.iter().map(|&ts| record(ts, 100, Some(10), Some(5.0))).collect(),
            next,
            epoch,
            missed: 0,
            more: 0,
        };
        let arrivals =
            |traffic: &RouterTraffic| traffic.observed.iter().map(|o| o.arrival_ms).collect::<Vec<_>>();
        let mut traffic = RouterTraffic::default();
        assert_eq!(traffic.cursor(), 0);
        traffic.absorb(page(&[10, 20], Some(2), Some(7)));
        // The next page holds only what was added since, including a request that arrived early.
        traffic.absorb(page(&[5, 30], Some(4), Some(7)));
        assert_eq!((arrivals(&traffic), traffic.cursor()), (vec![10, 20, 5, 30], 4));
        // The router restarted: a new epoch, and its answer is everything it holds.
        traffic.absorb(page(&[40], Some(1), Some(9)));
        assert_eq!((arrivals(&traffic), traffic.cursor()), (vec![40], 1));
        // A cursor that went back (a restart within one millisecond keeps the epoch) also starts over.
        traffic.absorb(page(&[50, 60], Some(3), Some(9)));
        traffic.absorb(page(&[70], Some(1), Some(9)));
        assert_eq!(arrivals(&traffic), [70]);
        // A router too old to page answers the whole window each time.
        let mut old = RouterTraffic::default();
        old.absorb(page(&[10, 20], None, None));
        old.absorb(page(&[10, 20, 30], None, None));
        assert_eq!((arrivals(&old), old.cursor()), (vec![10, 20, 30], 0));
    }

    #[test]
    fn unset_guards_take_the_runners_defaults_and_set_ones_are_kept() {
        let defaults = Guards::default();
        assert_eq!(guards_of(&CanaryGuards::default()), defaults);
        assert_eq!(guards_of(&guards_view(&defaults)), defaults);
        let asked =
            CanaryGuards { min_requests: Some(7), require_hit_rate: Some(false), ..CanaryGuards::default() };
        let guards = guards_of(&asked);
        assert_eq!((guards.min_requests, guards.require_hit_rate), (7, false));
        assert_eq!(guards.max_ttft_p95_ratio, defaults.max_ttft_p95_ratio);
    }
}
