//! Policies that look only at health and load: round robin, random, least load, power of two choices.

use rand::{Rng, RngCore};

use super::cache_aware::whole;
use super::{Engine, PickInProgress, argmin_by};
use crate::decision::Branch;
use crate::spec::{LoadMetric, LoadParams};

pub(super) fn load_of(engine: &Engine, pick: &PickInProgress, position: usize, params: &LoadParams) -> f64 {
    let candidate = &pick.candidates[position];
    match params.load_metric {
        // Fresh reported metrics count the requests other routers sent too.
        LoadMetric::Requests => candidate.seen_load.unwrap_or(candidate.outstanding as f64),
        LoadMetric::PrefillTokens => candidate.prefill_tokens as f64,
        LoadMetric::Wait => pick.wait_blocks(engine, position, params.decode_wait_weight).total(),
    }
}

/// A load for a reason sentence: whole as an integer (request counts, tokens), else to one decimal (an
/// expected wait weighs decoding blocks at a fraction: 0.1 x 3 prints 0.3, not 0.30000000000000004).
struct Shown(f64);

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match whole(self.0) {
            Some(integer) => write!(f, "{integer}"),
            None => write!(f, "{:.1}", self.0),
        }
    }
}

fn metric_name(metric: LoadMetric) -> &'static str {
    match metric {
        LoadMetric::Requests => "outstanding requests",
        LoadMetric::PrefillTokens => "prefill tokens",
        LoadMetric::Wait => "blocks of expected wait",
    }
}

pub(super) fn round_robin<R: RngCore + ?Sized>(engine: &Engine, pick: &mut PickInProgress, rng: &mut R) {
    // The turn advances in `on_routed`, never here, so a pick that is not routed changes nothing.
    let next = match engine.last_routed_slot {
        Some(last) => pick.healthy.iter().copied().find(|&position| pick.slots[position] > last),
        None => None,
    };
    let (position, reason) = match engine
        .last_routed_slot
        .and_then(|slot| engine.slots.get(slot as usize)?.as_ref())
    {
        Some(last) => {
            let position = next.unwrap_or(pick.healthy[0]);
            let reason = if next.is_some() {
                format!(
                    "round robin: {} is the next healthy replica after {}",
                    pick.replica(position),
                    last.id
                )
            } else {
                format!(
                    "round robin: wrapped around to the first healthy replica, {}",
                    pick.replica(position)
                )
            };
            (position, reason)
        }
        // The first turn starts at a replica drawn at random, as Envoy's round robin does: routers that
        // all started at the first replica would move in step, each sending its next request to the
        // same replica as the others (`bench routers`: TTFT p50 161 -> 495 ms with 4 routers).
        None => {
            let position = pick.healthy[rng.random_range(0..pick.healthy.len())];
            (position, format!("round robin: {} starts the turn (drawn at random)", pick.replica(position)))
        }
    };
    pick.decide(position, Branch::RoundRobin, reason);
}

pub(super) fn random<R: RngCore + ?Sized>(pick: &mut PickInProgress, rng: &mut R) {
    let position = pick.healthy[rng.random_range(0..pick.healthy.len())];
    let reason = format!(
        "random: drew {} uniformly from {} healthy replicas",
        pick.replica(position),
        pick.healthy.len()
    );
    pick.decide(position, Branch::Random, reason);
}

/// Fills `load` for every healthy candidate and returns the least loaded (engine order breaks ties).
pub(super) fn fill_loads_and_pick_least(
    engine: &Engine,
    pick: &mut PickInProgress,
    params: &LoadParams,
) -> usize {
    for index in 0..pick.healthy.len() {
        let position = pick.healthy[index];
        pick.candidates[position].load = Some(load_of(engine, pick, position, params));
    }
    argmin_by(&pick.healthy, |position| {
        (load_of(engine, pick, position, params), tie_break(pick, position, params.load_metric))
    })
}

/// What breaks a tie of `metric`, before engine order: the other figure. Equal request counts go to the
/// replica with less prompt still to prefill (the wait a new request would queue behind); equal prefill
/// (idle replicas all have none) to fewer requests, or light traffic piles onto the first replica.
fn tie_break(pick: &PickInProgress, position: usize, metric: LoadMetric) -> u64 {
    let candidate = &pick.candidates[position];
    match metric {
        LoadMetric::Requests => candidate.prefill_tokens,
        // No queue anywhere: fewer requests decoding.
        LoadMetric::PrefillTokens | LoadMetric::Wait => candidate.outstanding,
    }
}

pub(super) fn least_load(engine: &Engine, pick: &mut PickInProgress, params: &LoadParams) {
    let metric = params.load_metric;
    let position = fill_loads_and_pick_least(engine, pick, params);
    let reason = format!(
        "least load: {} has the fewest {} ({}) of {} healthy replicas",
        pick.replica(position),
        metric_name(metric),
        Shown(load_of(engine, pick, position, params)),
        pick.healthy.len()
    );
    pick.decide(position, Branch::LeastLoad, reason);
}

pub(super) fn power_of_two<R: RngCore + ?Sized>(
    engine: &Engine,
    pick: &mut PickInProgress,
    params: &LoadParams,
    rng: &mut R,
) {
    let metric = params.load_metric;
    let healthy = pick.healthy.len();
    if healthy == 1 {
        let position = pick.healthy[0];
        pick.candidates[position].load = Some(load_of(engine, pick, position, params));
        let reason = format!("power of two: {} is the only healthy replica", pick.replica(position));
        pick.decide(position, Branch::PowerOfTwo, reason);
        return;
    }
    // Two distinct draws: the second skips over the first.
    let first = rng.random_range(0..healthy);
    let mut second = rng.random_range(0..healthy - 1);
    if second >= first {
        second += 1;
    }
    let (first, second) = (pick.healthy[first], pick.healthy[second]);
    for position in [first, second] {
        pick.candidates[position].load = Some(load_of(engine, pick, position, params));
        pick.candidates[position].note = Some("drawn".to_owned());
    }
    let key = |position| (load_of(engine, pick, position, params), tie_break(pick, position, metric));
    let (winner, loser) = if key(second) < key(first) { (second, first) } else { (first, second) };
    let reason = format!(
        "power of two: drew {} ({} {}) and {} ({} {}); the less loaded wins",
        pick.replica(winner),
        Shown(load_of(engine, pick, winner, params)),
        metric_name(metric),
        pick.replica(loser),
        Shown(load_of(engine, pick, loser, params)),
        metric_name(metric),
    );
    pick.decide(winner, Branch::PowerOfTwo, reason);
}
