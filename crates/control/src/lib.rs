//! The control crate: everything the Fleetdeck app does, with no UI and no transport.
//!
//! - [`fleet`]: the watched replicas, the scrape loop and the live snapshot.
//! - [`admin`]: the fleet-router admin API client (bounded calls, lenient wire shapes).
//! - [`routers`]: the routers the app reads, their cached states and observed policy changes.
//! - [`third_party`]: SGLang's SMG and vllm-router read as routers too (workers, own metrics; read-only).
//! - [`heat`], [`headroom`]: pure computations behind the heat map and headroom views.
//! - [`views`]: the commands of the heat map, replica detail, decisions, headroom and settings.
//! - [`sources`]: Prometheus servers as a source of replicas; [`discovery`]: replicas and routers from a
//!   watched file (Prometheus file_sd, JSON or YAML) or DNS SRV records ([`dns_srv`]).
//! - [`settings`]: endpoints added in the app, persisted beside the history (tokens in 0600 files).
//! - [`synthetic`]: deterministic synthetic replicas for large-fleet UI checks.
//! - [`policy_edit`], [`rollout`], [`whatif`], [`history_compare`]: change the fleet safely: edit and
//!   validate a policy, preview it by replay, push it with compare-and-swap, canary it, compare history.
//! - [`policy_store`]: the fleet's policy in etcd: guarded push and rollback of the key routers watch, drift
//!   of every router against its key.
//! - [`demo`]: the embedded demo fleet (emulated replicas, a router, steady traffic).
//!
//! The Tauri shell and the headless HTTP server both run the UI's commands through
//! [`commands::dispatch`] (one table: command name -> [`Control`] method) and pass the results (or
//! [`fleetdeck_api::ApiError`]) through unchanged; no command logic lives in either adapter.

pub mod admin;
pub mod commands;
pub mod demo;
pub mod discovery;
pub mod dns_srv;
pub mod engine_profile;
pub mod fidelity;
pub mod fleet;
pub mod headroom;
pub mod heat;
pub mod history_compare;
pub mod history_writer;
pub mod policy_edit;
pub mod policy_store;
pub mod rollout;
pub mod routers;
pub mod settings;
pub mod signals;
pub mod sources;
pub mod synthetic;
pub mod third_party;
pub mod views;
pub mod whatif;

pub use discovery::DiscoverySource;
pub use fleet::{Control, ControlConfig};
/// The etcd client the app and fleet-router share (its config types are part of [`PolicyStoreConfig`]).
pub use fleet_etcd;
pub use policy_store::PolicyStoreConfig;
pub use routers::RouterTarget;

/// Locks a mutex of the control state, through poisoning: every such state is replaced in whole
/// assignments, so a panic elsewhere cannot leave it torn, and one panicked task must not take the app down.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
