//! The control crate: everything the Fleetdeck app does, with no UI and no transport.
//!
//! - [`fleet`]: the watched replicas, the scrape loop and the live snapshot.
//! - [`demo`]: the embedded demo fleet (emulated replicas, a router, steady traffic).
//!
//! The Tauri shell and the headless HTTP server call [`Control`]'s methods and pass their
//! results (or [`fleetdeck_api::ApiError`]) through unchanged; no command logic lives in
//! either adapter.

pub mod demo;
pub mod fleet;

pub use fleet::{Control, ControlConfig};
