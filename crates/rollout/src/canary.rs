//! The canary state machine: push a candidate policy to some routers, compare them with the rest, then promote
//! the candidate to every router or roll the canaries back, on its own, when a guard is crossed.
//!
//! ```text
//! start ──► CanaryPushing ──all applied──► Observing ──observe_ms held──► Promoting ──► Promoted
//!               │ any refused                 │ guard crossed /
//!               ▼                             ▼ not enough data for 3 periods / abort
//!           RollingBack ◄─────────────────────┘ ──rollbacks applied──► RolledBack   (else Failed)
//! ```
//!
//! Each observation is judged by [`judge`]: every guard (TTFT p95 of good answers, error rate, hit rate)
//! gives a [`GuardReading`], and the [`Verdict`] is `crossed` (roll back), `not_enough_data` (too few
//! requests, no successful answers to time, no cached-token reports to compute a hit rate from) or
//! `holding`. Only a canary whose verdict is `holding` when its observation time is up is promoted.
//!
//! The caller performs each returned [`Action`] and reports the outcome back; time comes in as `now_ms`.
//! Every transition appends a [`Step`] to the log, which the app writes to its audit trail.

use fleet_policy::PolicySpec;
use serde::{Deserialize, Serialize};

use crate::push::PushOutcome;

/// A router, as the app names it (its admin URL).
pub type RouterKey = String;

/// When a canary is judged worse than the rest. Defaults: 1.25x TTFT p95 and at least 50 ms slower; twice
/// the error rate and at least 2 points more; 5 points of hit rate; 50 requests; hit rate required.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Guards {
    /// Roll back when the canaries' TTFT p95 exceeds this multiple of the baseline's...
    pub max_ttft_p95_ratio: f64,
    /// ...and is at least this many milliseconds above it: at millisecond TTFTs a ratio alone trips
    /// on noise (10 ms against 6 ms is 1.7x and harmless).
    pub min_ttft_p95_increase_ms: f64,
    /// Roll back when the canaries' prefix hit rate is this much below the baseline's (0.05 = 5 points).
    pub max_hit_rate_drop: f64,
    /// Requests each side must have served in the window before the guards judge it.
    pub min_requests: u64,
    /// Roll back when the canaries' error rate (5xx, 502s, streams ended by an error event) exceeds this
    /// multiple of the baseline's...
    pub max_error_rate_ratio: f64,
    /// ...and is at least this much above it (0.02 = 2 points): one failed request in fifty against none
    /// is infinitely many times worse and still noise.
    pub min_error_rate_increase: f64,
    /// Without a hit rate on both sides (replicas that never report cached tokens) the canary is not
    /// judged, so not promoted. `false` promotes on latency and errors alone, and says so.
    pub require_hit_rate: bool,
}

impl Default for Guards {
    fn default() -> Self {
        Guards {
            max_ttft_p95_ratio: 1.25,
            min_ttft_p95_increase_ms: 50.0,
            max_hit_rate_drop: 0.05,
            min_requests: 50,
            max_error_rate_ratio: 2.0,
            min_error_rate_increase: 0.02,
            require_hit_rate: true,
        }
    }
}

/// What the operator asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CanaryPlan {
    /// The policy to roll out.
    pub candidate: PolicySpec,
    /// Routers that take the candidate first.
    pub canary: Vec<RouterKey>,
    /// Routers that keep the current policy while the canary is watched; they take it on promotion.
    pub baseline: Vec<RouterKey>,
    /// How long the guards must hold before promotion.
    pub observe_ms: u64,
    pub guards: Guards,
}

/// A plan that cannot run, with what to change.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CanaryError {
    #[error("choose at least one canary router")]
    NoCanary,
    #[error("keep at least one router out of the canary: the guards compare the canary with the rest")]
    NoBaseline,
    #[error("router {0} is both canary and baseline; pick each router once")]
    Overlap(String),
    #[error("the candidate policy is invalid: {0}")]
    InvalidCandidate(String),
    #[error("{field} is {value}; {fix}")]
    Guard { field: &'static str, value: String, fix: &'static str },
}

impl CanaryPlan {
    /// Checks the plan before anything is pushed.
    pub fn validate(&self) -> Result<(), CanaryError> {
        if self.canary.is_empty() {
            return Err(CanaryError::NoCanary);
        }
        if self.baseline.is_empty() {
            return Err(CanaryError::NoBaseline);
        }
        if let Some(router) = self.canary.iter().find(|router| self.baseline.contains(router)) {
            return Err(CanaryError::Overlap(router.clone()));
        }
        self.candidate.validate().map_err(|e| CanaryError::InvalidCandidate(e.to_string()))?;
        let guards = &self.guards;
        if !(guards.max_ttft_p95_ratio.is_finite() && guards.max_ttft_p95_ratio >= 1.0) {
            return Err(CanaryError::Guard {
                field: "max_ttft_p95_ratio",
                value: guards.max_ttft_p95_ratio.to_string(),
                fix: "use a ratio of at least 1.0, e.g. 1.25 to allow 25% slower first tokens",
            });
        }
        if !(guards.min_ttft_p95_increase_ms.is_finite() && guards.min_ttft_p95_increase_ms >= 0.0) {
            return Err(CanaryError::Guard {
                field: "min_ttft_p95_increase_ms",
                value: guards.min_ttft_p95_increase_ms.to_string(),
                fix: "use 0 or more milliseconds, e.g. 50 to ignore smaller TTFT changes",
            });
        }
        if !(0.0..=1.0).contains(&guards.max_hit_rate_drop) {
            return Err(CanaryError::Guard {
                field: "max_hit_rate_drop",
                value: guards.max_hit_rate_drop.to_string(),
                fix: "use a fraction from 0 to 1, e.g. 0.05 for five points of hit rate",
            });
        }
        if !(guards.max_error_rate_ratio.is_finite() && guards.max_error_rate_ratio >= 1.0) {
            return Err(CanaryError::Guard {
                field: "max_error_rate_ratio",
                value: guards.max_error_rate_ratio.to_string(),
                fix: "use a ratio of at least 1.0, e.g. 2 to allow twice the baseline's error rate",
            });
        }
        if !(0.0..=1.0).contains(&guards.min_error_rate_increase) {
            return Err(CanaryError::Guard {
                field: "min_error_rate_increase",
                value: guards.min_error_rate_increase.to_string(),
                fix: "use a fraction from 0 to 1, e.g. 0.02 to ignore error rates within two points",
            });
        }
        if self.observe_ms == 0 {
            return Err(CanaryError::Guard {
                field: "observe_ms",
                value: "0".into(),
                fix: "watch the canary for some time, e.g. 60000 for a minute",
            });
        }
        Ok(())
    }
}

/// One side's figures over the observation window (from its routers' recorded traffic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SideWindow {
    /// Every request answered, failed ones included.
    pub requests: u64,
    /// Failed requests: a 5xx (the router's 502s included) or a stream ended by an error event.
    #[serde(default)]
    pub errors: u64,
    /// TTFT p95 over successful answers only (2xx, not ended by an error, a first token seen): a fast
    /// error is not a fast first token.
    pub ttft_p95_s: Option<f64>,
    /// Cached over prompt tokens, over the requests whose replica reported cached tokens.
    pub hit_rate: Option<f64>,
}

impl SideWindow {
    /// Failed over answered requests, when there were any.
    pub fn error_rate(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.errors as f64 / self.requests as f64)
    }
}

/// How one guard reads, as the UI shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuardReading {
    /// `ttft_p95`, `error_rate` or `hit_rate`.
    pub guard: String,
    pub canary: Option<f64>,
    pub baseline: Option<f64>,
    /// `ok`, `crossed` or `not_enough_data`.
    pub state: String,
    /// The limit, or what is missing, in words.
    pub detail: String,
}

/// What an observation concludes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Every guard could be judged and none is crossed.
    Holding,
    /// Some guard cannot be judged yet; never a promotion.
    NotEnoughData { missing: Vec<String> },
    /// A guard is crossed: roll back.
    Crossed { reason: String },
}

impl Verdict {
    /// The verdict's tag, as its JSON form names it.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Holding => "holding",
            Verdict::NotEnoughData { .. } => "not_enough_data",
            Verdict::Crossed { .. } => "crossed",
        }
    }
}

/// A verdict with each guard's reading.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    pub verdict: Verdict,
    pub readings: Vec<GuardReading>,
}

/// Where the canary is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    CanaryPushing,
    Observing {
        since_ms: u64,
    },
    Promoting,
    RollingBack {
        reason: String,
    },
    Promoted,
    RolledBack {
        reason: String,
    },
    /// A rollback did not apply everywhere: some routers still run the candidate and need the operator.
    Failed {
        reason: String,
    },
}

impl Phase {
    /// True once nothing more will happen.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Phase::Promoted | Phase::RolledBack { .. } | Phase::Failed { .. })
    }

    /// The phase's tag, as its JSON form names it (`"observing"`, `"rolled_back"`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Phase::CanaryPushing => "canary_pushing",
            Phase::Observing { .. } => "observing",
            Phase::Promoting => "promoting",
            Phase::RollingBack { .. } => "rolling_back",
            Phase::Promoted => "promoted",
            Phase::RolledBack { .. } => "rolled_back",
            Phase::Failed { .. } => "failed",
        }
    }
}

/// What the caller must do next.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Push `spec` to these routers (compare-and-swap against the version each runs) and report the outcomes
    /// with [`Canary::on_push_outcomes`].
    Push { routers: Vec<RouterKey>, spec: PolicySpec },
    /// Restore the previous policy on these routers (`POST /admin/policy/rollback`) and report the outcomes
    /// with [`Canary::on_rollback_outcomes`].
    Rollback { routers: Vec<RouterKey> },
    /// Measure both sides and call [`Canary::on_observation`] again later.
    Observe,
    /// Nothing more to do.
    Finished,
}

/// One entry of the canary's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub at_ms: u64,
    /// The phase entered (or kept) by this step.
    pub phase: String,
    pub detail: String,
}

/// A canary in progress.
#[derive(Clone, Debug, Serialize)]
pub struct Canary {
    plan: CanaryPlan,
    phase: Phase,
    /// Routers that currently run the candidate because of this canary.
    applied: Vec<RouterKey>,
    log: Vec<Step>,
    judgement: Option<Judgement>,
}

/// Without enough traffic to judge for this many observation periods, the canary is rolled back: an
/// unjudged policy is not promoted.
const MAX_UNJUDGED_PERIODS: u64 = 3;

impl Canary {
    /// Validates the plan and returns the first action: push the candidate to the canary routers.
    pub fn start(plan: CanaryPlan, now_ms: u64) -> Result<(Canary, Action), CanaryError> {
        plan.validate()?;
        let action = Action::Push { routers: plan.canary.clone(), spec: plan.candidate.clone() };
        let mut canary = Canary {
            plan,
            phase: Phase::CanaryPushing,
            applied: Vec::new(),
            log: Vec::new(),
            judgement: None,
        };
        let detail = format!(
            "pushing {} to canary {}; baseline {}",
            canary.plan.candidate.policy,
            canary.plan.canary.join(", "),
            canary.plan.baseline.join(", ")
        );
        canary.record(now_ms, detail);
        Ok((canary, action))
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    pub fn plan(&self) -> &CanaryPlan {
        &self.plan
    }

    pub fn log(&self) -> &[Step] {
        &self.log
    }

    /// Routers that run the candidate because of this canary.
    pub fn applied(&self) -> &[RouterKey] {
        &self.applied
    }

    /// Reports what the routers answered to the last [`Action::Push`].
    pub fn on_push_outcomes(&mut self, outcomes: &[(RouterKey, PushOutcome)], now_ms: u64) -> Action {
        if !matches!(self.phase, Phase::CanaryPushing | Phase::Promoting) {
            return self.idle_action();
        }
        let mut failures = Vec::new();
        for (router, outcome) in outcomes {
            match outcome {
                PushOutcome::Applied { version } => {
                    if !self.applied.contains(router) {
                        self.applied.push(router.clone());
                    }
                    self.note(now_ms, format!("{router} applied version {version}"));
                }
                other => failures.push(format!("{router}: {}", describe(other))),
            }
        }
        let expected = match self.phase {
            Phase::CanaryPushing => &self.plan.canary,
            _ => &self.plan.baseline,
        };
        let unanswered: Vec<&RouterKey> =
            expected.iter().filter(|r| !outcomes.iter().any(|(answered, _)| answered == *r)).collect();
        failures.extend(unanswered.into_iter().map(|router| format!("{router}: no outcome reported")));

        if matches!(self.phase, Phase::Promoting) {
            self.phase = Phase::Promoted;
            let detail = if failures.is_empty() {
                "promoted to every router".to_owned()
            } else {
                format!("promoted; these routers did not take it and drift: {}", failures.join("; "))
            };
            self.record(now_ms, detail);
            return Action::Finished;
        }
        if failures.is_empty() {
            self.phase = Phase::Observing { since_ms: now_ms };
            self.record(now_ms, format!("watching the canary for {} ms", self.plan.observe_ms));
            return Action::Observe;
        }
        self.roll_back(format!("the canary push failed: {}", failures.join("; ")), now_ms)
    }

    /// The last observation's judgement, if one was made.
    pub fn judgement(&self) -> Option<&Judgement> {
        self.judgement.as_ref()
    }

    /// Reports both sides' figures; judges the guards and decides to keep watching, promote or roll back.
    pub fn on_observation(&mut self, canary: &SideWindow, baseline: &SideWindow, now_ms: u64) -> Action {
        let Phase::Observing { since_ms } = self.phase else { return self.idle_action() };
        let judgement = judge(&self.plan.guards, canary, baseline);
        let verdict = judgement.verdict.clone();
        self.judgement = Some(judgement);
        if let Verdict::Crossed { reason } = verdict {
            return self.roll_back(reason, now_ms);
        }
        let watched = now_ms.saturating_sub(since_ms);
        if watched < self.plan.observe_ms {
            return Action::Observe;
        }
        if verdict == Verdict::Holding {
            self.phase = Phase::Promoting;
            self.record(
                now_ms,
                format!(
                    "guards held for {watched} ms (canary {}, baseline {}); promoting to {}",
                    summary(canary),
                    summary(baseline),
                    self.plan.baseline.join(", ")
                ),
            );
            return Action::Push { routers: self.plan.baseline.clone(), spec: self.plan.candidate.clone() };
        }
        if let Verdict::NotEnoughData { missing } = verdict
            && watched >= self.plan.observe_ms.saturating_mul(MAX_UNJUDGED_PERIODS)
        {
            return self.roll_back(
                format!("not enough data to judge after {watched} ms: {}", missing.join("; ")),
                now_ms,
            );
        }
        Action::Observe
    }

    /// Reports what the routers answered to the last [`Action::Rollback`].
    pub fn on_rollback_outcomes(&mut self, outcomes: &[(RouterKey, PushOutcome)], now_ms: u64) -> Action {
        let Phase::RollingBack { reason } = &self.phase else { return self.idle_action() };
        let reason = reason.clone();
        let mut stuck = Vec::new();
        for (router, outcome) in outcomes {
            if outcome.is_applied() {
                self.applied.retain(|r| r != router);
                self.note(now_ms, format!("{router} restored its previous policy"));
            } else {
                stuck.push(format!("{router}: {}", describe(outcome)));
            }
        }
        stuck.extend(
            self.applied
                .iter()
                .filter(|r| !outcomes.iter().any(|(answered, _)| answered == *r))
                .map(|router| format!("{router}: no outcome reported")),
        );
        if stuck.is_empty() {
            self.phase = Phase::RolledBack { reason: reason.clone() };
            self.record(now_ms, format!("rolled back: {reason}"));
        } else {
            let detail = format!("rollback incomplete, still on the candidate: {}", stuck.join("; "));
            self.phase = Phase::Failed { reason: format!("{reason}; {detail}") };
            self.record(now_ms, detail);
        }
        Action::Finished
    }

    /// The operator stops the canary: whatever took the candidate is rolled back.
    pub fn abort(&mut self, reason: &str, now_ms: u64) -> Action {
        if self.phase.is_terminal() {
            return Action::Finished;
        }
        self.roll_back(format!("aborted by the operator: {reason}"), now_ms)
    }

    fn roll_back(&mut self, reason: String, now_ms: u64) -> Action {
        if self.applied.is_empty() {
            self.phase = Phase::RolledBack { reason: reason.clone() };
            self.record(now_ms, format!("nothing to roll back: {reason}"));
            return Action::Finished;
        }
        self.phase = Phase::RollingBack { reason: reason.clone() };
        self.record(now_ms, format!("rolling back {}: {reason}", self.applied.join(", ")));
        Action::Rollback { routers: self.applied.clone() }
    }

    /// The action that matches the current phase when an outcome arrives out of turn (ignored, not fatal).
    fn idle_action(&self) -> Action {
        match &self.phase {
            Phase::Observing { .. } => Action::Observe,
            Phase::RollingBack { .. } => Action::Rollback { routers: self.applied.clone() },
            Phase::CanaryPushing => {
                Action::Push { routers: self.plan.canary.clone(), spec: self.plan.candidate.clone() }
            }
            Phase::Promoting => {
                Action::Push { routers: self.plan.baseline.clone(), spec: self.plan.candidate.clone() }
            }
            _ => Action::Finished,
        }
    }

    fn record(&mut self, at_ms: u64, detail: String) {
        self.log.push(Step { at_ms, phase: self.phase.name().to_owned(), detail });
    }

    fn note(&mut self, at_ms: u64, detail: String) {
        self.record(at_ms, detail);
    }
}

/// Judges one observation: each guard's reading and the verdict. A crossed guard wins over missing data
/// elsewhere (a canary failing every request has no TTFT to compare, and must still roll back).
pub fn judge(guards: &Guards, canary: &SideWindow, baseline: &SideWindow) -> Judgement {
    let mut readings = Vec::new();
    let mut crossed = Vec::new();
    let mut missing = Vec::new();
    let ms = |s: Option<f64>| s.map(|s| s * 1e3);
    if canary.requests < guards.min_requests || baseline.requests < guards.min_requests {
        missing.push(format!(
            "too few requests (canary {}, baseline {}; {} needed on each side)",
            canary.requests, baseline.requests, guards.min_requests
        ));
        // Too few to judge any guard fairly: report the figures, judge nothing.
        for (guard, c, b) in [
            ("ttft_p95", ms(canary.ttft_p95_s), ms(baseline.ttft_p95_s)),
            ("error_rate", canary.error_rate(), baseline.error_rate()),
            ("hit_rate", canary.hit_rate, baseline.hit_rate),
        ] {
            readings.push(reading(guard, c, b, "not_enough_data", "too few requests".to_owned()));
        }
        return Judgement { verdict: Verdict::NotEnoughData { missing }, readings };
    }

    // Errors: judged whenever there are requests.
    let (c_err, b_err) = (canary.error_rate().unwrap_or(0.0), baseline.error_rate().unwrap_or(0.0));
    let limit = format!(
        "limit {:.2}x and +{:.1} points",
        guards.max_error_rate_ratio,
        guards.min_error_rate_increase * 100.0
    );
    if c_err > guards.max_error_rate_ratio * b_err && c_err - b_err >= guards.min_error_rate_increase {
        crossed.push(format!(
            "canary error rate {:.1}% ({} of {}) against the baseline's {:.1}% ({limit})",
            c_err * 100.0,
            canary.errors,
            canary.requests,
            b_err * 100.0
        ));
        readings.push(reading("error_rate", Some(c_err), Some(b_err), "crossed", limit));
    } else {
        readings.push(reading("error_rate", Some(c_err), Some(b_err), "ok", limit));
    }

    // TTFT of successful answers.
    match (canary.ttft_p95_s, baseline.ttft_p95_s) {
        (Some(c), Some(b)) => {
            let limit = format!(
                "limit {:.2}x and +{:.0} ms",
                guards.max_ttft_p95_ratio, guards.min_ttft_p95_increase_ms
            );
            if b > 0.0
                && c > guards.max_ttft_p95_ratio * b
                && (c - b) * 1e3 >= guards.min_ttft_p95_increase_ms
            {
                crossed.push(format!(
                    "canary TTFT p95 {:.0} ms is {:.2}x the baseline's {:.0} ms ({limit})",
                    c * 1e3,
                    c / b,
                    b * 1e3
                ));
                readings.push(reading("ttft_p95", Some(c * 1e3), Some(b * 1e3), "crossed", limit));
            } else {
                readings.push(reading("ttft_p95", Some(c * 1e3), Some(b * 1e3), "ok", limit));
            }
        }
        (c, b) => {
            let sides: Vec<&str> = [("canary", c), ("baseline", b)]
                .into_iter()
                .filter(|(_, v)| v.is_none())
                .map(|(n, _)| n)
                .collect();
            let what = format!("no successful answer with a first token on the {}", sides.join(" and "));
            missing.push(what.clone());
            readings.push(reading("ttft_p95", ms(c), ms(b), "not_enough_data", what));
        }
    }

    // Hit rate.
    match (canary.hit_rate, baseline.hit_rate) {
        (Some(c), Some(b)) => {
            let limit = format!("limit -{:.1} points", guards.max_hit_rate_drop * 100.0);
            if b - c > guards.max_hit_rate_drop {
                crossed.push(format!(
                    "canary hit rate {:.1}% is {:.1} points below the baseline's {:.1}% ({limit})",
                    c * 100.0,
                    (b - c) * 100.0,
                    b * 100.0
                ));
                readings.push(reading("hit_rate", Some(c), Some(b), "crossed", limit));
            } else {
                readings.push(reading("hit_rate", Some(c), Some(b), "ok", limit));
            }
        }
        (c, b) => {
            let sides: Vec<&str> = [("canary", c), ("baseline", b)]
                .into_iter()
                .filter(|(_, v)| v.is_none())
                .map(|(n, _)| n)
                .collect();
            let what = format!(
                "no cached-token reports from the {} replicas, so the hit rate cannot be judged",
                sides.join(" and ")
            );
            if guards.require_hit_rate {
                missing.push(what.clone());
                readings.push(reading("hit_rate", c, b, "not_enough_data", what));
            } else {
                readings.push(reading("hit_rate", c, b, "ok", format!("not judged (not required): {what}")));
            }
        }
    }

    let verdict = if !crossed.is_empty() {
        Verdict::Crossed { reason: crossed.join("; ") }
    } else if !missing.is_empty() {
        Verdict::NotEnoughData { missing }
    } else {
        Verdict::Holding
    };
    Judgement { verdict, readings }
}

fn reading(
    guard: &str,
    canary: Option<f64>,
    baseline: Option<f64>,
    state: &str,
    detail: String,
) -> GuardReading {
    GuardReading { guard: guard.to_owned(), canary, baseline, state: state.to_owned(), detail }
}

fn summary(side: &SideWindow) -> String {
    let p95 = side.ttft_p95_s.map_or("-".to_owned(), |s| format!("{:.0} ms", s * 1e3));
    let hit = side.hit_rate.map_or("-".to_owned(), |h| format!("{:.1}%", h * 100.0));
    format!("{} requests, {} errors, TTFT p95 {p95}, hit {hit}", side.requests, side.errors)
}

fn describe(outcome: &PushOutcome) -> String {
    match outcome {
        PushOutcome::Applied { version } => format!("applied version {version}"),
        PushOutcome::Refused { status, code, message } => format!("refused ({status} {code}): {message}"),
        PushOutcome::Unreachable { error } => format!("unreachable: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_name_is_its_json_tag() {
        let reason = || "r".to_owned();
        for phase in [
            Phase::CanaryPushing,
            Phase::Observing { since_ms: 1 },
            Phase::Promoting,
            Phase::RollingBack { reason: reason() },
            Phase::Promoted,
            Phase::RolledBack { reason: reason() },
            Phase::Failed { reason: reason() },
        ] {
            let json = serde_json::to_value(&phase).unwrap();
            assert_eq!(json["phase"], phase.name(), "{json}");
        }
    }

    fn plan() -> CanaryPlan {
        CanaryPlan {
            candidate: PolicySpec::named("cache_aware_approx"),
            canary: vec!["a".into()],
            baseline: vec!["b".into(), "c".into()],
            observe_ms: 1_000,
            guards: Guards::default(),
        }
    }

    fn applied(routers: &[&str]) -> Vec<(RouterKey, PushOutcome)> {
        routers.iter().map(|r| (r.to_string(), PushOutcome::Applied { version: 2 })).collect()
    }

    fn side(requests: u64, p95: f64, hit: f64) -> SideWindow {
        SideWindow { requests, errors: 0, ttft_p95_s: Some(p95), hit_rate: Some(hit) }
    }

    #[test]
    fn a_healthy_canary_is_promoted_after_the_observation_time() {
        let (mut canary, first) = Canary::start(plan(), 0).unwrap();
        assert_eq!(first, Action::Push { routers: vec!["a".into()], spec: plan().candidate });
        assert_eq!(canary.on_push_outcomes(&applied(&["a"]), 10), Action::Observe);
        assert_eq!(canary.on_observation(&side(80, 0.2, 0.6), &side(90, 0.19, 0.5), 500), Action::Observe);
        let promote = canary.on_observation(&side(160, 0.2, 0.6), &side(180, 0.19, 0.5), 1_010);
        assert_eq!(promote, Action::Push { routers: vec!["b".into(), "c".into()], spec: plan().candidate });
        assert_eq!(canary.on_push_outcomes(&applied(&["b", "c"]), 1_020), Action::Finished);
        assert_eq!(canary.phase(), &Phase::Promoted);
        let phases: Vec<&str> = canary.log().iter().map(|s| s.phase.as_str()).collect();
        assert_eq!(phases.first(), Some(&"canary_pushing"));
        assert_eq!(phases.last(), Some(&"promoted"));
    }

    #[test]
    fn slower_first_tokens_roll_the_canary_back_by_themselves() {
        let (mut canary, _) = Canary::start(plan(), 0).unwrap();
        canary.on_push_outcomes(&applied(&["a"]), 0);
        let action = canary.on_observation(&side(60, 0.5, 0.6), &side(60, 0.2, 0.6), 300);
        assert_eq!(action, Action::Rollback { routers: vec!["a".into()] });
        let Phase::RollingBack { reason } = canary.phase().clone() else { panic!("{:?}", canary.phase()) };
        assert!(reason.contains("2.50x") && reason.contains("limit 1.25x"), "{reason}");
        assert_eq!(canary.judgement().map(|j| j.verdict.name()), Some("crossed"));
        assert_eq!(canary.on_rollback_outcomes(&applied(&["a"]), 400), Action::Finished);
        assert!(matches!(canary.phase(), Phase::RolledBack { .. }));
        assert!(canary.applied().is_empty());
    }

    #[test]
    fn a_slower_ratio_within_the_absolute_slack_is_noise_not_a_rollback() {
        let (mut canary, _) = Canary::start(plan(), 0).unwrap();
        canary.on_push_outcomes(&applied(&["a"]), 0);
        // 1.7x, but only 7 ms: under the default 50 ms slack.
        assert_eq!(canary.on_observation(&side(60, 0.017, 0.6), &side(60, 0.010, 0.6), 300), Action::Observe);
        let mut negative = plan();
        negative.guards.min_ttft_p95_increase_ms = -1.0;
        assert!(Canary::start(negative, 0).unwrap_err().to_string().contains("min_ttft_p95_increase_ms"));
    }

    #[test]
    fn a_hit_rate_drop_rolls_back_and_too_few_requests_do_not_judge() {
        let (mut canary, _) = Canary::start(plan(), 0).unwrap();
        canary.on_push_outcomes(&applied(&["a"]), 0);
        // A bad window with too few requests is not judged yet.
        assert_eq!(canary.on_observation(&side(10, 0.2, 0.1), &side(100, 0.2, 0.6), 100), Action::Observe);
        let action = canary.on_observation(&side(50, 0.2, 0.40), &side(100, 0.2, 0.6), 200);
        assert_eq!(action, Action::Rollback { routers: vec!["a".into()] });
    }

    #[test]
    fn without_traffic_the_canary_is_never_promoted() {
        let (mut canary, _) = Canary::start(plan(), 0).unwrap();
        canary.on_push_outcomes(&applied(&["a"]), 0);
        assert_eq!(canary.on_observation(&side(3, 0.2, 0.6), &side(3, 0.2, 0.6), 1_500), Action::Observe);
        let action = canary.on_observation(&side(3, 0.2, 0.6), &side(3, 0.2, 0.6), 3_000);
        assert_eq!(action, Action::Rollback { routers: vec!["a".into()] });
    }

    /// `(requests, errors, ttft p95 ms, hit rate)` of one side; `None` where nothing was measured.
    fn w(requests: u64, errors: u64, p95_ms: Option<f64>, hit: Option<f64>) -> SideWindow {
        SideWindow { requests, errors, ttft_p95_s: p95_ms.map(|ms| ms / 1e3), hit_rate: hit }
    }

    #[test]
    fn every_guard_is_judged_from_the_figures_as_the_table_says() {
        let strict_hit = Guards::default();
        let lax_hit = Guards { require_hit_rate: false, ..Guards::default() };
        // (case, guards, canary, baseline, verdict, words the verdict or its missing list holds)
        let cases: Vec<(&str, &Guards, SideWindow, SideWindow, &str, &str)> = vec![
            (
                "equal sides hold",
                &strict_hit,
                w(100, 0, Some(200.0), Some(0.5)),
                w(100, 0, Some(200.0), Some(0.5)),
                "holding",
                "",
            ),
            (
                "too few canary requests",
                &strict_hit,
                w(49, 49, None, None),
                w(100, 0, Some(200.0), Some(0.5)),
                "not_enough_data",
                "too few requests (canary 49",
            ),
            (
                "errors: 10% against none",
                &strict_hit,
                w(100, 10, Some(200.0), Some(0.5)),
                w(100, 0, Some(200.0), Some(0.5)),
                "crossed",
                "error rate 10.0% (10 of 100)",
            ),
            (
                "errors: 1% against none is noise",
                &strict_hit,
                w(100, 1, Some(200.0), Some(0.5)),
                w(100, 0, Some(200.0), Some(0.5)),
                "holding",
                "",
            ),
            (
                "errors: 5% against 4% is within the ratio",
                &strict_hit,
                w(100, 5, Some(200.0), Some(0.5)),
                w(100, 4, Some(200.0), Some(0.5)),
                "holding",
                "",
            ),
            (
                "errors: every request failed, so no TTFT, still crossed",
                &strict_hit,
                w(100, 100, None, None),
                w(100, 0, Some(200.0), Some(0.5)),
                "crossed",
                "error rate 100.0%",
            ),
            (
                "TTFT 2.5x and +300 ms",
                &strict_hit,
                w(100, 0, Some(500.0), Some(0.5)),
                w(100, 0, Some(200.0), Some(0.5)),
                "crossed",
                "TTFT p95 500 ms is 2.50x",
            ),
            (
                "TTFT 1.7x but +7 ms is noise",
                &strict_hit,
                w(100, 0, Some(17.0), Some(0.5)),
                w(100, 0, Some(10.0), Some(0.5)),
                "holding",
                "",
            ),
            (
                "no successful answer on the canary",
                &strict_hit,
                w(100, 1, None, Some(0.5)),
                w(100, 0, Some(200.0), Some(0.5)),
                "not_enough_data",
                "no successful answer with a first token on the canary",
            ),
            (
                "hit rate 20 points lower",
                &strict_hit,
                w(100, 0, Some(200.0), Some(0.3)),
                w(100, 0, Some(200.0), Some(0.5)),
                "crossed",
                "20.0 points below",
            ),
            (
                "hit rate unknown on both sides",
                &strict_hit,
                w(100, 0, Some(200.0), None),
                w(100, 0, Some(200.0), None),
                "not_enough_data",
                "no cached-token reports from the canary and baseline replicas",
            ),
            (
                "hit rate unknown but not required",
                &lax_hit,
                w(100, 0, Some(200.0), None),
                w(100, 0, Some(200.0), None),
                "holding",
                "",
            ),
            (
                "a crossed guard wins over missing data",
                &strict_hit,
                w(100, 0, Some(900.0), None),
                w(100, 0, Some(200.0), None),
                "crossed",
                "TTFT",
            ),
        ];
        for (case, guards, canary, baseline, verdict, words) in cases {
            let judgement = judge(guards, &canary, &baseline);
            assert_eq!(judgement.verdict.name(), verdict, "{case}: {judgement:?}");
            let said = match &judgement.verdict {
                Verdict::Holding => String::new(),
                Verdict::NotEnoughData { missing } => missing.join("; "),
                Verdict::Crossed { reason } => reason.clone(),
            };
            assert!(said.contains(words), "{case}: {said:?} lacks {words:?}");
            let guards_read: Vec<&str> = judgement.readings.iter().map(|r| r.guard.as_str()).collect();
            assert_eq!(guards_read.len(), 3, "{case}: every guard reads: {guards_read:?}");
        }
    }

    #[test]
    fn without_cached_token_reports_the_canary_is_not_promoted_and_says_why() {
        let (mut canary, _) = Canary::start(plan(), 0).unwrap();
        canary.on_push_outcomes(&applied(&["a"]), 0);
        let blind = w(200, 0, Some(100.0), None);
        assert_eq!(canary.on_observation(&blind, &blind, 1_500), Action::Observe, "observation time is up");
        assert_eq!(canary.judgement().map(|j| j.verdict.name()), Some("not_enough_data"));
        assert!(matches!(canary.phase(), Phase::Observing { .. }));
        let action = canary.on_observation(&blind, &blind, 3_000);
        assert_eq!(action, Action::Rollback { routers: vec!["a".into()] });
        let Phase::RollingBack { reason } = canary.phase() else { panic!("{:?}", canary.phase()) };
        assert!(reason.contains("not enough data") && reason.contains("cached-token"), "{reason}");
        // The operator who knows the engines never report cached tokens may promote on the rest.
        let mut lax = plan();
        lax.guards.require_hit_rate = false;
        let (mut canary, _) = Canary::start(lax, 0).unwrap();
        canary.on_push_outcomes(&applied(&["a"]), 0);
        assert!(matches!(canary.on_observation(&blind, &blind, 1_500), Action::Push { .. }));
    }

    #[test]
    fn error_guards_are_validated() {
        let mut bad = plan();
        bad.guards.max_error_rate_ratio = 0.5;
        assert!(Canary::start(bad, 0).unwrap_err().to_string().contains("max_error_rate_ratio"));
        let mut bad = plan();
        bad.guards.min_error_rate_increase = 2.0;
        assert!(Canary::start(bad, 0).unwrap_err().to_string().contains("min_error_rate_increase"));
    }

    #[test]
    fn a_refused_canary_push_rolls_back_only_what_applied() {
        let mut two = plan();
        two.canary = vec!["a".into(), "d".into()];
        let (mut canary, _) = Canary::start(two, 0).unwrap();
        let outcomes = vec![
            ("a".to_owned(), PushOutcome::Applied { version: 5 }),
            (
                "d".to_owned(),
                PushOutcome::Refused {
                    status: 409,
                    code: "version_conflict".into(),
                    message: "stale".into(),
                },
            ),
        ];
        assert_eq!(canary.on_push_outcomes(&outcomes, 0), Action::Rollback { routers: vec!["a".into()] });
        let failed = vec![("a".to_owned(), PushOutcome::Unreachable { error: "timed out".into() })];
        assert_eq!(canary.on_rollback_outcomes(&failed, 5), Action::Finished);
        let Phase::Failed { reason } = canary.phase() else { panic!("{:?}", canary.phase()) };
        assert!(reason.contains("version_conflict") && reason.contains("a: unreachable"), "{reason}");
    }

    #[test]
    fn plans_are_checked_before_anything_is_pushed() {
        let mut bad = plan();
        bad.baseline.clear();
        assert_eq!(Canary::start(bad, 0).unwrap_err(), CanaryError::NoBaseline);
        let mut overlap = plan();
        overlap.baseline.push("a".into());
        assert_eq!(Canary::start(overlap, 0).unwrap_err(), CanaryError::Overlap("a".into()));
        let mut invalid = plan();
        invalid.candidate = PolicySpec::named("consistent_hash").with("load_factor", 0.1);
        assert!(matches!(Canary::start(invalid, 0).unwrap_err(), CanaryError::InvalidCandidate(_)));
        let mut ratio = plan();
        ratio.guards.max_ttft_p95_ratio = 0.5;
        assert!(Canary::start(ratio, 0).unwrap_err().to_string().contains("at least 1.0"));
    }

    #[test]
    fn operator_abort_rolls_back_and_finished_canaries_stay_finished() {
        let (mut canary, _) = Canary::start(plan(), 0).unwrap();
        canary.on_push_outcomes(&applied(&["a"]), 0);
        assert_eq!(canary.abort("wrong policy", 10), Action::Rollback { routers: vec!["a".into()] });
        canary.on_rollback_outcomes(&applied(&["a"]), 20);
        assert_eq!(canary.abort("again", 30), Action::Finished);
        assert_eq!(canary.on_observation(&side(100, 9.0, 0.0), &side(100, 0.1, 0.9), 40), Action::Finished);
    }
}
