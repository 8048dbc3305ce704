//! `cargo xtask dist`: the Debian package an operator installs (`dpkg -i` or `apt install ./...deb`).
//!
//! The release app is bundled by Tauri's own bundler, the `tauri` command of the npm package
//! `@tauri-apps/cli` (its prebuilt Linux binary ships inside the npm package
//! `@tauri-apps/cli-linux-x64-gnu`), installed at a pinned version under the target folder. Its
//! `deb` bundle is made offline: the binary in /usr/bin, the icon in the hicolor theme, a desktop
//! entry, and the dependencies on WebKitGTK and GTK. The man pages come from the app's own
//! command-line definitions (`fleetdeck man DIR`, clap_mangen), so they say what `--help` says.
//! AppImage is not offered: Tauri downloads linuxdeploy for it, which cannot work offline.

use std::fs;
use std::path::{Path, PathBuf};

use crate::{Result, cargo, output, root, run, target_dir, timed};

/// The Tauri CLI release used for bundling: the same minor version as the tauri crate in Cargo.lock.
pub const TAURI_CLI_VERSION: &str = "2.12.5";

/// `cargo xtask dist [--debug]`: installs what is missing, builds the UI and the release app (or,
/// with `--debug`, the debug build the tests use), packages it.
pub fn dist(args: &[String]) -> Result<()> {
    let debug = match args {
        [] => false,
        [flag] if flag == "--debug" => true,
        other => return Err(format!("unknown arguments {other:?}; usage: cargo xtask dist [--debug]")),
    };
    crate::setup(false)?;
    crate::build_ui()?;
    if debug {
        // The same set as `cargo xtask test` builds, so the two share every artifact.
        timed("build", || run(cargo(), &["build", "--workspace", "--bins"], &[]))?;
        return timed("deb package", || package(Profile::Debug)).map(|_| ());
    }
    build_and_package().map(|_| ())
}

/// Builds the release app (the UI must be built) and packages it; returns the `.deb`'s path.
pub fn build_and_package() -> Result<PathBuf> {
    timed("release app build", || run(cargo(), &["build", "--release", "-p", "fleetdeck"], &[]))?;
    timed("deb package", || package(Profile::Release))
}

/// Which build of the app goes into the package.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// What operators install (`cargo xtask dist`).
    Release,
    /// The test suite's package: the debug app it has built anyway. The packaging is the same, and
    /// a second (release) build of the app would cost CI minutes for no other check.
    Debug,
}

/// Bundles the already-built `target/{release,debug}/fleetdeck` as a `.deb`; returns its path.
pub fn package(profile: Profile) -> Result<PathBuf> {
    let (folder, flag) = match profile {
        Profile::Release => ("release", None),
        Profile::Debug => ("debug", Some("--debug")),
    };
    let release = target_dir().join(folder);
    let app = release.join("fleetdeck");
    let man_pages = man_pages(&app, &release.join("dist-man"))?;
    let tauri = ensure_tauri_cli()?;

    // The man pages live in the target folder, wherever that is, so they are named here rather
    // than in tauri.conf.json (whose paths are relative to src-tauri/).
    let files: Vec<String> = man_pages
        .iter()
        .map(|page| {
            let name = page.file_name().unwrap_or_default().to_string_lossy();
            format!("{:?}: {:?}", format!("/usr/share/man/man1/{name}"), page.to_string_lossy())
        })
        .collect();
    let config = format!(r#"{{"bundle": {{"linux": {{"deb": {{"files": {{{}}}}}}}}}}}"#, files.join(", "));
    let bundle_dir = release.join("bundle/deb");
    // Old packages would make the path below ambiguous (a version bump leaves the last one).
    let _ = fs::remove_dir_all(&bundle_dir);
    let tauri = tauri.to_string_lossy().into_owned();
    // Run from src-tauri/, where the CLI finds tauri.conf.json. `--no-binary-patching` leaves
    // cargo's binary as built (the patch only serves Tauri's updater, which this app does not use).
    let status = std::process::Command::new(&tauri)
        .args(["bundle", "--bundles", "deb", "--no-binary-patching", "--ci", "--config", &config])
        .args(flag)
        .current_dir(root().join("src-tauri"))
        .status()
        .map_err(|e| format!("cannot run {tauri}: {e}"))?;
    if !status.success() {
        return Err(format!("`{tauri} bundle --bundles deb` failed ({status})"));
    }
    let debs: Vec<PathBuf> = fs::read_dir(&bundle_dir)
        .map_err(|e| format!("the bundler left no {}: {e}", bundle_dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "deb"))
        .collect();
    match debs.as_slice() {
        [deb] => {
            println!("xtask: package: {}", deb.display());
            println!("xtask: install it with `sudo apt install {}`", deb.display());
            Ok(deb.clone())
        }
        _ => Err(format!("expected one .deb in {}, found {debs:?}", bundle_dir.display())),
    }
}

/// Writes the app's man pages into `dir`, gzipped as Debian wants them; returns their paths.
fn man_pages(app: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let _ = fs::remove_dir_all(dir);
    let dir_arg = dir.to_string_lossy().into_owned();
    run(app, &["man", &dir_arg], &[])?;
    let mut pages: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "1"))
        .collect();
    pages.sort();
    if pages.is_empty() {
        return Err(format!("`fleetdeck man` wrote no page into {}", dir.display()));
    }
    let mut gzipped = Vec::new();
    for page in pages {
        // -n: no name or time stamp inside, so an unchanged page makes an identical file.
        let page_arg = page.to_string_lossy().into_owned();
        run("gzip", &["-9", "-n", "-f", &page_arg], &[])?;
        gzipped.push(PathBuf::from(format!("{page_arg}.gz")));
    }
    Ok(gzipped)
}

/// The `tauri` command of `@tauri-apps/cli` at [`TAURI_CLI_VERSION`], installed with npm under
/// the target folder when missing.
fn ensure_tauri_cli() -> Result<PathBuf> {
    let prefix = target_dir().join("tauri-cli");
    let tauri = prefix.join("node_modules/.bin/tauri");
    let wanted = format!("tauri-cli {TAURI_CLI_VERSION}");
    let tauri_arg = tauri.to_string_lossy().into_owned();
    if output(&tauri_arg, &["--version"]).is_some_and(|v| v.trim() == wanted) {
        return Ok(tauri);
    }
    if output("npm", &["--version"]).is_none() {
        return Err("packaging needs npm (Node.js) to install Tauri's bundler; install Node.js and npm, \
                    then run `cargo xtask dist` again"
            .into());
    }
    let prefix_arg = prefix.to_string_lossy().into_owned();
    let package = format!("@tauri-apps/cli@{TAURI_CLI_VERSION}");
    timed("tauri-cli", || {
        run(
            "npm",
            &["install", "--prefix", &prefix_arg, "--no-audit", "--no-fund", "--save-exact", &package],
            &[],
        )
    })?;
    match output(&tauri_arg, &["--version"]) {
        Some(version) if version.trim() == wanted => Ok(tauri),
        other => Err(format!("{tauri_arg} --version says {other:?}, expected {wanted}")),
    }
}
