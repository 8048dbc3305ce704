//! `cargo xtask bench ...`: picks the benchmark, and launches the four that are examples of other crates
//! (`fidelity`, fleet-demo's; `etcd`, the control crate's; `skew`, fleet-sim's; `peer-load`, fleet-router's). The router bench is in `router_bench.rs`, the peers bench in `peers.rs`,
//! many routers over one fleet (`bench routers`) in `routers.rs`, P/D thresholds live and in the what-if
//! (`bench pd`) in `pd_bench.rs`,
//! `bench real` in `real.rs` (llama.cpp) and `real_vllm.rs` (vLLM, with the peers; `bench fidelity --engine
//! vllm` runs its fleet-router rows and the what-if alone); their shared process kit in `procs.rs`.

use std::process::Command;

use crate::{Result, cargo, install_packages, run, target_dir};

/// Runs the benchmark `args` names.
pub fn run_bench(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("router") => crate::router_bench::run_router_bench(),
        Some("etcd") => etcd_bench(&args[1..]),
        Some("peer-load") => peer_load_bench(&args[1..]),
        Some("peers") => crate::peers::run_peers(),
        Some("routers") => crate::routers::run_routers(),
        Some("pd") => crate::pd_bench::run_pd(),
        Some("real") => match &args[1..] {
            [] => crate::real::run_real(),
            [flag, engine] if flag == "--engine" && engine == "llamacpp" => crate::real::run_real(),
            [flag, engine] if flag == "--engine" && engine == "vllm" => crate::real_vllm::run_real_vllm(),
            other => Err(format!("bench real takes --engine llamacpp|vllm (default llamacpp), not {other:?}")),
        },
        Some("fidelity") => match &args[1..] {
            [flag, engine] if flag == "--engine" && engine == "vllm" => crate::real_vllm::run_fidelity(),
            extra => fidelity_bench(extra),
        },
        Some("skew") => skew_bench(&args[1..]),
        _ => Err(
            "usage: cargo xtask bench router | peers | routers | pd | real [--engine llamacpp|vllm] | fidelity [REQUESTS] [--scenario NAME] [--policy NAME] [--keep-traces DIR] | fidelity --engine vllm | skew [MOONCAKE_TRACE] | etcd [--routers N] [--pushes N] | peer-load [--routers 4,16,50] [--interval-ms 25] [--seconds 10] [--prompts-per-s 3]"
                .to_owned(),
        ),
    }
}

/// The what-if's fidelity (issue 25): fleet-demo's `fidelity` example runs each change A -> B live
/// on an emulated fleet, predicts B from A's recording with the app's what-if and measures B live from a
/// cold fleet; it prints the table and writes `crates/control/fidelity.json`, which the app compiles in.
fn fidelity_bench(extra: &[String]) -> Result<()> {
    let out = crate::root().join("crates/control/fidelity.json");
    let date = Command::new("date").args(["-u", "+%Y-%m-%d"]).output().map_err(|e| e.to_string())?;
    let date = String::from_utf8_lossy(&date.stdout).trim().to_owned();
    let out = out.to_string_lossy().into_owned();
    let mut args = vec!["run", "--release", "-p", "fleet-demo", "--example", "fidelity", "--", &out];
    args.extend(extra.iter().map(String::as_str));
    run(cargo(), &args, &[("FLEET_FIDELITY_DATE", &date)])
}

/// Issue 35's replay goals under skew: fleet-sim's `skew` example replays every policy on the Mooncake trace
/// (`../shared/traces`, or the path given) and on hot-tenant `fleet-sim gen` workloads at several loads.
fn skew_bench(extra: &[String]) -> Result<()> {
    let trace = match extra.first() {
        Some(path) if std::path::Path::new(path).exists() => Some(path.clone()),
        Some(path) => {
            return Err(format!("bench skew: no trace at {path}; give a Mooncake-format trace file"));
        }
        // The shared trace when it is there; the example runs the generated workloads alone otherwise.
        None => Some(crate::root().join("../shared/traces/synthetic_trace.jsonl"))
            .filter(|path| path.exists())
            .map(|path| path.to_string_lossy().into_owned()),
    };
    let mut args = vec!["run", "--release", "-p", "fleet-sim", "--example", "skew", "--"];
    args.extend(trace.as_deref());
    run(cargo(), &args, &[])
}

/// Policy fan-out to 50 routers through etcd against the per-router HTTP push (issue 26), measured by the
/// control crate's `etcd_fanout` example over release builds and a real etcd.
fn etcd_bench(extra: &[String]) -> Result<()> {
    install_packages(&["etcd-server", "etcd-client"])?;
    run(cargo(), &["build", "--release", "-p", "fleet-router"], &[])?;
    let bin = target_dir().join("release");
    let mut args = vec!["run", "--release", "-p", "fleetdeck-control", "--example", "etcd_fanout", "--"];
    args.extend(extra.iter().map(String::as_str));
    run(cargo(), &args, &[("FLEETDECK_BIN_DIR", &bin.to_string_lossy())])
}

/// What the routers' shared load asks of etcd as they multiply: fleet-router's `peer_load_etcd` example
/// (N publishers and N watchers with its etcd client and summary type) over a real etcd.
fn peer_load_bench(extra: &[String]) -> Result<()> {
    install_packages(&["etcd-server"])?;
    let mut args = vec!["run", "--release", "-p", "fleet-router", "--example", "peer_load_etcd", "--"];
    args.extend(extra.iter().map(String::as_str));
    run(cargo(), &args, &[])
}
