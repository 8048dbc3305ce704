//! Push (`#/push`): pick routers, see the diff against the version each runs, confirm; each
//! router's outcome (applied version, refused with its reason, unreachable) from the routers'
//! compare-and-swap; drift badges. The canary lives here too (`canary-panel`): push to some
//! routers first, watch TTFT p95 (first token, successful answers), error rate and hit rate against
//! the rest, promote or roll back by itself. Its verdict ("holding", "not enough data", "crossed"),
//! each guard's reading and every router that moved on from the reviewed version are shown.

use fleetdeck_api::MovedRouter;
use fleetdeck_api::{
    AbortCanaryArgs, ApiError, CMD_ABORT_CANARY, CMD_CANARY_STATUS, CMD_POLICY_EDITOR, CMD_PUSH_POLICY,
    CMD_START_CANARY, CanaryArgs, CanaryGuards, CanaryStatus, CanaryView, PolicyEditor, PushArgs, PushReport,
    PushResult, PushTarget, SideFigures, SpecCheck,
};
use leptos::prelude::*;
use leptos::task::spawn_local;
use serde_json::json;

use crate::candidate::{check_as_you_type, stored_candidate};
use crate::components::{EmptyState, ErrorBanner};
use crate::format;
use crate::policy_diff::{diff_row, drift_view};
use crate::poll::{Polled, poll};
use crate::transport;

mod etcd;
use etcd::EtcdPanel;

#[component]
pub fn PushView() -> impl IntoView {
    let editor = poll::<_, PolicyEditor>(CMD_POLICY_EDITOR, || json!({}), 3000.0);
    let text = RwSignal::new(stored_candidate().unwrap_or_default());
    let check = RwSignal::new(None::<SpecCheck>);
    let check_error = RwSignal::new(None::<ApiError>);
    check_as_you_type(text, check, check_error);
    // Routers ticked for the push (by URL); all of them by default.
    let chosen = RwSignal::new(Vec::<String>::new());
    let canary_chosen = RwSignal::new(Vec::<String>::new());
    let initialised = RwSignal::new(false);
    Effect::new(move |_| {
        editor.data.with(|e| {
            if let Some(e) = e
                && !initialised.get_untracked()
            {
                initialised.set(true);
                chosen.set(e.routers.iter().map(|r| r.url.clone()).collect());
                canary_chosen.set(e.routers.first().map(|r| vec![r.url.clone()]).unwrap_or_default());
            }
        })
    });
    let report = RwSignal::new(None::<PushReport>);
    let push_error = RwSignal::new(None::<ApiError>);
    let pushing = RwSignal::new(false);

    let confirm = move |_| {
        let diffs = check.with_untracked(|c| c.as_ref().map(|c| c.diffs.clone()).unwrap_or_default());
        let targets = chosen
            .get_untracked()
            .into_iter()
            .map(|url| {
                // Condition the push on the version the operator saw in the diff.
                let if_version = diffs.iter().find(|d| d.url == url).and_then(|d| d.version);
                PushTarget { url, if_version }
            })
            .collect();
        let args = PushArgs { text: text.get_untracked(), targets, operator: None };
        pushing.set(true);
        spawn_local(async move {
            let result = transport::call::<_, PushReport>(CMD_PUSH_POLICY, &args).await;
            pushing.set(false);
            match result {
                Ok(r) => {
                    report.set(Some(r));
                    push_error.set(None);
                }
                Err(e) => {
                    report.set(None);
                    push_error.set(Some(e));
                }
            }
            editor.refresh.update(|n| *n += 1);
            // Re-diff against the versions the routers run now.
            text.update(|t| t.push(' '));
            text.update(|t| {
                t.pop();
            });
        });
    };

    let router_rows = move || {
        let routers = editor.data.with(|e| e.as_ref().map(|e| e.routers.clone()).unwrap_or_default());
        let diffs = check.with(|c| c.as_ref().map(|c| c.diffs.clone()).unwrap_or_default());
        routers
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let url = r.url.clone();
                let (u1, u2) = (url.clone(), url.clone());
                let diff = diffs.iter().find(|d| d.url == url).map(diff_row);
                view! {
                    <tr data-testid="push-router">
                        <td>
                            <input type="checkbox" data-testid=format!("push-pick-{i}")
                                prop:checked=move || chosen.with(|c| c.contains(&u1))
                                on:change=move |ev| {
                                    let on = event_target_checked(&ev);
                                    chosen.update(|c| {
                                        c.retain(|x| *x != u2);
                                        if on { c.push(u2.clone()); }
                                    });
                                } />
                        </td>
                        <td class="url">{url.clone()}</td>
                        <td>{r.policy.clone().unwrap_or_else(|| "—".to_owned())}" "{r.version.map(|v| format!("v{v}")).unwrap_or_default()}</td>
                        <td>{drift_view(&r.drift)}</td>
                    </tr>
                    <tr class="diff-under"><td></td><td colspan="3"><table class="inner">{diff}</table></td></tr>
                }
            })
            .collect_view()
    };

    view! {
        <section class="view push-view">
            <ErrorBanner error=editor.error what="the routers" />
            // A fleet whose policy lives in etcd is pushed there first; its routers refuse HTTP pushes.
            <Show when=move || editor.data.with(|e| e.as_ref().is_some_and(|e| e.etcd_key.is_some()))>
                <EtcdPanel text=text />
            </Show>
            <div class="card">
                <div class="card-head">
                    <h2>"Push a policy"</h2>
                    <span class="card-meta">"compare-and-swap: a router that changed since you looked refuses"</span>
                </div>
                <Show when=move || editor.data.with(|e| e.as_ref().is_some_and(|e| e.etcd_key.is_some()))>
                    <p class="muted small">"Routers that watch the etcd key refuse HTTP pushes (409 policy_from_store): push those through etcd above."</p>
                </Show>
                <textarea class="spec-text" rows="5" data-testid="push-spec"
                    prop:value=move || text.get()
                    on:input=move |ev| text.set(event_target_value(&ev))></textarea>
                {move || check.with(|c| c.as_ref().filter(|c| !c.valid).map(|c| {
                    let p = c.problem.clone();
                    view! {
                        <div class="banner banner-error" data-testid="spec-problem">
                            {p.map(|p| format!("{}{}", p.field.map(|f| format!("{f}: ")).unwrap_or_default(), p.message)).unwrap_or_default()}
                        </div>
                    }
                }))}
                <table class="replicas" data-testid="push-routers">
                    <thead><tr><th></th><th>"Router"</th><th>"Runs"</th><th>"Drift"</th></tr></thead>
                    <tbody>{router_rows}</tbody>
                </table>
                <Show when=move || editor.data.with(|e| e.as_ref().is_some_and(|e| e.routers.is_empty()))>
                    <EmptyState title="No router is configured." hint="Add a fleet-router with its admin token in Settings." />
                </Show>
                <div class="toolbar">
                    <button class="primary" data-testid="push-confirm" on:click=confirm
                        disabled=move || pushing.get() || chosen.with(Vec::is_empty)>
                        {move || if pushing.get() { "Pushing…" } else { "Confirm push" }}
                    </button>
                </div>
                <ErrorBanner error=push_error what="the push" />
                <div data-testid="push-result">
                    {move || report.get().map(|r| view! {
                        <p class="muted">{format!("version {} by {}", r.label, r.author)}</p>
                        <table class="replicas">
                            <tbody>
                                {r.results.into_iter().map(|p| {
                                    // A short badge, then the router's own words: an error
                                    // message must stay readable, not upper-cased into a pill.
                                    let (class, outcome, detail) = match &p.result {
                                        PushResult::Applied { version } => ("badge badge-ok", "applied", format!("v{version}")),
                                        PushResult::Refused { status: 409, code, message } if code == "version_conflict" => ("badge badge-pending", "moved", message.clone()),
                                        PushResult::Refused { status, code, message } => ("badge badge-error", "refused", format!("{status} {code}: {message}")),
                                        PushResult::Unreachable { error } => ("badge badge-pending", "unreachable", error.clone()),
                                    };
                                    view! {
                                        <tr data-testid="push-outcome" data-outcome=outcome>
                                            <td class="url">{p.url.clone()}</td>
                                            <td>{p.if_version.map(|v| format!("if v{v}")).unwrap_or_default()}</td>
                                            <td><span class=class>{outcome}</span>" "<span class="detail">{detail}</span></td>
                                        </tr>
                                    }
                                }).collect_view()}
                            </tbody>
                        </table>
                    })}
                </div>
            </div>
            <CanaryPanel editor=editor text=text canary_chosen=canary_chosen check=check />
        </section>
    }
}

fn side(f: &SideFigures) -> String {
    let errors = if f.requests > 0 { Some(f.errors as f64 / f.requests as f64) } else { None };
    format!(
        "{} requests · {} errors ({}) · TTFT p95 {} · hit {}",
        f.requests,
        f.errors,
        format::percent(errors),
        format::duration_s(f.ttft_p95_s),
        format::percent(f.hit_rate)
    )
}

/// Shows the canary runner's default in a guard's field, unless the operator has typed there already.
fn fill_default(field: RwSignal<String>, default: Option<impl std::fmt::Display>) {
    if let Some(value) = default
        && field.with_untracked(|text| text.trim().is_empty())
    {
        field.set(value.to_string());
    }
}

fn moved_line(m: &MovedRouter) -> String {
    format!("{} ({}): {}", m.url, m.step, m.message)
}

#[component]
fn CanaryPanel(
    editor: Polled<PolicyEditor>,
    text: RwSignal<String>,
    canary_chosen: RwSignal<Vec<String>>,
    check: RwSignal<Option<SpecCheck>>,
) -> impl IntoView {
    let status = poll::<_, CanaryView>(CMD_CANARY_STATUS, || json!({}), 1000.0);
    let observe_s = RwSignal::new("60".to_owned());
    // The guards start empty and take the canary runner's own defaults when the editor answers
    // (`PolicyEditor::canary_defaults`), so the form never shows a number the runner does not use.
    let ratio = RwSignal::new(String::new());
    let increase_ms = RwSignal::new(String::new());
    let drop = RwSignal::new(String::new());
    let min_requests = RwSignal::new(String::new());
    let error_ratio = RwSignal::new(String::new());
    let error_increase = RwSignal::new(String::new());
    let require_hit = RwSignal::new(None::<bool>);
    let defaults_arrived = RwSignal::new(false);
    Effect::new(move |_| {
        editor.data.with(|e| {
            if let Some(e) = e
                && !defaults_arrived.get_untracked()
            {
                defaults_arrived.set(true);
                let d = e.canary_defaults;
                fill_default(ratio, d.max_ttft_p95_ratio);
                fill_default(increase_ms, d.min_ttft_p95_increase_ms);
                fill_default(drop, d.max_hit_rate_drop);
                fill_default(min_requests, d.min_requests);
                fill_default(error_ratio, d.max_error_rate_ratio);
                fill_default(error_increase, d.min_error_rate_increase);
                if require_hit.get_untracked().is_none() {
                    require_hit.set(d.require_hit_rate);
                }
            }
        })
    });
    let error = RwSignal::new(None::<ApiError>);

    let start = move |_| {
        let routers =
            editor.data.with_untracked(|e| e.as_ref().map(|e| e.routers.clone()).unwrap_or_default());
        let canary = canary_chosen.get_untracked();
        let baseline = routers.iter().map(|r| r.url.clone()).filter(|u| !canary.contains(u)).collect();
        let parse = |s: RwSignal<String>, name: &str| -> Result<f64, ApiError> {
            s.get_untracked()
                .trim()
                .parse::<f64>()
                .map_err(|_| ApiError::new("bad_request", format!("{name} must be a number")))
        };
        // Every change the canary makes is conditioned on the version the operator saw in the diff.
        let diffs = check.with_untracked(|c| c.as_ref().map(|c| c.diffs.clone()).unwrap_or_default());
        let reviewed =
            diffs.iter().map(|d| PushTarget { url: d.url.clone(), if_version: d.version }).collect();
        let args = (|| -> Result<CanaryArgs, ApiError> {
            Ok(CanaryArgs {
                text: text.get_untracked(),
                canary,
                baseline,
                observe_s: parse(observe_s, "observe seconds")? as u64,
                // Every guard is sent as the form shows it, so the canary judges by what the
                // operator read; start is only enabled once the defaults have filled the form.
                guards: CanaryGuards {
                    max_ttft_p95_ratio: Some(parse(ratio, "TTFT p95 ratio")?),
                    min_ttft_p95_increase_ms: Some(parse(increase_ms, "TTFT p95 increase (ms)")?),
                    max_hit_rate_drop: Some(parse(drop, "hit-rate drop")?),
                    min_requests: Some(parse(min_requests, "minimum requests")? as u64),
                    max_error_rate_ratio: Some(parse(error_ratio, "error-rate ratio")?),
                    min_error_rate_increase: Some(parse(error_increase, "error-rate increase")?),
                    require_hit_rate: require_hit.get_untracked(),
                },
                check_every_ms: None,
                operator: None,
                reviewed,
            })
        })();
        match args {
            Err(e) => error.set(Some(e)),
            Ok(args) => spawn_local(async move {
                let result = transport::call::<_, CanaryStatus>(CMD_START_CANARY, &args).await;
                error.set(result.err());
                status.refresh.update(|n| *n += 1);
            }),
        }
    };
    let abort = move |_| {
        spawn_local(async move {
            let args = AbortCanaryArgs { reason: "stopped from the Push view".to_owned() };
            let result = transport::call::<_, CanaryView>(CMD_ABORT_CANARY, &args).await;
            error.set(result.err());
            status.refresh.update(|n| *n += 1);
        });
    };
    let field = |label: &'static str, testid: &'static str, value: RwSignal<String>| {
        view! {
            <label>{label}
                <input type="text" size="6" data-testid=testid prop:value=move || value.get()
                    on:input=move |ev| value.set(event_target_value(&ev)) />
            </label>
        }
    };

    view! {
        <div class="card" data-testid="canary-panel">
            <div class="card-head">
                <h2>"Canary"</h2>
                <span class="card-meta">"push to some routers first; the rest is the baseline"</span>
            </div>
            <div class="toolbar">
                <span>"Canary routers: "</span>
                {move || editor.data.with(|e| e.as_ref().map(|e| e.routers.clone()).unwrap_or_default())
                    .into_iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let (u1, u2) = (r.url.clone(), r.url.clone());
                        view! {
                            <label class="check">
                                <input type="checkbox" data-testid=format!("canary-pick-{i}")
                                    prop:checked=move || canary_chosen.with(|c| c.contains(&u1))
                                    on:change=move |ev| {
                                        let on = event_target_checked(&ev);
                                        canary_chosen.update(|c| {
                                            c.retain(|x| *x != u2);
                                            if on { c.push(u2.clone()); }
                                        });
                                    } />
                                {format::short_url(&r.url).to_owned()}
                            </label>
                        }
                    })
                    .collect_view()}
            </div>
            <div class="toolbar">
                {field("watch (s) ", "canary-observe", observe_s)}
                {field(" roll back if TTFT p95 > x ", "canary-ratio", ratio)}
                {field(" and by ms ", "canary-increase", increase_ms)}
                {field(" or hit rate drops by ", "canary-drop", drop)}
                {field(" or error rate > x ", "canary-error-ratio", error_ratio)}
                {field(" and by ", "canary-error-increase", error_increase)}
                {field(" judged after requests ", "canary-min", min_requests)}
                <label class="check">
                    // Neither ticked nor not until the runner's default is known.
                    <input type="checkbox" data-testid="canary-require-hit"
                        prop:checked=move || require_hit.get().unwrap_or(false)
                        prop:indeterminate=move || require_hit.get().is_none()
                        on:change=move |ev| require_hit.set(Some(event_target_checked(&ev))) />
                    "hit rate required"
                </label>
                <button class="primary" data-testid="canary-start" on:click=start
                    disabled=move || !defaults_arrived.get()
                    title=move || (!defaults_arrived.get()).then_some("waiting for the canary runner's default guards")>
                    "Start canary"
                </button>
                <button data-testid="canary-abort" on:click=abort
                    disabled=move || !status.data.with(|s| s.as_ref().and_then(|s| s.canary.as_ref()).is_some_and(|c| !c.finished))>"Abort"</button>
            </div>
            <ErrorBanner error=error what="the canary" />
            {move || status.data.with(|s| s.as_ref().and_then(|s| s.canary.clone())).map(|c| view! {
                <div class="canary-status" data-testid="canary-status" data-phase=c.phase.clone()>
                    <p>
                        <span class="badge" data-testid="canary-phase">{c.phase.clone()}</span>
                        {format!(" {} on {} vs {}", c.label, c.canary.join(", "), c.baseline.join(", "))}
                    </p>
                    {c.reason.clone().map(|r| view! { <p class="banner banner-warn" data-testid="canary-reason">{r}</p> })}
                    <p data-testid="canary-side">{format!("canary: {}", side(&c.canary_side))}</p>
                    <p data-testid="baseline-side">{format!("baseline: {}", side(&c.baseline_side))}</p>
                    {c.measure_error.clone().map(|e| view! { <p class="muted">{format!("last measurement failed: {e}")}</p> })}
                    {c.verdict.clone().map(|v| {
                        let class = match v.as_str() {
                            "holding" => "badge badge-ok",
                            "crossed" => "badge badge-error",
                            _ => "badge badge-warn",
                        };
                        view! {
                            <p data-testid="canary-verdict" data-verdict=v.clone()>
                                <span class=class>{format::verdict_words(&v)}</span>
                                {(!c.missing.is_empty()).then(|| format!(" {}", c.missing.join("; ")))}
                            </p>
                        }
                    })}
                    <ul class="guards" data-testid="canary-guards">
                        {c.readings.iter().map(|r| view! {
                            <li data-testid="canary-guard" data-guard=r.guard.clone() data-state=r.state.clone()>
                                {format::guard_line(r)}
                            </li>
                        }).collect_view()}
                    </ul>
                    {(!c.moved.is_empty()).then(|| view! {
                        <div class="banner banner-warn" data-testid="canary-moved">
                            <p>"Routers that moved on from the version you reviewed were left as they are:"</p>
                            <ul>{c.moved.iter().map(|m| view! { <li data-testid="moved-router">{moved_line(m)}</li> }).collect_view()}</ul>
                        </div>
                    })}
                    <ol class="steps" data-testid="canary-steps">
                        {c.steps.iter().map(|s| view! { <li>{format!("{} · {}", s.phase, s.detail)}</li> }).collect_view()}
                    </ol>
                </div>
            })}
        </div>
    }
}
