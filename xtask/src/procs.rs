//! The benchmarks' process kit: child processes stopped on drop, free ports, waiting for a program's
//! readiness line or port, CPU placement (`taskset`), wrk with its scripts and its report, CPU time from
//! `/proc`, the median of rounds, and fleet-sim replicas to measure against. Shared by the router bench
//! (`router_bench.rs`), the peers bench (`peers.rs`), the PGO training run (`pgo.rs`) and `bench real`
//! (`real.rs`). Standard library only.

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;

/// Where the benchmarked processes run while they are measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Wherever the kernel schedules them: the deployment-like case.
    Free,
    /// Every process (wrk, replicas, proxies) on this one CPU. On a VM where waking a process on another
    /// CPU is slow, this takes those wake-ups out and leaves what the proxies themselves cost.
    OneCpu(usize),
}

impl Placement {
    /// The last CPU, or None on a one-CPU machine (where pinning changes nothing).
    pub(crate) fn one_cpu() -> Option<Self> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cpus > 1).then(|| Placement::OneCpu(cpus - 1))
    }

    /// A command for `program`, under `taskset -c CPU` when pinned.
    pub(crate) fn command(self, program: &str) -> Command {
        match self {
            Placement::Free => Command::new(program),
            Placement::OneCpu(cpu) => {
                let mut command = Command::new("taskset");
                command.args(["-c", &cpu.to_string(), program]);
                command
            }
        }
    }

    /// Moves running processes (every thread of each) here.
    pub(crate) fn apply(self, pids: &[u32]) -> Result<()> {
        let Placement::OneCpu(cpu) = self else { return Ok(()) };
        for pid in pids {
            let status = Command::new("taskset")
                .args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()])
                .stdout(Stdio::null())
                .status()
                .map_err(|e| format!("cannot run taskset: {e}"))?;
            if !status.success() {
                return Err(format!("taskset could not pin process {pid} to CPU {cpu}"));
            }
        }
        Ok(())
    }

    pub(crate) fn describe(self) -> String {
        match self {
            Placement::Free => "processes placed by the kernel".to_owned(),
            Placement::OneCpu(cpu) => format!("every process pinned to CPU {cpu} (taskset)"),
        }
    }
}

/// A child process stopped on drop: SIGTERM first, so that nginx's master takes its workers
/// down with it (a SIGKILLed master leaves them running), then SIGKILL.
pub(crate) struct Guard(pub(crate) Child);

impl Guard {
    /// Stops the process with SIGTERM and waits up to `grace` for it to exit by itself; an error if it
    /// does not, or exits unsuccessfully.
    pub(crate) fn stop(mut self, grace: Duration) -> Result<()> {
        let pid = self.0.id();
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            match self.0.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => return Err(format!("process {pid} exited with {status} on SIGTERM")),
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(error) => return Err(format!("cannot wait for process {pid}: {error}")),
            }
        }
        Err(format!("process {pid} did not exit within {} s of SIGTERM", grace.as_secs()))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(Some(_))) {
            return; // stopped already
        }
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

/// A bench setting from the environment: `name` as a positive number, else `default`. A value that is
/// not one is said on stderr with the default used, not replaced silently.
pub(crate) fn env_positive<T>(name: &str, default: T) -> T
where
    T: std::str::FromStr + PartialOrd + Default + std::fmt::Display,
{
    positive_or(name, std::env::var(name).ok().as_deref(), default)
}

/// `text` (the value of `name`) as a positive number, else `default`, said on stderr when `text` is not one.
fn positive_or<T>(name: &str, text: Option<&str>, default: T) -> T
where
    T: std::str::FromStr + PartialOrd + Default + std::fmt::Display,
{
    let Some(text) = text else { return default };
    match text.trim().parse::<T>() {
        Ok(value) if value > T::default() => value,
        _ => {
            eprintln!("xtask: {name}={text:?} is not a positive number; using {default}");
            default
        }
    }
}

pub(crate) fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot find a free port: {e}"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// Starts `program` and waits for a stdout line starting with `marker`.
pub(crate) fn start_and_wait(program: &Path, args: &[String], marker: &str) -> Result<Guard> {
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

/// Starts `bin/fleet-router` listening on loopback `port` with `args` after `--listen`, its output in
/// `log_path`; waits (60 s at most) until it answers `GET /v1/models`.
pub(crate) fn start_fleet_router(bin: &Path, port: u16, args: &[String], log_path: &Path) -> Result<Guard> {
    let log = fs::File::create(log_path).map_err(|e| e.to_string())?;
    let log_err = log.try_clone().map_err(|e| e.to_string())?;
    let child = Command::new(bin.join("fleet-router"))
        .args(["--listen".to_owned(), format!("127.0.0.1:{port}")])
        .args(args)
        .stdout(log)
        .stderr(Stdio::from(log_err))
        .spawn()
        .map_err(|e| format!("cannot start fleet-router: {e}"))?;
    let guard = Guard(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while crate::peers::http_status(port, "/v1/models") != Some(200) {
        if Instant::now() > deadline {
            return Err(format!("fleet-router did not answer within 60 s; see {}", log_path.display()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(guard)
}

pub(crate) fn wait_for_port(port: u16, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("nothing listens on port {port} after {} s", timeout.as_secs()))
}

/// Latency percentiles (microseconds), requests per second and request count of one wrk run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WrkResult {
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) rps: f64,
    pub(crate) requests: f64,
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

/// Reads wrk's `--latency` report.
fn parse_wrk(text: &str) -> Option<WrkResult> {
    let mut result = WrkResult { p50_us: f64::NAN, p99_us: f64::NAN, rps: f64::NAN, requests: f64::NAN };
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("50.000%" | "50%"), Some(value), _) => result.p50_us = parse_duration_us(value)?,
            (Some("99.000%" | "99%"), Some(value), _) => result.p99_us = parse_duration_us(value)?,
            (Some("Requests/sec:"), Some(value), _) => result.rps = value.parse().ok()?,
            (Some(count), Some("requests"), Some("in")) => result.requests = count.parse().ok()?,
            _ => {}
        }
    }
    let complete = [result.p50_us, result.p99_us, result.rps, result.requests].iter().all(|v| v.is_finite());
    complete.then_some(result)
}

pub(crate) fn wrk(
    url: &str,
    script: &Path,
    connections: u32,
    seconds: u32,
    placement: Placement,
) -> Result<WrkResult> {
    let output = placement
        .command("wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
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
    if text.contains("Non-2xx") && !script.to_string_lossy().contains("fast") {
        return Err(format!("the gen workload got non-2xx answers:\n{text}"));
    }
    parse_wrk(&text).ok_or_else(|| format!("cannot read wrk's output:\n{text}"))
}

/// CPU time (user, system) a process and its threads have used so far, in seconds.
pub(crate) fn cpu_seconds(pid: u32) -> Option<(f64, f64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    let per_second = 100.0; // USER_HZ on Linux
    Some((ticks(11)? / per_second, ticks(12)? / per_second))
}

/// The processes whose CPU a target's requests cost: the router itself, or nginx's workers.
pub(crate) fn serving_pids(pid: u32) -> Vec<u32> {
    let children = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let workers: Vec<u32> = children.split_whitespace().filter_map(|p| p.parse().ok()).collect();
    if workers.is_empty() { vec![pid] } else { workers }
}

/// The median of a benchmark's rounds (sorting them in place), NaN for none: the figure reported, since
/// a small VM's scheduling moves single rounds far more than their median.
pub(crate) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    fleet_base::quantile::median(values).unwrap_or(f64::NAN)
}

/// Writes a wrk script that POSTs the JSON `body` to `path`; returns the script's file.
pub(crate) fn wrk_script(dir: &Path, name: &str, path: &str, body: &str) -> Result<PathBuf> {
    let file = dir.join(format!("{name}.lua"));
    let script = format!(
        "wrk.method = \"POST\"\nwrk.path = \"{path}\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = '{body}'\n"
    );
    fs::write(&file, script).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    Ok(file)
}

/// The body of the `fast` workload: a completion fleet-sim rejects at once (`max_tokens: -1`, answered 400
/// with no model time), so a proxy in front of it runs its full path (parse, pick, forward, relay) and
/// the measure is the proxy's own cost.
pub(crate) const FAST_WORKLOAD: &str = r#"{"prompt": "hello", "max_tokens": -1}"#;

/// Starts `count` fleet-sim processes of one replica each (from `bin`, the production build) on free
/// ports; returns them and their ports.
pub(crate) fn start_replicas(bin: &Path, count: usize) -> Result<(Vec<Guard>, Vec<u16>)> {
    let mut replicas = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..count {
        let port = free_port()?;
        let args = ["serve", "--replicas", "1", "--base-port", &port.to_string()].map(str::to_owned);
        replicas.push(start_and_wait(&bin.join("fleet-sim"), &args, "replica 0 serving")?);
        ports.push(port);
    }
    Ok((replicas, ports))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_reports_are_read() {
        let report = "Running 2s test @ http://127.0.0.1:1\n  1 threads and 1 connections\n  Latency Distribution\n     50%   72.00us\n     75%   80.00us\n     90%   95.00us\n     99%    1.20ms\n  14000 requests in 2.00s, 3.1MB read\nRequests/sec:   7000.12\n";
        let result = parse_wrk(report).unwrap();
        assert_eq!(
            (result.p50_us, result.p99_us, result.requests, result.rps),
            (72.0, 1200.0, 14000.0, 7000.12)
        );
        assert!(parse_wrk("Requests/sec: 1\n").is_none(), "a report without percentiles is refused");
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn bench_settings_are_positive_numbers_or_the_default() {
        assert_eq!(positive_or("N", None, 300usize), 300);
        assert_eq!(positive_or("N", Some(" 12 "), 300usize), 12);
        assert_eq!(positive_or("N", Some("0"), 300usize), 300, "zero is not a setting");
        assert_eq!(positive_or("N", Some("many"), 300usize), 300);
        assert_eq!(positive_or("RATE", Some("2.5"), 80.0), 2.5);
        assert_eq!(positive_or("RATE", Some("-1"), 80.0), 80.0);
    }

    #[test]
    fn wrk_durations_parse_in_microseconds() {
        assert_eq!(parse_duration_us("215.00us"), Some(215.0));
        assert_eq!(parse_duration_us("1.20ms"), Some(1200.0));
        assert_eq!(parse_duration_us("2.00s"), Some(2_000_000.0));
    }
}
