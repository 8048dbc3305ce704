// Starts the Leptos UI: loads ui.js and ui_bg.wasm (from `wasm-bindgen --target web`) and runs it.
import init from './ui.js';
init();
