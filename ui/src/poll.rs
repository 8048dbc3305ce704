//! Background refresh of a backend command for as long as the view that asked lives: the
//! [`Polled`] signals a view renders from, filled by [`poll`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use fleetdeck_api::ApiError;
use leptos::prelude::*;
use leptos::task::spawn_local;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::clock::{perf_now, sleep_ms};
use crate::transport;

/// The result of a command that a view refreshes in the background.
pub struct Polled<T: Send + Sync + 'static> {
    pub data: RwSignal<Option<T>>,
    pub error: RwSignal<Option<ApiError>>,
    /// A call is in flight.
    pub busy: RwSignal<bool>,
    /// Bump to refresh now (after the arguments changed).
    pub refresh: RwSignal<u64>,
}

impl<T: Send + Sync + 'static> Clone for Polled<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Send + Sync + 'static> Copy for Polled<T> {}

/// Calls `cmd` with `args()` every `every_ms` (and at once when `refresh` is bumped) for as long
/// as the calling view lives. Calls never overlap: a slow backend slows the refresh instead of
/// piling up requests. `every_ms` of 0 calls only once and on refresh.
pub fn poll<A, R>(cmd: &'static str, args: impl Fn() -> A + 'static, every_ms: f64) -> Polled<R>
where
    A: Serialize + 'static,
    R: DeserializeOwned + Send + Sync + 'static,
{
    let polled = Polled {
        data: RwSignal::new(None::<R>),
        error: RwSignal::new(None),
        busy: RwSignal::new(false),
        refresh: RwSignal::new(0),
    };
    let alive = Arc::new(AtomicBool::new(true));
    {
        let alive = Arc::clone(&alive);
        on_cleanup(move || alive.store(false, Ordering::Relaxed));
    }
    spawn_local(async move {
        while alive.load(Ordering::Relaxed) {
            let started = perf_now();
            let generation = polled.refresh.get_untracked();
            polled.busy.set(true);
            let result = transport::call::<_, R>(cmd, &args()).await;
            // The view may have been left while the request was in flight; its signals are gone.
            if !alive.load(Ordering::Relaxed) {
                break;
            }
            polled.busy.set(false);
            match result {
                Ok(value) => {
                    polled.data.set(Some(value));
                    if polled.error.with_untracked(Option::is_some) {
                        polled.error.set(None);
                    }
                }
                Err(e) => polled.error.set(Some(e)),
            }
            // Sleep in short slices so a refresh request is answered promptly.
            loop {
                if !alive.load(Ordering::Relaxed) {
                    return;
                }
                let refreshed = polled.refresh.get_untracked() != generation;
                let due = every_ms > 0.0 && perf_now() - started >= every_ms;
                if refreshed || due {
                    break;
                }
                sleep_ms(100.0).await;
            }
        }
    });
    polled
}
