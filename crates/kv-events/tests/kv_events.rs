//! Cross-checks the wire format against an independent msgpack implementation (Python's
//! `msgpack` package, run as a subprocess): payloads written the way vLLM's msgspec writes
//! them decode here, and ours decode there.

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
