//! Which engine profile a what-if replays with: chosen from what the replicas' own metrics say of the
//! fleet (engine, served model, KV capacity and block size), or the operator's override.
//!
//! vLLM reports its cache in `vllm:cache_config_info` (labels `num_gpu_blocks`, `block_size`), SGLang its
//! pool in `sglang:max_total_num_tokens`; the model comes from the `model_name` label both put on their
//! series. The model picks the built-in cost profile (step and prefill costs); the KV capacity is the
//! fleet's own, since it decides the hit rate far more than any cost figure. The parsing is pure; only
//! [`read_fleet_facts`] does I/O (one bounded scrape per replica, concurrently).

use fleet_sim::engine::Profile;
use fleet_sim::engine::cost::{BUILTIN_PROFILES, DEFAULT_PROFILE};
use fleet_telemetry::ScrapeLimits;
use fleet_telemetry::exposition::Exposition;
use fleetdeck_api::{ApiError, WhatIfProfile};

/// What one replica's metrics say about its engine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineFacts {
    /// `vllm` or `sglang` (`None`: neither's names).
    pub engine: Option<String>,
    pub model: Option<String>,
    /// KV capacity in blocks of `block_tokens` (SGLang: tokens, with `block_tokens` 1).
    pub kv_blocks: Option<u32>,
    pub block_tokens: Option<u32>,
}

/// Reads the facts from one exposition.
pub fn facts_of(exposition: &Exposition) -> EngineFacts {
    let mut facts = EngineFacts::default();
    let model_of = |prefix: &str| {
        exposition
            .sample_names()
            .filter(|n| n.starts_with(prefix))
            .flat_map(|n| exposition.samples_named(n))
            .find_map(|s| s.label("model_name").map(str::to_owned))
    };
    if exposition.has_prefix("vllm:") {
        facts.engine = Some("vllm".to_owned());
        facts.model = model_of("vllm:");
        if let Some(info) = exposition.samples_named("vllm:cache_config_info").next() {
            facts.kv_blocks = info.label("num_gpu_blocks").and_then(|v| v.parse().ok());
            facts.block_tokens = info.label("block_size").and_then(|v| v.parse().ok());
        }
    } else if exposition.has_prefix("sglang:") {
        facts.engine = Some("sglang".to_owned());
        facts.model = model_of("sglang:");
        if let Some(total) = exposition.samples_named("sglang:max_total_num_tokens").next() {
            facts.kv_blocks = (total.value.is_finite() && total.value >= 1.0).then_some(total.value as u32);
            facts.block_tokens = Some(1);
        }
    }
    facts
}

/// Scrapes each replica once (bounded, concurrently) and reads its facts; a replica that fails is skipped.
pub async fn read_fleet_facts(
    http: &reqwest::Client,
    replicas: &[String],
    limits: ScrapeLimits,
) -> Vec<EngineFacts> {
    let reads = replicas.iter().take(64).map(|url| async move {
        let text = fleet_telemetry::scrape::fetch(http, &fleet_telemetry::scrape::metrics_url(url), limits)
            .await
            .ok()?;
        let exposition = fleet_telemetry::exposition::parse(&text).ok()?;
        Some(facts_of(&exposition))
    });
    futures_util::future::join_all(reads).await.into_iter().flatten().collect()
}

/// The profile a replay runs with: the cost model, the KV capacity and block size, and why.
#[derive(Debug, Clone)]
pub struct ChosenProfile {
    pub profile: Profile,
    /// KV capacity per replica in blocks of `block_tokens`.
    pub kv_blocks: u32,
    /// Engine block size (`None`: the trace's own).
    pub block_tokens: Option<u32>,
    pub shown: WhatIfProfile,
}

fn model_key(model: &str) -> String {
    model.rsplit('/').next().unwrap_or(model).to_ascii_lowercase()
}

/// Chooses the profile from the fleet's facts and the operator's overrides.
pub fn choose(
    facts: &[EngineFacts],
    profile_override: Option<&str>,
    kv_blocks_override: Option<u32>,
) -> Result<ChosenProfile, ApiError> {
    let available: Vec<String> = BUILTIN_PROFILES.iter().map(|(n, _)| (*n).to_owned()).collect();
    let builtin: Vec<Profile> = BUILTIN_PROFILES.iter().filter_map(|(n, _)| Profile::builtin(n)).collect();
    let engine = most_common(facts.iter().filter_map(|f| f.engine.clone()));
    let model = most_common(facts.iter().filter_map(|f| f.model.clone()));
    let mut reasons = Vec::new();
    let profile = match profile_override.map(str::trim).filter(|p| !p.is_empty()) {
        Some(name) => {
            reasons.push(format!("profile {name} chosen by the operator"));
            Profile::builtin(name).ok_or_else(|| {
                ApiError::new(
                    "bad_request",
                    format!(
                        "there is no built-in engine profile {name:?}; pick one of {}",
                        available.join(", ")
                    ),
                )
            })?
        }
        None => {
            let matched = model.as_deref().and_then(|m| {
                let key = model_key(m);
                // Several profiles may describe one model on different machines: the first listed wins.
                builtin.iter().find(|p| model_key(&p.model) == key)
            });
            match (matched, model.as_deref()) {
                (Some(p), Some(m)) => {
                    reasons.push(format!("the replicas serve {m}: profile {} matches that model", p.name));
                    p.clone()
                }
                (None, Some(m)) => {
                    reasons.push(format!(
                        "no built-in profile describes {m}; the costs of {DEFAULT_PROFILE} are assumed \
                         (override it if another is closer)"
                    ));
                    Profile::builtin(DEFAULT_PROFILE).expect("built in")
                }
                (_, None) => {
                    reasons.push(format!(
                        "no replica said its model; the costs of {DEFAULT_PROFILE} are assumed"
                    ));
                    Profile::builtin(DEFAULT_PROFILE).expect("built in")
                }
            }
        }
    };
    let reported_block = most_common(facts.iter().filter_map(|f| f.block_tokens));
    let reported_blocks = facts.iter().filter_map(|f| f.kv_blocks).min();
    let (kv_blocks, block_tokens) = match (kv_blocks_override, reported_blocks, reported_block) {
        (Some(blocks), _, block) => {
            if blocks == 0 {
                return Err(ApiError::new(
                    "bad_request",
                    "kv_blocks is 0; give a replica's KV capacity in blocks, at least 1",
                ));
            }
            let block = block.filter(|b| *b > 1).unwrap_or(profile.block_tokens);
            reasons.push(format!("KV capacity {blocks} blocks of {block} tokens chosen by the operator"));
            (blocks, Some(block))
        }
        (None, Some(blocks), Some(1)) => {
            // SGLang counts its pool in tokens: convert to the profile's block size.
            let block = profile.block_tokens;
            reasons.push(format!(
                "KV capacity from the replicas' sglang:max_total_num_tokens: {blocks} tokens = {} blocks of {block}",
                blocks / block
            ));
            ((blocks / block).max(1), Some(block))
        }
        (None, Some(blocks), block) => {
            let block = block.unwrap_or(profile.block_tokens);
            let spread = facts.iter().filter_map(|f| f.kv_blocks).max().unwrap_or(blocks);
            reasons.push(if spread != blocks {
                format!(
                    "KV capacity from vllm:cache_config_info: replicas report {blocks} to {spread} blocks of {block} \
                     tokens; the smallest is used"
                )
            } else {
                format!("KV capacity from vllm:cache_config_info: {blocks} blocks of {block} tokens per replica")
            });
            (blocks, Some(block))
        }
        (None, None, _) => {
            let block = profile.block_tokens;
            reasons.push(format!(
                "no replica reported its KV capacity; the profile's {} tokens are assumed",
                profile.kv_capacity_tokens
            ));
            (profile.capacity_blocks(block), Some(block))
        }
    };
    let shown = WhatIfProfile {
        name: profile.name.clone(),
        model: profile.model.clone(),
        engine,
        kv_blocks,
        block_tokens: block_tokens.unwrap_or(profile.block_tokens),
        reason: reasons.join("; "),
        overridden: profile_override.is_some_and(|p| !p.trim().is_empty()) || kv_blocks_override.is_some(),
        available,
    };
    Ok(ChosenProfile { profile, kv_blocks, block_tokens, shown })
}

fn most_common<T: Ord + Clone>(items: impl Iterator<Item = T>) -> Option<T> {
    let mut counts = std::collections::BTreeMap::<T, usize>::new();
    for item in items {
        *counts.entry(item).or_default() += 1;
    }
    counts.into_iter().max_by_key(|(_, n)| *n).map(|(item, _)| item)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vllm(model: &str, blocks: u32, block: u32) -> String {
        format!(
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"{model}\"}} 0\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"{block}\",num_gpu_blocks=\"{blocks}\"}} 1\n"
        )
    }

    fn facts(text: &str) -> EngineFacts {
        facts_of(&fleet_telemetry::exposition::parse(text).unwrap())
    }

    #[test]
    fn vllm_and_sglang_metrics_give_model_and_kv_capacity() {
        let v = facts(&vllm("meta-llama/Llama-3.1-8B-Instruct", 1200, 16));
        assert_eq!(
            v,
            EngineFacts {
                engine: Some("vllm".into()),
                model: Some("meta-llama/Llama-3.1-8B-Instruct".into()),
                kv_blocks: Some(1200),
                block_tokens: Some(16),
            }
        );
        let s = facts(
            "# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens{model_name=\"m\"} 32000\n",
        );
        assert_eq!(
            (s.engine.as_deref(), s.kv_blocks, s.block_tokens),
            (Some("sglang"), Some(32000), Some(1))
        );
        assert_eq!(facts("# TYPE up gauge\nup 1\n"), EngineFacts::default());
    }

    #[test]
    fn the_model_picks_the_profile_and_the_fleet_its_capacity_unless_overridden() {
        let fleet = [
            facts(&vllm("meta-llama/Llama-3.1-70B-Instruct", 900, 16)),
            facts(&vllm("meta-llama/Llama-3.1-70B-Instruct", 800, 16)),
        ];
        let chosen = choose(&fleet, None, None).unwrap();
        assert_eq!(chosen.profile.name, "llama-3.1-70b-8xh100");
        assert_eq!((chosen.kv_blocks, chosen.block_tokens), (800, Some(16)));
        assert!(chosen.shown.reason.contains("800 to 900"), "{}", chosen.shown.reason);
        assert!(!chosen.shown.overridden);

        let chosen = choose(&fleet, Some("llama-3.1-8b-a100"), Some(5000)).unwrap();
        assert_eq!((chosen.profile.name.as_str(), chosen.kv_blocks), ("llama-3.1-8b-a100", 5000));
        assert!(chosen.shown.overridden);
        assert_eq!(choose(&fleet, Some("gpt-5"), None).unwrap_err().code, "bad_request");

        // Nothing known: the default profile and its own capacity, said so.
        let chosen = choose(&[], None, None).unwrap();
        assert_eq!(chosen.profile.name, DEFAULT_PROFILE);
        assert_eq!(chosen.kv_blocks, chosen.profile.capacity_blocks(chosen.profile.block_tokens));
        assert!(chosen.shown.reason.contains("no replica"));

        // SGLang's token pool becomes blocks of the profile's size.
        let sglang = [facts(
            "# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 32000\n",
        )];
        let chosen = choose(&sglang, None, None).unwrap();
        assert_eq!((chosen.kv_blocks, chosen.block_tokens), (2000, Some(16)));
    }
}
