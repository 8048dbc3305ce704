//! The endpoints an operator added in the app (replicas, routers, Prometheus servers) and the scrape
//! interval: the settings view, adding and removing endpoints (each probed at once), and keeping them across
//! restarts in a small JSON file beside the history ([`saved`]). Router tokens never enter that file (nor
//! SQLite): each lives in its own 0600 file in the token folder, and only that file's path is written.

mod saved;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetdeck_api::{
    AddEndpointArgs, ApiError, EndpointKind, ProbeReport, RemoveEndpointArgs, RouterSetting,
    ScrapeIntervalArgs, SettingsView,
};

use crate::discovery::Discovery;
use crate::fleet::Fleet;
use crate::lock;
use crate::rollout::etcd::EtcdKeys;
use crate::routers::admin::AdminClient;
use crate::routers::{RouterTarget, Routers};
pub use saved::{
    MAX_SCRAPE_INTERVAL, MIN_SCRAPE_INTERVAL, SavedRouter, SavedSettings, token_file_for, validate_interval,
    validate_url, write_atomically,
};

/// Deadline of probing an endpoint that was just added.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError::new("bad_request", message)
}

/// What the settings are built from.
#[derive(Debug)]
pub(crate) struct SettingsParts {
    /// The settings file.
    pub path: PathBuf,
    /// The folder of the routers' token files the app writes.
    pub token_dir: PathBuf,
    /// What the file held at start.
    pub saved: SavedSettings,
    pub fleet: Fleet,
    pub routers: Routers,
    pub discovery: Discovery,
    pub etcd: EtcdKeys,
}

/// The settings. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Settings {
    inner: Arc<SettingsInner>,
}

#[derive(Debug)]
struct SettingsInner {
    path: PathBuf,
    token_dir: PathBuf,
    /// What the operator added in the app (persisted).
    saved: Mutex<SavedSettings>,
    fleet: Fleet,
    routers: Routers,
    discovery: Discovery,
    etcd: EtcdKeys,
}

impl Settings {
    pub(crate) fn new(parts: SettingsParts) -> Self {
        let SettingsParts { path, token_dir, saved, fleet, routers, discovery, etcd } = parts;
        let inner =
            SettingsInner { path, token_dir, saved: Mutex::new(saved), fleet, routers, discovery, etcd };
        Self { inner: Arc::new(inner) }
    }

    /// The settings view: every endpoint with what probing it found.
    pub async fn view(&self) -> Result<SettingsView, ApiError> {
        let rows = self.inner.fleet.rows();
        let replicas = rows
            .iter()
            .map(|r| ProbeReport {
                url: r.url.clone(),
                detected: r.engine.clone(),
                detail: r.model.clone(),
                error: match &r.scrape {
                    fleetdeck_api::ScrapeState::Error { message, .. } => Some(message.clone()),
                    _ => None,
                },
            })
            .collect();
        let sources = self.inner.routers.sources();
        let routers = self
            .inner
            .routers
            .urls()
            .into_iter()
            .map(|(url, token_file)| {
                let source = sources.iter().find(|s| s.url == url);
                RouterSetting {
                    token_file: token_file.map(|p| p.display().to_string()),
                    probe: ProbeReport {
                        url: url.clone(),
                        detected: source.and_then(|s| s.policy.as_ref()).map(|_| "fleet-router".to_owned()),
                        detail: source.and_then(|s| {
                            Some(format!("policy {} v{}", s.policy.as_ref()?, s.policy_version?))
                        }),
                        error: source.and_then(|s| s.error.clone()),
                    },
                    url,
                }
            })
            .collect();
        let prometheus = self
            .inner
            .fleet
            .prometheus()
            .urls()
            .into_iter()
            .map(|(url, error, n)| ProbeReport {
                url,
                detected: Some("prometheus".to_owned()),
                detail: Some(format!("{n} replicas")),
                error,
            })
            .collect();
        Ok(SettingsView {
            replicas,
            routers,
            prometheus,
            scrape_interval_s: self.inner.fleet.scrape_interval().as_secs_f64(),
            token_dir: self.inner.token_dir.display().to_string(),
            discovery: self.inner.discovery.views(),
            etcd: self.inner.etcd.setting(),
        })
    }

    /// Adds an endpoint, probing it at once; the report says what was found. The endpoint is
    /// kept even when the probe fails (it may come up later), and the report says why.
    pub async fn add_endpoint(&self, args: AddEndpointArgs) -> Result<ProbeReport, ApiError> {
        let url = validate_url(&args.url).map_err(bad_request)?;
        let report = match args.kind {
            EndpointKind::Replica => {
                if self.inner.fleet.watches(&url) {
                    return Err(bad_request(format!("{url} is watched already")));
                }
                let report = self.probe_replica(&url).await;
                self.inner.fleet.watch(&url);
                self.save(|s| s.replicas.push(url.clone()))?;
                report
            }
            EndpointKind::Router => {
                let token =
                    args.token.as_deref().map(str::trim).filter(|t| !t.is_empty()).ok_or_else(|| {
                        bad_request("a router needs its admin token (the one in its --admin-token-file)")
                    })?;
                let token_file = token_file_for(&self.inner.token_dir, &url);
                fleet_store::secrets::write_token_file(&token_file, token)
                    .map_err(|e| ApiError::new("token_not_saved", e.to_string()))?;
                let client = AdminClient::new(self.inner.fleet.http().clone(), &url, Some(token.into()));
                let report = match tokio::time::timeout(PROBE_TIMEOUT, client.state()).await {
                    Ok(Ok(state)) => ProbeReport {
                        url: url.clone(),
                        detected: Some("fleet-router".to_owned()),
                        detail: Some(format!(
                            "policy {} v{}, {} replicas",
                            state.policy.name,
                            state.policy.version,
                            state.replicas.len()
                        )),
                        error: None,
                    },
                    Ok(Err(e)) => {
                        ProbeReport { url: url.clone(), error: Some(e.to_string()), ..Default::default() }
                    }
                    Err(_) => ProbeReport {
                        url: url.clone(),
                        error: Some(format!("no answer within {PROBE_TIMEOUT:?}")),
                        ..Default::default()
                    },
                };
                let target = RouterTarget {
                    url: url.clone(),
                    token: None,
                    token_file: Some(token_file.clone()),
                    metrics_url: None,
                };
                self.inner.routers.add(target).await;
                self.save(|s| {
                    s.routers.retain(|r| r.url != url);
                    s.routers.push(SavedRouter { url: url.clone(), token_file: Some(token_file.clone()) });
                })?;
                self.inner.routers.poll().await;
                report
            }
            EndpointKind::Prometheus => {
                if self.inner.fleet.prometheus().contains(&url) {
                    return Err(bad_request(format!("{url} is a source already")));
                }
                let source = fleet_telemetry::prometheus::PromSource::new(
                    &url,
                    self.inner.fleet.http().clone(),
                    self.inner.fleet.limits(),
                    Duration::from_secs(30),
                );
                let report = match source.targets().await {
                    Ok(targets) => ProbeReport {
                        url: url.clone(),
                        detected: Some("prometheus".to_owned()),
                        detail: Some(format!(
                            "{} targets, {} up",
                            targets.len(),
                            targets.iter().filter(|t| t.health == "up").count()
                        )),
                        error: None,
                    },
                    Err(e) => {
                        ProbeReport { url: url.clone(), error: Some(e.to_string()), ..Default::default() }
                    }
                };
                self.inner.fleet.start_prometheus(&url);
                self.save(|s| s.prometheus.push(url.clone()))?;
                report
            }
        };
        Ok(report)
    }

    /// One scrape of `url` now: its engine and model, or why it failed.
    async fn probe_replica(&self, url: &str) -> ProbeReport {
        let mut limits = self.inner.fleet.limits();
        limits.timeout = limits.timeout.min(PROBE_TIMEOUT);
        match fleet_telemetry::scrape(self.inner.fleet.http(), url, limits).await {
            Ok(reading) => ProbeReport {
                url: url.to_owned(),
                detected: Some(reading.engine.name().to_owned()),
                detail: reading.model,
                error: None,
            },
            Err(e) => ProbeReport { url: url.to_owned(), error: Some(e.to_string()), ..Default::default() },
        }
    }

    /// Stops watching an endpoint (its history stays).
    pub async fn remove_endpoint(&self, args: RemoveEndpointArgs) -> Result<(), ApiError> {
        let url = args.url.trim().trim_end_matches('/').to_owned();
        let found = match args.kind {
            EndpointKind::Replica => self.inner.fleet.unwatch(&url),
            EndpointKind::Router => match self.inner.routers.remove(&url) {
                Some(token_file) => {
                    self.forget_token(token_file.as_deref());
                    true
                }
                None => false,
            },
            EndpointKind::Prometheus => self.inner.fleet.prometheus().remove(&url),
        };
        if !found {
            return Err(ApiError::new("not_found", format!("{url} is not configured; nothing to remove")));
        }
        self.save(|s| {
            s.replicas.retain(|u| *u != url);
            s.routers.retain(|r| r.url != url);
            s.prometheus.retain(|u| *u != url);
        })
    }

    /// Changes the scrape interval of every target (their signal windows restart).
    pub async fn set_scrape_interval(&self, args: ScrapeIntervalArgs) -> Result<(), ApiError> {
        let interval = validate_interval(args.seconds).map_err(bad_request)?;
        self.inner.fleet.set_interval(interval);
        self.save(|s| s.scrape_interval_s = Some(args.seconds))
    }

    /// Deletes a removed router's token file if the app wrote it (it lies in the app's token folder);
    /// a file the operator named with --router-token-file is theirs and stays.
    fn forget_token(&self, token_file: Option<&std::path::Path>) {
        let Some(file) = token_file else { return };
        // A file another router still reads (a settings file from before names were unique) stays.
        if self.inner.routers.urls().iter().any(|(_, other)| other.as_deref() == Some(file)) {
            return;
        }
        let ours = match (file.canonicalize(), self.inner.token_dir.canonicalize()) {
            (Ok(file), Ok(dir)) => file.starts_with(dir),
            _ => false,
        };
        if ours && let Err(error) = std::fs::remove_file(file) {
            tracing::warn!(%error, file = %file.display(), "could not delete the removed router's token file");
        }
    }

    /// Applies `change` to the saved settings and writes them.
    fn save(&self, change: impl FnOnce(&mut SavedSettings)) -> Result<(), ApiError> {
        let mut saved = lock(&self.inner.saved);
        change(&mut saved);
        saved.save(&self.inner.path).map_err(|e| ApiError::new("settings_not_saved", format!("{e:#}")))
    }
}
