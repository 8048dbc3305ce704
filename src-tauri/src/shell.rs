//! The Tauri window: registers the UI commands and forwards each to the control core.

use anyhow::{Context as _, Result};
use fleetdeck_api::{ApiError, FleetSnapshot, FleetSnapshotArgs};
use fleetdeck_control::Control;

#[tauri::command]
async fn fleet_snapshot(
    control: tauri::State<'_, Control>,
    args: FleetSnapshotArgs,
) -> Result<FleetSnapshot, ApiError> {
    control.fleet_snapshot(args).await
}

/// Opens the window and runs the GUI event loop until the window closes.
pub fn run(control: Control, context: tauri::Context<tauri::Wry>) -> Result<()> {
    tauri::Builder::default()
        .manage(control)
        .invoke_handler(tauri::generate_handler![fleet_snapshot])
        .run(context)
        .context("the desktop window failed; run with --headless to use a browser instead")
}
