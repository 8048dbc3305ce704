//! etcd v3's JSON gateway, pure: the request bodies of `/v3/kv/range`, `/v3/kv/txn`, `/v3/kv/put`,
//! `/v3/watch` and `/v3/auth/authenticate`, and the parsing of their answers and of the watch stream's
//! newline-delimited frames.
//!
//! The gateway speaks protobuf's JSON mapping: keys and values are base64, 64-bit integers are strings
//! (`"revision": "42"`), and fields at their zero value are left out (a failed txn has no `succeeded`, a
//! PUT event no `type`). Parsing is lenient about unknown fields and strict about values: a revision that
//! is not a number or a value that is not base64 is an error naming the field.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use serde_json::{Value, json};

/// An answer etcd's gateway sent that this client cannot read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not JSON, or JSON of another shape.
    #[error("etcd answered in a shape this client does not understand ({0})")]
    Shape(String),
    /// A field holds a value of the wrong kind.
    #[error("etcd's field {field} holds {value:?}, not {expected}")]
    Field {
        /// The field's name.
        field: &'static str,
        /// What it held.
        value: String,
        /// What it should hold.
        expected: &'static str,
    },
    /// One watch frame passed the size limit.
    #[error("a watch frame from etcd passed {limit} bytes without ending; is the value that large?")]
    FrameTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
}

/// Encodes bytes the way the gateway wants keys and values.
pub fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

fn unb64(field: &'static str, text: &str) -> Result<Vec<u8>, WireError> {
    STANDARD.decode(text).map_err(|_| WireError::Field { field, value: short(text), expected: "base64" })
}

fn short(text: &str) -> String {
    text.chars().take(80).collect()
}

/// A protobuf int64 in JSON: a string of digits (what the gateway sends) or a number; absent is 0.
fn int(field: &'static str, value: &Value) -> Result<i64, WireError> {
    match value {
        Value::Null => Ok(0),
        Value::Number(n) => n.as_i64().ok_or_else(|| WireError::Field {
            field,
            value: n.to_string(),
            expected: "a 64-bit integer",
        }),
        Value::String(s) => {
            s.parse().map_err(|_| WireError::Field { field, value: short(s), expected: "a 64-bit integer" })
        }
        other => {
            Err(WireError::Field { field, value: short(&other.to_string()), expected: "a 64-bit integer" })
        }
    }
}

/// One key's value, as etcd keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// Revision of the key's creation.
    pub create_revision: i64,
    /// Revision of its last change: the `If-Match` of etcd.
    pub mod_revision: i64,
    /// Changes since its creation (1 for a new key).
    pub version: i64,
}

impl KeyValue {
    fn parse(kv: &Value) -> Result<Self, WireError> {
        Ok(Self {
            key: unb64("kv.key", kv["key"].as_str().unwrap_or_default())?,
            value: unb64("kv.value", kv["value"].as_str().unwrap_or_default())?,
            create_revision: int("kv.create_revision", &kv["create_revision"])?,
            mod_revision: int("kv.mod_revision", &kv["mod_revision"])?,
            version: int("kv.version", &kv["version"])?,
        })
    }
}

/// The answer to a single-key range: the store's revision and the key, if it exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    /// The store's revision when it answered.
    pub revision: i64,
    /// The key, absent when it does not exist (at that revision).
    pub kv: Option<KeyValue>,
}

/// The answer to a compare-and-swap put.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnOutcome {
    /// Whether the compare held, so the value was written.
    pub succeeded: bool,
    /// The store's revision after the txn: the new value's `mod_revision` when it succeeded.
    pub revision: i64,
    /// When it failed: the key as it stands (absent if it does not exist).
    pub current: Option<KeyValue>,
}

/// One change the watch reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// The key was written.
    Put(KeyValue),
    /// The key was deleted at `mod_revision`.
    Delete {
        /// The key.
        key: Vec<u8>,
        /// The revision of the deletion.
        mod_revision: i64,
    },
}

/// One frame of the watch stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchFrame {
    /// The watch is set up; changes after `revision` follow.
    Created {
        /// The store's revision.
        revision: i64,
    },
    /// Changes, oldest first.
    Events {
        /// The store's revision.
        revision: i64,
        /// What happened.
        events: Vec<WatchEvent>,
    },
    /// No change, but the store is at `revision` (a progress notification).
    Progress {
        /// The store's revision.
        revision: i64,
    },
    /// etcd ended the watch: the start revision was compacted away (`compact_revision` set), or another
    /// reason. The watcher must read the key again and watch from there.
    Canceled {
        /// The oldest revision etcd still holds, when compaction was the cause.
        compact_revision: Option<i64>,
        /// etcd's reason, if it gave one.
        reason: String,
    },
}

/// An error answer of the gateway: `{"error", "message", "code"}` (a gRPC status code).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerError {
    /// gRPC status code (16: unauthenticated, 7: permission denied, 11: compacted, ...).
    pub code: i64,
    /// etcd's message.
    pub message: String,
}

/// Reads an error body, if it is one. The gateway sends `{"error": "...", "message": "...", "code": N}`
/// for a failed call and `{"error": {"grpc_code", "http_code", "message"}}` inside a stream.
pub fn parse_error(body: &[u8]) -> Option<ServerError> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let error = value.get("error")?;
    if let Some(inner) = error.as_object() {
        let message = inner.get("message").and_then(Value::as_str).unwrap_or_default().to_owned();
        let code = inner.get("grpc_code").and_then(Value::as_i64).unwrap_or(2);
        return Some(ServerError { code, message });
    }
    let message = value
        .get("message")
        .and_then(Value::as_str)
        .or_else(|| error.as_str())
        .unwrap_or_default()
        .to_owned();
    Some(ServerError { code: value.get("code").and_then(Value::as_i64).unwrap_or(2), message })
}

fn document(body: &[u8]) -> Result<Value, WireError> {
    serde_json::from_slice(body).map_err(|e| WireError::Shape(e.to_string()))
}

fn header_revision(answer: &Value) -> Result<i64, WireError> {
    int("header.revision", &answer["header"]["revision"])
}

/// The body of a range over one key, at `revision` (0: the newest).
pub fn range_request(key: &[u8], revision: i64) -> Value {
    let mut body = json!({"key": b64(key)});
    if revision > 0 {
        body["revision"] = json!(revision.to_string());
    }
    body
}

/// Reads the answer to [`range_request`].
pub fn parse_range(body: &[u8]) -> Result<Range, WireError> {
    let answer = document(body)?;
    let kv = match answer.get("kvs").and_then(Value::as_array).and_then(|kvs| kvs.first()) {
        Some(kv) => Some(KeyValue::parse(kv)?),
        None => None,
    };
    Ok(Range { revision: header_revision(&answer)?, kv })
}

/// The body of a txn that writes `value` to `key` only if the key's `mod_revision` is `expected`
/// (0: only if the key does not exist), and otherwise reads the key.
pub fn put_if_request(key: &[u8], value: &[u8], expected_mod_revision: i64) -> Value {
    let key = b64(key);
    json!({
        "compare": [{"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": expected_mod_revision.to_string()}],
        "success": [{"request_put": {"key": key, "value": b64(value)}}],
        "failure": [{"request_range": {"key": key}}],
    })
}

/// Reads the answer to [`put_if_request`].
pub fn parse_put_if(body: &[u8]) -> Result<TxnOutcome, WireError> {
    let answer = document(body)?;
    let succeeded = answer.get("succeeded").and_then(Value::as_bool).unwrap_or(false);
    let revision = header_revision(&answer)?;
    let mut current = None;
    if !succeeded {
        let kvs = &answer["responses"][0]["response_range"]["kvs"];
        if let Some(kv) = kvs.as_array().and_then(|kvs| kvs.first()) {
            current = Some(KeyValue::parse(kv)?);
        }
    }
    Ok(TxnOutcome { succeeded, revision, current })
}

/// The body of an unconditional put.
pub fn put_request(key: &[u8], value: &[u8]) -> Value {
    json!({"key": b64(key), "value": b64(value)})
}

/// Reads the answer to [`put_request`]: the store's revision after the write.
pub fn parse_put(body: &[u8]) -> Result<i64, WireError> {
    header_revision(&document(body)?)
}

/// The body of `/v3/watch` for one key from `start_revision` on.
pub fn watch_request(key: &[u8], start_revision: i64) -> Value {
    json!({"create_request": {"key": b64(key), "start_revision": start_revision.to_string()}})
}

/// The body of `/v3/auth/authenticate`.
pub fn authenticate_request(user: &str, password: &str) -> Value {
    json!({"name": user, "password": password})
}

/// Reads the token from the answer to [`authenticate_request`].
pub fn parse_token(body: &[u8]) -> Result<String, WireError> {
    #[derive(Deserialize)]
    struct Answer {
        token: String,
    }
    serde_json::from_slice::<Answer>(body).map(|a| a.token).map_err(|e| WireError::Shape(e.to_string()))
}

/// Reads one line of the watch stream: a frame, or the error etcd ended the stream with.
pub fn parse_watch_frame(line: &[u8]) -> Result<Result<WatchFrame, ServerError>, WireError> {
    let frame = document(line)?;
    if frame.get("error").is_some() {
        return Ok(Err(parse_error(line).unwrap_or(ServerError { code: 2, message: String::new() })));
    }
    let result =
        frame.get("result").ok_or_else(|| WireError::Shape("a watch frame without `result`".into()))?;
    let revision = header_revision(result)?;
    let flag = |name: &str| result.get(name).and_then(Value::as_bool).unwrap_or(false);
    if flag("canceled") {
        let compact = int("compact_revision", &result["compact_revision"])?;
        let reason = result.get("cancel_reason").and_then(Value::as_str).unwrap_or_default().to_owned();
        return Ok(Ok(WatchFrame::Canceled { compact_revision: (compact > 0).then_some(compact), reason }));
    }
    if flag("created") {
        return Ok(Ok(WatchFrame::Created { revision }));
    }
    let Some(events) = result.get("events").and_then(Value::as_array) else {
        return Ok(Ok(WatchFrame::Progress { revision }));
    };
    let mut parsed = Vec::with_capacity(events.len());
    for event in events {
        let kv = &event["kv"];
        match event.get("type").and_then(Value::as_str).unwrap_or("PUT") {
            "PUT" => parsed.push(WatchEvent::Put(KeyValue::parse(kv)?)),
            "DELETE" => parsed.push(WatchEvent::Delete {
                key: unb64("kv.key", kv["key"].as_str().unwrap_or_default())?,
                mod_revision: int("kv.mod_revision", &kv["mod_revision"])?,
            }),
            other => {
                return Err(WireError::Field {
                    field: "events.type",
                    value: short(other),
                    expected: "PUT or DELETE",
                });
            }
        }
    }
    Ok(Ok(WatchFrame::Events { revision, events: parsed }))
}

/// Cuts a byte stream into lines (the watch stream's frames), holding at most `limit` bytes of an
/// unfinished one.
#[derive(Debug)]
pub struct Lines {
    pending: Vec<u8>,
    limit: usize,
}

impl Lines {
    /// A splitter refusing lines longer than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self { pending: Vec::new(), limit }
    }

    /// Takes in `chunk`; returns the lines it completed (without their newline; blank lines skipped).
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Vec<u8>>, WireError> {
        let mut lines = Vec::new();
        let mut rest = chunk;
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            self.pending.extend_from_slice(&rest[..end]);
            rest = &rest[end + 1..];
            let line = std::mem::take(&mut self.pending);
            if line.iter().any(|b| !b.is_ascii_whitespace()) {
                lines.push(line);
            }
        }
        self.pending.extend_from_slice(rest);
        if self.pending.len() > self.limit {
            self.pending.clear();
            return Err(WireError::FrameTooLarge { limit: self.limit });
        }
        Ok(lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Answers as etcd 3.4.23's gateway sent them (cluster and member ids shortened).
    const RANGE: &str = r#"{"header":{"cluster_id":"3249","member_id":"3319","revision":"2","raft_term":"2"},"kvs":[{"key":"L2E=","create_revision":"2","mod_revision":"2","version":"1","value":"djE="}],"count":"1"}"#;
    const RANGE_EMPTY: &str =
        r#"{"header":{"cluster_id":"3249","member_id":"3319","revision":"2","raft_term":"2"}}"#;
    const TXN_OK: &str = r#"{"header":{"revision":"3","raft_term":"2"},"succeeded":true,"responses":[{"response_put":{"header":{"revision":"3"}}}]}"#;
    const TXN_STALE: &str = r#"{"header":{"revision":"3","raft_term":"2"},"responses":[{"response_range":{"header":{"revision":"3"},"kvs":[{"key":"L2E=","create_revision":"2","mod_revision":"3","version":"2","value":"djI="}],"count":"1"}}]}"#;
    const CREATED: &str = r#"{"result":{"header":{"revision":"4","raft_term":"2"},"created":true}}"#;
    const EVENTS: &str = r#"{"result":{"header":{"revision":"5"},"events":[{"kv":{"key":"L2E=","create_revision":"2","mod_revision":"4","version":"3","value":"djM="}},{"type":"DELETE","kv":{"key":"L2E=","mod_revision":"5"}}]}}"#;
    const COMPACTED: &str =
        r#"{"result":{"header":{"raft_term":"2"},"canceled":true,"compact_revision":"3"}}"#;
    const FAILED: &str = r#"{"error":"etcdserver: mvcc: required revision has been compacted","message":"etcdserver: mvcc: required revision has been compacted","code":11}"#;

    #[test]
    fn ranges_read_the_key_or_its_absence() {
        let range = parse_range(RANGE.as_bytes()).unwrap();
        let kv = range.kv.unwrap();
        assert_eq!(
            (range.revision, kv.key, kv.value, kv.mod_revision),
            (2, b"/a".to_vec(), b"v1".to_vec(), 2)
        );
        assert_eq!(parse_range(RANGE_EMPTY.as_bytes()).unwrap(), Range { revision: 2, kv: None });
        assert_eq!(range_request(b"/a", 0), json!({"key": "L2E="}));
        assert_eq!(range_request(b"/a", 7)["revision"], "7");
    }

    #[test]
    fn a_compare_and_swap_says_whether_it_wrote_and_what_is_there() {
        let ok = parse_put_if(TXN_OK.as_bytes()).unwrap();
        assert_eq!(ok, TxnOutcome { succeeded: true, revision: 3, current: None });
        let stale = parse_put_if(TXN_STALE.as_bytes()).unwrap();
        assert!(!stale.succeeded);
        assert_eq!(stale.current.unwrap().mod_revision, 3);
        let request = put_if_request(b"/a", b"v", 0);
        assert_eq!(request["compare"][0]["mod_revision"], "0");
        assert_eq!(request["success"][0]["request_put"]["value"], "dg==");
    }

    #[test]
    fn watch_frames_are_told_apart() {
        assert_eq!(parse_watch_frame(CREATED.as_bytes()).unwrap(), Ok(WatchFrame::Created { revision: 4 }));
        let Ok(WatchFrame::Events { revision: 5, events }) = parse_watch_frame(EVENTS.as_bytes()).unwrap()
        else {
            panic!("not events")
        };
        assert!(matches!(&events[0], WatchEvent::Put(kv) if kv.value == b"v3" && kv.mod_revision == 4));
        assert_eq!(events[1], WatchEvent::Delete { key: b"/a".to_vec(), mod_revision: 5 });
        assert_eq!(
            parse_watch_frame(COMPACTED.as_bytes()).unwrap(),
            Ok(WatchFrame::Canceled { compact_revision: Some(3), reason: String::new() })
        );
        let progress = r#"{"result":{"header":{"revision":"9"}}}"#;
        assert_eq!(parse_watch_frame(progress.as_bytes()).unwrap(), Ok(WatchFrame::Progress { revision: 9 }));
        let stream_error =
            r#"{"error":{"grpc_code":16,"http_code":401,"message":"etcdserver: invalid auth token"}}"#;
        let error = parse_watch_frame(stream_error.as_bytes()).unwrap().unwrap_err();
        assert_eq!((error.code, error.message.as_str()), (16, "etcdserver: invalid auth token"));
    }

    #[test]
    fn errors_and_bad_values_are_named() {
        let error = parse_error(FAILED.as_bytes()).unwrap();
        assert_eq!(error.code, 11);
        assert!(error.message.contains("compacted"));
        assert_eq!(parse_error(RANGE.as_bytes()), None);
        let bad_revision = r#"{"header":{"revision":"two"}}"#;
        assert!(matches!(
            parse_range(bad_revision.as_bytes()),
            Err(WireError::Field { field: "header.revision", .. })
        ));
        let bad_value = r#"{"header":{"revision":"2"},"kvs":[{"key":"L2E=","value":"**"}]}"#;
        assert!(matches!(parse_range(bad_value.as_bytes()), Err(WireError::Field { field: "kv.value", .. })));
        assert!(matches!(parse_range(b"<html>"), Err(WireError::Shape(_))));
        assert!(parse_watch_frame(br#"{"result":{"events":[{"type":"MOVE","kv":{}}]}}"#).is_err());
        assert_eq!(parse_token(br#"{"header":{},"token":"abc.1"}"#).unwrap(), "abc.1");
    }

    #[test]
    fn lines_are_cut_across_chunks_and_bounded() {
        let mut lines = Lines::new(16);
        assert!(lines.push(b"{\"a\"").unwrap().is_empty());
        assert_eq!(
            lines.push(b":1}\n\n{\"b\":2}\n{").unwrap(),
            vec![b"{\"a\":1}".to_vec(), b"{\"b\":2}".to_vec()]
        );
        assert_eq!(lines.push(b"}\r\n").unwrap(), vec![b"{}\r".to_vec()]);
        assert!(matches!(lines.push(&[b'x'; 17]), Err(WireError::FrameTooLarge { limit: 16 })));
        // After a refused frame the splitter starts clean.
        assert_eq!(lines.push(b"{}\n").unwrap(), vec![b"{}".to_vec()]);
    }
}
