//! A seeded workload generator that writes Mooncake-format traces.
//!
//! The shapes a cache-aware router has to get right, and that the Mooncake sample trace lacks:
//! - tenants whose shared system prompts have Zipf popularity, the most popular ones also the longest
//!   ("huge and hot": a few tenants dominate traffic with prompts of tens of thousands of tokens);
//! - multi-turn sessions: a follow-up extends its session's whole previous context (previous prompt,
//!   the answer, and a new user turn), so its prefix is the previous request;
//! - shared RAG documents (Zipf popularity) placed after the system prompt;
//! - Poisson arrivals, optionally bursty (an on/off modulated rate).
//!
//! Block ids are assigned from one counter, one per `block_tokens` tokens of content, so equal ids at
//! the same position mean equal prefixes as the Mooncake format requires. Every request also ends in a
//! fresh partial block (its own question tail), which no other request shares.

use std::str::FromStr;

use fleet_trace::TraceRecord;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Arrival process (`{kind: poisson}` or `{kind: bursty, factor, on_share, mean_burst_s}` in a config file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arrivals {
    /// Exponential gaps at the mean rate.
    Poisson,
    /// On/off modulated Poisson: during bursts the rate is `factor` times the off rate, with bursts
    /// taking `on_share` of the time on average and lasting `mean_burst_s` seconds; the mean rate stays
    /// `rate_rps`.
    Bursty {
        /// Burst rate over quiet rate.
        factor: f64,
        /// Fraction of time in bursts.
        on_share: f64,
        /// Mean burst length, seconds.
        mean_burst_s: f64,
    },
}

/// Workload shape. `Default` is a mixed chat/RAG workload of 12,000 requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GenConfig {
    /// RNG seed: the same seed and config give the same trace.
    pub seed: u64,
    /// Requests to generate.
    pub requests: usize,
    /// Mean arrival rate, requests per second.
    pub rate_rps: f64,
    /// Arrival process.
    pub arrivals: Arrivals,
    /// Tokens per hash id (Mooncake: 512).
    pub block_tokens: u32,
    /// Tenants (each with its own system prompt).
    pub tenants: usize,
    /// Zipf exponent of tenant popularity (tenant i has weight 1 / (i+1)^s).
    pub tenant_zipf: f64,
    /// Skew: the share of new sessions (and so, as follow-ups stay in their session, of requests) that
    /// belong to the hot tenant (tenant 0, the longest system prompt); the rest follow the Zipf draw over
    /// the other tenants. `None` leaves tenant 0 to the Zipf draw alone.
    pub hot_tenant_share: Option<f64>,
    /// System prompt length of the most popular tenant, in blocks; tenant i gets
    /// `max(min_system_blocks, hot_system_blocks / (i+1))`.
    pub hot_system_blocks: u32,
    /// Shortest system prompt, in blocks.
    pub min_system_blocks: u32,
    /// Shared RAG documents.
    pub documents: usize,
    /// Length of a document, in blocks.
    pub document_blocks: u32,
    /// Share of new sessions that start with a document.
    pub document_share: f64,
    /// Share of requests that continue an open session.
    pub follow_up_share: f64,
    /// Turns after which a session closes.
    pub max_turns: u32,
    /// Sessions kept open at most (the oldest closes first).
    pub max_open_sessions: usize,
    /// User turn length range, in tokens.
    pub user_tokens: (u32, u32),
    /// Output length range, in tokens.
    pub output_tokens: (u32, u32),
}

impl Default for GenConfig {
    fn default() -> Self {
        Self {
            seed: 7,
            requests: 12_000,
            rate_rps: 12.0,
            arrivals: Arrivals::Poisson,
            block_tokens: fleet_trace::MOONCAKE_BLOCK_TOKENS,
            tenants: 40,
            tenant_zipf: 1.1,
            hot_tenant_share: None,
            hot_system_blocks: 48,
            min_system_blocks: 2,
            documents: 200,
            document_blocks: 12,
            document_share: 0.4,
            follow_up_share: 0.5,
            max_turns: 8,
            max_open_sessions: 400,
            user_tokens: (64, 1500),
            output_tokens: (32, 600),
        }
    }
}

/// A generator setting that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid workload setting `{field}`: {message}")]
pub struct GenError {
    /// The setting.
    pub field: &'static str,
    /// What is wrong and the fix.
    pub message: String,
}

impl GenConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), GenError> {
        let fail = |field, message: &str| Err(GenError { field, message: message.to_owned() });
        if !(self.rate_rps.is_finite() && self.rate_rps > 0.0) {
            return fail("rate_rps", "use a positive request rate");
        }
        if self.block_tokens == 0 {
            return fail("block_tokens", "use a positive block size (Mooncake uses 512)");
        }
        if self.tenants == 0 {
            return fail("tenants", "at least one tenant");
        }
        if self.min_system_blocks == 0 || self.hot_system_blocks < self.min_system_blocks {
            return fail("hot_system_blocks", "need 1 <= min_system_blocks <= hot_system_blocks");
        }
        for (field, share) in
            [("document_share", self.document_share), ("follow_up_share", self.follow_up_share)]
        {
            if !(0.0..=1.0).contains(&share) {
                return fail(field, "a share is between 0 and 1");
            }
        }
        if let Some(share) = self.hot_tenant_share {
            if !(0.0..=1.0).contains(&share) {
                return fail(
                    "hot_tenant_share",
                    "a share is between 0 and 1 (0.5: half the traffic is the hot tenant's)",
                );
            }
            if self.tenants < 2 && share < 1.0 {
                return fail(
                    "hot_tenant_share",
                    "below 1 it needs at least 2 tenants (the others take the rest)",
                );
            }
        }
        if self.user_tokens.0 == 0 || self.user_tokens.0 > self.user_tokens.1 {
            return fail("user_tokens", "use a range 1 <= low <= high");
        }
        if self.output_tokens.0 == 0 || self.output_tokens.0 > self.output_tokens.1 {
            return fail("output_tokens", "use a range 1 <= low <= high");
        }
        if let Arrivals::Bursty { factor, on_share, mean_burst_s } = self.arrivals
            && !(factor >= 1.0 && on_share > 0.0 && on_share < 1.0 && mean_burst_s > 0.0)
        {
            return fail("arrivals", "bursty needs factor >= 1, 0 < on_share < 1 and mean_burst_s > 0");
        }
        Ok(())
    }
}

impl FromStr for GenConfig {
    type Err = GenError;

    /// YAML or JSON with any subset of the fields, validated.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let config: GenConfig = serde_norway::from_str(text).map_err(|e| GenError {
            field: "document",
            message: format!("{e}; write YAML with GenConfig fields"),
        })?;
        config.validate()?;
        Ok(config)
    }
}

struct Session {
    /// Full blocks of the context so far.
    context: Vec<u64>,
    turns: u32,
}

/// Draws from a Zipf-like distribution over `weights` (cumulative, precomputed).
fn draw(cumulative: &[f64], rng: &mut StdRng) -> usize {
    let total = *cumulative.last().unwrap_or(&1.0);
    let x = rng.random::<f64>() * total;
    cumulative.partition_point(|&c| c <= x).min(cumulative.len() - 1)
}

fn zipf_cumulative(n: usize, s: f64) -> Vec<f64> {
    let mut sum = 0.0;
    (0..n)
        .map(|i| {
            sum += 1.0 / ((i + 1) as f64).powf(s);
            sum
        })
        .collect()
}

/// Generates the trace (records in arrival order, timestamps in ms from 0).
pub fn generate(config: &GenConfig) -> Result<Vec<TraceRecord>, GenError> {
    config.validate()?;
    let mut rng = StdRng::seed_from_u64(config.seed);
    let block = config.block_tokens;
    let mut next_id = 0u64;
    let mut fresh = |n: u32| -> Vec<u64> {
        let ids = (next_id..next_id + u64::from(n)).collect();
        next_id += u64::from(n);
        ids
    };
    let systems: Vec<Vec<u64>> = (0..config.tenants)
        .map(|i| fresh((config.hot_system_blocks / (i as u32 + 1)).max(config.min_system_blocks)))
        .collect();
    let tenants = zipf_cumulative(config.tenants, config.tenant_zipf);
    // With a hot share, the others are drawn by Zipf among themselves (tenant 1 the most popular of them).
    let others = zipf_cumulative(config.tenants.saturating_sub(1).max(1), config.tenant_zipf);
    let documents: Vec<Vec<u64>> = (0..config.documents).map(|_| fresh(config.document_blocks)).collect();
    let popular_docs = zipf_cumulative(config.documents.max(1), 1.0);
    let mut sessions: Vec<Session> = Vec::new();
    let mut records = Vec::with_capacity(config.requests);
    let mut clock_s = 0.0f64;
    // Bursty arrivals: current phase and when it ends.
    let mut in_burst = false;
    let mut phase_ends_s = 0.0f64;
    for _ in 0..config.requests {
        // Arrival.
        let rate = match config.arrivals {
            Arrivals::Poisson => config.rate_rps,
            Arrivals::Bursty { factor, on_share, mean_burst_s } => {
                while clock_s >= phase_ends_s {
                    in_burst = !in_burst;
                    let mean =
                        if in_burst { mean_burst_s } else { mean_burst_s * (1.0 - on_share) / on_share };
                    phase_ends_s += -mean * (1.0 - rng.random::<f64>()).ln();
                }
                // Mean rate = off x (on_share x factor + 1 - on_share).
                let off = config.rate_rps / (on_share * factor + 1.0 - on_share);
                if in_burst { off * factor } else { off }
            }
        };
        clock_s += -(1.0 - rng.random::<f64>()).ln() / rate;
        // Context: a follow-up or a new session.
        let follow_up = !sessions.is_empty() && rng.random::<f64>() < config.follow_up_share;
        let user = rng.random_range(config.user_tokens.0..=config.user_tokens.1);
        let output = rng.random_range(config.output_tokens.0..=config.output_tokens.1);
        let index = if follow_up {
            rng.random_range(0..sessions.len())
        } else {
            // The hot share draws only when set, so traces without it stay what they were.
            let tenant = match config.hot_tenant_share {
                Some(share) if rng.random::<f64>() < share => 0,
                Some(_) => 1 + draw(&others, &mut rng),
                None => draw(&tenants, &mut rng),
            };
            let mut context = systems[tenant].clone();
            if !documents.is_empty() && rng.random::<f64>() < config.document_share {
                context.extend_from_slice(&documents[draw(&popular_docs, &mut rng)]);
            }
            if sessions.len() >= config.max_open_sessions {
                sessions.remove(0);
            }
            sessions.push(Session { context, turns: 0 });
            sessions.len() - 1
        };
        // The prompt: the context, the new user turn in full blocks, then a fresh partial tail.
        let session = &mut sessions[index];
        let user_full = user / block;
        let tail = user % block;
        let mut hash_ids = session.context.clone();
        hash_ids.extend(fresh(user_full));
        let mut input_length = hash_ids.len() as u32 * block + tail;
        if tail > 0 {
            hash_ids.extend(fresh(1));
        } else {
            input_length = input_length.max(1);
        }
        records.push(TraceRecord::mooncake(
            (clock_s * 1000.0) as u64,
            input_length,
            output,
            hash_ids.clone(),
        ));
        // The session's next context: this prompt and the answer, in full blocks (the partial tail and
        // the answer are re-cut into new blocks, as their token boundaries move).
        session.turns += 1;
        let carried = (tail + output) / block;
        hash_ids.truncate(hash_ids.len() - usize::from(tail > 0));
        hash_ids.extend(fresh(carried));
        session.context = hash_ids;
        if session.turns >= config.max_turns {
            sessions.swap_remove(index);
        }
    }
    Ok(records)
}

/// Writes records as JSON Lines (Mooncake fields only).
pub fn write_trace(records: &[TraceRecord], writer: &mut impl std::io::Write) -> std::io::Result<()> {
    for record in records {
        fleet_trace::write_record(writer, record)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_trace_and_follow_ups_extend_their_context() {
        let config = GenConfig { requests: 500, ..GenConfig::default() };
        let a = generate(&config).expect("valid");
        assert_eq!(a, generate(&config).expect("valid"));
        assert_ne!(a, generate(&GenConfig { seed: 8, ..config.clone() }).expect("valid"));
        assert!(a.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
        for record in &a {
            record.validate().expect("valid record");
        }
        // Some request's full blocks are a strict prefix of a later request's (a follow-up).
        let extends = a.iter().enumerate().any(|(i, r)| {
            let full = (r.input_length / 512) as usize;
            full > 4
                && a[i + 1..]
                    .iter()
                    .any(|later| later.hash_ids.len() > full && later.hash_ids[..full] == r.hash_ids[..full])
        });
        assert!(extends);
    }

    #[test]
    fn bursty_arrivals_keep_the_mean_rate() {
        let config = GenConfig {
            requests: 4000,
            rate_rps: 10.0,
            arrivals: Arrivals::Bursty { factor: 8.0, on_share: 0.2, mean_burst_s: 5.0 },
            ..GenConfig::default()
        };
        let trace = generate(&config).expect("valid");
        let span_s = trace.last().expect("some").timestamp as f64 / 1000.0;
        let rate = trace.len() as f64 / span_s;
        assert!((6.0..16.0).contains(&rate), "mean rate {rate}");
        assert!(GenConfig { tenants: 0, ..GenConfig::default() }.validate().is_err());
    }

    /// Requests whose prompt starts with the hot tenant's system prompt (ids 0.. of its length).
    fn hot_share_of(trace: &[TraceRecord], config: &GenConfig) -> f64 {
        let hot: Vec<u64> = (0..u64::from(config.hot_system_blocks)).collect();
        let hits = trace.iter().filter(|r| r.hash_ids.starts_with(&hot)).count();
        hits as f64 / trace.len() as f64
    }

    #[test]
    fn hot_tenant_share_is_met_and_seeded() {
        for share in [0.2, 0.5, 0.8] {
            let config = GenConfig { requests: 4000, hot_tenant_share: Some(share), ..GenConfig::default() };
            let trace = generate(&config).expect("valid");
            assert_eq!(trace, generate(&config).expect("valid"), "same seed, same trace");
            let measured = hot_share_of(&trace, &config);
            assert!((measured - share).abs() < 0.05, "hot share {share}: measured {measured}");
        }
        // Without the field the Zipf draw alone decides, as before (tenant 0 near 1/H(40, 1.1) ~ 0.25).
        let plain = GenConfig { requests: 4000, ..GenConfig::default() };
        assert!(hot_share_of(&generate(&plain).expect("valid"), &plain) < 0.4);
    }

    #[test]
    fn skew_and_burst_fields_are_validated_by_name() {
        let field = |config: GenConfig| config.validate().expect_err("invalid").field;
        assert_eq!(
            field(GenConfig { hot_tenant_share: Some(1.5), ..GenConfig::default() }),
            "hot_tenant_share"
        );
        assert_eq!(
            field(GenConfig { hot_tenant_share: Some(-0.1), ..GenConfig::default() }),
            "hot_tenant_share"
        );
        assert_eq!(
            field(GenConfig { hot_tenant_share: Some(0.5), tenants: 1, ..GenConfig::default() }),
            "hot_tenant_share"
        );
        assert!(
            GenConfig { hot_tenant_share: Some(1.0), tenants: 1, ..GenConfig::default() }.validate().is_ok()
        );
        let bursty = |factor, on_share, mean_burst_s| GenConfig {
            arrivals: Arrivals::Bursty { factor, on_share, mean_burst_s },
            ..GenConfig::default()
        };
        assert_eq!(field(bursty(0.5, 0.2, 5.0)), "arrivals");
        assert_eq!(field(bursty(4.0, 1.0, 5.0)), "arrivals");
        assert_eq!(field(bursty(4.0, 0.2, 0.0)), "arrivals");
        let parsed = "hot_tenant_share: 2".parse::<GenConfig>().expect_err("out of range");
        assert_eq!(parsed.field, "hot_tenant_share");
    }
}
