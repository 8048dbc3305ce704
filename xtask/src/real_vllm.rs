//! `cargo xtask bench real --engine vllm`: fleet-router's policies, SGLang's Shepherd Model Gateway and
//! vllm-router side by side over three real vLLM servers (the CPU build and model of `cargo xtask engines
//! vllm`), on one prefix-sharing chat trace.
//!
//! The servers start once; before every row each one's prefix cache is emptied (`POST /reset_prefix_cache`,
//! served with `VLLM_SERVER_DEV_MODE=1`), so every row starts cold without three minutes of restarts. Each
//! server's KV cache is `KV_BLOCKS` blocks of 32 tokens: about a third of the trace's shared prefixes, so a
//! router that sends every group everywhere evicts what it will need next, and one that keeps groups apart
//! keeps them cached. The trace is `bench real`'s (groups of requests sharing a long prefix, one block each of
//! their own, evenly spaced; `FLEET_REAL_REQUESTS`, `FLEET_REAL_GAP_MS`), replayed by `fleet-sim bench` as
//! streamed chat completions.
//!
//! Per row: client-side TTFT p50/p95, the prefix hit rate vLLM itself counted (`vllm:prefix_cache_hits_total`
//! over queries, read through fleetdeck's telemetry over the row), and the prompt tokens vLLM computed
//! (`vllm:prompt_tokens_total` minus `vllm:prompt_tokens_cached_total`, summed over the servers, over the row).
//! kv_precise follows the servers' own KV events (ZMQ, vLLM 0.32's encoding) and blocks of the model's own
//! tokens (the router is built with its `tokenizer` feature and given the model's `tokenizer.json` and chat
//! template). The peers: SMG 1.13.0 `cache_aware`, vllm-router 0.1.17 `cache_aware` and its `kv_aware` (which
//! follows the same KV events). Rows run in the order listed and can be narrowed with `FLEET_REAL_ROUTERS`
//! (comma-separated parts of their names). Not part of CI: it is a benchmark, and on two cores its TTFTs
//! carry the noise of three engines sharing them; compare rows of one run only.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::peers::{ensure_peers, http_status};
use crate::procs::{Guard, free_port};
use crate::real::{Row, bench_once, curl, metric, write_trace};
use crate::vllm::{Vllm, ensure_vllm};
use crate::{Result, cargo, run, target_dir};

const SERVERS: usize = 3;
/// The name the servers serve the model under.
const MODEL: &str = "tiny-llama3";
/// vLLM's CPU attention takes multiples of 32 only.
const BLOCK_SIZE: u32 = 32;
/// KV blocks per server (see the module docs; `FLEET_REAL_KV_BLOCKS` changes it): the trace's 20 shared
/// prefixes of about 30 blocks each would need about 600.
fn kv_blocks() -> u32 {
    std::env::var("FLEET_REAL_KV_BLOCKS").ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(224)
}
const MAX_MODEL_LEN: u32 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Fleet,
    Smg,
    VllmRouter,
}

#[derive(Debug, Clone, Copy)]
struct RouterSpec {
    kind: Kind,
    policy: &'static str,
}

impl RouterSpec {
    fn name(self) -> String {
        match self.kind {
            Kind::Fleet => format!("fleet-router {}", self.policy),
            Kind::Smg => format!("smg {}", self.policy),
            Kind::VllmRouter => format!("vllm-router {}", self.policy),
        }
    }
}

const ROUTERS: [RouterSpec; 6] = [
    RouterSpec { kind: Kind::Fleet, policy: "round_robin" },
    RouterSpec { kind: Kind::Fleet, policy: "cache_aware_approx" },
    RouterSpec { kind: Kind::Fleet, policy: "kv_precise" },
    RouterSpec { kind: Kind::Smg, policy: "cache_aware" },
    RouterSpec { kind: Kind::VllmRouter, policy: "cache_aware" },
    RouterSpec { kind: Kind::VllmRouter, policy: "kv_aware" },
];

/// One running vLLM server.
struct Server {
    _process: Guard,
    url: String,
    kv_port: u16,
}

pub fn run_real_vllm() -> Result<()> {
    let vllm = ensure_vllm()?;
    let venv = ensure_peers()?;
    run(cargo(), &["build", "--release", "-p", "fleet-sim", "--bins"], &[])?;
    run(cargo(), &["build", "--release", "-p", "fleet-router", "--features", "tokenizer", "--bins"], &[])?;
    let bin = target_dir().join("release");
    let dir = std::env::temp_dir().join(format!("fleet-real-vllm-bench-{}", std::process::id()));
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let trace = dir.join("trace.jsonl");
    write_trace(&trace)?;

    let mut routers = ROUTERS.to_vec();
    if let Ok(only) = std::env::var("FLEET_REAL_ROUTERS") {
        let wanted: Vec<&str> = only.split(',').map(str::trim).filter(|w| !w.is_empty()).collect();
        routers.retain(|router| wanted.iter().any(|w| router.name().contains(w)));
    }

    let started = Instant::now();
    let mut servers = Vec::new();
    for i in 0..SERVERS {
        println!(
            "starting vLLM server {} of {SERVERS} ({:.0} s so far)",
            i + 1,
            started.elapsed().as_secs_f64()
        );
        servers.push(start_server(&vllm, &dir, i)?);
    }
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    let mut rows = Vec::new();
    for router in &routers {
        let name = router.name();
        println!("\n== {name} ({:.0} s so far)", started.elapsed().as_secs_f64());
        for url in &urls {
            reset_prefix_cache(url)?;
        }
        let before = counters(&urls)?;
        let (guard, url) = start_router(*router, &servers, &vllm, &bin, &venv, &dir)?;
        let mut row = bench_once(&bin, &url, &trace, &urls, MODEL)?;
        let after = counters(&urls)?;
        row.computed = (after.0 - before.0) - (after.1 - before.1);
        row.cached = after.1 - before.1;
        drop(guard);
        rows.push((name, row));
    }
    drop(servers);
    print_table(&rows);
    println!("\nwhole run: {:.0} s; logs in {}", started.elapsed().as_secs_f64(), dir.display());
    Ok(())
}

/// Starts one server on free ports (HTTP and KV events) and waits for `/health` (three minutes at most).
fn start_server(vllm: &Vllm, dir: &Path, index: usize) -> Result<Server> {
    let (port, kv_port) = (free_port()?, free_port()?);
    // vLLM binds its PUB socket only for a wildcard endpoint.
    let kv_events = format!(
        r#"{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:{kv_port}","topic":"kv-events"}}"#
    );
    let log_path = dir.join(format!("vllm-{index}.log"));
    let log = File::create(&log_path).map_err(|e| e.to_string())?;
    let child = Command::new(&vllm.python)
        .args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
        .arg(&vllm.model)
        .args(["--served-model-name", MODEL, "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--dtype", "bfloat16", "--max-model-len", &MAX_MODEL_LEN.to_string()])
        .args(["--enable-prefix-caching", "--block-size", &BLOCK_SIZE.to_string()])
        .args(["--num-gpu-blocks-override", &kv_blocks().to_string(), "--max-num-seqs", "8"])
        .args(["--enable-prompt-tokens-details", "--kv-events-config", &kv_events])
        .env("VLLM_SERVER_DEV_MODE", "1")
        .env("VLLM_CPU_KVCACHE_SPACE", "1")
        .env("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        .env("HF_HUB_OFFLINE", "1")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("DO_NOT_TRACK", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start vLLM with {}: {e}", vllm.python.display()))?;
    let mut guard = Guard(child);
    let deadline = Instant::now() + Duration::from_secs(180);
    while http_status(port, "/health") != Some(200) {
        if matches!(guard.0.try_wait(), Ok(Some(_))) || Instant::now() > deadline {
            return Err(format!("vLLM on port {port} did not become healthy; see {}", log_path.display()));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(Server { _process: guard, url: format!("http://127.0.0.1:{port}"), kv_port })
}

fn reset_prefix_cache(url: &str) -> Result<()> {
    let out = Command::new("curl")
        .args(["--silent", "--fail", "--max-time", "30", "-X", "POST", &format!("{url}/reset_prefix_cache")])
        .output()
        .map_err(|e| format!("cannot run curl: {e}"))?;
    if !out.status.success() {
        return Err(format!("POST {url}/reset_prefix_cache failed (is VLLM_SERVER_DEV_MODE set?)"));
    }
    Ok(())
}

/// Prompt tokens and cached prompt tokens, summed over the servers.
fn counters(urls: &[String]) -> Result<(f64, f64)> {
    let mut sums = (0.0, 0.0);
    for url in urls {
        let text = curl(&format!("{url}/metrics"))?;
        sums.0 += metric_any_labels(&text, "vllm:prompt_tokens_total");
        sums.1 += metric_any_labels(&text, "vllm:prompt_tokens_cached_total");
    }
    Ok(sums)
}

/// The sum of a metric's samples whatever their labels (vLLM labels every sample with its model and engine).
fn metric_any_labels(exposition: &str, name: &str) -> f64 {
    let unlabelled = metric(exposition, name);
    let labelled: f64 = exposition
        .lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|rest| rest.rsplit_once("} ")?.1.trim().parse::<f64>().ok())
        .sum();
    unlabelled + labelled
}

/// Starts one router over the servers and waits until it lists the model; returns it and its URL.
fn start_router(
    router: RouterSpec,
    servers: &[Server],
    vllm: &Vllm,
    bin: &Path,
    venv: &Path,
    dir: &Path,
) -> Result<(Guard, String)> {
    let port = free_port()?;
    let (program, args): (PathBuf, Vec<String>) = match router.kind {
        Kind::Fleet => {
            let spec = dir.join(format!("{}.json", router.policy));
            let params = if router.policy == "kv_precise" {
                format!(r#", "params": {{"block_tokens": {BLOCK_SIZE}}}"#)
            } else {
                String::new()
            };
            fs::write(&spec, format!(r#"{{"policy": "{}"{params}}}"#, router.policy))
                .map_err(|e| e.to_string())?;
            let mut args = vec![
                "--listen".to_owned(),
                format!("127.0.0.1:{port}"),
                "--policy-file".to_owned(),
                spec.to_string_lossy().into_owned(),
                "--tokenizer".to_owned(),
                vllm.model.join("tokenizer.json").to_string_lossy().into_owned(),
            ];
            for server in servers {
                args.push("--replica".to_owned());
                args.push(format!("{},model={MODEL},kv=tcp://127.0.0.1:{}", server.url, server.kv_port));
            }
            (bin.join("fleet-router"), args)
        }
        Kind::Smg | Kind::VllmRouter => {
            let (program, log_level) =
                if router.kind == Kind::Smg { ("smg", "warn") } else { ("vllm-router", "warning") };
            let mut args = Vec::new();
            if router.kind == Kind::Smg {
                args.push("launch".to_owned());
            }
            let metrics_port = free_port()?;
            for arg in [
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                &metrics_port.to_string(),
                "--policy",
                router.policy,
                "--log-level",
                log_level,
            ] {
                args.push(arg.to_owned());
            }
            if router.policy == "kv_aware" {
                for server in servers {
                    args.push("--kv-event-source".to_owned());
                    args.push(format!("{}=tcp://127.0.0.1:{}", server.url, server.kv_port));
                }
                args.extend(["--kv-event-block-size".to_owned(), BLOCK_SIZE.to_string()]);
                args.extend(["--kv-event-model".to_owned(), vllm.model.to_string_lossy().into_owned()]);
            }
            args.push("--worker-urls".to_owned());
            args.extend(servers.iter().map(|s| s.url.clone()));
            (venv.join("bin").join(program), args)
        }
    };
    let log_path = dir.join(format!("{}.log", router.name().replace(' ', "-")));
    let log = File::create(&log_path).map_err(|e| e.to_string())?;
    let child = Command::new(&program)
        .args(&args)
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    let guard = Guard(child);
    let deadline = Instant::now() + Duration::from_secs(90);
    while http_status(port, "/v1/models") != Some(200) {
        if Instant::now() > deadline {
            return Err(format!(
                "{} did not answer /v1/models within 90 s; see {}",
                router.name(),
                log_path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok((guard, format!("http://127.0.0.1:{port}")))
}

fn print_table(rows: &[(String, Row)]) {
    let prompt_tokens = rows.iter().map(|(_, r)| r.computed + r.cached).sum::<f64>();
    let completed = rows.iter().map(|(_, r)| r.completed).sum::<f64>();
    println!(
        "\n{SERVERS} vLLM 0.32.0 CPU servers ({} KV blocks of {BLOCK_SIZE} tokens each), prefix caches emptied \
         before each row; trace: {} requests of {:.0} prompt tokens on average",
        kv_blocks(),
        crate::real::requests(),
        prompt_tokens / completed.max(1.0)
    );
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>7}",
        "router", "TTFT p50", "TTFT p95", "hit rate", "computed", "cached", "completed", "errors"
    );
    for (name, r) in rows {
        println!(
            "{:<28} {:>7.0}ms {:>7.0}ms {:>9} {:>10.0} {:>9.0} {:>9.0} {:>7.0}",
            name,
            r.ttft_p50_ms.unwrap_or(f64::NAN),
            r.ttft_p95_ms.unwrap_or(f64::NAN),
            r.hit_rate.map_or("-".to_owned(), |h| format!("{:.1}%", h * 100.0)),
            r.computed,
            r.cached,
            r.completed,
            r.errors,
        );
    }
    // The issue's goal: our best policy's hit rate >= SMG's, and its TTFT p95 <= 0.8 x SMG's.
    let smg = rows.iter().find(|(n, _)| n == "smg cache_aware").map(|(_, r)| r);
    let best = rows
        .iter()
        .filter(|(n, r)| n.starts_with("fleet-router") && r.hit_rate.is_some())
        .max_by(|a, b| a.1.hit_rate.unwrap_or(0.0).total_cmp(&b.1.hit_rate.unwrap_or(0.0)));
    if let (Some(smg), Some((name, ours))) = (smg, best) {
        let (h_ours, h_smg) = (ours.hit_rate.unwrap_or(0.0), smg.hit_rate.unwrap_or(0.0));
        let p95 = ours.ttft_p95_ms.unwrap_or(f64::NAN) / smg.ttft_p95_ms.unwrap_or(f64::NAN);
        println!(
            "\ngoal: {name} hit rate {:.1}% vs smg cache_aware {:.1}% ({}); TTFT p95 {:.2}x smg's ({})",
            h_ours * 100.0,
            h_smg * 100.0,
            if h_ours >= h_smg { "met" } else { "NOT met" },
            p95,
            if p95 <= 0.8 { "met" } else { "NOT met: goal <= 0.80x" }
        );
    }
}
