//! `cargo xtask bench real`: fleet-router's policies over three real llama.cpp servers (the engine and
//! model of `cargo xtask engines llamacpp`) on one prefix-sharing trace, and the emulator's what-if of
//! the recorded traffic against what the real servers then measured.
//!
//! The trace (written here, Mooncake JSON Lines with 64-token blocks): `GROUPS` groups of requests share a
//! `SHARED_BLOCKS`-block prefix (a tenant's system prompt), each request adds one block of its own and
//! asks for `OUTPUT_TOKENS` tokens; arrivals are evenly spaced, the groups in a scrambled order. For every policy
//! the three servers start cold, fleet-router starts over them with `--record`, and `fleet-sim bench`
//! replays the trace through it (streamed chat completions, client-side TTFT). Per row: TTFT p50/p95, the
//! prefix hit rate llama.cpp counted (`prompt_tokens_cached_total` over cached + computed, through
//! fleetdeck's telemetry) and the prompt tokens it actually computed (`llamacpp:prompt_tokens_total`,
//! summed over the servers).
//!
//! kv_precise is not run: llama.cpp publishes no KV-cache events (no ZMQ publisher, no event endpoint in
//! b11434's server; its `/slots` shows only each slot's current prompt), so the router would have no
//! index to be precise with.
//!
//! Calibration: the first row's recorded traffic (round_robin) is replayed by `fleet-sim replay` under
//! cache_aware_approx with the fitted profile (`crates/sim/profiles/llamacpp-cpu-tiny-llama.yaml`), and
//! the prediction is printed beside what the real servers measured under cache_aware_approx.
//! Not part of CI: it is a benchmark. Uses the debug binaries of `cargo build --workspace --bins`.

use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::engines::{LlamaCpp, ensure_llamacpp};
use crate::procs::Guard;
use crate::{Result, cargo, root, run, target_dir};

const REPLICAS: usize = 3;
const SLOTS: u32 = 2;
const CTX: u32 = 8192;
const BLOCK_TOKENS: u32 = 64;
const GROUPS: u64 = 20;
const SHARED_BLOCKS: u64 = 12;
const OUTPUT_TOKENS: u32 = 8;
const POLICIES: [&str; 3] = ["round_robin", "consistent_hash", "cache_aware_approx"];
const MODEL: &str = "tiny-llama";

/// The trace's shape: `FLEET_REAL_WORKLOAD`, `even` (the default) or `hot`.
/// - `even`: every group alike, 90 requests one every 500 ms (light load: placement decides hits, not
///   queueing).
/// - `hot`: one tenant's group takes half the requests, 300 of them one every 100 ms, so a router that pins
///   the hot prefix to one server queues it there (issue 35's skew, on real engines).
///
/// `FLEET_REAL_REQUESTS`, `FLEET_REAL_GAP_MS` and `FLEET_REAL_HOT_SHARE` (above 0, at most 1) change either
/// preset; for no hot group use `even`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Workload {
    pub(crate) name: &'static str,
    pub(crate) requests: u64,
    pub(crate) gap_ms: u64,
    /// Share of the requests that go to group 0.
    pub(crate) hot_share: f64,
}

impl Workload {
    pub(crate) fn from_env() -> Result<Workload> {
        let preset = match std::env::var("FLEET_REAL_WORKLOAD").as_deref().map(str::trim) {
            Err(_) | Ok("" | "even") => Workload { name: "even", requests: 90, gap_ms: 500, hot_share: 0.0 },
            Ok("hot") => Workload { name: "hot", requests: 300, gap_ms: 100, hot_share: 0.5 },
            Ok(other) => {
                return Err(format!("FLEET_REAL_WORKLOAD={other:?} is not a workload here; use even or hot"));
            }
        };
        use crate::procs::env_positive;
        Ok(Workload {
            requests: env_positive("FLEET_REAL_REQUESTS", preset.requests),
            gap_ms: env_positive("FLEET_REAL_GAP_MS", preset.gap_ms),
            hot_share: env_positive("FLEET_REAL_HOT_SHARE", preset.hot_share).min(1.0),
            ..preset
        })
    }

    /// One line for the table's header.
    pub(crate) fn describe(&self) -> String {
        let hot = if self.hot_share > 0.0 {
            format!(", {:.0} % of them one hot group's", self.hot_share * 100.0)
        } else {
            String::new()
        };
        format!("workload {}: {} requests, one every {} ms{hot}", self.name, self.requests, self.gap_ms)
    }
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Row {
    pub(crate) ttft_p50_ms: Option<f64>,
    pub(crate) ttft_p95_ms: Option<f64>,
    pub(crate) hit_rate: Option<f64>,
    pub(crate) computed: f64,
    pub(crate) cached: f64,
    pub(crate) prompt_seconds: f64,
    pub(crate) decode_tokens: f64,
    pub(crate) decode_seconds: f64,
    pub(crate) completed: f64,
    pub(crate) errors: f64,
}

pub fn run_real() -> Result<()> {
    let engine = ensure_llamacpp()?;
    run(cargo(), &["build", "--workspace", "--bins"], &[])?;
    let bin = target_dir().join("debug");
    let dir = std::env::temp_dir().join(format!("fleet-real-bench-{}", std::process::id()));
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let trace = dir.join("trace.jsonl");
    let workload = Workload::from_env()?;
    write_trace(&trace, &workload)?;
    let started = Instant::now();
    let mut rows = Vec::new();
    for policy in POLICIES {
        println!("\n== fleet-router {policy} ({:.0} s so far)", started.elapsed().as_secs_f64());
        let servers = start_servers(&engine, &dir)?;
        let urls: Vec<String> = servers.iter().map(|(_, url)| url.clone()).collect();
        let record = dir.join(format!("{policy}.recorded.jsonl"));
        let router = start_router(&bin, &dir, policy, &urls, &record)?;
        let mut row = bench_once(&bin, &router.1, &trace, &urls, MODEL)?;
        for url in &urls {
            let text = curl(&format!("{url}/metrics"))?;
            row.computed += metric(&text, "llamacpp:prompt_tokens_total");
            row.cached += metric(&text, "llamacpp:prompt_tokens_cached_total");
            row.prompt_seconds += metric(&text, "llamacpp:prompt_seconds_total");
            row.decode_tokens += metric(&text, "llamacpp:tokens_predicted_total");
            row.decode_seconds += metric(&text, "llamacpp:tokens_predicted_seconds_total");
        }
        drop(router);
        drop(servers);
        rows.push((policy, row));
    }
    println!(
        "\n{REPLICAS} llama-server b11434 replicas ({SLOTS} slots, ctx {CTX}, 1 thread each, model {}), cold per row; \
         trace: {GROUPS} groups sharing {} tokens + {BLOCK_TOKENS} own, {OUTPUT_TOKENS} output tokens; {}",
        engine.model.file_name().unwrap_or_default().to_string_lossy(),
        SHARED_BLOCKS * u64::from(BLOCK_TOKENS),
        workload.describe()
    );
    println!(
        "{:<20} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>7} {:>8} {:>10}",
        "policy",
        "TTFT p50",
        "TTFT p95",
        "hit rate",
        "computed",
        "cached",
        "completed",
        "errors",
        "prefill",
        "decode"
    );
    for (policy, r) in &rows {
        println!(
            "{:<20} {:>7.0}ms {:>7.0}ms {:>9} {:>10.0} {:>9.0} {:>9.0} {:>7.0} {:>6.1}us {:>8.2}ms",
            policy,
            r.ttft_p50_ms.unwrap_or(f64::NAN),
            r.ttft_p95_ms.unwrap_or(f64::NAN),
            r.hit_rate.map_or("-".to_owned(), |h| format!("{:.1}%", h * 100.0)),
            r.computed,
            r.cached,
            r.completed,
            r.errors,
            r.prompt_seconds * 1e6 / r.computed.max(1.0),
            r.decode_seconds * 1e3 / r.decode_tokens.max(1.0),
        );
    }
    println!(
        "(prefill: llama.cpp's prompt seconds per computed token; decode: its seconds per generated token)"
    );

    // What-if of round_robin's recorded traffic under cache_aware_approx, against the measured row.
    let profile = root().join("crates/sim/profiles/llamacpp-cpu-tiny-llama.yaml");
    let recorded = dir.join("round_robin.recorded.jsonl");
    let measured = rows.iter().find(|(p, _)| *p == "cache_aware_approx").map(|(_, r)| r.clone());
    if let (true, Some(measured)) = (profile.exists(), measured) {
        let output = Command::new(bin.join("fleet-sim"))
            .args(["replay", "--trace", &recorded.to_string_lossy(), "--replicas", &REPLICAS.to_string()])
            .args(["--profile", &profile.to_string_lossy(), "--policy", "cache_aware_approx", "--json"])
            .output()
            .map_err(|e| format!("cannot run fleet-sim replay: {e}"))?;
        let text = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!("fleet-sim replay failed: {}", String::from_utf8_lossy(&output.stderr)));
        }
        println!("\nwhat-if (fleet-sim replay of round_robin's recording, cache_aware_approx):\n{text}");
        println!(
            "measured cache_aware_approx: hit rate {:.1}%, TTFT p95 {:.0} ms",
            measured.hit_rate.unwrap_or(f64::NAN) * 100.0,
            measured.ttft_p95_ms.unwrap_or(f64::NAN)
        );
    }
    println!("\nwhole run: {:.0} s; files in {}", started.elapsed().as_secs_f64(), dir.display());
    Ok(())
}

/// The prefix-sharing trace (see the module docs).
pub(crate) fn write_trace(path: &Path, workload: &Workload) -> Result<()> {
    let mut lines = String::new();
    let hot_per_mille = (workload.hot_share * 1000.0).round() as u64;
    for i in 0..workload.requests {
        // A scrambled group order: with `i % GROUPS` and GROUPS a multiple of the replicas, round-robin would
        // send every group to one replica by accident and look cache-aware (seen in the first run).
        // The hot group's requests are drawn from other bits of the same number, so they are spread evenly too.
        let scrambled = i.wrapping_mul(2_654_435_761) >> 7;
        let group = if (scrambled >> 8) % 1000 < hot_per_mille { 0 } else { scrambled % GROUPS };
        let mut hash_ids: Vec<u64> = (0..SHARED_BLOCKS).map(|b| group * 1000 + b).collect();
        hash_ids.push(1_000_000 + i);
        let input = (SHARED_BLOCKS + 1) * u64::from(BLOCK_TOKENS);
        lines.push_str(&format!(
            "{{\"timestamp\": {}, \"input_length\": {input}, \"output_length\": {OUTPUT_TOKENS}, \"hash_ids\": {hash_ids:?}, \"block_tokens\": {BLOCK_TOKENS}}}\n",
            i * workload.gap_ms
        ));
    }
    fs::write(path, lines).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Starts the servers on free ports (`--port 0`: each logs the port it bound) and waits for `/health`.
fn start_servers(engine: &LlamaCpp, dir: &Path) -> Result<Vec<(Guard, String)>> {
    let mut servers = Vec::new();
    for i in 0..REPLICAS {
        let log_path = dir.join(format!("llama-server-{i}.log"));
        let mut child = Command::new(&engine.server)
            .arg("--model")
            .arg(&engine.model)
            .args([
                "--alias",
                MODEL,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--metrics",
                "--slots",
                "--no-webui",
            ])
            .args(["--parallel", &SLOTS.to_string(), "--ctx-size", &CTX.to_string(), "--threads", "1"])
            .args(["--chat-template", "chatml"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", engine.server.display()))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let guard = Guard(child);
        let mut log = File::create(&log_path).map_err(|e| e.to_string())?;
        let mut lines = BufReader::new(stderr).lines();
        let mut url = None;
        for line in lines.by_ref() {
            let line = line.map_err(|e| e.to_string())?;
            use std::io::Write;
            let _ = writeln!(log, "{line}");
            if let Some((_, address)) = line.split_once("listening on ") {
                url = Some(address.trim().trim_end_matches('/').to_owned());
                break;
            }
        }
        let url =
            url.ok_or_else(|| format!("llama-server exited before listening; see {}", log_path.display()))?;
        std::thread::spawn(move || {
            use std::io::Write;
            for line in lines.map_while(std::result::Result::ok) {
                let _ = writeln!(log, "{line}");
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while !curl(&format!("{url}/health")).is_ok_and(|t| t.contains("ok")) {
            if Instant::now() > deadline {
                return Err(format!("{url} did not become healthy within 60 s"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        servers.push((guard, url));
    }
    Ok(servers)
}

fn start_router(
    bin: &Path,
    dir: &Path,
    policy: &str,
    urls: &[String],
    record: &Path,
) -> Result<(Guard, String)> {
    let port = crate::procs::free_port()?;
    let spec = dir.join(format!("{policy}.json"));
    fs::write(&spec, format!(r#"{{"policy": "{policy}"}}"#)).map_err(|e| e.to_string())?;
    let mut args = vec![
        "--listen".to_owned(),
        format!("127.0.0.1:{port}"),
        "--policy-file".to_owned(),
        spec.to_string_lossy().into_owned(),
        "--record".to_owned(),
        record.to_string_lossy().into_owned(),
    ];
    for url in urls {
        args.push("--replica".to_owned());
        args.push(url.clone());
    }
    let log = File::create(dir.join(format!("router-{policy}.log"))).map_err(|e| e.to_string())?;
    let child = Command::new(bin.join("fleet-router"))
        .args(&args)
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start fleet-router: {e}"))?;
    let guard = Guard(child);
    crate::procs::wait_for_port(port, Duration::from_secs(60))?;
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !curl(&format!("{url}/v1/models")).is_ok_and(|t| t.contains(MODEL)) {
        if Instant::now() > deadline {
            return Err("fleet-router did not list the model within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok((guard, url))
}

pub(crate) fn bench_once(
    bin: &Path,
    url: &str,
    trace: &Path,
    replicas: &[String],
    model: &str,
) -> Result<Row> {
    let mut args = vec![
        "bench".to_owned(),
        "--target".to_owned(),
        url.to_owned(),
        "--trace".to_owned(),
        trace.to_string_lossy().into_owned(),
        "--model".to_owned(),
        model.to_owned(),
        "--request-timeout-s".to_owned(),
        "120".to_owned(),
        "--json".to_owned(),
    ];
    for replica in replicas {
        args.push("--metrics".to_owned());
        args.push(replica.clone());
    }
    let output = Command::new(bin.join("fleet-sim"))
        .args(&args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run fleet-sim bench: {e}"))?;
    if !output.status.success() {
        return Err(format!("fleet-sim bench against {url} failed"));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let number = |key: &str| json_number(&text, key);
    Ok(Row {
        ttft_p50_ms: number_in(&text, "\"ttft_ms\"", "\"p50\""),
        ttft_p95_ms: number_in(&text, "\"ttft_ms\"", "\"p95\""),
        hit_rate: number_in(&text, "\"prefix_cache\"", "\"hit_rate\""),
        completed: number("\"completed\"").unwrap_or(0.0),
        errors: number("\"failed\"").unwrap_or(0.0) + number("\"overflow\"").unwrap_or(0.0),
        ..Row::default()
    })
}

/// The number after `key` in JSON text (xtask stays std-only; the report's keys are unique enough).
pub(crate) fn json_number(text: &str, key: &str) -> Option<f64> {
    let at = text.find(key)? + key.len();
    let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | 'e' | 'E' | '+')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The number after `key` inside the object that follows `outer`.
fn number_in(text: &str, outer: &str, key: &str) -> Option<f64> {
    let at = text.find(outer)?;
    json_number(&text[at..], key)
}

pub(crate) fn metric(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

pub(crate) fn curl(url: &str) -> Result<String> {
    let out = Command::new("curl")
        .args(["--silent", "--max-time", "5", "--max-filesize", "10000000", url])
        .output()
        .map_err(|e| format!("cannot run curl: {e}"))?;
    if !out.status.success() {
        return Err(format!("GET {url} failed"));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
