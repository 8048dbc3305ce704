//! A steady traffic generator: tenants with shared system prompts of skewed popularity.
//!
//! It is what makes the demo fleet move: requests stream through the router at a fixed
//! rate, and because tenants reuse long system prompts, a prefix-aware policy has
//! something to gain. Arrivals are Poisson (exponential gaps) from a seeded RNG.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Shape and rate of the generated traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadConfig {
    /// Base URL of the OpenAI endpoint to drive (a router or a replica).
    pub target: String,
    /// More endpoints to spread the requests over with `target` (the routers of a fleet with several):
    /// each request goes to one of them, drawn evenly. The draws have their own random stream, so the
    /// traffic itself (arrivals, tenants, prompts) is the same whatever the number of targets.
    pub also_targets: Vec<String>,
    /// The `model` each request names (None: the field is left out).
    pub model: Option<String>,
    /// Mean requests per second.
    pub rps: f64,
    /// Distinct tenants; tenant `i` is chosen with weight `1 / (i + 1)` (Zipf, s = 1).
    pub tenants: usize,
    /// Approximate length of each tenant's system prompt, in bytes.
    pub system_prompt_bytes: usize,
    /// Tokens requested per completion.
    pub max_tokens: usize,
    /// Requests in flight at most; arrivals beyond it are counted as dropped, not queued,
    /// so a stalled target cannot make the generator grow without bound.
    pub max_in_flight: usize,
    /// Per-request deadline.
    pub request_timeout: Duration,
    pub seed: u64,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            target: "http://127.0.0.1:8000".into(),
            also_targets: Vec::new(),
            model: Some(crate::DEFAULT_MODEL.to_owned()),
            rps: 8.0,
            tenants: 6,
            system_prompt_bytes: 6000,
            max_tokens: 24,
            max_in_flight: 256,
            request_timeout: Duration::from_secs(60),
            seed: 7,
        }
    }
}

/// Counters of a running generator, readable while it runs.
#[derive(Debug, Default)]
pub struct LoadStats {
    pub sent: AtomicU64,
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub dropped: AtomicU64,
}

/// The system prompt of `tenant`: deterministic text, so every request of a tenant shares it.
pub fn system_prompt(tenant: usize, bytes: usize) -> String {
    let sentence = format!(
        "You are the assistant of tenant {tenant}. Follow the tenant's policies, cite documents, answer briefly. "
    );
    sentence.repeat(bytes / sentence.len() + 1)[..bytes].to_string()
}

fn pick_tenant(rng: &mut SmallRng, tenants: usize) -> usize {
    let total: f64 = (1..=tenants).map(|i| 1.0 / i as f64).sum();
    let mut x = rng.random::<f64>() * total;
    for i in 0..tenants {
        x -= 1.0 / (i + 1) as f64;
        if x <= 0.0 {
            return i;
        }
    }
    tenants - 1
}

/// Mixed into the seed for the stream that draws each request's target, apart from the traffic's own.
const TARGET_STREAM: u64 = 0x7a26_e7c0_5eed_0001;

/// Sends streaming chat requests to `config.target` (and `also_targets`) until `cancel` fires.
pub async fn run(
    config: LoadConfig,
    client: reqwest::Client,
    stats: Arc<LoadStats>,
    cancel: CancellationToken,
) {
    let mut rng = SmallRng::seed_from_u64(config.seed);
    let mut target_rng = SmallRng::seed_from_u64(config.seed ^ TARGET_STREAM);
    let in_flight = Arc::new(Semaphore::new(config.max_in_flight));
    let urls: Vec<String> = std::iter::once(&config.target)
        .chain(&config.also_targets)
        .map(|target| format!("{}/v1/chat/completions", target.trim_end_matches('/')))
        .collect();
    let tenants = config.tenants.max(1);
    let prompts: Vec<String> = (0..tenants).map(|t| system_prompt(t, config.system_prompt_bytes)).collect();
    loop {
        let gap = -rng.random::<f64>().max(f64::MIN_POSITIVE).ln() / config.rps.max(0.001);
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs_f64(gap.min(60.0))) => {}
        }
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let tenant = pick_tenant(&mut rng, tenants);
        let mut body = json!({
            "messages": [
                {"role": "system", "content": prompts[tenant]},
                {"role": "user", "content": format!("Question {} from tenant {tenant}", rng.random::<u32>())},
            ],
            "max_tokens": config.max_tokens,
            "stream": true,
            // The final usage chunk carries cached tokens: what routers record as achieved hits.
            "stream_options": {"include_usage": true},
        });
        if let Some(model) = &config.model {
            body["model"] = json!(model);
        }
        let url = if urls.len() > 1 { &urls[target_rng.random_range(0..urls.len())] } else { &urls[0] };
        let request = client.post(url).json(&body).timeout(config.request_timeout);
        let stats = stats.clone();
        let cancel = cancel.clone();
        stats.sent.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let outcome = tokio::select! {
                () = cancel.cancelled() => return,
                outcome = drain(request) => outcome,
            };
            let counter = if outcome { &stats.completed } else { &stats.failed };
            counter.fetch_add(1, Ordering::Relaxed);
            drop(permit);
        });
    }
}

/// Sends one request and reads its stream to the end; true if it ended with `[DONE]`.
async fn drain(request: reqwest::RequestBuilder) -> bool {
    let Ok(response) = request.send().await else { return false };
    if !response.status().is_success() {
        return false;
    }
    let mut body = response.bytes_stream();
    let mut tail = Vec::new();
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { return false };
        // Keep only the last few bytes: enough to see the terminal event.
        tail.extend_from_slice(&chunk);
        if tail.len() > 64 {
            tail.drain(..tail.len() - 64);
        }
    }
    tail.windows(6).any(|w| w == b"[DONE]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_popularity_is_skewed_towards_low_ids() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut counts = [0usize; 4];
        for _ in 0..4000 {
            counts[pick_tenant(&mut rng, 4)] += 1;
        }
        assert!(counts[0] > counts[1] && counts[1] > counts[3], "{counts:?}");
    }

    #[test]
    fn system_prompts_have_the_requested_size_and_differ_by_tenant() {
        assert_eq!(system_prompt(0, 1000).len(), 1000);
        assert_ne!(system_prompt(0, 100), system_prompt(1, 100));
    }
}
