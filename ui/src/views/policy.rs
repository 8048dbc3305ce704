//! Policy editor (`#/policy`): pick a policy, set each parameter with a control fitted to it
//! (slider and number, switch, choice) showing its default, range and meaning; the policy
//! crate's validation as you type; a raw YAML/JSON view; the diff against what each router runs.
//!
//! The candidate text is kept in local storage (`candidate.rs`), so What-if and Push work on the
//! same spec.

use fleetdeck_api::{ApiError, CMD_POLICY_EDITOR, ParamInfo, PolicyEditor, SpecCheck};
use leptos::prelude::*;
use serde_json::{Map, Value, json};

use crate::candidate::{check_as_you_type, store_candidate, stored_candidate};
use crate::components::{EmptyState, ErrorBanner};
use crate::policy_diff::{diff_row, drift_view};
use crate::poll::poll;

/// `{policy, params, pd}` as the pretty JSON the raw view shows (empty sections left out).
fn compose(policy: &str, params: &Map<String, Value>, pd: &Map<String, Value>) -> String {
    let mut doc = Map::new();
    doc.insert("policy".to_owned(), json!(policy));
    if !params.is_empty() {
        doc.insert("params".to_owned(), Value::Object(params.clone()));
    }
    // The P/D thresholds belong to the fleet, not the policy: kept whatever the form changes.
    if !pd.is_empty() {
        doc.insert("pd".to_owned(), Value::Object(pd.clone()));
    }
    serde_json::to_string_pretty(&Value::Object(doc)).unwrap_or_default()
}

#[component]
pub fn PolicyView() -> impl IntoView {
    let editor = poll::<_, PolicyEditor>(CMD_POLICY_EDITOR, || json!({}), 5000.0);
    let text = RwSignal::new(stored_candidate().unwrap_or_default());
    let policy = RwSignal::new(String::new());
    let params = RwSignal::new(Map::<String, Value>::new());
    let pd = RwSignal::new(Map::<String, Value>::new());
    let check = RwSignal::new(None::<SpecCheck>);
    let check_error = RwSignal::new(None::<ApiError>);
    let raw_yaml = RwSignal::new(true);

    // Start from what the fleet runs when there is no candidate yet.
    Effect::new(move |_| {
        if !text.get_untracked().trim().is_empty() {
            return;
        }
        editor.data.with(|e| {
            if let Some(e) = e {
                let start = e
                    .intended_json
                    .clone()
                    .or_else(|| e.routers.iter().find_map(|r| r.spec_json.clone()))
                    .unwrap_or_else(|| compose("round_robin", &Map::new(), &Map::new()));
                text.set(start);
            }
        });
    });
    check_as_you_type(text, check, check_error);
    Effect::new(move |_| store_candidate(&text.get()));
    // A valid text (typed or composed) sets the controls.
    Effect::new(move |_| {
        check.with(|c| {
            if let Some(c) = c.as_ref().filter(|c| c.valid)
                && let Some(doc) = c.json.as_deref().and_then(|j| serde_json::from_str::<Value>(j).ok())
            {
                policy.set(doc["policy"].as_str().unwrap_or_default().to_owned());
                params.set(doc["params"].as_object().cloned().unwrap_or_default());
                pd.set(doc["pd"].as_object().cloned().unwrap_or_default());
            }
        })
    });
    let recompose =
        move || text.set(compose(&policy.get_untracked(), &params.get_untracked(), &pd.get_untracked()));
    let set_in = move |section: RwSignal<Map<String, Value>>, name: String, value: Option<Value>| {
        section.update(|p| {
            match value {
                Some(v) => p.insert(name, v),
                None => p.remove(&name),
            };
        });
        recompose();
    };
    let set_param = move |name: String, value: Option<Value>| set_in(params, name, value);
    let set_pd = move |name: String, value: Option<Value>| set_in(pd, name, value);
    let choose_policy = move |name: String| {
        policy.set(name.clone());
        params.set(Map::new());
        recompose();
    };
    let pd_controls = move || {
        let infos = editor.data.with(|e| e.as_ref().map(|e| e.pd_params.clone()).unwrap_or_default());
        infos.into_iter().map(|p| param_control(p, pd, "pd", check, set_pd)).collect_view()
    };

    let controls = move || {
        let selected = policy.get();
        let infos = editor.data.with(|e| e.as_ref().map(|e| e.policies.clone()).unwrap_or_default());
        let Some(info) = infos.iter().find(|p| p.name == selected).cloned() else {
            return view! { <p class="muted">"Pick a policy to see its parameters."</p> }.into_any();
        };
        if info.params.is_empty() {
            return view! { <p class="muted">"This policy takes no parameters."</p> }.into_any();
        }
        info.params
            .into_iter()
            .map(|p| param_control(p, params, "params", check, set_param))
            .collect_view()
            .into_any()
    };

    view! {
        <section class="view policy-view" data-testid="policy-editor">
            <ErrorBanner error=editor.error what="the routers' policies" />
            <div class="card">
                <div class="card-head">
                    <h2>"Policy editor"</h2>
                    <span class="card-meta">"validated by fleet-policy as you type; nothing is sent until you push"</span>
                </div>
                <div class="toolbar">
                    <label>"Policy "
                        <select
                            data-testid="policy-select"
                            prop:value=move || policy.get()
                            on:change=move |ev| choose_policy(event_target_value(&ev))
                        >
                            {move || editor.data.with(|e| e.as_ref().map(|e| e.policies.clone()).unwrap_or_default())
                                .into_iter()
                                .map(|p| {
                                    let name = p.name.clone();
                                    let selected = name == policy.get_untracked();
                                    view! { <option value=name.clone() selected=selected title=p.summary.clone()>{name.clone()}</option> }
                                })
                                .collect_view()}
                        </select>
                    </label>
                    <span class="muted policy-summary">
                        {move || {
                            let selected = policy.get();
                            editor.data.with(|e| e.as_ref().and_then(|e| e.policies.iter().find(|p| p.name == selected).map(|p| p.summary.clone())).unwrap_or_default())
                        }}
                    </span>
                </div>
                <div class="param-grid">{controls}</div>
                <details class="pd-thresholds" data-testid="pd-thresholds">
                    <summary>"P/D thresholds (used where replicas are tagged role=prefill; kept whatever the policy)"</summary>
                    <div class="param-grid">{pd_controls}</div>
                </details>
                <div class="spec-status" data-testid="spec-status">
                    {move || check.with(|c| match c {
                        None => view! { <span class="muted">"checking…"</span> }.into_any(),
                        Some(c) if c.valid => view! { <span class="badge badge-ok" data-testid="spec-valid">"valid"</span> }.into_any(),
                        Some(c) => {
                            let p = c.problem.clone();
                            view! {
                                <div class="banner banner-error" data-testid="spec-problem">
                                    <strong>{p.as_ref().and_then(|p| p.field.clone()).map(|f| format!("{f}: ")).unwrap_or_default()}</strong>
                                    {p.map(|p| p.message).unwrap_or_default()}
                                </div>
                            }.into_any()
                        }
                    })}
                    <ErrorBanner error=check_error what="the validation" />
                </div>
            </div>
            <div class="card">
                <div class="card-head">
                    <h2>"Raw spec"</h2>
                    <div class="segmented">
                        <button class:active=move || raw_yaml.get() on:click=move |_| raw_yaml.set(true)>"YAML"</button>
                        <button class:active=move || !raw_yaml.get() on:click=move |_| raw_yaml.set(false)>"JSON"</button>
                    </div>
                </div>
                <textarea
                    class="spec-text"
                    rows="10"
                    data-testid="spec-text"
                    prop:value=move || text.get()
                    on:input=move |ev| text.set(event_target_value(&ev))
                ></textarea>
                <pre class="spec-normalised" data-testid="spec-normalised">
                    {move || check.with(|c| c.as_ref().and_then(|c| if raw_yaml.get() { c.yaml.clone() } else { c.json.clone() }).unwrap_or_default())}
                </pre>
            </div>
            <div class="card">
                <div class="card-head">
                    <h2>"Against what each router runs"</h2>
                    <a class="button" href="#/whatif" data-testid="goto-whatif">"Preview (what-if)"</a>
                    <a class="button" href="#/push" data-testid="goto-push">"Push…"</a>
                </div>
                <table class="replicas" data-testid="spec-diff">
                    <thead><tr><th>"Router"</th><th class="num">"Runs"</th><th>"Change"</th><th>"Drift"</th></tr></thead>
                    <tbody>
                        {move || {
                            let badges = editor.data.with(|e| e.as_ref().map(|e| e.routers.clone()).unwrap_or_default());
                            check.with(|c| c.as_ref().map(|c| c.diffs.clone()).unwrap_or_default())
                                .into_iter()
                                .map(|d| {
                                    let badge = badges.iter().find(|r| r.url == d.url).map(|r| drift_view(&r.drift));
                                    view! { {diff_row(&d)} <tr class="drift-row"><td colspan="4">{badge}</td></tr> }
                                })
                                .collect_view()
                        }}
                    </tbody>
                </table>
                <Show when=move || editor.data.with(|e| e.as_ref().is_some_and(|e| e.routers.is_empty()))>
                    <EmptyState title="No router is configured." hint="Add a fleet-router with its admin token in Settings to diff and push." />
                </Show>
            </div>
        </section>
    }
}

/// One parameter's control (of the spec's `section`, `params` or `pd`), with its default, range, meaning
/// and any validation message.
fn param_control(
    p: ParamInfo,
    params: RwSignal<Map<String, Value>>,
    section: &'static str,
    check: RwSignal<Option<SpecCheck>>,
    set_param: impl Fn(String, Option<Value>) + Copy + 'static,
) -> impl IntoView {
    let name = p.name.clone();
    let default: Value = serde_json::from_str(&p.default_json).unwrap_or(Value::Null);
    let current = {
        let (name, default) = (name.clone(), default.clone());
        move || params.with(|m| m.get(&name).cloned().unwrap_or_else(|| default.clone()))
    };
    let field = format!("{section}.{name}");
    let problem = move || {
        check.with(|c| {
            c.as_ref()
                .and_then(|c| c.problem.as_ref())
                .filter(|p| p.field.as_deref() == Some(field.as_str()))
                .map(|p| p.message.clone())
        })
    };
    let testid =
        if section == "params" { format!("param-{name}") } else { format!("{section}-param-{name}") };
    let input = match p.kind.as_str() {
        "integer" | "float" => {
            let integer = p.kind == "integer";
            let (min, max) = (p.min.unwrap_or(0.0), p.max.unwrap_or(1.0));
            let step = if integer { 1.0 } else { ((max - min) / 200.0).max(0.001) };
            let to_value = move |text: String| -> Option<Value> {
                let x: f64 = text.trim().parse().ok()?;
                Some(if integer && x.fract() == 0.0 { json!(x as i64) } else { json!(x) })
            };
            let (n1, n2) = (name.clone(), name.clone());
            let (c1, c2) = (current.clone(), current.clone());
            view! {
                <input type="range" min=min.to_string() max=max.to_string() step=step.to_string()
                    prop:value=move || c1().as_f64().map(|v| v.to_string()).unwrap_or_default()
                    on:input=move |ev| if let Some(v) = to_value(event_target_value(&ev)) { set_param(n1.clone(), Some(v)) } />
                <input type="number" step=step.to_string() data-testid=testid
                    prop:value=move || c2().as_f64().map(|v| v.to_string()).unwrap_or_default()
                    on:change=move |ev| {
                        let text = event_target_value(&ev);
                        // Out-of-range or malformed numbers go through as typed so the policy crate explains them.
                        let value = to_value(text.clone()).unwrap_or(Value::String(text));
                        set_param(n2.clone(), Some(value))
                    } />
            }
            .into_any()
        }
        "bool" => {
            let n = name.clone();
            view! {
                <input type="checkbox" data-testid=testid
                    prop:checked=move || current().as_bool().unwrap_or(false)
                    on:change=move |ev| set_param(n.clone(), Some(json!(event_target_checked(&ev)))) />
            }
            .into_any()
        }
        _ => {
            let n = name.clone();
            let options = p.options.clone();
            view! {
                <select data-testid=testid
                    prop:value=move || current().as_str().unwrap_or_default().to_owned()
                    on:change=move |ev| set_param(n.clone(), Some(json!(event_target_value(&ev))))>
                    {options.into_iter().map(|o| view! { <option value=o.clone()>{o.clone()}</option> }).collect_view()}
                </select>
            }
            .into_any()
        }
    };
    let range = match (p.min, p.max) {
        (Some(a), Some(b)) => format!("{a} – {b}"),
        _ if !p.options.is_empty() => p.options.join(" | "),
        _ => "true | false".to_owned(),
    };
    let reset_name = name.clone();
    view! {
        <div class="param" data-testid="param">
            <div class="param-head">
                <b>{name.clone()}</b>
                <span class="muted">{format!(" default {} · range {range}", p.default_json)}</span>
                <button class="link" title="use the default" on:click=move |_| set_param(reset_name.clone(), None)>"reset"</button>
            </div>
            <div class="param-input">{input}</div>
            <div class="param-meaning muted">{p.meaning.clone()}</div>
            {move || problem().map(|m| view! { <div class="field-error" data-testid="field-error">{m}</div> })}
        </div>
    }
}
