//! Synthetic replicas for exercising the overview at fleet sizes one laptop cannot emulate
//! (1,000 replicas and more). Deterministic: a row depends only on its index and the second it
//! is asked for, so values change every second like a live fleet and tests can reproduce them.
//! They are never scraped or stored, and their URLs say what they are.

use fleetdeck_api::{ReplicaRow, ScrapeState, Signals};

/// Ids of synthetic rows start here, far above any real target's id.
pub const FIRST_ID: u32 = 1 << 24;

/// splitmix64: a well-mixed 64-bit hash of its input.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A uniform value in 0..1 from `(index, second, salt)`.
fn unit(index: u32, second: i64, salt: u64) -> f64 {
    let h = mix(u64::from(index) ^ (second as u64).rotate_left(32) ^ salt.wrapping_mul(0x1000_0000_01b3));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// `n` synthetic rows as of `now_ms`. One in 97 is failing, with a last good scrape a minute ago.
pub fn rows(n: u32, now_ms: i64) -> Vec<ReplicaRow> {
    let second = now_ms.div_euclid(1000);
    (0..n)
        .map(|i| {
            // A per-replica base (stable) plus a per-second wobble (moving).
            let base = unit(i, 0, 1);
            let wobble = unit(i, second, 2);
            let queue = (base * 12.0 + wobble * 6.0).floor();
            let signals = Signals {
                queue_depth: Some(queue),
                running: Some((8.0 + base * 24.0).floor()),
                kv_usage: Some((0.2 + 0.6 * base + 0.2 * wobble).min(1.0)),
                hit_rate: Some((0.1 + 0.7 * unit(i, 0, 3) + 0.1 * wobble).min(1.0)),
                ttft_p50_s: Some(0.04 + 0.3 * base + 0.05 * wobble),
                ttft_p95_s: Some(0.1 + 0.9 * base + 0.3 * wobble),
                kv_transfer_s: None,
            };
            let scrape = if i % 97 == 96 {
                ScrapeState::Error {
                    message: "synthetic: connection refused".to_owned(),
                    last_good_ms: Some(second * 1000 - 60_000),
                }
            } else {
                ScrapeState::Ok { last_good_ms: second * 1000 }
            };
            ReplicaRow {
                id: FIRST_ID + i,
                url: format!("synthetic://replica-{i:05}"),
                engine: Some(if i % 3 == 0 { "sglang" } else { "vllm" }.to_owned()),
                model: Some(
                    if i % 5 == 0 { "Qwen/Qwen2.5-7B-Instruct" } else { fleet_sim::DEFAULT_MODEL }.to_owned(),
                ),
                signals,
                scrape,
                tokens_per_s: Some(500.0 + 4000.0 * base * (0.8 + 0.4 * wobble)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_reproducible_move_each_second_and_stay_in_range() {
        let a = rows(1000, 5_000_000);
        assert_eq!(a, rows(1000, 5_000_999), "same second, same rows");
        let b = rows(1000, 5_001_000);
        assert_ne!(a, b, "a new second moves the numbers");
        assert_eq!(a.len(), 1000);
        assert!(a.iter().all(|r| {
            let s = r.signals;
            (0.0..=1.0).contains(&s.kv_usage.unwrap()) && (0.0..=1.0).contains(&s.hit_rate.unwrap())
        }));
        assert_eq!(a.iter().filter(|r| matches!(r.scrape, ScrapeState::Error { .. })).count(), 10);
        let ids: std::collections::HashSet<u32> = a.iter().map(|r| r.id).collect();
        assert_eq!(ids.len(), 1000);
    }
}
