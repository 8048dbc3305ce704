//! The UI's commands in one table: each name (`fleetdeck_api::CMD_*`) and the [`Control`] method it runs.
//!
//! Both adapters call [`dispatch`]: the Tauri window's invoke handler and the headless server's
//! `POST /api/COMMAND`. So the window and the browser cannot disagree on what a command does or how its
//! arguments are read. Arguments come as JSON; `null` (no arguments sent) means the defaults for the
//! commands that have them, and the missing fields for those that do not.

use fleetdeck_api::{
    ApiError, CMD_ABORT_CANARY, CMD_ADD_ENDPOINT, CMD_CANARY_STATUS, CMD_CANCEL_WHATIF, CMD_CHECK_SPEC,
    CMD_DECISIONS, CMD_ETCD_DRIFT, CMD_ETCD_POLICY, CMD_FLEET_SNAPSHOT, CMD_HEADROOM, CMD_HEAT_MAP,
    CMD_HISTORY_COMPARE, CMD_POLICY_EDITOR, CMD_POLICY_HISTORY, CMD_PUSH_ETCD_POLICY, CMD_PUSH_POLICY,
    CMD_REMOVE_ENDPOINT, CMD_REPLICA_HISTORY, CMD_ROLLBACK_ETCD_POLICY, CMD_SET_SCRAPE_INTERVAL,
    CMD_SETTINGS, CMD_START_CANARY, CMD_START_DEMO, CMD_START_WHATIF, CMD_WHATIF_STATUS,
};
use serde_json::Value;

use crate::Control;

/// Writes the table once and derives both [`COMMANDS`] and [`dispatch`] from it, so no command can be
/// dispatched without being listed (the adapters' access tests walk the list).
macro_rules! command_table {
    ($($name:ident => $method:ident($kind:ident)),* $(,)?) => {
        /// Every command's name, in the table's order.
        pub const COMMANDS: &[&str] = &[$($name),*];

        /// Runs `command` with `args` as its arguments. Only translation happens here: every command is
        /// one `Control` method.
        pub async fn dispatch(control: &Control, command: &str, args: Value) -> Result<Value, ApiError> {
            match command {
                $($name => encode(command_table!(@call control, $method, $kind, args)),)*
                other => Err(ApiError::new("unknown_command", format!("there is no command {other:?}"))),
            }
        }
    };
    (@call $control:ident, $method:ident, none, $args:ident) => { $control.$method().await };
    (@call $control:ident, $method:ident, optional, $args:ident) => { $control.$method(optional($args)?).await };
    (@call $control:ident, $method:ident, required, $args:ident) => { $control.$method(required($args)?).await };
}

command_table! {
    CMD_FLEET_SNAPSHOT => fleet_snapshot(optional),
    CMD_HEAT_MAP => heat_map(optional),
    CMD_REPLICA_HISTORY => replica_history(required),
    CMD_DECISIONS => decisions(optional),
    CMD_HEADROOM => headroom(optional),
    CMD_SETTINGS => settings(none),
    CMD_ADD_ENDPOINT => add_endpoint(required),
    CMD_REMOVE_ENDPOINT => remove_endpoint(required),
    CMD_SET_SCRAPE_INTERVAL => set_scrape_interval(required),
    CMD_START_DEMO => start_demo(optional),
    CMD_POLICY_EDITOR => policy_editor(none),
    CMD_CHECK_SPEC => check_spec(required),
    CMD_PUSH_POLICY => push_policy(required),
    CMD_START_CANARY => start_canary(required),
    CMD_CANARY_STATUS => canary_status(none),
    CMD_ABORT_CANARY => abort_canary(required),
    CMD_START_WHATIF => start_whatif(required),
    CMD_WHATIF_STATUS => whatif_status(required),
    CMD_CANCEL_WHATIF => cancel_whatif(required),
    CMD_ETCD_POLICY => etcd_policy(optional),
    CMD_PUSH_ETCD_POLICY => push_etcd_policy(required),
    CMD_ROLLBACK_ETCD_POLICY => rollback_etcd_policy(required),
    CMD_ETCD_DRIFT => etcd_drift(none),
    CMD_POLICY_HISTORY => policy_history(none),
    CMD_HISTORY_COMPARE => history_compare(required),
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

    #[test]
    fn every_command_is_listed_once() {
        let mut names = COMMANDS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), COMMANDS.len(), "a command is listed twice");
        assert!(COMMANDS.contains(&CMD_PUSH_POLICY) && COMMANDS.contains(&CMD_FLEET_SNAPSHOT));
    }

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
