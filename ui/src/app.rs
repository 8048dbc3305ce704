//! The Leptos app: page chrome (nav, theme, keyboard), the hash router, and the helpers every
//! view shares (polling, time, empty and error states).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use fleetdeck_api::ApiError;
use leptos::prelude::*;
use leptos::task::spawn_local;
use serde::Serialize;
use serde::de::DeserializeOwned;
use wasm_bindgen::{JsCast, JsValue};

use crate::keys::{self, KeyAction};
use crate::route::Route;
use crate::views;
use crate::{format, transport};

/// Local time minus UTC at `unix_ms`, in minutes, as the browser sees it (DST-aware).
pub fn utc_offset_min(unix_ms: i64) -> i32 {
    -(js_sys::Date::new(&JsValue::from_f64(unix_ms as f64)).get_timezone_offset() as i32)
}

/// `HH:MM:SS` in the operator's local time.
pub fn local_clock(unix_ms: i64) -> String {
    format::clock(unix_ms, utc_offset_min(unix_ms))
}

pub fn current_hash() -> String {
    window().location().hash().unwrap_or_default()
}

fn current_route() -> Route {
    Route::from_hash(&current_hash())
}

/// `performance.now()`, in milliseconds.
pub fn perf_now() -> f64 {
    window().performance().map(|p| p.now()).unwrap_or_else(js_sys::Date::now)
}

/// Resolves after `ms` milliseconds, without blocking the event loop.
pub async fn sleep_ms(ms: f64) {
    let promise = js_sys::Promise::new(&mut |resolve, _reject| {
        // If scheduling fails the promise never settles; resolving at once instead keeps the
        // poll loop alive (it would just poll faster), which beats silently stopping.
        if window().set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms as i32).is_err() {
            let _ = resolve.call0(&JsValue::UNDEFINED);
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

/// The result of a command that a view refreshes in the background.
pub struct Polled<T: Send + Sync + 'static> {
    pub data: RwSignal<Option<T>>,
    pub error: RwSignal<Option<ApiError>>,
    /// A call is in flight.
    pub busy: RwSignal<bool>,
    /// Bump to refresh now (after the arguments changed).
    pub refresh: RwSignal<u64>,
}

impl<T: Send + Sync + 'static> Clone for Polled<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Send + Sync + 'static> Copy for Polled<T> {}

/// Calls `cmd` with `args()` every `every_ms` (and at once when `refresh` is bumped) for as long
/// as the calling view lives. Calls never overlap: a slow backend slows the refresh instead of
/// piling up requests. `every_ms` of 0 calls only once and on refresh.
pub fn poll<A, R>(cmd: &'static str, args: impl Fn() -> A + 'static, every_ms: f64) -> Polled<R>
where
    A: Serialize + 'static,
    R: DeserializeOwned + Send + Sync + 'static,
{
    let polled = Polled {
        data: RwSignal::new(None::<R>),
        error: RwSignal::new(None),
        busy: RwSignal::new(false),
        refresh: RwSignal::new(0),
    };
    let alive = Arc::new(AtomicBool::new(true));
    {
        let alive = Arc::clone(&alive);
        on_cleanup(move || alive.store(false, Ordering::Relaxed));
    }
    spawn_local(async move {
        while alive.load(Ordering::Relaxed) {
            let started = perf_now();
            let generation = polled.refresh.get_untracked();
            polled.busy.set(true);
            let result = transport::call::<_, R>(cmd, &args()).await;
            // The view may have been left while the request was in flight; its signals are gone.
            if !alive.load(Ordering::Relaxed) {
                break;
            }
            polled.busy.set(false);
            match result {
                Ok(value) => {
                    polled.data.set(Some(value));
                    if polled.error.with_untracked(Option::is_some) {
                        polled.error.set(None);
                    }
                }
                Err(e) => polled.error.set(Some(e)),
            }
            // Sleep in short slices so a refresh request is answered promptly.
            loop {
                if !alive.load(Ordering::Relaxed) {
                    return;
                }
                let refreshed = polled.refresh.get_untracked() != generation;
                let due = every_ms > 0.0 && perf_now() - started >= every_ms;
                if refreshed || due {
                    break;
                }
                sleep_ms(100.0).await;
            }
        }
    });
    polled
}

/// The red banner a view shows when its command fails, with the code for bug reports.
#[component]
pub fn ErrorBanner(error: RwSignal<Option<ApiError>>, #[prop(into)] what: String) -> impl IntoView {
    view! {
        <Show when=move || error.with(Option::is_some)>
            <div class="banner banner-error" role="alert" data-testid="error-banner">
                <strong>{format!("Can't refresh {what}. ")}</strong>
                {move || error.with(|e| e.as_ref().map(|e| e.message.clone()).unwrap_or_default())}
                <span class="banner-code">
                    {move || error.with(|e| e.as_ref().map(|e| e.code.clone()).unwrap_or_default())}
                </span>
            </div>
        </Show>
    }
}

/// A view's "nothing to show" panel: what is missing and what to do about it.
#[component]
pub fn EmptyState(#[prop(into)] title: String, #[prop(into)] hint: String) -> impl IntoView {
    view! {
        <div class="empty-state" data-testid="empty-state">
            <strong>{title}</strong>
            <span>{hint}</span>
        </div>
    }
}

/// A spinner with a sentence, for work that takes a while.
#[component]
pub fn Progress(#[prop(into)] text: Signal<String>) -> impl IntoView {
    view! {
        <div class="progress" role="status" data-testid="progress">
            <span class="spinner" aria-hidden="true"></span>
            {move || text.get()}
        </div>
    }
}

const THEME_KEY: &str = "fleetdeck.theme";

fn stored_theme() -> Option<String> {
    window().local_storage().ok().flatten()?.get_item(THEME_KEY).ok().flatten()
}

/// The system's preference when the operator has not chosen.
fn prefers_dark() -> bool {
    window().match_media("(prefers-color-scheme: dark)").ok().flatten().is_some_and(|m| m.matches())
}

fn apply_theme(dark: bool) {
    if let Some(root) = document().document_element() {
        let _ = root.set_attribute("data-theme", if dark { "dark" } else { "light" });
    }
    if let Ok(Some(storage)) = window().local_storage() {
        let _ = storage.set_item(THEME_KEY, if dark { "dark" } else { "light" });
    }
}

/// Whether the key press came from a field the operator is typing into.
fn typing(ev: &web_sys::KeyboardEvent) -> bool {
    ev.target()
        .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
        .is_some_and(|el| matches!(el.tag_name().as_str(), "INPUT" | "TEXTAREA" | "SELECT"))
}

/// The whole page: header with nav and theme switch, the current route's view, footer.
#[component]
pub fn App() -> impl IntoView {
    let route = RwSignal::new(current_route());
    // The handles are kept for the page's lifetime: the app is never unmounted.
    let _hash_listener = window_event_listener(leptos::ev::hashchange, move |_| route.set(current_route()));
    // Written by whichever view polls; the footer only reads it.
    let last_update = RwSignal::new(None::<i64>);
    let dark = RwSignal::new(stored_theme().map(|t| t == "dark").unwrap_or_else(prefers_dark));
    Effect::new(move |_| apply_theme(dark.get()));

    let after_g = RwSignal::new(false);
    let _keys = window_event_listener(leptos::ev::keydown, move |ev: web_sys::KeyboardEvent| {
        if ev.ctrl_key() || ev.meta_key() || ev.alt_key() || typing(&ev) {
            return;
        }
        let prefix = after_g.get_untracked();
        after_g.set(false);
        match keys::action(&ev.key(), prefix) {
            Some(KeyAction::Go(r)) => {
                ev.prevent_default();
                let _ = window().location().set_hash(&r.href());
            }
            Some(KeyAction::ToggleTheme) => dark.update(|d| *d = !*d),
            Some(KeyAction::Prefix) => after_g.set(true),
            Some(KeyAction::FocusFilter) => {
                if let Some(el) = document()
                    .query_selector("[data-filter]")
                    .ok()
                    .flatten()
                    .and_then(|e| e.dyn_into::<web_sys::HtmlElement>().ok())
                {
                    ev.prevent_default();
                    let _ = el.focus();
                }
            }
            None => {}
        }
    });

    view! {
        <header class="topbar">
            <div class="brand">
                <span class="logo" aria-hidden="true"></span>
                "Fleetdeck"
            </div>
            <nav class="nav">
                {Route::NAV
                    .iter()
                    .enumerate()
                    .map(|(i, &r)| {
                        view! {
                            <a
                                href=r.href()
                                class:active=move || r.nav_active(route.get())
                                data-testid=format!("nav-{}", r.slug())
                                title=format!("{} (key {} or g {})", r.label(), i + 1, r.key())
                            >
                                {r.label()}
                            </a>
                        }
                    })
                    .collect_view()}
            </nav>
            <button
                class="theme-toggle"
                data-testid="theme-toggle"
                title="Switch between light and dark (key t)"
                on:click=move |_| dark.update(|d| *d = !*d)
            >
                {move || if dark.get() { "☀ Light" } else { "☾ Dark" }}
            </button>
        </header>
        <main class="content">
            {move || match route.get() {
                Route::Fleet => view! { <views::fleet::FleetView last_update=last_update /> }.into_any(),
                Route::Heat => view! { <views::heat::HeatView last_update=last_update /> }.into_any(),
                Route::Replica(id) => {
                    view! { <views::replica::ReplicaView id=id last_update=last_update /> }.into_any()
                }
                Route::Decisions => {
                    view! { <views::decisions::DecisionsView last_update=last_update /> }.into_any()
                }
                Route::Headroom => {
                    view! { <views::headroom::HeadroomView last_update=last_update /> }.into_any()
                }
                Route::Settings => view! { <views::settings::SettingsView /> }.into_any(),
                Route::Policy => view! { <views::policy::PolicyView /> }.into_any(),
                Route::WhatIf => view! { <views::whatif::WhatIfView /> }.into_any(),
                Route::Push => view! { <views::push::PushView /> }.into_any(),
                Route::History => view! { <views::history::HistoryView /> }.into_any(),
            }}
        </main>
        <footer class="footer" data-testid="footer">
            {move || match last_update.get() {
                Some(ms) => format!("Last update: {}", local_clock(ms)),
                None => "Last update: waiting for the first answer…".to_owned(),
            }}
            <span class="footer-sep">"·"</span>
            {keys::HELP}
        </footer>
    }
}
