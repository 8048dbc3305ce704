//! The step cost model and the hardware/model profiles it is filled from.
//!
//! One engine step runs one forward pass over a batch of prefill chunks and decoding sequences. Its
//! duration is linear in what the pass has to read and compute:
//!
//! ```text
//! step = step_us                                   (weights read once + launch/scheduling overhead)
//!      + prefill_token_us      x prefill tokens    (GEMM FLOPs per token)
//!      + prefill_attn_us_per_ktok x sum over chunks of chunk x (start + chunk / 2) / 1000   (causal attention)
//!      + decode_seq_us         x decoding sequences
//!      + decode_ctx_us_per_ktok x context tokens of decoding sequences / 1000             (KV read)
//! ```
//!
//! The figures come from profiles (`crates/sim/profiles/*.yaml`), each figure with its source.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{EngineConfig, LoadFailurePolicy, TransferCost};

/// The profile `EngineConfig::default()` uses.
pub const DEFAULT_PROFILE: &str = "llama-3.1-8b-h100";

/// Built-in profiles: (name, YAML text).
pub const BUILTIN_PROFILES: [(&str, &str); 3] = [
    ("llama-3.1-8b-h100", include_str!("../../profiles/llama-3.1-8b-h100.yaml")),
    ("llama-3.1-70b-8xh100", include_str!("../../profiles/llama-3.1-70b-8xh100.yaml")),
    ("llama-3.1-8b-a100", include_str!("../../profiles/llama-3.1-8b-a100.yaml")),
];

/// Per-step cost figures, in microseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostProfile {
    /// Fixed time of any step.
    pub step_us: f64,
    /// Per prefill token.
    pub prefill_token_us: f64,
    /// Causal attention during prefill, per token per thousand tokens of context before it.
    pub prefill_attn_us_per_ktok: f64,
    /// Per decoding sequence in the batch.
    pub decode_seq_us: f64,
    /// Per thousand context tokens of decoding sequences (KV-cache read).
    pub decode_ctx_us_per_ktok: f64,
}

/// A figure that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid cost profile: {field} = {value}: {fix}")]
pub struct ProfileError {
    /// The field.
    pub field: &'static str,
    /// Its value.
    pub value: String,
    /// How to fix it.
    pub fix: String,
}

impl CostProfile {
    /// Every figure must be finite and non-negative, and a step must take some time.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let figures = [
            ("cost.step_us", self.step_us),
            ("cost.prefill_token_us", self.prefill_token_us),
            ("cost.prefill_attn_us_per_ktok", self.prefill_attn_us_per_ktok),
            ("cost.decode_seq_us", self.decode_seq_us),
            ("cost.decode_ctx_us_per_ktok", self.decode_ctx_us_per_ktok),
        ];
        for (field, value) in figures {
            if !value.is_finite() || value < 0.0 {
                return Err(ProfileError {
                    field,
                    value: value.to_string(),
                    fix: "use a finite number of microseconds >= 0".to_owned(),
                });
            }
        }
        if self.step_us <= 0.0 {
            return Err(ProfileError {
                field: "cost.step_us",
                value: self.step_us.to_string(),
                fix: "a step takes time: use a positive number of microseconds".to_owned(),
            });
        }
        Ok(())
    }

    /// Duration of a step, in microseconds (at least 1).
    ///
    /// `prefill_chunks` are `(start, tokens)`: a chunk of `tokens` prompt tokens after `start` already
    /// computed ones; `decode_seqs` sequences decode one token each over `decode_ctx_tokens` context tokens.
    pub fn step_time(&self, prefill_chunks: &[(u32, u32)], decode_seqs: u32, decode_ctx_tokens: u64) -> u64 {
        let mut prefill_tokens = 0.0;
        let mut attention = 0.0;
        for &(start, tokens) in prefill_chunks {
            let tokens = f64::from(tokens);
            prefill_tokens += tokens;
            attention += tokens * (f64::from(start) + tokens / 2.0) / 1000.0;
        }
        let micros = self.step_us
            + self.prefill_token_us * prefill_tokens
            + self.prefill_attn_us_per_ktok * attention
            + self.decode_seq_us * f64::from(decode_seqs)
            + self.decode_ctx_us_per_ktok * decode_ctx_tokens as f64 / 1000.0;
        (micros.round() as u64).max(1)
    }

    /// Total duration of `steps` consecutive pure-decode steps of `seqs` sequences whose context starts at
    /// `ctx_tokens` tokens and grows by `seqs` each step (each step rounded as [`Self::step_time`] rounds).
    pub fn decode_run_time(&self, seqs: u32, ctx_tokens: u64, steps: u64) -> u64 {
        // Closed form of the sum of rounded linear terms is awkward; rounding each step would need a loop.
        // Use the unrounded sum, rounded once: a run and the same steps one by one differ by < 1 us/step.
        let base = self.step_us + self.decode_seq_us * f64::from(seqs);
        let per_ctx = self.decode_ctx_us_per_ktok / 1000.0;
        let steps_f = steps as f64;
        let ctx_sum = steps_f * ctx_tokens as f64 + f64::from(seqs) * steps_f * (steps_f - 1.0) / 2.0;
        let micros = steps_f * base + per_ctx * ctx_sum;
        (micros.round() as u64).max(steps)
    }
}

/// A host whose cores every replica of a replay shares ([`Profile::shared_host`]).
///
/// A replica that computes alone runs at the profile's speed while its threads have a core each; when
/// `k` replicas compute at once they split the cores, each running at
/// `min(1, cores / (k x threads_per_replica)) ^ oversubscribed_exponent` of it. With the exponent at 1
/// that is processor sharing, as the kernel's scheduler gives busy threads equal shares. Above 1, busy
/// replicas lose more than their share, as CPU vLLM servers do on one host (`cargo xtask bench real
/// --engine vllm` measures it with the same burst on 1, 2 and 3 servers at once: with one compute thread
/// a server, 1.0x / 1.2-1.5x / 1.8-2.0x on two cores, exponents of 1.45-1.76, their engine-core and
/// API-server processes wanting the cores too; with torch's two threads a server, 2.3-4.4x and 4.7-7.5x,
/// an excess that went with one thread, or with two whose idle waits sleep, so most likely OpenMP threads
/// spinning at a barrier for a partner another server had descheduled). Requests' time in their API
/// servers is not in it: that is part of [`Profile::extra_latency_us`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedHost {
    /// Cores of the host.
    pub cores: f64,
    /// Cores one replica keeps busy computing alone: its compute threads (the vLLM bench gives its
    /// servers' OpenMP threads, one by default).
    pub threads_per_replica: f64,
    /// How much worse than a fair share oversubscribed cores are (1, the default: exactly a fair share).
    #[serde(default = "fair_share")]
    pub oversubscribed_exponent: f64,
}

fn fair_share() -> f64 {
    1.0
}

impl SharedHost {
    /// Share of the profile's speed each of `computing` replicas runs at.
    pub fn rate(&self, computing: usize) -> f64 {
        let demand = computing.max(1) as f64 * self.threads_per_replica;
        (self.cores / demand).min(1.0).powf(self.oversubscribed_exponent)
    }

    fn validate(&self) -> Result<(), ProfileError> {
        for (field, value) in
            [("shared_host.cores", self.cores), ("shared_host.threads_per_replica", self.threads_per_replica)]
        {
            if !value.is_finite() || value <= 0.0 {
                return Err(ProfileError {
                    field,
                    value: value.to_string(),
                    fix: "use a positive number (of cores, or threads)".to_owned(),
                });
            }
        }
        let exponent = self.oversubscribed_exponent;
        if !exponent.is_finite() || !(1.0..=8.0).contains(&exponent) {
            return Err(ProfileError {
                field: "shared_host.oversubscribed_exponent",
                value: exponent.to_string(),
                fix: "use 1 (cores shared fairly) up to 8 (oversubscribed threads lose far more than their share)"
                    .to_owned(),
            });
        }
        Ok(())
    }
}

/// The largest draw [`Profile::extra_latency_us`] takes: ten minutes (a larger figure is a unit mistake).
pub const MAX_EXTRA_LATENCY_US: u64 = 600_000_000;

/// A named preset: engine limits, KV capacity and step cost for one model on one machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Short name (`llama-3.1-8b-h100`).
    pub name: String,
    /// What it models.
    pub description: String,
    /// Served model name.
    pub model: String,
    /// KV capacity in tokens (converted to blocks of the engine's block size).
    pub kv_capacity_tokens: u64,
    /// Default block size.
    pub block_tokens: u32,
    /// vLLM's `max_num_seqs`.
    pub max_num_seqs: u32,
    /// vLLM's `max_num_batched_tokens`.
    pub max_num_batched_tokens: u32,
    /// Step cost figures.
    pub cost: CostProfile,
    /// Latency a request sees beyond the engine model, in microseconds, as an empirical sample: its
    /// server's API frontend (templating, tokenizing), the network and, where servers share a host's
    /// cores, the wait for one. A replay adds one draw to each request's TTFT and end-to-end time; it does
    /// not delay the engine's work. Empty (the default, and the built-in profiles'): none.
    /// `cargo xtask bench real --engine vllm` fits it from a live row, request by request (the client's
    /// TTFT less the model's for the same request, placed on the same server).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_latency_us: Vec<u64>,
    /// Replicas that share one host's cores (CPU servers on one machine): a replay then runs each
    /// computing replica at the share of the cores it gets. `None` (the default, and the built-in
    /// profiles'): each replica has its own accelerator, and one's work never slows another's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_host: Option<SharedHost>,
    /// Where each figure comes from (free text per figure; the YAML comments carry the detail).
    #[serde(default)]
    pub sources: Vec<String>,
}

impl Profile {
    /// Parses and validates a profile document (YAML or JSON).
    pub fn parse(text: &str) -> Result<Self, ProfileError> {
        let profile: Profile = serde_norway::from_str(text).map_err(|e| ProfileError {
            field: "document",
            value: e.to_string(),
            fix: "a profile is YAML with name, description, model, kv_capacity_tokens, block_tokens, \
                  max_num_seqs, max_num_batched_tokens and cost (see crates/sim/profiles/)"
                .to_owned(),
        })?;
        profile.cost.validate()?;
        let positive = [
            ("kv_capacity_tokens", profile.kv_capacity_tokens),
            ("block_tokens", u64::from(profile.block_tokens)),
            ("max_num_seqs", u64::from(profile.max_num_seqs)),
            ("max_num_batched_tokens", u64::from(profile.max_num_batched_tokens)),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(ProfileError { field, value: "0".into(), fix: "use a positive number".into() });
            }
        }
        if let Some(&far) = profile.extra_latency_us.iter().find(|&&us| us > MAX_EXTRA_LATENCY_US) {
            return Err(ProfileError {
                field: "extra_latency_us",
                value: far.to_string(),
                fix: format!(
                    "each draw is microseconds added to one request, at most {MAX_EXTRA_LATENCY_US} (10 minutes)"
                ),
            });
        }
        if let Some(host) = &profile.shared_host {
            host.validate()?;
        }
        Ok(profile)
    }

    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Option<Self> {
        let (_, text) = BUILTIN_PROFILES.iter().find(|(n, _)| *n == name)?;
        Self::parse(text).ok()
    }

    /// A built-in profile by name, or a profile file by path.
    pub fn load(name_or_path: &str) -> Result<Self, ProfileError> {
        if let Some(profile) = Self::builtin(name_or_path) {
            return Ok(profile);
        }
        let path = Path::new(name_or_path);
        if !path.exists() {
            let names: Vec<&str> = BUILTIN_PROFILES.iter().map(|(n, _)| *n).collect();
            return Err(ProfileError {
                field: "profile",
                value: name_or_path.to_owned(),
                fix: format!("name a built-in profile ({}) or an existing YAML file", names.join(", ")),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|e| ProfileError {
            field: "profile",
            value: name_or_path.to_owned(),
            fix: format!("cannot read it: {e}"),
        })?;
        Self::parse(&text)
    }

    /// KV capacity in blocks of `block_tokens` tokens (at least 1).
    pub fn capacity_blocks(&self, block_tokens: u32) -> u32 {
        let blocks = self.kv_capacity_tokens / u64::from(block_tokens.max(1));
        u32::try_from(blocks).unwrap_or(u32::MAX).max(1)
    }

    /// The engine configuration this profile describes (prefix caching on, no per-token or KV events).
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            block_tokens: self.block_tokens,
            num_gpu_blocks: self.capacity_blocks(self.block_tokens),
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            enable_prefix_caching: true,
            token_events: false,
            kv_events: false,
            cost: self.cost.clone(),
            kv_transfer: TransferCost::default(),
            kv_load_failure_policy: LoadFailurePolicy::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_profile_parses() {
        for (name, text) in BUILTIN_PROFILES {
            let profile = Profile::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(profile.name, name);
            assert!(!profile.sources.is_empty(), "{name} cites its sources");
            profile.engine_config().validate().expect("valid engine config");
        }
    }

    #[test]
    fn decode_slows_with_batch_and_context_and_a_run_adds_up_its_steps() {
        let cost = Profile::builtin(DEFAULT_PROFILE).expect("builtin").cost;
        assert!(cost.step_time(&[], 32, 32_000) > cost.step_time(&[], 1, 1_000));
        assert!(cost.step_time(&[], 8, 80_000) > cost.step_time(&[], 8, 8_000));
        let one_by_one: u64 = (0..10).map(|i| cost.step_time(&[], 4, 4_000 + 4 * i)).sum();
        let run = cost.decode_run_time(4, 4_000, 10);
        assert!(one_by_one.abs_diff(run) <= 10, "{one_by_one} vs {run}");
    }

    #[test]
    fn prefill_costs_per_token_and_attention_grows_with_context() {
        let cost = Profile::builtin(DEFAULT_PROFILE).expect("builtin").cost;
        assert!(cost.step_time(&[(0, 2048)], 0, 0) > cost.step_time(&[(0, 1024)], 0, 0));
        assert!(cost.step_time(&[(64_000, 1024)], 0, 0) > cost.step_time(&[(0, 1024)], 0, 0));
    }

    #[test]
    fn a_profile_takes_an_extra_latency_sample_and_names_a_draw_out_of_range() {
        let text = BUILTIN_PROFILES[0].1;
        assert!(Profile::parse(text).expect("builtin").extra_latency_us.is_empty());
        let with = format!("{text}\nextra_latency_us: [1500, 2500, 90000]\n");
        assert_eq!(Profile::parse(&with).expect("parses").extra_latency_us, vec![1500, 2500, 90_000]);
        let far = format!("{text}\nextra_latency_us: [1500, {}]\n", MAX_EXTRA_LATENCY_US + 1);
        let err = Profile::parse(&far).expect_err("over ten minutes");
        assert_eq!(err.field, "extra_latency_us");
        assert!(err.to_string().contains("microseconds"), "{err}");
    }

    #[test]
    fn a_shared_host_splits_its_cores_among_the_replicas_computing_and_names_a_bad_figure() {
        let text = BUILTIN_PROFILES[0].1;
        assert_eq!(Profile::parse(text).expect("builtin").shared_host, None);
        let with = format!("{text}\nshared_host: {{cores: 2, threads_per_replica: 2}}\n");
        let host = Profile::parse(&with).expect("parses").shared_host.expect("a shared host");
        assert_eq!([host.rate(0), host.rate(1), host.rate(2), host.rate(4)], [1.0, 1.0, 0.5, 0.25]);
        let roomy = SharedHost { cores: 8.0, threads_per_replica: 2.0, oversubscribed_exponent: 1.0 };
        assert_eq!([roomy.rate(4), roomy.rate(8)], [1.0, 0.5]);
        let harsh = SharedHost { oversubscribed_exponent: 2.0, ..roomy };
        assert_eq!([harsh.rate(4), harsh.rate(8), harsh.rate(16)], [1.0, 0.25, 0.0625]);
        let odd = format!(
            "{text}\nshared_host: {{cores: 2, threads_per_replica: 2, oversubscribed_exponent: 0.5}}\n"
        );
        assert_eq!(
            Profile::parse(&odd).expect_err("gains from sharing").field,
            "shared_host.oversubscribed_exponent"
        );
        let bad = format!("{text}\nshared_host: {{cores: 0, threads_per_replica: 2}}\n");
        let err = Profile::parse(&bad).expect_err("no cores");
        assert_eq!(err.field, "shared_host.cores");
        assert!(err.to_string().contains("positive"), "{err}");
    }

    #[test]
    fn bad_profiles_are_named() {
        let err = Profile::load("no-such-profile").expect_err("unknown");
        assert!(err.fix.contains("llama-3.1-8b-h100"), "{err}");
        let bad = CostProfile {
            step_us: f64::NAN,
            prefill_token_us: 1.0,
            prefill_attn_us_per_ktok: 0.0,
            decode_seq_us: 0.0,
            decode_ctx_us_per_ktok: 0.0,
        };
        assert_eq!(bad.validate().expect_err("nan").field, "cost.step_us");
    }
}
