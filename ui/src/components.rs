//! The small components every view is built with: the error banner, the empty state and the
//! progress line, so a failure, an absence and a wait look the same in every view.

use fleetdeck_api::ApiError;
use leptos::prelude::*;

/// The red banner a view shows when its command fails, with the code for bug reports.
#[component]
pub fn ErrorBanner(error: RwSignal<Option<ApiError>>, #[prop(into)] what: String) -> impl IntoView {
    view! {
        <Show when=move || error.with(Option::is_some)>
            <div class="banner banner-error" role="alert" data-testid="error-banner">
                <strong>{format!("Can't refresh {what}. ")}</strong>
                {move || error.with(|e| e.as_ref().map(|e| e.message.clone()).unwrap_or_default())}
                <span class="banner-code">
                    {move || error.with(|e| e.as_ref().map(|e| e.code.clone()).unwrap_or_default())}
                </span>
            </div>
        </Show>
    }
}

/// A view's "nothing to show" panel: what is missing and what to do about it.
#[component]
pub fn EmptyState(#[prop(into)] title: String, #[prop(into)] hint: String) -> impl IntoView {
    view! {
        <div class="empty-state" data-testid="empty-state">
            <strong>{title}</strong>
            <span>{hint}</span>
        </div>
    }
}

/// A spinner with a sentence, for work that takes a while.
#[component]
pub fn Progress(#[prop(into)] text: Signal<String>) -> impl IntoView {
    view! {
        <div class="progress" role="status" data-testid="progress">
            <span class="spinner" aria-hidden="true"></span>
            {move || text.get()}
        </div>
    }
}
