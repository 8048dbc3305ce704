//! Prometheus servers as a source of replicas: for fleets one laptop cannot scrape, the app
//! reads the same signals through PromQL (`fleet_telemetry::prometheus`) once per scrape
//! interval and shows every recognised instance as a row, stored in the history like a
//! scraped one (its readings join the scrapes' round of the interval).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use fleet_telemetry::prometheus::PromSource;
use fleetdeck_api::{ReplicaRow, ScrapeState};
use tokio_util::sync::CancellationToken;

use super::{Fleet, sample_row, tokens_per_s};
use crate::{lock, unix_ms_now};

/// One Prometheus server's latest rows.
#[derive(Debug)]
struct Source {
    url: String,
    stop: CancellationToken,
    rows: Vec<ReplicaRow>,
    /// Row id per instance, stable while the source is watched.
    ids: HashMap<String, u32>,
    error: Option<String>,
}

/// Every Prometheus source.
#[derive(Debug, Default)]
pub struct PromSources {
    sources: Mutex<Vec<Source>>,
}

/// The row URL of a Prometheus `instance` label (usually `host:port` of the replica).
pub fn instance_url(instance: &str) -> String {
    if instance.contains("://") { instance.to_owned() } else { format!("http://{instance}") }
}

impl PromSources {
    pub(crate) fn rows(&self) -> Vec<ReplicaRow> {
        lock(&self.sources).iter().flat_map(|s| s.rows.clone()).collect()
    }

    pub(crate) fn urls(&self) -> Vec<(String, Option<String>, usize)> {
        lock(&self.sources).iter().map(|s| (s.url.clone(), s.error.clone(), s.rows.len())).collect()
    }

    pub(crate) fn contains(&self, url: &str) -> bool {
        lock(&self.sources).iter().any(|s| s.url == url)
    }

    pub(crate) fn remove(&self, url: &str) -> bool {
        let mut sources = lock(&self.sources);
        let before = sources.len();
        sources.retain(|s| {
            if s.url == url {
                s.stop.cancel();
            }
            s.url != url
        });
        sources.len() != before
    }
}

/// Reads `url` (a Prometheus base URL) once per scrape interval until it is removed or the app stops. The
/// loop holds the fleet weakly, so it never keeps a dropped fleet alive.
pub(crate) fn spawn_source(fleet: &Fleet, url: &str) {
    let stop = fleet.cancel_token().child_token();
    lock(&fleet.prometheus().sources).push(Source {
        url: url.to_owned(),
        stop: stop.clone(),
        rows: Vec::new(),
        ids: HashMap::new(),
        error: None,
    });
    let weak = fleet.downgrade();
    let url = url.to_owned();
    tokio::spawn(async move {
        loop {
            let Some(fleet) = weak.upgrade() else { return };
            let interval = fleet.scrape_interval();
            let source = PromSource::new(
                &url,
                fleet.http().clone(),
                fleet.limits(),
                Duration::from_secs(30).max(interval * 3),
            );
            let result = source.signals().await;
            let now_ms = unix_ms_now();
            let mut round = Vec::new();
            {
                let mut sources = lock(&fleet.prometheus().sources);
                let Some(state) = sources.iter_mut().find(|s| s.url == url) else { return };
                match result {
                    Ok(replicas) => {
                        state.error = None;
                        let mut rows = Vec::new();
                        for replica in replicas {
                            let row_url = instance_url(&replica.instance);
                            let id = *state
                                .ids
                                .entry(replica.instance.clone())
                                .or_insert_with(|| fleet.allocate_id());
                            let s = &replica.signals;
                            round.push(sample_row(row_url.clone(), now_ms, s));
                            rows.push(ReplicaRow {
                                id,
                                url: row_url,
                                engine: Some(s.engine.name().to_owned()),
                                model: s.model.clone(),
                                signals: crate::signals::to_api(&s.total),
                                scrape: ScrapeState::Ok { last_good_ms: now_ms },
                                tokens_per_s: tokens_per_s(&s.total),
                            });
                        }
                        state.rows = rows;
                    }
                    Err(error) => {
                        let message = format!("via Prometheus {url}: {error}");
                        state.error = Some(message.clone());
                        for row in &mut state.rows {
                            let last_good_ms = match &row.scrape {
                                ScrapeState::Ok { last_good_ms } => Some(*last_good_ms),
                                ScrapeState::Error { last_good_ms, .. } => *last_good_ms,
                                ScrapeState::Pending => None,
                            };
                            row.scrape = ScrapeState::Error { message: message.clone(), last_good_ms };
                        }
                    }
                }
            }
            fleet.submit_round(round);
            drop(fleet);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_become_urls() {
        assert_eq!(instance_url("10.0.0.5:8000"), "http://10.0.0.5:8000");
        assert_eq!(instance_url("https://gpu:1"), "https://gpu:1");
    }
}
