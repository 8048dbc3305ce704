//! Build script: stops with one line when the UI has not been built (a fresh clone has no
//! ui/dist), else lets tauri-build embed the UI from ../ui/dist and the app icon.

#[path = "src/ui_dist.rs"]
mod ui_dist;

fn main() {
    let crate_dir = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    // tauri-build does not watch the UI folder itself: without this, a UI deleted after a good
    // build would skip the check below.
    println!("cargo::rerun-if-changed={}", crate_dir.join(ui_dist::UI_DIST).join("index.html").display());
    if let Err(message) = ui_dist::check(&crate_dir) {
        // Without this, the build fails much later inside `tauri::generate_context!` with
        // "frontendDist ../ui/dist doesn't exist", which says nothing about how to fix it.
        println!("cargo::error={message}");
        return;
    }
    tauri_build::build();
}
