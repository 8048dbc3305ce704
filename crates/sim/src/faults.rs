//! Fault injection: what can go wrong with a replica on demand, and the per-replica switchboard.
//!
//! Faults are set at runtime (admin API or [`crate::Fleet::set_faults`]) and read on every request
//! from an arc-swapped snapshot. Random faults draw from a per-replica seeded RNG, so a test that
//! sets a rate of 0 or 1 is exact and anything in between is reproducible for a given request order.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use arc_swap::ArcSwap;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The faults of one replica. Every field is optional in JSON; the default is "healthy".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Extra delay before any route answers (network or overload latency), in milliseconds.
    pub added_latency_ms: u64,
    /// Probability (0..=1) that a generation request fails with a 500 before its first byte.
    pub error_rate: f64,
    /// Probability (0..=1) that a generation response is cut off mid-body (the connection is
    /// dropped without the stream's terminal event or the full JSON).
    pub drop_mid_stream_rate: f64,
    /// Extra delay before the first token of every generation, in milliseconds.
    pub stall_ms: u64,
    /// `/metrics` serves text that is not valid exposition format.
    pub malformed_metrics: bool,
    /// The replica is down: its port refuses connections, and connections already open get 503s.
    pub down: bool,
    /// Probability (0..=1) that a KV transfer this (decode) replica pulls fails.
    pub kv_transfer_fail_rate: f64,
    /// The next N KV transfers this (decode) replica pulls fail (counted down from when the faults are set).
    pub kv_transfer_fail_next: u32,
}

/// Largest delay a fault may add; more is certainly a typo and would look like a hang.
pub const MAX_FAULT_DELAY_MS: u64 = 600_000;

/// A fault setting that makes no sense, naming the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid fault `{field}`: {reason}")]
pub struct FaultError {
    pub field: &'static str,
    pub reason: String,
}

impl Faults {
    /// Checks rates are probabilities and delays are bounded.
    pub fn validate(&self) -> Result<(), FaultError> {
        for (field, rate) in [
            ("error_rate", self.error_rate),
            ("drop_mid_stream_rate", self.drop_mid_stream_rate),
            ("kv_transfer_fail_rate", self.kv_transfer_fail_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(FaultError {
                    field,
                    reason: format!("{rate} is not a probability between 0 and 1"),
                });
            }
        }
        for (field, ms) in [("added_latency_ms", self.added_latency_ms), ("stall_ms", self.stall_ms)] {
            if ms > MAX_FAULT_DELAY_MS {
                return Err(FaultError {
                    field,
                    reason: format!("{ms} ms is more than the {MAX_FAULT_DELAY_MS} ms allowed"),
                });
            }
        }
        Ok(())
    }
}

/// One replica's current faults and the RNG its random faults draw from.
#[derive(Debug)]
pub struct FaultSwitch {
    current: ArcSwap<Faults>,
    rng: Mutex<SmallRng>,
    /// `down` as a watch, so the listener can close and reopen the port as it flips.
    down_tx: watch::Sender<bool>,
    /// KV transfers still to fail (`kv_transfer_fail_next`, counted down).
    transfer_failures_left: AtomicU32,
}

impl FaultSwitch {
    pub fn new(seed: u64) -> Self {
        Self {
            current: ArcSwap::from_pointee(Faults::default()),
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
            down_tx: watch::channel(false).0,
            transfer_failures_left: AtomicU32::new(0),
        }
    }

    /// The faults in force now.
    pub fn get(&self) -> std::sync::Arc<Faults> {
        self.current.load_full()
    }

    /// Replaces the faults (validated).
    pub fn set(&self, faults: Faults) -> Result<(), FaultError> {
        faults.validate()?;
        let down = faults.down;
        self.transfer_failures_left.store(faults.kv_transfer_fail_next, Ordering::SeqCst);
        self.current.store(std::sync::Arc::new(faults));
        self.down_tx.send_replace(down);
        Ok(())
    }

    /// A receiver that sees `down` flip.
    pub fn watch_down(&self) -> watch::Receiver<bool> {
        self.down_tx.subscribe()
    }

    /// Whether the KV transfer starting now fails: one of the next N set to fail, or by the failure rate.
    pub fn transfer_fails(&self) -> bool {
        let counted = self
            .transfer_failures_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1))
            .is_ok();
        counted || self.roll(self.get().kv_transfer_fail_rate)
    }

    /// True with probability `rate` (exactly never at 0 and always at 1).
    pub fn roll(&self, rate: f64) -> bool {
        if rate <= 0.0 {
            return false;
        }
        if rate >= 1.0 {
            return true;
        }
        let mut rng = self.rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        rng.random::<f64>() < rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_fields_are_optional_and_validated() {
        let faults: Faults = serde_json::from_str(r#"{"error_rate": 0.5}"#).unwrap();
        assert_eq!(faults, Faults { error_rate: 0.5, ..Faults::default() });
        assert!(serde_json::from_str::<Faults>(r#"{"eror_rate": 0.5}"#).is_err());
        let err = Faults { drop_mid_stream_rate: 1.5, ..Faults::default() }.validate().unwrap_err();
        assert_eq!(err.field, "drop_mid_stream_rate");
        assert!(Faults { stall_ms: MAX_FAULT_DELAY_MS + 1, ..Faults::default() }.validate().is_err());
    }

    #[test]
    fn rolls_are_exact_at_the_ends_and_seeded_between() {
        let a = FaultSwitch::new(1);
        let b = FaultSwitch::new(1);
        assert!(!a.roll(0.0) && a.roll(1.0));
        let rolls_a: Vec<bool> = (0..50).map(|_| a.roll(0.5)).collect();
        let rolls_b: Vec<bool> = (0..50).map(|_| b.roll(0.5)).collect();
        assert_eq!(rolls_a, rolls_b);
        assert!(rolls_a.iter().any(|&r| r) && rolls_a.iter().any(|&r| !r));
    }

    #[test]
    fn the_next_n_transfers_fail_then_the_rate_decides() {
        let switch = FaultSwitch::new(0);
        assert!(!switch.transfer_fails());
        switch.set(Faults { kv_transfer_fail_next: 2, ..Faults::default() }).unwrap();
        assert_eq!((0..4).map(|_| switch.transfer_fails()).collect::<Vec<_>>(), [true, true, false, false]);
        switch.set(Faults { kv_transfer_fail_rate: 1.0, ..Faults::default() }).unwrap();
        assert!(switch.transfer_fails() && switch.transfer_fails());
        assert!(Faults { kv_transfer_fail_rate: -0.1, ..Faults::default() }.validate().is_err());
    }

    #[test]
    fn down_is_watched() {
        let switch = FaultSwitch::new(0);
        let rx = switch.watch_down();
        switch.set(Faults { down: true, ..Faults::default() }).unwrap();
        assert!(*rx.borrow());
    }
}
