//! The policy from etcd (`--policy-etcd URL --policy-key KEY`): the router reads the key, watches it from
//! the next revision, and swaps in every value it holds through the admin API's own path (the same
//! parsing and validation as `PUT /admin/policy`, the same atomic swap).
//!
//! An invalid value is refused: logged, counted (`fleet_router_policy_store_rejected_total`) and shown in
//! `/admin/state`, while the last good policy stays in force. A deleted key also leaves the policy as it is.
//! The revision of the value in force (its `mod_revision`) is reported in `/admin/state` and `/metrics`, so
//! the app sees which routers lag the key.
//!
//! When etcd cannot be reached the router keeps its policy and tries again with backoff (100 ms doubling to
//! 2 s); each new session reads the key first and watches from there, which also covers a watch that etcd
//! cancelled because its revision was compacted away. A watch stream is quiet while the key is, so the key
//! is also read every `check_every`: a partition that leaves the stream open without traffic is noticed,
//! and a change the stream missed is applied.
//!
//! Revisions only grow within one etcd cluster (a snapshot restore keeps them): a router moved to a new
//! cluster, whose revisions start again, must be restarted, as it ignores revisions it has passed.

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_etcd::{EtcdClient, EtcdConfig, EtcdError, KeyValue, WatchEvent, WatchFrame};

use crate::etcd_sessions::{self, Backoff, Connection, Sessions};
use crate::state::{PolicyChangeError, RouterState, lock};

/// Where the policy comes from: an etcd key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdPolicySource {
    /// How to reach etcd.
    pub etcd: EtcdConfig,
    /// The key holding the policy spec (YAML or JSON), e.g. `/fleetdeck/FLEET/policy`.
    pub key: String,
    /// How often the key is also read beside the watch.
    pub check_every: Duration,
}

impl EtcdPolicySource {
    /// The defaults for `endpoints` and `key`.
    pub fn new(endpoints: &str, key: &str) -> Self {
        Self { etcd: EtcdConfig::new(endpoints), key: key.to_owned(), check_every: Duration::from_secs(10) }
    }
}

/// The watcher's state, as `/admin/state` and `/metrics` show it.
#[derive(Debug)]
pub struct EtcdPolicyWatch {
    /// The watched key.
    pub key: String,
    /// The etcd client.
    pub client: EtcdClient,
    check_every: Duration,
    /// Whether the last call to etcd succeeded, and its error.
    connection: Connection,
    /// The newest `mod_revision` of the key seen, applied or refused.
    seen_revision: AtomicI64,
    /// The newest `mod_revision` applied or refused (only the watcher task moves it).
    handled: AtomicI64,
    /// Values refused since start.
    rejected: AtomicU64,
    /// Sessions started after the first (etcd lost, watch cancelled).
    reconnects: AtomicU64,
    last_rejected: Mutex<Option<(i64, String)>>,
}

impl EtcdPolicyWatch {
    /// The watcher for `source` (the client is built now, so a bad TLS file fails the start).
    pub fn new(source: &EtcdPolicySource) -> Result<Self, EtcdError> {
        Ok(Self {
            key: source.key.clone(),
            client: EtcdClient::new(source.etcd.clone())?,
            check_every: source.check_every,
            connection: Connection::default(),
            seen_revision: AtomicI64::new(0),
            handled: AtomicI64::new(0),
            rejected: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            last_rejected: Mutex::new(None),
        })
    }

    /// Values refused since start.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    /// The `etcd_policy` object of `/admin/state`.
    pub fn state_document(&self) -> serde_json::Value {
        // Read first: a revision read as seen has its outcome (counted, last_rejected) in place below.
        let seen_revision = self.seen_revision.load(Ordering::Acquire);
        let last_rejected = lock(&self.last_rejected)
            .clone()
            .map(|(revision, reason)| serde_json::json!({"revision": revision, "reason": reason}));
        serde_json::json!({
            "kind": "etcd",
            "endpoint": self.client.endpoint(),
            "key": self.key,
            "connected": self.connection.connected(),
            "seen_revision": seen_revision,
            "rejected_total": self.rejected(),
            "reconnects_total": self.reconnects.load(Ordering::Relaxed),
            "last_rejected": last_rejected,
            "error": self.connection.error(),
        })
    }

    /// Appends the store's families to the `/metrics` text.
    pub fn render_metrics(&self, out: &mut String, revision_in_force: i64) {
        use std::fmt::Write as _;
        let key = crate::metrics::escape(&self.key);
        let families: [(&str, &str, &str, String); 5] = [
            (
                "fleet_router_policy_store_revision",
                "gauge",
                "etcd mod_revision of the policy value in force (0: none from etcd yet).",
                revision_in_force.to_string(),
            ),
            (
                "fleet_router_policy_store_seen_revision",
                "gauge",
                "Newest etcd mod_revision of the policy key seen, applied or refused.",
                self.seen_revision.load(Ordering::Acquire).to_string(),
            ),
            (
                "fleet_router_policy_store_rejected_total",
                "counter",
                "Policy values from etcd refused as invalid (the last good policy stayed in force).",
                self.rejected().to_string(),
            ),
            (
                "fleet_router_policy_store_connected",
                "gauge",
                "1 when the last call to etcd succeeded.",
                u8::from(self.connection.connected()).to_string(),
            ),
            (
                "fleet_router_policy_store_reconnects_total",
                "counter",
                "Watch sessions started again after etcd was lost or cancelled the watch.",
                self.reconnects.load(Ordering::Relaxed).to_string(),
            ),
        ];
        for (name, kind, help, value) in families {
            let _ =
                writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{key=\"{key}\"}} {value}");
        }
    }

    fn set_error(&self, error: Option<String>) {
        self.connection.set_error(error);
    }
}

/// Applies a value of the key, or refuses it (logged, counted); a value already handled is skipped.
async fn consider(state: &RouterState, store: &EtcdPolicyWatch, kv: &KeyValue) {
    // In force already, or refused already: a re-read after a reconnect must not count a refusal twice.
    if store.handled.fetch_max(kv.mod_revision, Ordering::Relaxed) < kv.mod_revision {
        apply_or_refuse(state, store, kv).await;
    }
    // Seen once handled (the parse runs off the runtime and takes a while): whoever reads a revision as seen
    // finds its outcome, applied or refused and counted, already in place.
    store.seen_revision.fetch_max(kv.mod_revision, Ordering::Release);
}

async fn apply_or_refuse(state: &RouterState, store: &EtcdPolicyWatch, kv: &KeyValue) {
    match state.apply_etcd_policy(kv.mod_revision, &kv.value).await {
        Ok(Some(version)) => {
            tracing::info!(key = %store.key, revision = kv.mod_revision, version = version.version, policy = version.name, "policy from etcd applied");
        }
        Ok(None) => {}
        Err(error) => {
            store.rejected.fetch_add(1, Ordering::Relaxed);
            let reason = match &error {
                PolicyChangeError::Invalid(spec_error) => spec_error.to_string(),
                other => other.to_string(),
            };
            tracing::warn!(key = %store.key, revision = kv.mod_revision, %reason, "policy from etcd refused; the last good policy stays in force");
            *lock(&store.last_rejected) = Some((kv.mod_revision, reason));
        }
    }
}

/// Reads the key once and applies it; the first thing a router does, so it serves with the store's policy.
pub async fn read_once(state: &RouterState, store: &EtcdPolicyWatch) -> Result<i64, EtcdError> {
    let range = store.client.get(&store.key).await;
    let range = match range {
        Ok(range) => range,
        Err(error) => {
            store.set_error(Some(error.to_string()));
            return Err(error);
        }
    };
    store.set_error(None);
    match &range.kv {
        Some(kv) => consider(state, store, kv).await,
        None => {
            tracing::warn!(key = %store.key, "the policy key does not exist in etcd yet; keeping the policy in force")
        }
    }
    Ok(range.revision)
}

/// Watches the key until shutdown, reconnecting with backoff (`etcd_sessions.rs`).
pub async fn run(state: Arc<RouterState>, store: Arc<EtcdPolicyWatch>) {
    etcd_sessions::run(&state.shutdown, &PolicySessions { state: &state, store: &store }).await;
}

/// The policy watcher's sessions.
struct PolicySessions<'a> {
    state: &'a RouterState,
    store: &'a EtcdPolicyWatch,
}

impl Sessions for PolicySessions<'_> {
    fn session(&self, backoff: &mut Backoff) -> impl Future<Output = Result<String, EtcdError>> + Send {
        session(self.state, self.store, backoff)
    }

    fn ended(&self, reason: String, retry_in: Duration) {
        let store = self.store;
        tracing::warn!(key = %store.key, error = %reason, ?retry_in, "etcd watch ended; keeping the policy in force and trying again");
        store.set_error(Some(reason));
        store.reconnects.fetch_add(1, Ordering::Relaxed);
    }
}

/// One session: read the key, watch from the next revision, read it again every `check_every`. Ends with
/// the reason the watch stopped (etcd cancelled it, the stream ended) or an error.
async fn session(
    state: &RouterState,
    store: &EtcdPolicyWatch,
    backoff: &mut Backoff,
) -> Result<String, EtcdError> {
    let revision = read_once(state, store).await?;
    let mut watch = store.client.watch(&store.key, revision + 1).await?;
    backoff.reset();
    let mut check =
        tokio::time::interval_at(tokio::time::Instant::now() + store.check_every, store.check_every);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            frame = watch.next() => match frame? {
                None => return Ok("etcd closed the watch stream".to_owned()),
                Some(WatchFrame::Created { .. } | WatchFrame::Progress { .. }) => store.set_error(None),
                Some(WatchFrame::Events { events, .. }) => {
                    for event in events {
                        match event {
                            WatchEvent::Put(kv) => consider(state, store, &kv).await,
                            WatchEvent::Delete { mod_revision, .. } => {
                                store.seen_revision.fetch_max(mod_revision, Ordering::Relaxed);
                                tracing::warn!(key = %store.key, revision = mod_revision, "the policy key was deleted from etcd; keeping the policy in force");
                            }
                        }
                    }
                }
                Some(WatchFrame::Canceled { compact_revision, reason }) => {
                    return Ok(match compact_revision {
                        Some(compacted) => format!("etcd compacted the key's history up to revision {compacted}; reading it again"),
                        None => format!("etcd cancelled the watch: {reason}"),
                    });
                }
            },
            _ = check.tick() => {
                read_once(state, store).await?;
            }
        }
    }
}
