//! The commands behind the heat map, replica detail, decisions, headroom and settings views.
//! Each validates its arguments, gathers from the routers, the history or the scrapers, and
//! answers the UI's types or an `ApiError` that says what to do.

use std::time::Duration;

use fleetdeck_api::{
    AddEndpointArgs, ApiError, DecisionLog, DecisionsArgs, EndpointKind, Headroom, HeadroomArgs, HeatMap,
    HeatMapArgs, PolicyMarker, ProbeReport, RemoveEndpointArgs, ReplicaHistory, ReplicaHistoryArgs,
    RouterSetting, ScrapeIntervalArgs, SettingsView,
};

use crate::admin::AdminClient;
use crate::fleet::{Control, unix_ms_now};
use crate::routers::RouterTarget;
use crate::settings::{SavedRouter, token_file_for, validate_interval, validate_url};
use crate::{headroom, heat};

/// Points a chart gets at most; longer windows are averaged into wider buckets.
const CHART_POINTS: i64 = 400;
/// Deadline of probing an endpoint that was just added.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError::new("bad_request", message)
}

fn history_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::new("history_unavailable", format!("{e}; check that the history database is readable"))
}

impl Control {
    /// Replicas x prefix groups from every router's last state, with hotspots.
    pub async fn heat_map(&self, args: HeatMapArgs) -> Result<HeatMap, ApiError> {
        if !(args.hotspot_share > 0.0 && args.hotspot_share <= 1.0) {
            return Err(bad_request(format!(
                "hotspot_share is {}; give a share of traffic between 0 (exclusive) and 1, e.g. 0.3",
                args.hotspot_share
            )));
        }
        let routers = &self.inner.routers;
        Ok(heat::build(&routers.states(), routers.sources(), args.hotspot_share, unix_ms_now()))
    }

    /// The newest decisions of every router, newest first.
    pub async fn decisions(&self, args: DecisionsArgs) -> Result<DecisionLog, ApiError> {
        if !(1..=500).contains(&args.limit) {
            return Err(bad_request(format!("limit is {}; ask for 1 to 500 decisions", args.limit)));
        }
        let clients = self.inner.routers.clients();
        let results = futures_util::future::join_all(
            clients.iter().map(|(client, urls)| async move { client.decisions(args.limit, urls).await }),
        )
        .await;
        let mut sources = self.inner.routers.sources();
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
        let clients: Vec<AdminClient> = self.inner.routers.clients().into_iter().map(|(c, _)| c).collect();
        let results =
            futures_util::future::join_all(clients.iter().map(|client| client.trace_since(since))).await;
        let mut sources = self.inner.routers.sources();
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
        for state in self.inner.routers.states() {
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

    /// One replica's charts over the last `window_s` seconds, with policy changes marked.
    pub async fn replica_history(&self, args: ReplicaHistoryArgs) -> Result<ReplicaHistory, ApiError> {
        if !(60..=90 * 86_400).contains(&args.window_s) {
            return Err(bad_request(format!("window_s is {}; pick 60 s to 90 days", args.window_s)));
        }
        let row = self.rows().into_iter().find(|r| r.id == args.id).ok_or_else(|| {
            ApiError::new(
                "not_found",
                format!("no watched replica has id {}; pick one on the Fleet view", args.id),
            )
        })?;
        let now_ms = unix_ms_now();
        let span_ms = i64::from(args.window_s) * 1000;
        let since = now_ms - span_ms;
        let (source, points) = self
            .inner
            .store
            .replica_series(&row.url, since, now_ms, (span_ms / CHART_POINTS).max(1000))
            .await
            .map_err(history_error)?;
        let pick = |f: fn(&fleet_store::SeriesPoint) -> Option<f64>| -> Vec<(i64, f64)> {
            points.iter().filter_map(|p| f(p).map(|v| (p.ts_ms, v))).collect()
        };
        let mut policy_changes = self.audit_markers(since, now_ms).await?;
        policy_changes.extend(self.inner.routers.markers_since(since));
        policy_changes.sort_by_key(|m| m.ts_ms);
        Ok(ReplicaHistory {
            id: row.id,
            url: row.url,
            engine: row.engine,
            model: row.model,
            now_ms,
            window_s: args.window_s,
            tier: source.name().to_owned(),
            ttft_p50_s: pick(|p| p.ttft_p50_s),
            ttft_p95_s: pick(|p| p.ttft_p95_s),
            queue_depth: pick(|p| p.queue_depth),
            kv_usage: pick(|p| p.kv_usage),
            hit_rate: pick(|p| p.hit_rate),
            tokens_per_s: pick(|p| p.tokens_per_s),
            policy_changes,
        })
    }

    /// Acknowledged pushes in the audit trail between `since` and `until`.
    async fn audit_markers(&self, since: i64, until: i64) -> Result<Vec<PolicyMarker>, ApiError> {
        let store = &self.inner.store;
        let pushes = store.fleet_pushes(self.history_fleet()).await.map_err(history_error)?;
        let markers = pushes
            .into_iter()
            .filter(|push| matches!(push.outcome, fleet_store::PushOutcome::Acknowledged { .. }))
            .filter(|push| (since..=until).contains(&push.pushed_ms))
            .map(|push| PolicyMarker {
                ts_ms: push.pushed_ms,
                label: format!("{} pushed to {}", push.label, push.router_url),
            })
            .collect();
        Ok(markers)
    }

    /// The settings view: every endpoint with what probing it found.
    pub async fn settings(&self) -> Result<SettingsView, ApiError> {
        let rows = self.rows();
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
            .prometheus
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
            scrape_interval_s: self.scrape_interval().as_secs_f64(),
            token_dir: self.inner.token_dir.display().to_string(),
            discovery: self.discovery_views(),
            etcd: self.etcd_setting(),
        })
    }

    /// Adds an endpoint, probing it at once; the report says what was found. The endpoint is
    /// kept even when the probe fails (it may come up later), and the report says why.
    pub async fn add_endpoint(&self, args: AddEndpointArgs) -> Result<ProbeReport, ApiError> {
        let url = validate_url(&args.url).map_err(bad_request)?;
        let report = match args.kind {
            EndpointKind::Replica => {
                if self.watches(&url) {
                    return Err(bad_request(format!("{url} is watched already")));
                }
                let report = self.probe_replica(&url).await;
                self.add_group(vec![url.clone()]);
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
                let client = AdminClient::new(self.inner.http.clone(), &url, Some(token.into()));
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
                self.inner.routers.add(target, &self.inner.store, self.history_fleet()).await;
                self.save(|s| {
                    s.routers.retain(|r| r.url != url);
                    s.routers.push(SavedRouter { url: url.clone(), token_file: Some(token_file.clone()) });
                })?;
                self.inner.routers.poll().await;
                report
            }
            EndpointKind::Prometheus => {
                if self.inner.prometheus.contains(&url) {
                    return Err(bad_request(format!("{url} is a source already")));
                }
                let source = fleet_telemetry::prometheus::PromSource::new(
                    &url,
                    self.inner.http.clone(),
                    self.inner.limits,
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
                self.start_prometheus(&url);
                self.save(|s| s.prometheus.push(url.clone()))?;
                report
            }
        };
        Ok(report)
    }

    /// One scrape of `url` now: its engine and model, or why it failed.
    async fn probe_replica(&self, url: &str) -> ProbeReport {
        let mut limits = self.inner.limits;
        limits.timeout = limits.timeout.min(PROBE_TIMEOUT);
        match fleet_telemetry::scrape(&self.inner.http, url, limits).await {
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
            EndpointKind::Replica => self.remove_target(&url),
            EndpointKind::Router => match self.inner.routers.remove(&url) {
                Some(token_file) => {
                    self.forget_token(token_file.as_deref());
                    true
                }
                None => false,
            },
            EndpointKind::Prometheus => self.inner.prometheus.remove(&url),
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
        self.set_interval(interval);
        self.save(|s| s.scrape_interval_s = Some(args.seconds))
    }

    /// Deletes a removed router's token file if the app wrote it (it lies in the app's token folder);
    /// a file the operator named with --router-token-file is theirs and stays.
    fn forget_token(&self, token_file: Option<&std::path::Path>) {
        let Some(file) = token_file else { return };
        let ours = match (file.canonicalize(), self.inner.token_dir.canonicalize()) {
            (Ok(file), Ok(dir)) => file.starts_with(dir),
            _ => false,
        };
        if ours && let Err(error) = std::fs::remove_file(file) {
            tracing::warn!(%error, file = %file.display(), "could not delete the removed router's token file");
        }
    }

    /// Applies `change` to the saved settings and writes them.
    fn save(&self, change: impl FnOnce(&mut crate::settings::SavedSettings)) -> Result<(), ApiError> {
        let mut saved = self.inner.saved.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut saved);
        saved
            .save(&self.inner.settings_path)
            .map_err(|e| ApiError::new("settings_not_saved", format!("{e:#}")))
    }
}
