//! End-to-end tests across Fleetdeck's programs, with real HTTP on loopback port 0.
//!
//! - [`llamacpp`]: three real llama.cpp servers probed, watched by the app and routed to, one killed mid-stream.
//! - [`vllm`]: real vLLM servers (CPU build): prefix cache, cached tokens, metrics; the app over two of
//!   them behind two fleet-routers (every view's figures, a canary promoted and one rolled back, a server
//!   killed mid-stream). kv_precise on vLLM's KV events is in fleet-router's own tests (`vllm.rs`).
//! - [`stack`]: emulated replicas behind fleet-router, driven by a real HTTP client.
//! - [`streams`]: the shared check of a stream cut short by a replica that dies.
//! - [`app`]: the `fleetdeck` binary in headless mode: its API, its history file, bad endpoints.
//! - [`browser`]: headless Chromium loading the headless app's UI.
//! - [`rollout`]: the policy loop in Chromium: edit, what-if, push, canary rollback, history.
//! - [`desktop`]: the real Tauri window under Xvfb, driven through tauri-driver.
//! - [`package`]: the `.deb` of `cargo xtask dist`, unpacked into a clean folder, its installed
//!   binary watching emulated replicas.
//! - [`security`]: the headless app against a same-laptop attacker: no sign-in, CSRF, DNS rebinding,
//!   local files and bodies through the API, clear text beyond loopback.
//! - [`etcd`]: a fleet found through a discovery file and pushed through a real etcd key from the
//!   Push view: guarded push, a refused stale push, reload, rollback, drift.
//! - [`views`]: every view of the app in headless Chromium against the demo fleet, and the
//!   overview's render time at 1,000 replicas.

mod app;
mod browser;
mod desktop;
mod etcd;
mod llamacpp;
mod package;
mod probe;
mod rollout;
mod security;
mod stack;
mod streams;
mod views;
mod vllm;
