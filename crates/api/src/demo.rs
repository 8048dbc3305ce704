//! Starting the embedded demo fleet from the first window.

use serde::{Deserialize, Serialize};

/// Command: start the embedded demo fleet inside the running app (once). Args: [`StartDemoArgs`].
pub const CMD_START_DEMO: &str = "start_demo";

/// Arguments of [`CMD_START_DEMO`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StartDemoArgs {
    /// Emulated replicas, 1 ..= 64.
    pub replicas: u32,
}

impl Default for StartDemoArgs {
    fn default() -> Self {
        Self { replicas: 4 }
    }
}

/// The demo fleet the app runs and watches (until it stops; never saved to the settings).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DemoStarted {
    pub replicas: Vec<String>,
    /// The fleet-router the demo traffic goes through.
    pub router: String,
}
