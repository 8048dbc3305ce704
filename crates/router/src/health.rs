//! Health with hysteresis: a pure state machine fed by active probes and passive request outcomes.
//!
//! A replica leaves rotation after `fall` consecutive failures (probe failures, connect errors, 5xx before the
//! first byte, streams that die) and returns after `rise` consecutive successful probes. One failure or one
//! success alone never flips it, so a single slow probe or a single bad request does not make it flap.

/// One replica's health state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthTracker {
    healthy: bool,
    consecutive_failures: u32,
    consecutive_successes: u32,
    fall: u32,
    rise: u32,
}

impl HealthTracker {
    /// A tracker that starts healthy (a replica gets traffic until it proves otherwise).
    pub fn new(fall: u32, rise: u32) -> Self {
        Self {
            healthy: true,
            consecutive_failures: 0,
            consecutive_successes: 0,
            fall: fall.max(1),
            rise: rise.max(1),
        }
    }

    /// Whether the replica is in rotation.
    pub fn healthy(&self) -> bool {
        self.healthy
    }

    /// Records one outcome; returns the new state when it changed.
    pub fn observe(&mut self, success: bool) -> Option<bool> {
        if success {
            self.consecutive_failures = 0;
            self.consecutive_successes = self.consecutive_successes.saturating_add(1);
            if !self.healthy && self.consecutive_successes >= self.rise {
                self.healthy = true;
                return Some(true);
            }
        } else {
            self.consecutive_successes = 0;
            self.consecutive_failures = self.consecutive_failures.saturating_add(1);
            if self.healthy && self.consecutive_failures >= self.fall {
                self.healthy = false;
                return Some(false);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flips_only_after_consecutive_outcomes() {
        let mut health = HealthTracker::new(2, 3);
        assert!(health.healthy());
        assert_eq!(health.observe(false), None);
        assert_eq!(health.observe(true), None, "a success resets the failure run");
        assert_eq!(health.observe(false), None);
        assert_eq!(health.observe(false), Some(false));
        assert_eq!(health.observe(false), None, "already down");
        assert_eq!(health.observe(true), None);
        assert_eq!(health.observe(true), None);
        assert_eq!(health.observe(false), None, "a failure resets the success run");
        assert_eq!(health.observe(true), None);
        assert_eq!(health.observe(true), None);
        assert_eq!(health.observe(true), Some(true));
        assert!(health.healthy());
    }
}
