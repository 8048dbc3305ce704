//! The candidate spec the operator is working on, shared by the policy editor, What-if and Push:
//! kept in local storage so each view opens on the same text, and checked by the backend as it
//! is typed.

use fleetdeck_api::{ApiError, CMD_CHECK_SPEC, CheckSpecArgs, SpecCheck};
use leptos::prelude::*;
use leptos::task::spawn_local;

use crate::transport;

/// Where the candidate spec is kept between views.
pub const CANDIDATE_KEY: &str = "fleetdeck.candidate";

/// The candidate spec the operator is working on, if any.
pub fn stored_candidate() -> Option<String> {
    window()
        .local_storage()
        .ok()
        .flatten()?
        .get_item(CANDIDATE_KEY)
        .ok()
        .flatten()
        .filter(|t| !t.trim().is_empty())
}

pub fn store_candidate(text: &str) {
    if let Ok(Some(storage)) = window().local_storage() {
        let _ = storage.set_item(CANDIDATE_KEY, text);
    }
}

/// Validates `text` on the backend, keeping only the newest answer.
pub fn check_as_you_type(
    text: RwSignal<String>,
    check: RwSignal<Option<SpecCheck>>,
    error: RwSignal<Option<ApiError>>,
) {
    let seq = RwSignal::new(0_u64);
    Effect::new(move |_| {
        let spec = text.get();
        let n = seq.get_untracked() + 1;
        seq.set(n);
        spawn_local(async move {
            let result = transport::call::<_, SpecCheck>(CMD_CHECK_SPEC, &CheckSpecArgs { text: spec }).await;
            if seq.get_untracked() != n {
                return;
            }
            match result {
                Ok(c) => {
                    check.set(Some(c));
                    error.set(None);
                }
                Err(e) => error.set(Some(e)),
            }
        });
    });
}
