//! The candidate against what each router runs, as the policy editor and Push show it: one table
//! row per router with the effective change, and the router's drift badge.

use fleetdeck_api::{DriftBadge, RouterDiff};
use leptos::prelude::*;

/// The drift badge of one router.
pub fn drift_view(badge: &DriftBadge) -> impl IntoView + use<> {
    let (class, text, title) = match badge {
        DriftBadge::InSync { version } => ("badge badge-ok", format!("in sync · v{version}"), String::new()),
        DriftBadge::Drifted { version, summary } => {
            ("badge badge-warn", format!("drift · v{version}"), summary.clone())
        }
        DriftBadge::Unknown => {
            ("badge badge-error", "unknown".to_owned(), "its policy could not be read".to_owned())
        }
        DriftBadge::NoIntent => {
            ("badge", "no intended spec yet".to_owned(), "push a spec from this app first".to_owned())
        }
    };
    view! { <span class=class title=title data-testid="drift-badge">{text}</span> }
}

/// The diff of one router, as a table row.
pub fn diff_row(d: &RouterDiff) -> impl IntoView + use<> {
    let body = if let Some(e) = &d.error {
        view! { <span class="error-text">{e.clone()}</span> }.into_any()
    } else if d.unchanged {
        view! { <span class="muted">"no change: it would route the same way"</span> }.into_any()
    } else {
        let policy = d
            .policy_change
            .as_ref()
            .map(|(a, b)| view! { <div><b>"policy: "</b>{format!("{a} → {b}")}</div> });
        let params = d
            .params
            .iter()
            .map(|p| {
                let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "—".to_owned());
                view! { <div class="diff-param">{format!("{}: {} → {}", p.name, show(&p.before), show(&p.after))}</div> }
            })
            .collect_view();
        view! { <div>{policy}{params}</div> }.into_any()
    };
    view! {
        <tr data-testid="diff-row">
            <td class="url">{d.url.clone()}</td>
            <td class="num">{d.version.map(|v| format!("v{v}")).unwrap_or_else(|| "—".to_owned())}</td>
            <td>{body}</td>
        </tr>
    }
}
