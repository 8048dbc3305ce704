//! The cache-aware policies: `cache_aware_approx` (SGLang), `kv_precise` (Dynamo) and `weighted_scorers` (llm-d).

use std::fmt;

use rand::{Rng, RngCore};

use super::load_based::fill_loads_and_pick_least;
use super::{Engine, ForeignBlocks, PickInProgress, ReplicaMetrics, argmin_by, peer_prompts};
use crate::decision::Branch;
use crate::kv_event::Medium;
use crate::prefix_index::PrefixIndex;
use crate::replica::ReplicaId;
use crate::request::RequestView;
use crate::spec::{CacheAwareParams, KvPreciseParams, LoadParams, PrefixSource, WeightedScorersParams};

/// Metrics older than this are flagged in the explanation as stale.
const STALE_METRICS_MS: u64 = 10_000;
/// Replicas named in one note before the rest are counted instead (keeps picks cheap at 256 replicas).
const NAMES_PER_NOTE: usize = 8;

/// "r1, r3" or "r1, ..., r8 and 40 more".
pub(super) fn name_list(names: &[ReplicaId]) -> String {
    let mut text = names.iter().take(NAMES_PER_NOTE).map(ToString::to_string).collect::<Vec<_>>().join(", ");
    if names.len() > NAMES_PER_NOTE {
        text.push_str(&format!(" and {} more", names.len() - NAMES_PER_NOTE));
    }
    text
}

/// Locations whose match counts live on the stack during a pick; larger indexes use one heap buffer.
const INLINE_LOCATIONS: usize = 256;

/// A reason sentence, formatted into one buffer sized for it: `format!` sizes from the literal text only,
/// so these sentences (mostly arguments) would otherwise grow it two or three times.
fn sentence(args: fmt::Arguments<'_>) -> String {
    let mut text = String::with_capacity(256);
    // Writing into a String cannot fail.
    let _ = fmt::Write::write_fmt(&mut text, args);
    text
}

/// Matches the prompt against `index` and records each candidate's matched blocks.
fn fill_matches(pick: &mut PickInProgress, index: &PrefixIndex, view: &RequestView) {
    fill_matches_with(pick, index.location_count(), |matched| {
        index.match_prefix_into(&view.block_hashes, matched)
    });
}

/// Runs `matcher` over a zeroed count per location (`locations` of them) and raises each candidate's
/// matched blocks to its location's count.
pub(super) fn fill_matches_with(
    pick: &mut PickInProgress,
    locations: usize,
    matcher: impl FnOnce(&mut [u32]),
) {
    let mut inline = [0u32; INLINE_LOCATIONS];
    let mut spilled = Vec::new();
    let matched: &mut [u32] = if locations <= INLINE_LOCATIONS {
        &mut inline[..locations]
    } else {
        spilled.resize(locations, 0);
        &mut spilled
    };
    matcher(matched);
    for (candidate, slot) in pick.candidates.iter_mut().zip(&pick.slots) {
        let found = matched.get(*slot as usize).copied().unwrap_or(0);
        candidate.matched_blocks = Some(candidate.matched_blocks.map_or(found, |before| before.max(found)));
    }
}

/// An `f64` rendered exactly as `{}` renders it, but whole numbers (the usual case for block counts,
/// weights and costs) go through integer formatting, which is several times cheaper than float printing.
struct Num(f64);

/// An `f64` rendered exactly as `{:.N}` renders it, with the same whole-number shortcut as [`Num`].
pub(super) struct Fixed(pub(super) f64, pub(super) usize);

/// The value as an integer when `{}` would print it as one (whole, in i64 range, and not -0, which
/// prints with its sign).
pub(super) fn whole(value: f64) -> Option<i64> {
    let exact = value.fract() == 0.0 && value.abs() < 1e15 && !(value == 0.0 && value.is_sign_negative());
    exact.then_some(value as i64)
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match whole(self.0) {
            Some(integer) => write!(f, "{integer}"),
            None => write!(f, "{}", self.0),
        }
    }
}

impl fmt::Display for Fixed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match whole(self.0) {
            Some(integer) if self.1 == 0 => write!(f, "{integer}"),
            Some(integer) => write!(f, "{integer}.{:0<width$}", "", width = self.1),
            None => write!(f, "{:.*}", self.1, self.0),
        }
    }
}

fn matched(pick: &PickInProgress, position: usize) -> u32 {
    pick.candidates[position].matched_blocks.unwrap_or(0)
}

/// Requests a replica holds as the pick sees them: its fresh reported figures with this engine's requests
/// sent since (other routers' load included), else this engine's outstanding count.
fn held(candidate: &crate::decision::CandidateExplanation) -> u64 {
    candidate.seen_load.map_or(candidate.outstanding, |load| load as u64)
}

fn share(matched: u32, prompt_blocks: usize) -> f64 {
    if prompt_blocks == 0 { 0.0 } else { f64::from(matched) / prompt_blocks as f64 }
}

pub(super) fn approx(
    engine: &Engine,
    pick: &mut PickInProgress,
    params: &CacheAwareParams,
    view: &RequestView,
) {
    let prompt_blocks = view.block_hashes.len();
    fill_matches(pick, &engine.routed_index, view);
    peer_prompts::fill_peer_routed(engine, pick, view);
    for candidate in &mut pick.candidates {
        candidate.score = Some(share(candidate.matched_blocks.unwrap_or(0), prompt_blocks));
    }
    if engine.routed_index.distinct_blocks() == 0 && engine.peer_routed_index.distinct_blocks() == 0 {
        pick.notes.push(
            "the approximate index is empty: it learns only from requests routed under this policy (on_routed)"
                .to_owned(),
        );
    }
    // `healthy` is never empty here (the pick would have failed), so both bounds are real loads.
    let (mut min, mut max) = (u64::MAX, 0);
    for &position in &pick.healthy {
        let outstanding = held(&pick.candidates[position]);
        min = min.min(outstanding);
        max = max.max(outstanding);
    }
    // SGLang's imbalance test: both the absolute and the relative gap must be exceeded.
    let imbalanced =
        max - min > params.balance_abs_threshold && max as f64 > params.balance_rel_threshold * min as f64;
    // Least loaded, ties to the replica the index attributes the fewest blocks to (most room), as SGLang does.
    let least_loaded = |pick: &mut PickInProgress| {
        fill_loads_and_pick_least(engine, pick, &LoadParams::REQUESTS);
        argmin_by(&pick.healthy, |p| {
            (held(&pick.candidates[p]), engine.routed_index.blocks_at(pick.slots[p]))
        })
    };
    if imbalanced {
        let position = least_loaded(pick);
        let reason = sentence(format_args!(
            "balance: outstanding requests range from {min} to {max} (gap {} > {} and {max} > {} x {min}), so the \
             least loaded {} was chosen",
            max - min,
            params.balance_abs_threshold,
            params.balance_rel_threshold,
            pick.replica(position)
        ));
        pick.decide(position, Branch::Balance, reason);
        return;
    }
    // Longest match, ties to the less loaded, then to engine order.
    let best = argmin_by(&pick.healthy, |p| (std::cmp::Reverse(matched(pick, p)), held(&pick.candidates[p])));
    let best_matched = matched(pick, best);
    let best_share = share(best_matched, prompt_blocks);
    if best_share > params.cache_threshold {
        for &position in &pick.healthy {
            pick.candidates[position].load = Some(held(&pick.candidates[position]) as f64);
        }
        let reason = sentence(format_args!(
            "cache: {} holds {best_matched} of {prompt_blocks} prompt blocks ({}%), the longest match, above \
             cache_threshold {}",
            pick.replica(best),
            Fixed(best_share * 100.0, 0),
            params.cache_threshold
        ));
        pick.decide(best, Branch::Cache, reason);
    } else {
        let position = least_loaded(pick);
        let reason = sentence(format_args!(
            "fallback: the longest prefix match is {best_matched} of {prompt_blocks} blocks ({}%), not above \
             cache_threshold {}, so the least loaded {} was chosen",
            Fixed(best_share * 100.0, 0),
            params.cache_threshold,
            pick.replica(position)
        ));
        pick.decide(position, Branch::Fallback, reason);
    }
}

/// How a `kv_precise` cost adds up, written straight into the reason (no intermediate string).
struct CostExplanation<'a> {
    cost: f64,
    params: &'a KvPreciseParams,
    uncached: f64,
    active_prefill_blocks: u64,
    active_decode_blocks: u64,
    /// Other routers' requests there, by the replica's fresh metrics (named only when there are some).
    foreign: ForeignBlocks,
}

impl fmt::Display for CostExplanation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cost {} = {} x (", Fixed(self.cost, 1), Num(self.params.prefill_weight))?;
        if self.params.overlap_weight != 1.0 {
            write!(f, "{} x ", Num(self.params.overlap_weight))?;
        }
        write!(f, "{} uncached + {} active prefill blocks", Num(self.uncached), self.active_prefill_blocks)?;
        if self.foreign.prefill > 0.0 {
            write!(f, " + {} for other routers' requests", Fixed(self.foreign.prefill, 1))?;
        }
        write!(
            f,
            ") + {} x {} active decode blocks",
            Num(self.params.decode_weight),
            self.active_decode_blocks
        )?;
        if self.foreign.decode > 0.0 {
            write!(f, " + {} for other routers' requests", Fixed(self.foreign.decode, 1))?;
        }
        Ok(())
    }
}

pub(super) fn precise<R: RngCore + ?Sized>(
    engine: &Engine,
    pick: &mut PickInProgress,
    params: &KvPreciseParams,
    view: &RequestView,
    rng: &mut R,
) {
    let prompt_blocks = view.block_hashes.len() as f64;
    fill_matches(pick, &engine.kv_indexes[Medium::Gpu.index()], view);
    // Blocks of requests routed to a replica and still in prefill will be cached there before this
    // request is prefilled, though no KV event says so yet: without this, a burst of requests sharing a
    // new prefix would scatter it over every replica before the first BlockStored arrives.
    if engine.pending_index.distinct_blocks() > 0 {
        fill_matches(pick, &engine.pending_index, view);
    }
    // Other routers' requests in prefill, as far as their prefix marks tell.
    peer_prompts::fill_peer_pending(engine, pick, view);
    // Every candidate's cost and how many healthy replicas are silent (no KV events yet); then the cheapest
    // healthy candidate, found once for every branch. Ties (common when replicas are idle and nothing
    // matches) go to the replica holding fewer requests (other routers' included), then fewer cached
    // blocks, then engine order: always taking the first would pile every new prefix onto one replica and
    // evict it early. The active blocks include other routers' requests where the replica's metrics are
    // fresh: this router's own are only its share of the fleet's load.
    let mut silent = 0usize;
    let mut cheapest: Option<(usize, (f64, u64, usize))> = None;
    for ((candidate, slot), foreign) in pick.candidates.iter_mut().zip(&pick.slots).zip(&pick.foreign) {
        let Some(state) = engine.slots[*slot as usize].as_ref() else { continue };
        let uncached = prompt_blocks - f64::from(candidate.matched_blocks.unwrap_or(0));
        let cost = params.prefill_weight
            * (params.overlap_weight * uncached + state.active_prefill_blocks as f64 + foreign.prefill)
            + params.decode_weight * (state.active_decode_blocks as f64 + foreign.decode);
        candidate.cost = Some(cost);
        if state.healthy {
            silent += usize::from(state.kv_events == 0);
        }
    }
    let gpu_index = &engine.kv_indexes[Medium::Gpu.index()];
    for &position in &pick.healthy {
        let key = (
            pick.candidates[position].cost.unwrap_or(f64::INFINITY),
            held(&pick.candidates[position]),
            gpu_index.blocks_at(pick.slots[position]),
        );
        if cheapest.is_none_or(|(_, best)| key.partial_cmp(&best) == Some(std::cmp::Ordering::Less)) {
            cheapest = Some((position, key));
        }
    }
    let cheapest = cheapest.map_or(pick.healthy[0], |(position, _)| position);
    let cost = |pick: &PickInProgress, p: usize| pick.candidates[p].cost.unwrap_or(f64::INFINITY);
    let explain = |pick: &PickInProgress, p: usize| {
        let state = engine.slots[pick.slots[p] as usize].as_ref();
        CostExplanation {
            cost: cost(pick, p),
            params,
            uncached: prompt_blocks - f64::from(matched(pick, p)),
            active_prefill_blocks: state.map_or(0, |s| s.active_prefill_blocks),
            active_decode_blocks: state.map_or(0, |s| s.active_decode_blocks),
            foreign: pick.foreign[p],
        }
    };
    if silent == pick.healthy.len() {
        let position = cheapest;
        pick.notes.push("no KV events have been received from any healthy replica".to_owned());
        let reason = sentence(format_args!(
            "fallback: no replica has sent KV events, so cache overlap is unknown (counted as none) and the pick \
             rests on load alone: {} has the lowest {}",
            pick.replica(position),
            explain(pick, position)
        ));
        pick.decide(position, Branch::Fallback, reason);
        return;
    }
    if silent > 0 {
        // Named only when some replicas are silent and others are not, so the common pick collects nothing.
        let silent: Vec<ReplicaId> = pick
            .healthy
            .iter()
            .filter_map(|&p| engine.slots[pick.slots[p] as usize].as_ref())
            .filter(|state| state.kv_events == 0)
            .map(|state| state.id)
            .collect();
        pick.notes.push(format!(
            "no KV events received from {}: their cached blocks are unknown and counted as none",
            name_list(&silent)
        ));
    }
    if params.temperature <= 0.0 {
        let position = cheapest;
        let reason = sentence(format_args!(
            "cost: {} has the lowest {}",
            pick.replica(position),
            explain(pick, position)
        ));
        pick.decide(position, Branch::Cost, reason);
        return;
    }
    // Softmax over costs normalised to [0, 1], as Dynamo samples: the temperature is scale-free.
    let costs: Vec<f64> = pick.healthy.iter().map(|&p| cost(pick, p)).collect();
    let lowest = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let highest = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let spread = if highest > lowest { highest - lowest } else { 1.0 };
    let weights: Vec<f64> =
        costs.iter().map(|c| (-(c - lowest) / spread / params.temperature).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut draw = rng.random::<f64>() * total;
    let mut chosen = pick.healthy[pick.healthy.len() - 1];
    for (index, weight) in weights.iter().enumerate() {
        pick.candidates[pick.healthy[index]].score = Some(weight / total);
    }
    for (index, weight) in weights.iter().enumerate() {
        if draw < *weight {
            chosen = pick.healthy[index];
            break;
        }
        draw -= weight;
    }
    let reason = sentence(format_args!(
        "sampled: {} drawn with probability {:.2} at temperature {} ({})",
        pick.replica(chosen),
        pick.candidates[chosen].score.unwrap_or(0.0),
        params.temperature,
        explain(pick, chosen)
    ));
    pick.decide(chosen, Branch::Sampled, reason);
}

pub(super) fn weighted(
    engine: &Engine,
    pick: &mut PickInProgress,
    params: &WeightedScorersParams,
    view: &RequestView,
    now_ms: u64,
) {
    let index = match params.prefix_source {
        PrefixSource::Routed => &engine.routed_index,
        PrefixSource::KvEvents => &engine.kv_indexes[Medium::Gpu.index()],
    };
    fill_matches(pick, index, view);
    if params.prefix_source == PrefixSource::Routed {
        peer_prompts::fill_peer_routed(engine, pick, view);
    }
    // Filters first: overloaded replicas (by their reported metrics, with this engine's requests sent
    // since) are not eligible.
    let mut eligible = Vec::with_capacity(pick.healthy.len());
    let mut unreported = Vec::new();
    let mut stale = Vec::new();
    let mut aged_out = Vec::new();
    // The reported figures, with this engine's requests sent since; where the fresh peer summaries show
    // more requests than those hold, the others are taken as queued (sent since the replica's last read).
    let figures_of = |pick: &PickInProgress, position: usize| -> Option<ReplicaMetrics> {
        let state = engine.slots[pick.slots[position] as usize].as_ref()?;
        let published = pick.published.get(position).copied();
        let mut metrics = match engine.seen_of(state, now_ms) {
            Some(metrics) => metrics,
            None if published.is_some() => {
                let running = u32::try_from(state.outstanding).unwrap_or(u32::MAX);
                ReplicaMetrics { queue_depth: 0, running, kv_usage: 0.0 }
            }
            None => return None,
        };
        let held = u64::from(metrics.queue_depth) + u64::from(metrics.running);
        let beyond = published.unwrap_or(0).saturating_sub(held);
        metrics.queue_depth = metrics.queue_depth.saturating_add(u32::try_from(beyond).unwrap_or(u32::MAX));
        Some(metrics)
    };
    for &position in &pick.healthy {
        let Some(state) = engine.slots[pick.slots[position] as usize].as_ref() else { continue };
        match figures_of(pick, position) {
            Some(metrics) => {
                if let Some((_, at_ms)) = state.metrics
                    && now_ms.saturating_sub(at_ms) > STALE_METRICS_MS
                {
                    stale.push(state.id);
                }
                if metrics.queue_depth > params.max_queue_depth {
                    pick.candidates[position].eligible = false;
                    pick.candidates[position].note = Some(format!(
                        "filtered: queue {} > max_queue_depth {}",
                        metrics.queue_depth, params.max_queue_depth
                    ));
                    continue;
                }
                if metrics.kv_usage > params.max_kv_usage {
                    pick.candidates[position].eligible = false;
                    pick.candidates[position].note = Some(format!(
                        "filtered: KV usage {:.2} > max_kv_usage {}",
                        metrics.kv_usage, params.max_kv_usage
                    ));
                    continue;
                }
            }
            None if engine.metrics_aged_out(state, now_ms) => aged_out.push(state.id),
            None => unreported.push(state.id),
        }
        eligible.push(position);
    }
    if !unreported.is_empty() {
        pick.notes.push(format!(
            "no metrics reported by {}: queue counted as 0, running as the router's outstanding count, KV usage as 0",
            name_list(&unreported)
        ));
    }
    if !aged_out.is_empty() {
        pick.notes.push(format!(
            "metrics of {} older than {} ms were ignored: queue counted as 0, running as the router's \
             outstanding count, KV usage as 0",
            name_list(&aged_out),
            engine.metrics_max_age_ms.unwrap_or(0)
        ));
    }
    if !stale.is_empty() {
        pick.notes.push(format!("metrics older than {STALE_METRICS_MS} ms from {}", name_list(&stale)));
    }
    let all_filtered = eligible.is_empty();
    if all_filtered {
        pick.notes.push(
            "every healthy replica was filtered as overloaded; scoring all healthy replicas".to_owned(),
        );
        eligible = pick.healthy.clone();
    }
    let figures: Vec<(f64, f64, f64)> = eligible
        .iter()
        .map(|&position| {
            let metrics = figures_of(pick, position);
            let queue = metrics.map_or(0.0, |m| f64::from(m.queue_depth));
            let running =
                metrics.map_or(pick.candidates[position].outstanding as f64, |m| f64::from(m.running));
            let kv_usage = metrics.map_or(0.0, |m| m.kv_usage.clamp(0.0, 1.0));
            (queue, running, kv_usage)
        })
        .collect();
    // Min-max normalisation: the least busy eligible replica scores 1, the busiest 0, all equal scores 1.
    let range = |value_of: fn(&(f64, f64, f64)) -> f64| {
        let lo = figures.iter().map(value_of).fold(f64::INFINITY, f64::min);
        let hi = figures.iter().map(value_of).fold(f64::NEG_INFINITY, f64::max);
        (lo, hi)
    };
    let (queue_range, running_range) = (range(|f| f.0), range(|f| f.1));
    let normalise = |value: f64, (lo, hi): (f64, f64)| if hi > lo { (hi - value) / (hi - lo) } else { 1.0 };
    let weight_sum =
        params.prefix_weight + params.kv_usage_weight + params.queue_weight + params.running_weight;
    let prompt_blocks = view.block_hashes.len();
    for (index, &position) in eligible.iter().enumerate() {
        let (queue, running, kv_usage) = figures[index];
        let score = (params.prefix_weight * share(matched(pick, position), prompt_blocks)
            + params.kv_usage_weight * (1.0 - kv_usage)
            + params.queue_weight * normalise(queue, queue_range)
            + params.running_weight * normalise(running, running_range))
            / weight_sum;
        pick.candidates[position].score = Some(score);
        pick.candidates[position].load = Some(running);
    }
    let best = argmin_by(&eligible, |p| -pick.candidates[p].score.unwrap_or(0.0));
    let reason = format!(
        "{}: {} scores {:.3} (prefix {} of {prompt_blocks} blocks x {}, KV usage x {}, queue x {}, running x {}), \
         the highest of {} {}replicas",
        if all_filtered { "fallback" } else { "score" },
        pick.replica(best),
        pick.candidates[best].score.unwrap_or(0.0),
        matched(pick, best),
        params.prefix_weight,
        params.kv_usage_weight,
        params.queue_weight,
        params.running_weight,
        eligible.len(),
        if all_filtered { "healthy (all overloaded) " } else { "eligible " },
    );
    pick.decide(best, if all_filtered { Branch::Fallback } else { Branch::Score }, reason);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_number_shortcut_prints_exactly_what_std_prints() {
        let values = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.3,
            0.5,
            1.5,
            2.5,
            -2.5,
            99.95,
            100.0,
            123_456.0,
            1e14,
            1e15,
            1e16,
            1e20,
            -1e20,
            4.0 / 3.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE,
        ];
        for value in values {
            assert_eq!(Num(value).to_string(), format!("{value}"), "{{}} of {value:?}");
            for precision in 0..4 {
                assert_eq!(
                    Fixed(value, precision).to_string(),
                    format!("{value:.precision$}"),
                    "{{:.{precision}}} of {value:?}"
                );
            }
        }
    }
}
