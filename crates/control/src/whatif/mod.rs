//! What-if: replays recent recorded traffic (every router's `/admin/trace`, every page of the window) or a
//! trace file through fleet-sim's engine model twice, under the candidate and under the policy the routers
//! run (read from each router, differences flagged), side by side, with progress and cancellation, on the
//! engine profile the fleet's metrics point to (or the operator's), next to the fidelity the bench measured.
//!
//! One job runs at a time: starting a new one (the editor re-runs on every change) cancels the
//! previous. The replays are CPU work on blocking threads, never on the async workers.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fleet_policy::PolicySpec;
use fleet_rollout::spec_diff;
use fleet_sim::replay::{
    self, PdReplay, PreparedTrace, Progress, ReplayConfig, ReplayControl, ReplayReport, unmodelled_overhead_s,
};
use fleet_trace::{Trace, TraceRecord};
use fleetdeck_api::{
    ApiError, ReplayFigures, ReplaySpread, WhatIfArgs, WhatIfCoverage, WhatIfJobArgs, WhatIfProfile,
    WhatIfResult, WhatIfRouter, WhatIfStatus,
};

use crate::fleet::Fleet;
use crate::rollout::Rollout;
use crate::routers::Routers;
use crate::routers::admin::{ActivePolicy, MAX_WINDOW_RECORDS, TraceWindow};
use crate::{lock, unix_ms_now};
use engine_profile::ChosenProfile;

pub mod engine_profile;
pub mod fidelity;
mod router_model;

/// Largest trace file read for a what-if (a 10-minute window of a busy fleet is a few MB).
pub const MAX_TRACE_FILE: u64 = 256 << 20;
/// Most replicas a what-if replays.
pub const MAX_WHATIF_REPLICAS: u32 = 1024;

#[derive(Debug)]
struct Job {
    id: u64,
    cancel: Arc<AtomicBool>,
    /// Requests routed so far by each of the two replays.
    routed: Arc<[AtomicU64; 2]>,
    /// Requests in the trace.
    requests: u64,
    /// Replays of each side the job runs (the main one and the spread's).
    replays: u64,
    status: Arc<Mutex<WhatIfStatus>>,
}

/// What the what-if reads from.
#[derive(Debug)]
pub(crate) struct WhatIfParts {
    pub routers: Routers,
    pub fleet: Fleet,
    pub rollout: Rollout,
    /// The only folder trace files are read from (`--trace-dir`).
    pub trace_dir: Option<PathBuf>,
}

/// The app's what-if replays: at most one job at a time (the latest). Cheap to clone.
#[derive(Debug, Clone)]
pub struct WhatIf {
    inner: Arc<WhatIfInner>,
}

#[derive(Debug)]
struct WhatIfInner {
    routers: Routers,
    fleet: Fleet,
    rollout: Rollout,
    trace_dir: Option<PathBuf>,
    next: AtomicU64,
    current: Mutex<Option<Job>>,
}

/// One report in the UI's terms, its TTFTs with `overhead_s` added (see [`unmodelled_overhead_s`]).
pub fn figures(policy: &str, report: &ReplayReport, overhead_s: f64) -> ReplayFigures {
    ReplayFigures {
        policy: policy.to_owned(),
        requests: report.requests,
        hit_rate: Some(report.hit_rate),
        ttft_p50_s: Some(report.ttft_p50_s + overhead_s),
        ttft_p95_s: Some(report.ttft_p95_s + overhead_s),
        imbalance: Some(report.imbalance),
        per_replica_requests: report.per_replica.iter().map(|r| r.requests).collect(),
        pd: report.pd.as_ref().map(|pd| fleetdeck_api::PdFigures {
            split_share: pd.split_share,
            decisions: pd.decisions.clone(),
            prefill_leg_mean_ms: pd.prefill_leg_mean_s * 1e3,
            transfer_mean_ms: pd.transfer_mean_s * 1e3,
        }),
        spread: None,
    }
}

/// Replays beside the main one that measure the spread: the same traffic with other random draws, other
/// metrics-read phases and arrivals moved within the recording's millisecond. A live fleet is one draw of
/// all three, and one replay hides how much they move the outcome: on the fidelity bench's demo fleet,
/// random's hit rate ranged over 6 points across draws (54.6-60.6 %), and least_load's over 3 points
/// (53.0-56.4 %) with arrivals moved by up to 2 ms.
pub const SPREAD_REPLAYS: u64 = 7;
/// How far the spread's replays move each arrival, either way: the resolution of a recorded timestamp.
pub const SPREAD_JITTER_US: u64 = 1_000;
/// Longest trace whose spread is measured: it costs [`SPREAD_REPLAYS`] more replays of each side.
pub const SPREAD_MAX_REQUESTS: usize = 50_000;

/// Variant `i` (1-based) of `base` for the spread: draws from another seed, metrics read at another point
/// of their interval (spread evenly over it).
pub fn spread_variant(base: &ReplayConfig, i: u64) -> ReplayConfig {
    let interval = base.metrics_interval_ms.unwrap_or(0);
    ReplayConfig {
        seed: base.seed.wrapping_add(i),
        metrics_phase_ms: interval * i / (SPREAD_REPLAYS + 1),
        ..base.clone()
    }
}

/// The range of hit rate and TTFT p95 (with `overhead_s` added) over `reports`; `None` for fewer than two.
pub fn spread_of(reports: &[ReplayReport], overhead_s: f64) -> Option<ReplaySpread> {
    if reports.len() < 2 {
        return None;
    }
    let range = |value: fn(&ReplayReport) -> f64| {
        reports
            .iter()
            .map(value)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)))
    };
    let (hit_rate_min, hit_rate_max) = range(|r| r.hit_rate);
    let (p95_min, p95_max) = range(|r| r.ttft_p95_s);
    Some(ReplaySpread {
        replays: reports.len() as u32,
        hit_rate_min,
        hit_rate_max,
        ttft_p95_min_s: p95_min + overhead_s,
        ttft_p95_max_s: p95_max + overhead_s,
    })
}

/// The trace prepared at the chosen engine block size (the trace's own when the two cannot be matched,
/// with the capacity converted) and the replay configuration of the chosen profile.
pub fn prepare_for(trace: &Trace, chosen: &ChosenProfile) -> Result<(PreparedTrace, ReplayConfig), ApiError> {
    let trace_block = trace.block_tokens().max(1);
    let (block, kv_blocks) = match chosen.block_tokens {
        Some(b) if b > 0 && (trace_block.is_multiple_of(b) || b.is_multiple_of(trace_block)) => {
            (b, chosen.kv_blocks)
        }
        Some(b) if b > 0 => {
            let tokens = u64::from(chosen.kv_blocks) * u64::from(b);
            (trace_block, u32::try_from(tokens / u64::from(trace_block)).unwrap_or(u32::MAX).max(1))
        }
        _ => (trace_block, chosen.kv_blocks),
    };
    let prepared = replay::prepare(trace, Some(block), 1.0)
        .map_err(|e| ApiError::new("bad_trace", format!("the traffic cannot be replayed: {e}")))?;
    let config = ReplayConfig {
        profile: chosen.profile.clone(),
        capacity_blocks: Some(kv_blocks),
        ..ReplayConfig::new(1, PolicySpec::default())
    };
    Ok((prepared, config))
}

/// Replays `trace` under `candidate` and `active` on two threads with `base`'s replicas, profile and
/// capacity; `routed` counts progress, from `routed_before` (requests routed by earlier replays of the job).
pub fn replay_both(
    trace: &PreparedTrace,
    base: &ReplayConfig,
    candidate: &PolicySpec,
    active: &PolicySpec,
    cancel: &AtomicBool,
    routed: &[AtomicU64; 2],
    routed_before: u64,
) -> Result<(ReplayReport, ReplayReport), String> {
    let run = |spec: &PolicySpec, slot: &AtomicU64| {
        let progress = |p: Progress| slot.store(routed_before + p.routed as u64, Ordering::Relaxed);
        let config = ReplayConfig { policy: spec.clone(), ..base.clone() };
        replay::replay(trace, &config, ReplayControl { progress: Some(&progress), cancel: Some(cancel) })
            .map_err(|e| e.to_string())
    };
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(|| run(candidate, &routed[0]));
        let b = run(active, &routed[1]);
        (a.join().unwrap_or_else(|_| Err("the replay thread panicked".to_owned())), b)
    });
    Ok((a?, b?))
}

/// The trace file `requested` names, opened, if it is a regular file inside the operator's trace folder
/// (`--trace-dir`); nothing else is ever opened on the API's behalf, so the API cannot be used to read the
/// machine's files.
///
/// `requested` is a name in that folder (or a path inside it, absolute or relative, without `..`). The file
/// is opened from the folder one component at a time without following any symbolic link (`O_NOFOLLOW`
/// at every step, `O_DIRECTORY` on the way), and what was opened is checked (a regular file): there is no
/// check-then-open, so a name swapped for a link after a check cannot lead outside. Every name that leads
/// outside (absolute elsewhere, `..`, a link, not a regular file) gets the same answer, whether or not
/// something exists there; only a name missing inside the folder is told apart.
#[cfg(unix)]
pub(crate) fn open_trace_file(dir: Option<&Path>, requested: &str) -> Result<std::fs::File, ApiError> {
    use rustix::fs::{FileType, Mode, OFlags};
    use rustix::io::Errno;
    use std::path::Component;

    let Some(dir) = dir else {
        return Err(ApiError::new(
            "forbidden_path",
            "trace files are read only from the folder given with `fleetdeck --trace-dir DIR`; \
             restart the app with it and put the trace there (or replay the routers' traffic instead)",
        ));
    };
    let forbidden = || {
        ApiError::new(
            "forbidden_path",
            format!(
                "{requested:?} is not a file inside the trace folder {}: name a regular file in that folder \
                 (links are not followed); copy the trace into it",
                dir.display()
            ),
        )
    };
    let wanted = Path::new(requested.trim());
    let relative = if wanted.is_absolute() {
        let canonical = dir.canonicalize().ok();
        wanted
            .strip_prefix(dir)
            .ok()
            .or_else(|| canonical.as_deref().and_then(|folder| wanted.strip_prefix(folder).ok()))
            .ok_or_else(forbidden)?
    } else {
        wanted
    };
    let mut names = Vec::new();
    for component in relative.components() {
        match component {
            Component::Normal(name) => names.push(name),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return Err(forbidden()),
        }
    }
    let Some((last, folders)) = names.split_last() else { return Err(forbidden()) };
    let walk = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let mut at = rustix::fs::open(dir, OFlags::RDONLY | OFlags::CLOEXEC | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| {
        ApiError::new("bad_trace", format!("the trace folder {} cannot be read: {e}", dir.display()))
    })?;
    let missing = |e: Errno| {
        if e == Errno::NOENT {
            ApiError::new(
                "bad_trace",
                format!("there is no trace {requested:?} in the trace folder {}", dir.display()),
            )
        } else {
            forbidden()
        }
    };
    for folder in folders {
        at = rustix::fs::openat(&at, *folder, walk | OFlags::DIRECTORY, Mode::empty()).map_err(missing)?;
    }
    // NONBLOCK: a FIFO planted in the folder must not hold the open (it is refused just below).
    let file = rustix::fs::openat(&at, *last, walk | OFlags::NONBLOCK, Mode::empty()).map_err(missing)?;
    let stat = rustix::fs::fstat(&file).map_err(|_| forbidden())?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(forbidden());
    }
    Ok(std::fs::File::from(file))
}

/// Without `O_NOFOLLOW` there is no way to open only inside the folder: trace files are not read.
#[cfg(not(unix))]
pub(crate) fn open_trace_file(_dir: Option<&Path>, _requested: &str) -> Result<std::fs::File, ApiError> {
    Err(ApiError::new(
        "forbidden_path",
        "trace files are read only on Unix; replay the routers' traffic instead",
    ))
}

/// Reads a trace file opened by [`open_trace_file`] (fleet-trace or Mooncake JSON Lines), bounded in size.
/// Its errors name the line and the field, never a value read (`fleet_trace::json_error_shape`).
fn read_trace_file(file: std::fs::File, name: &str) -> Result<Trace, ApiError> {
    use std::io::Read as _;
    let bad = |message: String| ApiError::new("bad_trace", message);
    let len = file.metadata().map_err(|e| bad(format!("cannot read the trace file {name:?}: {e}")))?.len();
    if len > MAX_TRACE_FILE {
        return Err(bad(format!(
            "the trace file {name:?} is {len} bytes; at most {MAX_TRACE_FILE} are replayed, cut it to a shorter window"
        )));
    }
    let reader = std::io::BufReader::new(file.take(MAX_TRACE_FILE));
    fleet_trace::read_trace(reader).map_err(|e| bad(format!("{name:?}: {e}")))
}

/// One router as the what-if read it: its running policy and its window of traffic.
struct RouterRead {
    url: String,
    policy: Result<ActivePolicy, String>,
    window: Result<TraceWindow, String>,
    /// How often it reads the replicas' engine load (`None`: its state did not say).
    engine_metrics_ms: Option<u64>,
    /// How often it publishes its load to the fleet's other routers (`None`: it shares none).
    peer_load_ms: Option<u64>,
}

/// The baseline spec (what the routers that recorded most of the window run), each router's row and the
/// notes on what differs.
fn baseline_of(
    reads: &[RouterRead],
    intended: Option<&(String, PolicySpec)>,
) -> (Option<(String, PolicySpec)>, Vec<WhatIfRouter>, Vec<String>) {
    let requests = |r: &RouterRead| r.window.as_ref().map_or(0, |w| w.records.len() as u64);
    // Weight each distinct running spec by the traffic its routers recorded (ties: the first router).
    let mut specs: Vec<(PolicySpec, u64, String)> = Vec::new();
    for read in reads {
        if let Ok(active) = &read.policy {
            match specs.iter_mut().find(|(spec, _, _)| spec_diff(spec, &active.spec).is_empty()) {
                Some(entry) => entry.1 += requests(read),
                None => specs.push((active.spec.clone(), requests(read), read.url.clone())),
            }
        }
    }
    let chosen =
        specs.iter().enumerate().max_by_key(|(i, (_, n, _))| (*n, std::cmp::Reverse(*i))).map(|(_, s)| s);
    let mut notes = Vec::new();
    let baseline = chosen.map(|(spec, _, url)| (url.clone(), spec.clone()));
    let rows = reads
        .iter()
        .map(|read| {
            let (policy, spec, version) = match &read.policy {
                Ok(a) => (Some(a.spec.policy.clone()), Some(a.spec.to_json()), Some(a.version)),
                Err(_) => (None, None, None),
            };
            let differs = match (&read.policy, &baseline) {
                (Ok(active), Some((_, base))) => !spec_diff(base, &active.spec).is_empty(),
                _ => false,
            };
            let error = match (&read.policy, &read.window) {
                (Err(e), _) | (_, Err(e)) => Some(e.clone()),
                _ => None,
            };
            WhatIfRouter {
                url: read.url.clone(),
                policy,
                spec,
                version,
                requests: requests(read),
                differs,
                error,
            }
        })
        .collect::<Vec<_>>();
    if let Some((url, base)) = &baseline {
        let policy_label = |spec: &PolicySpec| spec.policy.clone();
        if specs.len() > 1 {
            notes.push(format!(
                "the routers do not all run the same policy: the baseline is {} as run by {url} (the spec of the \
                 routers that recorded most of the window); all recorded traffic is replayed under it",
                policy_label(base)
            ));
        }
        for (row, read) in rows.iter().zip(reads) {
            if let (true, Ok(active)) = (row.differs, &read.policy) {
                let diff = spec_diff(base, &active.spec);
                let mut what: Vec<String> = Vec::new();
                if let Some((before, after)) = &diff.policy {
                    what.push(format!("policy {after} instead of {before}"));
                }
                for p in &diff.params {
                    let show = |v: &Option<serde_json::Value>| {
                        v.as_ref().map_or("unset".to_owned(), |v| v.to_string())
                    };
                    what.push(format!("{} = {} instead of {}", p.name, show(&p.after), show(&p.before)));
                }
                notes.push(format!(
                    "{} runs version {} which differs from the baseline: {}",
                    read.url,
                    active.version,
                    what.join(", ")
                ));
            }
        }
        if let Some((label, spec)) = intended
            && !spec_diff(base, spec).is_empty()
        {
            notes.push(format!(
                "the app's intended policy ({label}, {}) is not what the routers run; the baseline is what they \
                 run ({})",
                policy_label(spec),
                policy_label(base)
            ));
        }
    }
    for read in reads {
        if let Err(e) = &read.policy {
            notes.push(format!("{} did not say its policy ({e})", read.url));
        }
        if let Err(e) = &read.window {
            notes.push(format!("{} could not be read ({e}); its traffic is not in the replay", read.url));
        }
    }
    (baseline, rows, notes)
}

/// When a time span in milliseconds is written for people.
fn span_text(ms: i64) -> String {
    let s = (ms.max(0) + 500) / 1000;
    if s >= 120 { format!("{} min {} s", s / 60, s % 60) } else { format!("{s} s") }
}

impl WhatIf {
    pub(crate) fn new(parts: WhatIfParts) -> Self {
        let WhatIfParts { routers, fleet, rollout, trace_dir } = parts;
        let inner = WhatIfInner {
            routers,
            fleet,
            rollout,
            trace_dir,
            next: AtomicU64::new(0),
            current: Mutex::default(),
        };
        Self { inner: Arc::new(inner) }
    }

    /// Starts a what-if replay of the candidate against the routers' running policy; cancels the previous one.
    ///
    /// The baseline is what the routers run (read from each), not what the app meant them to run; every
    /// page of each router's window is read (up to [`MAX_WINDOW_RECORDS`] per router, the rest counted);
    /// a router that cannot be read is reported and the others replayed; the engine profile comes from the
    /// replicas' metrics unless the operator picks one.
    pub async fn start(&self, args: WhatIfArgs) -> Result<WhatIfStatus, ApiError> {
        let candidate = crate::rollout::spec_or_api_error(&args.text).await?;
        if !(10..=86_400).contains(&args.window_s) {
            return Err(ApiError::new(
                "bad_request",
                format!("window_s is {}; replay 10 to 86400 seconds of traffic", args.window_s),
            ));
        }
        // The path is checked before anything else runs, so a refused one never costs a router call.
        let trace_file = match &args.trace_path {
            Some(path) => Some((open_trace_file(self.inner.trace_dir.as_deref(), path)?, path)),
            None => None,
        };
        let since = unix_ms_now() - i64::from(args.window_s) * 1000;
        let clients = self.inner.routers.admin_clients();
        let reads: Vec<RouterRead> = futures_util::future::join_all(clients.iter().map(|client| async {
            let policy = client.policy();
            let window = async {
                if trace_file.is_some() {
                    return Ok(TraceWindow::default());
                }
                client.trace_window(since, MAX_WINDOW_RECORDS).await.map_err(|e| e.to_string())
            };
            let state = client.state();
            let (policy, window, state) = futures_util::join!(policy, window, state);
            let state = state.ok();
            let engine_metrics_ms = state.as_ref().and_then(|state| state.engine_metrics_ms);
            let peer_load_ms =
                state.as_ref().and_then(|state| state.peer_load.as_ref()).map(|p| p.interval_ms);
            RouterRead { url: client.url.clone(), policy, window, engine_metrics_ms, peer_load_ms }
        }))
        .await;
        let intended = self.inner.rollout.intended_spec().await;
        let (baseline, routers, mut notes) = baseline_of(&reads, intended.as_ref());
        let router_facts: Vec<router_model::RouterFacts> = reads
            .iter()
            .map(|read| router_model::RouterFacts {
                url: read.url.clone(),
                requests: read.window.as_ref().map_or(0, |w| w.records.len() as u64),
                engine_metrics_ms: read.engine_metrics_ms,
                peer_load_ms: read.peer_load_ms,
            })
            .collect();
        let active = match (baseline, &intended) {
            (Some((_, spec)), _) => spec,
            (None, Some((label, spec))) => {
                notes.push(format!(
                    "no router said what it runs; the baseline is the app's intended policy {label} ({})",
                    spec.policy
                ));
                spec.clone()
            }
            (None, None) => {
                return Err(ApiError::new(
                    "no_active_policy",
                    format!(
                        "no router told its policy, so there is nothing to compare against; check the routers in \
                         Settings{}",
                        if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) }
                    ),
                ));
            }
        };
        let mut coverage =
            WhatIfCoverage { limit_per_router: MAX_WINDOW_RECORDS as u64, ..WhatIfCoverage::default() };
        let (trace, source) = match trace_file {
            Some((file, path)) => (read_trace_file(file, path)?, format!("trace file {path}")),
            None => {
                let mut records: Vec<TraceRecord> = Vec::new();
                let mut unread = 0u64;
                let mut unknown = false;
                for read in reads {
                    match read.window {
                        Ok(mut window) => {
                            coverage.pages += window.pages;
                            unread += window.unread;
                            // Each request goes through the router that recorded it in the replay.
                            for record in &mut window.records {
                                record.router = Some(read.url.clone());
                            }
                            records.append(&mut window.records);
                        }
                        Err(_) => unknown = true,
                    }
                }
                coverage.window_s = Some(args.window_s);
                coverage.requests_in_window = (!unknown).then_some(records.len() as u64 + unread);
                let trace = Trace::from_records(records).map_err(|e| {
                    ApiError::new("bad_trace", format!("a router recorded an unusable request: {e}"))
                })?;
                (trace, format!("the routers' traffic of the last {} s", args.window_s))
            }
        };
        if trace.records.is_empty() {
            return Err(ApiError::new(
                "no_traffic",
                format!(
                    "there is no recorded traffic to replay; send traffic through the routers or pick a trace file{}",
                    if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) }
                ),
            ));
        }
        coverage.requests_read = trace.records.len() as u64;
        coverage.first_ms = trace.records.first().map(|r| r.timestamp as i64);
        coverage.last_ms = trace.records.last().map(|r| r.timestamp as i64);
        let span = coverage.last_ms.unwrap_or(0) - coverage.first_ms.unwrap_or(0);
        coverage.summary = match (coverage.window_s, coverage.requests_in_window) {
            (Some(window), Some(total)) if total > coverage.requests_read => format!(
                "read {} of the {total} requests the routers hold for the last {window} s (at most {} per \
                 router): the replay is a sample spanning {}",
                coverage.requests_read,
                MAX_WINDOW_RECORDS,
                span_text(span)
            ),
            (Some(window), Some(total)) => format!(
                "read all {total} requests the routers hold for the last {window} s ({} pages), arrivals spanning {}",
                coverage.pages,
                span_text(span)
            ),
            (Some(window), None) => format!(
                "read {} requests of the last {window} s from the routers that answered, arrivals spanning {}; \
                 the unreachable routers' traffic is missing",
                coverage.requests_read,
                span_text(span)
            ),
            _ => format!(
                "read {} requests from the file, arrivals spanning {}",
                coverage.requests_read,
                span_text(span)
            ),
        };
        let replica_urls: Vec<String> = {
            let urls = self.inner.routers.replica_urls();
            if urls.is_empty() {
                let mut urls: Vec<String> = self.inner.fleet.rows().into_iter().map(|r| r.url).collect();
                urls.sort();
                urls.dedup();
                urls
            } else {
                urls
            }
        };
        // P/D: the prefill replicas the routers know, or the operator's other split of the same replicas.
        let tagged_prefill = self.inner.routers.prefill_replica_count();
        let prefill_replicas = args.prefill_replicas.or((tagged_prefill > 0).then_some(tagged_prefill));
        let total = (replica_urls.len() as u32).max(1);
        let replicas = match (args.replicas, prefill_replicas) {
            (Some(replicas), _) => replicas,
            (None, Some(prefill)) if prefill < total => total - prefill,
            (None, Some(prefill)) => {
                return Err(ApiError::new(
                    "bad_request",
                    format!(
                        "prefill_replicas is {prefill} of {total} replicas; leave at least one to decode, or \
                         give replicas (the decode replicas) too"
                    ),
                ));
            }
            (None, None) => total,
        };
        if !(1..=MAX_WHATIF_REPLICAS).contains(&replicas) {
            return Err(ApiError::new(
                "bad_request",
                format!("replicas is {replicas}; replay on 1 to {MAX_WHATIF_REPLICAS} replicas"),
            ));
        }
        let facts = if args.profile.is_some() && args.kv_blocks.is_some() {
            Vec::new()
        } else {
            engine_profile::read_fleet_facts(
                self.inner.fleet.http(),
                &replica_urls,
                self.inner.fleet.limits(),
            )
            .await
        };
        let chosen = engine_profile::choose(&facts, args.profile.as_deref(), args.kv_blocks)?;
        let (prepared, config) = prepare_for(&trace, &chosen)?;
        let profile_shown = WhatIfProfile {
            kv_blocks: config.capacity_blocks.unwrap_or(chosen.kv_blocks),
            block_tokens: prepared.block_tokens,
            ..chosen.shown.clone()
        };
        let fidelity = fidelity::lookup(&active.policy, &candidate.policy);

        let spread_replays = if prepared.requests.len() <= SPREAD_MAX_REQUESTS { SPREAD_REPLAYS } else { 0 };
        if spread_replays == 0 {
            notes.push(format!(
                "replayed once: the spread over other random draws, metrics-read phases and arrival times is \
                 measured on up to {SPREAD_MAX_REQUESTS} requests, and this window has {}",
                prepared.requests.len()
            ));
        }
        let jobs = &*self.inner;
        let id = jobs.next.fetch_add(1, Ordering::Relaxed) + 1;
        let status = Arc::new(Mutex::new(WhatIfStatus {
            job: id,
            state: "running".to_owned(),
            progress: 0.0,
            message: Some(format!(
                "replaying {} requests from {source} on {replicas} replicas with engine profile {}, {} times \
                 each side (the spread's replays included)",
                trace.records.len(),
                profile_shown.name,
                1 + spread_replays
            )),
            result: None,
        }));
        let job = Job {
            id,
            cancel: Arc::new(AtomicBool::new(false)),
            routed: Arc::new([AtomicU64::new(0), AtomicU64::new(0)]),
            requests: prepared.requests.len() as u64,
            replays: 1 + spread_replays,
            status: status.clone(),
        };
        let (cancel, routed) = (job.cancel.clone(), job.routed.clone());
        if let Some(previous) = lock(&jobs.current).replace(job) {
            previous.cancel.store(true, Ordering::Relaxed);
        }
        let first = lock(&status).clone();
        let pd =
            prefill_replicas.map(|prefill_replicas| PdReplay { prefill_replicas, ..PdReplay::default() });
        let (router_model, mut model_notes) =
            router_model::deployed(&router_facts, prepared.routers.len(), pd.is_some());
        notes.append(&mut model_notes);
        let base = ReplayConfig {
            replicas,
            pd,
            routers: router_model.routers,
            metrics_interval_ms: router_model.engine_metrics_ms,
            peer_load_interval_ms: router_model.peer_load_ms,
            ..config
        };
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let requests = prepared.requests.len() as u64;
            let outcome =
                (0..=spread_replays).try_fold((Vec::new(), Vec::new()), |(mut cands, mut acts), i| {
                    let (cand, act) = if i == 0 {
                        replay_both(&prepared, &base, &candidate, &active, &cancel, &routed, 0)?
                    } else {
                        let moved = prepared.with_arrival_jitter(SPREAD_JITTER_US, i);
                        let config = spread_variant(&base, i);
                        replay_both(&moved, &config, &candidate, &active, &cancel, &routed, i * requests)?
                    };
                    cands.push(cand);
                    acts.push(act);
                    Ok::<_, String>((cands, acts))
                });
            let mut status = lock(&status);
            match outcome {
                Ok((cands, acts)) => {
                    // The main replays (the seed and phase a what-if always uses) are the figures; the others
                    // give their range.
                    let (cand, act) = (&cands[0], &acts[0]);
                    let overhead = unmodelled_overhead_s(&trace, &active.policy, act);
                    let added = overhead.unwrap_or(0.0);
                    status.state = "done".to_owned();
                    status.progress = 1.0;
                    status.message = None;
                    status.result = Some(WhatIfResult {
                        source,
                        requests: prepared.requests.len() as u64,
                        replicas,
                        prefill_replicas,
                        candidate: ReplayFigures {
                            spread: spread_of(&cands, added),
                            ..figures(&candidate.policy, cand, added)
                        },
                        active: ReplayFigures {
                            spread: spread_of(&acts, added),
                            ..figures(&active.policy, act, added)
                        },
                        ttft_overhead_ms: overhead.map(|s| s * 1000.0),
                        elapsed_ms: started.elapsed().as_millis() as u64,
                        coverage,
                        routers,
                        baseline_notes: notes,
                        profile: profile_shown,
                        fidelity,
                        router_model,
                    });
                }
                Err(_) if cancel.load(Ordering::Relaxed) => {
                    status.state = "cancelled".to_owned();
                    status.message = Some("cancelled".to_owned());
                }
                Err(error) => {
                    status.state = "failed".to_owned();
                    status.message = Some(error);
                }
            }
        });
        Ok(first)
    }

    /// Progress or result of job `args.job`.
    pub async fn status(&self, args: WhatIfJobArgs) -> Result<WhatIfStatus, ApiError> {
        let current = lock(&self.inner.current);
        let Some(job) = current.as_ref().filter(|j| j.id == args.job) else {
            return Err(ApiError::new(
                "not_found",
                format!("what-if {} is not the latest one; a newer run replaced it", args.job),
            ));
        };
        let mut status = lock(&job.status).clone();
        if status.state == "running" && job.requests > 0 {
            let routed: u64 = job.routed.iter().map(|r| r.load(Ordering::Relaxed)).sum();
            status.progress = (routed as f64 / (2 * job.requests * job.replays) as f64).min(0.99);
        }
        Ok(status)
    }

    /// Cancels job `args.job` (a no-op when it already ended).
    pub async fn cancel(&self, args: WhatIfJobArgs) -> Result<WhatIfStatus, ApiError> {
        {
            let current = lock(&self.inner.current);
            if let Some(job) = current.as_ref().filter(|j| j.id == args.job) {
                job.cancel.store(true, Ordering::Relaxed);
            }
        }
        self.status(args).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_policies_replay_the_same_requests_and_cancel_stops_them() {
        // Two prefixes, each shared by many requests, on four replicas.
        let records: Vec<TraceRecord> = (0..400u64)
            .map(|i| {
                TraceRecord::mooncake(i * 50, 2048, 16, vec![i % 2 + 1, i % 2 + 10, i % 2 + 20, 1000 + i])
            })
            .collect();
        let trace = Trace::from_records(records).unwrap();
        let prepared = replay::prepare(&trace, None, 1.0).unwrap();
        let cancel = AtomicBool::new(false);
        let routed = [AtomicU64::new(0), AtomicU64::new(0)];
        let candidate = PolicySpec::named("consistent_hash");
        let active = PolicySpec::named("round_robin");
        let base = ReplayConfig::new(4, PolicySpec::default());
        let (cand, act) = replay_both(&prepared, &base, &candidate, &active, &cancel, &routed, 0).unwrap();
        assert_eq!((cand.requests, act.requests), (400, 400));
        assert_eq!(routed[0].load(Ordering::Relaxed), 400);
        // Side by side is exactly each policy replayed alone: same trace, same engines, same seed.
        let alone = |spec: &PolicySpec| {
            replay::replay(&prepared, &ReplayConfig::new(4, spec.clone()), ReplayControl::default()).unwrap()
        };
        assert_eq!(cand, alone(&candidate));
        assert_eq!(act, alone(&active));
        assert_ne!(cand.per_replica, act.per_replica, "the two policies must route differently");
        // The spread's variants differ from the main replay only in their draws and metrics phase.
        let metered = ReplayConfig { metrics_interval_ms: Some(250), ..base.clone() };
        let variants: Vec<ReplayConfig> = (1..=SPREAD_REPLAYS).map(|i| spread_variant(&metered, i)).collect();
        let phases: Vec<u64> = variants.iter().map(|v| v.metrics_phase_ms).collect();
        assert_eq!(phases, [31, 62, 93, 125, 156, 187, 218]);
        assert!(variants.iter().all(|v| v.seed != metered.seed && v.replicas == metered.replicas));
        let random = PolicySpec::named("random");
        let reports: Vec<ReplayReport> = std::iter::once(&metered)
            .chain(&variants)
            .map(|config| {
                let config = ReplayConfig { policy: random.clone(), ..config.clone() };
                replay::replay(&prepared, &config, ReplayControl::default()).unwrap()
            })
            .collect();
        let spread = spread_of(&reports, 0.001).unwrap();
        assert_eq!(spread.replays, 8);
        assert!(spread.ttft_p95_min_s < spread.ttft_p95_max_s, "random draws move the figures: {spread:?}");
        assert!(reports.iter().all(|r| (spread.hit_rate_min..=spread.hit_rate_max).contains(&r.hit_rate)));
        let p95s = reports.iter().map(|r| r.ttft_p95_s + 0.001);
        assert_eq!(spread.ttft_p95_max_s, p95s.clone().fold(f64::MIN, f64::max));
        assert_eq!(spread.ttft_p95_min_s, p95s.fold(f64::MAX, f64::min));
        assert!(spread_of(&reports[..1], 0.0).is_none(), "one replay has no spread");
        let shown = figures("consistent_hash", &cand, 0.0);
        assert_eq!(shown.per_replica_requests.iter().sum::<u64>(), 400);

        cancel.store(true, Ordering::Relaxed);
        assert!(replay_both(&prepared, &base, &candidate, &active, &cancel, &routed, 0).is_err());
    }

    #[test]
    fn the_time_outside_the_engine_is_added_to_both_percentiles_shown() {
        let replayed = ReplayReport { ttft_p50_s: 0.012, ttft_p95_s: 0.05, ..ReplayReport::default() };
        let shown = figures("round_robin", &replayed, 0.003);
        assert!((shown.ttft_p50_s.unwrap() - 0.015).abs() < 1e-9);
        assert!((shown.ttft_p95_s.unwrap() - 0.053).abs() < 1e-9);
    }

    #[test]
    fn trace_files_are_read_only_from_the_trace_folder() {
        use std::io::Read as _;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("traces");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("day1.jsonl"), "inside").unwrap();
        std::fs::write(dir.join("sub").join("day2.jsonl"), "inside too").unwrap();
        std::fs::write(root.path().join("outside.jsonl"), "").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("link.jsonl")).unwrap();
        std::os::unix::fs::symlink(root.path().join("missing.jsonl"), dir.join("dangling.jsonl")).unwrap();
        std::os::unix::fs::symlink(root.path(), dir.join("up")).unwrap();
        let read = |name: &str| {
            let mut text = String::new();
            open_trace_file(Some(&dir), name)
                .map(|mut file| file.read_to_string(&mut text).map(|_| text).unwrap())
        };

        assert_eq!(read("day1.jsonl").unwrap(), "inside");
        assert_eq!(read("./sub/day2.jsonl").unwrap(), "inside too");
        assert_eq!(read(&dir.join("day1.jsonl").display().to_string()).unwrap(), "inside");
        // Outside, whether something exists there or not: one answer, word for word.
        let refusals: Vec<ApiError> = [
            "/etc/passwd",
            "/etc/no-such-file",
            "../outside.jsonl",
            "../no-such-file",
            "link.jsonl",
            "dangling.jsonl",
            "up/outside.jsonl",
            "up/no-such-file",
            "sub",
            ".",
        ]
        .iter()
        .map(|name| read(name).unwrap_err())
        .collect();
        for refused in &refusals {
            assert_eq!(refused.code, "forbidden_path", "{}", refused.message);
        }
        let message = |error: &ApiError, name: &str| error.message.replacen(&format!("{name:?}"), "NAME", 1);
        assert_eq!(message(&refusals[0], "/etc/passwd"), message(&refusals[1], "/etc/no-such-file"));
        assert_eq!(message(&refusals[6], "up/outside.jsonl"), message(&refusals[7], "up/no-such-file"));
        assert_eq!(read("missing.jsonl").unwrap_err().code, "bad_trace", "missing inside the folder");
        let no_folder = read_without_folder();
        assert!(no_folder.code == "forbidden_path" && no_folder.message.contains("--trace-dir"));
    }

    fn read_without_folder() -> ApiError {
        open_trace_file(None, "day1.jsonl").unwrap_err()
    }

    #[test]
    fn a_name_swapped_for_a_link_while_it_is_opened_never_leads_outside() {
        // The attack: a name checked as a file, then swapped for a link to a file outside before the open
        // (34 of 300 calls read the outside file). Here the swap runs all the time, beside 300 opens.
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("traces");
        std::fs::create_dir(&dir).unwrap();
        let secret = root.path().join("secret.jsonl");
        std::fs::write(&secret, "SECRET").unwrap();
        let (name, staged_file, staged_link) = (dir.join("t.jsonl"), dir.join(".file"), dir.join(".link"));
        std::fs::write(&name, "inside").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = std::fs::write(&staged_file, "inside");
                    let _ = std::fs::rename(&staged_file, &name);
                    let _ = std::os::unix::fs::symlink(&secret, &staged_link);
                    let _ = std::fs::rename(&staged_link, &name);
                }
            })
        };
        let (mut inside, mut refused) = (0, 0);
        for _ in 0..300 {
            match open_trace_file(Some(&dir), "t.jsonl") {
                Ok(mut file) => {
                    let mut text = String::new();
                    use std::io::Read as _;
                    file.read_to_string(&mut text).unwrap();
                    assert_eq!(text, "inside", "a file outside the folder was read");
                    inside += 1;
                }
                Err(error) => {
                    assert!(!error.message.contains("SECRET"));
                    assert!(matches!(error.code.as_str(), "forbidden_path" | "bad_trace"), "{error}");
                    refused += 1;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        assert_eq!(inside + refused, 300);
    }

    #[test]
    fn a_trace_file_error_repeats_no_value_it_read() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("t.jsonl"), r#"{"timestamp": "root:x:0:0", "input_length": 1}"#)
            .unwrap();
        let file = open_trace_file(Some(root.path()), "t.jsonl").unwrap();
        let error = read_trace_file(file, "t.jsonl").unwrap_err();
        assert_eq!(error.code, "bad_trace");
        assert!(!error.message.contains("root:x"), "{}", error.message);
    }
}
