//! The UI's commands in one table: each name (`fleetdeck_api::CMD_*`) and the [`Control`] method it runs.
//!
//! Both adapters call [`dispatch`]: the Tauri window's invoke handler and the headless server's
//! `POST /api/COMMAND`. So the window and the browser cannot disagree on what a command does or how its
//! arguments are read. Arguments come as JSON; `null` (no arguments sent) means the defaults for the
//! commands that have them, and the missing fields for those that do not.

use fleetdeck_api::{
    ApiError, CMD_ABORT_CANARY, CMD_ADD_ENDPOINT, CMD_CANARY_STATUS, CMD_CANCEL_WHATIF, CMD_CHECK_SPEC,
    CMD_DECISIONS, CMD_FLEET_SNAPSHOT, CMD_HEADROOM, CMD_HEAT_MAP, CMD_HISTORY_COMPARE, CMD_POLICY_EDITOR,
    CMD_POLICY_HISTORY, CMD_PUSH_POLICY, CMD_PUSH_STORE_POLICY, CMD_REMOVE_ENDPOINT, CMD_REPLICA_HISTORY,
    CMD_ROLLBACK_STORE_POLICY, CMD_SET_SCRAPE_INTERVAL, CMD_SETTINGS, CMD_START_CANARY, CMD_START_WHATIF,
    CMD_STORE_DRIFT, CMD_STORE_POLICY, CMD_WHATIF_STATUS,
};
use serde_json::Value;

use crate::Control;

/// Runs `command` with `args` as its arguments. Only translation happens here: every command is one
/// `Control` method.
pub async fn dispatch(control: &Control, command: &str, args: Value) -> Result<Value, ApiError> {
    match command {
        CMD_FLEET_SNAPSHOT => encode(control.fleet_snapshot(optional(args)?).await),
        CMD_HEAT_MAP => encode(control.heat_map(optional(args)?).await),
        CMD_REPLICA_HISTORY => encode(control.replica_history(required(args)?).await),
        CMD_DECISIONS => encode(control.decisions(optional(args)?).await),
        CMD_HEADROOM => encode(control.headroom(optional(args)?).await),
        CMD_SETTINGS => encode(control.settings().await),
        CMD_ADD_ENDPOINT => encode(control.add_endpoint(required(args)?).await),
        CMD_REMOVE_ENDPOINT => encode(control.remove_endpoint(required(args)?).await),
        CMD_SET_SCRAPE_INTERVAL => encode(control.set_scrape_interval(required(args)?).await),
        CMD_POLICY_EDITOR => encode(control.policy_editor().await),
        CMD_CHECK_SPEC => encode(control.check_spec(required(args)?).await),
        CMD_PUSH_POLICY => encode(control.push_policy(required(args)?).await),
        CMD_START_CANARY => encode(control.start_canary(required(args)?).await),
        CMD_CANARY_STATUS => encode(control.canary_status().await),
        CMD_ABORT_CANARY => encode(control.abort_canary(required(args)?).await),
        CMD_START_WHATIF => encode(control.start_whatif(required(args)?).await),
        CMD_WHATIF_STATUS => encode(control.whatif_status(required(args)?).await),
        CMD_CANCEL_WHATIF => encode(control.cancel_whatif(required(args)?).await),
        CMD_STORE_POLICY => encode(control.store_policy(optional(args)?).await),
        CMD_PUSH_STORE_POLICY => encode(control.push_store_policy(required(args)?).await),
        CMD_ROLLBACK_STORE_POLICY => encode(control.rollback_store_policy(required(args)?).await),
        CMD_STORE_DRIFT => encode(control.store_drift().await),
        CMD_POLICY_HISTORY => encode(control.policy_history().await),
        CMD_HISTORY_COMPARE => encode(control.history_compare(required(args)?).await),
        other => Err(ApiError::new("unknown_command", format!("there is no command {other:?}"))),
    }
}

fn encode<T: serde::Serialize>(result: Result<T, ApiError>) -> Result<Value, ApiError> {
    result.and_then(|value| {
        serde_json::to_value(value)
            .map_err(|e| ApiError::new("internal", format!("cannot encode the answer: {e}")))
    })
}

/// Arguments with defaults: none sent means the defaults, like an `invoke` without them.
fn optional<T: serde::de::DeserializeOwned + Default>(args: Value) -> Result<T, ApiError> {
    if args.is_null() {
        return Ok(T::default());
    }
    required(args)
}

/// Arguments without defaults: none sent is reported as the missing fields.
fn required<T: serde::de::DeserializeOwned>(args: Value) -> Result<T, ApiError> {
    let args = if args.is_null() { Value::Object(Default::default()) } else { args };
    serde_json::from_value(args).map_err(|e| ApiError::new("bad_request", format!("invalid arguments: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, serde::Deserialize, PartialEq)]
    struct Window {
        #[serde(default)]
        window_s: u32,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)] // read only through its error
    struct Needs {
        id: u32,
    }

    #[test]
    fn missing_arguments_are_the_defaults_or_named() {
        assert_eq!(optional::<Window>(Value::Null).unwrap(), Window::default());
        assert_eq!(optional::<Window>(serde_json::json!({"window_s": 60})).unwrap().window_s, 60);
        let missing = required::<Needs>(Value::Null).unwrap_err();
        assert_eq!(missing.code, "bad_request");
        assert!(missing.message.contains("missing field `id`"), "{}", missing.message);
    }
}
