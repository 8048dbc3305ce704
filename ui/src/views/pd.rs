//! P/D (`#/pd`): a disaggregated fleet at a glance. Its roles and how full each is, the P:D ratio, the
//! routers' split decisions by reason over time, where a split request's time to first token goes
//! (prefill leg, KV transfer, first decode token), and each router's own P/D figures (fleet-router's, and
//! third-party routers' such as SMG's `smg_pd_*`).

use fleetdeck_api::{CMD_PD_VIEW, PdBucket, PdRole, PdRouterRow, PdTtftSplit, PdView, PdViewArgs};
use leptos::prelude::*;

use crate::components::{EmptyState, ErrorBanner};
use crate::format;
use crate::poll::poll;
use crate::router_status::RouterStatus;

const POLL_INTERVAL_MS: f64 = 2_000.0;
/// Window and bucket width: 5 minutes in 10 s bars, 15 minutes in 30 s bars.
const WINDOWS: [(u32, u32, &str); 2] = [(300, 10, "5 min"), (900, 30, "15 min")];
/// Reasons in a fixed order, so each keeps its colour (`pd-reason-N` in the stylesheet).
const REASONS: [&str; 7] = [
    "split",
    "short_prompt",
    "cached_at_decode",
    "prefill_pool_busy",
    "no_prefill_replica",
    "transfer_failed",
    "local",
];

#[component]
pub fn PdFleetView(last_update: RwSignal<Option<i64>>) -> impl IntoView {
    let window = RwSignal::new(WINDOWS[0]);
    let pd = poll::<_, PdView>(
        CMD_PD_VIEW,
        move || {
            let (window_s, bucket_s, _) = window.get_untracked();
            PdViewArgs { window_s, bucket_s }
        },
        POLL_INTERVAL_MS,
    );
    Effect::new(move |_| {
        if pd.data.with(Option::is_some) {
            last_update.set(Some(js_sys::Date::now() as i64));
        }
    });
    view! {
        <section class="view pd-view">
            <ErrorBanner error=pd.error what="the P/D view" />
            <RouterStatus routers=Signal::derive(move || pd.data.with(|v| v.as_ref().map(|v| v.routers.clone()).unwrap_or_default())) />
            <div class="toolbar">
                <span>"Decisions of the last "</span>
                <div class="segmented" data-testid="pd-window">
                    {WINDOWS
                        .into_iter()
                        .map(|w| view! {
                            <button
                                class:active=move || window.get() == w
                                on:click=move |_| {
                                    window.set(w);
                                    pd.refresh.update(|n| *n += 1);
                                }
                            >
                                {w.2}
                            </button>
                        })
                        .collect_view()}
                </div>
            </div>
            {move || pd.data.with(|v| match v {
                None => view! { <EmptyState title="Reading the routers…" hint="The P/D view comes from fleet-router's P/D counters and the replicas' metrics." /> }.into_any(),
                Some(v) if v.routers.is_empty() => view! {
                    <EmptyState title="No router is configured." hint="P/D decisions come from a fleet-router in P/D mode: add it with its admin token in Settings (key 5)." />
                }.into_any(),
                Some(v) => body(v).into_any(),
            })}
        </section>
    }
}

fn body(v: &PdView) -> impl IntoView {
    let notes = v.notes.iter().map(|n| view! { <li>{n.clone()}</li> }).collect_view();
    let ratio = v.ratio.clone().map_or_else(|| "no P:D split".to_owned(), |r| format!("P:D {r}"));
    view! {
        <div class="card">
            <div class="card-head">
                <h2>"Roles"</h2>
                <span class="card-meta" data-testid="pd-ratio">{ratio}</span>
            </div>
            <table class="replicas pd-roles">
                <thead>
                    <tr>
                        <th>"Role"</th>
                        <th class="num">"Replicas (healthy)"</th>
                        <th class="num">"Outstanding / replica"</th>
                        <th class="num">"KV usage"</th>
                        <th class="num">"Queue"</th>
                        <th class="num">"Running"</th>
                        <th class="num">"KV transfer in"</th>
                    </tr>
                </thead>
                <tbody>{v.roles.iter().map(role_row).collect_view()}</tbody>
            </table>
        </div>
        <div class="card">
            <div class="card-head">
                <h2>"Time to first token of a split request"</h2>
                <span class="card-meta" data-testid="pd-splits">{format!("{} splits, {} fell back to a local prefill", v.ttft.splits, v.ttft.fallbacks)}</span>
            </div>
            {ttft(&v.ttft)}
        </div>
        {(!v.router_figures.is_empty()).then(|| view! {
            <div class="card">
                <div class="card-head">
                    <h2>"Each router's own figures"</h2>
                    <span class="card-meta">"as each router times its split requests"</span>
                </div>
                <table class="replicas pd-routers">
                    <thead>
                        <tr>
                            <th>"Router"</th>
                            <th class="num">"Splits"</th>
                            <th class="num">"Local"</th>
                            <th class="num">"Failed"</th>
                            <th class="num">"TTFT mean"</th>
                            <th class="num">"TTFT p95"</th>
                            <th class="num">"Prefill"</th>
                            <th class="num">"KV transfer"</th>
                            <th class="num">"Decode TTFT"</th>
                        </tr>
                    </thead>
                    <tbody>{v.router_figures.iter().map(router_row).collect_view()}</tbody>
                </table>
            </div>
        })}
        <div class="card">
            <div class="card-head">
                <h2>"Decisions by reason"</h2>
                <span class="card-meta">{format!("{} s bars over {} s", v.bucket_s, v.window_s)}</span>
            </div>
            {reasons(v)}
            {over_time(&v.over_time)}
            <ul class="notes">{notes}</ul>
        </div>
    }
}

fn router_row(r: &PdRouterRow) -> impl IntoView {
    let ms = |v: Option<f64>| format::duration_s(v.map(|ms| ms / 1e3));
    view! {
        <tr data-testid="pd-router" data-kind=r.kind.clone()>
            <td title=r.url.clone()>
                {format!("{} ({})", format::short_url(&r.url), r.kind)}
                {r.worker_types.iter().map(|t| view! {
                    <div class="card-meta" data-testid="pd-worker-type">{format::worker_type(t)}</div>
                }).collect_view()}
            </td>
            <td class="num" data-testid="pd-router-splits">{r.splits}</td>
            <td class="num">{r.local}</td>
            <td class="num">{r.failures}</td>
            <td class="num" data-testid="pd-router-ttft">{ms(r.ttft_mean_ms)}</td>
            <td class="num">{ms(r.ttft_p95_ms)}</td>
            <td class="num">{ms(r.prefill_mean_ms)}</td>
            <td class="num">{ms(r.transfer_mean_ms)}</td>
            <td class="num">{ms(r.decode_ttft_mean_ms)}</td>
        </tr>
    }
}

fn role_row(r: &PdRole) -> impl IntoView {
    view! {
        <tr data-testid="pd-role" data-role=r.role.clone()>
            <td>{r.role.clone()}</td>
            <td class="num">{format!("{} ({})", r.replicas, r.healthy)}</td>
            <td class="num">{format::count(Some(r.outstanding_per_replica))}</td>
            <td class="num">{format::percent(r.kv_usage)}</td>
            <td class="num">{format::count(r.queue_depth)}</td>
            <td class="num">{format::count(r.running)}</td>
            <td class="num" data-testid="pd-role-transfer">{format::duration_s(r.transfer_ms.map(|ms| ms / 1e3))}</td>
        </tr>
    }
}

fn ttft(t: &PdTtftSplit) -> AnyView {
    let legs = format::ttft_legs(t);
    if legs.is_empty() {
        return view! { <EmptyState title="No split request in this window." hint="Long prompts with a long uncached part are split; short or cached ones stay local." /> }.into_any();
    }
    let total: f64 = legs.iter().map(|(_, ms)| ms).sum::<f64>().max(1e-9);
    let segments = legs
        .iter()
        .enumerate()
        .map(|(i, (label, ms))| {
            let width = ms / total * 100.0;
            view! { <span class=format!("pd-leg pd-leg-{i}") style=format!("width:{width:.2}%") title=format!("{label}: {ms:.1} ms")></span> }
        })
        .collect_view();
    let legend = legs
        .iter()
        .enumerate()
        .map(|(i, (label, ms))| view! {
            <li data-testid="pd-leg"><span class=format!("pd-swatch pd-leg-{i}")></span>{format!("{label}: {}", format::duration_s(Some(ms / 1e3)))}</li>
        })
        .collect_view();
    let p95 = format!(
        "p95: prefill leg {}, decode leg to first byte {}",
        format::duration_s(t.prefill_leg_p95_ms.map(|ms| ms / 1e3)),
        format::duration_s(t.decode_first_byte_p95_ms.map(|ms| ms / 1e3))
    );
    view! {
        <div class="pd-ttft" data-testid="pd-ttft">
            <div class="pd-ttft-bar">{segments}</div>
            <ul class="pd-legend">{legend}</ul>
            <p class="card-meta">{p95}</p>
        </div>
    }
    .into_any()
}

fn reason_class(reason: &str) -> String {
    let slot = REASONS.iter().position(|r| *r == reason).unwrap_or(REASONS.len());
    format!("pd-reason-{slot}")
}

fn reasons(v: &PdView) -> AnyView {
    if v.reasons.is_empty() {
        return view! { <EmptyState title="No P/D decision in this window." hint="A router decides per request once a model has prefill replicas." /> }.into_any();
    }
    let rows = v
        .reasons
        .iter()
        .map(|r| view! {
            <li data-testid="pd-reason" data-reason=r.reason.clone()>
                <span class=format!("pd-swatch {}", reason_class(&r.reason))></span>
                {format!("{}: {} ({})", format::pd_reason(&r.reason), r.count, format::percent(Some(r.share)))}
            </li>
        })
        .collect_view();
    view! { <ul class="pd-legend pd-reasons">{rows}</ul> }.into_any()
}

fn over_time(buckets: &[PdBucket]) -> impl IntoView {
    let tallest = buckets.iter().map(|b| b.counts.values().sum::<u64>()).max().unwrap_or(0).max(1) as f64;
    let columns = buckets
        .iter()
        .map(|b| {
            let total: u64 = b.counts.values().sum();
            let segments = REASONS
                .iter()
                .filter_map(|reason| Some((*reason, *b.counts.get(*reason)?)))
                .map(|(reason, n)| {
                    let height = n as f64 / tallest * 100.0;
                    view! { <span class=format!("pd-seg {}", reason_class(reason)) style=format!("height:{height:.2}%")></span> }
                })
                .collect_view();
            view! { <div class="pd-col" title=format!("{total} decisions")>{segments}</div> }
        })
        .collect_view();
    view! { <div class="pd-over-time" data-testid="pd-over-time">{columns}</div> }
}
