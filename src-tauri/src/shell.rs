//! The Tauri window: registers the UI commands and forwards each to the control core.
//!
//! Every command takes one parameter named `args` (what `transport::call` sends) and returns
//! the control core's result or its `ApiError` unchanged.

use anyhow::{Context as _, Result};
use fleetdeck_api::{
    AddEndpointArgs, ApiError, DecisionLog, DecisionsArgs, FleetSnapshot, FleetSnapshotArgs, Headroom,
    HeadroomArgs, HeatMap, HeatMapArgs, ProbeReport, RemoveEndpointArgs, ReplicaHistory, ReplicaHistoryArgs,
    ScrapeIntervalArgs, SettingsView,
};
use fleetdeck_control::Control;

type Ctl<'a> = tauri::State<'a, Control>;

#[tauri::command]
async fn fleet_snapshot(control: Ctl<'_>, args: FleetSnapshotArgs) -> Result<FleetSnapshot, ApiError> {
    control.fleet_snapshot(args).await
}

#[tauri::command]
async fn heat_map(control: Ctl<'_>, args: HeatMapArgs) -> Result<HeatMap, ApiError> {
    control.heat_map(args).await
}

#[tauri::command]
async fn replica_history(control: Ctl<'_>, args: ReplicaHistoryArgs) -> Result<ReplicaHistory, ApiError> {
    control.replica_history(args).await
}

#[tauri::command]
async fn decisions(control: Ctl<'_>, args: DecisionsArgs) -> Result<DecisionLog, ApiError> {
    control.decisions(args).await
}

#[tauri::command]
async fn headroom(control: Ctl<'_>, args: HeadroomArgs) -> Result<Headroom, ApiError> {
    control.headroom(args).await
}

#[tauri::command]
async fn settings(control: Ctl<'_>, args: serde_json::Value) -> Result<SettingsView, ApiError> {
    let _ = args; // takes no arguments; the parameter keeps every command's shape alike
    control.settings().await
}

#[tauri::command]
async fn add_endpoint(control: Ctl<'_>, args: AddEndpointArgs) -> Result<ProbeReport, ApiError> {
    control.add_endpoint(args).await
}

#[tauri::command]
async fn remove_endpoint(control: Ctl<'_>, args: RemoveEndpointArgs) -> Result<(), ApiError> {
    control.remove_endpoint(args).await
}

#[tauri::command]
async fn set_scrape_interval(control: Ctl<'_>, args: ScrapeIntervalArgs) -> Result<(), ApiError> {
    control.set_scrape_interval(args).await
}

/// Opens the window and runs the GUI event loop until the window closes.
pub fn run(control: Control, context: tauri::Context<tauri::Wry>) -> Result<()> {
    tauri::Builder::default()
        .manage(control)
        .invoke_handler(tauri::generate_handler![
            fleet_snapshot,
            heat_map,
            replica_history,
            decisions,
            headroom,
            settings,
            add_endpoint,
            remove_endpoint,
            set_scrape_interval,
            crate::shell_rollout::policy_editor,
            crate::shell_rollout::check_spec,
            crate::shell_rollout::push_policy,
            crate::shell_rollout::start_canary,
            crate::shell_rollout::canary_status,
            crate::shell_rollout::abort_canary,
            crate::shell_rollout::start_whatif,
            crate::shell_rollout::whatif_status,
            crate::shell_rollout::cancel_whatif,
            crate::shell_rollout::policy_history,
            crate::shell_rollout::history_compare
        ])
        .run(context)
        .context("the desktop window failed; run with --headless to use a browser instead")
}
