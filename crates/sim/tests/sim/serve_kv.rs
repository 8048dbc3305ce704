//! KV-cache events over real ZMQ, decoded by an independent decoder: a Python subscriber
//! (pyzmq SUB + msgpack) reads the live stream in each encoding, then asks the replay socket
//! (a DEALER speaking vLLM's replay protocol) for everything from seq 0, including the batch it
//! missed before it connected.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fleet_kv_events::Encoding;
use fleet_sim::ReplicaConfig;
use fleet_sim::engine::tokenize;
use fleet_sim::kv_publish::KvEventsConfig;
use fleet_test_support::process::ChildProcess;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;

use super::serve::{client, complete, prompt, start_fleet};

const SUBSCRIBER: &str = r#"
import sys, json, time, zmq, msgpack
pub_endpoint, replay_endpoint, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.connect(pub_endpoint)
print(json.dumps({"subscribed": True}), flush=True)

def event(e):
    if isinstance(e, list):
        tag, fields = e[0], e[1:]
        names = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"],
                 "BlockRemoved": ["block_hashes", "medium"], "AllBlocksCleared": []}[tag]
        e = dict(zip(names, fields), type=tag)
    out = {"type": e["type"]}
    if "block_hashes" in e:
        out["block_hashes"] = e["block_hashes"]
        out["medium"] = e.get("medium")
    if e["type"] == "BlockStored":
        out.update(parent=e["parent_block_hash"], n_tokens=len(e["token_ids"]), block_size=e["block_size"])
    return out

def decode(payload):
    batch = msgpack.unpackb(payload, raw=False)
    if isinstance(batch, list):
        maps = all(isinstance(e, dict) for e in batch[1])
        arrays = all(isinstance(e, list) for e in batch[1])
        encoding = "vllm" if maps else "array" if arrays else "mixed"
        return {"encoding": encoding, "ts": batch[0], "rank": batch[2] if len(batch) > 2 else None,
                "events": [event(e) for e in batch[1]]}
    return {"encoding": "map", "ts": batch["ts"], "rank": batch.get("data_parallel_rank"),
            "events": [event(e) for e in batch["events"]]}

deadline = time.time() + timeout
cleared = False
while not cleared and time.time() < deadline:
    if sub.poll(100):
        topic, seq, payload = sub.recv_multipart()
        record = decode(payload)
        record.update(seq=int.from_bytes(seq, "big"), topic=topic.decode(), source="live")
        cleared = any(e["type"] == "AllBlocksCleared" for e in record["events"])
        print(json.dumps(record), flush=True)

dealer = ctx.socket(zmq.DEALER)
dealer.connect(replay_endpoint)
dealer.send_multipart([b"", (0).to_bytes(8, "big")])
while True:
    if not dealer.poll(int(timeout * 1000)):
        print(json.dumps({"replay_timeout": True}), flush=True)
        break
    frames = dealer.recv_multipart()
    assert frames[0] == b"", frames
    seq = int.from_bytes(frames[1], "big", signed=True)
    if seq == -1:
        assert frames[2] == b""
        print(json.dumps({"replay_end": True}), flush=True)
        break
    record = decode(frames[2])
    record.update(seq=seq, source="replay")
    print(json.dumps(record), flush=True)
"#;

async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>, within: Duration) -> Result<Option<Value>> {
    match tokio::time::timeout(within, lines.next_line()).await {
        Err(_) => Ok(None),
        Ok(line) => {
            let line = line?.context("the subscriber exited early")?;
            Ok(Some(serde_json::from_str(&line).with_context(|| format!("subscriber printed {line:?}"))?))
        }
    }
}

fn hashes(value: &Value) -> Vec<u64> {
    value.as_array().map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default()
}

#[tokio::test]
async fn kv_events_reach_a_python_subscriber_in_every_encoding_and_replay_returns_missed_ones() -> Result<()>
{
    for encoding in Encoding::ALL {
        let mut config = ReplicaConfig::default();
        config.engine.num_gpu_blocks = 48;
        let kv = KvEventsConfig {
            encoding,
            ..KvEventsConfig::new("tcp://127.0.0.1:0".parse().map_err(anyhow::Error::msg)?)
        };
        let fleet = start_fleet(1, config, Some(kv)).await?;
        let endpoints = fleet.fleet.kv_endpoints[0].clone();
        let url = fleet.url(0).to_string();

        // Published before anyone listens: only the replay socket can give it back.
        complete(&url, &prompt("missed", 3), 2).await?;

        let mut process = ChildProcess::spawn(
            tokio::process::Command::new("python3")
                .args(["-c", SUBSCRIBER, &endpoints.publish, &endpoints.replay, "20"])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit()),
        )?;
        let mut lines = BufReader::new(process.child.stdout.take().context("stdout")?).lines();
        let first = next_line(&mut lines, Duration::from_secs(20)).await?.context("no subscribed line")?;
        ensure!(first["subscribed"] == true, "{first}");

        // ZMQ subscriptions propagate asynchronously: send small requests until one is seen.
        let mut records = Vec::new();
        for i in 0.. {
            ensure!(i < 100, "the subscriber never received a live event");
            complete(&url, &prompt(&format!("warm{i}"), 2), 2).await?;
            if let Some(record) = next_line(&mut lines, Duration::from_millis(300)).await? {
                records.push(record);
                break;
            }
        }
        let alpha = prompt("alpha", 30);
        let beta = prompt("beta", 30);
        complete(&url, &alpha, 4).await?;
        complete(&url, &beta, 4).await?; // does not fit beside alpha's blocks: evicts them
        let reset = client().post(format!("{url}/reset_prefix_cache")).send().await?;
        ensure!(reset.status().is_success(), "reset_prefix_cache: {}", reset.status());

        loop {
            let record =
                next_line(&mut lines, Duration::from_secs(20)).await?.context("subscriber went quiet")?;
            if record.get("replay_end").is_some() {
                break;
            }
            if record.get("replay_timeout").is_some() {
                bail!("the replay socket did not answer");
            }
            records.push(record);
        }

        let live: Vec<&Value> = records.iter().filter(|r| r["source"] == "live").collect();
        let replay: Vec<&Value> = records.iter().filter(|r| r["source"] == "replay").collect();
        let name = encoding.name();
        ensure!(
            live.iter().chain(&replay).all(|r| r["encoding"] == name && r["rank"] == 0),
            "{name}: {records:?}"
        );
        let live_seqs: Vec<u64> = live.iter().filter_map(|r| r["seq"].as_u64()).collect();
        assert!(
            live_seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "{name}: live seqs are consecutive: {live_seqs:?}"
        );
        assert!(live_seqs[0] > 0, "{name}: the first batch was published before the subscriber connected");
        let replay_seqs: Vec<u64> = replay.iter().filter_map(|r| r["seq"].as_u64()).collect();
        assert_eq!(
            replay_seqs,
            (0..=*live_seqs.last().unwrap_or(&0)).collect::<Vec<_>>(),
            "{name}: replay from 0"
        );
        for (live_record, replayed) in live.iter().zip(replay.iter().skip(live_seqs[0] as usize)) {
            assert_eq!(live_record["events"], replayed["events"], "{name}: replay returns the same batches");
        }

        let events: Vec<&Value> =
            live.iter().flat_map(|r| r["events"].as_array().into_iter().flatten()).collect();
        let mut stored = HashSet::new();
        for event in events.iter().filter(|e| e["type"] == "BlockStored") {
            let blocks = hashes(&event["block_hashes"]);
            assert_eq!(event["block_size"], 16);
            assert_eq!(
                event["n_tokens"].as_u64(),
                Some(16 * blocks.len() as u64),
                "{name}: token ids per block"
            );
            assert_eq!(event["medium"], "GPU");
            stored.extend(blocks);
        }
        for text in [&alpha, &beta] {
            let expected = tokenize::prompt_of_text(text, 16).block_hashes;
            assert_eq!(expected.len(), 30);
            assert!(
                expected.iter().all(|h| stored.contains(h)),
                "{name}: every full prompt block is announced"
            );
        }
        let alpha_hashes: HashSet<u64> =
            tokenize::prompt_of_text(&alpha, 16).block_hashes.into_iter().collect();
        let removed: Vec<u64> = events
            .iter()
            .filter(|e| e["type"] == "BlockRemoved")
            .flat_map(|e| hashes(&e["block_hashes"]))
            .collect();
        assert!(
            removed.iter().any(|h| alpha_hashes.contains(h)),
            "{name}: beta evicted some of alpha's blocks"
        );
        assert!(removed.iter().all(|h| stored.contains(h) || !alpha_hashes.contains(h)));
        assert_eq!(events.last().map(|e| &e["type"]), Some(&Value::from("AllBlocksCleared")), "{name}");
        drop(process);
    }
    Ok(())
}
