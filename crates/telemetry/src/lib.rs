//! Telemetry: from an engine's `/metrics` text to normalised per-replica signals.
//!
//! - [`exposition`]: the Prometheus / OpenMetrics text parser (pure).
//! - [`signals`]: engine detection, raw readings, and signals from two readings (pure).
//! - [`scrape`]: fetching one endpoint with a deadline and a size cap (the only I/O).
//!
//! It knows nothing of storage, scheduling or the UI; the control crate drives it.

pub mod exposition;
pub mod scrape;
pub mod signals;

pub use scrape::{ScrapeError, ScrapeLimits, scrape};
pub use signals::{Engine, Reading, derive};
