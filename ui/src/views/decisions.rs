//! Decisions (`#/decisions`): the routers' recent routing decisions, newest first, each with its
//! explanation: the branch that decided, the reason, and every candidate with its load,
//! matched blocks and score or cost. Arrow keys move between decisions; pausing freezes the
//! list while reading.

use fleetdeck_api::{CMD_DECISIONS, Candidate, DecisionEntry, DecisionLog, DecisionsArgs};
use leptos::prelude::*;

use crate::clock::local_clock;
use crate::components::{EmptyState, ErrorBanner};
use crate::format;
use crate::poll::poll;
use crate::router_status::RouterStatus;

const POLL_INTERVAL_MS: f64 = 2000.0;
const LIMIT: u32 = 50;

#[component]
pub fn DecisionsView(last_update: RwSignal<Option<i64>>) -> impl IntoView {
    let paused = RwSignal::new(false);
    let log = poll::<_, DecisionLog>(CMD_DECISIONS, move || DecisionsArgs { limit: LIMIT }, POLL_INTERVAL_MS);
    // What is on screen: the latest answer unless paused.
    let shown = RwSignal::new(None::<DecisionLog>);
    Effect::new(move |_| {
        let latest = log.data.get();
        if !paused.get_untracked() && latest.is_some() {
            shown.set(latest);
            last_update.set(Some(js_sys::Date::now() as i64));
        }
    });
    let selected = RwSignal::new(0_usize);
    let keys = move |ev: web_sys::KeyboardEvent| {
        let n = shown.with(|s| s.as_ref().map(|s| s.decisions.len()).unwrap_or(0));
        if n == 0 {
            return;
        }
        match ev.key().as_str() {
            "ArrowDown" | "j" => selected.update(|i| *i = (*i + 1).min(n - 1)),
            "ArrowUp" | "k" => selected.update(|i| *i = i.saturating_sub(1)),
            _ => return,
        }
        ev.prevent_default();
        let index = selected.get_untracked();
        if let Ok(Some(el)) =
            document().query_selector(&format!("[data-testid=decision][data-index=\"{index}\"]"))
        {
            el.scroll_into_view_with_bool(false);
        }
    };

    view! {
        <section class="view decisions">
            <ErrorBanner error=log.error what="the decisions" />
            <RouterStatus routers=Signal::derive(move || shown.with(|d| d.as_ref().map(|d| d.routers.clone()).unwrap_or_default())) />
            <div class="card">
                <div class="card-head">
                    <h2>"Routing decisions"</h2>
                    <span class="card-meta">
                        {move || shown.with(|d| d.as_ref().map(|d| format!("{} newest, all routers", d.decisions.len())).unwrap_or_default())}
                    </span>
                </div>
                <div class="toolbar">
                    <button data-testid="pause" on:click=move |_| paused.update(|p| *p = !*p)>
                        {move || if paused.get() { "▶ Resume" } else { "⏸ Pause" }}
                    </button>
                    <span class="muted">"↑/↓ move between decisions · the chosen replica is marked ✓"</span>
                </div>
                <div class="decision-log" data-testid="decision-log" tabindex="0" on:keydown=keys>
                    {move || {
                        shown.with(|d| match d {
                            None => Some(view! { <EmptyState title="Asking the routers…" hint="Decisions come from each router's /admin/decisions." /> }.into_any()),
                            Some(d) if d.routers.is_empty() => Some(view! {
                                <EmptyState title="No router is configured." hint="Add a fleet-router with its admin token in Settings (key 5)." />
                            }.into_any()),
                            Some(d) if d.decisions.is_empty() => Some(view! {
                                <EmptyState title="No decisions yet." hint="Send requests through the router; each routed request appears here with its explanation." />
                            }.into_any()),
                            Some(_) => None,
                        })
                    }}
                    <For
                        each=move || shown.with(|d| d.as_ref().map(|d| d.decisions.iter().cloned().enumerate().collect::<Vec<_>>()).unwrap_or_default())
                        key=|(i, d)| (*i, d.router.clone(), d.request_id.clone(), d.ts_ms)
                        children=move |(i, d)| view! { <Decision index=i entry=d selected=selected /> }
                    />
                </div>
            </div>
        </section>
    }
}

#[component]
fn Decision(index: usize, entry: DecisionEntry, selected: RwSignal<usize>) -> impl IntoView {
    let version = entry.policy_version.map(|v| format!(" v{v}")).unwrap_or_default();
    let candidates = entry.candidates.iter().cloned().map(candidate_row).collect_view();
    let notes =
        (!entry.notes.is_empty()).then(|| view! { <div class="muted">{entry.notes.join(" · ")}</div> });
    let tried = (!entry.attempts.is_empty()).then(|| {
        let path: Vec<&str> = entry.attempts.iter().map(|url| format::short_url(url)).collect();
        view! { <div class="muted" data-testid="decision-attempts">{format!("tried {}", path.join(" → "))}</div> }
    });
    let cached = entry.cached_tokens.map(|c| {
        view! { <div class="muted" data-testid="decision-cached-tokens">{format::cached_tokens(&c)}</div> }
    });
    let pd = entry.pd.as_ref().map(|pd| {
        view! { <div class="muted" data-testid="decision-pd">{format::pd_decision(pd)}</div> }
    });
    let failed = entry.error.clone().map(|error| {
        view! { <div class="decision-error" data-testid="decision-error">{format!("not served (502): {error}")}</div> }
    });
    view! {
        <article
            class="decision"
            class:selected=move || selected.get() == index
            data-testid="decision"
            data-index=index.to_string()
            on:click=move |_| selected.set(index)
        >
            <div class="decision-head">
                <span class="mono">{local_clock(entry.ts_ms)}</span>
                <span class=format!("badge branch branch-{}", entry.branch) data-testid="decision-branch">{entry.branch.clone()}</span>
                // A request no replica served names the last one tried, crossed rather than pointed at.
                <span>{if entry.error.is_some() { "✗ " } else { "→ " }}<strong>{format::short_url(&entry.replica).to_owned()}</strong></span>
                <span class="muted">{format!("{}{} · {}", entry.policy, version, entry.model.clone().unwrap_or_default())}</span>
                <span class="muted mono">{format!("req {} via {}", entry.request_id, format::short_url(&entry.router))}</span>
            </div>
            <div class="decision-reason">{entry.reason.clone()}</div>
            {failed}
            {pd}
            {cached}
            {tried}
            {notes}
            <table class="replicas candidates" data-testid="candidates">
                <thead>
                    <tr>
                        <th>"Candidate"</th>
                        <th class="num">"Load"</th>
                        <th class="num">"Outstanding"</th>
                        <th class="num">"Prefill tok"</th>
                        <th class="num">
                            {match entry.prompt_blocks {
                                Some(n) => format!("Matched / {n}"),
                                None => "Matched".to_owned(),
                            }}
                        </th>
                        <th class="num">"Score"</th>
                        <th class="num">"Cost"</th>
                        <th>"Note"</th>
                    </tr>
                </thead>
                <tbody>{candidates}</tbody>
            </table>
        </article>
    }
}

fn opt(v: Option<f64>) -> String {
    v.map(|v| if v.abs() >= 100.0 { format!("{v:.0}") } else { format!("{v:.3}") })
        .unwrap_or_else(|| format::NOT_PROVIDED.to_owned())
}

fn candidate_row(c: Candidate) -> impl IntoView {
    let mut note = c.note.clone().unwrap_or_default();
    if !c.healthy {
        note = format!("unhealthy {note}");
    } else if !c.eligible {
        note = format!("filtered {note}");
    }
    view! {
        <tr class:chosen=c.chosen data-testid="candidate">
            <td>{if c.chosen { "✓ " } else { "" }}{format::short_url(&c.replica).to_owned()}</td>
            <td class="num">{opt(c.load)}</td>
            <td class="num">{c.outstanding}</td>
            <td class="num">{c.prefill_tokens}</td>
            <td class="num" data-testid="matched-blocks">{c.matched_blocks.map(|m| m.to_string()).unwrap_or_else(|| format::NOT_PROVIDED.to_owned())}</td>
            <td class="num">{opt(c.score)}</td>
            <td class="num">{opt(c.cost)}</td>
            <td class="muted">{note}</td>
        </tr>
    }
}
