//! The control crate's integration tests: the app core against real fleet-routers (admin API
//! on, real HTTP on loopback port 0) over emulated replicas (fleet-sim), with a real SQLite
//! history in a temporary folder.

#[path = "control/attacks.rs"]
mod attacks;
#[path = "control/canary.rs"]
mod canary;
#[path = "control/discovery.rs"]
mod discovery;
#[path = "control/etcd_fleet.rs"]
mod etcd_fleet;
#[path = "control/history.rs"]
mod history;
#[path = "control/rollout.rs"]
mod rollout;
#[path = "control/third_party.rs"]
mod third_party;
#[path = "control/views.rs"]
mod views;
#[path = "control/whatif.rs"]
mod whatif;
