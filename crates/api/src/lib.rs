//! The UI contract: commands the UI may call and the JSON shapes they return.
//!
//! Both transports carry exactly these types: the Tauri shell through `invoke(COMMAND, args)`
//! and the headless server through `POST /api/COMMAND` with `args` as the JSON body. Errors
//! cross either transport as [`ApiError`] (`{code, message}`), so the UI has one error path.
//!
//! One module per concept, matching the control crate's handles: [`fleet`] (the watched replicas),
//! [`routers`] (what the routers report: heat, decisions, headroom), [`settings`], [`demo`], [`policy`]
//! (the editor), [`rollout`] (push and canary), [`whatif`], [`audit`] (policy history and comparisons) and
//! [`etcd`] (the fleet's policy key). Everything is re-exported at the root.
//!
//! This crate is deliberately tiny and dependency-free beyond serde: it is compiled to wasm
//! for the UI and natively for everything else.

use serde::{Deserialize, Serialize};

pub mod audit;
pub mod demo;
pub mod etcd;
pub mod fleet;
pub mod policy;
pub mod rollout;
pub mod routers;
pub mod settings;
pub mod whatif;

pub use audit::*;
pub use demo::*;
pub use etcd::*;
pub use fleet::*;
pub use policy::*;
pub use rollout::*;
pub use routers::*;
pub use settings::*;
pub use whatif::*;

/// An error as the UI receives it: a stable machine-readable code and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// Stable, snake_case (e.g. `bad_request`, `unknown_command`, `internal`).
    pub code: String,
    /// What went wrong and how to fix it.
    pub message: String,
}

impl ApiError {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into() }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ApiError {}
