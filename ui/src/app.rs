//! The Leptos components: page chrome, the hash router and the live fleet view.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use fleetdeck_api::{
    ApiError, CMD_FLEET_SNAPSHOT, FleetSnapshot, FleetSnapshotArgs, ReplicaRow, ScrapeState,
};
use leptos::prelude::*;
use leptos::task::spawn_local;
use wasm_bindgen::JsValue;

use crate::route::Route;
use crate::{chart, format, transport};

/// How often the fleet view asks for a snapshot.
const POLL_INTERVAL_MS: f64 = 1000.0;
/// How far back the TTFT chart reaches.
const CHART_WINDOW_S: u32 = 300;

/// Local time minus UTC at `unix_ms`, in minutes, as the browser sees it (DST-aware).
fn utc_offset_min(unix_ms: i64) -> i32 {
    -(js_sys::Date::new(&JsValue::from_f64(unix_ms as f64)).get_timezone_offset() as i32)
}

/// `HH:MM:SS` in the operator's local time.
fn local_clock(unix_ms: i64) -> String {
    format::clock(unix_ms, utc_offset_min(unix_ms))
}

fn current_route() -> Route {
    let hash = window().location().hash().unwrap_or_default();
    Route::from_hash(&hash)
}

/// Resolves after `ms` milliseconds, without blocking the event loop.
async fn sleep_ms(ms: f64) {
    let promise = js_sys::Promise::new(&mut |resolve, _reject| {
        // If scheduling fails the promise never settles; resolving at once instead keeps the
        // poll loop alive (it would just poll faster), which beats silently stopping.
        if window().set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms as i32).is_err() {
            let _ = resolve.call0(&JsValue::UNDEFINED);
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

/// The whole page: header with nav, the current route's view, footer.
#[component]
pub fn App() -> impl IntoView {
    let route = RwSignal::new(current_route());
    // The handle is kept for the page's lifetime: the app is never unmounted.
    let _hash_listener = window_event_listener(leptos::ev::hashchange, move |_| route.set(current_route()));
    // Written by whichever view polls; the footer only reads it.
    let last_update = RwSignal::new(None::<i64>);

    view! {
        <header class="topbar">
            <div class="brand">
                <span class="logo" aria-hidden="true"></span>
                "Fleetdeck"
            </div>
            <nav class="nav">
                {Route::ALL
                    .iter()
                    .map(|&r| {
                        view! {
                            <a
                                href=r.href()
                                class:active=move || route.get() == r
                                data-testid=format!("nav-{}", r.slug())
                            >
                                {r.label()}
                            </a>
                        }
                    })
                    .collect_view()}
            </nav>
        </header>
        <main class="content">
            {move || match route.get() {
                Route::Fleet => view! { <FleetView last_update=last_update /> }.into_any(),
            }}
        </main>
        <footer class="footer" data-testid="footer">
            {move || match last_update.get() {
                Some(ms) => format!("Last update: {}", local_clock(ms)),
                None => "Last update: waiting for the first snapshot…".to_owned(),
            }}
            <span class="footer-sep">"·"</span>
            "refreshes every second"
        </footer>
    }
}

/// The live fleet: error banner, replica table and TTFT chart, refreshed by a poll loop that
/// lives exactly as long as the view.
#[component]
fn FleetView(last_update: RwSignal<Option<i64>>) -> impl IntoView {
    let snapshot = RwSignal::new(None::<FleetSnapshot>);
    let error = RwSignal::new(None::<ApiError>);

    let alive = Arc::new(AtomicBool::new(true));
    {
        let alive = Arc::clone(&alive);
        on_cleanup(move || alive.store(false, Ordering::Relaxed));
    }
    spawn_local(poll_loop(alive, snapshot, error, last_update));

    let chart_html = Memo::new(move |_| {
        snapshot.with(|s| match s {
            Some(s) => chart::chart_html(&s.ttft_p95, s.now_ms, CHART_WINDOW_S),
            None => chart::chart_html(&[], 0, CHART_WINDOW_S),
        })
    });

    view! {
        <section class="fleet">
            <Show when=move || error.with(Option::is_some)>
                <div class="banner banner-error" role="alert" data-testid="error-banner">
                    <strong>"Can't refresh the fleet. "</strong>
                    {move || error.with(|e| e.as_ref().map(|e| e.message.clone()).unwrap_or_default())}
                    <span class="banner-code">
                        {move || error.with(|e| e.as_ref().map(|e| e.code.clone()).unwrap_or_default())}
                    </span>
                </div>
            </Show>

            <div class="card">
                <div class="card-head">
                    <h2>"Replicas"</h2>
                    <span class="card-meta">
                        {move || {
                            snapshot
                                .with(|s| {
                                    s.as_ref()
                                        .map(|s| {
                                            let failing = s
                                                .replicas
                                                .iter()
                                                .filter(|r| matches!(r.scrape, ScrapeState::Error { .. }))
                                                .count();
                                            let n = s.replicas.len();
                                            let noun = if n == 1 { "replica" } else { "replicas" };
                                            if failing > 0 {
                                                format!("{n} {noun} · {failing} failing")
                                            } else {
                                                format!("{n} {noun}")
                                            }
                                        })
                                        .unwrap_or_default()
                                })
                        }}
                    </span>
                </div>
                <div class="table-wrap">
                    <table class="replicas" data-testid="replica-table">
                        <thead>
                            <tr>
                                <th>"Replica"</th>
                                <th>"Engine"</th>
                                <th>"Model"</th>
                                <th class="num">"Queue"</th>
                                <th class="num">"Running"</th>
                                <th class="num">"KV usage"</th>
                                <th class="num">"Prefix hit"</th>
                                <th class="num">"TTFT p50"</th>
                                <th class="num">"TTFT p95"</th>
                                <th>"Scrape"</th>
                            </tr>
                        </thead>
                        <tbody>
                            {move || {
                                placeholder_text(snapshot)
                                    .map(|text| {
                                        view! {
                                            <tr class="placeholder">
                                                <td colspan="10">{text}</td>
                                            </tr>
                                        }
                                    })
                            }}
                            // Keyed by URL so each replica keeps its <tr> across refreshes: cells
                            // update in place, text selection survives, and tests holding an
                            // element do not see it go stale every second.
                            <For
                                each=move || replica_urls(snapshot)
                                key=|url| url.clone()
                                children=move |url| view! { <ReplicaRowView url=url snapshot=snapshot /> }
                            />
                        </tbody>
                    </table>
                </div>
            </div>

            <div class="card">
                <div class="card-head">
                    <h2>"TTFT p95"</h2>
                    <span class="card-meta">"last 5 minutes, per replica"</span>
                </div>
                <div class="chart" data-testid="ttft-chart" inner_html=move || chart_html.get()></div>
            </div>
        </section>
    }
}

/// What the table body says when there are no rows to show.
fn placeholder_text(snapshot: RwSignal<Option<FleetSnapshot>>) -> Option<&'static str> {
    snapshot.with(|s| match s {
        None => Some("Waiting for the first snapshot…"),
        Some(s) if s.replicas.is_empty() => Some("No replicas are being watched yet."),
        Some(_) => None,
    })
}

fn replica_urls(snapshot: RwSignal<Option<FleetSnapshot>>) -> Vec<String> {
    snapshot.with(|s| s.iter().flat_map(|s| &s.replicas).map(|r| r.url.clone()).collect())
}

/// One replica's table row. Each cell reads the row through a memo, so a refresh that leaves a
/// replica unchanged touches none of its DOM.
#[component]
fn ReplicaRowView(url: String, snapshot: RwSignal<Option<FleetSnapshot>>) -> impl IntoView {
    let row = {
        let url = url.clone();
        Memo::new(move |_| {
            snapshot.with(|s| s.as_ref().and_then(|s| s.replicas.iter().find(|r| r.url == url).cloned()))
        })
    };
    // Same colour as the replica's line in the chart, which colours by series order.
    let swatch_style = {
        let url = url.clone();
        Memo::new(move |_| {
            snapshot
                .with(|s| s.as_ref().and_then(|s| s.ttft_p95.iter().position(|series| series.url == url)))
                .map(|i| format!("background:{}", chart::css_colour(i)))
                .unwrap_or_else(|| "visibility:hidden".to_owned())
        })
    };
    let signals = move || row.with(|r| r.as_ref().map(|r| r.signals).unwrap_or_default());
    let is_error =
        move || row.with(|r| matches!(r, Some(ReplicaRow { scrape: ScrapeState::Error { .. }, .. })));
    let engine = move || row.with(|r| r.as_ref().and_then(|r| r.engine.clone()));
    let model = move || row.with(|r| r.as_ref().and_then(|r| r.model.clone()));

    view! {
        <tr data-testid="replica-row" class:row-error=is_error data-url=url.clone()>
            <td class="replica">
                <span class="replica-cell">
                    <span class="swatch" style=move || swatch_style.get()></span>
                    <span class="url" title=url.clone()>{url.clone()}</span>
                </span>
            </td>
            <td class:na=move || engine().is_none()>{move || text_or_dash(engine())}</td>
            <td class="model" class:na=move || model().is_none() title=move || model().unwrap_or_default()>
                {move || text_or_dash(model())}
            </td>
            {num_cell(move || signals().queue_depth, format::count)}
            {num_cell(move || signals().running, format::count)}
            {num_cell(move || signals().kv_usage, format::percent)}
            {num_cell(move || signals().hit_rate, format::percent)}
            {num_cell(move || signals().ttft_p50_s, format::duration_s)}
            {num_cell(move || signals().ttft_p95_s, format::duration_s)}
            <td class="scrape">{move || row.with(|r| r.as_ref().map(|r| scrape_view(&r.scrape)))}</td>
        </tr>
    }
}

fn text_or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| format::NOT_PROVIDED.to_owned())
}

/// A right-aligned numeric cell. A missing signal also gets the muted `na` class, so "—" reads
/// as "not provided" rather than as a value.
fn num_cell(
    value: impl Fn() -> Option<f64> + Copy + Send + Sync + 'static,
    fmt: fn(Option<f64>) -> String,
) -> impl IntoView {
    view! { <td class="num" class:na=move || value().is_none()>{move || fmt(value())}</td> }
}

fn scrape_view(state: &ScrapeState) -> AnyView {
    match state {
        ScrapeState::Pending => view! { <span class="badge badge-pending">"pending"</span> }.into_any(),
        ScrapeState::Ok { last_good_ms } => view! {
            <span class="badge badge-ok">"ok"</span>
            <span class="scrape-time">{local_clock(*last_good_ms)}</span>
        }
        .into_any(),
        ScrapeState::Error { message, last_good_ms } => {
            let offset = last_good_ms.map(utc_offset_min).unwrap_or(0);
            let last_good = format::last_good_scrape(*last_good_ms, offset);
            view! {
                <div class="scrape-error" data-testid="scrape-error">
                    <span class="badge badge-error">"error"</span>
                    <span class="error-message" title=message.clone()>{message.clone()}</span>
                    <span class="last-good">{last_good}</span>
                </div>
            }
            .into_any()
        }
    }
}

/// Fetches a snapshot about once per [`POLL_INTERVAL_MS`] until the view goes away. Each request
/// finishes before the next starts (a slow backend slows the refresh instead of piling up calls).
async fn poll_loop(
    alive: Arc<AtomicBool>,
    snapshot: RwSignal<Option<FleetSnapshot>>,
    error: RwSignal<Option<ApiError>>,
    last_update: RwSignal<Option<i64>>,
) {
    let args = FleetSnapshotArgs { window_s: CHART_WINDOW_S };
    while alive.load(Ordering::Relaxed) {
        let started = js_sys::Date::now();
        let result = transport::call::<_, FleetSnapshot>(CMD_FLEET_SNAPSHOT, &args).await;
        // The view may have been left while the request was in flight; its signals are gone.
        if !alive.load(Ordering::Relaxed) {
            break;
        }
        match result {
            Ok(s) => {
                snapshot.set(Some(s));
                // Only notify when it changes, so the banner is not re-rendered every second.
                if error.with_untracked(Option::is_some) {
                    error.set(None);
                }
                last_update.set(Some(js_sys::Date::now() as i64));
            }
            Err(e) => error.set(Some(e)),
        }
        let elapsed = js_sys::Date::now() - started;
        sleep_ms((POLL_INTERVAL_MS - elapsed).max(0.0)).await;
    }
}
