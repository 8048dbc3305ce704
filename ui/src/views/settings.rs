//! Fleets and settings (`#/settings`): replica URLs, Prometheus servers as sources, routers and
//! their admin tokens (kept in 0600 files, never in the database), and the scrape interval.
//! An endpoint added here is probed at once and shows what was detected.

use fleetdeck_api::{
    AddEndpointArgs, ApiError, CMD_ADD_ENDPOINT, CMD_REMOVE_ENDPOINT, CMD_SET_SCRAPE_INTERVAL, CMD_SETTINGS,
    EndpointKind, ProbeReport, RemoveEndpointArgs, ScrapeIntervalArgs, SettingsView as Settings,
};
use leptos::prelude::*;
use leptos::task::spawn_local;

use crate::components::{ErrorBanner, Progress};
use crate::poll::poll;
use crate::transport;

fn kind_slug(kind: EndpointKind) -> &'static str {
    match kind {
        EndpointKind::Replica => "replica",
        EndpointKind::Router => "router",
        EndpointKind::Prometheus => "prometheus",
    }
}

#[component]
pub fn SettingsView() -> impl IntoView {
    let settings = poll::<_, Settings>(CMD_SETTINGS, || serde_json::json!({}), 3000.0);
    let kind = RwSignal::new(EndpointKind::Replica);
    let url = RwSignal::new(String::new());
    let token = RwSignal::new(String::new());
    let adding = RwSignal::new(None::<String>);
    let probe = RwSignal::new(None::<Result<ProbeReport, ApiError>>);
    let interval = RwSignal::new(String::new());
    let interval_note = RwSignal::new(None::<Result<String, ApiError>>);
    let action_error = RwSignal::new(None::<ApiError>);

    // Show the current interval once it is known, without overwriting what is being typed.
    Effect::new(move |_| {
        if let Some(s) = settings.data.get()
            && interval.get_untracked().is_empty()
        {
            interval.set(format!("{}", s.scrape_interval_s));
        }
    });

    let add = move || {
        let args = AddEndpointArgs {
            kind: kind.get_untracked(),
            url: url.get_untracked(),
            token: (kind.get_untracked() == EndpointKind::Router).then(|| token.get_untracked()),
        };
        adding.set(Some(args.url.clone()));
        probe.set(None);
        spawn_local(async move {
            let result = transport::call::<_, ProbeReport>(CMD_ADD_ENDPOINT, &args).await;
            adding.set(None);
            if result.is_ok() {
                url.set(String::new());
                token.set(String::new());
            }
            probe.set(Some(result));
            settings.refresh.update(|n| *n += 1);
        });
    };
    let remove = move |kind: EndpointKind, url: String| {
        spawn_local(async move {
            let result =
                transport::call::<_, ()>(CMD_REMOVE_ENDPOINT, &RemoveEndpointArgs { kind, url }).await;
            action_error.set(result.err());
            settings.refresh.update(|n| *n += 1);
        });
    };
    let save_interval = move || {
        let text = interval.get_untracked();
        spawn_local(async move {
            let result = match text.trim().parse::<f64>() {
                Ok(seconds) => {
                    transport::call::<_, ()>(CMD_SET_SCRAPE_INTERVAL, &ScrapeIntervalArgs { seconds })
                        .await
                        .map(|()| format!("scraping every {seconds} s"))
                }
                Err(_) => Err(ApiError::new("bad_request", format!("{text:?} is not a number of seconds"))),
            };
            interval_note.set(Some(result));
            settings.refresh.update(|n| *n += 1);
        });
    };

    view! {
        <section class="view settings" data-testid="settings">
            <ErrorBanner error=settings.error what="the settings" />
            <ErrorBanner error=action_error what="that endpoint" />
            <div class="card">
                <div class="card-head">
                    <h2>"Add an endpoint"</h2>
                    <span class="card-meta">"probed at once; it shows what it detected"</span>
                </div>
                <form class="toolbar add-form" on:submit=move |ev| { ev.prevent_default(); add(); }>
                    <select
                        data-testid="settings-kind"
                        on:change=move |ev| kind.set(match event_target_value(&ev).as_str() {
                            "router" => EndpointKind::Router,
                            "prometheus" => EndpointKind::Prometheus,
                            _ => EndpointKind::Replica,
                        })
                    >
                        {[EndpointKind::Replica, EndpointKind::Router, EndpointKind::Prometheus]
                            .into_iter()
                            .map(|k| view! { <option value=kind_slug(k) selected=move || kind.get() == k>{match k {
                                EndpointKind::Replica => "Replica (metrics URL)",
                                EndpointKind::Router => "fleet-router (admin API)",
                                EndpointKind::Prometheus => "Prometheus server",
                            }}</option> })
                            .collect_view()}
                    </select>
                    <input
                        type="url"
                        class="wide"
                        placeholder="http://10.0.0.5:8000"
                        data-testid="settings-url"
                        prop:value=move || url.get()
                        on:input=move |ev| url.set(event_target_value(&ev))
                    />
                    <Show when=move || kind.get() == EndpointKind::Router>
                        <input
                            type="password"
                            placeholder="admin token"
                            autocomplete="off"
                            data-testid="settings-token"
                            prop:value=move || token.get()
                            on:input=move |ev| token.set(event_target_value(&ev))
                        />
                    </Show>
                    <button type="submit" class="primary" data-testid="settings-add" disabled=move || adding.with(Option::is_some)>
                        "Add"
                    </button>
                    {move || adding.get().map(|u| view! { <Progress text=Signal::derive(move || format!("probing {u}…")) /> })}
                </form>
                {move || probe.get().map(|result| match result {
                    Ok(report) => {
                        let ok = report.error.is_none();
                        let text = match (&report.detected, &report.detail, &report.error) {
                            (_, _, Some(e)) => format!("Added {}, but the probe failed: {e}. It will be retried at every scrape.", report.url),
                            (Some(d), Some(detail), None) => format!("Added {}: detected {d} ({detail}).", report.url),
                            (Some(d), None, None) => format!("Added {}: detected {d}.", report.url),
                            _ => format!("Added {}.", report.url),
                        };
                        view! { <div class="probe-result" class:probe-error=!ok data-testid="probe-result">{text}</div> }.into_any()
                    }
                    Err(e) => view! { <div class="probe-result probe-error" data-testid="probe-result">{format!("Not added: {}", e.message)}</div> }.into_any(),
                })}
                <p class="muted small">
                    "Router tokens are written to a file only you can read (mode 0600) in "
                    <span class="mono">{move || settings.data.with(|s| s.as_ref().map(|s| s.token_dir.clone()).unwrap_or_default())}</span>
                    "; the history database stores only the file's path."
                </p>
            </div>

            <EndpointList title="Replicas" testid="settings-replica" kind=EndpointKind::Replica settings=settings.data remove=remove
                empty="No replicas yet: add a replica's base URL or /metrics URL above."
                items=|s: &Settings| s.replicas.iter().map(|r| (r.clone(), None)).collect() />
            <EndpointList title="Routers" testid="settings-router" kind=EndpointKind::Router settings=settings.data remove=remove
                empty="No routers yet: add a fleet-router URL and its admin token to see cache heat, decisions and headroom."
                items=|s: &Settings| s.routers.iter().map(|r| (r.probe.clone(), r.token_file.clone())).collect() />
            <EndpointList title="Prometheus sources" testid="settings-prometheus" kind=EndpointKind::Prometheus settings=settings.data remove=remove
                empty="No Prometheus server: add one to watch replicas it already scrapes."
                items=|s: &Settings| s.prometheus.iter().map(|r| (r.clone(), None)).collect() />

            <DiscoveryList settings=settings.data />
            <div class="card">
                <div class="card-head"><h2>"Scrape interval"</h2></div>
                // novalidate: the backend's message names the allowed range; the browser's
                // own tooltip for `min` would block the submit without saying it.
                <form class="toolbar" novalidate on:submit=move |ev| { ev.prevent_default(); save_interval(); }>
                    <input
                        type="number"
                        min="0.2"
                        max="300"
                        step="0.1"
                        class="narrow"
                        data-testid="scrape-interval"
                        prop:value=move || interval.get()
                        on:input=move |ev| interval.set(event_target_value(&ev))
                    />
                    "seconds"
                    <button type="submit" data-testid="save-interval">"Save"</button>
                    {move || interval_note.get().map(|r| match r {
                        Ok(text) => view! { <span class="muted" data-testid="interval-note">{text}</span> }.into_any(),
                        Err(e) => view! { <span class="probe-error" data-testid="interval-note">{e.message}</span> }.into_any(),
                    })}
                </form>
            </div>
        </section>
    }
}

/// An endpoint list's rows: what probing found and the token file, if any.
type ListItems = fn(&Settings) -> Vec<(ProbeReport, Option<String>)>;

/// One list of configured endpoints with what probing found and a remove button each.
#[component]
fn EndpointList(
    title: &'static str,
    testid: &'static str,
    kind: EndpointKind,
    settings: RwSignal<Option<Settings>>,
    remove: impl Fn(EndpointKind, String) + Copy + Send + Sync + 'static,
    empty: &'static str,
    items: ListItems,
) -> impl IntoView {
    view! {
        <div class="card">
            <div class="card-head"><h2>{title}</h2></div>
            <ul class="endpoint-list">
                {move || settings.with(|s| {
                    let list = s.as_ref().map(items).unwrap_or_default();
                    if list.is_empty() {
                        return view! { <li class="muted">{empty}</li> }.into_any();
                    }
                    list.into_iter().map(|(report, token_file)| {
                        let url = report.url.clone();
                        let detected = match (&report.detected, &report.detail) {
                            (Some(d), Some(detail)) => format!("{d} · {detail}"),
                            (Some(d), None) => d.clone(),
                            _ => "not detected yet".to_owned(),
                        };
                        view! {
                            <li data-testid=testid class:probe-error=report.error.is_some()>
                                <span class="mono">{report.url.clone()}</span>
                                <span class="badge badge-engine" data-testid="detected">{detected}</span>
                                {token_file.map(|f| view! { <span class="muted small">{format!("token: {f}")}</span> })}
                                {report.error.clone().map(|e| view! { <span class="error-message">{e}</span> })}
                                <button class="link" on:click=move |_| remove(kind, url.clone())>"Remove"</button>
                            </li>
                        }
                    }).collect_view().into_any()
                })}
            </ul>
        </div>
    }
}

/// The discovery sources and the etcd policy key, when the app was started with them: what each source
/// found last, how often it has been read, and why its last read failed (what it found before stays).
#[component]
fn DiscoveryList(settings: RwSignal<Option<Settings>>) -> impl IntoView {
    view! {
        <Show when=move || settings.with(|s| s.as_ref().is_some_and(|s| !s.discovery.is_empty() || s.etcd.is_some()))>
            <div class="card" data-testid="settings-discovery">
                <div class="card-head">
                    <h2>"Discovery and policy store"</h2>
                    <span class="card-meta">"read again every scrape interval"</span>
                </div>
                <ul class="endpoint-list">
                    {move || settings.with(|s| {
                        let Some(s) = s else { return Vec::new() };
                        s.discovery.iter().map(|d| {
                            let found = format!(
                                "{} replicas, {} routers · read {} times{}",
                                d.replicas.len(),
                                d.routers.len(),
                                d.reads,
                                d.last_read_ms.map(|ms| format!(", last at {}", crate::clock::local_clock(ms as i64))).unwrap_or_default()
                            );
                            view! {
                                <li data-testid="discovery-source" class:probe-error=d.error.is_some()>
                                    <span class="mono">{d.source.clone()}</span>
                                    <span class="badge badge-engine" data-testid="discovery-found">{found}</span>
                                    {d.error.clone().map(|e| view! {
                                        <span class="error-message" data-testid="discovery-error">{format!("{e} (keeping what it found before)")}</span>
                                    })}
                                </li>
                            }.into_any()
                        }).chain(s.etcd.iter().map(|p| view! {
                            <li data-testid="settings-policy-store">
                                <span class="mono">{format!("etcd {} key {}", p.endpoints.join(","), p.key)}</span>
                                <span class="badge badge-engine">"policy store"</span>
                            </li>
                        }.into_any())).collect::<Vec<_>>()
                    })}
                </ul>
            </div>
        </Show>
    }
}
