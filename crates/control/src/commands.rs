//! The UI's commands in one table: each name (`fleetdeck_api::CMD_*`) and the handle method it runs.
//!
//! Both adapters call [`dispatch`]: the Tauri window's invoke handler and the headless server's
//! `POST /api/COMMAND`. So the window and the browser cannot disagree on what a command does or how its
//! arguments are read. Arguments come as JSON; `null` (no arguments sent) means the defaults for the
//! commands that have them, and the missing fields for those that do not.

use fleetdeck_api::{
    ApiError, CMD_ABORT_CANARY, CMD_ADD_ENDPOINT, CMD_CANARY_STATUS, CMD_CANCEL_WHATIF, CMD_CHECK_SPEC,
    CMD_DECISIONS, CMD_ETCD_DRIFT, CMD_ETCD_POLICY, CMD_FLEET_SNAPSHOT, CMD_HEADROOM, CMD_HEAT_MAP,
    CMD_HISTORY_COMPARE, CMD_PD_VIEW, CMD_POLICY_EDITOR, CMD_POLICY_HISTORY, CMD_PUSH_ETCD_POLICY,
    CMD_PUSH_POLICY, CMD_REMOVE_ENDPOINT, CMD_REPLICA_HISTORY, CMD_ROLLBACK_ETCD_POLICY,
    CMD_SET_SCRAPE_INTERVAL, CMD_SETTINGS, CMD_START_CANARY, CMD_START_DEMO, CMD_START_WHATIF,
    CMD_WHATIF_STATUS,
};
use serde_json::Value;

use crate::Control;

/// Writes the table once and derives both [`COMMANDS`] and [`dispatch`] from it, so no command can be
/// dispatched without being listed (the adapters' access tests walk the list).
macro_rules! command_table {
    ($($name:ident => $handle:ident.$method:ident($kind:ident)),* $(,)?) => {
        /// Every command's name, in the table's order.
        pub const COMMANDS: &[&str] = &[$($name),*];

        /// Runs `command` with `args` as its arguments. Only translation happens here: every command is
        /// one method of one of the [`Control`]'s handles.
        pub async fn dispatch(control: &Control, command: &str, args: Value) -> Result<Value, ApiError> {
            match command {
                $($name => encode(command_table!(@call control.$handle(), $method, $kind, args)),)*
                other => Err(ApiError::new("unknown_command", format!("there is no command {other:?}"))),
            }
        }
    };
    (@call $handle:expr, $method:ident, none, $args:ident) => { $handle.$method().await };
    (@call $handle:expr, $method:ident, optional, $args:ident) => { $handle.$method(optional($args)?).await };
    (@call $handle:expr, $method:ident, required, $args:ident) => { $handle.$method(required($args)?).await };
}

command_table! {
    CMD_FLEET_SNAPSHOT => fleet.snapshot(optional),
    CMD_REPLICA_HISTORY => fleet.replica_history(required),
    CMD_HEAT_MAP => routers.heat_map(optional),
    CMD_DECISIONS => routers.decisions(optional),
    CMD_HEADROOM => routers.headroom(optional),
    CMD_PD_VIEW => disagg.view(optional),
    CMD_SETTINGS => settings.view(none),
    CMD_ADD_ENDPOINT => settings.add_endpoint(required),
    CMD_REMOVE_ENDPOINT => settings.remove_endpoint(required),
    CMD_SET_SCRAPE_INTERVAL => settings.set_scrape_interval(required),
    CMD_START_DEMO => demo.start(optional),
    CMD_POLICY_EDITOR => rollout.policy_editor(none),
    CMD_CHECK_SPEC => rollout.check_spec(required),
    CMD_PUSH_POLICY => rollout.push_policy(required),
    CMD_START_CANARY => canary.start(required),
    CMD_CANARY_STATUS => canary.status(none),
    CMD_ABORT_CANARY => canary.abort(required),
    CMD_START_WHATIF => whatif.start(required),
    CMD_WHATIF_STATUS => whatif.status(required),
    CMD_CANCEL_WHATIF => whatif.cancel(required),
    CMD_ETCD_POLICY => etcd.policy(optional),
    CMD_PUSH_ETCD_POLICY => etcd.push(required),
    CMD_ROLLBACK_ETCD_POLICY => etcd.rollback(required),
    CMD_ETCD_DRIFT => etcd.drift(none),
    CMD_POLICY_HISTORY => audit.policy_history(none),
    CMD_HISTORY_COMPARE => audit.history_compare(required),
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
