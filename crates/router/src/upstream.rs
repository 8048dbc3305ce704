//! The replica set and the pick: an immutable snapshot swapped atomically.
//!
//! Requests load the current [`Upstreams`] with one atomic read (arc-swap, as pingora's
//! load balancer does) and never wait on a lock; a change of the replica set builds a new
//! snapshot and swaps it in, while requests already holding the old one finish with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arc_swap::ArcSwap;

/// One immutable view of the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstreams {
    /// Replica base URLs without a trailing slash, e.g. `http://127.0.0.1:8100`.
    pub replicas: Vec<String>,
}

impl Upstreams {
    pub fn new(replicas: impl IntoIterator<Item = String>) -> Self {
        Self { replicas: replicas.into_iter().map(|r| r.trim_end_matches('/').to_string()).collect() }
    }
}

/// The live replica set plus the round-robin cursor.
#[derive(Debug)]
pub struct Balancer {
    upstreams: ArcSwap<Upstreams>,
    cursor: AtomicUsize,
}

impl Balancer {
    pub fn new(upstreams: Upstreams) -> Self {
        Self { upstreams: ArcSwap::from_pointee(upstreams), cursor: AtomicUsize::new(0) }
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Upstreams> {
        self.upstreams.load_full()
    }

    /// Replaces the replica set; in-flight requests keep the snapshot they started with.
    pub fn replace(&self, upstreams: Upstreams) {
        self.upstreams.store(Arc::new(upstreams));
    }

    /// The replicas to try for one request, in order: the round-robin pick first, then the
    /// others (the fallbacks used when the first cannot be reached).
    pub fn plan(&self, snapshot: &Upstreams) -> Vec<usize> {
        let n = snapshot.replicas.len();
        if n == 0 {
            return Vec::new();
        }
        let first = self.cursor.fetch_add(1, Ordering::Relaxed) % n;
        (0..n).map(|i| (first + i) % n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_visits_every_replica_in_turn_with_fallbacks() {
        let balancer =
            Balancer::new(Upstreams::new(["http://a/".to_string(), "http://b".into(), "http://c".into()]));
        let snapshot = balancer.snapshot();
        assert_eq!(snapshot.replicas[0], "http://a");
        let firsts: Vec<usize> = (0..6).map(|_| balancer.plan(&snapshot)[0]).collect();
        assert_eq!(firsts, [0, 1, 2, 0, 1, 2]);
        assert_eq!(balancer.plan(&snapshot), [0, 1, 2]);
    }

    #[test]
    fn an_empty_fleet_has_no_plan_and_swaps_are_seen_by_new_snapshots() {
        let balancer = Balancer::new(Upstreams::new(Vec::new()));
        let old = balancer.snapshot();
        assert!(balancer.plan(&old).is_empty());
        balancer.replace(Upstreams::new(["http://x".to_string()]));
        assert!(old.replicas.is_empty());
        assert_eq!(balancer.plan(&balancer.snapshot()), [0]);
    }
}
