//! End-to-end tests across Fleetdeck's programs, with real HTTP on loopback port 0.
//!
//! - [`stack`]: emulated replicas behind fleet-router, driven by a real HTTP client.
//! - [`app`]: the `fleetdeck` binary in headless mode: its API, its history file, bad endpoints.
//! - [`browser`]: headless Chromium loading the headless app's UI.
//! - [`desktop`]: the real Tauri window under Xvfb, driven through tauri-driver.

mod app;
mod browser;
mod desktop;
mod probe;
mod stack;
