//! The rollout commands of the Tauri window (policy editor, what-if, push, canary, history
//! compare), each forwarded unchanged to the control core; registered in `shell.rs`.

use fleetdeck_api::{
    AbortCanaryArgs, ApiError, CanaryArgs, CanaryStatus, CanaryView, CheckSpecArgs, HistoryCompareArgs,
    HistoryComparison, PolicyEditor, PolicyHistory, PushArgs, PushReport, SpecCheck, WhatIfArgs,
    WhatIfJobArgs, WhatIfStatus,
};
use fleetdeck_control::Control;

type Ctl<'a> = tauri::State<'a, Control>;

#[tauri::command]
pub async fn policy_editor(control: Ctl<'_>, args: serde_json::Value) -> Result<PolicyEditor, ApiError> {
    let _ = args; // takes no arguments; the parameter keeps every command's shape alike
    control.policy_editor().await
}

#[tauri::command]
pub async fn check_spec(control: Ctl<'_>, args: CheckSpecArgs) -> Result<SpecCheck, ApiError> {
    control.check_spec(args).await
}

#[tauri::command]
pub async fn push_policy(control: Ctl<'_>, args: PushArgs) -> Result<PushReport, ApiError> {
    control.push_policy(args).await
}

#[tauri::command]
pub async fn start_canary(control: Ctl<'_>, args: CanaryArgs) -> Result<CanaryStatus, ApiError> {
    control.start_canary(args).await
}

#[tauri::command]
pub async fn canary_status(control: Ctl<'_>, args: serde_json::Value) -> Result<CanaryView, ApiError> {
    let _ = args;
    control.canary_status().await
}

#[tauri::command]
pub async fn abort_canary(control: Ctl<'_>, args: AbortCanaryArgs) -> Result<CanaryView, ApiError> {
    control.abort_canary(args).await
}

#[tauri::command]
pub async fn start_whatif(control: Ctl<'_>, args: WhatIfArgs) -> Result<WhatIfStatus, ApiError> {
    control.start_whatif(args).await
}

#[tauri::command]
pub async fn whatif_status(control: Ctl<'_>, args: WhatIfJobArgs) -> Result<WhatIfStatus, ApiError> {
    control.whatif_status(args).await
}

#[tauri::command]
pub async fn cancel_whatif(control: Ctl<'_>, args: WhatIfJobArgs) -> Result<WhatIfStatus, ApiError> {
    control.cancel_whatif(args).await
}

#[tauri::command]
pub async fn policy_history(control: Ctl<'_>, args: serde_json::Value) -> Result<PolicyHistory, ApiError> {
    let _ = args;
    control.policy_history().await
}

#[tauri::command]
pub async fn history_compare(
    control: Ctl<'_>,
    args: HistoryCompareArgs,
) -> Result<HistoryComparison, ApiError> {
    control.history_compare(args).await
}
