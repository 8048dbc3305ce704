//! The pure logic of changing a live fleet's routing policy: what differs, what each router answered, and when a
//! canary is promoted or rolled back.
//!
//! No I/O and no clock: the app's control crate performs the pushes (the routers' compare-and-swap admin API)
//! and the measurements, feeds their results in with the current time, and carries out the [`Action`]s this
//! crate returns. That keeps every rollout decision reproducible in a test.
//!
//! - [`diff`]: the parameter-level difference between the spec a router runs and a candidate, defaults filled in.
//! - [`push`]: what one router answered to a push, and drift between intended and active specs.
//! - [`etcd`]: drift of routers that take their policy from etcd: each router's revision against its key's.
//! - [`canary`]: push to a subset, watch guards, then promote to the rest or roll back, logging every step.

pub mod canary;
pub mod diff;
pub mod etcd;
pub mod push;

pub use canary::{
    Action, Canary, CanaryError, CanaryPlan, GuardReading, Guards, Judgement, Phase, SideWindow, Step,
    Verdict, judge,
};
pub use diff::{ParamChange, SpecDiff, effective_params, effective_pd, spec_diff};
pub use etcd::{EtcdDrift, EtcdReport, Lag, etcd_drift, watched_keys};
pub use push::{Drift, PushOutcome, drift};
