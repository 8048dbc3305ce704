//! The fleet-routers the app reads: their admin clients, the last state each reported (the
//! per-router cache the heat map reads), and the policy changes seen while polling them.
//!
//! A poller asks every router for `/admin/state` once per [`POLL_EVERY`], all at once, each
//! call bounded; a router that fails keeps its last good state beside the error. A URL whose admin
//! API is missing but whose `/workers` is SGLang's SMG or vllm-router's is read as that router instead
//! (`third_party`): its workers and own metrics, read-only.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use fleet_store::Store;
use fleet_store::secrets::Secret;
use fleetdeck_api::{PolicyMarker, RouterSource, RouterWorker};

use crate::admin::{AdminClient, AdminError, RouterState};
use crate::fleet::unix_ms_now;
use crate::lock;
use crate::third_party::{self, PeerKind, PeerState};

/// How often every router's state is refreshed.
pub const POLL_EVERY: Duration = Duration::from_secs(1);
/// Policy changes kept in memory (the audit trail keeps the rest).
const MAX_MARKERS: usize = 1000;

/// A router to read, with its admin token (a [`Secret`], never logged) or the 0600 file holding it.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct RouterTarget {
    pub url: String,
    pub token: Option<Secret>,
    pub token_file: Option<PathBuf>,
    /// A third-party router's Prometheus endpoint (its `--prometheus-port`), where its policy and counts are.
    pub metrics_url: Option<String>,
}

#[derive(Debug)]
struct Entry {
    client: AdminClient,
    token_file: Option<PathBuf>,
    /// Why the token could not be read, if so (reported instead of calling the router).
    token_error: Option<String>,
    state: Option<RouterState>,
    error: Option<String>,
    /// The policy last seen, to notice changes.
    seen: Option<(String, u64)>,
    metrics_url: Option<String>,
    /// Set once the URL answered as a third-party router, with what it said last.
    peer_kind: Option<PeerKind>,
    peer: Option<PeerState>,
}

/// What one poll of one router gave.
enum Polled {
    Fleet(Result<RouterState, String>),
    Peer(PeerKind, Result<PeerState, String>),
}

/// Whether a failed admin call may mean "not a fleet-router" (then its `/workers` is asked).
fn maybe_third_party(error: &AdminError) -> bool {
    matches!(
        error,
        AdminError::NoToken { .. }
            | AdminError::AdminDisabled { .. }
            | AdminError::Unauthorized { .. }
            | AdminError::Status { status: 404 | 405, .. }
            | AdminError::BadBody { .. }
    )
}

/// Every router the app reads. Shared by all views.
#[derive(Debug)]
pub struct Routers {
    http: reqwest::Client,
    entries: Mutex<Vec<Entry>>,
    markers: Mutex<Vec<PolicyMarker>>,
}

impl Routers {
    pub(crate) async fn new(
        http: reqwest::Client,
        targets: Vec<RouterTarget>,
        store: &Store,
        fleet: &str,
    ) -> Self {
        let routers = Self { http, entries: Mutex::new(Vec::new()), markers: Mutex::new(Vec::new()) };
        for target in targets {
            routers.add(target, store, fleet).await;
        }
        routers
    }

    /// Adds (or replaces) a router and records it in `fleet`'s audit trail with its token file.
    pub(crate) async fn add(&self, target: RouterTarget, store: &Store, fleet: &str) {
        let (token, token_error) = match (&target.token, &target.token_file) {
            (Some(token), _) => (Some(token.clone()), None),
            (None, Some(path)) => match fleet_store::secrets::read_token_file(path) {
                Ok(token) => (Some(token), None),
                Err(e) => (None, Some(e.to_string())),
            },
            (None, None) => (None, None),
        };
        if let Err(error) = store.register_router(fleet, &target.url, target.token_file.as_deref()).await {
            tracing::warn!(%error, url = %target.url, "could not record the router in the history");
        }
        let entry = Entry {
            client: AdminClient::new(self.http.clone(), &target.url, token),
            token_file: target.token_file,
            token_error,
            state: None,
            error: None,
            seen: None,
            metrics_url: target.metrics_url,
            peer_kind: None,
            peer: None,
        };
        let mut entries = lock(&self.entries);
        entries.retain(|e| e.client.url != entry.client.url);
        entries.push(entry);
    }

    /// Stops reading router `url`. `None`: it was not configured; else the token file it used.
    pub(crate) fn remove(&self, url: &str) -> Option<Option<PathBuf>> {
        let mut entries = lock(&self.entries);
        let index = entries.iter().position(|e| e.client.url == url.trim_end_matches('/'))?;
        Some(entries.remove(index).token_file)
    }

    pub(crate) fn urls(&self) -> Vec<(String, Option<PathBuf>)> {
        lock(&self.entries).iter().map(|e| (e.client.url.clone(), e.token_file.clone())).collect()
    }

    /// Refreshes every router's state once, concurrently.
    pub(crate) async fn poll(&self) {
        type Job = (AdminClient, Option<String>, Option<PeerKind>, Option<String>);
        let clients: Vec<Job> = lock(&self.entries)
            .iter()
            .map(|e| (e.client.clone(), e.token_error.clone(), e.peer_kind, e.metrics_url.clone()))
            .collect();
        let http = &self.http;
        let results = futures_util::future::join_all(clients.iter().map(
            |(client, token_error, peer_kind, metrics_url)| async move {
                let metrics_url = metrics_url.as_deref();
                if let Some(kind) = peer_kind {
                    return Polled::Peer(
                        *kind,
                        third_party::probe(http, *kind, &client.url, metrics_url).await,
                    );
                }
                let error = match token_error {
                    Some(e) => return Polled::Fleet(Err(e.clone())),
                    None => match client.state().await {
                        Ok(state) => return Polled::Fleet(Ok(state)),
                        Err(error) => error,
                    },
                };
                if maybe_third_party(&error)
                    && let Some(kind) = third_party::detect_at(http, &client.url).await
                {
                    return Polled::Peer(
                        kind,
                        third_party::probe(http, kind, &client.url, metrics_url).await,
                    );
                }
                Polled::Fleet(Err(error.to_string()))
            },
        ))
        .await;
        let now_ms = unix_ms_now();
        let mut new_markers = Vec::new();
        {
            let mut entries = lock(&self.entries);
            for ((client, ..), result) in clients.iter().zip(results) {
                let Some(entry) = entries.iter_mut().find(|e| e.client.url == client.url) else { continue };
                let result = match result {
                    Polled::Fleet(result) => result,
                    Polled::Peer(kind, result) => {
                        entry.peer_kind = Some(kind);
                        match result {
                            Ok(peer) => {
                                entry.peer = Some(peer);
                                entry.error = None;
                            }
                            Err(error) => entry.error = Some(error),
                        }
                        continue;
                    }
                };
                match result {
                    Ok(state) => {
                        let policy = (state.policy.name.clone(), state.policy.version);
                        if entry.seen.as_ref().is_some_and(|seen| *seen != policy) {
                            new_markers.push(PolicyMarker {
                                ts_ms: now_ms,
                                label: format!("{} v{} on {}", policy.0, policy.1, client.url),
                            });
                        }
                        entry.seen = Some(policy);
                        entry.state = Some(state);
                        entry.error = None;
                    }
                    Err(error) => entry.error = Some(error),
                }
            }
        }
        if !new_markers.is_empty() {
            let mut markers = lock(&self.markers);
            markers.extend(new_markers);
            let excess = markers.len().saturating_sub(MAX_MARKERS);
            markers.drain(..excess);
        }
    }

    /// Where each router stands, for the views' source lines.
    pub(crate) fn sources(&self) -> Vec<RouterSource> {
        lock(&self.entries)
            .iter()
            .map(|e| {
                let answered = e.state.is_some() || e.peer.is_some();
                let mut source = RouterSource {
                    url: e.client.url.clone(),
                    error: e.error.clone().or_else(|| {
                        (!answered).then(|| "waiting for the first answer from this router".to_owned())
                    }),
                    policy: e.state.as_ref().map(|s| s.policy.name.clone()),
                    policy_version: e.state.as_ref().map(|s| s.policy.version),
                    kind: if e.state.is_some() { "fleet-router".to_owned() } else { String::new() },
                    read_only: None,
                    workers: Vec::new(),
                    requests_total: None,
                    errors_total: None,
                };
                if let Some(kind) = e.peer_kind {
                    source.kind = kind.name().to_owned();
                    source.read_only = Some(kind.read_only_reason());
                }
                if let Some(peer) = &e.peer {
                    source.policy = peer.policy.clone();
                    source.workers = peer
                        .workers
                        .iter()
                        .map(|w| RouterWorker { url: w.url.clone(), healthy: w.healthy, load: w.load })
                        .collect();
                    source.requests_total = peer.requests_total;
                    source.errors_total = peer.errors_total;
                    if let (None, Some(note)) = (&source.error, &peer.metrics_error) {
                        source.read_only = Some(format!("{}; {note}", peer.kind.read_only_reason()));
                    }
                }
                source
            })
            .collect()
    }

    /// The last good state of every router that has answered.
    pub(crate) fn states(&self) -> Vec<RouterState> {
        lock(&self.entries).iter().filter_map(|e| e.state.clone()).collect()
    }

    /// Each router's client with its replica names (id -> URL) from its last state.
    pub(crate) fn clients(&self) -> Vec<(AdminClient, HashMap<String, String>)> {
        // Third-party routers have no admin API: decisions, traces and pushes skip them.
        lock(&self.entries)
            .iter()
            .filter(|e| e.peer_kind.is_none())
            .map(|e| (e.client.clone(), e.state.as_ref().map(RouterState::urls_by_id).unwrap_or_default()))
            .collect()
    }

    /// Policy changes seen since `since_ms`.
    pub(crate) fn markers_since(&self, since_ms: i64) -> Vec<PolicyMarker> {
        lock(&self.markers).iter().filter(|m| m.ts_ms >= since_ms).cloned().collect()
    }
}
