//! `cargo xtask pgo router`: fleet-router built with profile-guided optimisation, the deployment build.
//!
//! Three steps, the way rustc documents PGO: build an instrumented router (`-Cprofile-generate`), run
//! it over two `fleet-sim` replicas under a training mix, then rebuild with the merged profile
//! (`-Cprofile-use`). Both builds use the `production` profile (fat LTO) and `--target HOST`, so the
//! flags reach the router's code but not build scripts or proc macros (which would otherwise write
//! profiles of their own while building). Each build has its own target directory under
//! `TARGET/pgo/`: different RUSTFLAGS would otherwise rebuild the main target directory from scratch.
//!
//! The training mix covers what a router does in service, not only what the benchmark measures:
//! - one worker thread with `round_robin`, then the default multi-threaded runtime with
//!   `cache_aware_approx` (LLVM lays out code it never saw run as cold, so both schedulers must run);
//! - wrk: a completion answered at once at 1 and at 64 connections, and streamed chat completions with
//!   a shared system prompt at 8 connections;
//! - `fleet-sim load`: Poisson arrivals of multi-tenant streaming chat with shared prefixes;
//! - a `/metrics` scrape.
//!
//! The mix runs over plain HTTP without a tokenizer. Built with `--features tls` or `tokenizer`, those
//! paths are compiled in but never ran in training, and LLVM optimises code it never saw run for size:
//! measure such a build with the features in use before deploying it (the command says so).
//!
//! Why: in `cargo xtask bench router` the profile cut the router's user-space instructions per
//! proxied request from 43.2k to 33.1k (callgrind) and its user CPU per request by about a third
//! (27.5 to 18.7 us with the processes placed freely, 15.4 to 11.9 us pinned to one CPU): the hot
//! path is laid out densely, which matters most when a request wakes a process on a cold CPU.
//! `llvm-profdata` comes from rustup's
//! `llvm-tools` component (installed when missing), as it must match rustc's LLVM.

use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::procs::{FAST_WORKLOAD, Placement, free_port, start_and_wait, start_replicas, wrk, wrk_script};
use crate::{Result, cargo, install_packages, output, run, target_dir, timed};

/// Seconds of each wrk run of the training mix.
const TRAINING_SECONDS: u32 = 3;

/// `cargo xtask pgo router [--features F]`.
pub fn run_pgo(args: &[String]) -> Result<()> {
    let features = match args {
        [router] if router == "router" => None,
        [router, flag, features] if router == "router" && flag == "--features" => Some(features.as_str()),
        _ => return Err("usage: cargo xtask pgo router [--features tls,tokenizer]".to_owned()),
    };
    let binary = build_router(features)?;
    if features.is_some() {
        println!(
            "xtask: note: the training ran without TLS or a tokenizer, so their code is optimised as \
             never-run code; measure this build with them in use before deploying it"
        );
    }
    println!("xtask: fleet-router with profile-guided optimisation: {}", binary.display());
    Ok(())
}

/// Builds fleet-router with PGO (instrument, train, rebuild) and returns the optimised binary's path.
pub fn build_router(features: Option<&str>) -> Result<PathBuf> {
    install_packages(&["wrk", "curl"])?;
    let host = host_triple()?;
    let profdata_tool = llvm_profdata(&host)?;
    let pgo_dir = target_dir().join("pgo");
    let raw_profiles = pgo_dir.join("profiles");
    // Profiles of an older build would not match this one's code.
    let _ = fs::remove_dir_all(&raw_profiles);
    fs::create_dir_all(&raw_profiles)
        .map_err(|e| format!("cannot create {}: {e}", raw_profiles.display()))?;

    // The replicas of the training run, built as the benchmark builds them.
    run(cargo(), &["build", "--profile", "production", "-p", "fleet-sim"], &[])?;
    let instrumented = timed("the instrumented router build", || {
        build(
            &host,
            features,
            &pgo_dir.join("generate"),
            &format!("-Cprofile-generate={}", raw_profiles.display()),
        )
    })?;
    timed("the training run", || train(&instrumented))?;
    let has_profiles = fs::read_dir(&raw_profiles)
        .map_err(|e| e.to_string())?
        .flatten()
        .any(|entry| entry.path().extension().is_some_and(|ext| ext == "profraw"));
    if !has_profiles {
        return Err(format!("the training run left no profile in {}", raw_profiles.display()));
    }
    let merged = pgo_dir.join("fleet-router.profdata");
    let merged_arg = format!("-o={}", merged.display());
    run(&profdata_tool, &["merge", &merged_arg, &raw_profiles.to_string_lossy()], &[])?;
    // Cargo fingerprints RUSTFLAGS, not the files they name: a profile named by its content makes a new
    // profile rebuild every crate, where a fixed name would leave the dependencies optimised for the old one.
    let profile = fs::read(&merged).map_err(|e| format!("cannot read {}: {e}", merged.display()))?;
    let mut hasher = std::hash::DefaultHasher::new();
    profile.hash(&mut hasher);
    let named = pgo_dir.join(format!("fleet-router-{:016x}.profdata", hasher.finish()));
    for old in fs::read_dir(&pgo_dir).map_err(|e| e.to_string())?.flatten() {
        let name = old.file_name().to_string_lossy().into_owned();
        if name.starts_with("fleet-router-") && name.ends_with(".profdata") {
            let _ = fs::remove_file(old.path());
        }
    }
    fs::rename(&merged, &named).map_err(|e| format!("cannot rename {}: {e}", merged.display()))?;
    timed("the optimised router build", || {
        build(&host, features, &pgo_dir.join("use"), &format!("-Cprofile-use={}", named.display()))
    })
}

/// The host's target triple, from `rustc -vV`.
fn host_triple() -> Result<String> {
    let version = output("rustc", &["-vV"]).ok_or("cannot run `rustc -vV`")?;
    version
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .map(str::to_owned)
        .ok_or_else(|| format!("`rustc -vV` names no host:\n{version}"))
}

/// rustup's `llvm-profdata` for the active toolchain, installing the `llvm-tools` component if needed.
fn llvm_profdata(host: &str) -> Result<PathBuf> {
    let sysroot = output("rustc", &["--print", "sysroot"]).ok_or("cannot run `rustc --print sysroot`")?;
    let tool = Path::new(sysroot.trim()).join("lib/rustlib").join(host).join("bin/llvm-profdata");
    if !tool.exists() {
        run("rustup", &["component", "add", "llvm-tools"], &[]).map_err(|error| {
            format!("{error}; PGO needs llvm-profdata from the toolchain's llvm-tools component")
        })?;
    }
    if tool.exists() {
        Ok(tool)
    } else {
        Err(format!("llvm-tools is installed but {} is missing", tool.display()))
    }
}

/// Builds fleet-router (production profile, `--target host`) into `target` with `flags` added to
/// RUSTFLAGS; returns the binary's path.
fn build(host: &str, features: Option<&str>, target: &Path, flags: &str) -> Result<PathBuf> {
    let rustflags = match std::env::var("RUSTFLAGS") {
        Ok(existing) if !existing.trim().is_empty() => format!("{existing} {flags}"),
        _ => flags.to_owned(),
    };
    let target_arg = target.to_string_lossy();
    let mut args = vec!["build", "--profile", "production", "-p", "fleet-router", "--target", host];
    if let Some(features) = features {
        args.extend(["--features", features]);
    }
    run(cargo(), &args, &[("RUSTFLAGS", &rustflags), ("CARGO_TARGET_DIR", &target_arg)])?;
    Ok(target.join(host).join("production").join("fleet-router"))
}

/// Runs the instrumented router under the training mix; it writes its profile when it exits.
fn train(router: &Path) -> Result<()> {
    let bin = target_dir().join("production");
    let dir = std::env::temp_dir().join(format!("fleet-router-pgo-{}", std::process::id()));
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let (replicas, replica_ports) = start_replicas(&bin, 2)?;
    let policy = dir.join("cache-aware.yaml");
    fs::write(&policy, "policy: cache_aware_approx\n").map_err(|e| e.to_string())?;
    let fast = wrk_script(&dir, "fast", "/v1/completions", FAST_WORKLOAD)?;
    let chat = wrk_script(
        &dir,
        "chat",
        "/v1/chat/completions",
        r#"{"messages": [{"role": "system", "content": "You answer questions about invoices for the billing team."}, {"role": "user", "content": "Summarise the last invoice."}], "max_tokens": 4, "stream": true}"#,
    )?;
    let runs: [&[&str]; 2] = [&["--worker-threads", "1"], &["--policy-file", &policy.to_string_lossy()]];
    for extra in runs {
        let port = free_port()?;
        let url = format!("http://127.0.0.1:{port}");
        let mut args = vec!["--listen".to_owned(), format!("127.0.0.1:{port}")];
        args.extend(extra.iter().map(|arg| arg.to_string()));
        for replica in &replica_ports {
            args.extend(["--replica".to_owned(), format!("http://127.0.0.1:{replica}")]);
        }
        let router = start_and_wait(router, &args, "fleet-router listening")?;
        for (script, connections) in [(&fast, 1), (&fast, 64), (&chat, 8)] {
            let requests = wrk(&url, script, connections, TRAINING_SECONDS, Placement::Free)?.requests;
            println!(
                "xtask: training: {requests} requests of {} at {connections} connection(s)",
                script.display()
            );
        }
        run(bin.join("fleet-sim"), &["load", "--target", &url, "--rps", "40", "--duration", "4"], &[])?;
        let metrics =
            Command::new("curl").args(["-sf", "-o", "/dev/null", &format!("{url}/metrics")]).status();
        if !metrics.is_ok_and(|status| status.success()) {
            return Err(format!("the instrumented router did not serve {url}/metrics"));
        }
        // A clean exit writes the profile; a killed router would leave none.
        router.stop(Duration::from_secs(30))?;
    }
    drop(replicas);
    let _ = fs::remove_dir_all(&dir);
    Ok(())
}
