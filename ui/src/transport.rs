//! Calling a backend command, whichever shell hosts the UI: Tauri's IPC or the headless HTTP API.
//!
//! Both paths carry the JSON shapes of `fleetdeck_api` and fail with its `ApiError`, so views
//! have a single error path. JSON goes through `serde_json` and `JSON.parse`/`JSON.stringify`
//! rather than serde-wasm-bindgen: one fewer dependency, and i64 timestamps stay plain numbers.

use fleetdeck_api::ApiError;
use js_sys::{Function, JSON, Promise, Reflect};
use serde::Serialize;
use serde::de::DeserializeOwned;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{Headers, RequestInit, Response, Window};

/// How long one HTTP request may take before it counts as unreachable. Polls never overlap, so a
/// hung request would otherwise freeze the view forever.
const HTTP_TIMEOUT_MS: u32 = 10_000;

/// Runs `cmd` with `args` and decodes its result.
///
/// Inside Tauri this is `__TAURI_INTERNALS__.invoke(cmd, { args })`, the IPC entry Tauri injects
/// into its own webview (what `@tauri-apps/api`'s `invoke` calls; the app keeps `withGlobalTauri`
/// off, so no wider `window.__TAURI__` object exists): every command takes one parameter named
/// `args`. Elsewhere it is `POST /api/<cmd>` with `args` as the JSON body.
pub async fn call<A: Serialize, R: DeserializeOwned>(cmd: &str, args: &A) -> Result<R, ApiError> {
    let body = serde_json::to_string(args).map_err(|e| {
        ApiError::new("bad_request", format!("could not encode the arguments of `{cmd}`: {e}"))
    })?;
    let window = web_sys::window().ok_or_else(|| ApiError::new("internal", "no browser window"))?;
    let text = match tauri_invoke(&window)? {
        Some((core, invoke)) => call_tauri(&core, &invoke, cmd, &body).await?,
        None => call_http(&window, cmd, &body).await?,
    };
    serde_json::from_str(&text).map_err(|e| {
        ApiError::new("bad_response", format!("`{cmd}` answered with data this UI does not understand: {e}"))
    })
}

/// `(window.__TAURI_INTERNALS__, its invoke)` when running inside Tauri.
fn tauri_invoke(window: &Window) -> Result<Option<(JsValue, Function)>, ApiError> {
    let internals = Reflect::get(window, &"__TAURI_INTERNALS__".into()).unwrap_or(JsValue::UNDEFINED);
    if internals.is_undefined() || internals.is_null() {
        return Ok(None);
    }
    let invoke = Reflect::get(&internals, &"invoke".into()).unwrap_or(JsValue::UNDEFINED);
    match invoke.dyn_into::<Function>() {
        Ok(f) => Ok(Some((internals, f))),
        Err(_) => Err(ApiError::new(
            "internal",
            "window.__TAURI_INTERNALS__ exists but has no invoke; is this a Tauri v2 shell?",
        )),
    }
}

async fn call_tauri(
    core: &JsValue,
    invoke: &Function,
    cmd: &str,
    args_json: &str,
) -> Result<String, ApiError> {
    let payload = JSON::parse(&format!(r#"{{"args":{args_json}}}"#)).map_err(|e| {
        ApiError::new("internal", format!("could not build the IPC payload: {}", js_message(&e)))
    })?;
    let promise = invoke
        .call2(core, &JsValue::from_str(cmd), &payload)
        .map_err(error_from_js)?
        .dyn_into::<Promise>()
        .map_err(|_| ApiError::new("internal", "__TAURI_INTERNALS__.invoke did not return a promise"))?;
    let value = JsFuture::from(promise).await.map_err(error_from_js)?;
    stringify(&value)
}

async fn call_http(window: &Window, cmd: &str, body: &str) -> Result<String, ApiError> {
    let headers = Headers::new().map_err(error_from_js)?;
    headers.set("content-type", "application/json").map_err(error_from_js)?;
    let init = RequestInit::new();
    init.set_method("POST");
    init.set_headers(&headers);
    init.set_body(&JsValue::from_str(body));
    if let Some(signal) = timeout_signal() {
        init.set_signal(Some(&signal));
    }
    let url = format!("/api/{cmd}");
    let response: Response = JsFuture::from(window.fetch_with_str_and_init(&url, &init))
        .await
        .map_err(|e| unreachable(&url, &e))?
        .dyn_into()
        .map_err(|_| ApiError::new("internal", "fetch did not resolve to a Response"))?;
    let text_promise = response.text().map_err(|e| unreachable(&url, &e))?;
    let text = JsFuture::from(text_promise)
        .await
        .map_err(|e| unreachable(&url, &e))?
        .as_string()
        .unwrap_or_default();
    if response.ok() {
        return Ok(text);
    }
    // The server answers failures with an ApiError body; anything else (a proxy's HTML page, an
    // empty body) still becomes an ApiError so the banner has something useful to say.
    Err(serde_json::from_str::<ApiError>(&text).unwrap_or_else(|_| {
        let status = response.status();
        // An HTML error page would flood the banner; its status line says enough.
        let body = text.trim();
        let detail = if body.is_empty() || body.starts_with('<') {
            response.status_text()
        } else {
            body.chars().take(200).collect()
        };
        ApiError::new(format!("http_{status}"), format!("POST {url} failed with HTTP {status}: {detail}"))
    }))
}

/// `AbortSignal.timeout(HTTP_TIMEOUT_MS)` where the engine has it (older WebKit does not).
fn timeout_signal() -> Option<web_sys::AbortSignal> {
    let ctor = Reflect::get(&js_sys::global(), &"AbortSignal".into()).ok()?;
    let has_timeout = Reflect::get(&ctor, &"timeout".into()).ok()?.is_function();
    has_timeout.then(|| web_sys::AbortSignal::timeout_with_u32(HTTP_TIMEOUT_MS))
}

fn unreachable(url: &str, e: &JsValue) -> ApiError {
    ApiError::new("unreachable", format!("cannot reach the Fleetdeck server ({url}): {}", js_message(e)))
}

/// A JS value as JSON text (`undefined`, from a command returning unit, becomes `null`).
fn stringify(value: &JsValue) -> Result<String, ApiError> {
    if value.is_undefined() {
        return Ok("null".to_owned());
    }
    JSON::stringify(value)
        .map(String::from)
        .map_err(|e| ApiError::new("bad_response", format!("result is not JSON: {}", js_message(&e))))
}

/// The ApiError carried by a rejected invoke. Tauri rejects with the command's serialized error
/// (an object `{code, message}`) or, for IPC-level failures such as an unknown command, a string.
fn error_from_js(e: JsValue) -> ApiError {
    if let Some(s) = e.as_string() {
        return serde_json::from_str(&s).unwrap_or_else(|_| ApiError::new("ipc", s));
    }
    if e.is_instance_of::<js_sys::Error>() {
        return ApiError::new("ipc", js_message(&e));
    }
    if let Ok(json) = JSON::stringify(&e)
        && let Some(json) = json.as_string()
        && let Ok(err) = serde_json::from_str::<ApiError>(&json)
    {
        return err;
    }
    ApiError::new("ipc", js_message(&e))
}

/// The human part of a JS exception or rejection value.
fn js_message(e: &JsValue) -> String {
    if let Some(err) = e.dyn_ref::<js_sys::Error>() {
        return String::from(err.message());
    }
    if let Some(s) = e.as_string() {
        return s;
    }
    JSON::stringify(e).ok().and_then(|s| s.as_string()).unwrap_or_else(|| format!("{e:?}"))
}
