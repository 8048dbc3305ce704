//! fleet-router: an OpenAI-compatible proxy in front of a fleet of LLM replicas.
//!
//! - [`upstream`]: the replica set, read on the hot path from an atomically swapped snapshot.
//! - [`proxy`]: the HTTP server: picks a replica, forwards the request, streams the answer
//!   back unbuffered.
//!
//! The router knows replicas only by base URL; it does not scrape metrics (the app does)
//! and does not persist anything.

pub mod proxy;
pub mod upstream;

pub use proxy::{RouterConfig, serve};
