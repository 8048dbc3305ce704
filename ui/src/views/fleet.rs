//! Fleet overview (`#/fleet`): a tile per replica coloured by the chosen signal, with sort and
//! filter, then (for fleets small enough to read row by row) the replica table and TTFT chart.
//!
//! Built for 1,000+ replicas: tiles are keyed by replica id in a `<For>`, so a refresh updates
//! text and colours in place instead of rebuilding the grid, and each tile reads its row from a
//! map rather than scanning the list. Every refresh's render time (from setting the new
//! snapshot until the DOM is updated and laid out) is appended to
//! `window.__fleetdeck_render` as `{ms, rows}`, which the end-to-end test reads.

use std::collections::HashMap;

use fleetdeck_api::{
    AddEndpointArgs, ApiError, CMD_ADD_ENDPOINT, CMD_FLEET_SNAPSHOT, CMD_START_DEMO, DemoStarted,
    EndpointKind, FleetSnapshot, FleetSnapshotArgs, ProbeReport, ReplicaRow, ScrapeState, StartDemoArgs,
};
use leptos::prelude::*;
use leptos::task::spawn_local;
use wasm_bindgen::{JsCast, JsValue};

use crate::clock::{local_clock, perf_now, sleep_ms, utc_offset_min};
use crate::components::{EmptyState, ErrorBanner, Progress};
use crate::route::{Route, query_param};
use crate::tiles::{self, SortBy, TileSignal};
use crate::{chart, format, transport};

/// How often the overview asks for a snapshot.
const POLL_INTERVAL_MS: f64 = 1000.0;
/// How far back the TTFT chart reaches.
const CHART_WINDOW_S: u32 = 300;
/// Above this many replicas the per-row table and chart are left out (the grid is the view).
const TABLE_MAX_ROWS: usize = 64;

/// Appends one render measurement to `window.__fleetdeck_render`.
fn record_render(ms: f64, rows: usize) {
    let window = window();
    let key = JsValue::from_str("__fleetdeck_render");
    let list = js_sys::Reflect::get(&window, &key)
        .ok()
        .filter(js_sys::Array::is_array)
        // `Array::from` would be JS `Array.from`, a copy; the list itself must grow.
        .map(|v| v.unchecked_into::<js_sys::Array>())
        .unwrap_or_else(|| {
            let list = js_sys::Array::new();
            let _ = js_sys::Reflect::set(&window, &key, &list);
            list
        });
    let entry = js_sys::Object::new();
    let _ = js_sys::Reflect::set(&entry, &"ms".into(), &JsValue::from_f64(ms));
    let _ = js_sys::Reflect::set(&entry, &"rows".into(), &JsValue::from_f64(rows as f64));
    list.push(&entry);
}

#[component]
pub fn FleetView(last_update: RwSignal<Option<i64>>) -> impl IntoView {
    let snapshot = RwSignal::new(None::<FleetSnapshot>);
    let by_id = RwSignal::new(HashMap::<u32, ReplicaRow>::new());
    let error = RwSignal::new(None);
    let signal = RwSignal::new(TileSignal::default());
    let sort = RwSignal::new(SortBy::default());
    let filter = RwSignal::new(String::new());
    let errors_only = RwSignal::new(false);
    let synthetic: u32 =
        query_param(&crate::route::current_hash(), "synthetic").and_then(|v| v.parse().ok()).unwrap_or(0);

    let alive = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    {
        let alive = alive.clone();
        on_cleanup(move || alive.store(false, std::sync::atomic::Ordering::Relaxed));
    }
    spawn_local(async move {
        use std::sync::atomic::Ordering;
        while alive.load(Ordering::Relaxed) {
            let started = perf_now();
            let small =
                snapshot.with_untracked(|s| s.as_ref().is_none_or(|s| s.replicas.len() <= TABLE_MAX_ROWS));
            let args = FleetSnapshotArgs { window_s: CHART_WINDOW_S, synthetic, skip_series: !small };
            let result = transport::call::<_, FleetSnapshot>(CMD_FLEET_SNAPSHOT, &args).await;
            if !alive.load(Ordering::Relaxed) {
                break;
            }
            match result {
                Ok(s) => {
                    let rows = s.replicas.len();
                    let t0 = perf_now();
                    by_id.set(s.replicas.iter().map(|r| (r.id, r.clone())).collect());
                    snapshot.set(Some(s));
                    // Reactive updates run as microtasks; a zero timeout fires after all of
                    // them, and reading a layout property makes the browser lay out the page.
                    sleep_ms(0.0).await;
                    let _ = document().body().map(|b| b.offset_height());
                    record_render(perf_now() - t0, rows);
                    if error.with_untracked(Option::is_some) {
                        error.set(None);
                    }
                    last_update.set(Some(js_sys::Date::now() as i64));
                }
                Err(e) => error.set(Some(e)),
            }
            sleep_ms((POLL_INTERVAL_MS - (perf_now() - started)).max(0.0)).await;
        }
    });

    let visible = Memo::new(move |_| {
        let (signal, sort, errors_only) = (signal.get(), sort.get(), errors_only.get());
        filter.with(|f| {
            snapshot.with(|s| {
                s.as_ref()
                    .map(|s| tiles::visible_ids(&s.replicas, signal, sort, f, errors_only))
                    .unwrap_or_default()
            })
        })
    });
    let scale_max = Memo::new(move |_| {
        let signal = signal.get();
        snapshot.with(|s| s.as_ref().map(|s| tiles::fleet_max(&s.replicas, signal)).unwrap_or(0.0))
    });
    let small =
        Memo::new(move |_| snapshot.with(|s| s.as_ref().is_some_and(|s| s.replicas.len() <= TABLE_MAX_ROWS)));
    // A memo, so the first-run panel (and what is typed in it) survives the refreshes.
    let no_fleet = Memo::new(move |_| snapshot.with(|s| s.as_ref().is_some_and(|s| s.replicas.is_empty())));

    view! {
        <section class="view fleet">
            <ErrorBanner error=error what="the fleet" />
            {move || snapshot.with(|s| s.as_ref().and_then(|s| crate::format::history_banner(&s.history))).map(|text| view! {
                <p class="banner banner-warn" data-testid="history-banner">{text}</p>
            })}
            <div class="card">
                <div class="card-head">
                    <h2>"Fleet overview"</h2>
                    <span class="card-meta" data-testid="fleet-summary">{move || summary(snapshot, visible)}</span>
                </div>
                <div class="toolbar">
                    <label>
                        "Colour by "
                        <select
                            data-testid="signal-select"
                            on:change=move |ev| signal.set(TileSignal::from_slug(&event_target_value(&ev)))
                        >
                            {TileSignal::ALL
                                .into_iter()
                                .map(|s| view! { <option value=s.slug() selected=move || signal.get() == s>{s.label()}</option> })
                                .collect_view()}
                        </select>
                    </label>
                    <label>
                        "Sort "
                        <select
                            data-testid="sort-select"
                            on:change=move |ev| sort.set(SortBy::from_slug(&event_target_value(&ev)))
                        >
                            {SortBy::ALL
                                .into_iter()
                                .map(|s| view! { <option value=s.slug() selected=move || sort.get() == s>{s.label()}</option> })
                                .collect_view()}
                        </select>
                    </label>
                    <input
                        type="search"
                        placeholder="Filter by URL, engine or model (/)"
                        data-filter=""
                        data-testid="fleet-filter"
                        prop:value=move || filter.get()
                        on:input=move |ev| filter.set(event_target_value(&ev))
                    />
                    <label class="check">
                        <input
                            type="checkbox"
                            data-testid="errors-only"
                            prop:checked=move || errors_only.get()
                            on:change=move |ev| errors_only.set(event_target_checked(&ev))
                        />
                        "failing only"
                    </label>
                    <span class="legend">
                        <span class="legend-swatch" style=format!("background:{}", tiles::heat_colour(0.0))></span>
                        {move || if matches!(signal.get(), TileSignal::HitRate | TileSignal::KvUsage) { "0%" } else { "low" }}
                        <span class="legend-swatch" style=format!("background:{}", tiles::heat_colour(0.5))></span>
                        <span class="legend-swatch" style=format!("background:{}", tiles::heat_colour(1.0))></span>
                        {move || if matches!(signal.get(), TileSignal::HitRate | TileSignal::KvUsage) { "100%".to_owned() } else { "fleet max".to_owned() }}
                    </span>
                </div>
                <Show when=move || no_fleet.get()>
                    <FirstRun />
                </Show>
                {move || grid_placeholder(snapshot, visible)}
                <div class="fleet-grid" data-testid="fleet-grid" on:keydown=grid_keys>
                    <For
                        each=move || visible.get()
                        key=|id| *id
                        children=move |id| view! { <Tile id=id by_id=by_id signal=signal scale_max=scale_max /> }
                    />
                </div>
            </div>
            <Show when=move || small.get()>
                <ReplicaTable snapshot=snapshot />
            </Show>
        </section>
    }
}

fn summary(snapshot: RwSignal<Option<FleetSnapshot>>, visible: Memo<Vec<u32>>) -> String {
    snapshot.with(|s| {
        let Some(s) = s else { return String::new() };
        let n = s.replicas.len();
        let failing = s.replicas.iter().filter(|r| matches!(r.scrape, ScrapeState::Error { .. })).count();
        let shown = visible.with(Vec::len);
        let noun = if n == 1 { "replica" } else { "replicas" };
        let mut text = format!("{n} {noun}");
        if failing > 0 {
            text.push_str(&format!(" · {failing} failing"));
        }
        if shown != n {
            text.push_str(&format!(" · {shown} shown"));
        }
        if !s.history.db_path.is_empty() {
            text.push_str(&format!(" · history in {}", s.history.db_path));
        }
        text
    })
}

fn grid_placeholder(snapshot: RwSignal<Option<FleetSnapshot>>, visible: Memo<Vec<u32>>) -> Option<AnyView> {
    let (title, hint) = snapshot.with(|s| match s {
        None => Some(("Waiting for the first snapshot…", "The app is scraping the replicas.")),
        // The first-run panel says what to do.
        Some(s) if s.replicas.is_empty() => None,
        Some(_) if visible.with(Vec::is_empty) => {
            Some(("No replica matches the filter.", "Clear the filter or untick \"failing only\"."))
        }
        Some(_) => None,
    })?;
    Some(view! { <EmptyState title=title hint=hint /> }.into_any())
}

/// What the first window shows while no fleet is watched: the three ways in, each a click away.
/// What is added here is kept for the next start (as in Settings); the demo is not.
#[component]
fn FirstRun() -> impl IntoView {
    let replica_url = RwSignal::new(String::new());
    let prometheus_url = RwSignal::new(String::new());
    let busy = RwSignal::new(None::<String>);
    let outcome = RwSignal::new(None::<Result<String, ApiError>>);

    let add = move |kind: EndpointKind, url: RwSignal<String>| {
        let args = AddEndpointArgs { kind, url: url.get_untracked(), token: None };
        busy.set(Some(format!("probing {}…", args.url)));
        outcome.set(None);
        spawn_local(async move {
            let result = transport::call::<_, ProbeReport>(CMD_ADD_ENDPOINT, &args).await;
            busy.set(None);
            // Added even when the probe failed (it may come up later); the report says why.
            outcome.set(Some(result.map(|report| match report.error {
                Some(error) => format!("added {}, but it does not answer yet: {error}", report.url),
                None => format!("added {}", report.url),
            })));
        });
    };
    let start_demo = move || {
        busy.set(Some("starting the demo fleet…".to_owned()));
        outcome.set(None);
        spawn_local(async move {
            let result = transport::call::<_, DemoStarted>(CMD_START_DEMO, &StartDemoArgs::default()).await;
            busy.set(None);
            outcome.set(Some(result.map(|demo| {
                format!("demo fleet started: {} replicas, router at {}", demo.replicas.len(), demo.router)
            })));
        });
    };
    let url_form = move |kind: EndpointKind,
                         url: RwSignal<String>,
                         placeholder: &'static str,
                         button: &'static str,
                         slug: &'static str| {
        view! {
            <form class="toolbar add-form" on:submit=move |ev| { ev.prevent_default(); add(kind, url); }>
                <input
                    type="url"
                    class="wide"
                    placeholder=placeholder
                    data-testid=format!("first-run-{slug}-url")
                    prop:value=move || url.get()
                    on:input=move |ev| url.set(event_target_value(&ev))
                />
                <button type="submit" data-testid=format!("first-run-add-{slug}") disabled=move || busy.with(Option::is_some)>
                    {button}
                </button>
            </form>
        }
    };

    view! {
        <div class="first-run" data-testid="first-run">
            <strong>"No fleet is watched yet. Three ways in:"</strong>
            <ol>
                <li>
                    <span>"Watch replicas directly: a replica's base URL or metrics URL (vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM, Triton, Dynamo)."</span>
                    {url_form(EndpointKind::Replica, replica_url, "http://10.0.0.5:8000", "Add replica", "replica")}
                </li>
                <li>
                    <span>"Or read them from a Prometheus server that already scrapes them: its URL."</span>
                    {url_form(EndpointKind::Prometheus, prometheus_url, "http://127.0.0.1:9090", "Add Prometheus", "prometheus")}
                </li>
                <li>
                    <span>"Or try the demo: 4 emulated replicas, a fleet-router over them and steady traffic, inside the app."</span>
                    <button
                        class="primary"
                        data-testid="first-run-demo"
                        disabled=move || busy.with(Option::is_some)
                        on:click=move |_| start_demo()
                    >
                        "Start the demo fleet"
                    </button>
                </li>
            </ol>
            {move || busy.get().map(|text| view! { <Progress text=Signal::derive(move || text.clone()) /> })}
            {move || outcome.get().map(|result| match result {
                Ok(text) => view! { <span class="first-run-note" data-testid="first-run-result">{text}</span> }.into_any(),
                Err(error) => view! {
                    <span class="first-run-note first-run-error" data-testid="first-run-result">{error.message}</span>
                }
                .into_any(),
            })}
            <span class="hint">
                "Added replicas and Prometheus servers are kept for the next start and listed in Settings (key 5), "
                "where fleet-routers are added too. From a terminal: fleetdeck --replica URL, --prometheus URL or --demo (see fleetdeck --help)."
            </span>
        </div>
    }
}

/// Arrow keys move the focus between tiles: left/right by one, up/down by a row.
fn grid_keys(ev: web_sys::KeyboardEvent) {
    use wasm_bindgen::JsCast;
    let step: i32 = match ev.key().as_str() {
        "ArrowRight" => 1,
        "ArrowLeft" => -1,
        "ArrowDown" | "ArrowUp" => 0,
        _ => return,
    };
    let Ok(tiles) = document().query_selector_all("[data-testid=replica-tile]") else { return };
    let elements: Vec<web_sys::HtmlElement> =
        (0..tiles.length()).filter_map(|i| tiles.item(i)?.dyn_into().ok()).collect();
    let active = document().active_element();
    let Some(at) =
        elements.iter().position(|e| active.as_ref().is_some_and(|a| a == e.as_ref() as &web_sys::Element))
    else {
        if let Some(first) = elements.first() {
            let _ = first.focus();
            ev.prevent_default();
        }
        return;
    };
    // Tiles per row: how many share the first tile's top edge.
    let per_row =
        elements.iter().take_while(|e| e.offset_top() == elements[0].offset_top()).count().max(1) as i32;
    let delta = match ev.key().as_str() {
        "ArrowDown" => per_row,
        "ArrowUp" => -per_row,
        _ => step,
    };
    let next = (at as i32 + delta).clamp(0, elements.len() as i32 - 1) as usize;
    let _ = elements[next].focus();
    ev.prevent_default();
}

/// One replica's tile, updated in place on every refresh.
#[component]
fn Tile(
    id: u32,
    by_id: RwSignal<HashMap<u32, ReplicaRow>>,
    signal: RwSignal<TileSignal>,
    scale_max: Memo<f64>,
) -> impl IntoView {
    let row = Memo::new(move |_| by_id.with(|m| m.get(&id).cloned()));
    let background = move || {
        row.with(|r| {
            let level = r
                .as_ref()
                .and_then(|r| signal.get().value(r))
                .map(|v| signal.get().level(v, scale_max.get()));
            match level {
                Some(level) => format!("background:{}", tiles::heat_colour(level)),
                None => String::new(),
            }
        })
    };
    let is_error =
        move || row.with(|r| matches!(r, Some(ReplicaRow { scrape: ScrapeState::Error { .. }, .. })));
    let name =
        move || row.with(|r| r.as_ref().map(|r| format::short_url(&r.url).to_owned()).unwrap_or_default());
    let value = move || row.with(|r| r.as_ref().map(|r| signal.get().text(r)).unwrap_or_default());
    let engine = move || row.with(|r| r.as_ref().and_then(|r| r.engine.clone()));
    let model = move || row.with(|r| r.as_ref().and_then(|r| r.model.clone()));
    let details = move || {
        row.with(|r| {
            r.as_ref()
                .map(|r| {
                    let s = r.signals;
                    format!(
                        "q {} · kv {} · hit {} · p95 {}",
                        format::count(s.queue_depth),
                        format::percent(s.kv_usage),
                        format::percent(s.hit_rate),
                        format::duration_s(s.ttft_p95_s)
                    )
                })
                .unwrap_or_default()
        })
    };
    let scrape_line = move || {
        row.with(|r| match r.as_ref().map(|r| &r.scrape) {
            Some(ScrapeState::Error { message, last_good_ms }) => {
                let offset = last_good_ms.map(utc_offset_min).unwrap_or(0);
                Some(format!("{message} · {}", format::last_good_scrape(*last_good_ms, offset)))
            }
            Some(ScrapeState::Pending) => Some("waiting for the first scrape".to_owned()),
            _ => None,
        })
    };
    view! {
        <a
            class="tile"
            class:tile-error=is_error
            href=Route::Replica(id).href()
            data-testid="replica-tile"
            data-id=id.to_string()
            style=background
            title=move || row.with(|r| r.as_ref().map(|r| r.url.clone()).unwrap_or_default())
        >
            <span class="tile-name">{name}</span>
            <span class="tile-value" data-testid="tile-value">{value}</span>
            <span class="tile-badges">
                <span class="badge badge-engine" class:na=move || engine().is_none()>
                    {move || engine().unwrap_or_else(|| "engine?".to_owned())}
                </span>
                <span class="badge badge-model" title=move || model().unwrap_or_default()>
                    {move || model().map(|m| short_model(&m)).unwrap_or_else(|| "model?".to_owned())}
                </span>
            </span>
            <span class="tile-details">{details}</span>
            {move || scrape_line().map(|text| view! { <span class="tile-scrape" data-testid="tile-error">{text}</span> })}
        </a>
    }
}

/// `org/Model-Name` without the organisation, cut to fit a badge.
fn short_model(model: &str) -> String {
    let name = model.rsplit('/').next().unwrap_or(model);
    if name.chars().count() > 22 {
        format!("{}…", name.chars().take(21).collect::<String>())
    } else {
        name.to_owned()
    }
}

/// The per-row table and TTFT chart (small fleets only).
#[component]
fn ReplicaTable(snapshot: RwSignal<Option<FleetSnapshot>>) -> impl IntoView {
    let chart_html = Memo::new(move |_| {
        snapshot.with(|s| match s {
            Some(s) => chart::chart_html(&s.ttft_p95, s.now_ms, CHART_WINDOW_S),
            None => chart::chart_html(&[], 0, CHART_WINDOW_S),
        })
    });
    view! {
        <div class="card">
            <div class="card-head">
                <h2>"Replicas"</h2>
                <span class="card-meta">"click a row's replica for its history"</span>
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
                            <th class="num">"Tokens/s"</th>
                            <th>"Scrape"</th>
                        </tr>
                    </thead>
                    <tbody>
                        // Keyed by id so each replica keeps its <tr> across refreshes.
                        <For
                            each=move || snapshot.with(|s| s.iter().flat_map(|s| &s.replicas).map(|r| r.id).collect::<Vec<_>>())
                            key=|id| *id
                            children=move |id| view! { <ReplicaRowView id=id snapshot=snapshot /> }
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
    }
}

/// One replica's table row.
#[component]
fn ReplicaRowView(id: u32, snapshot: RwSignal<Option<FleetSnapshot>>) -> impl IntoView {
    let row = Memo::new(move |_| {
        snapshot.with(|s| s.as_ref().and_then(|s| s.replicas.iter().find(|r| r.id == id).cloned()))
    });
    let url = move || row.with(|r| r.as_ref().map(|r| r.url.clone()).unwrap_or_default());
    // Same colour as the replica's line in the chart, which colours by series order.
    let swatch_style = Memo::new(move |_| {
        let url = url();
        snapshot
            .with(|s| s.as_ref().and_then(|s| s.ttft_p95.iter().position(|series| series.url == url)))
            .map(|i| format!("background:{}", chart::css_colour(i)))
            .unwrap_or_else(|| "visibility:hidden".to_owned())
    });
    let signals = move || row.with(|r| r.as_ref().map(|r| r.signals).unwrap_or_default());
    let is_error =
        move || row.with(|r| matches!(r, Some(ReplicaRow { scrape: ScrapeState::Error { .. }, .. })));
    let engine = move || row.with(|r| r.as_ref().and_then(|r| r.engine.clone()));
    let model = move || row.with(|r| r.as_ref().and_then(|r| r.model.clone()));
    let tokens = move || row.with(|r| r.as_ref().and_then(|r| r.tokens_per_s));

    view! {
        <tr data-testid="replica-row" class:row-error=is_error data-url=url>
            <td class="replica">
                <span class="replica-cell">
                    <span class="swatch" style=move || swatch_style.get()></span>
                    <a class="url" href=Route::Replica(id).href() title=url>{url}</a>
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
            {num_cell(tokens, format::rate)}
            <td class="scrape">{move || row.with(|r| r.as_ref().map(|r| scrape_view(&r.scrape)))}</td>
        </tr>
    }
}

fn text_or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| format::NOT_PROVIDED.to_owned())
}

/// A right-aligned numeric cell; a missing signal gets the muted `na` class.
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
