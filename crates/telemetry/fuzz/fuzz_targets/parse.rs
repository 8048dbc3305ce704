//! Fuzz target: any bytes through the exposition parser, and whatever parses through engine
//! detection and signal derivation. Nothing may panic; errors must name a line.
#![no_main]

use std::time::Duration;

use fleet_telemetry::exposition::{self, ParseError};
use fleet_telemetry::{Window, read};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match exposition::parse(&text) {
        Ok(parsed) => {
            let _ = parsed.family_names();
            if let Ok(reading) = read(&parsed) {
                // Two readings a second apart exercise deltas, resets and quantiles.
                let mut window = Window::new(Duration::from_secs(10));
                window.push(0.0, &reading);
                window.push(1.0, &reading);
                let _ = window.signals();
            }
        }
        Err(ParseError::Line { line, .. }) => assert!(line >= 1),
        Err(ParseError::TooLarge { .. }) => {}
    }
});
