//! The crate's one integration-test binary: data-driven engine fixtures, the scrape scheduler
//! against real HTTP endpoints, and the Prometheus source against a real Prometheus server.

#[path = "telemetry/fixtures.rs"]
mod fixtures;
#[path = "telemetry/pd.rs"]
mod pd;
#[path = "telemetry/prometheus.rs"]
mod prometheus;
#[path = "telemetry/scheduler.rs"]
mod scheduler;
