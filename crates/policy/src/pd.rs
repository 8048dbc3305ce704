//! Prefill/decode disaggregation: the spec's `pd` thresholds and the pure per-request decision to split a
//! request into a remote prefill leg and a decode leg, or to serve it locally at the decode replica.
//!
//! The decision runs after the decode pick (so it knows how much of the prompt the chosen decode replica
//! already holds) and before any prefill pick. It splits only when the transfer is worth its cost, as
//! vLLM's router (`pd_uncached_token_threshold`), llm-d's prefix-based decider and Dynamo's conditional
//! disaggregation do: the prompt is long, the part the decode replica lacks is long, and the prefill pool
//! has room. Each threshold is a field of the spec's `pd` section, so it changes live with the policy.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::spec::{ParamDoc, ParamKind, SpecError};

/// A replica's part in prefill/decode disaggregation, as fleet-router's replica specs and fleet-sim's
/// `--role` name it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Prefill and decode: whole requests, and decode legs (no disaggregation; the default).
    #[default]
    Both,
    /// Computes prompts and holds their KV for a decode replica (vLLM `kv_producer`, SGLang
    /// `--disaggregation-mode prefill`); never picked for a whole request.
    Prefill,
    /// Pulls prompts' KV and decodes (vLLM `kv_consumer`, SGLang `--disaggregation-mode decode`), and serves
    /// whole requests when the router prefills locally.
    Decode,
}

impl Role {
    /// Its name in a replica spec, a flag and `/admin/state`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Both => "both",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is none of `prefill`, `decode` and `both`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a replica role; use prefill, decode or both (the default)")]
pub struct UnknownRole(pub String);

impl std::str::FromStr for Role {
    type Err = UnknownRole;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "both" => Ok(Role::Both),
            "prefill" => Ok(Role::Prefill),
            "decode" => Ok(Role::Decode),
            other => Err(UnknownRole(other.to_owned())),
        }
    }
}

/// The `pd` section of a policy spec, resolved (every field at its default when omitted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PdParams {
    /// Split only when the prompt tokens the chosen decode replica does not hold reach this.
    pub min_uncached_tokens: u32,
    /// Split only when the prompt has at least this many tokens.
    pub min_prompt_tokens: u32,
    /// Serve locally when the least loaded healthy prefill replica has more than this many requests
    /// outstanding (the prefill pool is busy).
    pub max_prefill_queue: u32,
    /// How the decode leg finds the prefill leg's KV.
    pub kv_handoff: KvHandoff,
}

/// How the decode replica finds the KV the prefill leg computed: what the engines' KV connector needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvHandoff {
    /// The prefill answer's `kv_transfer_params` ride on the decode leg, which pulls with them (vLLM's NIXL
    /// and Mooncake connectors, which answer with the blocks' address).
    #[default]
    Params,
    /// The decode replica's connector finds the KV by the prompt itself in a store both sides share (vLLM's
    /// `ExampleConnector`, LMCache with a shared backend): the prefill answer carries no parameters and the
    /// decode leg is the client's request as it came.
    Prompt,
}

impl KvHandoff {
    /// Its name in the spec.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Params => "params",
            Self::Prompt => "prompt",
        }
    }
}

/// Default of [`PdParams::min_uncached_tokens`].
pub const DEFAULT_MIN_UNCACHED_TOKENS: u32 = 512;
/// Default of [`PdParams::min_prompt_tokens`].
pub const DEFAULT_MIN_PROMPT_TOKENS: u32 = 256;
/// Default of [`PdParams::max_prefill_queue`].
pub const DEFAULT_MAX_PREFILL_QUEUE: u32 = 16;

impl Default for PdParams {
    fn default() -> Self {
        Self {
            min_uncached_tokens: DEFAULT_MIN_UNCACHED_TOKENS,
            min_prompt_tokens: DEFAULT_MIN_PROMPT_TOKENS,
            max_prefill_queue: DEFAULT_MAX_PREFILL_QUEUE,
            kv_handoff: KvHandoff::Params,
        }
    }
}

/// The fields of the spec's `pd` section with type, range, default and meaning.
pub fn pd_param_docs() -> Vec<ParamDoc> {
    let integer = |name, max: i64, default: u32, meaning| ParamDoc {
        name,
        kind: ParamKind::Integer { min: 0, max },
        default: Value::from(default),
        meaning,
    };
    vec![
        integer(
            "min_uncached_tokens",
            100_000_000,
            DEFAULT_MIN_UNCACHED_TOKENS,
            "P/D mode: split a request into a remote prefill and a decode leg only when the prompt tokens the \
             chosen decode replica does not hold (by the router's prefix index) reach this; shorter remainders \
             are prefilled locally, where a transfer would cost more than it saves.",
        ),
        integer(
            "min_prompt_tokens",
            100_000_000,
            DEFAULT_MIN_PROMPT_TOKENS,
            "P/D mode: split only prompts of at least this many tokens (estimated as bytes / 4 for raw text).",
        ),
        integer(
            "max_prefill_queue",
            1_000_000,
            DEFAULT_MAX_PREFILL_QUEUE,
            "P/D mode: serve locally when the least loaded healthy prefill replica has more than this many \
             requests outstanding (the prefill pool is busy).",
        ),
        ParamDoc {
            name: "kv_handoff",
            kind: ParamKind::Choice { options: vec!["params", "prompt"] },
            default: Value::from("params"),
            meaning: "P/D mode: how the decode replica finds the prefill leg's KV. params: the prefill answer's \
                      kv_transfer_params ride on the decode leg (vLLM's NIXL and Mooncake connectors). prompt: \
                      the connector finds it by the prompt in a store both sides share (vLLM's ExampleConnector, \
                      LMCache with a shared backend), so no parameters are needed.",
        },
    ]
}

impl PdParams {
    /// Reads a spec's `pd` section: names, types and ranges checked, omitted fields at their defaults.
    pub fn from_section(section: &Map<String, Value>) -> Result<Self, SpecError> {
        let docs = pd_param_docs();
        for (name, value) in section {
            let Some(doc) = docs.iter().find(|doc| doc.name == name) else {
                return Err(SpecError::UnknownField {
                    field: format!("pd.{name}"),
                    policy: "the pd section".to_owned(),
                    allowed: docs.iter().map(|doc| doc.name.to_owned()).collect(),
                    suggestion: crate::spec::closest(name, docs.iter().map(|doc| doc.name)),
                });
            };
            doc.check_field(&format!("pd.{name}"), value)?;
        }
        let read = |name: &str, default: u32| {
            section.get(name).and_then(Value::as_f64).map_or(default, |number| number as u32)
        };
        Ok(Self {
            min_uncached_tokens: read("min_uncached_tokens", DEFAULT_MIN_UNCACHED_TOKENS),
            min_prompt_tokens: read("min_prompt_tokens", DEFAULT_MIN_PROMPT_TOKENS),
            max_prefill_queue: read("max_prefill_queue", DEFAULT_MAX_PREFILL_QUEUE),
            kv_handoff: match section.get("kv_handoff").and_then(Value::as_str) {
                Some("prompt") => KvHandoff::Prompt,
                _ => KvHandoff::Params,
            },
        })
    }
}

/// What the decision looks at, for one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PdInputs {
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens the chosen decode replica holds already (its prefix-index match).
    pub cached_at_decode: u32,
    /// Healthy prefill replicas in the request's model group.
    pub prefill_replicas: usize,
    /// Requests outstanding on the least loaded healthy prefill replica.
    pub prefill_pool_load: u64,
}

/// Why a request was split or served locally; `/metrics` counts decisions by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PdReason {
    /// Split: long prompt, long uncached part, room in the prefill pool.
    Split,
    /// Local: no healthy prefill replica.
    NoPrefillReplica,
    /// Local: the prompt is shorter than `min_prompt_tokens`.
    ShortPrompt,
    /// Local: the decode replica lacks fewer than `min_uncached_tokens` of the prompt.
    CachedAtDecode,
    /// Local: the least loaded prefill replica is over `max_prefill_queue`.
    PrefillPoolBusy,
    /// Local after a split failed: the prefill leg or the transfer did not succeed (set by the caller).
    TransferFailed,
}

impl PdReason {
    /// Every reason, in `/metrics` order.
    pub const ALL: [Self; 6] = [
        Self::Split,
        Self::NoPrefillReplica,
        Self::ShortPrompt,
        Self::CachedAtDecode,
        Self::PrefillPoolBusy,
        Self::TransferFailed,
    ];

    /// Its label in `/metrics` and the decision log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Split => "split",
            Self::NoPrefillReplica => "no_prefill_replica",
            Self::ShortPrompt => "short_prompt",
            Self::CachedAtDecode => "cached_at_decode",
            Self::PrefillPoolBusy => "prefill_pool_busy",
            Self::TransferFailed => "transfer_failed",
        }
    }
}

/// The outcome: split or local, why, in one sentence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PdDecision {
    /// Whether the request is split into a remote prefill leg and a decode leg.
    pub split: bool,
    /// Why.
    pub reason: PdReason,
    /// Prompt tokens the decode replica does not hold.
    pub uncached_tokens: u32,
    /// One sentence saying why, with the figures and thresholds compared.
    pub explanation: String,
}

/// The spec the prefill pool's engine runs for the policy `spec`: the policy itself when it is cache-aware
/// (`cache_aware_approx`, `kv_precise`, `weighted_scorers`), else `cache_aware_approx` with the policy's
/// hashing, so a prefill pick always follows the prefix (the prefill replica that holds most of the prompt).
/// fleet-router's prefill pool and fleet-sim's P/D replay both run it, so the what-if picks as the router does.
pub fn prefill_spec(spec: &crate::PolicySpec) -> crate::PolicySpec {
    match spec.policy.as_str() {
        "cache_aware_approx" | "kv_precise" | "weighted_scorers" => spec.clone(),
        _ => {
            let hashing = spec.resolve().map(|policy| policy.hashing()).unwrap_or_default();
            crate::PolicySpec::named("cache_aware_approx")
                .with("block_tokens", hashing.block_tokens)
                .with("chunk_bytes", hashing.chunk_bytes)
        }
    }
}

/// Decides whether to split one request. Pure: the same params and inputs give the same decision.
///
/// The rules, first match wins: no healthy prefill replica → local; prompt under `min_prompt_tokens` →
/// local; uncached part under `min_uncached_tokens` → local; least loaded prefill replica over
/// `max_prefill_queue` → local; else split.
pub fn decide_pd(params: &PdParams, inputs: &PdInputs) -> PdDecision {
    let uncached = inputs.prompt_tokens.saturating_sub(inputs.cached_at_decode);
    let (split, reason, explanation) = if inputs.prefill_replicas == 0 {
        (
            false,
            PdReason::NoPrefillReplica,
            "no healthy prefill replica: prefilled at the decode replica".to_owned(),
        )
    } else if inputs.prompt_tokens < params.min_prompt_tokens {
        (
            false,
            PdReason::ShortPrompt,
            format!(
                "the prompt has {} tokens, under min_prompt_tokens {}: prefilled at the decode replica",
                inputs.prompt_tokens, params.min_prompt_tokens
            ),
        )
    } else if uncached < params.min_uncached_tokens {
        (
            false,
            PdReason::CachedAtDecode,
            format!(
                "the decode replica lacks {uncached} of {} prompt tokens, under min_uncached_tokens {}: \
                 prefilled there",
                inputs.prompt_tokens, params.min_uncached_tokens
            ),
        )
    } else if inputs.prefill_pool_load > u64::from(params.max_prefill_queue) {
        (
            false,
            PdReason::PrefillPoolBusy,
            format!(
                "the least loaded prefill replica has {} requests outstanding, over max_prefill_queue {}: \
                 prefilled at the decode replica",
                inputs.prefill_pool_load, params.max_prefill_queue
            ),
        )
    } else {
        (
            true,
            PdReason::Split,
            format!(
                "{uncached} of {} prompt tokens are not cached at the decode replica (min_uncached_tokens {}) \
                 and the prefill pool has room ({} outstanding, max_prefill_queue {}): prefilled remotely",
                inputs.prompt_tokens,
                params.min_uncached_tokens,
                inputs.prefill_pool_load,
                params.max_prefill_queue
            ),
        )
    };
    PdDecision { split, reason, uncached_tokens: uncached, explanation }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::{Role, UnknownRole};

    #[test]
    fn roles_parse_and_print_by_name_and_a_typo_names_the_choices() {
        for role in [Role::Both, Role::Prefill, Role::Decode] {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
            assert_eq!(role.to_string(), role.as_str());
        }
        let typo = "prefil".parse::<Role>().unwrap_err();
        assert_eq!(typo, UnknownRole("prefil".into()));
        assert_eq!(
            typo.to_string(),
            "\"prefil\" is not a replica role; use prefill, decode or both (the default)"
        );
    }

    use super::*;

    fn params(min_uncached: u32, min_prompt: u32, max_queue: u32) -> PdParams {
        PdParams {
            min_uncached_tokens: min_uncached,
            min_prompt_tokens: min_prompt,
            max_prefill_queue: max_queue,
            kv_handoff: KvHandoff::Params,
        }
    }

    #[test]
    fn each_rule_decides_in_order() {
        // (prompt, cached at decode, prefill replicas, pool load, expected reason)
        let cases = [
            (4096, 0, 0, 0, PdReason::NoPrefillReplica),
            (100, 0, 2, 0, PdReason::ShortPrompt),
            (100, 0, 0, 0, PdReason::NoPrefillReplica),
            (4096, 4000, 2, 0, PdReason::CachedAtDecode),
            (4096, 3584, 2, 0, PdReason::Split),
            (4096, 3585, 2, 0, PdReason::CachedAtDecode),
            (4096, 0, 2, 16, PdReason::Split),
            (4096, 0, 2, 17, PdReason::PrefillPoolBusy),
            (4096, 4096, 2, 17, PdReason::CachedAtDecode),
            (256, 0, 1, 0, PdReason::CachedAtDecode),
            (255, 0, 1, 0, PdReason::ShortPrompt),
            (600, 10_000, 1, 0, PdReason::CachedAtDecode),
        ];
        let defaults = PdParams::default();
        for (prompt, cached, replicas, load, reason) in cases {
            let inputs = PdInputs {
                prompt_tokens: prompt,
                cached_at_decode: cached,
                prefill_replicas: replicas,
                prefill_pool_load: load,
            };
            let decision = decide_pd(&defaults, &inputs);
            assert_eq!(decision.reason, reason, "{inputs:?}: {}", decision.explanation);
            assert_eq!(decision.split, reason == PdReason::Split);
            assert_eq!(decision.uncached_tokens, prompt.saturating_sub(cached));
        }
        let zero = decide_pd(&params(0, 0, 0), &PdInputs { prefill_replicas: 1, ..PdInputs::default() });
        assert_eq!(zero.reason, PdReason::Split, "zero thresholds split everything: {}", zero.explanation);
    }

    #[test]
    fn the_section_is_read_with_defaults_and_bad_fields_are_named() {
        let empty = PdParams::from_section(&Map::new()).unwrap();
        assert_eq!(empty, PdParams::default());
        let section = json!({"min_uncached_tokens": 64, "max_prefill_queue": 0});
        let read = PdParams::from_section(section.as_object().unwrap()).unwrap();
        assert_eq!(read, params(64, DEFAULT_MIN_PROMPT_TOKENS, 0));
        let prompt = PdParams::from_section(json!({"kv_handoff": "prompt"}).as_object().unwrap()).unwrap();
        assert_eq!(prompt.kv_handoff, KvHandoff::Prompt);
        assert_eq!(empty.kv_handoff.as_str(), "params");
        for (bad, needle) in [
            (json!({"min_uncached_token": 1}), "did you mean min_uncached_tokens"),
            (json!({"min_prompt_tokens": -1}), "pd.min_prompt_tokens = -1 is out of range"),
            (json!({"max_prefill_queue": "many"}), "pd.max_prefill_queue = \"many\" has the wrong type"),
            (json!({"min_uncached_tokens": 1.5}), "pd.min_uncached_tokens = 1.5 has the wrong type"),
            (json!({"kv_handoff": "nixl"}), "pd.kv_handoff = \"nixl\" is out of range"),
        ] {
            let error = PdParams::from_section(bad.as_object().unwrap()).unwrap_err().to_string();
            assert!(error.contains(needle), "{bad}: {error}");
        }
    }

    proptest! {
        #[test]
        fn split_exactly_when_every_threshold_passes_and_raising_one_never_splits_more(
            prompt in 0u32..10_000,
            cached in 0u32..10_000,
            replicas in 0usize..4,
            load in 0u64..40,
            min_uncached in 0u32..5_000,
            min_prompt in 0u32..5_000,
            max_queue in 0u32..32,
            raise in 0u32..1_000,
        ) {
            let inputs = PdInputs { prompt_tokens: prompt, cached_at_decode: cached, prefill_replicas: replicas, prefill_pool_load: load };
            let decision = decide_pd(&params(min_uncached, min_prompt, max_queue), &inputs);
            let expected = replicas > 0
                && prompt >= min_prompt
                && prompt.saturating_sub(cached) >= min_uncached
                && load <= u64::from(max_queue);
            prop_assert_eq!(decision.split, expected);
            prop_assert_eq!(decision.reason == PdReason::Split, expected);
            for stricter in [
                params(min_uncached.saturating_add(raise), min_prompt, max_queue),
                params(min_uncached, min_prompt.saturating_add(raise), max_queue),
                params(min_uncached, min_prompt, max_queue.saturating_sub(raise)),
            ] {
                prop_assert!(!decide_pd(&stricter, &inputs).split || decision.split);
            }
        }
    }
}
