//! The policy the fleet is meant to run: the last one this app put in force (over HTTP, through etcd, or by
//! promoting a canary), else the newest version in the audit trail. Drift badges and the what-if's notes
//! compare the routers with it.

use std::sync::{Arc, Mutex};

use fleet_policy::PolicySpec;

use crate::audit::Audit;
use crate::lock;

/// The intended spec, shared by the pushes that set it and the views that read it. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Intended {
    /// `(label, spec)` of the version last put in force from this app.
    last: Arc<Mutex<Option<(String, PolicySpec)>>>,
    audit: Audit,
}

impl Intended {
    pub(crate) fn new(audit: Audit) -> Self {
        Self { last: Arc::default(), audit }
    }

    /// `(label, spec)` of what the fleet is meant to run, if anything says.
    pub(crate) async fn get(&self) -> Option<(String, PolicySpec)> {
        let last = lock(&self.last).clone();
        match last {
            Some(last) => Some(last),
            None => self.audit.newest_version().await,
        }
    }

    /// Remembers `spec` as what the fleet is meant to run (a change from this app took effect).
    pub(crate) fn set(&self, label: &str, spec: PolicySpec) {
        *lock(&self.last) = Some((label.to_owned(), spec));
    }
}
