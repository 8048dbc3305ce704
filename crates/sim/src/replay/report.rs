//! The replay report: the figures an operator compares policies by, as JSON or as a table.

use fleet_base::quantile::nearest_rank;
use serde::{Deserialize, Serialize};

use super::Outcome;
use crate::engine::EngineModel;

/// One replica's share of the replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicaReport {
    /// Replica index.
    pub replica: u32,
    /// Requests routed to it.
    pub requests: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Of those, served from its prefix cache.
    pub cached_tokens: u64,
    /// cached / prompt tokens.
    pub hit_rate: f64,
    /// Prompt tokens it computed (uncached prefill, recomputation after preemption included).
    pub prefill_tokens: u64,
    /// Tokens it generated.
    pub output_tokens: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// 95th percentile TTFT of its requests, in seconds.
    pub ttft_p95_s: f64,
}

/// One request of the replay, in arrival order (`fleet-sim replay --requests-out`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestReport {
    /// Its index in the trace (arrival order).
    pub index: u64,
    /// The replica it went to (the decode replica in a P/D replay).
    pub replica: u32,
    /// Its prompt tokens.
    pub prompt_tokens: u32,
    /// Of those, served from the replica's prefix cache.
    pub cached_tokens: u32,
    /// Time to its first token in seconds, the profile's extra latency included (`None`: never started).
    pub ttft_s: Option<f64>,
    /// The engine's side, as vLLM's `request_queue_time`, `request_prefill_time` and
    /// `request_decode_time` count it: seconds from arrival to first scheduled, from there to the first
    /// token, and from the first token to the last (`None` where it never got that far).
    pub queue_s: Option<f64>,
    /// See `queue_s`.
    pub prefill_s: Option<f64>,
    /// See `queue_s`.
    pub decode_s: Option<f64>,
}

/// The replay report. Its JSON has exactly these keys at top level.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// Requests replayed.
    pub requests: u64,
    /// Cached prompt tokens / prompt tokens, over the whole fleet.
    pub hit_rate: f64,
    /// Time to first token percentiles, in seconds (nearest rank).
    pub ttft_p50_s: f64,
    /// 95th percentile.
    pub ttft_p95_s: f64,
    /// 99th percentile.
    pub ttft_p99_s: f64,
    /// Mean time per output token after the first, over requests with at least two output tokens.
    pub tpot_mean_s: f64,
    /// Generated tokens per second from the first arrival to the last completion.
    pub throughput_tok_s: f64,
    /// Max over mean of prefill tokens computed per replica (1 = perfectly even).
    pub imbalance: f64,
    /// Hit rate of one LRU cache with the fleet's total capacity on the same trace.
    pub pooled_bound_hit_rate: f64,
    /// TTFT p95 with the pooled cache's hits and no queueing ([`super::pooled::reference`]): what is left
    /// when placement has nothing more to win.
    #[serde(default)]
    pub unqueued_ttft_p95_s: f64,
    /// Per replica, in index order (the decode replicas in a P/D replay).
    pub per_replica: Vec<ReplicaReport>,
    /// A P/D replay's split decisions and legs (absent otherwise, and from the JSON then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pd: Option<super::PdReport>,
    /// Time outside the engine model added to every TTFT above, measured from the recording
    /// ([`super::unmodelled_overhead_s`], `fleet-sim replay --add-recorded-overhead`); absent when none was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_overhead_s: Option<f64>,
    /// Every request, in arrival order; not in the JSON (a long trace would bury the figures), written by
    /// `--requests-out`.
    #[serde(skip)]
    pub per_request: Vec<RequestReport>,
}

/// The report's TTFT quantile of sorted values: nearest rank, the definition the canary judges live TTFT by,
/// so a prediction and a canary reading compare like for like (0 for none).
fn ttft_quantile(sorted: &[f64], q: f64) -> f64 {
    nearest_rank(sorted, q).unwrap_or(0.0)
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

pub(super) fn build(
    outcomes: &[Outcome],
    engines: &[EngineModel],
    pooled: super::pooled::PooledReference,
) -> ReplayReport {
    let seconds = |us: u64| us as f64 / 1e6;
    let mut ttfts: Vec<f64> = Vec::with_capacity(outcomes.len());
    let mut per_replica_ttft: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
    let (mut prompt, mut cached, mut output) = (0u64, 0u64, 0u64);
    let (mut tpot_sum, mut tpot_n) = (0.0, 0u64);
    let mut per: Vec<ReplicaReport> = (0..engines.len())
        .map(|r| ReplicaReport {
            replica: r as u32,
            requests: 0,
            prompt_tokens: 0,
            cached_tokens: 0,
            hit_rate: 0.0,
            prefill_tokens: engines[r].stats().computed_prefill_tokens,
            output_tokens: 0,
            preemptions: engines[r].stats().preemptions,
            ttft_p95_s: 0.0,
        })
        .collect();
    let start = outcomes.iter().map(|o| o.arrival).min().unwrap_or(0);
    let end = outcomes.iter().filter_map(|o| o.finished).max().unwrap_or(start);
    for outcome in outcomes {
        let replica = &mut per[outcome.replica as usize];
        replica.requests += 1;
        replica.prompt_tokens += u64::from(outcome.prompt_tokens);
        replica.cached_tokens += u64::from(outcome.cached_tokens);
        replica.output_tokens += u64::from(outcome.output_tokens);
        prompt += u64::from(outcome.prompt_tokens);
        cached += u64::from(outcome.cached_tokens);
        output += u64::from(outcome.output_tokens);
        if let Some(first) = outcome.first_token {
            let ttft = seconds(first - outcome.arrival);
            ttfts.push(ttft);
            per_replica_ttft[outcome.replica as usize].push(ttft);
            if let Some(done) = outcome.finished
                && outcome.output_tokens >= 2
            {
                tpot_sum += seconds(done - first) / f64::from(outcome.output_tokens - 1);
                tpot_n += 1;
            }
        }
    }
    ttfts.sort_by(f64::total_cmp);
    for (replica, mut samples) in per.iter_mut().zip(per_replica_ttft) {
        samples.sort_by(f64::total_cmp);
        replica.ttft_p95_s = ttft_quantile(&samples, 0.95);
        replica.hit_rate = ratio(replica.cached_tokens, replica.prompt_tokens);
    }
    let prefill: Vec<u64> = per.iter().map(|r| r.prefill_tokens).collect();
    let mean = prefill.iter().sum::<u64>() as f64 / prefill.len().max(1) as f64;
    let imbalance = if mean > 0.0 { *prefill.iter().max().unwrap_or(&0) as f64 / mean } else { 1.0 };
    let span = seconds(end - start);
    ReplayReport {
        requests: outcomes.len() as u64,
        hit_rate: ratio(cached, prompt),
        ttft_p50_s: ttft_quantile(&ttfts, 0.50),
        ttft_p95_s: ttft_quantile(&ttfts, 0.95),
        ttft_p99_s: ttft_quantile(&ttfts, 0.99),
        tpot_mean_s: if tpot_n == 0 { 0.0 } else { tpot_sum / tpot_n as f64 },
        throughput_tok_s: if span > 0.0 { output as f64 / span } else { 0.0 },
        imbalance,
        pooled_bound_hit_rate: pooled.hit_rate,
        unqueued_ttft_p95_s: pooled.unqueued_ttft_p95_s,
        per_replica: per,
        pd: None,
        ttft_overhead_s: None,
        per_request: outcomes
            .iter()
            .enumerate()
            .map(|(index, outcome)| RequestReport {
                index: index as u64,
                replica: outcome.replica,
                prompt_tokens: outcome.prompt_tokens,
                cached_tokens: outcome.cached_tokens,
                ttft_s: outcome.first_token.map(|first| seconds(first - outcome.arrival)),
                queue_s: outcome.scheduled.map(|at| seconds(at - outcome.arrival)),
                prefill_s: outcome
                    .scheduled
                    .zip(outcome.first_token)
                    .map(|(at, first)| seconds(first.saturating_sub(outcome.extra_us).saturating_sub(at))),
                decode_s: outcome
                    .first_token
                    .zip(outcome.finished)
                    .map(|(first, last)| seconds(last - first)),
            })
            .collect(),
    }
}

/// A human-readable report.
pub fn format_report(report: &ReplayReport) -> String {
    let mut text = format!(
        "requests {}\nhit rate {:.3} (pooled bound {:.3}, {:.0}% of it)\nTTFT p50 {:.3} s  p95 {:.3} s  p99 {:.3} s \
         (p95 with the pooled cache and no queueing {:.3} s)\n\
         TPOT mean {:.4} s\nthroughput {:.0} tok/s\nimbalance {:.2} (max / mean prefill tokens)\n\n",
        report.requests,
        report.hit_rate,
        report.pooled_bound_hit_rate,
        if report.pooled_bound_hit_rate > 0.0 {
            100.0 * report.hit_rate / report.pooled_bound_hit_rate
        } else {
            0.0
        },
        report.ttft_p50_s,
        report.ttft_p95_s,
        report.ttft_p99_s,
        report.unqueued_ttft_p95_s,
        report.tpot_mean_s,
        report.throughput_tok_s,
        report.imbalance,
    );
    if let Some(overhead) = report.ttft_overhead_s {
        text.push_str(&format!(
            "(every TTFT includes {:.1} ms outside the engine model, measured from the recording)\n\n",
            overhead * 1e3
        ));
    }
    if let Some(pd) = &report.pd {
        text.push_str(&format_pd(pd));
        text.push('\n');
    }
    text.push_str("replica  requests  hit_rate  prefill_tokens  preemptions  ttft_p95_s\n");
    for r in &report.per_replica {
        text.push_str(&format!(
            "{:>7}  {:>8}  {:>8.3}  {:>14}  {:>11}  {:>10.3}\n",
            r.replica, r.requests, r.hit_rate, r.prefill_tokens, r.preemptions, r.ttft_p95_s
        ));
    }
    text
}

/// A P/D replay's figures in two lines.
fn format_pd(pd: &super::PdReport) -> String {
    let decisions: Vec<String> = pd.decisions.iter().map(|(reason, n)| format!("{reason} {n}")).collect();
    format!(
        "P/D: {} prefill replicas, split {:.1}% ({})\nprefill leg mean {:.3} s, KV transfer mean {:.4} s, prefill pool computed {} tokens\n",
        pd.prefill_replicas,
        pd.split_share * 100.0,
        decisions.join(", "),
        pd.prefill_leg_mean_s,
        pd.transfer_mean_s,
        pd.prefill_pool_tokens
    )
}

/// Several policies' reports side by side, one row each.
pub fn format_comparison(rows: &[(String, ReplayReport)]) -> String {
    let mut text = format!(
        "{:<20} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9}\n",
        "policy",
        "hit",
        "bound",
        "of_bound",
        "ttft_p50",
        "ttft_p95",
        "ttft_p99",
        "tpot",
        "tok/s",
        "imbalance"
    );
    for (name, r) in rows {
        let of_bound = if r.pooled_bound_hit_rate > 0.0 { r.hit_rate / r.pooled_bound_hit_rate } else { 0.0 };
        text.push_str(&format!(
            "{:<20} {:>8.3} {:>8.3} {:>8.3} {:>9.3} {:>9.3} {:>9.3} {:>9.4} {:>10.0} {:>9.2}\n",
            name,
            r.hit_rate,
            r.pooled_bound_hit_rate,
            of_bound,
            r.ttft_p50_s,
            r.ttft_p95_s,
            r.ttft_p99_s,
            r.tpot_mean_s,
            r.throughput_tok_s,
            r.imbalance
        ));
    }
    if let Some((_, first)) = rows.first() {
        text.push_str(&format!(
            "{:<20} {:>8.3} {:>8} {:>8} {:>9} {:>9.3}    (the pooled cache's hits, no queueing: what placement works toward)\n",
            "pooled_unqueued", first.pooled_bound_hit_rate, "", "", "", first.unqueued_ttft_p95_s
        ));
    }
    if rows.iter().any(|(_, r)| r.pd.is_some()) {
        text.push_str(&format!("\n{:<20} {:>8} {:>10} {:>11}\n", "policy", "split", "leg_mean", "xfer_mean"));
        for (name, r) in rows {
            if let Some(pd) = &r.pd {
                text.push_str(&format!(
                    "{:<20} {:>7.1}% {:>10.3} {:>11.4}\n",
                    name,
                    pd.split_share * 100.0,
                    pd.prefill_leg_mean_s,
                    pd.transfer_mean_s
                ));
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(ttft_quantile(&values, 0.50), 50.0);
        assert_eq!(ttft_quantile(&values, 0.95), 95.0);
        assert_eq!(ttft_quantile(&values, 0.99), 99.0);
        assert_eq!(ttft_quantile(&[3.0], 0.99), 3.0);
        assert_eq!(ttft_quantile(&[], 0.50), 0.0);
    }
}
