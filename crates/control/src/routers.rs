//! The fleet-routers the app reads: their admin clients, the last state each reported (the
//! per-router cache the heat map reads), and the policy changes seen while polling them.
//!
//! A poller asks every router for `/admin/state` once per [`POLL_EVERY`], all at once, each
//! call bounded; a router that fails keeps its last good state beside the error.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use fleet_store::Store;
use fleet_store::secrets::Secret;
use fleetdeck_api::{PolicyMarker, RouterSource};

use crate::admin::{AdminClient, RouterState};
use crate::fleet::unix_ms_now;

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
}

/// Every router the app reads. Shared by all views.
#[derive(Debug)]
pub struct Routers {
    http: reqwest::Client,
    entries: Mutex<Vec<Entry>>,
    markers: Mutex<Vec<PolicyMarker>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Routers {
    pub(crate) async fn new(http: reqwest::Client, targets: Vec<RouterTarget>, store: &Store) -> Self {
        let routers = Self { http, entries: Mutex::new(Vec::new()), markers: Mutex::new(Vec::new()) };
        for target in targets {
            routers.add(target, store).await;
        }
        routers
    }

    /// Adds (or replaces) a router and records it in the audit trail with its token file.
    pub(crate) async fn add(&self, target: RouterTarget, store: &Store) {
        let (token, token_error) = match (&target.token, &target.token_file) {
            (Some(token), _) => (Some(token.clone()), None),
            (None, Some(path)) => match fleet_store::secrets::read_token_file(path) {
                Ok(token) => (Some(token), None),
                Err(e) => (None, Some(e.to_string())),
            },
            (None, None) => (None, None),
        };
        if let Err(error) =
            store.register_router(fleet_store::DEFAULT_FLEET, &target.url, target.token_file.as_deref()).await
        {
            tracing::warn!(%error, url = %target.url, "could not record the router in the history");
        }
        let entry = Entry {
            client: AdminClient::new(self.http.clone(), &target.url, token),
            token_file: target.token_file,
            token_error,
            state: None,
            error: None,
            seen: None,
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
        let clients: Vec<(AdminClient, Option<String>)> =
            lock(&self.entries).iter().map(|e| (e.client.clone(), e.token_error.clone())).collect();
        let results =
            futures_util::future::join_all(clients.iter().map(|(client, token_error)| async move {
                match token_error {
                    Some(e) => Err(e.clone()),
                    None => client.state().await.map_err(|e| e.to_string()),
                }
            }))
            .await;
        let now_ms = unix_ms_now();
        let mut new_markers = Vec::new();
        {
            let mut entries = lock(&self.entries);
            for ((client, _), result) in clients.iter().zip(results) {
                let Some(entry) = entries.iter_mut().find(|e| e.client.url == client.url) else { continue };
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
            .map(|e| RouterSource {
                url: e.client.url.clone(),
                error: e.error.clone().or_else(|| {
                    e.state.is_none().then(|| "waiting for the first answer from this router".to_owned())
                }),
                policy: e.state.as_ref().map(|s| s.policy.name.clone()),
                policy_version: e.state.as_ref().map(|s| s.policy.version),
            })
            .collect()
    }

    /// The last good state of every router that has answered.
    pub(crate) fn states(&self) -> Vec<RouterState> {
        lock(&self.entries).iter().filter_map(|e| e.state.clone()).collect()
    }

    /// Each router's client with its replica names (id -> URL) from its last state.
    pub(crate) fn clients(&self) -> Vec<(AdminClient, HashMap<String, String>)> {
        lock(&self.entries)
            .iter()
            .map(|e| (e.client.clone(), e.state.as_ref().map(RouterState::urls_by_id).unwrap_or_default()))
            .collect()
    }

    /// Policy changes seen since `since_ms`.
    pub(crate) fn markers_since(&self, since_ms: i64) -> Vec<PolicyMarker> {
        lock(&self.markers).iter().filter(|m| m.ts_ms >= since_ms).cloned().collect()
    }
}
