//! `cargo xtask bench router`: fleet-router's added latency and throughput against going direct and
//! against nginx round-robin, over the same emulated replicas, measured with wrk in one run.
//!
//! Installs Debian's `nginx` and `wrk` when missing, builds the binaries with the `production` profile
//! (fat LTO), and the router once more with profile-guided optimisation (`cargo xtask pgo router`, the
//! deployment build), starts two `fleet-sim` replicas, both routers (round_robin) and nginx (upstream
//! round-robin, keepalive) over them, then runs wrk against each. Two workloads:
//! - `fast`: a completion the replica rejects at once (`max_tokens: -1`, answered 400 with no model time),
//!   which isolates the proxies' own cost; every proxy runs its full path (parse, pick, forward, relay).
//! - `gen`: a one-token completion (about 7 ms of emulated model time), the realistic case.
//!
//! Latency runs use one connection (added p50/p99 = proxy minus direct in the same round), in interleaved
//! rounds whose median is reported: on a small VM single runs move by tens of microseconds with the host's
//! scheduling. Throughput runs use 64 connections. The proxies' CPU time per request (from /proc) is
//! printed beside, a figure the scheduling noise hardly moves.
//!
//! On a VM, waking a process on another CPU can be slow: a halted vCPU waits for the host to schedule
//! it. The 2-vCPU Firecracker VM this was written on boots with KVM's guest halt polling off
//! (`haltpoll.guest_halt_poll_ns=0`), so an idle vCPU halts at once and every cross-CPU wake-up waits
//! for the host. In the run of 2026-12-04 a direct request's p50 was 83 us there and 27 us with polling
//! on, about 28 us for each of its two wake-ups; a proxy adds two more before doing any work, and nginx
//! alone added 59 us at p50 with polling off against 36 us with it on. Two more tables take that cost
//! out, each for the `fast` workload:
//! - processes free, with the guest's halt polling set to the kernel's default (200 us) for the table
//!   and restored after it, where the machine has the haltpoll driver, boots with it off and lets the
//!   bench (as root) write it: the deployment-like placement on a guest tuned as KVM's defaults are;
//! - every process (wrk, replicas, proxies) pinned to one CPU (`taskset`): what the proxies themselves
//!   cost, figures that hardly move between rounds.
//!
//! Last, each proxy runs once more under valgrind's callgrind for the `fast` workload: user-space
//! instructions per request, a count the host cannot move at all (this VM has no hardware counters
//! for `perf stat`). It is the figure to compare two versions of the router by. The PGO router is counted
//! once more with its engine-metrics scraper off (`--engine-metrics-ms 0`): callgrind counts that
//! background task too, and under valgrind's slowdown its scrapes fall on few requests.
//!
//! Targets: added p50 <= 50 us, added p99 <= 500 us, req/s >= 0.8 x nginx, judged on the `fast` workload
//! (the proxies' own cost) and printed as met or MISSED under each of its tables, beside nginx's figures.
//! Not part of CI.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::procs::{
    FAST_WORKLOAD, Guard, Placement, cpu_seconds, free_port, median, serving_pids, start_and_wait,
    start_replicas, wait_for_port, wrk, wrk_script,
};
use crate::{Result, cargo, install_packages, run, target_dir};

/// Seconds per latency run (one connection); the rounds interleave the targets.
const LATENCY_SECONDS: u32 = 2;
/// Seconds per throughput run (64 connections) and how many rounds of them.
const THROUGHPUT_SECONDS: u32 = 3;
const THROUGHPUT_ROUNDS: usize = 3;
/// Latency rounds (override with FLEET_BENCH_ROUNDS): a VM's scheduling noise moves single runs by
/// tens of microseconds, the median of interleaved rounds far less.
fn bench_rounds() -> usize {
    crate::procs::env_positive("FLEET_BENCH_ROUNDS", 11)
}
/// Router worker threads (override with FLEET_BENCH_ROUTER_THREADS to compare).
fn router_threads() -> String {
    std::env::var("FLEET_BENCH_ROUTER_THREADS").unwrap_or_else(|_| "1".to_owned())
}

/// KVM guests' idle driver (cpuidle-haltpoll): how long an idle vCPU polls for work before it halts.
/// A halted vCPU needs the host to schedule it again when a wake-up arrives, which on the VM this
/// bench was written on costs about 30 us per cross-CPU wake-up; a polling one answers at once.
const HALT_POLL_NS_PATH: &str = "/sys/module/haltpoll/parameters/guest_halt_poll_ns";
/// Linux's default for `guest_halt_poll_ns` (drivers/cpuidle/governors/haltpoll.c): 200 us.
const KERNEL_DEFAULT_HALT_POLL_NS: u64 = 200_000;

/// This guest's halt polling, in nanoseconds: None where the machine has no haltpoll driver (bare
/// metal, other hypervisors) or it cannot be read.
fn halt_poll_ns() -> Option<u64> {
    fs::read_to_string(HALT_POLL_NS_PATH).ok()?.trim().parse().ok()
}

/// How idle vCPUs wait, for a table's heading: nothing where there is no haltpoll driver.
fn idle_policy() -> String {
    match halt_poll_ns() {
        None => String::new(),
        Some(0) => ", idle vCPUs halt at once (guest halt polling off)".to_owned(),
        Some(ns) => format!(", idle vCPUs poll {} us before halting (guest halt polling)", ns / 1000),
    }
}

/// Guest halt polling switched on at the kernel's default for one measurement, switched back to
/// what it was on drop. A machine-wide setting, so the bench says when it changes it, and how to
/// undo that by hand should the bench be killed before it can.
struct HaltPolling {
    previous_ns: u64,
}

impl HaltPolling {
    /// Switches polling on where this guest boots with it off and the setting can be written (as
    /// root); None otherwise, with the reason printed.
    fn kernel_default() -> Option<Self> {
        let previous_ns = halt_poll_ns()?;
        if previous_ns != 0 {
            return None; // already on: the free table above is measured with it
        }
        if let Err(error) = fs::write(HALT_POLL_NS_PATH, KERNEL_DEFAULT_HALT_POLL_NS.to_string()) {
            println!(
                "(guest halt polling is off and cannot be switched on here: {error}; the table with it is skipped)\n"
            );
            return None;
        }
        println!(
            "guest halt polling set to {KERNEL_DEFAULT_HALT_POLL_NS} ns for the next table; should the bench be killed \
             before it restores it: echo {previous_ns} > {HALT_POLL_NS_PATH}"
        );
        Some(HaltPolling { previous_ns })
    }
}

impl Drop for HaltPolling {
    fn drop(&mut self) {
        match fs::write(HALT_POLL_NS_PATH, self.previous_ns.to_string()) {
            Ok(()) => println!("guest halt polling restored to {} ns\n", self.previous_ns),
            Err(error) => eprintln!(
                "could not restore guest halt polling ({error}): echo {} > {HALT_POLL_NS_PATH}",
                self.previous_ns
            ),
        }
    }
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

/// One proxy's figures over the rounds of a workload.
#[derive(Debug, Default)]
struct Samples {
    p50_us: Vec<f64>,
    p99_us: Vec<f64>,
    added_p50_us: Vec<f64>,
    added_p99_us: Vec<f64>,
    rps: Vec<f64>,
    cpu_user_us: Vec<f64>,
    cpu_system_us: Vec<f64>,
}

/// The router's medians set against the issue's targets, with nginx's beside them for scale.
#[derive(Debug, Clone, Copy)]
struct Verdict {
    added_p50_us: f64,
    added_p99_us: f64,
    rps_x_nginx: f64,
}

const TARGET_ADDED_P50_US: f64 = 50.0;
const TARGET_ADDED_P99_US: f64 = 500.0;
const TARGET_RPS_X_NGINX: f64 = 0.8;

impl Verdict {
    fn of(samples: &mut Samples, nginx_rps: f64) -> Self {
        Verdict {
            added_p50_us: median(&mut samples.added_p50_us),
            added_p99_us: median(&mut samples.added_p99_us),
            rps_x_nginx: median(&mut samples.rps) / nginx_rps,
        }
    }

    /// One line per target: the router's figure, the target, met or missed, and nginx's figure.
    fn against_targets(&self, name: &str, nginx: &Verdict) -> [String; 3] {
        let mark = |met: bool| if met { "met" } else { "MISSED" };
        [
            format!(
                "target added p50 <= {TARGET_ADDED_P50_US:.0} us: {name} {:.0} us, {} (nginx adds {:.0} us)",
                self.added_p50_us,
                mark(self.added_p50_us <= TARGET_ADDED_P50_US),
                nginx.added_p50_us
            ),
            format!(
                "target added p99 <= {TARGET_ADDED_P99_US:.0} us: {name} {:.0} us, {} (nginx adds {:.0} us)",
                self.added_p99_us,
                mark(self.added_p99_us <= TARGET_ADDED_P99_US),
                nginx.added_p99_us
            ),
            format!(
                "target req/s >= {TARGET_RPS_X_NGINX} x nginx: {name} {:.2} x, {}",
                self.rps_x_nginx,
                mark(self.rps_x_nginx >= TARGET_RPS_X_NGINX)
            ),
        ]
    }
}

/// Runs the router benchmark (`cargo xtask bench router`).
pub(crate) fn run_router_bench() -> Result<()> {
    install_packages(&["nginx", "wrk", "valgrind"])?;
    // The production profile (fat LTO), as the router is built for deployment; the replicas too, so
    // that they are no slower than in a real deployment's emulation.
    run(cargo(), &["build", "--profile", "production", "-p", "fleet-sim", "-p", "fleet-router"], &[])?;
    let bin = target_dir().join("production");
    // The same router built with profile-guided optimisation (`cargo xtask pgo router`), measured beside.
    let pgo_router = crate::pgo::build_router(None)?;
    let dir = std::env::temp_dir().join(format!("fleet-router-bench-{}", std::process::id()));
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;

    let (mut guards, replica_ports) = start_replicas(&bin, 2)?;
    // One worker thread, as nginx below runs one worker process: on this small machine the
    // router shares the cores with wrk and the replicas.
    let router_args = |port: u16| {
        let mut args = vec![
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--worker-threads".to_owned(),
            router_threads(),
        ];
        for replica in &replica_ports {
            args.push("--replica".to_owned());
            args.push(format!("http://127.0.0.1:{replica}"));
        }
        args
    };
    let routers = [("router", bin.join("fleet-router")), ("router+pgo", pgo_router)];
    let mut router_targets = Vec::new();
    for (name, program) in &routers {
        let port = free_port()?;
        let router = start_and_wait(program, &router_args(port), "fleet-router listening")?;
        router_targets.push((*name, format!("http://127.0.0.1:{port}"), Some(router.0.id())));
        guards.push(router);
    }
    let nginx_port = free_port()?;
    let config = dir.join("nginx.conf");
    fs::write(&config, nginx_config(&dir, nginx_port, &replica_ports)).map_err(|e| e.to_string())?;
    let nginx = Command::new("nginx")
        .args(["-c", &config.to_string_lossy(), "-p", &dir.to_string_lossy()])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start nginx: {e}"))?;
    let nginx_pid = nginx.id();
    guards.push(Guard(nginx));
    wait_for_port(nginx_port, Duration::from_secs(10))?;

    let fast = wrk_script(&dir, "fast", "/v1/completions", FAST_WORKLOAD)?;
    let generate =
        wrk_script(&dir, "gen", "/v1/completions", r#"{"prompt": "hello there", "max_tokens": 1}"#)?;
    // Direct first and nginx second: `measure` reads the rest as routers.
    let mut targets = vec![
        ("direct", format!("http://127.0.0.1:{}", replica_ports[0]), None),
        ("nginx", format!("http://127.0.0.1:{nginx_port}"), Some(nginx_pid)),
    ];
    targets.extend(router_targets);
    println!(
        "\nfleet-router bench: 2 fleet-sim replicas, wrk -t1, router --worker-threads {}, nginx worker_processes 1",
        router_threads()
    );
    println!(
        "latency: {} rounds x {LATENCY_SECONDS} s per target at 1 connection, targets interleaved, median of \
         the rounds (added = proxy minus direct in the same round); throughput: {THROUGHPUT_ROUNDS} rounds x \
         {THROUGHPUT_SECONDS} s at 64 connections; cpu = the proxy's user/system time per request at 1 connection\n",
        bench_rounds()
    );
    for (workload, script) in [("fast", &fast), ("gen", &generate)] {
        measure(workload, script, &targets, Placement::Free)?;
    }
    // Where this VM boots with its idle vCPUs halting at once, the fast workload again with the
    // kernel's default halt polling: the free placement without the hypervisor's wake-up cost.
    if let Some(polling) = HaltPolling::kernel_default() {
        measure("fast", &fast, &targets, Placement::Free)?;
        drop(polling);
    }
    // The same fast workload with every process on one CPU: what the proxies cost without the VM's
    // cross-CPU wake-ups (the gen workload's figures are the replica's timer jitter either way).
    if let Some(one_cpu) = Placement::one_cpu() {
        let mut running: Vec<u32> = guards.iter().map(|guard| guard.0.id()).collect();
        running.extend(serving_pids(nginx_pid));
        one_cpu.apply(&running)?;
        measure("fast", &fast, &targets, one_cpu)?;
    }
    let nginx_instructions = instructions_per_request(&dir, &fast, |port| {
        let config = dir.join("nginx-callgrind.conf");
        let text = nginx_config(&dir, port, &replica_ports)
            .replace("worker_processes 1;", "worker_processes 1;\nmaster_process off;")
            .replace("nginx.pid", "nginx-callgrind.pid");
        let _ = fs::write(&config, text);
        let args = ["-c", &config.to_string_lossy(), "-p", &dir.to_string_lossy()].map(str::to_owned);
        ("nginx".to_owned(), args.to_vec())
    })?;
    let mut counts = vec![format!("nginx {nginx_instructions:.0}")];
    for (name, program) in &routers {
        let instructions = instructions_per_request(&dir, &fast, |port| {
            (program.to_string_lossy().into_owned(), router_args(port))
        })?;
        counts.push(format!("{name} {instructions:.0} ({:.2} x nginx)", instructions / nginx_instructions));
    }
    // The request path alone: the PGO router again with its engine-metrics scraper off. Callgrind counts
    // the scraper's background parsing too, per request, and valgrind's slowdown makes few requests.
    if let Some((_, program)) = routers.last() {
        let instructions = instructions_per_request(&dir, &fast, |port| {
            let mut args = router_args(port);
            args.extend(["--engine-metrics-ms".to_owned(), "0".to_owned()]);
            (program.to_string_lossy().into_owned(), args)
        })?;
        counts.push(format!(
            "router+pgo without the engine-metrics scraper {instructions:.0} ({:.2} x nginx)",
            instructions / nginx_instructions
        ));
    }
    println!(
        "user-space instructions per request (callgrind, fast workload, 1 connection): {}",
        counts.join(", ")
    );
    drop(guards);
    let _ = fs::remove_dir_all(&dir);
    Ok(())
}

/// A target: its name, its URL and the process whose CPU time its requests cost (none for direct).
type Target = (&'static str, String, Option<u32>);

/// Measures one workload against every target (latency rounds, then throughput) and prints its table;
/// under the `fast` workload's table, each router's figures against the targets. `targets` are direct,
/// nginx, then the routers.
fn measure(workload: &str, script: &Path, targets: &[Target], placement: Placement) -> Result<()> {
    let rounds = bench_rounds();
    // Warm every path (connection pools, caches) before measuring.
    for (_, url, _) in targets {
        let _ = placement
            .command("wrk")
            .args(["-t1", "-c8", "-d2s", "-s", &script.to_string_lossy(), url])
            .output();
    }
    let mut samples: Vec<Samples> = targets.iter().map(|_| Samples::default()).collect();
    for round in 0..rounds {
        // Rotate the order so no target always runs first (or right after another).
        let mut direct = None;
        let mut results = vec![None; targets.len()];
        for k in 0..targets.len() {
            let i = (round + k) % targets.len();
            let (_, url, pid) = &targets[i];
            let pids = pid.map(serving_pids).unwrap_or_default();
            let before: Vec<_> = pids.iter().filter_map(|p| cpu_seconds(*p)).collect();
            let result = wrk(url, script, 1, LATENCY_SECONDS, placement)?;
            let after: Vec<_> = pids.iter().filter_map(|p| cpu_seconds(*p)).collect();
            if !pids.is_empty() && before.len() == after.len() {
                let used = |pick: fn(&(f64, f64)) -> f64| {
                    after.iter().zip(&before).map(|(a, b)| pick(a) - pick(b)).sum::<f64>() * 1e6
                        / result.requests
                };
                samples[i].cpu_user_us.push(used(|t| t.0));
                samples[i].cpu_system_us.push(used(|t| t.1));
            }
            if i == 0 {
                direct = Some(result);
            }
            results[i] = Some(result);
        }
        let direct = direct.ok_or("no direct run")?;
        for (i, result) in results.into_iter().enumerate() {
            let result = result.ok_or("a target did not run")?;
            samples[i].p50_us.push(result.p50_us);
            samples[i].p99_us.push(result.p99_us);
            samples[i].added_p50_us.push(result.p50_us - direct.p50_us);
            samples[i].added_p99_us.push(result.p99_us - direct.p99_us);
        }
    }
    for round in 0..THROUGHPUT_ROUNDS {
        for k in 0..targets.len() {
            let i = (round + k) % targets.len();
            samples[i].rps.push(wrk(&targets[i].1, script, 64, THROUGHPUT_SECONDS, placement)?.rps);
        }
    }
    let nginx_rps = median(&mut samples[1].rps.clone());
    println!("workload {workload}, {}{}:", placement.describe(), idle_policy());
    println!(
        "  {:<10} {:>8} {:>8} {:>10} {:>17} {:>10} {:>9} {:>7} {:>14}",
        "target",
        "p50 us",
        "p99 us",
        "added p50",
        "(min..max)",
        "added p99",
        "req/s",
        "x nginx",
        "cpu us/req"
    );
    for ((name, _, _), s) in targets.iter().zip(&mut samples) {
        let range = if s.added_p50_us.is_empty() {
            String::new()
        } else {
            let low = s.added_p50_us.iter().copied().fold(f64::INFINITY, f64::min);
            let high = s.added_p50_us.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("({low:.0}..{high:.0})")
        };
        let rps = median(&mut s.rps);
        let cpu = if s.cpu_user_us.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.1}u + {:.1}s", median(&mut s.cpu_user_us), median(&mut s.cpu_system_us))
        };
        println!(
            "  {name:<10} {:>8.1} {:>8.1} {:>10.1} {range:>17} {:>10.1} {rps:>9.0} {:>7.2} {cpu:>14}",
            median(&mut s.p50_us),
            median(&mut s.p99_us),
            median(&mut s.added_p50_us),
            median(&mut s.added_p99_us),
            rps / nginx_rps,
        );
    }
    if workload == "fast" {
        // The fast workload isolates the proxies' own cost, so the targets are judged on it.
        let nginx = Verdict::of(&mut samples[1], nginx_rps);
        for ((name, _, _), router) in targets.iter().zip(&mut samples).skip(2) {
            for line in Verdict::of(router, nginx_rps).against_targets(name, &nginx) {
                println!("  {line}");
            }
        }
    }
    println!();
    Ok(())
}

/// Seconds of the measured callgrind run: enough requests that the router's health probes (a few per
/// second) add about 1 % to the count, few enough for valgrind's ~50x slowdown.
const CALLGRIND_SECONDS: u32 = 5;

/// Runs the proxy that `command(port)` names under callgrind and counts the user-space instructions it
/// executes per request of `script` at one connection (counters zeroed after a warm-up).
fn instructions_per_request(
    dir: &Path,
    script: &Path,
    command: impl FnOnce(u16) -> (String, Vec<String>),
) -> Result<f64> {
    let port = free_port()?;
    let (program, args) = command(port);
    let out = dir.join(format!("callgrind-{port}"));
    let mut valgrind_args =
        vec!["--tool=callgrind".to_owned(), format!("--callgrind-out-file={}", out.display()), program];
    valgrind_args.extend(args);
    let child = Command::new("valgrind")
        .args(&valgrind_args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start valgrind: {e}"))?;
    let guard = Guard(child);
    // Programs start slowly under valgrind.
    wait_for_port(port, Duration::from_secs(60))?;
    let url = format!("http://127.0.0.1:{port}");
    wrk(&url, script, 1, 2, Placement::Free)?;
    let pid = guard.0.id().to_string();
    callgrind_control(&["--zero", &pid])?;
    let measured = wrk(&url, script, 1, CALLGRIND_SECONDS, Placement::Free)?;
    callgrind_control(&["--dump=measured", &pid])?;
    // The dump is written as OUT.1 (the first dump of the run).
    let dump = PathBuf::from(format!("{}.1", out.display()));
    let deadline = Instant::now() + Duration::from_secs(30);
    let instructions = loop {
        if let Some(total) = fs::read_to_string(&dump).ok().as_deref().and_then(callgrind_total) {
            break total;
        }
        if Instant::now() > deadline {
            return Err(format!("callgrind wrote no totals to {} within 30 s", dump.display()));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(guard);
    Ok(instructions / measured.requests)
}

/// Sends a command to a running callgrind (quietly: its chatter would bury the report).
fn callgrind_control(args: &[&str]) -> Result<()> {
    let output = Command::new("callgrind_control")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run callgrind_control: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "callgrind_control {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// The instruction count of a callgrind profile (its `summary:` or `totals:` line).
fn callgrind_total(profile: &str) -> Option<f64> {
    profile.lines().find_map(|line| {
        let value = line.strip_prefix("summary:").or_else(|| line.strip_prefix("totals:"))?;
        value.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_judged_on_the_routers_medians() {
        let router = Verdict { added_p50_us: 51.0, added_p99_us: 500.0, rps_x_nginx: 0.8 };
        let nginx = Verdict { added_p50_us: 40.0, added_p99_us: 300.0, rps_x_nginx: 1.0 };
        let lines = router.against_targets("router", &nginx);
        assert!(lines[0].contains("router 51 us, MISSED (nginx adds 40 us)"), "{}", lines[0]);
        assert!(lines[1].contains("router 500 us, met"), "{}", lines[1]);
        assert!(lines[2].contains("router 0.80 x, met"), "{}", lines[2]);
    }

    #[test]
    fn callgrind_totals_are_read() {
        let profile = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nfn=main\n0 12\nsummary: 147251876\ntotals: 147251876\n";
        assert_eq!(callgrind_total(profile), Some(147_251_876.0));
        assert_eq!(callgrind_total("events: Ir\n"), None);
    }
}
