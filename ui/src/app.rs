//! The app's shell: the page chrome (nav, footer), the hash router that picks the view, the light
//! and dark theme, and the keyboard shortcuts. What the views share lives in modules of its own.

use leptos::prelude::*;
use wasm_bindgen::JsCast;

use crate::clock::local_clock;
use crate::keys::{self, KeyAction};
use crate::route::{self, Route};
use crate::views;

fn current_route() -> Route {
    Route::from_hash(&route::current_hash())
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
                Route::Pd => view! { <views::pd::PdFleetView last_update=last_update /> }.into_any(),
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
