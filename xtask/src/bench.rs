//! `cargo xtask bench router`: fleet-router's added latency and throughput against going direct and
//! against nginx round-robin, over the same emulated replicas, measured with wrk in one run.
//!
//! Installs Debian's `nginx` and `wrk` when missing, builds release binaries, starts two `fleet-sim`
//! replicas, `fleet-router` (round_robin) and nginx (upstream round-robin, keepalive) over them, then runs
//! wrk against each. Two workloads:
//! - `fast`: a completion the replica rejects at once (`max_tokens: -1`, answered 400 with no model time),
//!   which isolates the proxies' own cost; every proxy runs its full path (parse, pick, forward, relay).
//! - `gen`: a one-token completion (about 12 ms of emulated model time), the realistic case.
//!
//! Latency runs use one connection (added p50/p99 = proxy minus direct); throughput runs use 64.
//! Targets: added p50 <= 50 us, added p99 <= 500 us, req/s >= 0.8 x nginx. Not part of CI.

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Result, cargo, install_packages, run, target_dir};

/// Seconds per wrk run.
const RUN_SECONDS: u32 = 8;
/// Router worker threads (override with FLEET_BENCH_ROUTER_THREADS to compare).
fn router_threads() -> String {
    std::env::var("FLEET_BENCH_ROUTER_THREADS").unwrap_or_else(|_| "1".to_owned())
}

/// A child process stopped on drop: SIGTERM first, so that nginx's master takes its workers
/// down with it (a SIGKILLed master leaves them running), then SIGKILL.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        for _ in 0..50 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot find a free port: {e}"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// Starts `program` and waits for a stdout line starting with `marker`.
fn start_and_wait(program: &Path, args: &[String], marker: &str) -> Result<Guard> {
    let mut child = Command::new(program)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let guard = Guard(child);
    loop {
        match lines.next() {
            Some(Ok(line)) if line.starts_with(marker) => break,
            Some(Ok(_)) => {}
            _ => return Err(format!("{} exited before printing {marker:?}", program.display())),
        }
    }
    // Keep draining so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok(guard)
}

fn wait_for_port(port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("nothing listens on port {port} after 10 s"))
}

fn nginx_config(dir: &Path, port: u16, replicas: &[u16]) -> String {
    let servers: String = replicas.iter().map(|p| format!("        server 127.0.0.1:{p};\n")).collect();
    format!(
        "worker_processes 1;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log warn;\ndaemon off;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n    access_log off;\n    client_body_temp_path {dir};\n    proxy_temp_path {dir};\n\
         fastcgi_temp_path {dir};\n    uwsgi_temp_path {dir};\n    scgi_temp_path {dir};\n\
             upstream replicas {{\n{servers}        keepalive 64;\n    }}\n\
             server {{\n        listen 127.0.0.1:{port};\n        location / {{\n\
                     proxy_pass http://replicas;\n            proxy_http_version 1.1;\n\
                     proxy_set_header Connection \"\";\n            proxy_buffering off;\n        }}\n    }}\n}}\n",
        dir = dir.display()
    )
}

/// Latency percentiles (microseconds) and requests per second of one wrk run.
#[derive(Debug, Clone, Copy)]
struct WrkResult {
    p50_us: f64,
    p99_us: f64,
    rps: f64,
}

fn parse_duration_us(text: &str) -> Option<f64> {
    let text = text.trim();
    let (number, factor) = if let Some(n) = text.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1e6)
    } else {
        (text, 1.0)
    };
    number.trim().parse::<f64>().ok().map(|n| n * factor)
}

fn wrk(url: &str, script: &Path, connections: u32) -> Result<WrkResult> {
    let output = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{RUN_SECONDS}s"),
            "--latency",
            "-s",
            &script.to_string_lossy(),
            url,
        ])
        .output()
        .map_err(|e| format!("cannot run wrk: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("wrk failed: {text}{}", String::from_utf8_lossy(&output.stderr)));
    }
    let mut result = WrkResult { p50_us: f64::NAN, p99_us: f64::NAN, rps: f64::NAN };
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("50.000%" | "50%"), Some(value)) => {
                result.p50_us = parse_duration_us(value).unwrap_or(f64::NAN)
            }
            (Some("99.000%" | "99%"), Some(value)) => {
                result.p99_us = parse_duration_us(value).unwrap_or(f64::NAN)
            }
            (Some("Requests/sec:"), Some(value)) => result.rps = value.parse().unwrap_or(f64::NAN),
            _ => {}
        }
    }
    if result.p50_us.is_nan() || result.rps.is_nan() {
        return Err(format!("cannot read wrk's output:\n{text}"));
    }
    if text.contains("Non-2xx") && !script.to_string_lossy().contains("fast") {
        return Err(format!("the gen workload got non-2xx answers:\n{text}"));
    }
    Ok(result)
}

fn write_script(dir: &Path, name: &str, body: &str) -> Result<PathBuf> {
    let path = dir.join(format!("{name}.lua"));
    let script = format!(
        "wrk.method = \"POST\"\nwrk.path = \"/v1/completions\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = '{body}'\n"
    );
    fs::write(&path, script).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// Runs the router benchmark.
pub fn run_bench(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("router") => router_bench(),
        _ => Err("usage: cargo xtask bench router".to_owned()),
    }
}

fn router_bench() -> Result<()> {
    install_packages(&["nginx", "wrk"])?;
    run(cargo(), &["build", "--release", "-p", "fleet-sim", "-p", "fleet-router"], &[])?;
    let bin = target_dir().join("release");
    let dir = std::env::temp_dir().join(format!("fleet-router-bench-{}", std::process::id()));
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;

    let mut guards = Vec::new();
    let mut replica_ports = Vec::new();
    for _ in 0..2 {
        let port = free_port()?;
        let args: Vec<String> = ["serve", "--replicas", "1", "--base-port", &port.to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        guards.push(start_and_wait(&bin.join("fleet-sim"), &args, "replica 0 serving")?);
        replica_ports.push(port);
    }
    let router_port = free_port()?;
    // One worker thread, as nginx below runs one worker process: on this small machine the
    // router shares the cores with wrk and the replicas.
    let mut router_args = vec![
        "--listen".to_owned(),
        format!("127.0.0.1:{router_port}"),
        "--worker-threads".to_owned(),
        router_threads(),
    ];
    for port in &replica_ports {
        router_args.push("--replica".to_owned());
        router_args.push(format!("http://127.0.0.1:{port}"));
    }
    guards.push(start_and_wait(&bin.join("fleet-router"), &router_args, "fleet-router listening")?);
    let nginx_port = free_port()?;
    let config = dir.join("nginx.conf");
    fs::write(&config, nginx_config(&dir, nginx_port, &replica_ports)).map_err(|e| e.to_string())?;
    let nginx = Command::new("nginx")
        .args(["-c", &config.to_string_lossy(), "-p", &dir.to_string_lossy()])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start nginx: {e}"))?;
    guards.push(Guard(nginx));
    wait_for_port(nginx_port)?;

    let fast = write_script(&dir, "fast", r#"{"prompt": "hello", "max_tokens": -1}"#)?;
    let generate = write_script(&dir, "gen", r#"{"prompt": "hello there", "max_tokens": 1}"#)?;
    let targets = [
        ("direct", format!("http://127.0.0.1:{}", replica_ports[0])),
        ("nginx", format!("http://127.0.0.1:{nginx_port}")),
        ("router", format!("http://127.0.0.1:{router_port}")),
    ];
    println!(
        "\nfleet-router bench: 2 fleet-sim replicas, wrk -t1, {RUN_SECONDS} s per run, router --worker-threads {}, nginx worker_processes 1\n",
        router_threads()
    );
    for (workload, script) in [("fast", &fast), ("gen", &generate)] {
        // Warm every path (connection pools, caches) before measuring.
        for (_, url) in &targets {
            let _ = Command::new("wrk")
                .args(["-t1", "-c8", "-d2s", "-s", &script.to_string_lossy(), url])
                .output();
        }
        let mut latency = Vec::new();
        let mut throughput = Vec::new();
        for (name, url) in &targets {
            latency.push((*name, wrk(url, script, 1)?));
            throughput.push((*name, wrk(url, script, 64)?));
        }
        let direct = latency[0].1;
        let nginx_rps = throughput[1].1.rps;
        println!("workload {workload}:");
        println!(
            "  {:<8} {:>10} {:>10} {:>12} {:>12} {:>10} {:>8}",
            "target", "p50 us", "p99 us", "added p50", "added p99", "req/s", "x nginx"
        );
        for ((name, lat), (_, thr)) in latency.iter().zip(&throughput) {
            println!(
                "  {name:<8} {:>10.1} {:>10.1} {:>12.1} {:>12.1} {:>10.0} {:>8.2}",
                lat.p50_us,
                lat.p99_us,
                lat.p50_us - direct.p50_us,
                lat.p99_us - direct.p99_us,
                thr.rps,
                thr.rps / nginx_rps
            );
        }
        println!();
    }
    drop(guards);
    let _ = fs::remove_dir_all(&dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_durations_parse_in_microseconds() {
        assert_eq!(parse_duration_us("215.00us"), Some(215.0));
        assert_eq!(parse_duration_us("1.20ms"), Some(1200.0));
        assert_eq!(parse_duration_us("2.00s"), Some(2_000_000.0));
    }
}
