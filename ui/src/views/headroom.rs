//! Headroom (`#/headroom`): per model, the hit rate the fleet achieved on its recent recorded
//! traffic next to the achievable one: the pooled bound (one shared cache that never evicts)
//! and the best policy's what-if result where a replay ran.

use fleetdeck_api::{CMD_HEADROOM, Headroom, HeadroomArgs, ModelHeadroom};
use leptos::prelude::*;

use crate::clock::perf_now;
use crate::components::{EmptyState, ErrorBanner, Progress};
use crate::format;
use crate::poll::poll;
use crate::router_status::RouterStatus;

/// Each refresh replays the traffic under several policies: not more often than this.
const POLL_INTERVAL_MS: f64 = 30_000.0;
const WINDOWS: [(u32, &str); 4] = [(120, "2 min"), (600, "10 min"), (3600, "1 h"), (6 * 3600, "6 h")];

#[component]
pub fn HeadroomView(last_update: RwSignal<Option<i64>>) -> impl IntoView {
    let window_s = RwSignal::new(600_u32);
    let headroom = poll::<_, Headroom>(
        CMD_HEADROOM,
        move || HeadroomArgs { window_s: window_s.get_untracked() },
        POLL_INTERVAL_MS,
    );
    Effect::new(move |_| {
        if headroom.data.with(Option::is_some) {
            last_update.set(Some(js_sys::Date::now() as i64));
        }
    });
    // Seconds the current computation has taken, ticking while it runs.
    let started = RwSignal::new(0.0_f64);
    let elapsed = RwSignal::new(0.0_f64);
    Effect::new(move |_| {
        if headroom.busy.get() {
            started.set(perf_now());
        }
    });
    let ticker = leptos::prelude::set_interval_with_handle(
        move || {
            if headroom.busy.get_untracked() {
                elapsed.set((perf_now() - started.get_untracked()) / 1000.0);
            }
        },
        std::time::Duration::from_millis(250),
    )
    .ok();
    on_cleanup(move || {
        if let Some(t) = ticker {
            t.clear();
        }
    });

    view! {
        <section class="view headroom-view">
            <ErrorBanner error=headroom.error what="the headroom" />
            <RouterStatus routers=Signal::derive(move || headroom.data.with(|h| h.as_ref().map(|h| h.routers.clone()).unwrap_or_default())) />
            <div class="card">
                <div class="card-head">
                    <h2>"Headroom: achieved vs achievable prefix hit rate"</h2>
                    <span class="card-meta">"token-weighted, from the routers' recorded traffic"</span>
                </div>
                <div class="toolbar">
                    <span>"Recorded traffic of the last "</span>
                    <div class="segmented" data-testid="headroom-window">
                        {WINDOWS
                            .into_iter()
                            .map(|(s, label)| view! {
                                <button
                                    class:active=move || window_s.get() == s
                                    on:click=move |_| {
                                        window_s.set(s);
                                        headroom.refresh.update(|n| *n += 1);
                                    }
                                >
                                    {label}
                                </button>
                            })
                            .collect_view()}
                    </div>
                    <button data-testid="headroom-recompute" on:click=move |_| headroom.refresh.update(|n| *n += 1)>"Recompute"</button>
                    <Show when=move || headroom.busy.get()>
                        <Progress text=Signal::derive(move || format!("computing over the recorded traffic… {:.1} s", elapsed.get())) />
                    </Show>
                </div>
                <div class="headroom" data-testid="headroom">
                    {move || {
                        headroom.data.with(|h| match h {
                            None => view! { <EmptyState title="Computing…" hint="Fetching the routers' recorded traffic and replaying it through a pooled cache." /> }.into_any(),
                            Some(h) if h.routers.is_empty() => view! {
                                <EmptyState title="No router is configured." hint="Headroom is computed from a router's recorded traffic: add a fleet-router with its admin token in Settings (key 5)." />
                            }.into_any(),
                            Some(h) if h.models.is_empty() => view! {
                                <EmptyState title="No recorded traffic in this window." hint="Send requests through the router, or pick a longer window." />
                            }.into_any(),
                            Some(h) => {
                                let rows = h.models.iter().map(model_row).collect_view();
                                let notes = h.notes.iter().map(|n| view! { <li>{n.clone()}</li> }).collect_view();
                                view! {
                                    <table class="replicas headroom-table">
                                        <thead>
                                            <tr>
                                                <th>"Model"</th>
                                                <th class="num">"Requests"</th>
                                                <th class="num">"Prompt tokens"</th>
                                                <th>"Hit rate: achieved · best policy · pooled bound"</th>
                                                <th class="num">"Left on the table"</th>
                                            </tr>
                                        </thead>
                                        <tbody>{rows}</tbody>
                                    </table>
                                    <ul class="notes">{notes}</ul>
                                }.into_any()
                            }
                        })
                    }}
                </div>
            </div>
        </section>
    }
}

fn bar(class: &'static str, value: Option<f64>, label: String, testid: &'static str) -> impl IntoView {
    let width = value.map(|v| (v.clamp(0.0, 1.0) * 100.0).to_string()).unwrap_or_else(|| "0".to_owned());
    view! {
        <div class="bar-row">
            <span class="bar-label">{label}</span>
            <span class="bar-track"><span class=format!("bar {class}") style=format!("width:{width}%")></span></span>
            <span class="bar-value num" data-testid=testid>{format::percent(value)}</span>
        </div>
    }
}

fn model_row(m: &ModelHeadroom) -> impl IntoView {
    // Achieved is measured on the requests that reported cached tokens; compare it with the
    // bound of those same requests.
    let partial = m.measured_requests < m.requests;
    let gap = match (m.achieved, m.pooled_bound_measured) {
        (Some(a), Some(b)) => format!("{:.1} pts", (b - a).max(0.0) * 100.0),
        _ => format::NOT_PROVIDED.to_owned(),
    };
    let best_label = match &m.best_policy {
        Some(p) => format!("best policy ({p})"),
        None => "best policy (no replay)".to_owned(),
    };
    let achieved_label = if partial {
        format!("achieved ({} of {} requests reported usage)", m.measured_requests, m.requests)
    } else {
        "achieved".to_owned()
    };
    view! {
        <tr data-testid="headroom-model">
            <td class="model">{m.model.clone()}</td>
            <td class="num">{m.requests}</td>
            <td class="num">{m.prompt_tokens}</td>
            <td class="bars">
                {bar("bar-achieved", m.achieved, achieved_label, "achieved")}
                {partial.then(|| bar("bar-bound", m.pooled_bound_measured, "pooled bound, same requests".to_owned(), "pooled-bound-measured"))}
                {bar("bar-best", m.best_policy_hit_rate, best_label, "best-policy")}
                {bar("bar-bound", m.pooled_bound, "pooled bound".to_owned(), "pooled-bound")}
            </td>
            <td class="num">{gap}</td>
        </tr>
    }
}
