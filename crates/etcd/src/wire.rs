//! etcd v3's JSON gateway, pure: the request bodies of `/v3/kv/range` (one key or a prefix), `/v3/kv/txn`,
//! `/v3/kv/put`, `/v3/watch` (one key or a prefix), `/v3/lease/grant`, `/v3/lease/keepalive`,
//! `/v3/lease/revoke` and `/v3/auth/authenticate`, and the parsing of their answers and of the watch
//! stream's newline-delimited frames.
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

/// The answer to a prefix range: the store's revision and the keys under the prefix, in key order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixRange {
    /// The store's revision when it answered: a watch of the prefix from `revision + 1` misses nothing.
    pub revision: i64,
    /// The keys, at most the request's limit.
    pub kvs: Vec<KeyValue>,
    /// Whether etcd holds more keys under the prefix than the limit let through.
    pub more: bool,
}

/// A lease etcd granted: keys put with it vanish when it expires or is revoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// etcd's id for it.
    pub id: i64,
    /// The time to live etcd granted, in seconds: etcd raises a TTL below its minimum (2 s with its default
    /// election timeout; 0 and negative TTLs too), so this may be more than was asked.
    pub ttl_seconds: i64,
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

/// The error a stream's frame `line` (which has an `error` field) carries; 2 (unknown) if it says nothing.
fn stream_error(line: &[u8]) -> ServerError {
    parse_error(line).unwrap_or(ServerError { code: 2, message: String::new() })
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
    // A one-key range is a range of at most one key.
    let PrefixRange { revision, kvs, .. } = parse_prefix_range(body)?;
    Ok(Range { revision, kv: kvs.into_iter().next() })
}

/// The `range_end` that, beside `key = prefix`, selects every key starting with `prefix` (etcd's own
/// prefix rule, clientv3's `GetPrefixRangeEnd`): the prefix with its last byte below 0xff incremented and
/// what follows that byte dropped. A prefix of only 0xff bytes, or the empty one, has no such end: it is
/// "\0", which etcd reads as "every key from `key` on".
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|b| *b < 0xff) {
        Some(last) => {
            let mut end = prefix[..=last].to_vec();
            end[last] += 1;
            end
        }
        None => vec![0],
    }
}

/// The `key` and `range_end` of every key starting with `prefix`. etcd refuses an empty `key` ("key is
/// not provided"), so the empty prefix starts at "\0", the smallest key, as clientv3 does.
fn prefix_bounds(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let key = if prefix.is_empty() { vec![0] } else { prefix.to_vec() };
    (key, prefix_end(prefix))
}

/// The body of a range over every key starting with `prefix`, now, at most `limit` keys (0: no limit).
pub fn prefix_range_request(prefix: &[u8], limit: i64) -> Value {
    let (key, end) = prefix_bounds(prefix);
    let mut body = json!({"key": b64(&key), "range_end": b64(&end)});
    if limit > 0 {
        body["limit"] = json!(limit.to_string());
    }
    body
}

/// Reads the answer to [`prefix_range_request`] (and to [`range_request`]).
pub fn parse_prefix_range(body: &[u8]) -> Result<PrefixRange, WireError> {
    let answer = document(body)?;
    let kvs = match answer.get("kvs").and_then(Value::as_array) {
        Some(kvs) => kvs.iter().map(KeyValue::parse).collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let more = answer.get("more").and_then(Value::as_bool).unwrap_or(false);
    Ok(PrefixRange { revision: header_revision(&answer)?, kvs, more })
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

/// The body of an unconditional put, attached to the lease `lease_id` (0: none, etcd's own "no lease").
pub fn put_request(key: &[u8], value: &[u8], lease_id: i64) -> Value {
    let mut body = json!({"key": b64(key), "value": b64(value)});
    if lease_id != 0 {
        body["lease"] = json!(lease_id.to_string());
    }
    body
}

/// Reads the answer to [`put_request`]: the store's revision after the write. A revoke (see
/// [`lease_request`]) answers the same `{"header"}`.
pub fn parse_put(body: &[u8]) -> Result<i64, WireError> {
    header_revision(&document(body)?)
}

/// The body of `/v3/watch` for one key from `start_revision` on.
pub fn watch_request(key: &[u8], start_revision: i64) -> Value {
    json!({"create_request": {"key": b64(key), "start_revision": start_revision.to_string()}})
}

/// The body of `/v3/watch` for every key starting with `prefix`, from `start_revision` on.
pub fn watch_prefix_request(prefix: &[u8], start_revision: i64) -> Value {
    let (key, end) = prefix_bounds(prefix);
    let mut body = watch_request(&key, start_revision);
    body["create_request"]["range_end"] = json!(b64(&end));
    body
}

/// The body of `/v3/lease/grant` for a lease of `ttl_seconds`; ID 0 lets etcd choose the id.
pub fn lease_grant_request(ttl_seconds: i64) -> Value {
    json!({"TTL": ttl_seconds.to_string(), "ID": "0"})
}

/// Reads the answer to [`lease_grant_request`].
pub fn parse_lease_grant(body: &[u8]) -> Result<Lease, WireError> {
    let answer = document(body)?;
    let id = int("ID", &answer["ID"])?;
    // Zero is no lease at all: a put with it would be a plain put that never vanishes.
    if id == 0 {
        return Err(WireError::Shape("a lease grant without a lease ID".into()));
    }
    Ok(Lease { id, ttl_seconds: int("TTL", &answer["TTL"])? })
}

/// The body of `/v3/lease/keepalive` and `/v3/lease/revoke`: the lease's id.
pub fn lease_request(id: i64) -> Value {
    json!({"ID": id.to_string()})
}

/// Reads the answer to a one-shot keepalive: the lease's time to live from now, in seconds, or `None`
/// when etcd no longer holds the lease (it expired or was revoked: etcd leaves `TTL` out, which is 0), or
/// the error etcd ended the stream with.
///
/// Keepalive is a stream in gRPC; etcd 3.4's gateway answers one request with one frame
/// `{"result": {"header", "ID", "TTL"}}` and a newline, and closes the stream. The bare answer
/// `{"header", "ID", "TTL"}` (what a unary call looks like) is read too, should a gateway send that.
pub fn parse_keepalive(body: &[u8]) -> Result<Result<Option<i64>, ServerError>, WireError> {
    let line = body.split(|b| *b == b'\n').find(|line| line.iter().any(|b| !b.is_ascii_whitespace()));
    let line = line.unwrap_or_default();
    let frame = document(line)?;
    if frame.get("error").is_some() {
        return Ok(Err(stream_error(line)));
    }
    let answer = frame.get("result").unwrap_or(&frame);
    if !answer.is_object() {
        return Err(WireError::Shape("a keepalive answer that is not an object".into()));
    }
    let ttl = int("TTL", &answer["TTL"])?;
    Ok(Ok((ttl > 0).then_some(ttl)))
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
        return Ok(Err(stream_error(line)));
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

    // Leases and prefixes, as etcd 3.4.23's gateway sent them (cluster and member ids shortened).
    // Asked for a TTL of 1 second, etcd granted its minimum, 2.
    const GRANT_TTL_1: &str = r#"{"header":{"cluster_id":"3249","member_id":"3319","revision":"1","raft_term":"2"},"ID":"4111120492007863301","TTL":"2"}"#;
    // One-shot keepalive of a live lease: the stream's one frame, a newline, the end.
    const KEEPALIVE_LIVE: &str = concat!(
        r#"{"result":{"header":{"cluster_id":"3249","member_id":"3319","revision":"1","raft_term":"2"},"ID":"4111120492007863315","TTL":"30"}}"#,
        "\n"
    );
    // Keepalive of a lease that expired (or was revoked, or never was): HTTP 200, no TTL.
    const KEEPALIVE_EXPIRED: &str = concat!(
        r#"{"result":{"header":{"cluster_id":"3249","member_id":"3319","revision":"3","raft_term":"2"},"ID":"4111120492007863318"}}"#,
        "\n"
    );
    // Keepalive of lease 0: not even an ID.
    const KEEPALIVE_ZERO: &str =
        r#"{"result":{"header":{"cluster_id":"3249","member_id":"3319","revision":"1","raft_term":"2"}}}"#;
    // Revoke of a live lease (HTTP 200); of an unknown or expired one, HTTP 404 with code 5.
    const REVOKED: &str =
        r#"{"header":{"cluster_id":"3249","member_id":"3319","revision":"3","raft_term":"2"}}"#;
    const LEASE_NOT_FOUND: &str = r#"{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}"#;
    // `/fleetdeck/f1/load/` with limit 1, two keys there (put with a lease: the kvs carry it).
    const PREFIX_MORE: &str = r#"{"header":{"cluster_id":"3249","member_id":"3319","revision":"6","raft_term":"2"},"kvs":[{"key":"L2ZsZWV0ZGVjay9mMS9sb2FkL3Ix","create_revision":"4","mod_revision":"4","version":"1","value":"eyJyMSI6MX0=","lease":"4111120492007863327"}],"more":true,"count":"2"}"#;
    const PREFIX_ALL: &str = r#"{"header":{"cluster_id":"3249","member_id":"3319","revision":"6","raft_term":"2"},"kvs":[{"key":"L2ZsZWV0ZGVjay9mMS9sb2FkL3Ix","create_revision":"4","mod_revision":"4","version":"1","value":"eyJyMSI6MX0=","lease":"4111120492007863327"},{"key":"L2ZsZWV0ZGVjay9mMS9sb2FkL3Iy","create_revision":"5","mod_revision":"5","version":"1","value":"eyJyMiI6MX0=","lease":"4111120492007863327"}],"count":"2"}"#;
    // A prefix watch when the lease of both keys expired: both deletions in one frame, one revision.
    const LEASE_EXPIRED_EVENTS: &str = r#"{"result":{"header":{"cluster_id":"3249","member_id":"3319","revision":"7","raft_term":"2"},"events":[{"type":"DELETE","kv":{"key":"L2ZsZWV0ZGVjay9mMS9sb2FkL3Ix","mod_revision":"7"}},{"type":"DELETE","kv":{"key":"L2ZsZWV0ZGVjay9mMS9sb2FkL3Iy","mod_revision":"7"}}]}}"#;

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

    #[test]
    fn leases_are_granted_kept_alive_and_revoked() {
        assert_eq!(lease_grant_request(1), json!({"TTL": "1", "ID": "0"}));
        assert_eq!(
            parse_lease_grant(GRANT_TTL_1.as_bytes()).unwrap(),
            Lease { id: 4111120492007863301, ttl_seconds: 2 }
        );
        assert!(matches!(parse_lease_grant(REVOKED.as_bytes()), Err(WireError::Shape(_))));
        assert_eq!(lease_request(4111120492007863315), json!({"ID": "4111120492007863315"}));
        assert_eq!(parse_keepalive(KEEPALIVE_LIVE.as_bytes()).unwrap(), Ok(Some(30)));
        assert_eq!(parse_keepalive(KEEPALIVE_EXPIRED.as_bytes()).unwrap(), Ok(None));
        assert_eq!(parse_keepalive(KEEPALIVE_ZERO.as_bytes()).unwrap(), Ok(None));
        // The unary shape, should a gateway answer without the stream's framing.
        let bare = r#"{"header":{"revision":"1"},"ID":"7","TTL":"10"}"#;
        assert_eq!(parse_keepalive(bare.as_bytes()).unwrap(), Ok(Some(10)));
        // An error ending the stream, in the watch stream's shape.
        let stream_error = r#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader"}}"#;
        let error = parse_keepalive(stream_error.as_bytes()).unwrap().unwrap_err();
        assert_eq!((error.code, error.message.as_str()), (14, "etcdserver: no leader"));
        assert!(matches!(parse_keepalive(b""), Err(WireError::Shape(_))));
        assert!(matches!(parse_keepalive(b"[]"), Err(WireError::Shape(_))));
        assert!(matches!(
            parse_keepalive(br#"{"result":{"TTL":"soon"}}"#),
            Err(WireError::Field { field: "TTL", .. })
        ));
        assert_eq!(parse_put(REVOKED.as_bytes()).unwrap(), 3);
        let error = parse_error(LEASE_NOT_FOUND.as_bytes()).unwrap();
        assert_eq!((error.code, error.message.as_str()), (5, "etcdserver: requested lease not found"));
    }

    #[test]
    fn a_put_names_its_lease_only_when_it_has_one() {
        assert_eq!(put_request(b"/a", b"v", 0), json!({"key": "L2E=", "value": "dg=="}));
        assert_eq!(
            put_request(b"/a", b"v", 4111120492007863318),
            json!({"key": "L2E=", "value": "dg==", "lease": "4111120492007863318"})
        );
    }

    #[test]
    fn prefix_ends_follow_etcds_rule() {
        assert_eq!(prefix_end(b"/fleetdeck/f1/load/"), b"/fleetdeck/f1/load0");
        assert_eq!(prefix_end(b"a"), b"b");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"a\xfe\xff\xff"), b"a\xff");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn prefix_ranges_read_every_key_and_say_when_some_were_left_out() {
        assert_eq!(
            prefix_range_request(b"/fleetdeck/f1/load/", 1024),
            json!({"key": b64(b"/fleetdeck/f1/load/"), "range_end": b64(b"/fleetdeck/f1/load0"), "limit": "1024"})
        );
        // The empty prefix is every key: etcd refuses an empty key, so it starts at "\0".
        assert_eq!(prefix_range_request(b"", 0), json!({"key": "AA==", "range_end": "AA=="}));
        let all = parse_prefix_range(PREFIX_ALL.as_bytes()).unwrap();
        assert_eq!((all.revision, all.more), (6, false));
        let keys: Vec<&[u8]> = all.kvs.iter().map(|kv| kv.key.as_slice()).collect();
        assert_eq!(keys, [b"/fleetdeck/f1/load/r1".as_slice(), b"/fleetdeck/f1/load/r2"]);
        assert_eq!(all.kvs[1].value, br#"{"r2":1}"#);
        let cut = parse_prefix_range(PREFIX_MORE.as_bytes()).unwrap();
        assert_eq!((cut.revision, cut.kvs.len(), cut.more), (6, 1, true));
        assert_eq!(
            parse_prefix_range(RANGE_EMPTY.as_bytes()).unwrap(),
            PrefixRange { revision: 2, kvs: Vec::new(), more: false }
        );
    }

    #[test]
    fn a_prefix_watch_sees_a_leases_keys_vanish() {
        let body = watch_prefix_request(b"/fleetdeck/f1/load/", 7);
        assert_eq!(
            body,
            json!({"create_request": {
                "key": b64(b"/fleetdeck/f1/load/"),
                "range_end": b64(b"/fleetdeck/f1/load0"),
                "start_revision": "7",
            }})
        );
        assert_eq!(watch_prefix_request(b"", 1)["create_request"]["key"], "AA==");
        let Ok(WatchFrame::Events { revision: 7, events }) =
            parse_watch_frame(LEASE_EXPIRED_EVENTS.as_bytes()).unwrap()
        else {
            panic!("not events")
        };
        assert_eq!(
            events,
            [
                WatchEvent::Delete { key: b"/fleetdeck/f1/load/r1".to_vec(), mod_revision: 7 },
                WatchEvent::Delete { key: b"/fleetdeck/f1/load/r2".to_vec(), mod_revision: 7 },
            ]
        );
    }
}
