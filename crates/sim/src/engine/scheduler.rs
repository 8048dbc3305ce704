//! Continuous batching: forming steps, committing them, chunked prefill, preemption, coalesced decode runs.
//!
//! One step is in flight at a time. A step is *formed* at its start (the previous step's end, or the
//! arrival that wakes an idle engine): the batch is chosen, blocks are allocated (evicting free cached
//! blocks as needed, reported at once), and the end time follows from the cost model. It is *committed*
//! at its end: computed tokens advance, full prompt blocks are cached (BlockStored), tokens are sampled
//! and finished requests free their blocks. Then the next step is formed at once.
//!
//! Coalescing (replay): when a step is pure decode for every running request, no request was preempted
//! and no waiting request could be admitted, nothing changes the batch until a request finishes, blocks
//! run out, or a new request arrives or one is aborted. So the step is stretched into a run of `k` decode
//! steps (`k` = fewest tokens any request still needs, cut where blocks would run out), timed in closed
//! form, and cut short at the step boundary an arrival or abort falls in.
//!
//! Rate (replay's shared host): a step's cost is its *work*, in microseconds at the profile's speed. An
//! engine runs at a rate (1.0 unless [`EngineModel::set_rate`] says otherwise, as when replicas share a
//! host's cores); a step ends when its work is done at the rates it ran at, so a rate change moves the end
//! of the step in flight.

use std::collections::{HashSet, VecDeque};

use super::kv::{BlockId, KvCache, cacheable_blocks};
use super::tokenize::Prompt;
use super::{
    AddError, ConfigError, EngineConfig, EngineEvent, EngineRequest, EngineStats, FinishReason, KvEventKind,
    LoadFailurePolicy, Micros, RemoteKv,
};

#[derive(Clone, Debug)]
struct Seq {
    id: u64,
    prompt: Prompt,
    max_output: u32,
    arrived_at: Micros,
    /// Tokens whose KV is computed.
    computed: u32,
    /// Tokens generated.
    output: u32,
    blocks: Vec<BlockId>,
    /// Leading prompt blocks already cached for this sequence (hit or committed).
    hashed_blocks: usize,
    cached_tokens: Option<u32>,
    first_token_at: Option<Micros>,
    aborted: bool,
    /// Prefill side: keep the blocks held this long after finishing.
    hold_for: Option<Micros>,
    /// Decode side: the prompt's KV is still to be pulled.
    remote: Option<RemoteKv>,
}

/// A decode-side request whose KV transfer is running.
#[derive(Clone, Debug)]
struct Loading {
    seq: Seq,
    started_at: Micros,
    done_at: Micros,
    tokens: u32,
    fail: bool,
}

/// A finished prefill-side request's blocks, held for the decode side.
#[derive(Clone, Debug)]
struct Held {
    id: u64,
    blocks: Vec<BlockId>,
    until: Micros,
}

impl Seq {
    fn total(&self) -> u32 {
        self.prompt.tokens + self.output
    }

    fn is_decode(&self) -> bool {
        self.output > 0 && self.total() - self.computed == 1
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum StepKind {
    Single,
    /// `steps` decode steps of every running sequence; `ctx` is their context at the first step.
    DecodeRun {
        steps: u64,
        seqs: u32,
        ctx: u64,
    },
}

#[derive(Clone, Debug)]
struct Step {
    /// When it ends at the engine's current rate.
    end: Micros,
    /// Its work: microseconds at the profile's speed (rate 1.0).
    work: f64,
    /// Of that, done by `since` (the step's start or the last rate change).
    done: f64,
    since: Micros,
    /// (index into `running`, tokens) of every scheduled sequence.
    scheduled: Vec<(usize, u32)>,
    kind: StepKind,
}

/// One emulated engine. See the [module docs](super) for how to drive it.
#[derive(Clone, Debug)]
pub struct EngineModel {
    config: EngineConfig,
    kv: KvCache,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    live: HashSet<u64>,
    /// Decode side: transfers in flight, and loaded requests waiting for their first step.
    loading: Vec<Loading>,
    ready: VecDeque<Seq>,
    /// Prefill side: finished requests' blocks held for a pull.
    held: Vec<Held>,
    step: Option<Step>,
    /// Latest time seen; an idle engine never starts a step before it.
    clock: Micros,
    /// Share of the profile's speed the engine runs at now (see the module docs).
    rate: f64,
    stats: EngineStats,
}

impl EngineModel {
    /// An idle engine with an empty cache.
    pub fn new(config: EngineConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let kv = KvCache::new(config.num_gpu_blocks);
        let stats = EngineStats { num_gpu_blocks: config.num_gpu_blocks, ..EngineStats::default() };
        Ok(Self {
            config,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
            live: HashSet::new(),
            loading: Vec::new(),
            ready: VecDeque::new(),
            held: Vec::new(),
            step: None,
            clock: 0,
            rate: 1.0,
            stats,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Counters and gauges.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// The KV cache, for inspection.
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Prompt tokens of `prompt` the cache holds now (what a request would hit if admitted now).
    pub fn cached_prefix_tokens(&self, prompt: &Prompt) -> u32 {
        if !self.config.enable_prefix_caching || prompt.tokens == 0 {
            return 0;
        }
        let limit = cacheable_blocks(prompt.tokens, self.config.block_tokens, prompt.block_hashes.len());
        self.kv.lookup(&prompt.block_hashes[..limit]).0 as u32 * self.config.block_tokens
    }

    /// Requests added and not finished.
    pub fn live_requests(&self) -> usize {
        self.live.len()
    }

    /// When the engine next has something to do: the step in flight ends, a KV transfer ends or a held
    /// request's lease runs out (`None` when idle).
    pub fn next_step_at(&self) -> Option<Micros> {
        [self.step.as_ref().map(|s| s.end), self.next_load_done(), self.next_lease_end()]
            .into_iter()
            .flatten()
            .min()
    }

    fn next_load_done(&self) -> Option<Micros> {
        self.loading.iter().map(|l| l.done_at).min()
    }

    fn next_lease_end(&self) -> Option<Micros> {
        self.held.iter().map(|h| h.until).min()
    }

    /// Whether a step is in flight (the engine is computing, not idle or only waiting on transfers).
    pub fn is_stepping(&self) -> bool {
        self.step.is_some()
    }

    /// Runs the engine at `rate` of the profile's speed from `now` on (a replica sharing its host's cores
    /// with others that are computing too): the step in flight ends when its remaining work is done at
    /// that rate, and later steps are timed at it until the next call. `now` is the engine's latest time
    /// (advance it first); a rate outside (0, 1] is taken as 1.
    pub fn set_rate(&mut self, now: Micros, rate: f64) {
        let rate = if rate > 0.0 && rate <= 1.0 { rate } else { 1.0 };
        let old = self.rate;
        self.rate = rate;
        if let Some(step) = self.step.as_mut() {
            let now = now.clamp(step.since, step.end);
            step.done = (step.done + (now - step.since) as f64 * old).min(step.work);
            step.since = now;
            step.end = now + ((step.work - step.done) / rate).ceil() as Micros;
        }
    }

    /// Prefill side: whether request `id`'s blocks are held now.
    pub fn is_held(&self, id: u64) -> bool {
        self.held.iter().any(|h| h.id == id)
    }

    /// Prefill side: the decode side pulled request `id`'s KV; its held blocks are freed at `now`. Returns
    /// false when nothing is held under `id` (never was, already pulled, or the lease ran out).
    pub fn release_held(&mut self, id: u64, now: Micros, out: &mut impl FnMut(EngineEvent)) -> bool {
        let Some(position) = self.held.iter().position(|h| h.id == id) else { return false };
        self.clock = self.clock.max(now);
        let held = self.held.swap_remove(position);
        for block in held.blocks.into_iter().rev() {
            self.kv.release(block);
        }
        out(EngineEvent::HoldReleased { id, at: now, expired: false });
        self.refresh_gauges();
        true
    }

    /// Queues a request arriving at `now`. An idle engine starts a step at once (events of forming it,
    /// such as evictions, go to `out`); a decode run in flight is cut at the step boundary after `now`, so
    /// the request can join the next step.
    pub fn add_request(
        &mut self,
        request: EngineRequest,
        now: Micros,
        out: &mut impl FnMut(EngineEvent),
    ) -> Result<(), AddError> {
        if self.live.contains(&request.id) {
            return Err(AddError::DuplicateId(request.id));
        }
        let max_output = request.max_output_tokens.max(1);
        let needed = (u64::from(request.prompt.tokens) + u64::from(max_output))
            .div_ceil(u64::from(self.config.block_tokens));
        if needed > u64::from(self.config.num_gpu_blocks) {
            return Err(AddError::TooLarge { id: request.id, needed, capacity: self.config.num_gpu_blocks });
        }
        self.clock = self.clock.max(now);
        self.live.insert(request.id);
        self.waiting.push_back(Seq {
            id: request.id,
            prompt: request.prompt,
            max_output,
            arrived_at: now,
            computed: 0,
            output: 0,
            blocks: Vec::new(),
            hashed_blocks: 0,
            cached_tokens: None,
            first_token_at: None,
            aborted: false,
            hold_for: request.hold_for,
            remote: request.remote,
        });
        if self.step.is_some() {
            self.cut_run(now);
        } else {
            self.form_step(self.clock, out);
        }
        self.refresh_gauges();
        Ok(())
    }

    /// Aborts a live request at `now`: it leaves at once (a `Finished` event with reason `abort`), its
    /// blocks are freed (cached ones stay cached). Returns false for an unknown id.
    pub fn abort(&mut self, id: u64, now: Micros, out: &mut impl FnMut(EngineEvent)) -> bool {
        if !self.live.remove(&id) {
            return false;
        }
        self.clock = self.clock.max(now);
        if let Some(position) = self.waiting.iter().position(|s| s.id == id) {
            let mut seq = self.waiting.remove(position).expect("position is in range");
            self.release_blocks(&mut seq);
            self.stats.finished_abort += 1;
            out(finished(&seq, now, FinishReason::Abort));
        } else if let Some(position) = self.loading.iter().position(|l| l.seq.id == id) {
            let mut seq = self.loading.swap_remove(position).seq;
            self.release_blocks(&mut seq);
            self.stats.finished_abort += 1;
            out(finished(&seq, now, FinishReason::Abort));
        } else if let Some(position) = self.ready.iter().position(|s| s.id == id) {
            let mut seq = self.ready.remove(position).expect("position is in range");
            self.release_blocks(&mut seq);
            self.stats.finished_abort += 1;
            out(finished(&seq, now, FinishReason::Abort));
        } else if let Some(position) = self.running.iter().position(|s| s.id == id && !s.aborted) {
            let blocks = std::mem::take(&mut self.running[position].blocks);
            for block in blocks.into_iter().rev() {
                self.kv.release(block);
            }
            let entry = &mut self.running[position];
            entry.aborted = true;
            entry.hashed_blocks = 0;
            self.stats.finished_abort += 1;
            out(finished(entry, now, FinishReason::Abort));
            self.cut_run(now);
        }
        self.refresh_gauges();
        true
    }

    /// Handles everything due at or before `now` in time order (transfers ending first, then leases
    /// running out, then steps ending), forming the next step each time.
    pub fn advance_to(&mut self, now: Micros, out: &mut impl FnMut(EngineEvent)) {
        loop {
            if let Some(at) = self.next_load_done().filter(|&at| at <= now) {
                self.clock = self.clock.max(at);
                self.finish_loads(at, out);
                if self.step.is_none() {
                    self.form_step(self.clock, out);
                }
            } else if let Some(at) = self.next_lease_end().filter(|&at| at <= now) {
                self.clock = self.clock.max(at);
                self.expire_holds(at, out);
                if self.step.is_none() {
                    self.form_step(self.clock, out);
                }
            } else if let Some(step) = self.step.take_if(|s| s.end <= now) {
                self.clock = self.clock.max(step.end);
                self.commit(step, out);
                self.form_step(self.clock, out);
            } else {
                break;
            }
        }
        self.clock = self.clock.max(now);
        self.refresh_gauges();
    }

    /// Ends every transfer due at `at`: a loaded request waits for its first step with all but the
    /// prompt's last token computed; a failed one follows the load failure policy.
    fn finish_loads(&mut self, at: Micros, out: &mut impl FnMut(EngineEvent)) {
        let mut index = 0;
        while index < self.loading.len() {
            if self.loading[index].done_at > at {
                index += 1;
                continue;
            }
            let Loading { mut seq, started_at, tokens, fail, .. } = self.loading.swap_remove(index);
            let bytes = self.config.kv_transfer.bytes(tokens);
            let blocks = tokens.div_ceil(self.block_tokens());
            out(EngineEvent::LoadDone { id: seq.id, at, started_at, tokens, bytes, blocks, failed: fail });
            if fail {
                self.stats.kv_load_failures += 1;
                self.release_blocks(&mut seq);
                seq.computed = 0;
                seq.hashed_blocks = 0;
                seq.remote = None;
                match self.config.kv_load_failure_policy {
                    LoadFailurePolicy::Recompute => {
                        seq.cached_tokens = None;
                        self.waiting.push_front(seq);
                    }
                    LoadFailurePolicy::Fail => {
                        self.live.remove(&seq.id);
                        self.stats.finished_error += 1;
                        out(finished(&seq, at, FinishReason::Error));
                    }
                }
            } else {
                self.stats.kv_loads += 1;
                self.stats.kv_loaded_tokens += u64::from(tokens);
                seq.computed = seq.prompt.tokens.saturating_sub(1);
                seq.cached_tokens = Some(seq.computed);
                seq.remote = None;
                self.ready.push_back(seq);
            }
        }
    }

    /// Frees the held blocks whose lease ended at or before `at`.
    fn expire_holds(&mut self, at: Micros, out: &mut impl FnMut(EngineEvent)) {
        let mut index = 0;
        while index < self.held.len() {
            if self.held[index].until > at {
                index += 1;
                continue;
            }
            let held = self.held.swap_remove(index);
            for block in held.blocks.into_iter().rev() {
                self.kv.release(block);
            }
            self.stats.kv_expired_holds += 1;
            out(EngineEvent::HoldReleased { id: held.id, at, expired: true });
        }
    }

    /// Drops every cached prefix (vLLM's `/reset_prefix_cache`) when no request holds blocks; emits
    /// `AllBlocksCleared`. Returns whether it reset.
    pub fn reset_prefix_cache(&mut self, now: Micros, out: &mut impl FnMut(EngineEvent)) -> bool {
        let reset = self.kv.reset_prefix_cache();
        if reset && self.config.kv_events {
            out(EngineEvent::Kv { at: now, kind: KvEventKind::AllBlocksCleared });
        }
        reset
    }

    fn refresh_gauges(&mut self) {
        self.stats.running = self.running.iter().filter(|s| !s.aborted).count() as u32;
        self.stats.waiting = (self.waiting.len() + self.loading.len() + self.ready.len()) as u32;
        self.stats.loading = self.loading.len() as u32;
        self.stats.held = self.held.len() as u32;
        self.stats.used_blocks = self.kv.used_blocks();
    }

    /// Cuts a decode run in flight at the first step boundary at or after `now`.
    fn cut_run(&mut self, now: Micros) {
        let cost = &self.config.cost;
        let rate = self.rate;
        let Some(step) = self.step.as_mut() else { return };
        let StepKind::DecodeRun { steps, seqs, ctx } = step.kind else { return };
        if now >= step.end {
            return;
        }
        // The work done by `now` at the current rate; then the smallest j >= 1 whose j steps cover it.
        let done_by_now = step.done + now.saturating_sub(step.since) as f64 * rate;
        let (mut lo, mut hi) = (1u64, steps);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if cost.decode_run_time(seqs, ctx, mid) as f64 >= done_by_now {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        step.kind = StepKind::DecodeRun { steps: lo, seqs, ctx };
        step.work = cost.decode_run_time(seqs, ctx, lo) as f64;
        step.end = step.since + ((step.work - step.done).max(0.0) / rate).ceil() as Micros;
    }

    fn block_tokens(&self) -> u32 {
        self.config.block_tokens
    }

    /// Blocks a sequence needs to hold `tokens` computed tokens.
    fn blocks_for(&self, tokens: u32) -> usize {
        tokens.div_ceil(self.block_tokens()) as usize
    }

    /// Allocates blocks until `seq_blocks` holds `count` (fewer if the pool runs dry), reporting evictions.
    fn grow(
        &mut self,
        seq_blocks: &mut Vec<BlockId>,
        count: usize,
        at: Micros,
        out: &mut impl FnMut(EngineEvent),
    ) {
        let mut evicted = Vec::new();
        while seq_blocks.len() < count {
            let Some((block, gone)) = self.kv.allocate() else { break };
            seq_blocks.push(block);
            evicted.extend(gone);
        }
        if self.config.kv_events && !evicted.is_empty() {
            out(EngineEvent::Kv { at, kind: KvEventKind::BlockRemoved { block_hashes: evicted } });
        }
    }

    fn release_blocks(&mut self, seq: &mut Seq) {
        // Tail blocks first, so they are evicted before the (more shareable) head of the prompt.
        for block in seq.blocks.drain(..).rev() {
            self.kv.release(block);
        }
    }

    fn preempt_last(&mut self, at: Micros, out: &mut impl FnMut(EngineEvent)) {
        let Some(mut seq) = self.running.pop() else { return };
        self.release_blocks(&mut seq);
        seq.computed = 0;
        seq.hashed_blocks = 0;
        self.stats.preemptions += 1;
        out(EngineEvent::Preempted { id: seq.id, at });
        self.waiting.push_front(seq);
    }

    fn form_step(&mut self, start: Micros, out: &mut impl FnMut(EngineEvent)) {
        debug_assert!(self.step.is_none());
        let mut budget = self.config.max_num_batched_tokens;
        let mut scheduled: Vec<(usize, u32)> = Vec::with_capacity(self.running.len() + 4);
        let mut preempted = false;
        let mut index = 0;
        // Running requests first, in admission order.
        while index < self.running.len() {
            if budget == 0 {
                break;
            }
            let seq = &self.running[index];
            let want = (seq.total() - seq.computed).min(budget);
            let need = self.blocks_for(seq.computed + want);
            let mut scheduled_self = true;
            while self.kv.free_blocks() as usize + self.running[index].blocks.len() < need {
                if self.running.len() - 1 == index {
                    // Nothing left to preempt but this request itself.
                    self.preempt_last(start, out);
                    scheduled_self = false;
                    preempted = true;
                    break;
                }
                self.preempt_last(start, out);
                preempted = true;
            }
            if !scheduled_self {
                break;
            }
            let mut blocks = std::mem::take(&mut self.running[index].blocks);
            self.grow(&mut blocks, need, start, out);
            self.running[index].blocks = blocks;
            budget -= want;
            scheduled.push((index, want));
            index += 1;
        }
        // Then waiting requests, unless this step had to preempt (vLLM does not admit then).
        if !preempted || scheduled.is_empty() {
            // Loaded requests first: their blocks are held already and one token is left to compute.
            while budget > 0 && (self.running.len() as u32) < self.config.max_num_seqs {
                let Some(mut seq) = self.ready.pop_front() else { break };
                let want = (seq.total() - seq.computed).min(budget);
                let need = self.blocks_for(seq.computed + want);
                let mut blocks = std::mem::take(&mut seq.blocks);
                self.grow(&mut blocks, need, start, out);
                seq.blocks = blocks;
                out(EngineEvent::Scheduled { id: seq.id, at: start, cached_tokens: seq.computed });
                budget -= want;
                scheduled.push((self.running.len(), want));
                self.running.push(seq);
            }
            while budget > 0 && (self.running.len() as u32) < self.config.max_num_seqs {
                let Some(seq) = self.waiting.front() else { break };
                if let Some(remote) = seq.remote {
                    if self.start_load(remote, start, out) {
                        continue;
                    }
                    break;
                }
                let (hit_blocks, free_hits) = if self.config.enable_prefix_caching {
                    // Over the whole sequence: a preempted request comes back with its output so far.
                    let limit =
                        cacheable_blocks(seq.total(), self.block_tokens(), seq.prompt.block_hashes.len());
                    self.kv.lookup(&seq.prompt.block_hashes[..limit])
                } else {
                    (0, 0)
                };
                let computed = hit_blocks as u32 * self.block_tokens();
                let want = (seq.total() - computed).min(budget);
                let need = self.blocks_for(computed + want) - hit_blocks;
                if (self.kv.free_blocks() - free_hits) < need as u32 {
                    break;
                }
                let mut seq = self.waiting.pop_front().expect("front exists");
                for hash in &seq.prompt.block_hashes[..hit_blocks] {
                    let block = self.kv.acquire_cached(*hash).expect("looked up just now");
                    seq.blocks.push(block);
                }
                seq.hashed_blocks = hit_blocks;
                seq.computed = computed;
                let mut blocks = std::mem::take(&mut seq.blocks);
                self.grow(&mut blocks, hit_blocks + need, start, out);
                seq.blocks = blocks;
                self.stats.prefix_cache_queries_tokens += u64::from(seq.total());
                self.stats.prefix_cache_hits_tokens += u64::from(computed);
                if seq.cached_tokens.is_none() {
                    seq.cached_tokens = Some(computed);
                    out(EngineEvent::Scheduled { id: seq.id, at: start, cached_tokens: computed });
                }
                budget -= want;
                scheduled.push((self.running.len(), want));
                self.running.push(seq);
            }
        }
        if scheduled.is_empty() {
            return;
        }
        // Cost of the step.
        let mut chunks: Vec<(u32, u32)> = Vec::new();
        let mut decode_seqs = 0u32;
        let mut decode_ctx = 0u64;
        for &(i, tokens) in &scheduled {
            let seq = &self.running[i];
            if seq.is_decode() {
                decode_seqs += 1;
                decode_ctx += u64::from(seq.computed) + 1;
            } else {
                chunks.push((seq.computed, tokens));
            }
        }
        let cost = &self.config.cost;
        let mut kind = StepKind::Single;
        let mut duration = cost.step_time(&chunks, decode_seqs, decode_ctx);
        let all_decode = chunks.is_empty() && scheduled.len() == self.running.len();
        if all_decode && !preempted && !self.config.token_events {
            let steps = self.decode_run_length();
            if steps > 1 {
                kind = StepKind::DecodeRun { steps, seqs: decode_seqs, ctx: decode_ctx };
                duration = cost.decode_run_time(decode_seqs, decode_ctx, steps);
            }
        }
        let work = duration as f64;
        let end = start + (work / self.rate).ceil() as Micros;
        self.step = Some(Step { end, work, done: 0.0, since: start, scheduled, kind });
        // A transfer ending during a decode run lets its request join at the next step boundary.
        if let Some(at) = self.next_load_done() {
            self.cut_run(at);
        }
    }

    /// Longest run of pure-decode steps every running sequence can take: until the first finishes, and
    /// while free blocks cover the growth (the first step's blocks are already held).
    fn decode_run_length(&self) -> u64 {
        let most = self.running.iter().map(|s| s.max_output - s.output).min().unwrap_or(1).max(1);
        let free = self.kv.free_blocks() as usize;
        let fits = |k: u32| -> bool {
            let mut extra = 0usize;
            for seq in &self.running {
                extra += self.blocks_for(seq.computed + k).saturating_sub(seq.blocks.len());
                if extra > free {
                    return false;
                }
            }
            true
        };
        let (mut lo, mut hi) = (1u32, most);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        u64::from(lo)
    }

    fn commit(&mut self, step: Step, out: &mut impl FnMut(EngineEvent)) {
        let end = step.end;
        match step.kind {
            StepKind::Single => {
                self.stats.steps += 1;
                for &(i, tokens) in &step.scheduled {
                    if self.running[i].aborted {
                        continue;
                    }
                    if !self.running[i].is_decode() {
                        self.stats.computed_prefill_tokens += u64::from(tokens);
                    }
                    self.running[i].computed += tokens;
                    self.cache_full_blocks(i, end, out);
                    if self.running[i].computed == self.running[i].total() {
                        self.sample(i, end, 1, out);
                    }
                }
            }
            StepKind::DecodeRun { steps, .. } => {
                self.stats.steps += steps;
                let k = steps as u32;
                for &(i, _) in &step.scheduled {
                    if self.running[i].aborted {
                        continue;
                    }
                    let need = self.blocks_for(self.running[i].computed + k);
                    let mut blocks = std::mem::take(&mut self.running[i].blocks);
                    self.grow(&mut blocks, need, end, out);
                    debug_assert_eq!(blocks.len(), need, "a run is cut to the blocks available");
                    self.running[i].blocks = blocks;
                    self.running[i].computed += k;
                    self.sample(i, end, k, out);
                }
            }
        }
        // Finished and aborted requests leave the batch; the rest keep their order.
        let mut index = 0;
        while index < self.running.len() {
            let seq = &self.running[index];
            if seq.aborted || seq.output >= seq.max_output {
                let mut seq = self.running.remove(index);
                if !seq.aborted {
                    match seq.hold_for {
                        Some(lease) => {
                            let blocks = std::mem::take(&mut seq.blocks);
                            out(EngineEvent::Held {
                                id: seq.id,
                                at: end,
                                tokens: seq.prompt.tokens,
                                blocks: blocks.len() as u32,
                                until: end + lease,
                            });
                            self.held.push(Held { id: seq.id, blocks, until: end + lease });
                        }
                        None => self.release_blocks(&mut seq),
                    }
                    self.live.remove(&seq.id);
                    self.stats.finished_length += 1;
                    out(finished(&seq, end, FinishReason::Length));
                }
            } else {
                index += 1;
            }
        }
    }

    /// Starts the transfer of the waiting head's prompt KV if blocks for the whole prompt can be had;
    /// returns whether it did.
    fn start_load(&mut self, remote: RemoteKv, start: Micros, out: &mut impl FnMut(EngineEvent)) -> bool {
        let Some(seq) = self.waiting.front() else { return false };
        let (hit_blocks, free_hits) = if remote.use_local_cache && self.config.enable_prefix_caching {
            let limit =
                cacheable_blocks(seq.prompt.tokens, self.block_tokens(), seq.prompt.block_hashes.len());
            self.kv.lookup(&seq.prompt.block_hashes[..limit])
        } else {
            (0, 0)
        };
        let local = hit_blocks as u32 * self.block_tokens();
        let need = self.blocks_for(seq.prompt.tokens).saturating_sub(hit_blocks);
        if (self.kv.free_blocks() - free_hits) < need as u32 {
            return false;
        }
        let mut seq = self.waiting.pop_front().expect("front exists");
        for hash in &seq.prompt.block_hashes[..hit_blocks] {
            let block = self.kv.acquire_cached(*hash).expect("looked up just now");
            seq.blocks.push(block);
        }
        seq.hashed_blocks = hit_blocks;
        let mut blocks = std::mem::take(&mut seq.blocks);
        self.grow(&mut blocks, hit_blocks + need, start, out);
        seq.blocks = blocks;
        self.stats.prefix_cache_queries_tokens += u64::from(seq.prompt.tokens);
        self.stats.prefix_cache_hits_tokens += u64::from(local);
        let tokens = seq.prompt.tokens - local;
        let done_at = start + self.config.kv_transfer.duration_us(tokens);
        out(EngineEvent::LoadStarted { id: seq.id, at: start, local_tokens: local, tokens, done_at });
        self.cut_run(done_at);
        self.loading.push(Loading { seq, started_at: start, done_at, tokens, fail: remote.fail });
        true
    }

    /// Samples `count` tokens for running sequence `i` (the last at `at`).
    fn sample(&mut self, i: usize, at: Micros, count: u32, out: &mut impl FnMut(EngineEvent)) {
        let token_events = self.config.token_events;
        let seq = &mut self.running[i];
        for _ in 0..count {
            seq.output += 1;
            if seq.output == 1 {
                seq.first_token_at = Some(at);
                self.stats.prompt_tokens += u64::from(seq.prompt.tokens);
                out(EngineEvent::FirstToken {
                    id: seq.id,
                    at,
                    cached_tokens: seq.cached_tokens.unwrap_or(0),
                });
            } else if token_events {
                out(EngineEvent::Token { id: seq.id, at, index: seq.output - 1 });
            }
        }
        self.stats.generation_tokens += u64::from(count);
    }

    /// Caches the prompt blocks of running sequence `i` that became full, reporting them as BlockStored.
    fn cache_full_blocks(&mut self, i: usize, at: Micros, out: &mut impl FnMut(EngineEvent)) {
        let block_tokens = self.block_tokens();
        let seq = &self.running[i];
        let full = ((seq.computed / block_tokens) as usize).min(seq.prompt.block_hashes.len());
        if full <= seq.hashed_blocks {
            return;
        }
        let from = seq.hashed_blocks;
        let mut stored: Vec<(usize, usize)> = Vec::new(); // runs [a, b) of newly cached blocks
        for j in from..full {
            let (block, hash) = (self.running[i].blocks[j], self.running[i].prompt.block_hashes[j]);
            if self.kv.commit(block, hash) {
                match stored.last_mut() {
                    Some((_, b)) if *b == j => *b = j + 1,
                    _ => stored.push((j, j + 1)),
                }
            }
        }
        self.running[i].hashed_blocks = full;
        if !self.config.kv_events {
            return;
        }
        let seq = &self.running[i];
        for (a, b) in stored {
            let bt = block_tokens as usize;
            let token_ids = seq
                .prompt
                .token_ids
                .as_ref()
                .and_then(|ids| ids.get(a * bt..b * bt))
                .map(<[u32]>::to_vec)
                .unwrap_or_default();
            out(EngineEvent::Kv {
                at,
                kind: KvEventKind::BlockStored {
                    block_hashes: seq.prompt.block_hashes[a..b].to_vec(),
                    parent_block_hash: a.checked_sub(1).map(|p| seq.prompt.block_hashes[p]),
                    token_ids,
                    block_size: block_tokens,
                },
            });
        }
    }
}

fn finished(seq: &Seq, at: Micros, reason: FinishReason) -> EngineEvent {
    EngineEvent::Finished {
        id: seq.id,
        at,
        reason,
        prompt_tokens: seq.prompt.tokens,
        output_tokens: seq.output,
        cached_tokens: seq.cached_tokens.unwrap_or(0),
        first_token_at: seq.first_token_at,
        arrived_at: seq.arrived_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::CostProfile;

    /// A small engine with round cost figures: a step is 1 ms plus 10 us per prefill token and 100 us
    /// per decoding sequence.
    fn config(blocks: u32, max_num_seqs: u32, budget: u32) -> EngineConfig {
        EngineConfig {
            block_tokens: 4,
            num_gpu_blocks: blocks,
            max_num_seqs,
            max_num_batched_tokens: budget,
            enable_prefix_caching: true,
            token_events: false,
            kv_events: true,
            cost: CostProfile {
                step_us: 1000.0,
                prefill_token_us: 10.0,
                prefill_attn_us_per_ktok: 0.0,
                decode_seq_us: 100.0,
                decode_ctx_us_per_ktok: 0.0,
            },
            kv_transfer: crate::engine::TransferCost::default(),
            kv_load_failure_policy: LoadFailurePolicy::default(),
        }
    }

    /// A prompt of `tokens` tokens whose block `i` is named `seed * 1000 + i` (same seed = same prefix).
    fn prompt(seed: u64, tokens: u32) -> Prompt {
        Prompt::from_hashes(tokens, (0..u64::from(tokens / 4)).map(|i| seed * 1000 + i).collect())
    }

    fn run(engine: &mut EngineModel, events: &mut Vec<EngineEvent>) {
        while let Some(at) = engine.next_step_at() {
            engine.advance_to(at, &mut |e| events.push(e));
        }
    }

    fn first_token_cached(events: &[EngineEvent], id: u64) -> Option<u32> {
        events.iter().find_map(|e| match e {
            EngineEvent::FirstToken { id: i, cached_tokens, .. } if *i == id => Some(*cached_tokens),
            _ => None,
        })
    }

    fn finished_at(events: &[EngineEvent], id: u64) -> Option<Micros> {
        events.iter().find_map(|e| match e {
            EngineEvent::Finished { id: i, at, .. } if *i == id => Some(*at),
            _ => None,
        })
    }

    #[test]
    fn a_repeated_prefix_hits_and_reported_cached_tokens_equal_the_models() {
        let mut engine = EngineModel::new(config(64, 8, 64)).expect("valid");
        let mut events = Vec::new();
        engine
            .add_request(EngineRequest::new(1, prompt(1, 20), 3), 0, &mut |e| events.push(e))
            .expect("added");
        run(&mut engine, &mut events);
        // The second request shares 4 of 5 blocks; the third is identical (capped at 19 tokens -> 4 blocks).
        let mut shared = prompt(1, 20);
        shared.block_hashes[4] = 99;
        assert_eq!(engine.cached_prefix_tokens(&shared), 16);
        engine
            .add_request(EngineRequest::new(2, shared, 3), 100_000, &mut |e| events.push(e))
            .expect("added");
        run(&mut engine, &mut events);
        engine
            .add_request(EngineRequest::new(3, prompt(1, 20), 3), 200_000, &mut |e| events.push(e))
            .expect("added");
        run(&mut engine, &mut events);
        assert_eq!(first_token_cached(&events, 1), Some(0));
        assert_eq!(first_token_cached(&events, 2), Some(16));
        assert_eq!(first_token_cached(&events, 3), Some(16), "a full hit still computes the last token");
        let stats = engine.stats();
        assert_eq!(stats.prefix_cache_queries_tokens, 60);
        assert_eq!(stats.prefix_cache_hits_tokens, 32);
        assert_eq!(stats.computed_prefill_tokens, 60 - 32);
        assert_eq!(stats.generation_tokens, 9);
        assert_eq!((stats.running, stats.waiting, stats.used_blocks), (0, 0, 0));
        // Each request's BlockStored events name only blocks new to the cache.
        let stored: usize = events
            .iter()
            .map(|e| match e {
                EngineEvent::Kv { kind: KvEventKind::BlockStored { block_hashes, .. }, .. } => {
                    block_hashes.len()
                }
                _ => 0,
            })
            .sum();
        assert_eq!(stored, 6, "5 blocks of request 1 and block 99 of request 2");
    }

    fn first_token_at(events: &[EngineEvent], id: u64) -> Option<Micros> {
        events.iter().find_map(|e| match e {
            EngineEvent::FirstToken { id: i, at, .. } if *i == id => Some(*at),
            _ => None,
        })
    }

    #[test]
    fn a_rate_stretches_the_work_left_and_a_cut_run_ends_where_the_work_done_says() {
        // 20 prompt tokens, 3 output: a 1,200 us prefill step, then a run of two 1,100 us decode steps.
        let timings = |rate: f64| {
            let mut engine = EngineModel::new(config(64, 8, 64)).expect("valid");
            let mut events = Vec::new();
            engine.set_rate(0, rate);
            engine
                .add_request(EngineRequest::new(1, prompt(1, 20), 3), 0, &mut |e| events.push(e))
                .expect("added");
            run(&mut engine, &mut events);
            (first_token_at(&events, 1), finished_at(&events, 1))
        };
        assert_eq!(timings(1.0), (Some(1_200), Some(3_400)));
        assert_eq!(timings(0.5), (Some(2_400), Some(6_800)), "half the speed, twice the time");
        assert_eq!(timings(0.0), timings(1.0), "a rate outside (0, 1] is the profile's speed");

        // Halved 600 us into the prefill step: 600 us of work left take 1,200 us. Then 5 output tokens:
        // a run of four decode steps at 2,200 us each, cut by an arrival 2,300 us in (the second step),
        // so the newcomer's prefill (1,000 + 200 + 100 for the decoding sequence = 1,300 us of work)
        // starts at 1,800 + 4,400 and takes 2,600 us.
        let mut engine = EngineModel::new(config(64, 8, 64)).expect("valid");
        let mut events = Vec::new();
        engine
            .add_request(EngineRequest::new(1, prompt(1, 20), 5), 0, &mut |e| events.push(e))
            .expect("added");
        engine.advance_to(600, &mut |e| events.push(e));
        assert!(engine.is_stepping());
        engine.set_rate(600, 0.5);
        engine.advance_to(1_800 + 2_300, &mut |e| events.push(e));
        assert_eq!(first_token_at(&events, 1), Some(1_800));
        engine
            .add_request(EngineRequest::new(2, prompt(2, 20), 1), 4_100, &mut |e| events.push(e))
            .expect("added");
        run(&mut engine, &mut events);
        assert_eq!(first_token_at(&events, 2), Some(6_200 + 2_600));
        assert!(!engine.is_stepping());
    }

    #[test]
    fn eviction_is_lru_over_free_blocks() {
        // 6 blocks; three finished one-block prompts a, b, c (5 tokens: 1 full block each + 1 decode slot).
        let mut engine = EngineModel::new(config(6, 8, 64)).expect("valid");
        let mut events = Vec::new();
        for (id, seed) in [(1, 1), (2, 2), (3, 3)] {
            engine
                .add_request(EngineRequest::new(id, prompt(seed, 5), 1), id * 10_000, &mut |e| events.push(e))
                .expect("added");
            run(&mut engine, &mut events);
        }
        // Touch a again: b is now the least recently used cached block.
        engine
            .add_request(EngineRequest::new(4, prompt(1, 5), 1), 40_000, &mut |e| events.push(e))
            .expect("added");
        run(&mut engine, &mut events);
        let order = engine.kv().eviction_order();
        assert_eq!(order, vec![2000, 3000, 1000]);
        // A request needing every free block but two evicts b then c, never a... until it must.
        events.clear();
        engine
            .add_request(EngineRequest::new(5, prompt(9, 14), 1), 50_000, &mut |e| events.push(e))
            .expect("added");
        let removed: Vec<u64> = events
            .iter()
            .flat_map(|e| match e {
                EngineEvent::Kv { kind: KvEventKind::BlockRemoved { block_hashes }, .. } => {
                    block_hashes.clone()
                }
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(removed, vec![2000, 3000], "least recently used first; 4 blocks needed, 3 were empty");
        assert!(engine.kv().contains(1000));
    }

    #[test]
    fn preemption_happens_when_the_cache_is_full_and_only_then() {
        // 8 blocks of 4 tokens. Two requests of 12-token prompts fit (3 blocks each) but their outputs
        // of 12 tokens need 6 blocks each: the later one must be preempted, then finishes after.
        let mut engine = EngineModel::new(config(8, 8, 64)).expect("valid");
        let mut events = Vec::new();
        engine
            .add_request(EngineRequest::new(1, prompt(1, 12), 12), 0, &mut |e| events.push(e))
            .expect("added");
        engine
            .add_request(EngineRequest::new(2, prompt(2, 12), 12), 0, &mut |e| events.push(e))
            .expect("added");
        run(&mut engine, &mut events);
        let preempted: Vec<u64> = events
            .iter()
            .filter_map(|e| match e {
                EngineEvent::Preempted { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        assert!(!preempted.is_empty() && preempted.iter().all(|&id| id == 2), "{preempted:?}");
        assert!(finished_at(&events, 1) < finished_at(&events, 2));
        assert_eq!(engine.stats().preemptions, preempted.len() as u64);
        assert_eq!(engine.stats().generation_tokens, 24);
        // With room for both, nothing is preempted.
        let mut roomy = EngineModel::new(config(16, 8, 64)).expect("valid");
        let mut events = Vec::new();
        for id in [1, 2] {
            roomy
                .add_request(EngineRequest::new(id, prompt(id, 12), 12), 0, &mut |e| events.push(e))
                .expect("added");
        }
        run(&mut roomy, &mut events);
        assert_eq!(roomy.stats().preemptions, 0);
        assert!(
            EngineModel::new(config(4, 8, 64))
                .expect("valid")
                .add_request(EngineRequest::new(9, prompt(1, 12), 12), 0, &mut |_| {})
                .is_err(),
            "a request larger than the cache is refused, not livelocked"
        );
    }

    #[test]
    fn chunked_prefill_respects_the_token_budget_and_batches_respect_max_num_seqs() {
        let mut engine = EngineModel::new(config(64, 2, 8)).expect("valid");
        let mut events = Vec::new();
        for id in 1..=3 {
            engine
                .add_request(EngineRequest::new(id, prompt(id, 20), 2), 0, &mut |e| events.push(e))
                .expect("added");
        }
        assert_eq!((engine.stats().running, engine.stats().waiting), (1, 2), "20 tokens > budget 8");
        run(&mut engine, &mut events);
        // 20 tokens in chunks of 8, 8, 4; the third step fills its budget with request 2's first 4 tokens:
        // 3 steps of 1 ms + 8 tokens x 10 us before request 1's first token.
        let first = events.iter().find_map(|e| match e {
            EngineEvent::FirstToken { id: 1, at, .. } => Some(*at),
            _ => None,
        });
        assert_eq!(first, Some(3 * (1000 + 80)));
        assert_eq!(engine.stats().finished_length, 3);
    }

    #[test]
    fn coalesced_decode_runs_match_step_by_step_decoding() {
        let arrivals =
            [(1u64, 0u64, 40u32, 50u32), (2, 5_000, 24, 30), (3, 70_000, 8, 20), (4, 71_000, 16, 5)];
        let mut finishes = Vec::new();
        for token_events in [false, true] {
            let mut engine =
                EngineModel::new(EngineConfig { token_events, ..config(256, 8, 32) }).expect("valid");
            let mut events = Vec::new();
            for &(id, at, tokens, output) in &arrivals {
                engine.advance_to(at, &mut |e| events.push(e));
                engine
                    .add_request(EngineRequest::new(id, prompt(id, tokens), output), at, &mut |e| {
                        events.push(e)
                    })
                    .expect("added");
            }
            run(&mut engine, &mut events);
            let tokens = events.iter().filter(|e| matches!(e, EngineEvent::Token { .. })).count();
            assert_eq!(tokens, if token_events { 49 + 29 + 19 + 4 } else { 0 });
            finishes.push((1..=4).map(|id| finished_at(&events, id).expect("finished")).collect::<Vec<_>>());
            assert_eq!(engine.stats().generation_tokens, 105);
        }
        assert_eq!(finishes[0], finishes[1], "coalescing changes speed, not results");
    }

    /// `config` with a KV link where a token's KV takes 1 us on the wire and a transfer 100 us more.
    fn pd_config(policy: LoadFailurePolicy) -> EngineConfig {
        EngineConfig {
            kv_transfer: crate::engine::TransferCost { bytes_per_token: 1000, gbps: 8.0, latency_us: 100 },
            kv_load_failure_policy: policy,
            ..config(64, 8, 64)
        }
    }

    fn remote(id: u64, prompt: Prompt, output: u32, fail: bool) -> EngineRequest {
        EngineRequest {
            remote: Some(RemoteKv { use_local_cache: true, fail }),
            ..EngineRequest::new(id, prompt, output)
        }
    }

    #[test]
    fn a_held_prefill_keeps_its_blocks_until_pulled_or_until_the_lease_ends() {
        let mut engine = EngineModel::new(config(64, 8, 64)).expect("valid");
        let mut events = Vec::new();
        let held = EngineRequest { hold_for: Some(50_000), ..EngineRequest::new(1, prompt(1, 20), 1) };
        engine.add_request(held, 0, &mut |e| events.push(e)).expect("added");
        let done = engine.next_step_at().expect("a step");
        engine.advance_to(done, &mut |e| events.push(e));
        assert_eq!(finished_at(&events, 1), Some(done), "the prefill leg answers at once");
        assert!(engine.is_held(1));
        assert_eq!(
            (engine.stats().held, engine.stats().used_blocks),
            (1, 5),
            "20 prompt tokens in blocks of 4"
        );
        assert!(engine.release_held(1, done + 10, &mut |e| events.push(e)));
        assert!(!engine.release_held(1, done + 10, &mut |e| events.push(e)), "a second pull finds nothing");
        assert_eq!((engine.stats().held, engine.stats().used_blocks), (0, 0));
        assert!(events.iter().any(|e| matches!(e, EngineEvent::HoldReleased { id: 1, expired: false, .. })));
        assert!(engine.kv().contains(1000), "pulled blocks stay in the prefix cache");

        // Never pulled: the lease ends, the blocks are freed and the expiry counted.
        let held = EngineRequest { hold_for: Some(50_000), ..EngineRequest::new(2, prompt(2, 20), 1) };
        engine.add_request(held, 100_000, &mut |e| events.push(e)).expect("added");
        run(&mut engine, &mut events);
        let finished = finished_at(&events, 2).expect("finished");
        assert!(events.iter().any(|e| matches!(e, EngineEvent::HoldReleased { id: 2, expired: true, at, .. } if *at == finished + 50_000)));
        assert_eq!(
            (engine.stats().held, engine.stats().used_blocks, engine.stats().kv_expired_holds),
            (0, 0, 1)
        );
        assert!(!engine.release_held(2, finished + 60_000, &mut |e| events.push(e)), "too late to pull");
    }

    #[test]
    fn a_remote_prefill_waits_for_its_transfer_then_computes_only_the_last_token() {
        let mut engine = EngineModel::new(pd_config(LoadFailurePolicy::Fail)).expect("valid");
        let mut events = Vec::new();
        engine.add_request(remote(1, prompt(1, 40), 3, false), 0, &mut |e| events.push(e)).expect("added");
        assert_eq!((engine.stats().waiting, engine.stats().loading, engine.stats().running), (1, 1, 0));
        assert_eq!(engine.next_step_at(), Some(100 + 40), "40 tokens' KV at 1 us each plus the latency");
        run(&mut engine, &mut events);
        let first = events.iter().find_map(|e| match e {
            EngineEvent::FirstToken { id: 1, at, cached_tokens } => Some((*at, *cached_tokens)),
            _ => None,
        });
        assert_eq!(first, Some((140 + 1000 + 10, 39)), "one step computing the last prompt token");
        assert_eq!(engine.stats().computed_prefill_tokens, 1, "the prompt was not recomputed");
        assert_eq!((engine.stats().kv_loads, engine.stats().kv_loaded_tokens), (1, 40));
        assert_eq!(engine.stats().used_blocks, 0);

        // The same prompt again: the locally cached prefix (9 full blocks of 10) is not pulled again, and
        // a longer prompt takes longer on the wire.
        events.clear();
        engine
            .add_request(remote(2, prompt(1, 40), 1, false), 1_000_000, &mut |e| events.push(e))
            .expect("added");
        engine
            .add_request(remote(3, prompt(3, 80), 1, false), 1_000_000, &mut |e| events.push(e))
            .expect("added");
        run(&mut engine, &mut events);
        let loads: Vec<(u64, u32, u32, Micros)> = events
            .iter()
            .filter_map(|e| match e {
                EngineEvent::LoadStarted { id, local_tokens, tokens, done_at, at } => {
                    Some((*id, *local_tokens, *tokens, done_at - at))
                }
                _ => None,
            })
            .collect();
        assert_eq!(loads, vec![(2, 36, 4, 104), (3, 0, 80, 180)]);
    }

    #[test]
    fn a_failed_load_fails_the_request_or_recomputes_it_as_the_policy_says() {
        let mut engine = EngineModel::new(pd_config(LoadFailurePolicy::Fail)).expect("valid");
        let mut events = Vec::new();
        engine.add_request(remote(1, prompt(1, 40), 3, true), 0, &mut |e| events.push(e)).expect("added");
        run(&mut engine, &mut events);
        assert!(
            events.iter().any(|e| matches!(e, EngineEvent::LoadDone { id: 1, failed: true, at: 140, .. }))
        );
        assert!(
            events.iter().any(|e| matches!(
                e,
                EngineEvent::Finished { id: 1, reason: FinishReason::Error, at: 140, .. }
            ))
        );
        assert_eq!(first_token_cached(&events, 1), None);
        let stats = engine.stats();
        assert_eq!(
            (stats.finished_error, stats.kv_load_failures, stats.used_blocks, stats.computed_prefill_tokens),
            (1, 1, 0, 0)
        );
        assert_eq!(engine.live_requests(), 0);

        let mut engine = EngineModel::new(pd_config(LoadFailurePolicy::Recompute)).expect("valid");
        let mut events = Vec::new();
        engine.add_request(remote(1, prompt(1, 40), 3, true), 0, &mut |e| events.push(e)).expect("added");
        run(&mut engine, &mut events);
        assert_eq!(first_token_cached(&events, 1), Some(0), "the prompt is computed locally");
        assert_eq!(engine.stats().computed_prefill_tokens, 40);
        assert!(
            events
                .iter()
                .any(|e| matches!(e, EngineEvent::Finished { id: 1, reason: FinishReason::Length, .. }))
        );
        assert_eq!(engine.stats().used_blocks, 0);
    }

    #[test]
    fn abort_frees_blocks_and_reports() {
        let mut engine = EngineModel::new(config(32, 8, 64)).expect("valid");
        let mut events = Vec::new();
        engine
            .add_request(EngineRequest::new(1, prompt(1, 16), 100), 0, &mut |e| events.push(e))
            .expect("added");
        engine.advance_to(10_000, &mut |e| events.push(e));
        assert!(engine.abort(1, 10_000, &mut |e| events.push(e)));
        assert!(!engine.abort(1, 10_000, &mut |e| events.push(e)));
        run(&mut engine, &mut events);
        assert!(
            events
                .iter()
                .any(|e| matches!(e, EngineEvent::Finished { id: 1, reason: FinishReason::Abort, .. }))
        );
        assert_eq!(engine.stats().used_blocks, 0);
        assert_eq!(engine.live_requests(), 0);
        assert!(engine.kv().contains(1000), "computed prompt blocks stay cached");
    }
}
