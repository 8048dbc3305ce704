//! The Tauri window: its invoke handler forwards every UI command to the control core.
//!
//! The UI calls `invoke(COMMAND, { args })`. The handler hands the command's name and `args` to
//! [`fleetdeck_control::commands::dispatch`], the table the headless server uses too, and answers with
//! its result or its `ApiError` (`{code, message}`) unchanged.

use anyhow::{Context as _, Result};
use fleetdeck_control::Control;
use serde_json::Value;
use tauri::Manager as _;
use tauri::ipc::{InvokeBody, InvokeError};

/// Opens the window and runs the GUI event loop until the window closes.
pub fn run(control: Control, context: tauri::Context<tauri::Wry>) -> Result<()> {
    tauri::Builder::default()
        .manage(control)
        .invoke_handler(|invoke| {
            let command = invoke.message.command().to_owned();
            let args = match invoke.message.payload() {
                InvokeBody::Json(payload) => payload.get("args").cloned().unwrap_or(Value::Null),
                InvokeBody::Raw(_) => Value::Null,
            };
            let control = invoke.message.webview().state::<Control>().inner().clone();
            invoke.resolver.respond_async(async move {
                fleetdeck_control::commands::dispatch(&control, &command, args)
                    .await
                    .map_err(InvokeError::from)
            });
            true
        })
        .run(context)
        .context("the desktop window failed; run with --headless to use a browser instead")
}
