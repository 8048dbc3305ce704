//! The Push view's etcd card (`store-panel`), a part of that view only, shown when the fleet's routers
//! take their policy from an etcd key (`fleetdeck --policy-etcd`): the key's value and revision as the
//! operator reviewed them, a push and a rollback each guarded by that revision (one etcd txn whatever
//! the number of routers), and the drift of every router against the key it watches.
//!
//! The reviewed revision is read when the card opens and on "Reload", never behind the operator's back:
//! a key that moved since is a `revision_conflict`, shown with the revision to review, not overwritten.

use fleetdeck_api::{
    ApiError, CMD_ETCD_DRIFT, CMD_ETCD_POLICY, CMD_PUSH_ETCD_POLICY, CMD_ROLLBACK_ETCD_POLICY, EtcdDrift,
    EtcdPolicy, EtcdPushArgs, EtcdPushReport, EtcdRollbackArgs,
};
use leptos::prelude::*;
use leptos::task::spawn_local;
use serde_json::json;

use crate::components::ErrorBanner;
use crate::format;
use crate::poll::poll;
use crate::transport;

/// The card; `text` is the Push view's candidate spec.
#[component]
pub fn EtcdPanel(text: RwSignal<String>) -> impl IntoView {
    // Read once and on Reload (every_ms 0): what is shown is what the operator reviews.
    let reviewed = poll::<_, EtcdPolicy>(CMD_ETCD_POLICY, || json!({}), 0.0);
    let drift = poll::<_, EtcdDrift>(CMD_ETCD_DRIFT, || json!({}), 1500.0);
    let report = RwSignal::new(None::<(&'static str, EtcdPushReport)>);
    let error = RwSignal::new(None::<ApiError>);
    let busy = RwSignal::new(false);

    let write = move |rollback: bool| {
        let Some(revision) = reviewed.data.with_untracked(|p| p.as_ref().map(|p| p.revision)) else {
            return;
        };
        busy.set(true);
        spawn_local(async move {
            let result = if rollback {
                let args = EtcdRollbackArgs { if_revision: revision, key: None, operator: None };
                transport::call::<_, EtcdPushReport>(CMD_ROLLBACK_ETCD_POLICY, &args).await
            } else {
                let args = EtcdPushArgs {
                    text: text.get_untracked(),
                    if_revision: revision,
                    key: None,
                    operator: None,
                };
                transport::call::<_, EtcdPushReport>(CMD_PUSH_ETCD_POLICY, &args).await
            };
            busy.set(false);
            match result {
                Ok(written) => {
                    report.set(Some((if rollback { "rolled back" } else { "pushed" }, written)));
                    error.set(None);
                    // The new revision is what the operator now looks at.
                    reviewed.refresh.update(|n| *n += 1);
                }
                Err(e) => {
                    report.set(None);
                    error.set(Some(e));
                }
            }
            drift.refresh.update(|n| *n += 1);
        });
    };

    view! {
        <div class="card" data-testid="store-panel">
            <div class="card-head">
                <h2>"Policy in etcd"</h2>
                <span class="card-meta">"one txn reaches every router watching the key; it holds only if the key is still at the revision you reviewed"</span>
            </div>
            <ErrorBanner error=reviewed.error what="the etcd key" />
            {move || reviewed.data.get().map(|p| {
                let state = match (&p.text, &p.invalid) {
                    (None, _) => "the key does not exist yet: the first push creates it".to_owned(),
                    (Some(_), Some(why)) => format!("its value is invalid, routers refuse it: {why}"),
                    (Some(_), None) => "valid".to_owned(),
                };
                view! {
                    <p>
                        <span class="mono" data-testid="store-key">{p.key.clone()}</span>
                        " at revision "
                        <strong data-testid="store-revision">{p.revision}</strong>
                        <span class="muted">{format!(" · {state}")}</span>
                    </p>
                    {p.text.clone().map(|t| view! {
                        <details><summary>"Value"</summary><pre class="spec-normalised" data-testid="store-value">{t}</pre></details>
                    })}
                }
            })}
            <div class="toolbar">
                <button class="primary" data-testid="store-push" on:click=move |_| write(false)
                    disabled=move || busy.get() || reviewed.data.with(Option::is_none)>
                    {move || reviewed.data.with(|p| format!(
                        "Push to etcd (if revision {})", p.as_ref().map_or(0, |p| p.revision)))}
                </button>
                <button data-testid="store-rollback" on:click=move |_| write(true)
                    disabled=move || busy.get() || reviewed.data.with(|p| p.as_ref().is_none_or(|p| p.text.is_none()))>
                    "Roll back to the previous value"
                </button>
                <button class="link" data-testid="store-reload" on:click=move |_| {
                    error.set(None);
                    reviewed.refresh.update(|n| *n += 1);
                }>"Reload"</button>
            </div>
            {move || error.get().map(|e| {
                let hint = (e.code == "revision_conflict")
                    .then_some(" Reload to review what the key holds now, then push again.");
                view! {
                    <div class="banner banner-error" data-testid="store-error" data-code=e.code.clone()>
                        {format!("{}{}", e.message, hint.unwrap_or_default())}
                    </div>
                }
            })}
            {move || report.get().map(|(what, r)| view! {
                <p class="banner banner-ok" data-testid="store-result">
                    {format!("{what} {} by {}: {} revision {} → {}", r.label, r.author, r.key, r.previous_revision, r.revision)}
                </p>
            })}
            <ErrorBanner error=drift.error what="the routers' revisions" />
            {move || drift.data.get().map(drift_table)}
        </div>
    }
}

/// Every router against its key: in sync, lagging (with the revision it runs and why), not on the store,
/// or unreadable.
fn drift_table(drift: EtcdDrift) -> impl IntoView {
    let clean = drift.is_empty();
    let rows = drift
        .keys
        .into_iter()
        .flat_map(|key| {
            let synced = key.in_sync.into_iter().map({
                let (name, revision) = (key.key.clone(), key.revision);
                move |url| {
                    (name.clone(), url, "in sync", "badge badge-ok", format!("runs revision {revision}"))
                }
            });
            let lagging = key.lagging.into_iter().map({
                let (name, revision) = (key.key.clone(), key.revision);
                move |lag| {
                    let runs = lag.revision.map_or("no revision".to_owned(), |r| format!("runs {r}"));
                    (
                        name.clone(),
                        lag.url,
                        "lagging",
                        "badge badge-error",
                        format!("{runs} of {revision}: {}", lag.reason),
                    )
                }
            });
            synced.chain(lagging).collect::<Vec<_>>()
        })
        .chain(drift.not_on_etcd.into_iter().map(|url| {
            (
                String::new(),
                url,
                "HTTP",
                "badge",
                "takes no policy from etcd: push it over HTTP below".to_owned(),
            )
        }))
        .chain(
            drift
                .unreadable
                .into_iter()
                .map(|r| (String::new(), r.url, "unreadable", "badge badge-pending", r.reason)),
        )
        .map(|(key, url, state, class, detail)| {
            view! {
                <tr data-testid="store-router" data-state=state>
                    <td class="url">{format::short_url(&url).to_owned()}</td>
                    <td class="mono">{key}</td>
                    <td><span class=class>{state}</span>" "<span class="detail">{detail}</span></td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <p class="muted" data-testid="store-drift" data-clean=clean.to_string()>
            {if clean { "No drift: every router runs its key's revision." } else { "Drift: some routers do not run their key's revision." }}
        </p>
        <table class="replicas">
            <thead><tr><th>"Router"</th><th>"Key"</th><th>"State"</th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
    }
}
