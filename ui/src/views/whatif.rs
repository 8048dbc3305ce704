//! What-if (`#/whatif`): the recent recorded traffic (or a trace file) replayed with the
//! candidate and the active policy side by side: hit rate, TTFT p50/p95, imbalance and load per
//! replica, with a progress bar and cancel; it re-runs as the candidate changes.

use fleetdeck_api::{
    ApiError, CMD_CANCEL_WHATIF, CMD_START_WHATIF, CMD_WHATIF_STATUS, ReplayFigures, WhatIfArgs,
    WhatIfJobArgs, WhatIfResult, WhatIfStatus,
};
use leptos::prelude::*;
use leptos::task::spawn_local;

use crate::candidate::{store_candidate, stored_candidate};
use crate::clock::sleep_ms;
use crate::components::{EmptyState, ErrorBanner};
use crate::format;
use crate::transport;

/// How often a running replay's progress is asked for.
const STATUS_EVERY_MS: f64 = 250.0;
/// Typing pauses this long before a re-run starts.
const RERUN_AFTER_MS: f64 = 600.0;

#[component]
pub fn WhatIfView() -> impl IntoView {
    let text = RwSignal::new(stored_candidate().unwrap_or_else(|| "policy: cache_aware_approx".to_owned()));
    let window_s = RwSignal::new(600_u32);
    let trace_path = RwSignal::new(String::new());
    // The operator's engine profile and KV capacity (empty: chosen from the replicas' metrics).
    let profile = RwSignal::new(String::new());
    let kv_blocks = RwSignal::new(String::new());
    // P/D: how many of the replicas prefill (empty: as the routers tag them).
    let prefill_replicas = RwSignal::new(String::new());
    let status = RwSignal::new(None::<WhatIfStatus>);
    let error = RwSignal::new(None::<ApiError>);
    let edits = RwSignal::new(0_u64);

    let run = move || {
        let args = WhatIfArgs {
            text: text.get_untracked(),
            window_s: window_s.get_untracked(),
            trace_path: Some(trace_path.get_untracked()).filter(|p| !p.trim().is_empty()),
            replicas: None,
            profile: Some(profile.get_untracked()).filter(|p| !p.trim().is_empty()),
            kv_blocks: kv_blocks.get_untracked().trim().parse().ok(),
            prefill_replicas: prefill_replicas.get_untracked().trim().parse().ok(),
        };
        store_candidate(&args.text);
        spawn_local(async move {
            match transport::call::<_, WhatIfStatus>(CMD_START_WHATIF, &args).await {
                Err(e) => error.set(Some(e)),
                Ok(first) => {
                    error.set(None);
                    let job = first.job;
                    status.set(Some(first));
                    loop {
                        sleep_ms(STATUS_EVERY_MS).await;
                        // A newer run replaced this one.
                        if status.with_untracked(|s| s.as_ref().map(|s| s.job) != Some(job)) {
                            return;
                        }
                        match transport::call::<_, WhatIfStatus>(CMD_WHATIF_STATUS, &WhatIfJobArgs { job })
                            .await
                        {
                            Ok(s) => {
                                let running = s.state == "running";
                                status.set(Some(s));
                                if !running {
                                    return;
                                }
                            }
                            Err(e) => {
                                error.set(Some(e));
                                return;
                            }
                        }
                    }
                }
            }
        });
    };
    // Re-run when the candidate changes, once typing pauses.
    Effect::new(move |first: Option<()>| {
        text.track();
        window_s.track();
        profile.track();
        prefill_replicas.track();
        if first.is_none() {
            run();
            return;
        }
        let n = edits.get_untracked() + 1;
        edits.set(n);
        spawn_local(async move {
            sleep_ms(RERUN_AFTER_MS).await;
            if edits.get_untracked() == n {
                run();
            }
        });
    });
    let cancel = move |_| {
        if let Some(job) = status.with_untracked(|s| s.as_ref().map(|s| s.job)) {
            spawn_local(async move {
                match transport::call::<_, WhatIfStatus>(CMD_CANCEL_WHATIF, &WhatIfJobArgs { job }).await {
                    Ok(s) => status.set(Some(s)),
                    Err(e) => error.set(Some(e)),
                }
            });
        }
    };

    view! {
        <section class="view whatif-view">
            <ErrorBanner error=error what="the what-if" />
            <div class="card">
                <div class="card-head">
                    <h2>"What-if: candidate vs active on the same traffic"</h2>
                    <span class="card-meta">"fleet-sim's engine model on a virtual clock"</span>
                </div>
                <div class="toolbar">
                    <label>"Recorded traffic of the last "
                        <select data-testid="whatif-window" on:change=move |ev| window_s.set(event_target_value(&ev).parse().unwrap_or(600))>
                            <option value="120">"2 min"</option>
                            <option value="600" selected=true>"10 min"</option>
                            <option value="3600">"1 h"</option>
                        </select>
                    </label>
                    <label title="a file in the folder fleetdeck was started with --trace-dir">" or a trace file in the trace folder "
                        <input type="text" placeholder="trace.jsonl" data-testid="whatif-trace"
                            prop:value=move || trace_path.get()
                            on:change=move |ev| trace_path.set(event_target_value(&ev)) />
                    </label>
                    <label title="the engine profile the replay uses; automatic: from the replicas' model and KV capacity">" engine profile "
                        <select data-testid="whatif-profile" on:change=move |ev| profile.set(event_target_value(&ev))>
                            <option value="" selected=true>"automatic (from the fleet)"</option>
                            <option value="llama-3.1-8b-h100">"llama-3.1-8b-h100"</option>
                            <option value="llama-3.1-8b-a100">"llama-3.1-8b-a100"</option>
                            <option value="llama-3.1-70b-8xh100">"llama-3.1-70b-8xh100"</option>
                        </select>
                    </label>
                    <label title="KV capacity per replica in blocks; empty: what the replicas report">" KV blocks "
                        <input type="text" size="7" placeholder="auto" data-testid="whatif-kv-blocks"
                            prop:value=move || kv_blocks.get()
                            on:change=move |ev| kv_blocks.set(event_target_value(&ev)) />
                    </label>
                    <label title="P/D: how many of the same replicas prefill, the rest decode; empty: as the routers tag them">" prefill replicas "
                        <input type="text" size="3" placeholder="auto" data-testid="whatif-prefill-replicas"
                            prop:value=move || prefill_replicas.get()
                            on:change=move |ev| prefill_replicas.set(event_target_value(&ev)) />
                    </label>
                    <button data-testid="whatif-run" on:click=move |_| run()>"Run"</button>
                    <button data-testid="whatif-cancel" on:click=cancel
                        disabled=move || !status.with(|s| s.as_ref().is_some_and(|s| s.state == "running"))>"Cancel"</button>
                </div>
                <textarea class="spec-text" rows="4" data-testid="whatif-spec"
                    prop:value=move || text.get()
                    on:input=move |ev| text.set(event_target_value(&ev))></textarea>
                <div class="whatif-progress">
                    <progress max="1" data-testid="whatif-progress"
                        prop:value=move || status.with(|s| s.as_ref().map_or(0.0, |s| s.progress))></progress>
                    <span class="muted" data-testid="whatif-state">
                        {move || status.with(|s| s.as_ref().map(|s| {
                            let m = s.message.clone().unwrap_or_default();
                            format!("{} {m}", s.state)
                        }).unwrap_or_default())}
                    </span>
                </div>
            </div>
            <div class="card" data-testid="whatif-result">
                {move || status.with(|s| match s.as_ref().and_then(|s| s.result.clone()) {
                    None => view! { <EmptyState title="No result yet." hint="The replay runs as soon as there is recorded traffic and a valid candidate." /> }.into_any(),
                    Some(r) => result_view(&r).into_any(),
                })}
            </div>
        </section>
    }
}

fn ratio(v: Option<f64>) -> String {
    format::percent(v)
}

fn result_view(r: &WhatIfResult) -> impl IntoView + use<> {
    let row = |label: &'static str, key: &'static str, f: fn(&ReplayFigures) -> String| {
        view! {
            <tr data-testid=format!("whatif-{key}")>
                <td>{label}</td>
                <td class="num" data-testid="candidate">{f(&r.candidate)}</td>
                <td class="num" data-testid="active">{f(&r.active)}</td>
            </tr>
        }
    };
    let loads = |f: &ReplayFigures| {
        let max = f.per_replica_requests.iter().copied().max().unwrap_or(1).max(1) as f64;
        f.per_replica_requests
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let width = (*n as f64 / max * 100.0).round();
                view! {
                    <div class="bar-row">
                        <span class="bar-label">{format!("replica {i}")}</span>
                        <span class="bar-track"><span class="bar bar-achieved" style=format!("width:{width}%")></span></span>
                        <span class="bar-value num">{*n}</span>
                    </div>
                }
            })
            .collect_view()
    };
    view! {
        <div class="card-head">
            <h2>{match r.prefill_replicas {
                Some(p) => format!("{} requests on {p} prefill + {} decode replicas", r.requests, r.replicas),
                None => format!("{} requests on {} replicas", r.requests, r.replicas),
            }}</h2>
            <span class="card-meta" data-testid="whatif-elapsed">{format!("{} · replayed in {} ms", r.source, r.elapsed_ms)}</span>
        </div>
        <table class="replicas whatif-table">
            <thead><tr><th></th>
                <th class="num">{format!("candidate: {}", r.candidate.policy)}</th>
                <th class="num">{format!("active: {}", r.active.policy)}</th></tr></thead>
            <tbody>
                {row("Prefix hit rate", "hit-rate", |f| ratio(f.hit_rate))}
                {row("TTFT p50", "ttft-p50", |f| format::duration_s(f.ttft_p50_s))}
                {row("TTFT p95", "ttft-p95", |f| format::duration_s(f.ttft_p95_s))}
                {r.candidate.spread.is_some().then(|| view! {
                    {row("Hit rate over other draws, metrics phases and arrival times", "hit-rate-spread", |f| f.spread.as_ref().map_or_else(String::new, |s| format!("{} to {} ({} replays)", format::percent(Some(s.hit_rate_min)), format::percent(Some(s.hit_rate_max)), s.replays)))}
                    {row("TTFT p95 over other draws, metrics phases and arrival times", "ttft-p95-spread", |f| f.spread.as_ref().map_or_else(String::new, |s| format!("{} to {}", format::duration_s(Some(s.ttft_p95_min_s)), format::duration_s(Some(s.ttft_p95_max_s)))))}
                })}
                {row("Imbalance (max/mean prefill)", "imbalance", |f| f.imbalance.map(|v| format!("{v:.2}")).unwrap_or_default())}
                {r.prefill_replicas.is_some().then(|| view! {
                    {row("P/D: split", "pd-split", |f| f.pd.as_ref().map_or_else(String::new, |pd| format::percent(Some(pd.split_share))))}
                    {row("P/D: prefill leg, mean", "pd-leg", |f| f.pd.as_ref().map_or_else(String::new, |pd| format::duration_s(Some(pd.prefill_leg_mean_ms / 1e3))))}
                    {row("P/D: KV transfer, mean", "pd-transfer", |f| f.pd.as_ref().map_or_else(String::new, |pd| format::duration_s(Some(pd.transfer_mean_ms / 1e3))))}
                })}
            </tbody>
        </table>
        <p class="muted" data-testid="whatif-fidelity">{r.fidelity.as_ref().map_or_else(
            || "fidelity: the bench has not measured this kind of change (cargo xtask bench fidelity)".to_owned(),
            |f| f.summary.clone())}</p>
        <p class="muted" data-testid="whatif-overhead">{r.ttft_overhead_ms.map_or_else(
            || "TTFT: the engine model's alone (the traffic carries no recorded first tokens to measure the rest from)".to_owned(),
            |ms| format!("TTFT includes {ms:.1} ms a request spends outside the engine (router, HTTP, tokenising), \
                          measured from the recording: the median, over its requests under {}, of each one's TTFT less the replay's", r.active.policy))}</p>
        <p data-testid="whatif-coverage">{format!("Coverage: {}", r.coverage.summary)}</p>
        <p data-testid="whatif-router-model">{format!("Routers replayed: {}", r.router_model.summary)}</p>
        <p data-testid="whatif-profile-used">{format!(
            "Engine profile: {} ({}), {} KV blocks of {} tokens per replica{}: {}",
            r.profile.name, r.profile.model, r.profile.kv_blocks, r.profile.block_tokens,
            if r.profile.overridden { ", chosen by you" } else { "" }, r.profile.reason)}</p>
        <ul class="whatif-notes" data-testid="whatif-notes">
            {r.baseline_notes.iter().map(|n| view! { <li>{n.clone()}</li> }).collect_view()}
        </ul>
        <table class="replicas" data-testid="whatif-routers">
            <thead><tr><th>"router"</th><th>"runs"</th><th class="num">"requests read"</th><th></th></tr></thead>
            <tbody>
                {r.routers.iter().map(|router| view! {
                    <tr>
                        <td>{router.url.clone()}</td>
                        <td>{match (&router.policy, router.version) {
                            (Some(p), Some(v)) => format!("{p} v{v}"),
                            _ => "unknown".to_owned(),
                        }}</td>
                        <td class="num">{router.requests}</td>
                        <td>{match (&router.error, router.differs) {
                            (Some(e), _) => format!("unreachable: {e}"),
                            (None, true) => "differs from the baseline".to_owned(),
                            (None, false) => "baseline".to_owned(),
                        }}</td>
                    </tr>
                }).collect_view()}
            </tbody>
        </table>
        <div class="whatif-loads">
            <div><h3>"Load per replica: candidate"</h3>{loads(&r.candidate)}</div>
            <div><h3>"Load per replica: active"</h3>{loads(&r.active)}</div>
        </div>
    }
}
