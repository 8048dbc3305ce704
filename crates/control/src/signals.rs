//! Where telemetry's signals meet the app's two other vocabularies: the UI contract
//! (`fleetdeck_api::Signals`) and the history's rows (`fleet_store::SampleSignals`). Neither
//! fleet-telemetry nor fleet-store knows the other or the UI; the app translates here, at the edge.

use fleet_store::SampleSignals;
use fleet_telemetry::EngineSignals;

/// The subset of a replica's signals the UI contract carries.
pub fn to_api(signals: &EngineSignals) -> fleetdeck_api::Signals {
    fleetdeck_api::Signals {
        queue_depth: signals.queue_depth,
        running: signals.running,
        kv_usage: signals.kv_usage,
        hit_rate: signals.hit_rate,
        ttft_p50_s: signals.ttft_p50_s,
        ttft_p95_s: signals.ttft_p95_s,
        kv_transfer_s: signals.kv_transfer_mean_s,
    }
}

/// The subset of a replica's signals a history sample stores (the token rates go in the row beside).
pub fn sample_signals(signals: &EngineSignals) -> SampleSignals {
    SampleSignals {
        queue_depth: signals.queue_depth,
        running: signals.running,
        kv_usage: signals.kv_usage,
        hit_rate: signals.hit_rate,
        ttft_p50_s: signals.ttft_p50_s,
        ttft_p95_s: signals.ttft_p95_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field a distinct value, so a field copied into the wrong place shows.
    fn distinct() -> EngineSignals {
        EngineSignals {
            queue_depth: Some(1.0),
            running: Some(2.0),
            kv_usage: Some(0.3),
            hit_rate: Some(0.4),
            ttft_p50_s: Some(0.5),
            ttft_p95_s: Some(0.6),
            ttft_p99_s: Some(0.7),
            itl_p50_s: Some(0.8),
            itl_p95_s: Some(0.9),
            itl_mean_s: Some(1.1),
            prompt_tokens_per_s: Some(12.0),
            generation_tokens_per_s: Some(13.0),
            preemptions_per_s: Some(14.0),
            kv_transfer_mean_s: Some(0.015),
        }
    }

    #[test]
    fn the_ui_and_the_history_carry_the_same_values_as_telemetry() {
        let signals = distinct();
        let api = to_api(&signals);
        let expected = fleetdeck_api::Signals {
            queue_depth: Some(1.0),
            running: Some(2.0),
            kv_usage: Some(0.3),
            hit_rate: Some(0.4),
            ttft_p50_s: Some(0.5),
            ttft_p95_s: Some(0.6),
            kv_transfer_s: Some(0.015),
        };
        assert_eq!(api, expected);
        let sample = sample_signals(&signals);
        assert_eq!(
            [
                sample.queue_depth,
                sample.running,
                sample.kv_usage,
                sample.hit_rate,
                sample.ttft_p50_s,
                sample.ttft_p95_s
            ],
            [api.queue_depth, api.running, api.kv_usage, api.hit_rate, api.ttft_p50_s, api.ttft_p95_s]
        );
        // "Not provided" stays not provided, never zero.
        assert_eq!(to_api(&EngineSignals::default()), fleetdeck_api::Signals::default());
        assert_eq!(sample_signals(&EngineSignals::default()), SampleSignals::default());
    }
}
