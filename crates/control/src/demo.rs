//! Starting a demo fleet from the first window (`start_demo`), as `fleetdeck --demo` does at launch: the
//! app watches its replicas and reads its router, and writes its history under a fleet of its own.
//!
//! This crate does not know what a demo fleet is made of (emulated replicas, a router, traffic: the
//! `fleet-demo` crate): the binary hands it a [`DemoLauncher`], so the control crate links neither the
//! router nor the emulator's serving side.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use fleetdeck_api::{ApiError, DemoStarted, StartDemoArgs};
use tokio_util::sync::CancellationToken;

use crate::audit::Audit;
use crate::fleet::Fleet;
use crate::routers::{RouterTarget, Routers};
use crate::unix_ms_now;

/// The history fleet of a demo started from the UI.
pub const DEMO_FLEET: &str = "demo";
/// Most replicas the UI may ask the demo for.
const MAX_UI_DEMO_REPLICAS: u32 = 64;

/// A demo fleet that runs until its cancellation token fires.
#[derive(Debug, Clone)]
pub struct LaunchedDemo {
    /// Base URLs of its replicas (what the app watches).
    pub replica_urls: Vec<String>,
    /// The model its replicas serve.
    pub model: String,
    /// Its router, with the admin token file the launcher wrote.
    pub router: RouterTarget,
}

/// The future a [`DemoLauncher`] returns.
pub type LaunchFuture<'a> = Pin<Box<dyn Future<Output = Result<LaunchedDemo, String>> + Send + 'a>>;

/// Starts a demo fleet of `replicas` replicas on loopback, its router's admin token in a 0600 file in
/// `token_dir`, running until `cancel` fires.
pub trait DemoLauncher: Send + Sync {
    fn launch<'a>(
        &'a self,
        replicas: u32,
        token_dir: &'a Path,
        cancel: CancellationToken,
    ) -> LaunchFuture<'a>;
}

/// The demo started from the UI, if any. Cheap to clone.
#[derive(Clone)]
pub struct Demo {
    inner: Arc<DemoInner>,
}

struct DemoInner {
    launcher: Option<Arc<dyn DemoLauncher>>,
    /// Held across a start, so two clicks cannot start two demos.
    running: tokio::sync::Mutex<Option<DemoStarted>>,
    fleet: Fleet,
    routers: Routers,
    audit: Audit,
    token_dir: PathBuf,
    cancel: CancellationToken,
}

impl std::fmt::Debug for Demo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Demo").field("launcher", &self.inner.launcher.is_some()).finish_non_exhaustive()
    }
}

impl Demo {
    pub(crate) fn new(
        launcher: Option<Arc<dyn DemoLauncher>>,
        fleet: Fleet,
        routers: Routers,
        audit: Audit,
        token_dir: PathBuf,
        cancel: CancellationToken,
    ) -> Self {
        let running = tokio::sync::Mutex::new(None);
        Self { inner: Arc::new(DemoInner { launcher, running, fleet, routers, audit, token_dir, cancel }) }
    }

    /// Starts the demo fleet inside the running app and watches it, as `--demo` does: the first window's
    /// way to try the app without a fleet. It runs until the app stops and is not saved to the settings
    /// (its ports change every time). A second call answers with the running one.
    pub async fn start(&self, args: StartDemoArgs) -> Result<DemoStarted, ApiError> {
        if args.replicas == 0 || args.replicas > MAX_UI_DEMO_REPLICAS {
            return Err(ApiError::new(
                "bad_request",
                format!("a demo of {} replicas: pick 1 to {MAX_UI_DEMO_REPLICAS}", args.replicas),
            ));
        }
        let Some(launcher) = &self.inner.launcher else {
            return Err(ApiError::new(
                "no_demo",
                "this build of the app has no demo fleet; run `fleetdeck --demo` or add your replicas in Settings",
            ));
        };
        let mut running = self.inner.running.lock().await;
        if let Some(demo) = running.as_ref() {
            return Ok(demo.clone());
        }
        // The demo's history goes to a fleet of its own in this database: mixed into the operator's
        // fleet, its samples and pushes would pollute every later before/after comparison.
        let watched = self.inner.fleet.watched_count();
        if watched > 0 {
            return Err(ApiError::new(
                "conflict",
                format!(
                    "this app already watches {watched} replica(s); the demo starts only in an app with no fleet, \
                     so its samples never mix with a real fleet's: run `fleetdeck --demo` (its own database) instead"
                ),
            ));
        }
        let history_error = |e: fleet_store::StoreError| {
            ApiError::new("history", format!("cannot set up the demo's history: {e}"))
        };
        let store = self.inner.audit.store();
        store.create_fleet(DEMO_FLEET, unix_ms_now()).await.map_err(history_error)?;
        let demo = launcher
            .launch(args.replicas, &self.inner.token_dir, self.inner.cancel.clone())
            .await
            .map_err(|e| ApiError::new("internal", format!("the demo fleet did not start: {e}")))?;
        for url in &demo.replica_urls {
            store.assign_replica(url, &demo.model, DEMO_FLEET, unix_ms_now()).await.map_err(history_error)?;
        }
        // Only an app that watched nothing got here, and the demo starts once: nothing was written under
        // another fleet by this launch before.
        self.inner.audit.write_as(DEMO_FLEET);
        self.inner.fleet.watch_all(&demo.replica_urls);
        let router_url = demo.router.url.clone();
        self.inner.routers.add(demo.router).await;
        self.inner.routers.poll().await;
        let started = DemoStarted { replicas: demo.replica_urls, router: router_url };
        *running = Some(started.clone());
        Ok(started)
    }
}
