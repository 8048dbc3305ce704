//! The routers' status line above the views that read the routers (heat map, decisions,
//! headroom): one chip per router with its policy and version, or what is wrong with it.

use fleetdeck_api::RouterSource;
use leptos::prelude::*;

use crate::format;

/// One line per router: its policy and version, or what is wrong with it.
#[component]
pub fn RouterStatus(#[prop(into)] routers: Signal<Vec<RouterSource>>) -> impl IntoView {
    view! {
        <div class="router-status" data-testid="router-status">
            <For
                each=move || routers.get()
                key=|r| {
                    let (badge, text) = format::router_summary(r);
                    (r.url.clone(), badge, text, r.read_only.clone())
                }
                children=move |r| {
                    let ok = r.error.is_none();
                    let (badge, text) = format::router_summary(&r);
                    // A third-party router is shown, never hidden, with why the app cannot change it.
                    let read_only = r.read_only.clone().map(|reason| view! {
                        <span class="badge badge-read-only" data-testid="router-read-only" title=reason.clone()>"read-only"</span>
                        <span class="router-read-only-reason">{reason}</span>
                    });
                    view! {
                        <span class="router-chip" class:router-error=!ok data-testid="router-chip">
                            <span class="badge" class:badge-ok=ok class:badge-error=!ok>{badge}</span>
                            <span class="mono">{format::short_url(&r.url).to_owned()}</span>
                            <span class="router-text">{text}</span>
                            {read_only}
                        </span>
                    }
                }
            />
        </div>
    }
}
