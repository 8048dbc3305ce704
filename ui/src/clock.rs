//! The browser's clocks, as the views use them: wall-clock time in the operator's time zone for
//! display, the monotonic clock for durations, and a sleep that never blocks the event loop.

use leptos::prelude::window;
use wasm_bindgen::JsValue;

use crate::format;

/// Local time minus UTC at `unix_ms`, in minutes, as the browser sees it (DST-aware).
pub fn utc_offset_min(unix_ms: i64) -> i32 {
    -(js_sys::Date::new(&JsValue::from_f64(unix_ms as f64)).get_timezone_offset() as i32)
}

/// `HH:MM:SS` in the operator's local time.
pub fn local_clock(unix_ms: i64) -> String {
    format::clock(unix_ms, utc_offset_min(unix_ms))
}

/// `performance.now()`, in milliseconds.
pub fn perf_now() -> f64 {
    window().performance().map(|p| p.now()).unwrap_or_else(js_sys::Date::now)
}

/// Resolves after `ms` milliseconds, without blocking the event loop.
pub async fn sleep_ms(ms: f64) {
    let promise = js_sys::Promise::new(&mut |resolve, _reject| {
        // If scheduling fails the promise never settles; resolving at once instead keeps the
        // poll loop alive (it would just poll faster), which beats silently stopping.
        if window().set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms as i32).is_err() {
            let _ = resolve.call0(&JsValue::UNDEFINED);
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}
