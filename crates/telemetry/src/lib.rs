//! Telemetry: from an engine's `/metrics` text to normalised per-replica signals.
//!
//! - [`exposition`]: the Prometheus / OpenMetrics text parser (pure).
//! - [`engines`]: engine detection and where each engine keeps each signal (pure).
//! - [`pd`]: disaggregated prefill/decode figures (per-role queues, KV transfers) (pure).
//! - [`signals`]: readings, and signals from a window of readings (pure).
//! - [`scrape`]: fetching one endpoint with a deadline and a size cap (I/O).
//! - [`scheduler`]: scraping many targets, each on its own interval, with a concurrency limit,
//!   backoff and per-target error state (I/O).
//! - [`prometheus`]: the Prometheus HTTP API as a source: targets and the same signals (I/O).
//!
//! It knows nothing of storage or the UI; the control crate drives it.

pub mod engines;
pub mod exposition;
pub mod pd;
pub mod prometheus;
pub mod scheduler;
pub mod scrape;
pub mod signals;

pub use engines::{Engine, UnsupportedEngine, read};
pub use scheduler::{Scheduler, SchedulerConfig, TargetSpec, TargetStatus};
pub use scrape::{ScrapeError, ScrapeLimits, connect_detail, error_chain, scrape};
pub use signals::{EngineSignals, Reading, ReplicaSignals, Window};
