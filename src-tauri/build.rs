//! Build script: lets tauri-build embed the UI from ../ui/dist and the app icon.

fn main() {
    tauri_build::build();
}
