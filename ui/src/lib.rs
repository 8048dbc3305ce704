//! Fleetdeck's UI: a Leptos (client-side rendered) app, compiled to wasm32 and loaded by
//! `index.html` through wasm-bindgen's `--target web` output (`ui.js` calls [`start`] on `init()`).
//!
//! The pure modules ([`format`], [`chart`], [`route`], [`keys`], [`tiles`]) build on any target
//! so their tests run on the host; everything that needs a browser is compiled for wasm32 only:
//! the shell (`app`), one module per view (`views`, none importing another) and what views share,
//! each in a module of its own: `components` (error banner, empty state, progress), `poll`
//! (background refresh of a command), `clock` (the browser's clocks), `candidate` (the candidate
//! spec in local storage, checked as it is typed), `policy_diff` (diff rows and drift badges),
//! `router_status` (the routers' status line) and `transport` (calling the backend).

pub mod chart;
pub mod format;
pub mod keys;
pub mod overlay;
pub mod route;
pub mod tiles;

#[cfg(target_arch = "wasm32")]
mod app;
#[cfg(target_arch = "wasm32")]
mod candidate;
#[cfg(target_arch = "wasm32")]
mod clock;
#[cfg(target_arch = "wasm32")]
mod components;
#[cfg(target_arch = "wasm32")]
mod policy_diff;
#[cfg(target_arch = "wasm32")]
mod poll;
#[cfg(target_arch = "wasm32")]
mod router_status;
#[cfg(target_arch = "wasm32")]
pub mod transport;
#[cfg(target_arch = "wasm32")]
mod views;

#[cfg(test)]
mod view_independence;

/// Entry point run by wasm-bindgen's `init()`: mounts the app onto `<body>`.
#[cfg(target_arch = "wasm32")]
#[wasm_bindgen::prelude::wasm_bindgen(start)]
pub fn start() {
    // Without a hook a Rust panic surfaces as an opaque "unreachable" trap; this puts the panic
    // message in the devtools console instead.
    std::panic::set_hook(Box::new(|info| web_sys::console::error_1(&info.to_string().into())));
    leptos::mount::mount_to_body(app::App);
}
