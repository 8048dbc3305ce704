//! Prefix-cache heat map (`#/heat`): replicas x the routers' top prefix groups, each cell the
//! blocks the replica has cached for the group or the share of the group's prompt blocks that
//! hit there; a hotspot warning above it when one replica carries too much of the traffic; and, below
//! it, whether the fleet's routers agree on each replica's load (each router's view beside the engine's
//! own figure).

use fleetdeck_api::{CMD_HEAT_MAP, HeatMap, HeatMapArgs};
use leptos::prelude::*;

use crate::components::{EmptyState, ErrorBanner};
use crate::poll::poll;
use crate::router_status::RouterStatus;
use crate::{format, tiles};

const POLL_INTERVAL_MS: f64 = 2000.0;

/// What a cell shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CellValue {
    CachedBlocks,
    HitShare,
    Requests,
}

#[component]
pub fn HeatView(last_update: RwSignal<Option<i64>>) -> impl IntoView {
    let threshold_pct = RwSignal::new(30.0_f64);
    let cell_value = RwSignal::new(CellValue::CachedBlocks);
    let heat = poll::<_, HeatMap>(
        CMD_HEAT_MAP,
        move || HeatMapArgs { hotspot_share: (threshold_pct.get_untracked() / 100.0).clamp(0.001, 1.0) },
        POLL_INTERVAL_MS,
    );
    Effect::new(move |_| {
        if heat.data.with(Option::is_some) {
            last_update.set(Some(js_sys::Date::now() as i64));
        }
    });

    view! {
        <section class="view heat">
            <ErrorBanner error=heat.error what="the heat map" />
            <RouterStatus routers=Signal::derive(move || heat.data.with(|h| h.as_ref().map(|h| h.routers.clone()).unwrap_or_default())) />
            {move || {
                heat.data.with(|h| {
                    h.as_ref().filter(|h| !h.hotspots.is_empty()).map(|h| {
                        let items = h
                            .hotspots
                            .iter()
                            .map(|s| {
                                format!(
                                    "{} serves prefix group {} alone: {} of all traffic",
                                    format::short_url(&s.replica),
                                    short_group(&s.group),
                                    format::percent(Some(s.share))
                                )
                            })
                            .collect::<Vec<_>>();
                        view! {
                            <div class="banner banner-warn" role="alert" data-testid="hotspot-warning">
                                <strong>"Hotspot. "</strong>
                                <span>{items.join("; ")}</span>
                                <span class="banner-code">
                                    {format!("threshold {:.0}%", threshold_pct.get_untracked())}
                                </span>
                            </div>
                        }
                    })
                })
            }}
            <div class="card">
                <div class="card-head">
                    <h2>"Prefix-cache heat"</h2>
                    <span class="card-meta">
                        {move || heat.data.with(|h| h.as_ref().map(|h| format!("top {} prefix groups over the routers' last {} s", h.groups.len(), h.window_s)).unwrap_or_default())}
                    </span>
                </div>
                <div class="toolbar">
                    <label>
                        "Cells show "
                        <select
                            data-testid="heat-value"
                            on:change=move |ev| {
                                cell_value.set(match event_target_value(&ev).as_str() {
                                    "hit_share" => CellValue::HitShare,
                                    "requests" => CellValue::Requests,
                                    _ => CellValue::CachedBlocks,
                                })
                            }
                        >
                            <option value="cached_blocks">"cached blocks"</option>
                            <option value="hit_share">"hit share"</option>
                            <option value="requests">"requests"</option>
                        </select>
                    </label>
                    <label>
                        "Hotspot when one replica carries more than "
                        <input
                            type="number"
                            min="1"
                            max="100"
                            step="1"
                            class="narrow"
                            data-testid="hotspot-threshold"
                            prop:value=move || threshold_pct.get().to_string()
                            on:change=move |ev| {
                                if let Ok(v) = event_target_value(&ev).parse::<f64>() && v > 0.0 && v <= 100.0 {
                                    threshold_pct.set(v);
                                    heat.refresh.update(|n| *n += 1);
                                }
                            }
                        />
                        "% of traffic"
                    </label>
                </div>
                {move || heat_table(heat.data, cell_value)}
            </div>
            {move || agreement_table(heat.data)}
            {move || placement_table(heat.data)}
        </section>
    }
}

fn short_group(group: &str) -> String {
    if group.len() > 10 {
        format!("{}…", &group[..group.char_indices().nth(8).map(|(i, _)| i).unwrap_or(group.len())])
    } else {
        group.to_owned()
    }
}

fn heat_table(data: RwSignal<Option<HeatMap>>, cell_value: RwSignal<CellValue>) -> AnyView {
    let value = cell_value.get();
    data.with(|h| {
        let Some(h) = h else {
            return view! { <EmptyState title="Asking the routers…" hint="The heat map comes from each router's /admin/state." /> }.into_any();
        };
        if h.routers.is_empty() {
            return view! {
                <EmptyState
                    title="No router is configured."
                    hint="Add a fleet-router with its admin token in Settings (key 5), or start the app with --router URL --router-token-file FILE."
                />
            }
            .into_any();
        }
        if h.groups.is_empty() {
            return view! {
                <EmptyState
                    title="No traffic in the routers' window yet."
                    hint="Send requests through the router; prefix groups appear as soon as it has routed some."
                />
            }
            .into_any();
        }
        let max_blocks = h.groups.iter().flat_map(|g| g.cells.iter().map(|c| c.cached_blocks)).max().unwrap_or(0).max(1);
        let max_requests = h.groups.iter().flat_map(|g| g.cells.iter().map(|c| c.requests)).max().unwrap_or(0).max(1);
        let header = h
            .replicas
            .iter()
            .map(|r| view! { <th class="num" title=r.clone()>{format::short_url(r).to_owned()}</th> })
            .collect_view();
        let hot: Vec<(String, String)> = h.hotspots.iter().map(|s| (s.group.clone(), s.replica.clone())).collect();
        let rows = h
            .groups
            .iter()
            .map(|g| {
                let cells = g
                    .cells
                    .iter()
                    .zip(&h.replicas)
                    .map(|(c, replica)| {
                        let (text, level) = match value {
                            CellValue::CachedBlocks => (c.cached_blocks.to_string(), c.cached_blocks as f64 / max_blocks as f64),
                            CellValue::HitShare => (format::percent(Some(c.hit_share)), c.hit_share),
                            CellValue::Requests => (c.requests.to_string(), c.requests as f64 / max_requests as f64),
                        };
                        let is_hot = hot.iter().any(|(grp, rep)| *grp == g.group && rep == replica);
                        let style = if c.requests == 0 && c.cached_blocks == 0 {
                            String::new()
                        } else {
                            format!("background:{}", tiles::heat_colour(level))
                        };
                        view! {
                            <td
                                class="num heat-cell"
                                class:hot=is_hot
                                style=style
                                data-testid="heat-cell"
                                title=format!("{} requests · {} cached blocks · hit share {}", c.requests, c.cached_blocks, format::percent(Some(c.hit_share)))
                            >
                                {text}
                            </td>
                        }
                    })
                    .collect_view();
                view! {
                    <tr data-testid="heat-row">
                        <td class="mono" title=g.group.clone()>{short_group(&g.group)}</td>
                        <td class="num">{format::percent(Some(g.share))}</td>
                        <td class="num">{g.requests}</td>
                        {cells}
                    </tr>
                }
            })
            .collect_view();
        view! {
            <div class="table-wrap">
                <table class="replicas heat-table" data-testid="heat-map">
                    <thead>
                        <tr>
                            <th>"Prefix group"</th>
                            <th class="num">"Share"</th>
                            <th class="num">"Requests"</th>
                            {header}
                        </tr>
                    </thead>
                    <tbody>{rows}</tbody>
                </table>
            </div>
        }
        .into_any()
    })
}

/// The routers' agreement on each replica's load: a row per replica, the engine's own figure, then each
/// router's view; rows where some router is off are marked and say which. Shown once a router reports
/// engine figures or there are several routers to compare.
fn agreement_table(data: RwSignal<Option<HeatMap>>) -> Option<AnyView> {
    data.with(|h| {
        let h = h.as_ref()?;
        let routers: Vec<String> = h.routers.iter().map(|r| r.url.clone()).collect();
        let informative = routers.len() > 1 || h.load_agreement.iter().any(|a| a.engine.is_some());
        if h.load_agreement.is_empty() || !informative {
            return None;
        }
        let disagreeing = h.load_agreement.iter().filter(|a| a.disagree).count();
        let header = routers
            .iter()
            .map(|r| view! { <th title=r.clone()>{format!("seen by {}", format::short_url(r))}</th> })
            .collect_view();
        let rows = h
            .load_agreement
            .iter()
            .map(|a| {
                let cells = routers
                    .iter()
                    .map(|r| {
                        let text = a
                            .routers
                            .iter()
                            .find(|v| &v.router == r)
                            .map_or_else(|| "not listed".to_owned(), format::router_load_view);
                        view! { <td class="mono">{text}</td> }
                    })
                    .collect_view();
                let status = if a.disagree {
                    a.note.clone().unwrap_or_else(|| "routers disagree".to_owned())
                } else {
                    "agree".to_owned()
                };
                view! {
                    <tr class:hot=a.disagree data-testid="agreement-row">
                        <td class="mono" title=a.replica.clone()>{format::short_url(&a.replica).to_owned()}</td>
                        <td class="num">{format::engine_load(a.engine, a.engine_age_ms)}</td>
                        {cells}
                        <td data-testid="agreement-status">{status}</td>
                    </tr>
                }
            })
            .collect_view();
        Some(
            view! {
                <div class="card" data-testid="load-agreement">
                    <div class="card-head">
                        <h2>"Routers' view of load"</h2>
                        <span class="card-meta">
                            {format!(
                                "requests each router counts on each replica, beside the engine's own waiting + running; {disagreeing} of {} replicas disagree",
                                h.load_agreement.len()
                            )}
                        </span>
                    </div>
                    <div class="table-wrap">
                        <table class="replicas">
                            <thead>
                                <tr>
                                    <th>"Replica"</th>
                                    <th class="num">"Engine"</th>
                                    {header}
                                    <th>"Agreement"</th>
                                </tr>
                            </thead>
                            <tbody>{rows}</tbody>
                        </table>
                    </div>
                </div>
            }
            .into_any(),
        )
    })
}

/// Where each router believes the busiest prefix groups live: a row per group two or more routers report,
/// each router's holders; rows where they name different replicas are marked (approximate prefix trees learn
/// only from their own router's traffic, so the same prefix ends up computed on several replicas).
fn placement_table(data: RwSignal<Option<HeatMap>>) -> Option<AnyView> {
    data.with(|h| {
        let h = h.as_ref()?;
        if h.prefix_placement.is_empty() {
            return None;
        }
        let routers: Vec<String> = h.routers.iter().map(|r| r.url.clone()).collect();
        let disagreeing = h.prefix_placement.iter().filter(|p| p.disagree).count();
        let header = routers
            .iter()
            .map(|r| view! { <th title=r.clone()>{format!("held by, says {}", format::short_url(r))}</th> })
            .collect_view();
        let rows = h
            .prefix_placement
            .iter()
            .map(|p| {
                let cells = routers
                    .iter()
                    .map(|r| {
                        let text = p.routers.iter().find(|v| &v.router == r).map_or_else(
                            || "not reported".to_owned(),
                            |v| format::prefix_holders(&v.holders),
                        );
                        view! { <td class="mono">{text}</td> }
                    })
                    .collect_view();
                view! {
                    <tr class:hot=p.disagree data-testid="placement-row">
                        <td class="mono" title=p.group.clone()>{short_group(&p.group)}</td>
                        <td class="num">{p.requests}</td>
                        {cells}
                        <td data-testid="placement-status">{if p.disagree { "routers disagree" } else { "agree" }}</td>
                    </tr>
                }
            })
            .collect_view();
        Some(
            view! {
                <div class="card" data-testid="prefix-placement">
                    <div class="card-head">
                        <h2>"Where routers think prefixes live"</h2>
                        <span class="card-meta">
                            {format!(
                                "replicas each router's index credits with a prefix group; {disagreeing} of {} groups disagree",
                                h.prefix_placement.len()
                            )}
                        </span>
                    </div>
                    <div class="table-wrap">
                        <table class="replicas">
                            <thead>
                                <tr>
                                    <th>"Prefix group"</th>
                                    <th class="num">"Requests"</th>
                                    {header}
                                    <th>"Agreement"</th>
                                </tr>
                            </thead>
                            <tbody>{rows}</tbody>
                        </table>
                    </div>
                </div>
            }
            .into_any(),
        )
    })
}
