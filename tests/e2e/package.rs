//! The Debian package of `cargo xtask dist`, as an operator gets it: unpacked into a clean folder
//! (`dpkg-deb -x`, what `dpkg -i` puts on disk, without touching the machine), its files checked,
//! and the installed binary started headless against emulated replicas.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fleet_sim::ModelConfig;
use fleet_test_support::process::{bin_dir, spawn_headless_app_at};
use fleet_test_support::{eventually, spawn_sim};
use fleetdeck_api::ScrapeState;

/// The package to test: `FLEETDECK_DEB` (set by `cargo xtask test`, which packages the debug app
/// it builds), else the one `cargo xtask dist` left beside the binaries.
fn package() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("FLEETDECK_DEB") {
        return Ok(PathBuf::from(path));
    }
    let dir = bin_dir().join("bundle/deb");
    let debs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    match debs.as_slice() {
        [deb] if deb.extension().is_some_and(|e| e == "deb") => Ok(deb.clone()),
        _ => bail!(
            "no single .deb in {}; package the app with `cargo xtask test` (or set FLEETDECK_DEB to the \
             .deb of `cargo xtask dist`)",
            dir.display()
        ),
    }
}

/// Runs a tool to completion and returns its stdout, failing with its stderr.
fn stdout_of(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program).args(args).output().with_context(|| format!("cannot run {program}"))?;
    ensure!(
        out.status.success(),
        "`{program} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `KEY=value` of a desktop entry's `[Desktop Entry]` group.
fn desktop_value<'a>(entry: &'a str, key: &str) -> Option<&'a str> {
    entry.lines().find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
}

fn path_arg(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[tokio::test]
async fn the_installed_package_has_its_entry_icon_and_man_page_and_watches_a_fleet() -> Result<()> {
    let deb = path_arg(&package()?);
    let root_dir = tempfile::tempdir()?;
    let root = root_dir.path();
    stdout_of("dpkg-deb", &["-x", &deb, &path_arg(root)])?;

    // What apt reads: the name, and the libraries the window needs.
    assert_eq!(stdout_of("dpkg-deb", &["-f", &deb, "Package"])?.trim(), "fleetdeck");
    let depends = stdout_of("dpkg-deb", &["-f", &deb, "Depends"])?;
    assert!(depends.contains("libwebkit2gtk-4.1-0") && depends.contains("libgtk-3-0"), "Depends: {depends}");

    // The desktop entry starts the packaged binary and names the packaged icon.
    let applications = root.join("usr/share/applications");
    let entries: Vec<PathBuf> = std::fs::read_dir(&applications)
        .with_context(|| format!("the package has no {}", applications.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "desktop"))
        .collect();
    let [entry_path] = entries.as_slice() else { bail!("expected one desktop entry, found {entries:?}") };
    let entry = std::fs::read_to_string(entry_path)?;
    assert_eq!(desktop_value(&entry, "Type"), Some("Application"), "{entry}");
    assert_eq!(desktop_value(&entry, "Name"), Some("Fleetdeck"), "{entry}");
    let exec = desktop_value(&entry, "Exec").context("no Exec= in the desktop entry")?;
    let program = exec.split_whitespace().next().unwrap_or_default();
    let installed = root.join("usr/bin").join(program);
    ensure!(installed.is_file(), "Exec={exec} but the package has no /usr/bin/{program}");
    let icon = desktop_value(&entry, "Icon").context("no Icon= in the desktop entry")?;
    let icon_path = root.join(format!("usr/share/icons/hicolor/256x256/apps/{icon}.png"));
    let png =
        std::fs::read(&icon_path).with_context(|| format!("Icon={icon} but no {}", icon_path.display()))?;
    assert!(png.starts_with(b"\x89PNG"), "{} is not a PNG", icon_path.display());

    // The man pages say what --help says, the three ways in included.
    let man = root.join("usr/share/man/man1");
    let page = stdout_of("gzip", &["-dc", &path_arg(&man.join("fleetdeck.1.gz"))])?;
    assert!(page.contains(".TH fleetdeck"), "not a man page: {page:.200}");
    // roff writes a hyphen as `\-`.
    let page = page.replace("\\-", "-");
    for expected in ["--replica", "--prometheus", "--demo", "Three ways in"] {
        assert!(page.contains(expected), "the man page does not mention {expected}");
    }
    for tool in ["fleetdeck-probe.1.gz", "fleetdeck-history.1.gz"] {
        ensure!(man.join(tool).is_file(), "the package has no man page {tool}");
    }

    // The installed binary, started as an operator would, watches emulated replicas.
    let sim = spawn_sim(2, ModelConfig::default()).await?;
    let db_dir = tempfile::tempdir()?;
    let app = spawn_headless_app_at(&installed, sim.urls(), &db_dir.path().join("history.sqlite")).await?;
    let client = app.client()?;
    let api = app.api("fleet_snapshot");
    let snap = eventually("both replicas scraped by the installed app", Duration::from_secs(60), || async {
        let snap = super::app::snapshot(&client, &api).await?;
        let ready = snap.replicas.len() == 2
            && snap
                .replicas
                .iter()
                .all(|r| matches!(r.scrape, ScrapeState::Ok { .. }) && r.engine.as_deref() == Some("vllm"));
        Ok(ready.then_some(snap))
    })
    .await?;
    let mut urls: Vec<&str> = snap.replicas.iter().map(|r| r.url.as_str()).collect();
    urls.sort_unstable();
    let mut expected: Vec<&str> = sim.urls().iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(urls, expected);

    // Its UI is embedded: the package carries no separate web files.
    let index = client.get(&app.url).send().await?.error_for_status()?.text().await?;
    assert!(index.contains("boot.js"), "the installed app's index.html does not load the UI: {index}");
    Ok(())
}
