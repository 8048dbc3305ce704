//! The P/D view: a disaggregated fleet's roles, their saturation, the routers' split decisions by reason over
//! time and where a split request's time to first token goes.
//!
//! [`Disagg`] is the handle: it reads the routers' last states and the cumulative P/D counters the router
//! poller keeps per router ([`Routers::pd_samples_since`]), and the fleet's scraped replicas for the
//! engines' own figures (KV usage, queues, the connector's transfer time). [`build`] is the pure part:
//! counter readings in, figures out, so every number here is tested on hand-made readings.
//!
//! TTFT of a split request (router-timed: arrival to the decode replica's first byte) = prefill leg
//! (router-timed: send, prefill, answer) + decode leg, and the decode leg = KV transfer (engine-timed, where
//! the connector exports it) + the first decode token. Leg figures are over the view's window; the transfer
//! is over the app's signal window (seconds), the freshest the engines give.
//!
//! Third-party routers that disaggregate (SMG in P/D mode) add a row each of their own figures, as they time
//! them (`smg_pd_*`), their splits count in the decisions over time, and the roles their workers list count
//! in the roles.

use std::collections::BTreeMap;

use fleetdeck_api::{
    ApiError, PdBucket, PdReasonCount, PdRole, PdRouterRow, PdTtftSplit, PdView, PdViewArgs, PdWorkerType,
    ReplicaRow, RouterSource,
};

use crate::fleet::Fleet;
use crate::routers::admin::{LegHistogram, PdCounters, RouterState};
use crate::routers::third_party::PeerWorker;
use crate::routers::{PD_KEPT, PeerPdSamples, Routers};
use crate::unix_ms_now;

/// The P/D view's handle. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Disagg {
    routers: Routers,
    fleet: Fleet,
}

/// Most buckets one view returns (a wider `bucket_s` is asked for beyond it).
const MAX_BUCKETS: u32 = 300;

impl Disagg {
    pub(crate) fn new(routers: Routers, fleet: Fleet) -> Self {
        Self { routers, fleet }
    }

    /// The P/D view over the last `window_s` seconds.
    pub async fn view(&self, args: PdViewArgs) -> Result<PdView, ApiError> {
        let kept = PD_KEPT.as_secs() as u32;
        if !(10..=kept).contains(&args.window_s) {
            return Err(ApiError::new(
                "bad_request",
                format!(
                    "window_s is {}; pick 10 to {kept} seconds (the app keeps {kept} s of counters)",
                    args.window_s
                ),
            ));
        }
        if args.bucket_s == 0 || args.bucket_s > args.window_s || args.window_s / args.bucket_s > MAX_BUCKETS
        {
            return Err(ApiError::new(
                "bad_request",
                format!(
                    "bucket_s is {}; pick 1 to window_s ({}) seconds, at most {MAX_BUCKETS} buckets per window",
                    args.bucket_s, args.window_s
                ),
            ));
        }
        let now_ms = unix_ms_now();
        let since_ms = now_ms - i64::from(args.window_s) * 1000;
        let input = Input {
            states: self.routers.states(),
            samples: self.routers.pd_samples_since(since_ms),
            peers: self.routers.peer_pd_samples_since(since_ms),
            peer_workers: self.routers.peer_workers(),
            replicas: self.fleet.rows(),
            sources: self.routers.sources(),
        };
        Ok(build(input, now_ms, args))
    }
}

/// What the view is built from.
pub struct Input {
    /// Every router's last state (roles, health, outstanding requests).
    pub states: Vec<RouterState>,
    /// Each router's cumulative P/D counters, oldest first, with one reading before the window.
    pub samples: Vec<(String, Vec<(i64, PdCounters)>)>,
    /// Third-party routers' own P/D readings, the same way.
    pub peers: Vec<PeerPdSamples>,
    /// The workers third-party routers list, with their roles.
    pub peer_workers: Vec<PeerWorker>,
    /// The scraped replicas.
    pub replicas: Vec<ReplicaRow>,
    pub sources: Vec<RouterSource>,
}

/// Increase of a cumulative counter; a decrease means the router restarted and counts anew.
fn increase(before: u64, after: u64) -> u64 {
    if after < before { after } else { after - before }
}

/// The view, from counters and states alone.
pub fn build(input: Input, now_ms: i64, args: PdViewArgs) -> PdView {
    let since_ms = now_ms - i64::from(args.window_s) * 1000;
    let bucket_ms = i64::from(args.bucket_s) * 1000;
    let buckets = (args.window_s / args.bucket_s) as usize;
    let start_ms = now_ms - bucket_ms * buckets as i64;
    let mut tally =
        Tally { over_time: vec![BTreeMap::new(); buckets], totals: BTreeMap::new(), start_ms, bucket_ms };
    let mut fallbacks = 0;
    let (mut prefill_leg, mut decode_first_byte) = (LegHistogram::default(), LegHistogram::default());
    let mut router_figures = Vec::new();
    for (url, samples) in &input.samples {
        let mut row = RouterWindow::default();
        for (at, before, after) in in_window(samples, since_ms) {
            for (reason, count) in &after.decisions {
                let added = increase(before.decisions.get(reason).copied().unwrap_or(0), *count);
                tally.add(at, reason, added);
                match reason.as_str() {
                    "split" => row.splits += added,
                    // Counted on top of the split it undid.
                    "transfer_failed" => {}
                    _ => row.local += added,
                }
            }
            row.failures += increase(before.fallbacks, after.fallbacks);
            add_delta(&mut row.prefill, &before.prefill_leg, &after.prefill_leg);
            add_delta(&mut row.ttft, &before.decode_first_byte, &after.decode_first_byte);
        }
        fallbacks += row.failures;
        add_leg(&mut prefill_leg, &row.prefill);
        add_leg(&mut decode_first_byte, &row.ttft);
        router_figures.push(row.into_row(url, "fleet-router"));
    }
    for peer in &input.peers {
        let mut row = RouterWindow::default();
        for (at, before, after) in in_window(&peer.samples, since_ms) {
            // A peer in P/D mode splits every request it sends to a prefill worker; what it serves without a
            // split, it does for a reason it does not give (llm-d's decode-only).
            let (added, kept) = (increase(before.splits, after.splits), increase(before.local, after.local));
            tally.add(at, "split", added);
            tally.add(at, "local", kept);
            row.splits += added;
            row.local += kept;
            row.failures += increase(before.failures, after.failures);
            add_delta(&mut row.ttft, &before.ttft, &after.ttft);
            add_delta(&mut row.prefill, &before.prefill, &after.prefill);
            add_delta(&mut row.transfer, &before.transfer, &after.transfer);
            add_delta(&mut row.decode_ttft, &before.decode_ttft, &after.decode_ttft);
        }
        if let Some((_, latest)) = peer.samples.last() {
            row.worker_types = latest.worker_types.clone();
        }
        router_figures.push(row.into_row(&peer.url, &peer.kind));
    }
    let Tally { over_time, totals, .. } = tally;
    let all: u64 = totals.values().sum();
    let mut reasons: Vec<PdReasonCount> = totals
        .into_iter()
        .map(|(reason, count)| PdReasonCount { reason, count, share: count as f64 / all.max(1) as f64 })
        .collect();
    reasons.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));

    let roles = roles(&input.states, &input.peer_workers, &input.replicas);
    let count = |name: &str| roles.iter().find(|r| r.role == name).map_or(0, |r| r.replicas);
    let (prefill, decode) = (count("prefill"), count("decode"));
    let ratio = (prefill > 0 && decode > 0).then(|| {
        let g = gcd(prefill, decode);
        format!("{}:{}", prefill / g, decode / g)
    });
    let transfer_mean_ms = roles.iter().find(|r| r.role == "decode").and_then(|r| r.transfer_ms);
    let decode_first_byte_mean_ms = mean_ms(&decode_first_byte);
    let prefill_leg_mean_ms = mean_ms(&prefill_leg);
    // The routers time the decode side from the request's arrival: the decode leg is what it adds after
    // the prefill leg (in SGLang's flow the legs overlap, and this is still what the prefill leaves).
    let decode_leg_mean_ms = match (decode_first_byte_mean_ms, prefill_leg_mean_ms) {
        (Some(ttft), Some(prefill)) => Some((ttft - prefill).max(0.0)),
        _ => None,
    };
    let ttft = PdTtftSplit {
        splits: prefill_leg.count,
        fallbacks,
        prefill_leg_mean_ms,
        prefill_leg_p95_ms: p95_ms(&prefill_leg),
        transfer_mean_ms,
        first_decode_token_mean_ms: match (decode_leg_mean_ms, transfer_mean_ms) {
            (Some(leg), Some(transfer)) => Some((leg - transfer).max(0.0)),
            _ => None,
        },
        decode_leg_mean_ms,
        decode_first_byte_mean_ms,
        decode_first_byte_p95_ms: p95_ms(&decode_first_byte),
    };

    let disaggregated = prefill > 0;
    let mut notes = Vec::new();
    if !disaggregated {
        notes.push(
            "No router knows a prefill replica: tag replicas role=prefill and role=decode in fleet-router's \
             --replica list (or add them with a role) to disaggregate."
                .to_owned(),
        );
    }
    if router_figures.iter().any(|r| r.kind != "fleet-router") {
        notes.push(
            "Third-party routers' rows are their own figures as they time them (SMG: smg_pd_ttft_seconds, \
             smg_pd_prefill_duration_seconds, and over gRPC its KV transfer and decode TTFT; llm-d: its \
             decision counters; Dynamo: its per-worker gauges by worker_type); their splits count in the \
             decisions over time, and llm-d's decode-only decisions as local."
                .to_owned(),
        );
    }
    if input.samples.is_empty() && !input.states.is_empty() {
        notes.push(
            "The routers report no P/D counters: they predate P/D mode; upgrade fleet-router.".to_owned(),
        );
    }
    if ttft.splits > 0 && transfer_mean_ms.is_none() {
        notes.push(
            "The decode replicas export no KV-transfer time (vLLM exports it with the NIXL connector only), so \
             the decode leg is shown whole."
                .to_owned(),
        );
    }
    notes.push(format!(
        "Decisions and leg times are the routers' counters over the last {} s; KV usage, queues and the \
         transfer time are the engines' latest figures.",
        args.window_s
    ));

    PdView {
        now_ms,
        window_s: args.window_s,
        bucket_s: args.bucket_s,
        routers: input.sources,
        disaggregated,
        roles,
        ratio,
        reasons,
        over_time: over_time
            .into_iter()
            .enumerate()
            .map(|(i, counts)| PdBucket { start_ms: start_ms + bucket_ms * i as i64, counts })
            .collect(),
        ttft,
        router_figures,
        notes,
    }
}

/// Decisions by reason in the window, in total and per bucket of decisions over time.
struct Tally {
    over_time: Vec<BTreeMap<String, u64>>,
    totals: BTreeMap<String, u64>,
    start_ms: i64,
    bucket_ms: i64,
}

impl Tally {
    /// Counts `n` decisions for `reason`, in the bucket of the reading taken at `at_ms`.
    fn add(&mut self, at_ms: i64, reason: &str, n: u64) {
        if n == 0 {
            return;
        }
        let last = self.over_time.len() - 1;
        let slot =
            usize::try_from((at_ms - self.start_ms - 1).max(0) / self.bucket_ms).unwrap_or(0).min(last);
        *self.over_time[slot].entry(reason.to_owned()).or_default() += n;
        *self.totals.entry(reason.to_owned()).or_default() += n;
    }
}

/// Consecutive readings whose later one falls in the window: (its time, the reading before, it).
fn in_window<T>(samples: &[(i64, T)], since_ms: i64) -> impl Iterator<Item = (i64, &T, &T)> {
    samples
        .windows(2)
        .filter(move |pair| pair[1].0 > since_ms)
        .map(|pair| (pair[1].0, &pair[0].1, &pair[1].1))
}

/// One router's P/D readings differenced over the window.
#[derive(Default)]
struct RouterWindow {
    splits: u64,
    local: u64,
    failures: u64,
    worker_types: Vec<PdWorkerType>,
    ttft: LegHistogram,
    prefill: LegHistogram,
    transfer: LegHistogram,
    decode_ttft: LegHistogram,
}

impl RouterWindow {
    fn into_row(self, url: &str, kind: &str) -> PdRouterRow {
        PdRouterRow {
            url: url.to_owned(),
            kind: kind.to_owned(),
            splits: self.splits,
            failures: self.failures,
            ttft_mean_ms: mean_ms(&self.ttft),
            ttft_p95_ms: p95_ms(&self.ttft),
            prefill_mean_ms: mean_ms(&self.prefill),
            transfer_mean_ms: mean_ms(&self.transfer),
            decode_ttft_mean_ms: mean_ms(&self.decode_ttft),
            local: self.local,
            worker_types: self.worker_types,
        }
    }
}

/// A histogram's mean, ms; `None` when it counted nothing.
fn mean_ms(h: &LegHistogram) -> Option<f64> {
    (h.count > 0).then(|| h.sum_s / h.count as f64 * 1e3)
}

/// A histogram's 95th percentile by its buckets, ms.
fn p95_ms(h: &LegHistogram) -> Option<f64> {
    let buckets: Vec<(f64, f64)> = h
        .buckets
        .iter()
        .map(|(le, n)| (*le, *n as f64))
        .chain(std::iter::once((f64::INFINITY, h.count as f64)))
        .collect();
    (h.count > 0)
        .then(|| fleet_telemetry::signals::histogram_quantile(0.95, &buckets))
        .flatten()
        .map(|s| s * 1e3)
}

/// Adds one window's histogram to a total (as [`add_delta`] from an empty reading).
fn add_leg(total: &mut LegHistogram, window: &LegHistogram) {
    add_delta(total, &LegHistogram::default(), window);
}

/// Adds the increase of a leg histogram between two readings (a reset takes the later one whole).
fn add_delta(total: &mut LegHistogram, before: &LegHistogram, after: &LegHistogram) {
    let same_layout = before.buckets.len() == after.buckets.len()
        && before.buckets.iter().zip(&after.buckets).all(|(a, b)| a.0 == b.0);
    let reset = !same_layout || after.count < before.count;
    let delta: Vec<(f64, u64)> = if reset {
        after.buckets.clone()
    } else {
        before.buckets.iter().zip(&after.buckets).map(|(a, b)| (b.0, b.1.saturating_sub(a.1))).collect()
    };
    let (count, sum) = if reset {
        (after.count, after.sum_s)
    } else {
        (after.count - before.count, (after.sum_s - before.sum_s).max(0.0))
    };
    if total.buckets.is_empty() {
        total.buckets = delta.iter().map(|(le, _)| (*le, 0)).collect();
    }
    // Routers share one layout; a reading in another is counted in the sum and count only.
    if total.buckets.len() == delta.len() && total.buckets.iter().zip(&delta).all(|(a, b)| a.0 == b.0) {
        for (slot, (_, n)) in total.buckets.iter_mut().zip(&delta) {
            slot.1 += n;
        }
    }
    total.count += count;
    total.sum_s += sum;
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a.max(1) } else { gcd(b, a % b) }
}

/// Per role: replicas (each URL once, as any router lists it), health, the routers' outstanding requests
/// and the engines' own figures.
fn roles(states: &[RouterState], peer_workers: &[PeerWorker], replicas: &[ReplicaRow]) -> Vec<PdRole> {
    struct Seen {
        role: String,
        healthy: bool,
        outstanding: u64,
    }
    let mut by_url: BTreeMap<String, Seen> = BTreeMap::new();
    for state in states {
        for replica in &state.replicas {
            let role = if replica.role.is_empty() { "both".to_owned() } else { replica.role.clone() };
            let seen = by_url.entry(fleet_telemetry::scrape::metrics_url(&replica.url)).or_insert(Seen {
                role,
                healthy: false,
                outstanding: 0,
            });
            // Healthy if any router can reach it; outstanding requests add up over routers.
            seen.healthy |= replica.healthy;
            seen.outstanding += replica.outstanding;
        }
    }
    for worker in peer_workers {
        let seen = by_url.entry(fleet_telemetry::scrape::metrics_url(&worker.url)).or_insert(Seen {
            role: worker.role.clone(),
            healthy: false,
            outstanding: 0,
        });
        seen.healthy |= worker.healthy.unwrap_or(false);
        seen.outstanding += worker.load.unwrap_or(0.0).max(0.0) as u64;
    }
    let scraped: BTreeMap<String, &ReplicaRow> =
        replicas.iter().map(|row| (fleet_telemetry::scrape::metrics_url(&row.url), row)).collect();
    let mean =
        |values: Vec<f64>| (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64);
    ["prefill", "decode", "both"]
        .into_iter()
        .filter_map(|name| {
            let members: Vec<(&String, &Seen)> = by_url.iter().filter(|(_, s)| s.role == name).collect();
            if members.is_empty() {
                return None;
            }
            let rows: Vec<&ReplicaRow> =
                members.iter().filter_map(|(url, _)| scraped.get(*url).copied()).collect();
            let signal =
                |pick: fn(&ReplicaRow) -> Option<f64>| mean(rows.iter().filter_map(|r| pick(r)).collect());
            Some(PdRole {
                role: name.to_owned(),
                replicas: members.len() as u32,
                healthy: members.iter().filter(|(_, s)| s.healthy).count() as u32,
                outstanding_per_replica: members.iter().map(|(_, s)| s.outstanding).sum::<u64>() as f64
                    / members.len() as f64,
                kv_usage: signal(|r| r.signals.kv_usage),
                queue_depth: signal(|r| r.signals.queue_depth),
                running: signal(|r| r.signals.running),
                transfer_ms: signal(|r| r.signals.kv_transfer_s).map(|s| s * 1e3),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routers::admin::RouterReplica;
    use fleetdeck_api::{ScrapeState, Signals};

    fn leg(buckets: [u64; 3], sum_s: f64, count: u64) -> LegHistogram {
        LegHistogram { buckets: vec![(0.1, buckets[0]), (0.5, buckets[1]), (1.0, buckets[2])], sum_s, count }
    }

    fn counters(
        split: u64,
        short: u64,
        fallbacks: u64,
        prefill: LegHistogram,
        decode: LegHistogram,
    ) -> PdCounters {
        PdCounters {
            decisions: [("split".to_owned(), split), ("short_prompt".to_owned(), short)]
                .into_iter()
                .collect(),
            fallbacks,
            prefill_leg: prefill,
            decode_first_byte: decode,
        }
    }

    fn replica(url: &str, role: &str, healthy: bool, outstanding: u64) -> RouterReplica {
        RouterReplica {
            url: url.to_owned(),
            role: role.to_owned(),
            healthy,
            outstanding,
            ..RouterReplica::default()
        }
    }

    fn row(url: &str, kv_usage: f64, queue: f64, transfer_s: Option<f64>) -> ReplicaRow {
        ReplicaRow {
            id: 0,
            url: url.to_owned(),
            engine: Some("vllm".to_owned()),
            model: None,
            signals: Signals {
                kv_usage: Some(kv_usage),
                queue_depth: Some(queue),
                kv_transfer_s: transfer_s,
                ..Signals::default()
            },
            scrape: ScrapeState::Pending,
            tokens_per_s: None,
        }
    }

    const NOW: i64 = 1_000_000;

    /// Input of fleet-routers' counter readings alone.
    fn of_samples(samples: Vec<(String, Vec<(i64, PdCounters)>)>) -> Input {
        Input {
            states: vec![],
            samples,
            replicas: vec![],
            sources: vec![],
            peers: vec![],
            peer_workers: vec![],
        }
    }

    fn args() -> PdViewArgs {
        PdViewArgs { window_s: 60, bucket_s: 10 }
    }

    #[test]
    fn decisions_are_counted_by_reason_in_the_bucket_they_happened() {
        let zero = || counters(0, 0, 0, leg([0; 3], 0.0, 0), leg([0; 3], 0.0, 0));
        let samples = vec![
            (
                "http://r1".to_owned(),
                vec![
                    // Before the window: what came before it is not counted.
                    (NOW - 70_000, counters(5, 5, 0, leg([0; 3], 0.0, 0), leg([0; 3], 0.0, 0))),
                    (NOW - 55_000, counters(7, 6, 0, leg([0; 3], 0.0, 0), leg([0; 3], 0.0, 0))),
                    (NOW - 5_000, counters(10, 6, 1, leg([0; 3], 0.0, 0), leg([0; 3], 0.0, 0))),
                ],
            ),
            (
                "http://r2".to_owned(),
                vec![
                    (NOW - 30_000, zero()),
                    (NOW - 2_000, counters(0, 4, 0, leg([0; 3], 0.0, 0), leg([0; 3], 0.0, 0))),
                ],
            ),
        ];
        let view = build(of_samples(samples), NOW, args());
        let got: Vec<(&str, u64)> = view.reasons.iter().map(|r| (r.reason.as_str(), r.count)).collect();
        assert_eq!(got, [("short_prompt", 5), ("split", 5)], "largest first, ties by name");
        assert!((view.reasons[0].share - 0.5).abs() < 1e-9);
        assert_eq!(view.over_time.len(), 6);
        assert_eq!(view.over_time[0].start_ms, NOW - 60_000);
        // NOW-55 s lands in the first bucket, NOW-5 s and NOW-2 s in the last.
        assert_eq!(
            view.over_time[0].counts,
            [("short_prompt".to_owned(), 1), ("split".to_owned(), 2)].into()
        );
        assert_eq!(
            view.over_time[5].counts,
            [("short_prompt".to_owned(), 4), ("split".to_owned(), 3)].into()
        );
        assert!(view.over_time[1..5].iter().all(|b| b.counts.is_empty()));
        assert_eq!(view.ttft.fallbacks, 1);
    }

    #[test]
    fn a_router_restart_counts_its_new_totals_not_a_negative() {
        let samples = vec![(
            "http://r1".to_owned(),
            vec![
                (NOW - 20_000, counters(50, 0, 0, leg([40, 50, 50], 5.0, 50), leg([0; 3], 0.0, 0))),
                (NOW - 10_000, counters(3, 0, 0, leg([1, 3, 3], 0.6, 3), leg([0; 3], 0.0, 0))),
            ],
        )];
        let view = build(of_samples(samples), NOW, args());
        assert_eq!(view.reasons[0].count, 3);
        assert_eq!(view.ttft.splits, 3);
        assert!(view.ttft.prefill_leg_mean_ms.is_some_and(|ms| (ms - 200.0).abs() < 1e-9));
    }

    #[test]
    fn ttft_divides_into_the_prefill_leg_the_transfer_and_the_first_decode_token() {
        // Two routers, 10 splits: prefill legs 8 under 0.1 s and 2 under 0.5 s; first bytes 140 ms after
        // arrival, so 60 ms after the 80 ms prefill leg.
        let router = |url: &str, prefill: [u64; 3], p_sum: f64, d_sum: f64| {
            (
                url.to_owned(),
                vec![
                    (NOW - 40_000, counters(0, 0, 0, leg([0; 3], 0.0, 0), leg([0; 3], 0.0, 0))),
                    (NOW - 1_000, counters(5, 0, 0, leg(prefill, p_sum, 5), leg([0, 5, 5], d_sum, 5))),
                ],
            )
        };
        let samples =
            vec![router("http://r1", [5, 5, 5], 0.25, 0.7), router("http://r2", [3, 5, 5], 0.55, 0.7)];
        let states = vec![RouterState {
            replicas: vec![
                replica("http://p1", "prefill", true, 2),
                replica("http://d1", "decode", true, 1),
                replica("http://d2", "decode", false, 3),
            ],
            ..RouterState::default()
        }];
        let replicas = vec![
            row("http://p1", 0.2, 1.0, None),
            row("http://d1/metrics", 0.6, 0.0, Some(0.015)),
            row("http://d2", 0.8, 2.0, Some(0.025)),
        ];
        let view = build(
            Input { states, samples, replicas, sources: vec![], peers: vec![], peer_workers: vec![] },
            NOW,
            args(),
        );
        let t = &view.ttft;
        assert_eq!(t.splits, 10);
        assert!(t.prefill_leg_mean_ms.is_some_and(|ms| (ms - 80.0).abs() < 1e-9), "{t:?}");
        // The 95th of 10 lies in (0.1, 0.5]: 9.5th observation, 1.5 of the bucket's 2.
        assert!(t.prefill_leg_p95_ms.is_some_and(|ms| (ms - (100.0 + 400.0 * 0.75)).abs() < 1e-6), "{t:?}");
        assert!(t.decode_first_byte_mean_ms.is_some_and(|ms| (ms - 140.0).abs() < 1e-9), "{t:?}");
        assert!(t.decode_leg_mean_ms.is_some_and(|ms| (ms - 60.0).abs() < 1e-9), "{t:?}");
        assert!(t.transfer_mean_ms.is_some_and(|ms| (ms - 20.0).abs() < 1e-9), "{t:?}");
        assert!(t.first_decode_token_mean_ms.is_some_and(|ms| (ms - 40.0).abs() < 1e-9), "{t:?}");
        // Each router's own row: its splits and legs.
        let r2 = view.router_figures.iter().find(|r| r.url == "http://r2").expect("r2's row");
        assert_eq!((r2.kind.as_str(), r2.splits, r2.local, r2.failures), ("fleet-router", 5, 0, 0));
        assert!(r2.prefill_mean_ms.is_some_and(|ms| (ms - 110.0).abs() < 1e-9), "{r2:?}");
        assert!(r2.ttft_mean_ms.is_some_and(|ms| (ms - 140.0).abs() < 1e-9), "{r2:?}");
        assert_eq!(r2.transfer_mean_ms, None, "fleet-router leaves the transfer to the engines");

        assert!(view.disaggregated);
        assert_eq!(view.ratio.as_deref(), Some("1:2"));
        let decode = view.roles.iter().find(|r| r.role == "decode").expect("a decode role");
        assert_eq!((decode.replicas, decode.healthy), (2, 1));
        assert!((decode.outstanding_per_replica - 2.0).abs() < 1e-9);
        assert!(decode.kv_usage.is_some_and(|u| (u - 0.7).abs() < 1e-9));
        assert_eq!(decode.queue_depth, Some(1.0));
        let prefill = view.roles.iter().find(|r| r.role == "prefill").expect("a prefill role");
        assert_eq!((prefill.replicas, prefill.transfer_ms), (1, None));
        assert!(!view.notes.iter().any(|n| n.contains("no KV-transfer time")), "{:?}", view.notes);
    }

    #[test]
    fn a_fleet_without_prefill_replicas_says_how_to_disaggregate() {
        let states =
            vec![RouterState { replicas: vec![replica("http://a", "", true, 0)], ..RouterState::default() }];
        let view = build(
            Input {
                states,
                samples: vec![],
                replicas: vec![],
                sources: vec![],
                peers: vec![],
                peer_workers: vec![],
            },
            NOW,
            args(),
        );
        assert!(!view.disaggregated);
        assert_eq!(view.ratio, None);
        assert_eq!(view.roles.iter().map(|r| r.role.as_str()).collect::<Vec<_>>(), ["both"]);
        assert!(view.notes.iter().any(|n| n.contains("role=prefill")), "{:?}", view.notes);
        assert!(view.notes.iter().any(|n| n.contains("predate P/D")), "{:?}", view.notes);
        assert!(view.ttft.prefill_leg_mean_ms.is_none());
    }

    #[test]
    fn a_third_party_router_adds_its_own_figures_its_splits_and_its_workers_roles() {
        use crate::routers::third_party::PeerPd;
        let smg = |splits: u64, failures: u64, ttft_sum: f64, prefill_sum: f64| PeerPd {
            splits,
            failures,
            ttft: leg([0, splits, splits], ttft_sum, splits),
            prefill: leg([splits, splits, splits], prefill_sum, splits),
            ..PeerPd::default()
        };
        let peers = vec![PeerPdSamples {
            url: "http://smg".to_owned(),
            kind: "smg".to_owned(),
            samples: vec![
                // Before the window: 10 splits, one failure, are not this window's.
                (NOW - 70_000, smg(10, 1, 2.0, 0.5)),
                (NOW - 25_000, smg(14, 1, 2.8, 0.7)),
                (NOW - 3_000, smg(16, 2, 3.2, 0.8)),
            ],
        }];
        let worker = |url: &str, role: &str, load: f64| PeerWorker {
            url: url.to_owned(),
            healthy: Some(true),
            load: Some(load),
            role: role.to_owned(),
        };
        let peer_workers = vec![worker("http://p", "prefill", 1.0), worker("http://d", "decode", 3.0)];
        let input =
            Input { states: vec![], samples: vec![], replicas: vec![], sources: vec![], peers, peer_workers };
        let view = build(input, NOW, args());
        let row = view.router_figures.first().expect("SMG's row");
        assert_eq!(
            (row.url.as_str(), row.kind.as_str(), row.splits, row.failures),
            ("http://smg", "smg", 6, 1)
        );
        // 6 splits, 1.2 s of TTFT and 0.3 s of prefill between the readings.
        assert!(row.ttft_mean_ms.is_some_and(|ms| (ms - 200.0).abs() < 1e-6), "{row:?}");
        assert!(row.prefill_mean_ms.is_some_and(|ms| (ms - 50.0).abs() < 1e-6), "{row:?}");
        assert_eq!((row.transfer_mean_ms, row.decode_ttft_mean_ms), (None, None), "not timed: {row:?}");
        assert_eq!(
            view.reasons.iter().map(|r| (r.reason.as_str(), r.count)).collect::<Vec<_>>(),
            [("split", 6)]
        );
        assert_eq!(view.over_time[3].counts.get("split"), Some(&4));
        assert_eq!(view.over_time[5].counts.get("split"), Some(&2));
        assert!(view.disaggregated, "its workers' roles make the fleet a P/D one");
        assert_eq!(view.ratio.as_deref(), Some("1:1"));
        let decode = view.roles.iter().find(|r| r.role == "decode").expect("a decode role");
        assert_eq!((decode.replicas, decode.healthy, decode.outstanding_per_replica), (1, 1, 3.0));
        assert!(view.notes.iter().any(|n| n.contains("smg_pd_ttft_seconds")), "{:?}", view.notes);
    }

    #[test]
    fn llm_d_decode_only_decisions_count_as_local_and_dynamo_worker_types_show_as_they_stand() {
        use crate::routers::third_party::PeerPd;
        let llm_d = |splits: u64, local: u64| PeerPd { splits, local, ..PeerPd::default() };
        let prefill = |tokens: f64| PdWorkerType {
            worker_type: "prefill".to_owned(),
            workers: 2,
            active_prefill_tokens: Some(tokens),
            last_ttft_ms: Some(250.0),
            ..PdWorkerType::default()
        };
        let dynamo = |tokens: f64| PeerPd { worker_types: vec![prefill(tokens)], ..PeerPd::default() };
        let peers = vec![
            PeerPdSamples {
                url: "http://epp".to_owned(),
                kind: "llm-d".to_owned(),
                samples: vec![(NOW - 30_000, llm_d(1, 1)), (NOW - 5_000, llm_d(3, 6))],
            },
            PeerPdSamples {
                url: "http://dynamo".to_owned(),
                kind: "dynamo".to_owned(),
                samples: vec![(NOW - 30_000, dynamo(10.0)), (NOW - 5_000, dynamo(700.0))],
            },
        ];
        let input = Input {
            states: vec![],
            samples: vec![],
            replicas: vec![],
            sources: vec![],
            peers,
            peer_workers: vec![],
        };
        let view = build(input, NOW, args());
        let got: Vec<(&str, u64)> = view.reasons.iter().map(|r| (r.reason.as_str(), r.count)).collect();
        assert_eq!(got, [("local", 5), ("split", 2)]);
        let epp = view.router_figures.iter().find(|r| r.kind == "llm-d").expect("llm-d's row");
        assert_eq!((epp.splits, epp.local), (2, 5));
        let dyn_row = view.router_figures.iter().find(|r| r.kind == "dynamo").expect("Dynamo's row");
        let types: Vec<(&str, u32, Option<f64>, Option<f64>)> = dyn_row
            .worker_types
            .iter()
            .map(|t| (t.worker_type.as_str(), t.workers, t.active_prefill_tokens, t.last_ttft_ms))
            .collect();
        assert_eq!(types, [("prefill", 2, Some(700.0), Some(250.0))], "the latest reading, not a sum");
    }

    #[test]
    fn ratios_are_reduced() {
        assert_eq!(gcd(2, 4), 2);
        assert_eq!(gcd(3, 5), 1);
        assert_eq!(gcd(0, 0), 1);
    }
}
