//! The control crate: everything the Fleetdeck app does, with no UI and no transport.
//!
//! [`Control`] is a thin struct of handles. Each handle owns one concern's state and methods (as
//! mini-redis gives `Db` and `Handler` homes of their own), is cheap to clone, and holds clones of the few
//! handles it builds on; none knows the handles built on it, so the graph has no cycle:
//!
//! `Audit` <- `Routers` <- `Fleet` <- `Discovery`; `Routers`, `Fleet` <- `Disagg`; `EtcdKeys` <- `Rollout` <- `Canary`; `WhatIf`,
//! `Settings` and `Demo` on top (ARCHITECTURE.md has the table of what each owns and builds on).
//!
//! - [`audit`]: the SQLite history's audit side: policy versions, pushes, notes, the fleet this launch
//!   writes under, the policy history and before/after comparisons.
//! - [`routers`]: the fleet's routers: the admin API client (`routers::admin`, `/admin/policy` included),
//!   third-party routers read-only, the per-router cache a poller refreshes, and the views read from it
//!   (heat map, decisions, headroom).
//! - [`fleet`]: the watched replicas: one scrape scheduler, one batcher handing the history writer one round
//!   per scrape interval, Prometheus servers as a source, the live snapshot and a replica's history.
//! - [`pd`]: the P/D view ([`pd::Disagg`]), joining the routers' P/D counters with the replicas' figures.
//! - [`discovery`]: replicas and routers from a watched file or DNS SRV records.
//! - [`rollout`]: changing the fleet's policy: the intended spec, the editor's checks, pushes over HTTP;
//!   [`rollout::etcd`]: the fleet's policy keys in etcd; [`rollout::canary`]: the canary runner.
//! - [`whatif`]: replays of recorded traffic under a candidate, as jobs with progress.
//! - [`settings`]: endpoints added in the app, persisted beside the history (tokens in 0600 files).
//! - [`demo`]: starting a demo fleet from the first window, through a [`demo::DemoLauncher`] the
//!   binary provides (the demo itself is the `fleet-demo` crate; this crate does not know it).
//!
//! The Tauri shell and the headless HTTP server both run the UI's commands through
//! [`commands::dispatch`] (one table: command name -> handle method) and pass the results (or
//! [`fleetdeck_api::ApiError`]) through unchanged; no command logic lives in either adapter.

pub mod audit;
pub mod commands;
pub mod demo;
pub mod discovery;
pub mod fleet;
pub mod pd;
pub mod rollout;
pub mod routers;
pub mod settings;
pub mod signals;
pub mod whatif;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use fleet_store::Store;
use fleet_telemetry::ScrapeLimits;
use tokio_util::sync::CancellationToken;

pub use discovery::DiscoverySource;
/// The etcd client the app and fleet-router share (its config types are part of [`EtcdPolicyConfig`]).
pub use fleet_etcd;
pub use rollout::etcd::EtcdPolicyConfig;
pub use routers::RouterTarget;

use audit::Audit;
use demo::{Demo, DemoLauncher};
use discovery::Discovery;
use fleet::Fleet;
use pd::Disagg;
use rollout::Rollout;
use rollout::canary::Canary;
use rollout::etcd::{EtcdKey, EtcdKeys};
use rollout::intended::Intended;
use routers::Routers;
use settings::{SavedSettings, Settings};
use whatif::WhatIf;

/// How the control crate is set up.
#[derive(Clone)]
pub struct ControlConfig {
    /// Replica base URLs (or full metrics URLs) to watch.
    pub targets: Vec<String>,
    /// fleet-routers whose admin API feeds the heat map, decisions and headroom views.
    pub routers: Vec<RouterTarget>,
    /// Prometheus servers whose targets are replicas (read through PromQL).
    pub prometheus: Vec<String>,
    pub scrape_interval: Duration,
    pub limits: ScrapeLimits,
    /// The SQLite history file.
    pub db_path: PathBuf,
    /// Endpoints added in the app (default: `settings.json` beside the database).
    pub settings_path: PathBuf,
    /// Folder of the routers' 0600 token files (default: `tokens/` beside the database).
    pub token_dir: PathBuf,
    /// The only folder the what-if reads trace files from (`--trace-dir`); `None`: no trace files.
    /// A path from the API is never opened outside it.
    pub trace_dir: Option<PathBuf>,
    /// The etcd key the fleet's routers take their policy from, if they do (`--policy-etcd`).
    pub etcd_policy: Option<EtcdPolicyConfig>,
    /// Sources of replicas and routers read every scrape interval (a watched file, DNS SRV).
    pub discovery: Vec<DiscoverySource>,
    /// What starts a demo fleet when the first window asks for one; `None`: `start_demo` says the app was
    /// built without one.
    pub demo: Option<Arc<dyn DemoLauncher>>,
}

impl std::fmt::Debug for ControlConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlConfig")
            .field("targets", &self.targets)
            .field("routers", &self.routers)
            .field("prometheus", &self.prometheus)
            .field("scrape_interval", &self.scrape_interval)
            .field("db_path", &self.db_path)
            .field("trace_dir", &self.trace_dir)
            .field("etcd_policy", &self.etcd_policy)
            .field("discovery", &self.discovery)
            .field("demo", &self.demo.is_some())
            .finish_non_exhaustive()
    }
}

impl ControlConfig {
    pub fn new(targets: Vec<String>, db_path: PathBuf) -> Self {
        let dir = db_path.parent().map(PathBuf::from).unwrap_or_default();
        Self {
            targets,
            routers: Vec::new(),
            prometheus: Vec::new(),
            scrape_interval: Duration::from_secs(1),
            limits: ScrapeLimits::default(),
            settings_path: dir.join("settings.json"),
            token_dir: dir.join("tokens"),
            trace_dir: None,
            etcd_policy: None,
            discovery: Vec::new(),
            demo: None,
            db_path,
        }
    }
}

/// The app's core, shared by the Tauri shell and the headless server: one handle per concern. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct Control {
    audit: Audit,
    routers: Routers,
    fleet: Fleet,
    disagg: Disagg,
    discovery: Discovery,
    rollout: Rollout,
    etcd: EtcdKeys,
    canary: Canary,
    whatif: WhatIf,
    settings: Settings,
    demo: Demo,
}

impl Control {
    /// Opens the history and starts scraping `config.targets` (plus what the settings file
    /// adds) and reading the routers, until `cancel` fires.
    pub async fn start(config: ControlConfig, cancel: CancellationToken) -> Result<Self> {
        if let Some(dir) = config.db_path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| {
                format!("cannot create the folder {} for the history database", dir.display())
            })?;
        }
        let saved = SavedSettings::load(&config.settings_path)?;
        let store = Store::open(&config.db_path).await?;
        // Downsampling and retention run beside ingestion until the app stops.
        store.spawn_maintenance(fleet_store::MaintenanceConfig::default(), cancel.clone().cancelled_owned());
        let http = reqwest::Client::builder()
            .connect_timeout(config.limits.timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            // Scrapes, admin calls (with their tokens) and Prometheus queries stay on the URL's origin.
            .redirect(fleet_telemetry::scrape::same_origin_redirects())
            .build()
            .context("cannot build the app's HTTP client")?;
        let interval = match saved.scrape_interval_s {
            Some(s) => settings::validate_interval(s).map_err(anyhow::Error::msg)?,
            None => config.scrape_interval,
        };
        let etcd = match &config.etcd_policy {
            Some(etcd) => Some(EtcdKey::new(etcd).context("invalid --policy-etcd")?),
            None => None,
        };

        let audit = Audit::new(store.clone());
        let routers = Routers::new(http.clone(), audit.clone());
        for target in config.routers.iter().cloned().chain(saved.router_targets()) {
            if !routers.contains(&target.url) {
                routers.add(target).await;
            }
        }
        routers.spawn_poller(cancel.clone());
        let fleet = Fleet::start(
            fleet::FleetParts {
                store,
                http,
                limits: config.limits,
                interval,
                db_path: config.db_path.display().to_string(),
                audit: audit.clone(),
                routers: routers.clone(),
            },
            cancel.clone(),
        );
        fleet.watch_all(config.targets.iter().chain(&saved.replicas));
        for url in config.prometheus.iter().chain(&saved.prometheus) {
            if !fleet.prometheus().contains(url) {
                fleet.start_prometheus(url);
            }
        }
        let disagg = Disagg::new(routers.clone(), fleet.clone());
        let discovery = Discovery::new(fleet.clone(), routers.clone(), cancel.clone());
        for source in config.discovery {
            discovery.start(source);
        }
        let intended = Intended::new(audit.clone());
        let etcd = EtcdKeys::new(etcd, routers.clone(), audit.clone(), intended.clone());
        let rollout = Rollout::new(routers.clone(), audit.clone(), etcd.clone(), intended);
        let canary = Canary::new(rollout.clone(), cancel.clone());
        let whatif = WhatIf::new(whatif::WhatIfParts {
            routers: routers.clone(),
            fleet: fleet.clone(),
            rollout: rollout.clone(),
            trace_dir: config.trace_dir,
        });
        let settings = Settings::new(settings::SettingsParts {
            path: config.settings_path,
            token_dir: config.token_dir.clone(),
            saved,
            fleet: fleet.clone(),
            routers: routers.clone(),
            discovery: discovery.clone(),
            etcd: etcd.clone(),
        });
        let demo =
            Demo::new(config.demo, fleet.clone(), routers.clone(), audit.clone(), config.token_dir, cancel);
        Ok(Self { audit, routers, fleet, disagg, discovery, rollout, etcd, canary, whatif, settings, demo })
    }

    /// The audit trail: policy versions, pushes, notes, history comparisons.
    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    /// The fleet's routers, their cached states and the views read from them.
    pub fn routers(&self) -> &Routers {
        &self.routers
    }

    /// The watched replicas: scraping, history writing, the live snapshot.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// The P/D view: roles, split decisions over time, TTFT by leg.
    pub fn disagg(&self) -> &Disagg {
        &self.disagg
    }

    /// Replicas and routers from discovery sources.
    pub fn discovery(&self) -> &Discovery {
        &self.discovery
    }

    /// The policy editor's checks, pushes and the fleet's etcd key.
    pub fn rollout(&self) -> &Rollout {
        &self.rollout
    }

    /// The fleet's policy keys in etcd.
    pub fn etcd(&self) -> &EtcdKeys {
        &self.etcd
    }

    /// The canary runner.
    pub fn canary(&self) -> &Canary {
        &self.canary
    }

    /// What-if replays.
    pub fn whatif(&self) -> &WhatIf {
        &self.whatif
    }

    /// Endpoints added in the app and the scrape interval.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The demo fleet started from the first window.
    pub fn demo(&self) -> &Demo {
        &self.demo
    }
}

/// Locks a mutex of the control state, through poisoning: every such state is replaced in whole
/// assignments, so a panic elsewhere cannot leave it torn, and one panicked task must not take the app down.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The app's clock for records and views: Unix milliseconds (one definition, in fleet-base).
pub use fleet_base::time::{unix_ms, unix_ms_now};
