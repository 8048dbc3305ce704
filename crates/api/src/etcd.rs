//! The fleet's policy in etcd (for routers started with `--policy-etcd`): the key as etcd holds it, a push
//! or rollback as one guarded txn, and which routers run the key's revision.

use serde::{Deserialize, Serialize};

/// Command: the fleet's policy key in etcd as it stands. Args: [`EtcdKeyArgs`]. Answers [`EtcdPolicy`].
pub const CMD_ETCD_POLICY: &str = "etcd_policy";

/// Command: write a spec to the policy key in one etcd txn guarded by the revision the operator reviewed.
/// Args: [`EtcdPushArgs`]. Answers [`EtcdPushReport`]; a moved key is the error `revision_conflict`.
pub const CMD_PUSH_ETCD_POLICY: &str = "push_etcd_policy";

/// Command: put the key's previous valid value back, in one guarded txn. Args: [`EtcdRollbackArgs`].
/// Answers [`EtcdPushReport`].
pub const CMD_ROLLBACK_ETCD_POLICY: &str = "rollback_etcd_policy";

/// Command: which routers run the revision of the key they watch, and which lag and why. Args: `{}`.
/// Answers [`EtcdDrift`].
pub const CMD_ETCD_DRIFT: &str = "etcd_drift";

/// Which of the fleet's policy keys (`None`: the fleet's main key; canary groups have keys of their own
/// beside it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EtcdKeyArgs {
    #[serde(default)]
    pub key: Option<String>,
}

/// A policy key as etcd holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EtcdPolicy {
    pub key: String,
    /// The key's `mod_revision`: the `if_revision` of the next push (0: the key does not exist).
    pub revision: i64,
    /// The value (the spec's text), absent when the key does not exist.
    pub text: Option<String>,
    /// Why the value is not a valid policy, if it is not (routers refuse it and keep their last good one).
    pub invalid: Option<String>,
}

/// Arguments of [`CMD_PUSH_ETCD_POLICY`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EtcdPushArgs {
    pub text: String,
    /// The key's revision the operator reviewed ([`EtcdPolicy::revision`]); the txn writes only if the
    /// key is still at it (0: only if the key does not exist).
    pub if_revision: i64,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub operator: Option<String>,
}

/// Arguments of [`CMD_ROLLBACK_ETCD_POLICY`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EtcdRollbackArgs {
    /// The key's revision the operator reviewed.
    pub if_revision: i64,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub operator: Option<String>,
}

/// The result of a push or rollback to the etcd key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EtcdPushReport {
    /// The audit-trail label of the written version.
    pub label: String,
    pub author: String,
    pub at_ms: i64,
    pub key: String,
    /// The key's new `mod_revision`: the revision every watching router reports once it runs it.
    pub revision: i64,
    /// The revision it replaced.
    pub previous_revision: i64,
}

/// Drift of the routers that take their policy from etcd.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EtcdDrift {
    /// One entry per key some router watches.
    pub keys: Vec<KeyDrift>,
    /// Routers that answered but take no policy from etcd (pushed over HTTP instead).
    pub not_on_etcd: Vec<String>,
    /// Routers whose state could not be read, with why.
    pub unreadable: Vec<LaggingRouter>,
}

impl EtcdDrift {
    /// Whether every router runs the revision of its key.
    pub fn is_empty(&self) -> bool {
        self.unreadable.is_empty() && self.keys.iter().all(|k| k.lagging.is_empty())
    }
}

/// The routers watching one key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyDrift {
    pub key: String,
    /// The key's `mod_revision` (0: it does not exist).
    pub revision: i64,
    /// Routers running it.
    pub in_sync: Vec<String>,
    /// Routers behind it.
    pub lagging: Vec<LaggingRouter>,
}

/// A router behind its key, with the revision it runs and why (it refused the value, lost etcd, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaggingRouter {
    pub url: String,
    pub revision: Option<i64>,
    pub reason: String,
}
