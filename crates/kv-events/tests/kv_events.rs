//! Cross-checks the wire format against an independent msgpack implementation (Python's
//! `msgpack` package, run as a subprocess): payloads written the way vLLM's msgspec writes
//! them decode here, and ours decode there; batches recorded from a real vLLM 0.32 server
//! (`tests/fixtures/vllm-0.32/`) decode, and the default encoding has their shape.

use std::io::Write;
use std::process::{Command, Stdio};

use fleet_kv_events::{
    BlockHash, BlockRemoved, BlockStored, Encoding, EventBatch, KvEvent, decode_batch, encode_batch,
};

fn python(script: &str, stdin: &[u8]) -> Vec<u8> {
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be installed (CI installs it with the msgpack package)");
    child.stdin.take().expect("stdin").write_all(stdin).expect("write stdin");
    let output = child.wait_with_output().expect("python3 output");
    assert!(output.status.success(), "python failed: {}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

/// What vLLM's current (map) and older (array_like) msgspec encoders produce for the same batch.
const VLLM_LIKE: &str = r#"
import sys, msgpack
digest = bytes(range(32))
stored_map = {"type": "BlockStored", "block_hashes": [digest, 2**64 - 1], "parent_block_hash": None,
              "token_ids": [1, 2, 3, 4], "block_size": 2, "lora_id": None, "medium": "GPU",
              "lora_name": None, "group_idx": 0}
removed_map = {"type": "BlockRemoved", "block_hashes": [-17], "medium": "GPU"}
cleared_map = {"type": "AllBlocksCleared"}
m = msgpack.packb({"ts": 12.5, "events": [stored_map, removed_map, cleared_map], "data_parallel_rank": 1}, use_bin_type=True)
stored_arr = ["BlockStored", [digest, 2**64 - 1], None, [1, 2, 3, 4], 2, None, "GPU"]
a = msgpack.packb([12.5, [stored_arr, ["BlockRemoved", [-17], "GPU"], ["AllBlocksCleared"]], 1], use_bin_type=True)
sys.stdout.buffer.write(len(m).to_bytes(4, "big") + m + a)
"#;

fn expected() -> EventBatch {
    EventBatch {
        ts: 12.5,
        events: vec![
            KvEvent::BlockStored(BlockStored {
                block_hashes: vec![BlockHash::Bytes((0..32).collect()), BlockHash::from(u64::MAX)],
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
                lora_id: None,
                medium: Some("GPU".into()),
            }),
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![BlockHash::Int(-17)],
                medium: Some("GPU".into()),
            }),
            KvEvent::AllBlocksCleared,
        ],
        data_parallel_rank: Some(1),
    }
}

#[test]
fn decodes_payloads_written_by_python_msgpack_in_both_encodings() {
    let out = python(VLLM_LIKE, b"");
    let map_len = u32::from_be_bytes(out[..4].try_into().unwrap()) as usize;
    let (map, array) = out[4..].split_at(map_len);
    assert_eq!(decode_batch(map).unwrap(), expected());
    assert_eq!(decode_batch(array).unwrap(), expected());
}

#[test]
fn python_msgpack_reads_what_we_write() {
    const READ: &str = r#"
import sys, msgpack, json
data = sys.stdin.buffer.read()
n = int.from_bytes(data[:4], "big")
def show(obj):
    if isinstance(obj, bytes): return "hex:" + obj.hex()
    if isinstance(obj, list): return [show(x) for x in obj]
    if isinstance(obj, dict): return {k: show(v) for k, v in obj.items()}
    return obj
print(json.dumps([show(msgpack.unpackb(data[4:4+n], raw=False)), show(msgpack.unpackb(data[4+n:], raw=False))]))
"#;
    let map = encode_batch(&expected(), Encoding::Map);
    let array = encode_batch(&expected(), Encoding::Array);
    let mut input = (map.len() as u32).to_be_bytes().to_vec();
    input.extend_from_slice(&map);
    input.extend_from_slice(&array);
    let text = String::from_utf8(python(READ, &input)).unwrap();
    let seen: serde_json::Value = serde_json::from_str(&text).unwrap();
    let digest: String = (0..32u8).map(|b| format!("{b:02x}")).collect();
    assert_eq!(seen[0]["ts"], 12.5);
    assert_eq!(seen[0]["data_parallel_rank"], 1);
    assert_eq!(seen[0]["events"][0]["type"], "BlockStored");
    assert_eq!(seen[0]["events"][0]["block_hashes"][0], format!("hex:{digest}"));
    assert_eq!(seen[0]["events"][0]["block_hashes"][1], u64::MAX);
    assert_eq!(seen[0]["events"][1]["block_hashes"][0], -17);
    assert_eq!(seen[0]["events"][2], serde_json::json!({"type": "AllBlocksCleared"}));
    assert_eq!(
        seen[1],
        serde_json::json!([
            12.5,
            [
                ["BlockStored", [format!("hex:{digest}"), u64::MAX], null, [1, 2, 3, 4], 2, null, "GPU"],
                ["BlockRemoved", [-17], "GPU"],
                ["AllBlocksCleared"]
            ],
            1
        ])
    );
}

/// The payloads recorded from a real vLLM 0.32 server (`tests/fixtures/vllm-0.32/README.md`).
fn recorded_vllm_batches() -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm-0.32");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|x| x == "msgpack"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| (path.display().to_string(), std::fs::read(&path).expect("fixture readable")))
        .collect()
}

#[test]
fn decodes_batches_recorded_from_vllm_0_32() {
    let batches = recorded_vllm_batches();
    assert_eq!(batches.len(), 7);
    let mut stored = std::collections::HashSet::new();
    let mut above_i64 = 0;
    for (name, payload) in &batches {
        let batch = decode_batch(payload).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(batch.data_parallel_rank, Some(0), "{name}");
        assert!(batch.ts > 1.7e9, "{name}: a Unix time");
        for event in &batch.events {
            let KvEvent::BlockStored(event) = event else { panic!("{name}: only stores were recorded") };
            assert_eq!((event.block_size, event.medium.as_deref()), (32, Some("GPU")), "{name}");
            assert_eq!(event.token_ids.len(), 32 * event.block_hashes.len(), "{name}: 32 tokens a block");
            for hash in &event.block_hashes {
                let BlockHash::Int(value) = hash else { panic!("{name}: hashes are ints, got {hash:?}") };
                assert!((0..=i128::from(u64::MAX)).contains(value), "{name}: a 64-bit unsigned int");
                above_i64 += usize::from(*value > i128::from(i64::MAX));
            }
            // A chain: every parent is a block stored before (or none, for a prompt's first block).
            if let Some(parent) = &event.parent_block_hash {
                assert!(stored.contains(&parent.as_u64()), "{name}: parent {parent:?} stored before");
            }
            stored.extend(event.block_hashes.iter().map(BlockHash::as_u64));
        }
    }
    assert!(above_i64 > 0, "vLLM's hashes use the whole u64 range, beyond i64");
}

#[test]
fn the_default_encoding_has_the_shape_vllm_0_32_sends() {
    // The shape of a payload: the batch's kind and length, each event's kind and its keys in order.
    const SHAPE: &str = r#"
import sys, msgpack, json
data = sys.stdin.buffer.read()
out = []
while data:
    n = int.from_bytes(data[:4], "big")
    batch = msgpack.unpackb(data[4:4 + n], raw=False)
    data = data[4 + n:]
    events = [list(e.keys()) if isinstance(e, dict) else ["array"] for e in batch[1]] if isinstance(batch, list) else None
    out.append({"batch": type(batch).__name__, "len": len(batch), "events": events,
                "hash_kinds": sorted({type(h).__name__ for e in (batch[1] if isinstance(batch, list) else [])
                                      if isinstance(e, dict) for h in e.get("block_hashes", [])})})
print(json.dumps(out))
"#;
    let mut input = Vec::new();
    for (_, payload) in recorded_vllm_batches() {
        let ours = encode_batch(&decode_batch(&payload).expect("decodes"), Encoding::default());
        for bytes in [payload, ours] {
            input.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
            input.extend_from_slice(&bytes);
        }
    }
    let shapes: Vec<serde_json::Value> = serde_json::from_slice(&python(SHAPE, &input)).expect("json");
    for pair in shapes.chunks(2) {
        let (vllm, ours) = (&pair[0], &pair[1]);
        assert_eq!((&vllm["batch"], &vllm["len"]), (&"list".into(), &3.into()), "{vllm}");
        assert_eq!((&ours["batch"], &ours["len"]), (&vllm["batch"], &vllm["len"]), "{ours} vs {vllm}");
        assert_eq!(ours["hash_kinds"], serde_json::json!(["int"]));
        assert_eq!(ours["hash_kinds"], vllm["hash_kinds"]);
        let vllm_events = vllm["events"].as_array().expect("events");
        let our_events = ours["events"].as_array().expect("events");
        assert_eq!(our_events.len(), vllm_events.len());
        for (theirs, ours) in vllm_events.iter().zip(our_events) {
            // Our keys are vLLM's, in vLLM's order, "type" first; vLLM has a few more we do not write.
            let theirs: Vec<&str> = theirs.as_array().unwrap().iter().filter_map(|k| k.as_str()).collect();
            let ours: Vec<&str> = ours.as_array().unwrap().iter().filter_map(|k| k.as_str()).collect();
            assert_eq!(ours.first(), Some(&"type"));
            let mut rest = theirs.iter();
            assert!(ours.iter().all(|key| rest.any(|k| k == key)), "{ours:?} in the order of {theirs:?}");
        }
    }
}
