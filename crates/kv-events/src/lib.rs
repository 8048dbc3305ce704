//! vLLM's KV-cache event wire format, encoded and decoded without any I/O.
//!
//! vLLM (`vllm/distributed/kv_events.py`, `ZmqEventPublisher`) publishes on a ZMQ PUB socket
//! multipart messages `[topic, seq, payload]`: `seq` is an 8-byte big-endian counter starting
//! at 0, `payload` a msgpack `KVEventBatch` `[ts, events, data_parallel_rank]`. Events are
//! `BlockStored`, `BlockRemoved` and `AllBlocksCleared`, msgspec tagged structs. Three encodings of the
//! same structs are written ([`encode_batch`]) and all are read ([`decode_batch`]):
//!
//! - [`Encoding::Vllm`] (the default; vLLM 0.32, recorded from a real server in
//!   `tests/fixtures/vllm-0.32/`): the batch is msgspec `array_like`, `[ts, events, rank]`, and each event
//!   a map with a `"type"` tag (`{"type": "BlockStored", "block_hashes": ...}`); unknown keys (vLLM keeps
//!   adding some: `lora_name`, `extra_keys`, `group_idx`, `kv_cache_spec_kind`) are ignored.
//! - [`Encoding::Array`] (msgspec `array_like=True` on the events too, older vLLM): an event is
//!   `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`
//!   (trailing fields may be missing, extra trailing fields are ignored).
//! - [`Encoding::Map`]: the batch a map too, `{"ts", "events", "data_parallel_rank"}` (fleet-sim's default
//!   before it was checked against vLLM 0.32; kept for subscribers written against it).
//!
//! Block hashes are ints (vLLM 0.32's 64-bit ints, up to 2^64-1; fleet-sim's chained u64 hashes; older
//! vLLM's signed `hash()` values) or bytes (sha256 digests, as some vLLM versions sent): see [`BlockHash`].
//!
//! A ROUTER "replay" socket next to the PUB socket serves missed batches: a client (REQ)
//! sends the first sequence number it wants as 8 big-endian bytes; the publisher answers
//! with one `[seq, payload]` message per buffered batch from that number on, then the end
//! marker `[-1 as 8 signed big-endian bytes, b""]`. [`replay`] has those frames as functions.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

/// Why a message could not be decoded; each says which part of the message is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    #[error("payload is not valid msgpack: {0}")]
    Msgpack(String),
    #[error("{what} has the wrong shape: expected {expected}, found {found}")]
    Shape { what: String, expected: &'static str, found: String },
    #[error("{what} is missing field `{field}`")]
    MissingField { what: String, field: &'static str },
    #[error("event {index} has unknown tag {tag:?} (expected BlockStored, BlockRemoved or AllBlocksCleared)")]
    UnknownEvent { index: usize, tag: String },
    #[error("sequence number must be exactly 8 bytes (big-endian), got {0} bytes")]
    SeqLength(usize),
    #[error("message has {found} frames; expected {expected}")]
    FrameCount { expected: &'static str, found: usize },
}

/// The identity of one KV block as vLLM reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockHash {
    /// A msgpack integer; msgpack integers span `-2^63 ..= 2^64-1`, hence `i128`.
    Int(i128),
    /// A msgpack bin (a digest, typically 32 bytes of sha256, as some vLLM versions sent; 0.32 sends ints).
    Bytes(Vec<u8>),
}

impl BlockHash {
    /// A 64-bit identity for indexing: an integer's low 64 bits (two's complement for
    /// negative Python hashes), or the first 8 bytes of a digest big-endian (digests are
    /// uniformly distributed, so any 8 bytes are as good; shorter byte strings are padded).
    pub fn as_u64(&self) -> u64 {
        match self {
            BlockHash::Int(value) => *value as u64,
            BlockHash::Bytes(bytes) => {
                let mut word = [0u8; 8];
                let n = bytes.len().min(8);
                word[8 - n..].copy_from_slice(&bytes[..n]);
                u64::from_be_bytes(word)
            }
        }
    }
}

impl From<u64> for BlockHash {
    fn from(value: u64) -> Self {
        BlockHash::Int(i128::from(value))
    }
}

/// Blocks newly computed and cached (a request's prompt or output filled them).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockStored {
    /// The stored blocks, in order; each one's parent is the previous one.
    pub block_hashes: Vec<BlockHash>,
    /// Parent of the first block (`None` when the first block starts a sequence).
    pub parent_block_hash: Option<BlockHash>,
    /// The tokens of all stored blocks, `block_size` per block.
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    pub lora_id: Option<i64>,
    /// Where the blocks live (`"GPU"` in vLLM; `None` in older versions).
    pub medium: Option<String>,
}

/// Blocks evicted from the cache.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockRemoved {
    pub block_hashes: Vec<BlockHash>,
    pub medium: Option<String>,
}

/// One KV-cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    BlockStored(BlockStored),
    BlockRemoved(BlockRemoved),
    /// The whole prefix cache was reset (vLLM's `reset_prefix_cache`, or a restart).
    AllBlocksCleared,
}

impl KvEvent {
    /// The msgspec tag (the Python class name).
    pub fn tag(&self) -> &'static str {
        match self {
            KvEvent::BlockStored(_) => "BlockStored",
            KvEvent::BlockRemoved(_) => "BlockRemoved",
            KvEvent::AllBlocksCleared => "AllBlocksCleared",
        }
    }
}

/// One published message's payload: the events of one engine step.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// Unix time of the step, in seconds.
    pub ts: f64,
    pub events: Vec<KvEvent>,
    /// vLLM's data-parallel rank of the publishing engine (fleet-sim: the replica index).
    pub data_parallel_rank: Option<i64>,
}

/// Which msgpack encoding of a batch to write (see the crate docs); [`decode_batch`] reads all three.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// What vLLM 0.32 sends: the batch a positional array `[ts, events, rank]`, each event a map with a
    /// `"type"` tag.
    #[default]
    Vllm,
    /// Positional arrays throughout, each event's tag first (older vLLM, msgspec `array_like` events).
    Array,
    /// Maps throughout: the batch `{"ts", "events", "data_parallel_rank"}`, events tagged by `"type"`.
    Map,
}

impl Encoding {
    /// Every encoding, as the command line names them.
    pub const ALL: [Encoding; 3] = [Encoding::Vllm, Encoding::Array, Encoding::Map];

    /// The name [`std::str::FromStr`] takes.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Vllm => "vllm",
            Encoding::Array => "array",
            Encoding::Map => "map",
        }
    }
}

impl std::fmt::Display for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Encoding {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "vllm" => Ok(Encoding::Vllm),
            "array" => Ok(Encoding::Array),
            "map" => Ok(Encoding::Map),
            other => Err(format!("unknown KV event encoding {other:?}; use `vllm`, `array` or `map`")),
        }
    }
}

/// Encodes `batch` as a msgpack payload in `encoding`.
pub fn encode_batch(batch: &EventBatch, encoding: Encoding) -> Vec<u8> {
    let value = batch_to_value(batch, encoding);
    // Serialising our own tree into a Vec cannot fail: every variant maps to a msgpack type.
    rmp_serde::to_vec(&value).unwrap_or_default()
}

/// Decodes a msgpack `KVEventBatch` in any of the encodings (see the crate docs).
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, WireError> {
    let value: Value = rmp_serde::from_slice(payload).map_err(|e| WireError::Msgpack(e.to_string()))?;
    batch_from_value(value)
}

/// A sequence number as it travels: 8 bytes, big-endian.
pub fn encode_seq(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// Reads an 8-byte big-endian sequence number.
pub fn decode_seq(bytes: &[u8]) -> Result<u64, WireError> {
    let array: [u8; 8] = bytes.try_into().map_err(|_| WireError::SeqLength(bytes.len()))?;
    Ok(u64::from_be_bytes(array))
}

/// One message of the PUB stream, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    pub topic: Vec<u8>,
    pub seq: u64,
    pub batch: EventBatch,
}

/// The frames of one PUB message: `[topic, seq, payload]`.
pub fn publish_frames(topic: &[u8], seq: u64, payload: &[u8]) -> [Vec<u8>; 3] {
    [topic.to_vec(), encode_seq(seq).to_vec(), payload.to_vec()]
}

/// Decodes a PUB message received by a SUB socket.
pub fn decode_published(frames: &[&[u8]]) -> Result<Published, WireError> {
    let [topic, seq, payload] = frames else {
        return Err(WireError::FrameCount { expected: "3 (topic, seq, payload)", found: frames.len() });
    };
    Ok(Published { topic: topic.to_vec(), seq: decode_seq(seq)?, batch: decode_batch(payload)? })
}

/// The replay protocol's frames (vLLM's `ZmqEventPublisher._service_replay`), as seen by a
/// ROUTER socket (the publisher) and a REQ socket (the client).
pub mod replay {
    use super::{WireError, decode_seq, encode_seq};

    /// The end-of-replay marker: -1 as a signed 8-byte big-endian integer.
    pub const END_SEQ: [u8; 8] = [0xff; 8];

    /// A replay request as the ROUTER receives it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Request {
        /// The client's routing identity (first frame, added by ROUTER).
        pub identity: Vec<u8>,
        /// The first sequence number the client wants.
        pub start_seq: u64,
    }

    /// The frame a client (REQ) sends: the start sequence number.
    pub fn request_frame(start_seq: u64) -> [u8; 8] {
        encode_seq(start_seq)
    }

    /// Parses `[identity, "", start_seq]` as received by the ROUTER socket (REQ adds the empty
    /// delimiter). A DEALER client without the delimiter (`[identity, start_seq]`) is accepted too.
    pub fn parse_request(frames: &[&[u8]]) -> Result<Request, WireError> {
        match frames {
            [identity, [], seq] => Ok(Request { identity: identity.to_vec(), start_seq: decode_seq(seq)? }),
            [identity, seq] => Ok(Request { identity: identity.to_vec(), start_seq: decode_seq(seq)? }),
            _ => Err(WireError::FrameCount {
                expected: "3 (identity, empty delimiter, 8-byte start seq)",
                found: frames.len(),
            }),
        }
    }

    /// The ROUTER's frames carrying one buffered batch: `[identity, "", seq, payload]`.
    pub fn batch_frames(identity: &[u8], seq: u64, payload: &[u8]) -> Vec<Vec<u8>> {
        vec![identity.to_vec(), Vec::new(), encode_seq(seq).to_vec(), payload.to_vec()]
    }

    /// The ROUTER's frames ending a replay: `[identity, "", END_SEQ, ""]`.
    pub fn end_frames(identity: &[u8]) -> Vec<Vec<u8>> {
        vec![identity.to_vec(), Vec::new(), END_SEQ.to_vec(), Vec::new()]
    }

    /// One reply as the client (REQ, delimiter stripped) receives it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Reply {
        Batch { seq: u64, payload: Vec<u8> },
        End,
    }

    /// Parses a reply `[seq, payload]` (a leading empty delimiter, as a DEALER sees it, is skipped).
    pub fn parse_reply(frames: &[&[u8]]) -> Result<Reply, WireError> {
        let frames = match frames {
            [delimiter, rest @ ..] if delimiter.is_empty() && rest.len() == 2 => rest,
            other => other,
        };
        let [seq, payload] = frames else {
            return Err(WireError::FrameCount { expected: "2 (seq, payload)", found: frames.len() });
        };
        if *seq == END_SEQ.as_slice() {
            return Ok(Reply::End);
        }
        Ok(Reply::Batch { seq: decode_seq(seq)?, payload: payload.to_vec() })
    }
}

// ---------------------------------------------------------------------------------------
// A msgpack value tree: decoding goes bytes -> Value -> typed, so that every encoding and
// every error are handled in plain Rust, with a message naming the offending part.

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Nil,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Bin(Vec<u8>),
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
}

impl Value {
    fn kind(&self) -> String {
        match self {
            Value::Nil => "nil".into(),
            Value::Bool(b) => format!("bool {b}"),
            Value::Int(i) => format!("int {i}"),
            Value::Float(f) => format!("float {f}"),
            Value::Str(s) => format!("string {s:?}"),
            Value::Bin(b) => format!("{} bytes", b.len()),
            Value::Array(a) => format!("array of {}", a.len()),
            Value::Map(m) => format!("map of {}", m.len()),
        }
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Nil => serializer.serialize_unit(),
            Value::Bool(b) => serializer.serialize_bool(*b),
            Value::Int(i) => match u64::try_from(*i) {
                Ok(u) => serializer.serialize_u64(u),
                Err(_) => serializer.serialize_i64(i64::try_from(*i).unwrap_or(i64::MIN)),
            },
            Value::Float(f) => serializer.serialize_f64(*f),
            Value::Str(s) => serializer.serialize_str(s),
            Value::Bin(b) => serializer.serialize_bytes(b),
            Value::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Map(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a msgpack value (ext types are not used by vLLM)")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Nil)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Nil)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(i128::from(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Int(i128::from(v)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_owned()))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Value, E> {
        Ok(Value::Bin(v.to_vec()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        // The size hint comes from the (untrusted) header: cap the preallocation.
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(4096));
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Value::Map(entries))
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

// ---- typed -> Value ----

fn hash_value(hash: &BlockHash) -> Value {
    match hash {
        BlockHash::Int(i) => Value::Int(*i),
        BlockHash::Bytes(b) => Value::Bin(b.clone()),
    }
}

fn hashes_value(hashes: &[BlockHash]) -> Value {
    Value::Array(hashes.iter().map(hash_value).collect())
}

fn opt_str(value: &Option<String>) -> Value {
    value.as_ref().map_or(Value::Nil, |s| Value::Str(s.clone()))
}

fn event_to_value(event: &KvEvent, encoding: Encoding) -> Value {
    let tag = Value::Str(event.tag().into());
    let fields: Vec<(&str, Value)> = match event {
        KvEvent::BlockStored(stored) => vec![
            ("block_hashes", hashes_value(&stored.block_hashes)),
            ("parent_block_hash", stored.parent_block_hash.as_ref().map_or(Value::Nil, hash_value)),
            (
                "token_ids",
                Value::Array(stored.token_ids.iter().map(|&t| Value::Int(i128::from(t))).collect()),
            ),
            ("block_size", Value::Int(i128::from(stored.block_size))),
            ("lora_id", stored.lora_id.map_or(Value::Nil, |id| Value::Int(i128::from(id)))),
            ("medium", opt_str(&stored.medium)),
        ],
        KvEvent::BlockRemoved(removed) => {
            vec![("block_hashes", hashes_value(&removed.block_hashes)), ("medium", opt_str(&removed.medium))]
        }
        KvEvent::AllBlocksCleared => Vec::new(),
    };
    match encoding {
        Encoding::Array => {
            Value::Array(std::iter::once(tag).chain(fields.into_iter().map(|(_, v)| v)).collect())
        }
        Encoding::Vllm | Encoding::Map => Value::Map(
            std::iter::once((Value::Str("type".into()), tag))
                .chain(fields.into_iter().map(|(k, v)| (Value::Str(k.into()), v)))
                .collect(),
        ),
    }
}

fn batch_to_value(batch: &EventBatch, encoding: Encoding) -> Value {
    let events = Value::Array(batch.events.iter().map(|e| event_to_value(e, encoding)).collect());
    let rank = batch.data_parallel_rank.map_or(Value::Nil, |r| Value::Int(i128::from(r)));
    match encoding {
        Encoding::Vllm | Encoding::Array => {
            let mut items = vec![Value::Float(batch.ts), events];
            // msgspec's omit_defaults drops a trailing field equal to its default (None).
            if batch.data_parallel_rank.is_some() {
                items.push(rank);
            }
            Value::Array(items)
        }
        Encoding::Map => {
            let mut entries = vec![
                (Value::Str("ts".into()), Value::Float(batch.ts)),
                (Value::Str("events".into()), events),
            ];
            if batch.data_parallel_rank.is_some() {
                entries.push((Value::Str("data_parallel_rank".into()), rank));
            }
            Value::Map(entries)
        }
    }
}

// ---- Value -> typed ----

fn shape(what: impl Into<String>, expected: &'static str, found: &Value) -> WireError {
    WireError::Shape { what: what.into(), expected, found: found.kind() }
}

/// Named fields of a struct in either encoding: positional (array, after the tag if any)
/// or by key (map).
enum Fields {
    Positional(Vec<Value>),
    Named(Vec<(Value, Value)>),
}

impl Fields {
    fn take(&mut self, position: usize, name: &str) -> Option<Value> {
        match self {
            Fields::Positional(items) => items.get_mut(position).map(|v| std::mem::replace(v, Value::Nil)),
            Fields::Named(entries) => entries
                .iter_mut()
                .find(|(k, _)| matches!(k, Value::Str(key) if key == name))
                .map(|(_, v)| std::mem::replace(v, Value::Nil)),
        }
    }

    fn required(&mut self, position: usize, name: &'static str, what: &str) -> Result<Value, WireError> {
        self.take(position, name).ok_or_else(|| WireError::MissingField { what: what.into(), field: name })
    }
}

fn as_float(value: &Value, what: &str) -> Result<f64, WireError> {
    match value {
        Value::Float(f) => Ok(*f),
        Value::Int(i) => Ok(*i as f64),
        other => Err(shape(what, "a number", other)),
    }
}

fn as_opt_int(value: Value, what: &str) -> Result<Option<i64>, WireError> {
    match value {
        Value::Nil => Ok(None),
        Value::Int(i) => i64::try_from(i).map(Some).map_err(|_| shape(what, "a 64-bit int", &Value::Int(i))),
        other => Err(shape(what, "an int or nil", &other)),
    }
}

fn as_opt_str(value: Value, what: &str) -> Result<Option<String>, WireError> {
    match value {
        Value::Nil => Ok(None),
        Value::Str(s) => Ok(Some(s)),
        other => Err(shape(what, "a string or nil", &other)),
    }
}

fn as_hash(value: Value, what: &str) -> Result<BlockHash, WireError> {
    match value {
        Value::Int(i) => Ok(BlockHash::Int(i)),
        Value::Bin(b) => Ok(BlockHash::Bytes(b)),
        other => Err(shape(what, "a block hash (int or bytes)", &other)),
    }
}

fn as_hashes(value: Value, what: &str) -> Result<Vec<BlockHash>, WireError> {
    match value {
        Value::Array(items) => items.into_iter().map(|v| as_hash(v, what)).collect(),
        other => Err(shape(what, "an array of block hashes", &other)),
    }
}

fn event_from_value(value: Value, index: usize) -> Result<KvEvent, WireError> {
    let what = format!("event {index}");
    let (tag, mut fields) = match value {
        Value::Array(mut items) if !items.is_empty() => {
            let tag = items.remove(0);
            (tag, Fields::Positional(items))
        }
        Value::Map(mut entries) => {
            let position = entries.iter().position(|(k, _)| matches!(k, Value::Str(key) if key == "type"));
            let Some(position) = position else {
                return Err(WireError::MissingField { what, field: "type" });
            };
            let (_, tag) = entries.remove(position);
            (tag, Fields::Named(entries))
        }
        other => return Err(shape(what, "a tagged array or a map with a \"type\" key", &other)),
    };
    let tag = match tag {
        Value::Str(tag) => tag,
        other => return Err(shape(format!("{what} tag"), "a string", &other)),
    };
    match tag.as_str() {
        "BlockStored" => {
            let block_hashes =
                as_hashes(fields.required(0, "block_hashes", &what)?, &format!("{what} block_hashes"))?;
            let parent_block_hash = match fields.required(1, "parent_block_hash", &what)? {
                Value::Nil => None,
                other => Some(as_hash(other, &format!("{what} parent_block_hash"))?),
            };
            let token_ids = match fields.required(2, "token_ids", &what)? {
                Value::Array(items) => items
                    .into_iter()
                    .map(|v| match v {
                        Value::Int(i) => u32::try_from(i).map_err(|_| {
                            shape(format!("{what} token_ids"), "a token id (u32)", &Value::Int(i))
                        }),
                        other => Err(shape(format!("{what} token_ids"), "a token id (u32)", &other)),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                other => return Err(shape(format!("{what} token_ids"), "an array", &other)),
            };
            let block_size = match fields.required(3, "block_size", &what)? {
                Value::Int(i) => u32::try_from(i)
                    .map_err(|_| shape(format!("{what} block_size"), "a u32", &Value::Int(i)))?,
                other => return Err(shape(format!("{what} block_size"), "an int", &other)),
            };
            let lora_id =
                as_opt_int(fields.take(4, "lora_id").unwrap_or(Value::Nil), &format!("{what} lora_id"))?;
            let medium =
                as_opt_str(fields.take(5, "medium").unwrap_or(Value::Nil), &format!("{what} medium"))?;
            Ok(KvEvent::BlockStored(BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_id,
                medium,
            }))
        }
        "BlockRemoved" => {
            let block_hashes =
                as_hashes(fields.required(0, "block_hashes", &what)?, &format!("{what} block_hashes"))?;
            let medium =
                as_opt_str(fields.take(1, "medium").unwrap_or(Value::Nil), &format!("{what} medium"))?;
            Ok(KvEvent::BlockRemoved(BlockRemoved { block_hashes, medium }))
        }
        "AllBlocksCleared" => Ok(KvEvent::AllBlocksCleared),
        _ => Err(WireError::UnknownEvent { index, tag }),
    }
}

fn batch_from_value(value: Value) -> Result<EventBatch, WireError> {
    let mut fields = match value {
        Value::Array(items) => Fields::Positional(items),
        Value::Map(entries) => Fields::Named(entries),
        other => return Err(shape("batch", "an array [ts, events, rank] or a map", &other)),
    };
    let ts = as_float(&fields.required(0, "ts", "batch")?, "batch ts")?;
    let events = match fields.required(1, "events", "batch")? {
        Value::Array(items) => {
            items.into_iter().enumerate().map(|(i, v)| event_from_value(v, i)).collect::<Result<_, _>>()?
        }
        other => return Err(shape("batch events", "an array", &other)),
    };
    let data_parallel_rank =
        as_opt_int(fields.take(2, "data_parallel_rank").unwrap_or(Value::Nil), "batch data_parallel_rank")?;
    Ok(EventBatch { ts, events, data_parallel_rank })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EventBatch {
        EventBatch {
            ts: 1_700_000_000.25,
            events: vec![
                KvEvent::BlockStored(BlockStored {
                    block_hashes: vec![BlockHash::from(u64::MAX), BlockHash::Int(-5)],
                    parent_block_hash: Some(BlockHash::Bytes(vec![1, 2, 3])),
                    token_ids: vec![1, 2, 3, 4],
                    block_size: 2,
                    lora_id: None,
                    medium: Some("GPU".into()),
                }),
                KvEvent::BlockRemoved(BlockRemoved { block_hashes: vec![BlockHash::from(7)], medium: None }),
                KvEvent::AllBlocksCleared,
            ],
            data_parallel_rank: Some(3),
        }
    }

    #[test]
    fn every_encoding_round_trips() {
        for encoding in Encoding::ALL {
            assert_eq!(encoding.name().parse::<Encoding>(), Ok(encoding));
            let bytes = encode_batch(&sample(), encoding);
            assert_eq!(decode_batch(&bytes).unwrap(), sample(), "{encoding:?}");
        }
    }

    #[test]
    fn array_encoding_is_positional_with_the_tag_first() {
        let batch =
            EventBatch { ts: 1.5, events: vec![KvEvent::AllBlocksCleared], data_parallel_rank: Some(0) };
        // fixarray(3), float64 1.5, fixarray(1) [fixarray(1) ["AllBlocksCleared"]], 0
        let mut expected = vec![0x93, 0xcb];
        expected.extend_from_slice(&1.5f64.to_be_bytes());
        expected.extend_from_slice(&[0x91, 0x91, 0xb0]);
        expected.extend_from_slice(b"AllBlocksCleared");
        expected.push(0x00);
        assert_eq!(encode_batch(&batch, Encoding::Array), expected);
    }

    #[test]
    fn vllm_encoding_is_an_array_batch_of_tagged_map_events() {
        assert_eq!(Encoding::default(), Encoding::Vllm);
        let batch =
            EventBatch { ts: 1.5, events: vec![KvEvent::AllBlocksCleared], data_parallel_rank: Some(0) };
        // fixarray(3), float64 1.5, fixarray(1) [fixmap(1) {"type": "AllBlocksCleared"}], 0
        let mut expected = vec![0x93, 0xcb];
        expected.extend_from_slice(&1.5f64.to_be_bytes());
        expected.extend_from_slice(&[0x91, 0x81, 0xa4]);
        expected.extend_from_slice(b"type");
        expected.push(0xb0);
        expected.extend_from_slice(b"AllBlocksCleared");
        expected.push(0x00);
        assert_eq!(encode_batch(&batch, Encoding::Vllm), expected);
        assert!("json".parse::<Encoding>().unwrap_err().contains("`vllm`, `array` or `map`"));
    }

    #[test]
    fn map_encoding_tags_with_type() {
        let batch = EventBatch { ts: 0.0, events: vec![KvEvent::AllBlocksCleared], data_parallel_rank: None };
        let bytes = encode_batch(&batch, Encoding::Map);
        assert_eq!(bytes[0], 0x82, "ts and events only: rank None is omitted");
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("type") && text.contains("AllBlocksCleared"));
    }

    #[test]
    fn short_and_long_array_events_are_accepted() {
        // An older vLLM without `medium`, and a newer one with an extra trailing field.
        let short = Value::Array(vec![
            Value::Float(1.0),
            Value::Array(vec![Value::Array(vec![
                Value::Str("BlockStored".into()),
                Value::Array(vec![Value::Int(9)]),
                Value::Nil,
                Value::Array(vec![Value::Int(1)]),
                Value::Int(1),
            ])]),
        ]);
        let batch = decode_batch(&rmp_serde::to_vec(&short).unwrap()).unwrap();
        assert_eq!(batch.data_parallel_rank, None);
        let KvEvent::BlockStored(stored) = &batch.events[0] else { panic!("not stored") };
        assert_eq!(stored.medium, None);
        let long = Value::Array(vec![
            Value::Float(1.0),
            Value::Array(vec![Value::Array(vec![
                Value::Str("BlockRemoved".into()),
                Value::Array(vec![Value::Int(9)]),
                Value::Str("GPU".into()),
                Value::Int(0),
            ])]),
            Value::Int(1),
        ]);
        let batch = decode_batch(&rmp_serde::to_vec(&long).unwrap()).unwrap();
        assert_eq!(
            batch.events[0],
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![BlockHash::Int(9)],
                medium: Some("GPU".into())
            })
        );
    }

    #[test]
    fn bad_payloads_say_what_is_wrong() {
        assert!(matches!(decode_batch(b"\xc1"), Err(WireError::Msgpack(_))));
        let not_batch = rmp_serde::to_vec(&Value::Int(3)).unwrap();
        assert!(decode_batch(&not_batch).unwrap_err().to_string().contains("batch"));
        let unknown = Value::Array(vec![
            Value::Float(1.0),
            Value::Array(vec![Value::Array(vec![Value::Str("Nope".into())])]),
        ]);
        assert_eq!(
            decode_batch(&rmp_serde::to_vec(&unknown).unwrap()).unwrap_err(),
            WireError::UnknownEvent { index: 0, tag: "Nope".into() }
        );
        let missing = Value::Map(vec![(Value::Str("ts".into()), Value::Float(1.0))]);
        let err = decode_batch(&rmp_serde::to_vec(&missing).unwrap()).unwrap_err();
        assert_eq!(err, WireError::MissingField { what: "batch".into(), field: "events" });
        // Truncated input never panics.
        let bytes = encode_batch(&sample(), Encoding::Map);
        for cut in 0..bytes.len() {
            let _ = decode_batch(&bytes[..cut]);
        }
    }

    #[test]
    fn sequence_numbers_are_8_bytes_big_endian() {
        assert_eq!(encode_seq(258), [0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(decode_seq(&[0, 0, 0, 0, 0, 0, 1, 2]).unwrap(), 258);
        assert_eq!(decode_seq(&[1, 2]), Err(WireError::SeqLength(2)));
        let frames = publish_frames(b"kv", 5, &encode_batch(&sample(), Encoding::Array));
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let published = decode_published(&refs).unwrap();
        assert_eq!((published.topic.as_slice(), published.seq), (b"kv".as_slice(), 5));
        assert!(decode_published(&refs[..2]).is_err());
    }

    #[test]
    fn replay_framing() {
        let request = replay::parse_request(&[b"id", b"", &replay::request_frame(42)]).unwrap();
        assert_eq!(request, replay::Request { identity: b"id".to_vec(), start_seq: 42 });
        assert!(replay::parse_request(&[b"id", b"x", b"y", b"z"]).is_err());
        let frames = replay::batch_frames(b"id", 43, b"payload");
        let refs: Vec<&[u8]> = frames[2..].iter().map(Vec::as_slice).collect();
        assert_eq!(
            replay::parse_reply(&refs).unwrap(),
            replay::Reply::Batch { seq: 43, payload: b"payload".to_vec() }
        );
        let end = replay::end_frames(b"id");
        let refs: Vec<&[u8]> = end[1..].iter().map(Vec::as_slice).collect();
        assert_eq!(replay::parse_reply(&refs).unwrap(), replay::Reply::End);
    }

    #[test]
    fn hashes_fold_to_u64() {
        assert_eq!(BlockHash::from(42).as_u64(), 42);
        assert_eq!(BlockHash::Int(-1).as_u64(), u64::MAX);
        assert_eq!(BlockHash::Bytes(vec![0, 0, 0, 0, 0, 0, 0, 1, 9, 9]).as_u64(), 1);
        assert_eq!(BlockHash::Bytes(vec![1]).as_u64(), 1);
    }
}
