//! Replicas and routers from a source instead of flags: a file the app watches, or DNS SRV records. Each
//! source is read once per scrape interval; replicas that appear start being scraped at once and those that
//! leave stop, so the fleet view follows within one interval. A source that fails (a half-written file, a
//! DNS timeout) keeps what it found last, with the error, rather than emptying the fleet.
//!
//! The file is what operators already template, in JSON or YAML:
//! - Prometheus `file_sd` (a list of `{targets: [host:port, ...], labels: {...}}`): every target is a
//!   replica, unless its group's label `fleetdeck_role` is `router` (then `fleetdeck_token_file` names its
//!   admin token file); `__scheme__: https` makes https URLs.
//! - `{replicas: [URL, ...], routers: [URL | {url, token_file}, ...]}`.
//! - a plain list of replica URLs.
//!
//! (Prometheus servers are a source of their own, `fleet/prometheus.rs`. Kubernetes EndpointSlices are not read:
//! there is no API server to test them against here.)

pub mod dns_srv;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::fleet::Fleet;
use crate::routers::{RouterTarget, Routers};
use crate::{lock, unix_ms_now};

/// Largest discovery file read.
const MAX_FILE_BYTES: u64 = 4 << 20;

/// Where replicas and routers are found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiscoverySource {
    /// A JSON or YAML file, read again every scrape interval.
    File(PathBuf),
    /// The SRV records of `name` (e.g. `_vllm._tcp.fleet.internal`), asked of `server` (default: the first
    /// nameserver of /etc/resolv.conf); each instance is a replica at `http://ADDRESS:PORT`.
    Srv { name: String, server: Option<SocketAddr> },
}

impl std::fmt::Display for DiscoverySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::Srv { name, .. } => write!(f, "DNS SRV {name}"),
        }
    }
}

/// A router found by a source.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FoundRouter {
    pub url: String,
    pub token_file: Option<PathBuf>,
}

/// What a source lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    pub replicas: BTreeSet<String>,
    pub routers: BTreeSet<FoundRouter>,
}

fn url_of(target: &str, scheme: &str) -> Result<String, String> {
    let target = target.trim().trim_end_matches('/');
    if target.is_empty() {
        return Err("an empty target".to_owned());
    }
    if target.starts_with("http://") || target.starts_with("https://") {
        return Ok(target.to_owned());
    }
    if target.contains("://") {
        return Err(format!("{target:?} is not an http(s) URL or host:port"));
    }
    if target.rsplit_once(':').is_none_or(|(_, port)| port.parse::<u16>().is_err()) {
        return Err(format!("{target:?} has no port; write it as host:port or a URL"));
    }
    Ok(format!("{scheme}://{target}"))
}

fn text<'a>(value: &'a Value, what: &str) -> Result<&'a str, String> {
    value.as_str().ok_or_else(|| format!("{what} must be a string, not {value}"))
}

/// Reads a discovery file (JSON or YAML, in any of the three shapes).
pub fn parse_file(content: &str) -> Result<Found, String> {
    let trimmed = content.trim_start();
    let document: Value = if trimmed.starts_with('[') || trimmed.starts_with('{') {
        serde_json::from_str(content).map_err(|e| format!("not valid JSON: {e}"))?
    } else {
        serde_norway::from_str(content).map_err(|e| format!("not valid YAML: {e}"))?
    };
    let mut found = Found::default();
    match &document {
        Value::Null => {}
        Value::Array(items) if items.iter().all(Value::is_string) => {
            for item in items {
                found.replicas.insert(url_of(text(item, "a replica")?, "http")?);
            }
        }
        Value::Array(groups) => {
            for (i, group) in groups.iter().enumerate() {
                let targets = group["targets"]
                    .as_array()
                    .ok_or_else(|| format!("group {i} has no `targets` list (Prometheus file_sd shape)"))?;
                let labels = &group["labels"];
                let scheme = labels["__scheme__"].as_str().unwrap_or("http");
                if !matches!(scheme, "http" | "https") {
                    return Err(format!("group {i}: __scheme__ {scheme:?} is neither http nor https"));
                }
                let role = labels["fleetdeck_role"].as_str().unwrap_or("replica");
                for target in targets {
                    let url =
                        url_of(text(target, "a target")?, scheme).map_err(|e| format!("group {i}: {e}"))?;
                    match role {
                        "replica" => {
                            found.replicas.insert(url);
                        }
                        "router" => {
                            let token_file = labels["fleetdeck_token_file"].as_str().map(PathBuf::from);
                            found.routers.insert(FoundRouter { url, token_file });
                        }
                        other => {
                            return Err(format!(
                                "group {i}: fleetdeck_role {other:?} is neither replica nor router"
                            ));
                        }
                    }
                }
            }
        }
        Value::Object(fields) => {
            for key in fields.keys() {
                if key != "replicas" && key != "routers" {
                    return Err(format!(
                        "unknown field {key:?}; a discovery file has `replicas` and `routers`"
                    ));
                }
            }
            for item in document["replicas"].as_array().into_iter().flatten() {
                let url = match item {
                    Value::Object(_) => text(&item["url"], "a replica's url")?,
                    other => text(other, "a replica")?,
                };
                found.replicas.insert(url_of(url, "http")?);
            }
            for item in document["routers"].as_array().into_iter().flatten() {
                let (url, token_file) = match item {
                    Value::Object(_) => (
                        text(&item["url"], "a router's url")?,
                        item["token_file"].as_str().map(PathBuf::from),
                    ),
                    other => (text(other, "a router")?, None),
                };
                found.routers.insert(FoundRouter { url: url_of(url, "http")?, token_file });
            }
        }
        other => return Err(format!("a discovery file is a list or an object, not {other}")),
    }
    Ok(found)
}

/// Reads a source once.
async fn read(source: &DiscoverySource) -> Result<Found, String> {
    match source {
        DiscoverySource::File(path) => {
            let size = tokio::fs::metadata(path)
                .await
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?
                .len();
            if size > MAX_FILE_BYTES {
                return Err(format!(
                    "{} is {size} bytes, above the {MAX_FILE_BYTES} a discovery file may have",
                    path.display()
                ));
            }
            let content = tokio::fs::read_to_string(path)
                .await
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            parse_file(&content).map_err(|e| format!("{}: {e}", path.display()))
        }
        DiscoverySource::Srv { name, server } => {
            let server = match server {
                Some(server) => *server,
                None => {
                    let conf = tokio::fs::read_to_string("/etc/resolv.conf").await.unwrap_or_default();
                    dns_srv::nameserver(&conf).ok_or(
                        "no nameserver in /etc/resolv.conf; give the DNS server with --dns-server HOST:PORT",
                    )?
                }
            };
            let instances = dns_srv::resolve_srv(server, name)
                .await
                .map_err(|e| format!("SRV {name} at {server}: {e}"))?;
            Ok(Found {
                replicas: instances
                    .into_iter()
                    .map(|(address, port)| format!("http://{address}:{port}"))
                    .collect(),
                routers: BTreeSet::new(),
            })
        }
    }
}

/// One source's state, for the settings view and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceStatus {
    pub source: String,
    /// What it listed last time it could be read.
    pub found: Found,
    /// Why the last read failed, if it did (what it found before is kept).
    pub error: Option<String>,
    /// Reads finished (and applied), one per scrape interval: a change made to the source is applied by
    /// the first read that starts after it, so it shows by the time this has grown by two.
    pub reads: u64,
    /// When the last read finished (unix ms).
    pub last_read_ms: Option<u64>,
}

/// Every discovery source, each read on its own loop, and what each found last. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Discovery {
    inner: Arc<DiscoveryInner>,
}

#[derive(Debug)]
struct DiscoveryInner {
    sources: Mutex<Vec<SourceStatus>>,
    fleet: Fleet,
    routers: Routers,
    cancel: CancellationToken,
}

impl Discovery {
    pub(crate) fn new(fleet: Fleet, routers: Routers, cancel: CancellationToken) -> Self {
        Self { inner: Arc::new(DiscoveryInner { sources: Mutex::default(), fleet, routers, cancel }) }
    }

    /// Where each discovery source stands.
    pub fn status(&self) -> Vec<SourceStatus> {
        lock(&self.inner.sources).clone()
    }

    /// The discovery sources as the settings view shows them.
    pub(crate) fn views(&self) -> Vec<fleetdeck_api::DiscoveryView> {
        self.status()
            .into_iter()
            .map(|status| fleetdeck_api::DiscoveryView {
                source: status.source,
                replicas: status.found.replicas.into_iter().collect(),
                routers: status.found.routers.into_iter().map(|r| r.url).collect(),
                error: status.error,
                reads: status.reads,
                last_read_ms: status.last_read_ms,
            })
            .collect()
    }

    /// Reads `source` once per scrape interval until the app stops, applying what changed. The loop holds
    /// the discovery weakly, so it never keeps a dropped app alive.
    pub(crate) fn start(&self, source: DiscoverySource) {
        let index = {
            let mut sources = lock(&self.inner.sources);
            sources.push(SourceStatus { source: source.to_string(), ..SourceStatus::default() });
            sources.len() - 1
        };
        let weak = Arc::downgrade(&self.inner);
        let cancel = self.inner.cancel.clone();
        tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let discovery = Discovery { inner };
                let result = read(&source).await;
                let interval = discovery.inner.fleet.scrape_interval();
                discovery.apply(index, result).await;
                drop(discovery);
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(interval) => {}
                }
            }
        });
    }

    async fn apply(&self, index: usize, result: Result<Found, String>) {
        self.apply_found(index, result).await;
        let mut sources = lock(&self.inner.sources);
        sources[index].reads += 1;
        sources[index].last_read_ms = u64::try_from(unix_ms_now()).ok();
    }

    async fn apply_found(&self, index: usize, result: Result<Found, String>) {
        let found = match result {
            Ok(found) => found,
            Err(error) => {
                let mut sources = lock(&self.inner.sources);
                if sources[index].error.as_ref() != Some(&error) {
                    tracing::warn!(source = %sources[index].source, %error, "discovery failed; keeping what it found before");
                }
                sources[index].error = Some(error);
                return;
            }
        };
        let before = {
            let mut sources = lock(&self.inner.sources);
            sources[index].error = None;
            std::mem::replace(&mut sources[index].found, found.clone())
        };
        // Another source (or a flag) may list the same replica: only what no one else lists goes.
        let others: BTreeSet<String> = lock(&self.inner.sources)
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != index)
            .flat_map(|(_, s)| s.found.replicas.iter().cloned())
            .collect();
        let fleet = &self.inner.fleet;
        for url in found.replicas.difference(&before.replicas) {
            if fleet.watch(url) {
                tracing::info!(%url, "discovered a replica");
            }
        }
        for url in before.replicas.difference(&found.replicas) {
            if !others.contains(url) && fleet.unwatch(url) {
                tracing::info!(%url, "a discovered replica left");
            }
        }
        for router in found.routers.difference(&before.routers) {
            let target = RouterTarget {
                url: router.url.clone(),
                token_file: router.token_file.clone(),
                ..RouterTarget::default()
            };
            self.inner.routers.add(target).await;
        }
        for router in before.routers.difference(&found.routers) {
            if !found.routers.iter().any(|r| r.url == router.url) {
                self.inner.routers.remove(&router.url);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(found: &Found) -> Vec<&str> {
        found.replicas.iter().map(String::as_str).collect()
    }

    #[test]
    fn prometheus_file_sd_in_json_and_yaml() {
        let json = r#"[
            {"targets": ["10.0.0.5:8000", "10.0.0.6:8000"], "labels": {"job": "vllm"}},
            {"targets": ["gpu7:443"], "labels": {"__scheme__": "https"}},
            {"targets": ["10.0.0.9:8080"], "labels": {"fleetdeck_role": "router", "fleetdeck_token_file": "/etc/fd/r.token"}}
        ]"#;
        let found = parse_file(json).unwrap();
        assert_eq!(urls(&found), ["http://10.0.0.5:8000", "http://10.0.0.6:8000", "https://gpu7:443"]);
        let router = found.routers.iter().next().unwrap();
        assert_eq!(
            (router.url.as_str(), router.token_file.as_deref()),
            ("http://10.0.0.9:8080", Some("/etc/fd/r.token".as_ref()))
        );
        let yaml = "- targets: ['10.0.0.5:8000']\n  labels:\n    job: vllm\n";
        assert_eq!(urls(&parse_file(yaml).unwrap()), ["http://10.0.0.5:8000"]);
    }

    #[test]
    fn the_fleetdeck_shape_and_a_plain_list() {
        let yaml = "replicas:\n  - http://a:1\n  - url: b:2\nrouters:\n  - http://r:8080\n  - {url: 'http://s:8080', token_file: /t}\n";
        let found = parse_file(yaml).unwrap();
        assert_eq!(urls(&found), ["http://a:1", "http://b:2"]);
        assert_eq!(found.routers.len(), 2);
        assert_eq!(urls(&parse_file(r#"["http://a:1", "c:3"]"#).unwrap()), ["http://a:1", "http://c:3"]);
        assert_eq!(parse_file("").unwrap(), Found::default());
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        for (content, says) in [
            ("[{\"labels\": {}}]", "targets"),
            ("[{\"targets\": [\"nohost\"]}]", "no port"),
            (
                "[{\"targets\": [\"a:1\"], \"labels\": {\"fleetdeck_role\": \"db\"}}]",
                "neither replica nor router",
            ),
            ("{\"replica\": []}", "unknown field"),
            ("{\"replicas\": [", "not valid JSON"),
            ("replicas: [a:1", "not valid YAML"),
            ("[\"ftp://a:1\"]", "not an http(s) URL"),
            ("42", "a list or an object"),
        ] {
            let error = parse_file(content).unwrap_err();
            assert!(error.contains(says), "{content}: {error}");
        }
    }
}
