//! Replica detail (`#/replica/ID`): history charts of TTFT p50/p95, queue depth, KV usage, hit
//! rate and tokens/s over a selectable window, with a marker wherever the policy changed.

use fleetdeck_api::{CMD_REPLICA_HISTORY, ReplicaHistory, ReplicaHistoryArgs};
use leptos::prelude::*;

use crate::chart::{Line, YUnit, history_chart_html};
use crate::components::{EmptyState, ErrorBanner};
use crate::poll::poll;
use crate::route::Route;

/// Selectable windows: (seconds, label).
const WINDOWS: [(u32, &str); 5] =
    [(300, "5 min"), (3600, "1 h"), (6 * 3600, "6 h"), (86_400, "24 h"), (7 * 86_400, "7 days")];

/// Picks a chart's labelled lines out of the history.
type PickLines = fn(&ReplicaHistory) -> Vec<(&'static str, Vec<(i64, f64)>)>;

#[component]
pub fn ReplicaView(id: u32, last_update: RwSignal<Option<i64>>) -> impl IntoView {
    let window_s = RwSignal::new(300_u32);
    let history = poll::<_, ReplicaHistory>(
        CMD_REPLICA_HISTORY,
        move || ReplicaHistoryArgs { id, window_s: window_s.get_untracked() },
        2000.0,
    );
    Effect::new(move |_| {
        if history.data.with(Option::is_some) {
            last_update.set(Some(js_sys::Date::now() as i64));
        }
    });
    let chart = move |unit: YUnit, pick: PickLines| {
        move || {
            history.data.with(|h| {
                h.as_ref()
                    .map(|h| {
                        let lines_owned = pick(h);
                        let lines: Vec<Line<'_>> =
                            lines_owned.iter().map(|(label, pts)| Line { label, points: pts }).collect();
                        let markers: Vec<(i64, String)> =
                            h.policy_changes.iter().map(|m| (m.ts_ms, m.label.clone())).collect();
                        history_chart_html(unit, &lines, &markers, h.now_ms, h.window_s)
                    })
                    .unwrap_or_default()
            })
        }
    };

    view! {
        <section class="view replica">
            <ErrorBanner error=history.error what="this replica's history" />
            <div class="card">
                <div class="card-head">
                    <h2>
                        <a href=Route::Fleet.href() class="back" data-testid="back-to-fleet">"← Fleet"</a>
                        {move || history.data.with(|h| h.as_ref().map(|h| h.url.clone()).unwrap_or_else(|| format!("Replica {id}")))}
                    </h2>
                    <span class="card-meta" data-testid="replica-meta">
                        {move || {
                            history.data.with(|h| {
                                h.as_ref()
                                    .map(|h| {
                                        format!(
                                            "{} · {} · {} policy change(s) in view · from the {} history",
                                            h.engine.as_deref().unwrap_or("engine unknown"),
                                            h.model.as_deref().unwrap_or("model unknown"),
                                            h.policy_changes.len(),
                                            h.tier
                                        )
                                    })
                                    .unwrap_or_default()
                            })
                        }}
                    </span>
                </div>
                <div class="toolbar">
                    <span>"Window "</span>
                    <div class="segmented" data-testid="window-select">
                        {WINDOWS
                            .into_iter()
                            .map(|(s, label)| {
                                view! {
                                    <button
                                        class:active=move || window_s.get() == s
                                        data-window=s.to_string()
                                        on:click=move |_| {
                                            window_s.set(s);
                                            history.refresh.update(|n| *n += 1);
                                        }
                                    >
                                        {label}
                                    </button>
                                }
                            })
                            .collect_view()}
                    </div>
                    <Show when=move || history.busy.get()>
                        <span class="muted">"loading…"</span>
                    </Show>
                </div>
                {move || {
                    (history.error.with(Option::is_some) && history.data.with(Option::is_none)).then(|| {
                        view! { <EmptyState title="This replica has no history here." hint="Pick a replica on the Fleet view (key 1); ids change when the app restarts." /> }
                    })
                }}
                <div class="chart-grid" data-testid="replica-charts">
                    <ChartCard title="TTFT p50 / p95" testid="chart-ttft" html=Signal::derive(chart(YUnit::Seconds, |h| vec![("p50", h.ttft_p50_s.clone()), ("p95", h.ttft_p95_s.clone())])) />
                    <ChartCard title="Queue depth" testid="chart-queue" html=Signal::derive(chart(YUnit::Count, |h| vec![("waiting", h.queue_depth.clone())])) />
                    <ChartCard title="KV-cache usage" testid="chart-kv" html=Signal::derive(chart(YUnit::Ratio, |h| vec![("KV usage", h.kv_usage.clone())])) />
                    <ChartCard title="Prefix hit rate" testid="chart-hit" html=Signal::derive(chart(YUnit::Ratio, |h| vec![("hit rate", h.hit_rate.clone())])) />
                    <ChartCard title="Tokens per second" testid="chart-tokens" html=Signal::derive(chart(YUnit::PerSecond, |h| vec![("prompt + generated", h.tokens_per_s.clone())])) />
                </div>
            </div>
        </section>
    }
}

#[component]
fn ChartCard(title: &'static str, testid: &'static str, html: Signal<String>) -> impl IntoView {
    view! {
        <div class="chart-card">
            <h3>{title}</h3>
            <div class="chart" data-testid=testid inner_html=move || html.get()></div>
        </div>
    }
}
