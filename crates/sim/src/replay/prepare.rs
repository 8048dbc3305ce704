//! Turning trace records into engine requests: arrival times and block hashes at the engine's block size.
//!
//! A trace names each `block_tokens`-token block of a prompt by an id (Mooncake `hash_ids`, or a recorded
//! trace's chained hashes). Mooncake ids are chained ([`fleet_policy::chain_block_ids`]) so a hash names the
//! whole prefix, as equal ids at the same position mean equal prefixes; a recorded trace's hashes (`chained`)
//! are used as they are, so a policy keyed on them (consistent_hash) places each prefix where the live router
//! did. Only full blocks are cacheable (`input_length / block_tokens` of them); a trailing partial block's id
//! is ignored.
//!
//! The engine may use another block size than the trace, as long as one divides the other:
//! - smaller (e.g. 16-token engine blocks under 512-token trace blocks): each trace block is split into
//!   sub-blocks whose hashes mix the trace block's chained hash with the sub-block's index;
//! - larger (a multiple of the trace's): an engine block is named by the chained hash of its last trace block.

use std::borrow::Cow;
use std::sync::Arc;

use fleet_trace::Trace;

use super::ReplayError;
use crate::engine::Micros;

/// One request ready to replay.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedRequest {
    /// Arrival, microseconds after the first request (speedup applied).
    pub arrival_us: Micros,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Tokens to generate.
    pub output_tokens: u32,
    /// Chained hashes of the full engine blocks of the prompt.
    pub block_hashes: Arc<[u64]>,
    /// Session key, when the trace has one.
    pub session: Option<u64>,
    /// The router that recorded it, numbered by first appearance in the trace (`None`: the trace does not
    /// say). A replay with several routers sends it through that one.
    pub router: Option<u32>,
}

/// A trace prepared for one engine block size (shared by every policy of a comparison).
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedTrace {
    /// Requests in arrival order.
    pub requests: Vec<PreparedRequest>,
    /// Engine block size.
    pub block_tokens: u32,
    /// The trace's own block size.
    pub trace_block_tokens: u32,
    /// Routers the records name (`TraceRecord::router`), in order of first appearance; empty when none do.
    pub routers: Vec<String>,
}

impl PreparedTrace {
    /// The same requests with each arrival moved by up to `max_us` either way (uniform, from `seed`; none
    /// before the start), in their new order. A recording times arrivals to the millisecond, and a live
    /// router sees them a little apart from that: where a policy's choices hinge on which request came
    /// first or whether a replica was still busy, this shows how much the outcome moves with it.
    pub fn with_arrival_jitter(&self, max_us: Micros, seed: u64) -> PreparedTrace {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut requests = self.requests.clone();
        for request in &mut requests {
            let shift = rng.random_range(0..=2 * max_us);
            request.arrival_us = (request.arrival_us + shift).saturating_sub(max_us);
        }
        requests.sort_by_key(|request| request.arrival_us);
        PreparedTrace { requests, ..self.clone() }
    }
}

/// splitmix64 finaliser, to spread sub-block hashes.
fn mix(mut value: u64) -> u64 {
    value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    value ^ (value >> 31)
}

/// Prepares `trace` for engines of `block_tokens`-token blocks (`None`: the trace's own size), with
/// arrivals divided by `speedup`.
pub fn prepare(trace: &Trace, block_tokens: Option<u32>, speedup: f64) -> Result<PreparedTrace, ReplayError> {
    if trace.is_empty() {
        return Err(ReplayError::EmptyTrace);
    }
    if !(speedup.is_finite() && speedup > 0.0) {
        return Err(ReplayError::Config {
            field: "speedup",
            message: format!("{speedup} is not a positive number; use e.g. 1 (real time) or 4 (4x faster)"),
        });
    }
    let trace_block = trace.block_tokens();
    let engine_block = block_tokens.unwrap_or(trace_block);
    if engine_block == 0
        || (!trace_block.is_multiple_of(engine_block) && !engine_block.is_multiple_of(trace_block))
    {
        return Err(ReplayError::Config {
            field: "block_tokens",
            message: format!(
                "{engine_block} must divide the trace's block size {trace_block} or be a multiple of it; \
                 try {trace_block} or 16"
            ),
        });
    }
    let first = trace.records[0].timestamp;
    let mut routers: Vec<String> = Vec::new();
    let requests = trace
        .records
        .iter()
        .map(|record| {
            let chained: Cow<'_, [u64]> = if record.chained {
                Cow::Borrowed(&record.hash_ids)
            } else {
                Cow::Owned(fleet_policy::chain_block_ids(&record.hash_ids))
            };
            let full_engine_blocks = (record.input_length / engine_block) as usize;
            let mut hashes = Vec::with_capacity(full_engine_blocks.min(chained.len() * 32));
            if engine_block <= trace_block {
                let per = (trace_block / engine_block) as usize;
                'outer: for &parent in chained.iter() {
                    for k in 0..per {
                        if hashes.len() == full_engine_blocks {
                            break 'outer;
                        }
                        hashes.push(if per == 1 { parent } else { mix(parent ^ mix(k as u64 + 1)) });
                    }
                }
            } else {
                let group = (engine_block / trace_block) as usize;
                for e in 0..full_engine_blocks {
                    let Some(&last) = chained.get((e + 1) * group - 1) else { break };
                    hashes.push(last);
                }
            }
            let offset_ms = record.timestamp.saturating_sub(first) as f64 / speedup;
            let router = record.router.as_ref().map(|name| {
                let index = routers.iter().position(|known| known == name).unwrap_or_else(|| {
                    routers.push(name.clone());
                    routers.len() - 1
                });
                index as u32
            });
            PreparedRequest {
                arrival_us: (offset_ms * 1000.0).round() as Micros,
                prompt_tokens: record.input_length,
                output_tokens: record.output_length,
                block_hashes: Arc::from(hashes),
                session: record.session,
                router,
            }
        })
        .collect();
    Ok(PreparedTrace { requests, block_tokens: engine_block, trace_block_tokens: trace_block, routers })
}

#[cfg(test)]
mod tests {
    use fleet_trace::TraceRecord;

    use super::*;

    fn trace(records: Vec<TraceRecord>) -> Trace {
        Trace::from_records(records).expect("valid")
    }

    #[test]
    fn only_full_blocks_are_hashed_and_shared_prefixes_share_hashes() {
        let t = trace(vec![
            TraceRecord::mooncake(0, 1100, 5, vec![1, 2, 3]),
            TraceRecord::mooncake(10, 1024, 5, vec![1, 2]),
            TraceRecord::mooncake(20, 1024, 5, vec![7, 2]),
        ]);
        let p = prepare(&t, None, 1.0).expect("prepared");
        assert_eq!(p.block_tokens, 512);
        assert_eq!(p.requests[0].block_hashes.len(), 2, "1100 tokens = 2 full blocks");
        assert_eq!(p.requests[0].block_hashes[..], p.requests[1].block_hashes[..]);
        assert_ne!(p.requests[2].block_hashes[1], p.requests[1].block_hashes[1], "same id, other prefix");
        assert_eq!(p.requests[1].arrival_us, 10_000);
    }

    #[test]
    fn a_recorded_traces_chained_hashes_are_the_live_routers_keys() {
        // fleet-router records the hashes its policy saw; chaining them again would hand consistent_hash
        // other ring keys than the live router used, so the replay would place prefixes elsewhere.
        let ids = vec![11, 22, 33];
        let recorded = TraceRecord {
            block_tokens: Some(16),
            chained: true,
            ..TraceRecord::mooncake(0, 48, 1, ids.clone())
        };
        let mooncake = TraceRecord { block_tokens: Some(16), ..TraceRecord::mooncake(1, 48, 1, ids.clone()) };
        let p = prepare(&trace(vec![recorded, mooncake]), None, 1.0).expect("prepared");
        assert_eq!(p.requests[0].block_hashes[..], ids[..]);
        assert_eq!(p.requests[1].block_hashes[..], fleet_policy::chain_block_ids(&ids)[..]);
    }

    #[test]
    fn jitter_moves_arrivals_within_its_bound_and_keeps_them_in_order() {
        let records = (0..200).map(|i| TraceRecord::mooncake(i * 3, 512, 1, vec![i])).collect();
        let p = prepare(&trace(records), None, 1.0).expect("prepared");
        let jittered = p.with_arrival_jitter(1000, 7);
        assert_eq!(jittered.requests.len(), p.requests.len());
        assert!(jittered.requests.windows(2).all(|w| w[0].arrival_us <= w[1].arrival_us));
        let moved = jittered.requests.iter().filter(|r| {
            let original =
                p.requests.iter().find(|o| o.block_hashes == r.block_hashes).expect("same request");
            assert!(r.arrival_us.abs_diff(original.arrival_us) <= 1000, "{r:?} vs {original:?}");
            r.arrival_us != original.arrival_us
        });
        assert!(moved.count() > 150, "most arrivals move");
        assert_eq!(p.with_arrival_jitter(1000, 7), jittered, "the same seed moves them alike");
        assert_eq!(p.with_arrival_jitter(0, 7), p, "no jitter, no change");
    }

    #[test]
    fn routers_are_numbered_by_first_appearance() {
        let by = |ts: u64, router: Option<&str>| TraceRecord {
            router: router.map(str::to_owned),
            ..TraceRecord::mooncake(ts, 512, 1, vec![ts])
        };
        let t = trace(vec![
            by(0, Some("http://b")),
            by(1, Some("http://a")),
            by(2, None),
            by(3, Some("http://b")),
        ]);
        let p = prepare(&t, None, 1.0).expect("prepared");
        assert_eq!(p.routers, ["http://b", "http://a"]);
        let routers: Vec<Option<u32>> = p.requests.iter().map(|r| r.router).collect();
        assert_eq!(routers, [Some(0), Some(1), None, Some(0)]);
    }

    #[test]
    fn smaller_and_larger_engine_blocks_keep_prefix_identity() {
        let t = trace(vec![
            TraceRecord::mooncake(0, 1024, 1, vec![1, 2]),
            TraceRecord::mooncake(0, 1024, 1, vec![1, 3]),
        ]);
        let small = prepare(&t, Some(16), 2.0).expect("prepared");
        assert_eq!(small.requests[0].block_hashes.len(), 64);
        assert_eq!(small.requests[0].block_hashes[..32], small.requests[1].block_hashes[..32]);
        assert_ne!(small.requests[0].block_hashes[32], small.requests[1].block_hashes[32]);
        let large = prepare(&t, Some(1024), 1.0).expect("prepared");
        assert_eq!(large.requests[0].block_hashes.len(), 1);
        assert_ne!(large.requests[0].block_hashes[0], large.requests[1].block_hashes[0]);
        assert!(prepare(&t, Some(300), 1.0).is_err());
        assert!(prepare(&t, None, 0.0).is_err());
    }
}
