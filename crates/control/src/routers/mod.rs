//! The fleet-routers the app reads: their admin clients, the last state each reported (the
//! per-router cache the heat map reads), the policy changes seen while polling them, and the views read
//! from the routers (heat map, decisions, headroom).
//!
//! A poller asks every router for `/admin/state` once per [`POLL_EVERY`], all at once, each
//! call bounded; a router that fails keeps its last good state beside the error. A URL whose admin
//! API is missing but whose `/workers` is SGLang's SMG or vllm-router's is read as that router instead
//! (`third_party`): its workers and own metrics, read-only.

pub mod admin;
pub mod agreement;
pub mod headroom;
pub mod heat;
pub mod third_party;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_store::secrets::Secret;
use fleetdeck_api::{
    ApiError, DecisionLog, DecisionsArgs, Headroom, HeadroomArgs, HeatMap, HeatMapArgs, IndexAccuracy,
    PolicyMarker, RouterSource, RouterWorker,
};
use tokio_util::sync::CancellationToken;

use crate::audit::Audit;
use crate::{lock, unix_ms_now};
use admin::{ActivePolicy, AdminClient, AdminError, RouterState};
use third_party::{PeerKind, PeerState};

/// How often every router's state is refreshed.
pub const POLL_EVERY: Duration = Duration::from_secs(1);
/// Policy changes kept in memory (the audit trail keeps the rest).
const MAX_MARKERS: usize = 1000;
/// How long each router's P/D counters are kept, one reading per poll, for the P/D view's windows.
pub const PD_KEPT: Duration = Duration::from_secs(15 * 60);

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
    /// The router's cumulative P/D counters at each poll of the last [`PD_KEPT`], oldest first.
    pd_samples: std::collections::VecDeque<(i64, admin::PdCounters)>,
    /// The same for a third-party router's own P/D figures.
    peer_pd_samples: std::collections::VecDeque<(i64, third_party::PeerPd)>,
}

/// Appends a reading and drops those older than [`PD_KEPT`].
fn keep_sample<T>(samples: &mut std::collections::VecDeque<(i64, T)>, now_ms: i64, reading: T) {
    samples.push_back((now_ms, reading));
    let oldest = now_ms - PD_KEPT.as_millis() as i64;
    while samples.front().is_some_and(|(at, _)| *at < oldest) {
        samples.pop_front();
    }
}

/// The readings since `since_ms`, with one before the window so that its first increase is counted.
fn samples_since<T: Clone>(samples: &std::collections::VecDeque<(i64, T)>, since_ms: i64) -> Vec<(i64, T)> {
    let first = samples.iter().rposition(|(at, _)| *at < since_ms).unwrap_or(0);
    samples.iter().skip(first).cloned().collect()
}

/// A third-party router's P/D readings over a window.
#[derive(Debug, Clone)]
pub struct PeerPdSamples {
    pub url: String,
    /// Its kind's name (`smg`).
    pub kind: String,
    /// Cumulative readings, oldest first, with one before the window.
    pub samples: Vec<(i64, third_party::PeerPd)>,
}

/// What one poll of one router gave.
enum Polled {
    /// Boxed, both: a fleet-router's state and a peer's (with its P/D histograms) are large.
    Fleet(Result<Box<RouterState>, String>),
    Peer(PeerKind, Result<Box<PeerState>, String>),
}

/// Whether a failed admin call may mean "not a fleet-router" (then its `/workers`, else its metrics, tell).
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

/// Every router the app reads, shared by all views. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Routers {
    inner: Arc<RoutersInner>,
}

#[derive(Debug)]
struct RoutersInner {
    http: reqwest::Client,
    entries: Mutex<Vec<Entry>>,
    markers: Mutex<Vec<PolicyMarker>>,
    audit: Audit,
}

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError::new("bad_request", message)
}

impl Routers {
    pub(crate) fn new(http: reqwest::Client, audit: Audit) -> Self {
        let inner = RoutersInner { http, entries: Mutex::default(), markers: Mutex::default(), audit };
        Self { inner: Arc::new(inner) }
    }

    /// Refreshes every router's state once per [`POLL_EVERY`] until `cancel` fires. The poller holds only a
    /// weak handle, so it never keeps dropped routers alive.
    pub(crate) fn spawn_poller(&self, cancel: CancellationToken) {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                Routers { inner }.poll().await;
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(POLL_EVERY) => {}
                }
            }
        });
    }

    /// Adds (or replaces) a router and records it in the audit trail with its token file.
    pub(crate) async fn add(&self, target: RouterTarget) {
        let (token, token_error) = match (&target.token, &target.token_file) {
            (Some(token), _) => (Some(token.clone()), None),
            (None, Some(path)) => match fleet_store::secrets::read_token_file(path) {
                Ok(token) => (Some(token), None),
                Err(e) => (None, Some(e.to_string())),
            },
            (None, None) => (None, None),
        };
        self.inner.audit.register_router(&target.url, target.token_file.as_deref()).await;
        let entry = Entry {
            client: AdminClient::new(self.inner.http.clone(), &target.url, token),
            token_file: target.token_file,
            token_error,
            state: None,
            error: None,
            seen: None,
            metrics_url: target.metrics_url,
            peer_kind: None,
            peer: None,
            pd_samples: Default::default(),
            peer_pd_samples: Default::default(),
        };
        let mut entries = lock(&self.inner.entries);
        entries.retain(|e| e.client.url != entry.client.url);
        entries.push(entry);
    }

    /// Whether router `url` is read.
    pub(crate) fn contains(&self, url: &str) -> bool {
        let url = url.trim_end_matches('/');
        lock(&self.inner.entries).iter().any(|e| e.client.url == url)
    }

    /// Stops reading router `url`. `None`: it was not configured; else the token file it used.
    pub(crate) fn remove(&self, url: &str) -> Option<Option<PathBuf>> {
        let mut entries = lock(&self.inner.entries);
        let index = entries.iter().position(|e| e.client.url == url.trim_end_matches('/'))?;
        Some(entries.remove(index).token_file)
    }

    pub(crate) fn urls(&self) -> Vec<(String, Option<PathBuf>)> {
        lock(&self.inner.entries).iter().map(|e| (e.client.url.clone(), e.token_file.clone())).collect()
    }

    /// Refreshes every router's state once, concurrently.
    pub(crate) async fn poll(&self) {
        type Job = (AdminClient, Option<String>, Option<PeerKind>, Option<String>);
        let clients: Vec<Job> = lock(&self.inner.entries)
            .iter()
            .map(|e| (e.client.clone(), e.token_error.clone(), e.peer_kind, e.metrics_url.clone()))
            .collect();
        let http = &self.inner.http;
        let results = futures_util::future::join_all(clients.iter().map(
            |(client, token_error, peer_kind, metrics_url)| async move {
                let metrics_url = metrics_url.as_deref();
                if let Some(kind) = peer_kind {
                    return Polled::Peer(
                        *kind,
                        third_party::probe(http, *kind, &client.url, metrics_url).await.map(Box::new),
                    );
                }
                let error = match token_error {
                    Some(e) => return Polled::Fleet(Err(e.clone())),
                    None => match client.state().await {
                        Ok(state) => return Polled::Fleet(Ok(Box::new(state))),
                        Err(error) => error,
                    },
                };
                if maybe_third_party(&error)
                    && let Some(kind) = third_party::detect_at(http, &client.url, metrics_url).await
                {
                    return Polled::Peer(
                        kind,
                        third_party::probe(http, kind, &client.url, metrics_url).await.map(Box::new),
                    );
                }
                Polled::Fleet(Err(error.to_string()))
            },
        ))
        .await;
        let now_ms = unix_ms_now();
        let mut new_markers = Vec::new();
        {
            let mut entries = lock(&self.inner.entries);
            for ((client, ..), result) in clients.iter().zip(results) {
                let Some(entry) = entries.iter_mut().find(|e| e.client.url == client.url) else { continue };
                let result = match result {
                    Polled::Fleet(result) => result.map(|state| *state),
                    Polled::Peer(kind, result) => {
                        entry.peer_kind = Some(kind);
                        match result {
                            Ok(peer) => {
                                if let Some(pd) = &peer.pd {
                                    keep_sample(&mut entry.peer_pd_samples, now_ms, pd.clone());
                                }
                                entry.peer = Some(*peer);
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
                        if let Some(pd) = &state.pd {
                            keep_sample(&mut entry.pd_samples, now_ms, pd.clone());
                        }
                        entry.state = Some(state);
                        entry.error = None;
                    }
                    Err(error) => entry.error = Some(error),
                }
            }
        }
        if !new_markers.is_empty() {
            let mut markers = lock(&self.inner.markers);
            markers.extend(new_markers);
            let excess = markers.len().saturating_sub(MAX_MARKERS);
            markers.drain(..excess);
        }
    }

    /// Where each router stands, for the views' source lines.
    pub(crate) fn sources(&self) -> Vec<RouterSource> {
        lock(&self.inner.entries)
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
                    index_accuracy: e.state.as_ref().and_then(|s| s.index_accuracy).map(|counts| {
                        IndexAccuracy { predictions: counts.predictions, within_block: counts.within_block }
                    }),
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
        lock(&self.inner.entries).iter().filter_map(|e| e.state.clone()).collect()
    }

    /// The last state of every router that answered, with the router's URL.
    pub(crate) fn states_by_router(&self) -> Vec<(String, RouterState)> {
        lock(&self.inner.entries)
            .iter()
            .filter_map(|e| Some((e.client.url.clone(), e.state.clone()?)))
            .collect()
    }

    /// Each fleet-router's P/D counters since `since_ms`, oldest first, by router URL.
    pub(crate) fn pd_samples_since(&self, since_ms: i64) -> Vec<(String, Vec<(i64, admin::PdCounters)>)> {
        lock(&self.inner.entries)
            .iter()
            .filter(|e| !e.pd_samples.is_empty())
            .map(|e| (e.client.url.clone(), samples_since(&e.pd_samples, since_ms)))
            .collect()
    }

    /// Each third-party router's own P/D figures since `since_ms`, oldest first: (URL, kind, readings).
    pub(crate) fn peer_pd_samples_since(&self, since_ms: i64) -> Vec<PeerPdSamples> {
        lock(&self.inner.entries)
            .iter()
            .filter(|e| !e.peer_pd_samples.is_empty())
            .map(|e| PeerPdSamples {
                url: e.client.url.clone(),
                kind: e.peer_kind.map_or("peer", PeerKind::name).to_owned(),
                samples: samples_since(&e.peer_pd_samples, since_ms),
            })
            .collect()
    }

    /// The workers third-party routers list, with the P/D role they give each.
    pub(crate) fn peer_workers(&self) -> Vec<third_party::PeerWorker> {
        lock(&self.inner.entries)
            .iter()
            .filter_map(|e| e.peer.as_ref())
            .flat_map(|p| p.workers.clone())
            .collect()
    }

    /// Each router's client with its replica names (id -> URL) from its last state.
    pub(crate) fn clients(&self) -> Vec<(AdminClient, HashMap<String, String>)> {
        // Third-party routers have no admin API: decisions, traces and pushes skip them.
        lock(&self.inner.entries)
            .iter()
            .filter(|e| e.peer_kind.is_none())
            .map(|e| (e.client.clone(), e.state.as_ref().map(RouterState::urls_by_id).unwrap_or_default()))
            .collect()
    }

    /// Policy changes seen since `since_ms`.
    pub(crate) fn markers_since(&self, since_ms: i64) -> Vec<PolicyMarker> {
        lock(&self.inner.markers).iter().filter(|m| m.ts_ms >= since_ms).cloned().collect()
    }

    /// The admin clients of every fleet-router (third-party routers have no admin API).
    pub(crate) fn admin_clients(&self) -> Vec<AdminClient> {
        self.clients().into_iter().map(|(client, _)| client).collect()
    }

    /// Each router's client by URL, or an error naming the routers there are.
    pub(crate) fn clients_for(&self, urls: &[String]) -> Result<Vec<AdminClient>, ApiError> {
        let known = self.admin_clients();
        let mut chosen = Vec::new();
        for url in urls {
            let url = url.trim_end_matches('/');
            let Some(client) = known.iter().find(|c| c.url == url) else {
                let names: Vec<&str> = known.iter().map(|c| c.url.as_str()).collect();
                return Err(ApiError::new(
                    "unknown_router",
                    format!(
                        "{url} is not one of the app's routers ({}); add it in Settings first",
                        if names.is_empty() { "none yet".to_owned() } else { names.join(", ") }
                    ),
                ));
            };
            if !chosen.iter().any(|c: &AdminClient| c.url == client.url) {
                chosen.push(client.clone());
            }
        }
        Ok(chosen)
    }

    /// Every router's active policy, read now and concurrently: `(url, policy or why not)`.
    pub(crate) async fn read_policies(&self) -> Vec<(String, Result<ActivePolicy, String>)> {
        let clients = self.admin_clients();
        let results = futures_util::future::join_all(clients.iter().map(AdminClient::policy)).await;
        clients.into_iter().map(|c| c.url).zip(results).collect()
    }

    /// Replicas the routers tag `role=prefill` (each URL once).
    pub(crate) fn prefill_replica_count(&self) -> u32 {
        let mut urls: Vec<String> = self
            .states()
            .iter()
            .flat_map(|s| s.replicas.iter().filter(|r| r.role == "prefill").map(|r| r.url.clone()))
            .collect();
        urls.sort();
        urls.dedup();
        urls.len() as u32
    }

    /// The replica URLs the routers route to, sorted and without repeats.
    pub(crate) fn replica_urls(&self) -> Vec<String> {
        let mut urls: Vec<String> =
            self.states().iter().flat_map(|s| s.replicas.iter().map(|r| r.url.clone())).collect();
        urls.sort();
        urls.dedup();
        urls
    }

    /// Replicas x prefix groups from every router's last state, with hotspots.
    pub async fn heat_map(&self, args: HeatMapArgs) -> Result<HeatMap, ApiError> {
        if !(args.hotspot_share > 0.0 && args.hotspot_share <= 1.0) {
            return Err(bad_request(format!(
                "hotspot_share is {}; give a share of traffic between 0 (exclusive) and 1, e.g. 0.3",
                args.hotspot_share
            )));
        }
        let mut map = heat::build(&self.states(), self.sources(), args.hotspot_share, unix_ms_now());
        let states = self.states_by_router();
        map.load_agreement = agreement::build(&states);
        map.prefix_placement = agreement::prefix_placement(&states);
        Ok(map)
    }

    /// The newest decisions of every router, newest first.
    pub async fn decisions(&self, args: DecisionsArgs) -> Result<DecisionLog, ApiError> {
        if !(1..=500).contains(&args.limit) {
            return Err(bad_request(format!("limit is {}; ask for 1 to 500 decisions", args.limit)));
        }
        let clients = self.clients();
        let results = futures_util::future::join_all(
            clients.iter().map(|(client, urls)| async move { client.decisions(args.limit, urls).await }),
        )
        .await;
        let mut sources = self.sources();
        let mut decisions = Vec::new();
        for ((client, _), result) in clients.iter().zip(results) {
            match result {
                Ok(mut list) => decisions.append(&mut list),
                Err(error) => {
                    if let Some(source) = sources.iter_mut().find(|s| s.url == client.url) {
                        source.error = Some(error.to_string());
                    }
                }
            }
        }
        decisions.sort_by_key(|d| std::cmp::Reverse(d.ts_ms));
        decisions.truncate(args.limit as usize);
        Ok(DecisionLog { now_ms: unix_ms_now(), routers: sources, decisions })
    }

    /// Achieved vs achievable hit rate per model over the routers' recorded traffic.
    pub async fn headroom(&self, args: HeadroomArgs) -> Result<Headroom, ApiError> {
        if !(10..=86_400).contains(&args.window_s) {
            return Err(bad_request(format!("window_s is {}; pick 10 to 86400 seconds", args.window_s)));
        }
        let now_ms = unix_ms_now();
        let since = now_ms - i64::from(args.window_s) * 1000;
        let clients = self.admin_clients();
        let results =
            futures_util::future::join_all(clients.iter().map(|client| client.trace_since(since))).await;
        let mut sources = self.sources();
        let mut records = Vec::new();
        for (client, result) in clients.iter().zip(results) {
            match result {
                Ok(mut list) => records.append(&mut list),
                Err(error) => {
                    if let Some(source) = sources.iter_mut().find(|s| s.url == client.url) {
                        source.error = Some(error.to_string());
                    }
                }
            }
        }
        // Replicas per model, as the routers know them, size the what-if fleet.
        let mut replicas: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
        for state in self.states() {
            for r in &state.replicas {
                *replicas
                    .entry(r.model.clone().unwrap_or_else(|| headroom::UNKNOWN_MODEL.to_owned()))
                    .or_default() += 1;
            }
        }
        let fallback = replicas.values().copied().max().unwrap_or(1);
        // Replays are CPU work over possibly many records: keep them off the async workers.
        let (models, mut notes) = tokio::task::spawn_blocking(move || {
            headroom::with_what_if(records, |model| replicas.get(model).copied().unwrap_or(fallback))
        })
        .await
        .map_err(|e| ApiError::new("internal", format!("the headroom computation failed: {e}")))?;
        notes.insert(
            0,
            "Pooled bound: one shared cache that never evicts, over the same requests; no routing policy can beat it."
                .to_owned(),
        );
        notes.insert(
            1,
            format!(
                "Best policy: fleet-sim's replay of the same requests under {} (default parameters), the highest hit rate.",
                headroom::WHAT_IF_POLICIES.join(", ")
            ),
        );
        if models.iter().any(|m| m.achieved.is_none()) {
            notes.push("Achieved is unknown where the routers recorded no cached-token counts.".to_owned());
        }
        Ok(Headroom { now_ms, window_s: args.window_s, routers: sources, models, notes })
    }
}
