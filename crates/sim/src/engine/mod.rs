//! The replica engine model: a pure, deterministic stand-in for one vLLM engine on a virtual clock.
//!
//! What it models, after vLLM V1's scheduler and KV-cache manager:
//! - a paged KV cache ([`kv::KvCache`]) of `num_gpu_blocks` blocks of `block_tokens` tokens, with prefix
//!   caching over chained block hashes, reference counts for the blocks of running requests and LRU
//!   eviction of free cached blocks (freed blocks join the tail of the free queue, tail blocks of a request
//!   first, so its shared head stays longest);
//! - continuous batching ([`EngineModel`], `scheduler.rs`): every step has a token budget of
//!   `max_num_batched_tokens`; running requests are served first (decodes take one token, prefills the rest
//!   of their prompt in chunks), then waiting requests are admitted in arrival order while fewer than
//!   `max_num_seqs` run and blocks can be allocated; when a running request cannot get a block, the most
//!   recently admitted request is preempted (recompute: its blocks are freed and it re-queues at the head);
//! - a step's duration from a [`CostProfile`] (`cost.rs`): fixed step time, per prefill token, attention
//!   over the context, per decoding sequence and per context token read.
//!
//! Time is integer microseconds ([`Micros`]) passed in by the caller; nothing here sleeps, reads a clock
//! or draws random numbers, so the same calls always give the same events.
//!
//! # Driving it
//! ```
//! use fleet_sim::engine::{EngineConfig, EngineModel, EngineRequest};
//! let mut engine = EngineModel::new(EngineConfig::default()).expect("valid config");
//! let mut events = Vec::new();
//! let prompt = fleet_sim::engine::tokenize::prompt_of_text("some prompt text", 16);
//! engine.add_request(EngineRequest::new(1, prompt, 8), 0, &mut |e| events.push(e));
//! while let Some(at) = engine.next_step_at() {
//!     engine.advance_to(at, &mut |e| events.push(e));
//! }
//! assert!(events.iter().any(|e| matches!(e, fleet_sim::engine::EngineEvent::Finished { id: 1, .. })));
//! ```
//! A real-time driver (serve mode) sleeps until [`EngineModel::next_step_at`], calls
//! [`EngineModel::advance_to`] with the current time, and calls [`EngineModel::add_request`] /
//! [`EngineModel::abort`] as requests come and go. Call `advance_to(now)` before `add_request(.., now, ..)`
//! so earlier steps are committed first. With [`EngineConfig::token_events`] every decode step is its own
//! step and emits [`EngineEvent::Token`]s; without it (replay) runs of pure-decode steps are computed in
//! one go, which is what makes replaying thousands of requests fast.

pub mod cost;
pub mod kv;
pub mod pd;
mod scheduler;
pub mod tokenize;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use cost::{CostProfile, Profile, ProfileError, SharedHost};
pub use kv::KvCache;
pub use pd::{LoadFailurePolicy, RemoteKv, TransferCost};
pub use scheduler::EngineModel;
pub use tokenize::Prompt;

/// Virtual time in microseconds (any epoch; replay starts at 0, serve mode uses its own start instant).
pub type Micros = u64;

/// Engine limits and behaviour. `Default` is vLLM's defaults on an 8B model on one H100 (see
/// `profiles/llama-3.1-8b-h100.yaml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Tokens per KV block (vLLM's `--block-size`, default 16).
    pub block_tokens: u32,
    /// KV capacity in blocks (vLLM's `num_gpu_blocks`).
    pub num_gpu_blocks: u32,
    /// Concurrent sequences in the running batch (vLLM's `--max-num-seqs`).
    pub max_num_seqs: u32,
    /// Token budget of one step (vLLM's `--max-num-batched-tokens`); long prompts are prefilled in chunks.
    pub max_num_batched_tokens: u32,
    /// Prefix caching (vLLM's `--enable-prefix-caching`, on by default in V1).
    pub enable_prefix_caching: bool,
    /// Emit one [`EngineEvent::Token`] per generated token and run every decode step separately (serve
    /// mode). Off: runs of pure-decode steps are coalesced and only first-token and finish events are
    /// emitted (replay).
    pub token_events: bool,
    /// Emit [`EngineEvent::Kv`] (BlockStored / BlockRemoved / AllBlocksCleared) as vLLM publishes them.
    pub kv_events: bool,
    /// Step cost figures.
    pub cost: CostProfile,
    /// What moving a request's KV between replicas costs (disaggregated prefill/decode).
    pub kv_transfer: TransferCost,
    /// What a failed KV load does (vLLM's `kv_load_failure_policy`).
    pub kv_load_failure_policy: LoadFailurePolicy,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Profile::builtin(cost::DEFAULT_PROFILE).expect("the default profile is built in").engine_config()
    }
}

/// An [`EngineConfig`] that cannot work, naming the field and the fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid engine config: {field} = {value}: {fix}")]
pub struct ConfigError {
    /// The offending field.
    pub field: &'static str,
    /// Its value.
    pub value: String,
    /// How to fix it.
    pub fix: String,
}

impl EngineConfig {
    /// Checks limits and cost figures.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |field, value: &dyn fmt::Display, fix: &str| {
            Err(ConfigError { field, value: value.to_string(), fix: fix.to_owned() })
        };
        if self.block_tokens == 0 {
            return err(
                "block_tokens",
                &self.block_tokens,
                "use a positive block size (vLLM's default is 16)",
            );
        }
        if self.num_gpu_blocks == 0 {
            return err("num_gpu_blocks", &self.num_gpu_blocks, "the cache needs at least one block");
        }
        if self.max_num_seqs == 0 {
            return err("max_num_seqs", &self.max_num_seqs, "allow at least one running sequence");
        }
        if self.max_num_batched_tokens == 0 {
            return err(
                "max_num_batched_tokens",
                &self.max_num_batched_tokens,
                "use a positive token budget",
            );
        }
        self.kv_transfer.validate().map_err(|fix| ConfigError {
            field: "kv_transfer",
            value: format!("{:?}", self.kv_transfer),
            fix,
        })?;
        self.cost.validate().map_err(|e| ConfigError { field: e.field, value: e.value, fix: e.fix })
    }
}

impl FromStr for EngineConfig {
    type Err = ConfigError;

    /// YAML or JSON with any subset of the fields (missing ones take their defaults), validated.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let config: EngineConfig = serde_norway::from_str(text).map_err(|e| ConfigError {
            field: "document",
            value: e.to_string(),
            fix: "write YAML or JSON with fields of EngineConfig".to_owned(),
        })?;
        config.validate()?;
        Ok(config)
    }
}

/// One request for the engine: its prompt as block hashes (and optionally token ids) and its output length.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineRequest {
    /// Caller's id, echoed in every event about this request; unique among live requests.
    pub id: u64,
    /// The prompt.
    pub prompt: Prompt,
    /// Tokens to generate (at least 1: a request that asks for 0 still samples one, as vLLM requires
    /// `max_tokens >= 1`).
    pub max_output_tokens: u32,
    /// Prefill side of a disaggregated request: when it finishes, its KV blocks stay held this long (the
    /// lease) for the decode side to pull, then are freed ([`EngineModel::release_held`] frees them sooner).
    pub hold_for: Option<Micros>,
    /// Decode side of a disaggregated request: the prompt's KV is pulled from a prefill replica.
    pub remote: Option<RemoteKv>,
}

impl EngineRequest {
    /// A request generating `max_output_tokens` tokens.
    pub fn new(id: u64, prompt: Prompt, max_output_tokens: u32) -> Self {
        Self { id, prompt, max_output_tokens, hold_for: None, remote: None }
    }
}

/// Why a request left the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// Generated `max_output_tokens` (vLLM's `length`).
    Length,
    /// Aborted by the caller (vLLM's `abort`).
    Abort,
    /// Failed in the engine: a KV load failed under [`LoadFailurePolicy::Fail`] (vLLM's `error`).
    Error,
}

impl FinishReason {
    /// vLLM's `finished_reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
        }
    }
}

/// A KV-cache event, as vLLM publishes them (`vllm/distributed/kv_events.py`). Hashes are the engine's
/// block hashes, which here are the prompt's chained block hashes ([`Prompt::block_hashes`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvEventKind {
    /// Blocks became cached (full and computed), in prompt order, chained from `parent_block_hash`.
    BlockStored {
        /// The stored blocks' hashes.
        block_hashes: Vec<u64>,
        /// Hash of the block before the first one, `None` at the start of the prompt.
        parent_block_hash: Option<u64>,
        /// The blocks' token ids (`block_tokens` per block), empty when the prompt came without tokens.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
    },
    /// Cached blocks were evicted.
    BlockRemoved {
        /// Their hashes.
        block_hashes: Vec<u64>,
    },
    /// The whole prefix cache was reset.
    AllBlocksCleared,
}

/// What the engine reports as steps complete. `at` is the virtual time the thing happened.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// The request was admitted to the running batch for the first time (its queue time ends).
    Scheduled {
        /// Request id.
        id: u64,
        /// When.
        at: Micros,
        /// Prompt tokens found in the prefix cache (a multiple of `block_tokens`).
        cached_tokens: u32,
    },
    /// The prefill finished and the first token was sampled.
    FirstToken {
        /// Request id.
        id: u64,
        /// When.
        at: Micros,
        /// Prompt tokens served from the prefix cache at first admission (what `usage.cached_tokens` says).
        cached_tokens: u32,
    },
    /// A later token was sampled (only with [`EngineConfig::token_events`]).
    Token {
        /// Request id.
        id: u64,
        /// When.
        at: Micros,
        /// 0-based index of the token in the output (the first token is index 0, reported as `FirstToken`).
        index: u32,
    },
    /// The request was preempted (recompute): its blocks were freed and it waits again.
    Preempted {
        /// Request id.
        id: u64,
        /// When.
        at: Micros,
    },
    /// The request left the engine.
    Finished {
        /// Request id.
        id: u64,
        /// When.
        at: Micros,
        /// Why.
        reason: FinishReason,
        /// Prompt tokens.
        prompt_tokens: u32,
        /// Tokens generated.
        output_tokens: u32,
        /// Prompt tokens served from the prefix cache at first admission.
        cached_tokens: u32,
        /// Time of the first token, if one was produced.
        first_token_at: Option<Micros>,
        /// When the request was added.
        arrived_at: Micros,
    },
    /// Prefill side: the request finished and its blocks are held for the decode side until `until`.
    Held {
        /// Request id.
        id: u64,
        /// When.
        at: Micros,
        /// Prompt tokens whose KV is held.
        tokens: u32,
        /// Blocks held.
        blocks: u32,
        /// When the lease runs out.
        until: Micros,
    },
    /// Prefill side: held blocks were freed, pulled by the decode side or because the lease ran out.
    HoldReleased {
        /// Request id.
        id: u64,
        /// When.
        at: Micros,
        /// The lease ran out before a pull.
        expired: bool,
    },
    /// Decode side: the request's blocks are allocated and its KV transfer started.
    LoadStarted {
        /// Request id.
        id: u64,
        /// When.
        at: Micros,
        /// Prompt tokens found in the local prefix cache (not pulled).
        local_tokens: u32,
        /// Tokens pulled.
        tokens: u32,
        /// When the transfer ends.
        done_at: Micros,
    },
    /// Decode side: the KV transfer ended.
    LoadDone {
        /// Request id.
        id: u64,
        /// When.
        at: Micros,
        /// When it started.
        started_at: Micros,
        /// Tokens pulled.
        tokens: u32,
        /// Bytes moved.
        bytes: u64,
        /// Blocks written (vLLM's descriptors).
        blocks: u32,
        /// Whether it failed (then the policy applies: a `Finished` with `error`, or a local prefill).
        failed: bool,
    },
    /// A KV-cache event.
    Kv {
        /// When.
        at: Micros,
        /// What.
        kind: KvEventKind,
    },
}

/// Counters (monotonic) and gauges of one engine, named after what vLLM exports.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineStats {
    /// Gauge: requests in the running batch (`vllm:num_requests_running`).
    pub running: u32,
    /// Gauge: requests waiting, including preempted ones (`vllm:num_requests_waiting`).
    pub waiting: u32,
    /// Gauge: blocks in use by running requests (`kv_cache_usage_perc` = used / total).
    pub used_blocks: u32,
    /// Capacity in blocks.
    pub num_gpu_blocks: u32,
    /// Counter: prompt tokens looked up in the prefix cache (`vllm:prefix_cache_queries`).
    pub prefix_cache_queries_tokens: u64,
    /// Counter: of those, tokens found (`vllm:prefix_cache_hits`).
    pub prefix_cache_hits_tokens: u64,
    /// Counter: preemptions (`vllm:num_preemptions`).
    pub preemptions: u64,
    /// Counter: prompt tokens of requests whose prefill finished (`vllm:prompt_tokens`).
    pub prompt_tokens: u64,
    /// Counter: tokens generated (`vllm:generation_tokens`).
    pub generation_tokens: u64,
    /// Counter: prompt tokens actually computed (uncached prefill, recomputation included).
    pub computed_prefill_tokens: u64,
    /// Counter: requests finished with `length`.
    pub finished_length: u64,
    /// Counter: requests finished with `abort`.
    pub finished_abort: u64,
    /// Counter: model steps executed (a coalesced decode run counts each step).
    pub steps: u64,
    /// Counter: requests finished with `error` (a failed KV load under the `fail` policy).
    pub finished_error: u64,
    /// Gauge: decode side, requests whose KV transfer is running (also counted in `waiting`).
    pub loading: u32,
    /// Gauge: prefill side, finished requests whose blocks are held for a pull.
    pub held: u32,
    /// Counter: KV transfers that completed.
    pub kv_loads: u64,
    /// Counter: KV transfers that failed.
    pub kv_load_failures: u64,
    /// Counter: tokens whose KV was pulled successfully.
    pub kv_loaded_tokens: u64,
    /// Counter: held requests freed because their lease ran out.
    pub kv_expired_holds: u64,
}

impl EngineStats {
    /// KV-cache usage, 0 to 1 (vLLM's `kv_cache_usage_perc`: blocks held by requests / all blocks).
    pub fn kv_usage(&self) -> f64 {
        if self.num_gpu_blocks == 0 {
            0.0
        } else {
            f64::from(self.used_blocks) / f64::from(self.num_gpu_blocks)
        }
    }
}

/// A request the engine refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddError {
    /// A live request already has this id.
    #[error("request id {0} is already in the engine; use a fresh id per request")]
    DuplicateId(u64),
    /// The prompt can never fit: more blocks than the whole cache.
    #[error(
        "request {id} needs {needed} KV blocks for its prompt and output but the engine has {capacity}; \
         shorten the prompt or raise num_gpu_blocks"
    )]
    TooLarge {
        /// Request id.
        id: u64,
        /// Blocks needed.
        needed: u64,
        /// Blocks in the cache.
        capacity: u32,
    },
}

/// Shared, immutable token ids of a prompt (cheap to clone into events).
pub type TokenIds = Arc<[u32]>;
