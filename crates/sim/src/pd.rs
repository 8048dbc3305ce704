//! Disaggregated prefill/decode at the HTTP edge: replica roles, the two request protocols, and the
//! prefill side's table of KV it holds for the decode side.
//!
//! - vLLM (NixlConnector, as its toy proxy drives it): the prefill leg carries `kv_transfer_params`
//!   `{"do_remote_decode": true, ...}` and `max_tokens: 1`; the prefill replica answers with
//!   `kv_transfer_params` `{"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id",
//!   "remote_request_id", "remote_block_ids", "remote_host", "remote_port", "tp_size", "remote_num_tokens"}`,
//!   and the decode leg carries those back. The decode replica pulls the blocks not in its own prefix cache.
//! - SGLang: both legs carry `bootstrap_host`, `bootstrap_port` and `bootstrap_room` and are sent at once;
//!   the decode replica waits (bounded) for the prefill replica's KV of that room and receives the whole
//!   prompt's KV.
//!
//! In the emulator the "side channel" is the prefill replica's own HTTP port: the decode replica asks it
//! `POST /fleet_sim/kv/pull` (see [`PullRequest`]) and the prefill replica frees the held blocks as it
//! answers. Parsing here is pure; a malformed field is a [`PdError`] worded for the client.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::watch;

pub use fleet_policy::Role;

/// vLLM's `kv_role` for `role`.
pub fn kv_role(role: Role) -> &'static str {
    match role {
        Role::Both => "kv_both",
        Role::Prefill => "kv_producer",
        Role::Decode => "kv_consumer",
    }
}

/// SGLang's `disaggregation_mode` for `role`.
pub fn disaggregation_mode(role: Role) -> &'static str {
    match role {
        Role::Both => "null",
        Role::Prefill => "prefill",
        Role::Decode => "decode",
    }
}

/// Settings of a replica's P/D behaviour beyond the engine's transfer cost.
#[derive(Debug, Clone, PartialEq)]
pub struct PdConfig {
    pub role: Role,
    /// How long a prefill replica holds finished requests' blocks for a pull (vLLM's `kv_lease_duration`,
    /// 30 s by default).
    pub lease: Duration,
    /// How long a decode replica waits for a prefill replica's KV (SGLang's
    /// `SGLANG_DISAGGREGATION_WAITING_TIMEOUT`, 300 s by default), and bounds every pull.
    pub wait_timeout: Duration,
}

impl Default for PdConfig {
    fn default() -> Self {
        Self { role: Role::Both, lease: Duration::from_secs(30), wait_timeout: Duration::from_secs(300) }
    }
}

/// A malformed P/D field, worded for the client (an OpenAI `invalid_request_error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PdError {
    pub message: String,
    pub param: &'static str,
}

fn bad(param: &'static str, message: impl Into<String>) -> PdError {
    PdError { message: message.into(), param }
}

/// Where a decode leg's KV is to come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PdLeg {
    /// vLLM prefill leg: compute, hold the blocks, answer with `kv_transfer_params`.
    VllmPrefill,
    /// vLLM decode leg: pull request `remote_request_id` from the prefill replica at `host:port`.
    VllmDecode { host: String, port: u16, request_id: u64, engine_id: String },
    /// SGLang leg on a prefill replica: compute, hold the blocks under `room`.
    SglangPrefill { room: u64 },
    /// SGLang leg on a decode replica: wait for `room`'s KV at the prefill replica `host:port`.
    SglangDecode { host: String, port: u16, room: u64 },
}

fn field<'a>(params: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    params.get(name).filter(|v| !v.is_null())
}

fn flag(params: &Map<String, Value>, name: &'static str) -> Result<bool, PdError> {
    match field(params, name) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(bad(
            "kv_transfer_params",
            format!("`kv_transfer_params.{name}` must be a boolean, not {other}"),
        )),
    }
}

fn port_of(value: Option<&Value>, param: &'static str, name: &str) -> Result<u16, PdError> {
    value
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p > 0)
        .ok_or_else(|| bad(param, format!("`{name}` must be a port number between 1 and 65535")))
}

fn host_of(value: Option<&Value>, param: &'static str, name: &str) -> Result<String, PdError> {
    match value.and_then(Value::as_str) {
        Some(host) if !host.is_empty() && host.len() <= 255 && !host.contains(['/', '@', ' ']) => {
            Ok(host.to_string())
        }
        _ => Err(bad(param, format!("`{name}` must be a host name or address"))),
    }
}

/// Reads `kv_transfer_params` (vLLM). `None` when absent or null; a leg otherwise.
pub fn parse_kv_transfer_params(value: Option<&Value>) -> Result<Option<PdLeg>, PdError> {
    let params = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(params)) => params,
        Some(_) => return Err(bad("kv_transfer_params", "`kv_transfer_params` must be a JSON object")),
    };
    let remote_decode = flag(params, "do_remote_decode")?;
    let remote_prefill = flag(params, "do_remote_prefill")?;
    match (remote_decode, remote_prefill) {
        (true, true) => Err(bad(
            "kv_transfer_params",
            "`kv_transfer_params` asks for both do_remote_decode and do_remote_prefill; a leg is one or the other",
        )),
        (true, false) => Ok(Some(PdLeg::VllmPrefill)),
        (false, true) => {
            let p = "kv_transfer_params";
            let host = host_of(field(params, "remote_host"), p, "kv_transfer_params.remote_host")?;
            let port = port_of(field(params, "remote_port"), p, "kv_transfer_params.remote_port")?;
            let request_id = match field(params, "remote_request_id") {
                Some(Value::String(s)) => s.parse::<u64>().ok(),
                Some(Value::Number(n)) => n.as_u64(),
                _ => None,
            }
            .ok_or_else(|| {
                bad(
                    p,
                    "`kv_transfer_params.remote_request_id` must be the id the prefill replica answered with",
                )
            })?;
            let engine_id = match field(params, "remote_engine_id") {
                Some(Value::String(s)) if !s.is_empty() => s.clone(),
                _ => return Err(bad(p, "`kv_transfer_params.remote_engine_id` must be a non-empty string")),
            };
            match field(params, "remote_block_ids") {
                Some(Value::Array(_)) => {}
                _ => return Err(bad(p, "`kv_transfer_params.remote_block_ids` must be a list of block ids")),
            }
            Ok(Some(PdLeg::VllmDecode { host, port, request_id, engine_id }))
        }
        (false, false) => Ok(None),
    }
}

/// Reads SGLang's bootstrap fields from a request body. `None` when none is present; all three otherwise.
pub fn parse_bootstrap(body: &Map<String, Value>) -> Result<Option<(String, u16, u64)>, PdError> {
    let host = field(body, "bootstrap_host");
    let port = field(body, "bootstrap_port");
    let room = field(body, "bootstrap_room");
    if host.is_none() && port.is_none() && room.is_none() {
        return Ok(None);
    }
    let host = host_of(host, "bootstrap_host", "bootstrap_host")?;
    let port = port_of(port, "bootstrap_port", "bootstrap_port")?;
    let room = room
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("bootstrap_room", "`bootstrap_room` must be a non-negative integer"))?;
    Ok(Some((host, port, room)))
}

/// The prefill replica's answer to a vLLM prefill leg, naming what the decode leg must send back.
pub fn vllm_prefill_answer(
    engine_id: &str,
    request_id: u64,
    host: &str,
    port: u16,
    blocks: u32,
    tokens: u32,
) -> Value {
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_engine_id": engine_id,
        "remote_request_id": request_id.to_string(),
        "remote_block_ids": [(0..blocks).collect::<Vec<u32>>()],
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
        "remote_num_tokens": tokens,
    })
}

/// What a decode replica asks a prefill replica for (`POST /fleet_sim/kv/pull`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// vLLM: the prefill request's id (`remote_request_id`).
    #[serde(default)]
    pub request_id: Option<u64>,
    /// SGLang: the bootstrap room; the prefill replica waits for it within `wait_ms`.
    #[serde(default)]
    pub room: Option<u64>,
    /// How long the prefill replica may wait for the room's KV, in milliseconds.
    #[serde(default)]
    pub wait_ms: u64,
}

/// A room on the prefill replica: the prefill is running, or its KV is held under an engine request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoomState {
    Pending,
    Ready { id: u64, tokens: u32 },
    Failed,
}

/// The prefill replica's rooms (SGLang), each watched by the decode side's pull.
#[derive(Debug, Default)]
pub struct Rooms {
    rooms: Mutex<HashMap<u64, watch::Sender<RoomState>>>,
}

/// Most rooms a replica tracks at once; more are refused (a bound against runaway clients).
pub const MAX_ROOMS: usize = 65_536;

impl Rooms {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, watch::Sender<RoomState>>> {
        self.rooms.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn entry(&self, room: u64) -> Option<watch::Receiver<RoomState>> {
        let mut rooms = self.lock();
        if let Some(tx) = rooms.get(&room) {
            return Some(tx.subscribe());
        }
        if rooms.len() >= MAX_ROOMS {
            return None;
        }
        let (tx, rx) = watch::channel(RoomState::Pending);
        rooms.insert(room, tx);
        Some(rx)
    }

    /// Sets a room's state (creating it), waking its waiters. False when the table is full.
    pub fn set(&self, room: u64, state: RoomState) -> bool {
        let mut rooms = self.lock();
        if let Some(tx) = rooms.get(&room) {
            tx.send_replace(state);
            return true;
        }
        if rooms.len() >= MAX_ROOMS {
            // Rooms finished but never pulled (their blocks' lease has run out since) make way.
            rooms.retain(|_, tx| *tx.borrow() == RoomState::Pending || tx.receiver_count() > 0);
            if rooms.len() >= MAX_ROOMS {
                return false;
            }
        }
        rooms.insert(room, watch::channel(state).0);
        true
    }

    /// Forgets a room.
    pub fn remove(&self, room: u64) {
        self.lock().remove(&room);
    }

    /// Waits up to `wait` for the room to be ready (or failed), then forgets it. `None` on timeout or a
    /// full table.
    pub async fn take(&self, room: u64, wait: Duration) -> Option<RoomState> {
        let mut rx = self.entry(room)?;
        let state = tokio::time::timeout(wait, rx.wait_for(|s| *s != RoomState::Pending)).await;
        let state = match state {
            Ok(Ok(state)) => Some(*state),
            _ => None,
        };
        if state.is_some() {
            self.remove(room);
        }
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_params_are_read_strictly() {
        assert_eq!(parse_kv_transfer_params(None), Ok(None));
        let prefill = json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null});
        assert_eq!(parse_kv_transfer_params(Some(&prefill)), Ok(Some(PdLeg::VllmPrefill)));
        let answer = vllm_prefill_answer("engine-1", 7, "127.0.0.1", 8100, 3, 40);
        assert_eq!(answer["remote_block_ids"], json!([[0, 1, 2]]));
        assert_eq!(
            parse_kv_transfer_params(Some(&answer)),
            Ok(Some(PdLeg::VllmDecode {
                host: "127.0.0.1".into(),
                port: 8100,
                request_id: 7,
                engine_id: "engine-1".into()
            }))
        );
        for broken in [
            json!("yes"),
            json!({"do_remote_decode": "true"}),
            json!({"do_remote_prefill": true, "remote_host": "h", "remote_port": 1}),
            json!({"do_remote_prefill": true, "remote_host": "h", "remote_port": 70000, "remote_request_id": "1",
                   "remote_engine_id": "e", "remote_block_ids": []}),
            json!({"do_remote_prefill": true, "do_remote_decode": true}),
        ] {
            let error = parse_kv_transfer_params(Some(&broken)).expect_err("refused");
            assert_eq!(error.param, "kv_transfer_params", "{broken}");
            assert!(error.message.contains("kv_transfer_params"), "{}", error.message);
        }
    }

    #[test]
    fn bootstrap_fields_come_as_three() {
        let body = |v: Value| v.as_object().cloned().expect("object");
        assert_eq!(parse_bootstrap(&body(json!({"prompt": "x"}))), Ok(None));
        assert_eq!(
            parse_bootstrap(&body(
                json!({"bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 42})
            )),
            Ok(Some(("10.0.0.1".into(), 8998, 42)))
        );
        let error =
            parse_bootstrap(&body(json!({"bootstrap_host": "h", "bootstrap_port": 1}))).expect_err("no room");
        assert_eq!(error.param, "bootstrap_room");
        assert!(parse_bootstrap(&body(json!({"bootstrap_host": "h", "bootstrap_room": 1}))).is_err());
        assert_eq!("decode".parse::<Role>(), Ok(Role::Decode));
        assert!("router".parse::<Role>().is_err());
    }

    #[tokio::test]
    async fn a_room_is_awaited_within_its_deadline() {
        let rooms = Rooms::default();
        assert_eq!(rooms.take(1, Duration::from_millis(100)).await, None, "nobody registers room 1");
        assert!(rooms.set(2, RoomState::Ready { id: 9, tokens: 40 }));
        assert_eq!(
            rooms.take(2, Duration::from_millis(100)).await,
            Some(RoomState::Ready { id: 9, tokens: 40 })
        );
        assert_eq!(rooms.take(2, Duration::from_millis(10)).await, None, "taken once");
        let waiter = {
            let rooms = std::sync::Arc::new(rooms);
            let r = rooms.clone();
            let task = tokio::spawn(async move { r.take(3, Duration::from_secs(5)).await });
            tokio::task::yield_now().await;
            rooms.set(3, RoomState::Ready { id: 4, tokens: 1 });
            task
        };
        assert_eq!(waiter.await.expect("joined"), Some(RoomState::Ready { id: 4, tokens: 1 }));
    }
}
