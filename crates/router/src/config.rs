//! The router's configuration: replica specs (`URL[,model=NAME][,kv=tcp://HOST:PORT][,role=ROLE][,bootstrap=PORT]`), timeouts, health,
//! recording and admin settings, each with a `Default`, parsed with `FromStr` and checked by `validate()`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use fleet_policy::PolicySpec;
use fleet_policy::Role;

/// A configuration value that cannot be used, with what is wrong and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    /// The option or field at fault.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }
}

/// One replica as given on the command line or to `POST /admin/replicas`.
///
/// Syntax: `URL[,model=NAME][,kv=tcp://HOST:PORT][,kv_replay=tcp://HOST:PORT][,role=prefill|decode|both][,bootstrap=PORT]`.
/// `role=` (default `both`) is the replica's part in prefill/decode disaggregation: a model group with
/// `prefill` replicas runs in P/D mode (see the crate README). `bootstrap=` marks an SGLang prefill server and
/// gives its `--disaggregation-bootstrap-port`: splits onto it run SGLang's flow (both legs at once, with
/// `bootstrap_host/port/room`) instead of vLLM's (prefill leg first). Without `model=` the router
/// asks the replica's `/v1/models` once when it is added; without `kv=` the replica's KV events come from
/// [`RouterConfig::kv_events_port_offset`] when set, else the replica sends none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaSpec {
    /// Base URL without a trailing slash, e.g. `http://127.0.0.1:8100`.
    pub url: String,
    /// The served model name, if given.
    pub model: Option<String>,
    /// ZMQ PUB endpoint of the replica's KV events (vLLM `--kv-events-config` `endpoint`).
    pub kv_events: Option<String>,
    /// ZMQ ROUTER endpoint of the replica's event replay socket (vLLM `replay_endpoint`).
    pub kv_replay: Option<String>,
    /// Its part in prefill/decode disaggregation.
    pub role: Role,
    /// An SGLang prefill server's bootstrap port (`--disaggregation-bootstrap-port`): P/D splits onto it
    /// run SGLang's flow. Only with `role=prefill`.
    pub bootstrap_port: Option<u16>,
}

impl ReplicaSpec {
    /// A replica known by URL only.
    pub fn url(url: &str) -> Self {
        Self {
            url: url.trim_end_matches('/').to_owned(),
            model: None,
            kv_events: None,
            kv_replay: None,
            role: Role::Both,
            bootstrap_port: None,
        }
    }

    /// The URL's host, without brackets for an IPv6 address or the port (SGLang's `bootstrap_host`).
    pub fn host(&self) -> Option<&str> {
        let authority = self.url.split_once("://")?.1.split('/').next()?;
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split_once(']')?.0,
            None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
        };
        (!host.is_empty()).then_some(host)
    }

    /// `host:port` of the URL (for deriving a KV endpoint), if it has an explicit port.
    pub fn host_port(&self) -> Option<(String, u16)> {
        let rest = self.url.split_once("://")?.1;
        let authority = rest.split('/').next()?;
        let (host, port) = authority.rsplit_once(':')?;
        Some((host.to_owned(), port.parse().ok()?))
    }
}

impl FromStr for ReplicaSpec {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut parts = text.split(',').map(str::trim);
        let url = parts.next().unwrap_or_default();
        if !url.starts_with("http://") || url.len() <= "http://".len() {
            return Err(ConfigError::new(
                "replica",
                format!(
                    "{url:?} is not an http:// URL; write it like http://127.0.0.1:8100[,model=NAME] (replicas are reached over plain HTTP: put a TLS sidecar before one that only speaks https)"
                ),
            ));
        }
        let mut spec = Self::url(url);
        for part in parts {
            let Some((key, value)) = part.split_once('=') else {
                return Err(ConfigError::new(
                    "replica",
                    format!(
                        "{part:?} in {text:?} is not KEY=VALUE; use model=NAME, kv=tcp://HOST:PORT, kv_replay=tcp://HOST:PORT, role=prefill|decode|both or bootstrap=PORT"
                    ),
                ));
            };
            let value = value.trim().to_owned();
            if value.is_empty() {
                return Err(ConfigError::new("replica", format!("{key}= in {text:?} has no value")));
            }
            match key.trim() {
                "model" => spec.model = Some(value),
                "kv" => spec.kv_events = Some(check_zmq_endpoint(&value)?),
                "kv_replay" => spec.kv_replay = Some(check_zmq_endpoint(&value)?),
                "role" => {
                    spec.role = value.parse().map_err(|_| {
                        ConfigError::new(
                            "replica",
                            format!(
                                "role={value:?} is not a replica role; use role=prefill, role=decode or role=both (the default)"
                            ),
                        )
                    })?
                }
                "bootstrap" => {
                    spec.bootstrap_port = Some(value.parse().ok().filter(|port| *port > 0).ok_or_else(|| {
                        ConfigError::new(
                            "replica",
                            format!(
                                "bootstrap={value:?} is not a port; give the SGLang prefill server's \
                                 --disaggregation-bootstrap-port, e.g. bootstrap=8998"
                            ),
                        )
                    })?)
                }
                other => {
                    return Err(ConfigError::new(
                        "replica",
                        format!(
                            "unknown replica option {other:?} in {text:?}; allowed: model, kv, kv_replay, role, bootstrap"
                        ),
                    ));
                }
            }
        }
        if spec.bootstrap_port.is_some() && spec.role != Role::Prefill {
            return Err(ConfigError::new(
                "replica",
                format!(
                    "bootstrap= in {text:?} marks an SGLang prefill server, but the replica's role is {}; add \
                     role=prefill, or drop bootstrap= (decode servers find the prefill server by the request's \
                     bootstrap fields)",
                    spec.role.as_str()
                ),
            ));
        }
        Ok(spec)
    }
}

impl fmt::Display for ReplicaSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.url)?;
        if let Some(model) = &self.model {
            write!(f, ",model={model}")?;
        }
        if let Some(kv) = &self.kv_events {
            write!(f, ",kv={kv}")?;
        }
        if let Some(replay) = &self.kv_replay {
            write!(f, ",kv_replay={replay}")?;
        }
        if self.role != Role::Both {
            write!(f, ",role={}", self.role.as_str())?;
        }
        if let Some(port) = self.bootstrap_port {
            write!(f, ",bootstrap={port}")?;
        }
        Ok(())
    }
}

fn check_zmq_endpoint(value: &str) -> Result<String, ConfigError> {
    if value.starts_with("tcp://")
        && value.rsplit_once(':').is_some_and(|(_, port)| port.parse::<u16>().is_ok())
    {
        Ok(value.to_owned())
    } else {
        Err(ConfigError::new(
            "replica",
            format!("{value:?} is not a ZMQ TCP endpoint; write it like tcp://127.0.0.1:5557"),
        ))
    }
}

/// Active health probing and the hysteresis applied to probe and passive results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthConfig {
    /// Time between probes of one replica.
    pub interval: Duration,
    /// Time allowed for one probe.
    pub timeout: Duration,
    /// Path probed (GET), answered 2xx when healthy.
    pub path: String,
    /// Consecutive failures (probes or proxied requests) that take a replica out of rotation.
    pub fall: u32,
    /// Consecutive successful probes that bring it back.
    pub rise: u32,
}

impl Default for HealthConfig {
    /// Out of rotation within `interval x fall + timeout` = 1.3 s of a replica dying; back after 2 good probes.
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(400),
            timeout: Duration::from_millis(500),
            path: "/health".to_owned(),
            fall: 2,
            rise: 2,
        }
    }
}

/// Where recorded traffic goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordConfig {
    /// Records kept in memory for `GET /admin/trace`.
    pub ring_capacity: usize,
    /// Bytes the records kept in memory may weigh ([`crate::recording::weight`]); the oldest leave first.
    pub max_ring_bytes: usize,
    /// File to append fleet-trace lines to, if any.
    pub file: Option<PathBuf>,
    /// Size at which the file is rotated to `FILE.1` (older ones shift to `.2`, ...).
    pub max_file_bytes: u64,
    /// Rotated files kept besides the live one.
    pub keep_files: usize,
}

impl Default for RecordConfig {
    fn default() -> Self {
        Self {
            ring_capacity: 100_000,
            max_ring_bytes: 64 << 20,
            file: None,
            max_file_bytes: 64 << 20,
            keep_files: 4,
        }
    }
}

/// Reading each replica's engine load (queue, running requests, KV usage) from its `/metrics`, off the
/// request path, so the policies see the load other routers sent too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineMetricsConfig {
    /// Time between two scrapes of one replica; zero turns the scrapes off.
    pub interval: Duration,
    /// Time one scrape may take (connect, headers, body); a replica has at most one scrape in flight.
    pub timeout: Duration,
    /// Largest `/metrics` body read; a larger one is refused, not buffered.
    pub max_bytes: usize,
    /// Figures older than this many intervals are stale: the policies ignore them (and fall back to the
    /// router's own in-flight counts) and `/admin/state` and `/metrics` flag them.
    pub max_age_intervals: u32,
}

impl Default for EngineMetricsConfig {
    /// Four scrapes a second, each within 1 s and 2 MiB; figures count for a second.
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(250),
            timeout: Duration::from_secs(1),
            max_bytes: 2 << 20,
            max_age_intervals: 4,
        }
    }
}

impl EngineMetricsConfig {
    /// Whether the scrapes run.
    pub fn enabled(&self) -> bool {
        !self.interval.is_zero()
    }

    /// Age beyond which figures no longer count, in milliseconds (`None` when the scrapes are off).
    pub fn max_age_ms(&self) -> Option<u64> {
        self.enabled().then(|| self.interval.as_millis() as u64 * u64::from(self.max_age_intervals))
    }
}

/// HTTPS: PEM certificate chain and private key (build feature `tls`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// Certificate chain (PEM).
    pub cert: PathBuf,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// The admin API's bearer token. It has no `Display` and a redacted `Debug`, so neither a log line nor a
/// dump of [`RouterConfig`] can carry it; it is compared in constant time ([`AdminToken::matches`]).
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    /// Whether `presented` is this token, in time independent of the presented bytes.
    pub fn matches(&self, presented: &str) -> bool {
        crate::admin::token_matches(&self.0, presented)
    }

    fn is_blank(&self) -> bool {
        self.0.trim().is_empty()
    }
}

impl From<String> for AdminToken {
    fn from(token: String) -> Self {
        Self(token)
    }
}

impl From<&str> for AdminToken {
    fn from(token: &str) -> Self {
        Self(token.to_owned())
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// How the router is set up. `replicas` holds replica specs in [`ReplicaSpec`] syntax (a bare URL works).
#[derive(Clone, Debug, PartialEq)]
pub struct RouterConfig {
    /// Replica specs: `URL[,model=NAME][,kv=tcp://HOST:PORT]`.
    pub replicas: Vec<String>,
    /// The policy in force at start (version 1).
    pub policy: PolicySpec,
    /// Bearer token of the admin API; `None` turns the admin API off.
    pub admin_token: Option<AdminToken>,
    /// Time allowed to open a connection to a replica before trying the next one.
    pub connect_timeout: Duration,
    /// Longest silence tolerated from a replica while reading its answer.
    pub read_timeout: Duration,
    /// An idle connection to a replica is closed after this long (keep it below the replica's own
    /// keep-alive timeout, so the router never sends on a connection the replica is closing).
    pub upstream_idle_timeout: Duration,
    /// Time a client has to send a request's headers, from when the router starts waiting for them
    /// (an idle keep-alive connection included): a client that trickles them (slowloris) is cut off.
    pub header_read_timeout: Duration,
    /// Time a client has to send a request's whole body once its headers are in: a client that trickles
    /// it is answered 408 and its connection closed, so it cannot hold a connection and a task for ever.
    pub body_read_timeout: Duration,
    /// Client connections open at once; one over the cap is answered 503 once its request is in (a second at
    /// most) and closed (the refusal is counted). At most 16 refusals are under way at once, the oldest closed
    /// unanswered when more arrive, so a flood of idle connections cannot exhaust file descriptors or memory.
    pub max_connections: usize,
    /// On shutdown the router stops accepting, closes idle connections and lets requests in flight finish;
    /// those still running after this long are cut off.
    pub shutdown_grace: Duration,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Replicas tried per request (the pick plus fallbacks) on connect failures or 5xx before the first byte.
    pub max_attempts: usize,
    /// Health probing.
    pub health: HealthConfig,
    /// Traffic recording.
    pub record: RecordConfig,
    /// Reading the replicas' engine load from their `/metrics`.
    pub engine_metrics: EngineMetricsConfig,
    /// Decisions kept for `GET /admin/decisions`.
    pub decisions_capacity: usize,
    /// Bytes the decisions kept may weigh ([`crate::state::DecisionRecord::weight`]); the oldest leave first.
    pub decisions_max_bytes: usize,
    /// Window of the prefix-heat summary in `GET /admin/state`.
    pub heat_window: Duration,
    /// When set, a replica without `kv=` publishes KV events on `tcp://ITS_HOST:(ITS_PORT + offset)`.
    pub kv_events_port_offset: Option<u16>,
    /// Hugging Face `tokenizer.json` for token-exact blocks (needs the `tokenizer` feature).
    pub tokenizer: Option<PathBuf>,
    /// The model's Jinja chat template, when not the one in `tokenizer_config.json` beside `tokenizer`.
    pub chat_template: Option<PathBuf>,
    /// Bytes the memo of tokenized prompt chunks may hold (`token_memo.rs`); 0 tokenizes every prompt whole.
    pub tokenizer_memo_bytes: u64,
    /// Seed of the policy's random draws (random, power_of_two, sampled kv_precise).
    pub seed: u64,
    /// Serve HTTPS instead of HTTP.
    pub tls: Option<TlsConfig>,
    /// Take the policy from an etcd key (watched; every value validated as an admin PUT is).
    pub policy_etcd: Option<crate::etcd_policy::EtcdPolicySource>,
    /// Publish this router's in-flight load per replica to etcd and weigh the other routers' requests by
    /// theirs (`peer_load.rs`).
    pub peer_load: Option<crate::peer_load::PeerLoadConfig>,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            replicas: Vec::new(),
            policy: PolicySpec::default(),
            admin_token: None,
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(120),
            upstream_idle_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(30),
            max_connections: 8192,
            shutdown_grace: Duration::from_secs(30),
            max_body_bytes: 16 * 1024 * 1024,
            max_attempts: 3,
            health: HealthConfig::default(),
            record: RecordConfig::default(),
            engine_metrics: EngineMetricsConfig::default(),
            decisions_capacity: 1000,
            decisions_max_bytes: 16 << 20,
            heat_window: Duration::from_secs(300),
            kv_events_port_offset: None,
            tokenizer: None,
            chat_template: None,
            tokenizer_memo_bytes: 64 << 20,
            seed: 0x5EED,
            tls: None,
            policy_etcd: None,
            peer_load: None,
        }
    }
}

impl RouterConfig {
    /// Checks every field; the error names the field and the fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.replica_specs()?;
        self.policy.validate().map_err(|error| ConfigError::new("policy", format!("{error}")))?;
        if self.admin_token.as_ref().is_some_and(AdminToken::is_blank) {
            return Err(ConfigError::new(
                "admin_token",
                "the admin token is empty; put a non-empty secret in the token file",
            ));
        }
        let positive = [
            ("connect_timeout", self.connect_timeout),
            ("read_timeout", self.read_timeout),
            ("upstream_idle_timeout", self.upstream_idle_timeout),
            ("header_read_timeout", self.header_read_timeout),
            ("body_read_timeout", self.body_read_timeout),
            ("health.interval", self.health.interval),
            ("health.timeout", self.health.timeout),
        ];
        for (field, value) in positive {
            if value.is_zero() {
                return Err(ConfigError::new(field, "must be above zero"));
            }
        }
        if self.max_body_bytes == 0 {
            return Err(ConfigError::new("max_body_bytes", "must be above zero"));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::new("max_connections", "must be at least 1"));
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::new("max_attempts", "must be at least 1 (the pick itself)"));
        }
        if self.health.fall == 0 || self.health.rise == 0 {
            return Err(ConfigError::new("health", "fall and rise must be at least 1"));
        }
        if !self.health.path.starts_with('/') {
            return Err(ConfigError::new("health.path", "must start with /, e.g. /health"));
        }
        if self.record.ring_capacity == 0 || self.decisions_capacity == 0 {
            return Err(ConfigError::new("record.ring_capacity", "ring capacities must be at least 1"));
        }
        if self.record.max_ring_bytes == 0 || self.decisions_max_bytes == 0 {
            return Err(ConfigError::new("record.max_ring_bytes", "ring byte budgets must be above zero"));
        }
        if self.record.file.is_some() && self.record.max_file_bytes < 1024 {
            return Err(ConfigError::new("record.max_file_bytes", "must be at least 1024 bytes"));
        }
        let engine = &self.engine_metrics;
        if engine.enabled() {
            if engine.timeout.is_zero() || engine.max_bytes == 0 || engine.max_age_intervals == 0 {
                return Err(ConfigError::new(
                    "engine_metrics",
                    "the timeout, the size cap and the age bound (in intervals) must be above zero",
                ));
            }
            if engine.interval < Duration::from_millis(10) {
                return Err(ConfigError::new(
                    "engine_metrics.interval",
                    "at least 10 ms (0 turns the scrapes off); 250 ms keeps figures fresh at little cost",
                ));
            }
        }
        if self.tls.is_some() && !cfg!(feature = "tls") {
            return Err(ConfigError::new(
                "tls",
                "this fleet-router was built without the `tls` feature; rebuild with --features tls",
            ));
        }
        if self.tokenizer.is_some() && !cfg!(feature = "tokenizer") {
            return Err(ConfigError::new(
                "tokenizer",
                "this fleet-router was built without the `tokenizer` feature; rebuild with --features tokenizer",
            ));
        }
        if self.chat_template.is_some() && self.tokenizer.is_none() {
            return Err(ConfigError::new(
                "chat_template",
                "a chat template needs --tokenizer: the rendered chat is tokenised with the model's tokenizer",
            ));
        }
        if let Some(source) = &self.policy_etcd {
            source.etcd.validate().map_err(|error| ConfigError::new("policy_etcd", error.to_string()))?;
            if source.key.trim().is_empty() {
                return Err(ConfigError::new(
                    "policy_key",
                    "the etcd key is empty; give the key holding the policy, e.g. /fleetdeck/FLEET/policy",
                ));
            }
            if source.check_every.is_zero() {
                return Err(ConfigError::new("policy_etcd_check", "must be above zero"));
            }
        }
        if let Some(share) = &self.peer_load {
            share.validate().map_err(|fix| ConfigError::new("peer_load", fix))?;
        }
        Ok(())
    }

    /// The replica specs, parsed.
    pub fn replica_specs(&self) -> Result<Vec<ReplicaSpec>, ConfigError> {
        let specs: Vec<ReplicaSpec> =
            self.replicas.iter().map(|text| text.parse()).collect::<Result<_, _>>()?;
        for (i, spec) in specs.iter().enumerate() {
            if specs[..i].iter().any(|other| other.url == spec.url) {
                return Err(ConfigError::new(
                    "replica",
                    format!("{} is given twice; list each replica once", spec.url),
                ));
            }
        }
        Ok(specs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_specs_parse_with_options_and_reject_bad_input_with_a_fix() {
        let spec: ReplicaSpec = "http://127.0.0.1:8100/,model=m1,kv=tcp://127.0.0.1:5557".parse().unwrap();
        assert_eq!(spec.url, "http://127.0.0.1:8100");
        assert_eq!(spec.model.as_deref(), Some("m1"));
        assert_eq!(spec.kv_events.as_deref(), Some("tcp://127.0.0.1:5557"));
        assert_eq!(spec.host_port(), Some(("127.0.0.1".to_owned(), 8100)));
        assert_eq!(spec.to_string().parse::<ReplicaSpec>().unwrap(), spec);
        for bad in [
            "127.0.0.1:8100",
            "https://gpu:8000",
            "http://x,model",
            "http://x,colour=red",
            "http://x,kv=udp://a:1",
            "http://",
        ] {
            let error = bad.parse::<ReplicaSpec>().unwrap_err();
            assert_eq!(error.field, "replica", "{bad}");
        }
    }

    #[test]
    fn replica_roles_parse_round_trip_and_a_bad_one_names_the_fix() {
        let cases = [
            ("http://a:1", Role::Both),
            ("http://a:1,role=both", Role::Both),
            ("http://a:1,role=prefill", Role::Prefill),
            ("http://a:1,model=m,role=decode", Role::Decode),
        ];
        for (text, role) in cases {
            let spec: ReplicaSpec = text.parse().unwrap();
            assert_eq!(spec.role, role, "{text}");
            assert_eq!(spec.to_string().parse::<ReplicaSpec>().unwrap(), spec, "{text}");
        }
        let error = "http://a:1,role=prefil".parse::<ReplicaSpec>().unwrap_err();
        assert!(error.message.contains("\"prefil\"") && error.message.contains("role=prefill"), "{error}");
    }

    #[test]
    fn an_sglang_prefill_server_takes_a_bootstrap_port_and_only_a_prefill_replica_does() {
        let spec: ReplicaSpec = "http://a:30000,role=prefill,bootstrap=8998".parse().unwrap();
        assert_eq!((spec.role, spec.bootstrap_port), (Role::Prefill, Some(8998)));
        // Its host is the bootstrap host, with or without a port in the URL.
        let hosts = [
            ("http://a:30000", "a"),
            ("http://prefill-0.svc", "prefill-0.svc"),
            ("http://[::1]:80/v1", "::1"),
        ];
        for (url, host) in hosts {
            assert_eq!(ReplicaSpec::url(url).host(), Some(host), "{url}");
        }
        assert_eq!(spec.to_string().parse::<ReplicaSpec>().unwrap(), spec);
        let error = "http://a:1,role=decode,bootstrap=8998".parse::<ReplicaSpec>().unwrap_err();
        assert!(error.message.contains("role=prefill"), "{error}");
        let error = "http://a:1,bootstrap=8998".parse::<ReplicaSpec>().unwrap_err();
        assert!(error.message.contains("role is both"), "{error}");
        for bad in ["0", "70000", "x"] {
            let error =
                format!("http://a:1,role=prefill,bootstrap={bad}").parse::<ReplicaSpec>().unwrap_err();
            assert!(error.message.contains("--disaggregation-bootstrap-port"), "{error}");
        }
    }

    #[test]
    fn validate_names_the_field() {
        assert!(RouterConfig::default().validate().is_ok());
        let twice =
            RouterConfig { replicas: vec!["http://a:1".into(), "http://a:1/".into()], ..Default::default() };
        assert!(twice.validate().unwrap_err().message.contains("twice"));
        let zero = RouterConfig { max_attempts: 0, ..Default::default() };
        assert_eq!(zero.validate().unwrap_err().field, "max_attempts");
        let no_connections = RouterConfig { max_connections: 0, ..Default::default() };
        assert_eq!(no_connections.validate().unwrap_err().field, "max_connections");
        let no_body_time = RouterConfig { body_read_timeout: Duration::ZERO, ..Default::default() };
        assert_eq!(no_body_time.validate().unwrap_err().field, "body_read_timeout");
        let no_header_time = RouterConfig { header_read_timeout: Duration::ZERO, ..Default::default() };
        assert_eq!(no_header_time.validate().unwrap_err().field, "header_read_timeout");
        let empty_token = RouterConfig { admin_token: Some(" ".into()), ..Default::default() };
        assert_eq!(empty_token.validate().unwrap_err().field, "admin_token");
    }

    #[test]
    fn a_config_dump_never_shows_the_admin_token() {
        let config = RouterConfig { admin_token: Some("s3cret-admin".into()), ..Default::default() };
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret-admin") && shown.contains("AdminToken(<redacted>)"), "{shown}");
        let token = config.admin_token.unwrap();
        assert!(token.matches("s3cret-admin") && !token.matches("s3cret-admi"));
    }
}
