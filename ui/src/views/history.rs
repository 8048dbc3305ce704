//! History (`#/history`): choose two policy versions (or two time windows) from the audit trail;
//! overlaid charts and a delta table with bootstrap confidence intervals from the history
//! store; export as CSV and PNG (the chart SVG rasterised on a canvas by the browser).

use fleetdeck_api::{
    ApiError, CMD_HISTORY_COMPARE, CMD_POLICY_HISTORY, HistoryCompareArgs, HistoryComparison, HistoryWindow,
    PolicyHistory,
};
use leptos::prelude::*;
use leptos::task::spawn_local;
use serde_json::json;
use wasm_bindgen::JsCast;
use wasm_bindgen::closure::Closure;

use crate::components::{EmptyState, ErrorBanner};
use crate::poll::poll;
use crate::{format, overlay, transport};

fn metric_title(name: &str) -> &'static str {
    match name {
        "hit_rate" => "Prefix hit rate",
        "ttft_p50_s" => "TTFT p50 (s)",
        "ttft_p95_s" => "TTFT p95 (s)",
        "queue_depth" => "Queue depth",
        "throughput_tok_s" => "Throughput (tok/s)",
        "imbalance" => "Imbalance",
        _ => "metric",
    }
}

fn number(v: Option<f64>) -> String {
    v.map(overlay::tick).unwrap_or_else(|| format::NOT_PROVIDED.to_owned())
}

/// Starts a download of `href` as `name`.
fn download(href: &str, name: &str) {
    let document = document();
    if let Ok(a) = document.create_element("a")
        && let Ok(a) = a.dyn_into::<web_sys::HtmlAnchorElement>()
    {
        a.set_href(href);
        a.set_download(name);
        if let Some(body) = document.body() {
            let _ = body.append_child(&a);
            a.click();
            let _ = body.remove_child(&a);
        }
    }
}

/// Rasterises `svg` on a canvas and downloads it as a PNG.
fn export_png(svg: String, name: String) {
    let Ok(image) = web_sys::HtmlImageElement::new() else { return };
    let loaded = image.clone();
    let onload = Closure::once_into_js(move || {
        let Ok(canvas) = document().create_element("canvas") else { return };
        let Ok(canvas) = canvas.dyn_into::<web_sys::HtmlCanvasElement>() else { return };
        // Twice the SVG size, so the PNG stays sharp on high-density screens and in documents.
        canvas.set_width((overlay::WIDTH * 2.0) as u32);
        canvas.set_height((overlay::HEIGHT * 2.0) as u32);
        let Some(context) = canvas
            .get_context("2d")
            .ok()
            .flatten()
            .and_then(|c| c.dyn_into::<web_sys::CanvasRenderingContext2d>().ok())
        else {
            return;
        };
        let _ = context.draw_image_with_html_image_element_and_dw_and_dh(
            &loaded,
            0.0,
            0.0,
            overlay::WIDTH * 2.0,
            overlay::HEIGHT * 2.0,
        );
        if let Ok(url) = canvas.to_data_url_with_type("image/png") {
            let _ = canvas.set_attribute("data-png-bytes", &url.len().to_string());
            download(&url, &name);
        }
    });
    image.set_onload(Some(onload.unchecked_ref()));
    let encoded: String = js_sys::encode_uri_component(&svg).into();
    image.set_src(&format!("data:image/svg+xml;charset=utf-8,{encoded}"));
}

#[component]
pub fn HistoryView() -> impl IntoView {
    let history = poll::<_, PolicyHistory>(CMD_POLICY_HISTORY, || json!({}), 5000.0);
    let a = RwSignal::new(String::new());
    let b = RwSignal::new(String::new());
    let comparison = RwSignal::new(None::<HistoryComparison>);
    let error = RwSignal::new(None::<ApiError>);
    let exported = RwSignal::new(None::<String>);

    // Preselect the two newest versions that were in force.
    Effect::new(move |_| {
        history.data.with(|h| {
            if let Some(h) = h
                && a.get_untracked().is_empty()
            {
                let active: Vec<&str> = h
                    .versions
                    .iter()
                    .filter(|v| v.active_from_ms.is_some())
                    .map(|v| v.label.as_str())
                    .collect();
                if active.len() >= 2 {
                    a.set(active[active.len() - 2].to_owned());
                    b.set(active[active.len() - 1].to_owned());
                }
            }
        })
    });
    let compare = move |_| {
        let args = HistoryCompareArgs {
            a: HistoryWindow::Version { label: a.get_untracked() },
            b: HistoryWindow::Version { label: b.get_untracked() },
        };
        spawn_local(async move {
            match transport::call::<_, HistoryComparison>(CMD_HISTORY_COMPARE, &args).await {
                Ok(c) => {
                    comparison.set(Some(c));
                    error.set(None);
                }
                Err(e) => error.set(Some(e)),
            }
        });
    };
    let picker = |value: RwSignal<String>, testid: &'static str| {
        view! {
            <select data-testid=testid prop:value=move || value.get() on:change=move |ev| value.set(event_target_value(&ev))>
                <option value="">"choose a version"</option>
                {move || history.data.with(|h| h.as_ref().map(|h| h.versions.clone()).unwrap_or_default())
                    .into_iter()
                    .map(|v| {
                        let label = v.label.clone();
                        let selected = label == value.get_untracked();
                        let note = if v.active_from_ms.is_some() { "" } else { " (never in force)" };
                        view! { <option value=label.clone() selected=selected>{format!("{label} · {}{note}", v.author)}</option> }
                    })
                    .collect_view()}
            </select>
        }
    };

    view! {
        <section class="view history-view" data-testid="history-compare">
            <ErrorBanner error=history.error what="the audit trail" />
            <div class="card">
                <div class="card-head">
                    <h2>"Compare two policy versions"</h2>
                    <span class="card-meta">"each version's window runs from its first applied push to the next version's"</span>
                </div>
                <div class="toolbar">
                    <label>"A " {picker(a, "history-a")}</label>
                    <label>" B " {picker(b, "history-b")}</label>
                    <button class="primary" data-testid="history-run" on:click=compare>"Compare"</button>
                </div>
                <ErrorBanner error=error what="the comparison" />
                <table class="replicas" data-testid="history-versions">
                    <thead><tr><th>"Version"</th><th>"By"</th><th>"In force"</th><th>"Pushes"</th></tr></thead>
                    <tbody>
                        {move || history.data.with(|h| h.as_ref().map(|h| h.versions.clone()).unwrap_or_default())
                            .into_iter()
                            .rev()
                            .map(|v| view! {
                                <tr data-testid="history-version">
                                    <td title=v.spec.clone()>{v.label.clone()}</td>
                                    <td>{v.author.clone()}</td>
                                    <td>{match (v.active_from_ms, v.active_to_ms) {
                                        (Some(f), Some(t)) => format!("{:.0} s", (t - f) as f64 / 1000.0),
                                        _ => "never".to_owned(),
                                    }}</td>
                                    <td class="muted">{v.pushes.join("; ")}</td>
                                </tr>
                            })
                            .collect_view()}
                    </tbody>
                </table>
                <Show when=move || history.data.with(|h| h.as_ref().is_some_and(|h| h.versions.is_empty()))>
                    <EmptyState title="No policy version recorded yet." hint="Versions appear here when you push from the Push view." />
                </Show>
            </div>
            {move || comparison.get().map(|c| {
                let csv = c.csv.clone();
                let charts: Vec<(String, String)> = c.series.iter().map(|s| {
                    (s.metric.clone(), overlay::svg(metric_title(&s.metric), &s.a, &s.b, &c.a_label, &c.b_label))
                }).collect();
                let first_svg = charts.first().map(|(_, s)| s.clone()).unwrap_or_default();
                let export_csv = move |_| {
                    let encoded: String = js_sys::encode_uri_component(&csv).into();
                    download(&format!("data:text/csv;charset=utf-8,{encoded}"), "fleetdeck-compare.csv");
                    exported.set(Some("csv".to_owned()));
                };
                let export_png_click = move |_| {
                    export_png(first_svg.clone(), "fleetdeck-compare.png".to_owned());
                    exported.set(Some("png".to_owned()));
                };
                view! {
                    <div class="card">
                        <div class="card-head">
                            <h2>{format!("{} → {}", c.a_label, c.b_label)}</h2>
                            <span class="card-meta">{format!("{:.0}% bootstrap intervals of B − A", c.confidence * 100.0)}</span>
                            <button data-testid="export-csv" on:click=export_csv>"Export CSV"</button>
                            <button data-testid="export-png" on:click=export_png_click>"Export PNG"</button>
                            <span class="muted" data-testid="exported">{move || exported.get().map(|e| format!("exported {e}")).unwrap_or_default()}</span>
                        </div>
                        <div class="overlay-charts" data-testid="history-charts">
                            {charts.into_iter().map(|(metric, svg)| view! { <div class="overlay-chart" data-metric=metric inner_html=svg></div> }).collect_view()}
                        </div>
                        <table class="replicas" data-testid="delta-table">
                            <thead><tr><th>"Metric"</th><th class="num">"A"</th><th class="num">"B"</th><th class="num">"B − A"</th><th class="num">"interval"</th><th class="num">"buckets"</th></tr></thead>
                            <tbody>
                                {c.metrics.iter().map(|m| view! {
                                    <tr data-testid="delta-row" data-metric=m.name.clone()>
                                        <td>{metric_title(&m.name)}</td>
                                        <td class="num">{number(m.a)}</td>
                                        <td class="num">{number(m.b)}</td>
                                        <td class="num" data-testid="delta">{number(m.delta)}</td>
                                        <td class="num">{match (m.ci_low, m.ci_high) {
                                            (Some(l), Some(h)) => format!("[{}, {}]", overlay::tick(l), overlay::tick(h)),
                                            _ => "too few buckets".to_owned(),
                                        }}</td>
                                        <td class="num">{format!("{} / {}", m.n_a, m.n_b)}</td>
                                    </tr>
                                }).collect_view()}
                            </tbody>
                        </table>
                    </div>
                }
            })}
        </section>
    }
}
