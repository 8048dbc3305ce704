//! Whether the built UI that the app embeds is there: shared by the build script (which stops
//! with one line saying what to run) and the unit tests below.

use std::path::Path;

/// The folder Tauri embeds, relative to this crate; `build.frontendDist` in tauri.conf.json.
pub const UI_DIST: &str = "../ui/dist";

/// `Err` with the one line to show when `crate_dir`'s UI is not built.
pub fn check(crate_dir: &Path) -> Result<(), String> {
    let index = crate_dir.join(UI_DIST).join("index.html");
    if index.is_file() {
        return Ok(());
    }
    // Named from the workspace root, where the commands are run.
    let shown = UI_DIST.trim_start_matches("../");
    Err(format!(
        "the UI is not built ({shown}/index.html is missing): run `cargo xtask ui` (or `cargo xtask demo`), then build again"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_ui_says_to_build_it_and_a_built_one_passes() {
        let root = tempfile::tempdir().unwrap();
        let crate_dir = root.path().join("src-tauri");
        std::fs::create_dir_all(&crate_dir).unwrap();
        let error = check(&crate_dir).unwrap_err();
        assert!(error.contains("run `cargo xtask ui`") && error.contains("index.html"), "{error}");
        assert!(!error.contains('\n'), "one line: {error}");

        // An empty folder is not a built UI either (a build stopped half way).
        let dist = root.path().join("ui/dist");
        std::fs::create_dir_all(&dist).unwrap();
        assert!(check(&crate_dir).is_err());

        std::fs::write(dist.join("index.html"), "<!doctype html>").unwrap();
        assert_eq!(check(&crate_dir), Ok(()));
    }

    #[test]
    fn the_checked_folder_is_the_one_tauri_embeds() {
        let config: serde_json::Value =
            serde_json::from_str(include_str!("../tauri.conf.json")).expect("tauri.conf.json is JSON");
        assert_eq!(config["build"]["frontendDist"], UI_DIST);
    }
}
