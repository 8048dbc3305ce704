//! The fleet's policy in etcd, for fleets whose routers watch a key (`fleet-router --policy-etcd`): read
//! the key, push a spec as one txn guarded by the revision the operator reviewed (etcd's If-Match), roll
//! back to the key's previous valid value the same way, and the drift of every router against its key.
//!
//! One write reaches every router of the key, however many there are; per-router HTTP pushes
//! (`rollout/mod.rs`) stay for small fleets. Canary groups watch keys of their own beside the fleet's main key
//! (same folder, e.g. `/fleetdeck/FLEET/canary`), which the same commands write with `key`. Every write is
//! recorded in the audit trail like an HTTP push, with `etcd:KEY` as its router. The etcd password and token
//! stay in memory (fleet-etcd keeps them out of `Debug`), never in SQLite or logs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fleet_etcd::{EtcdClient, EtcdConfig, EtcdError, KeyValue};
use fleet_policy::PolicySpec;
use fleet_rollout::{EtcdReport, PushOutcome};
use fleetdeck_api::{
    ApiError, EtcdDrift, EtcdKeyArgs, EtcdPolicy, EtcdPushArgs, EtcdPushReport, EtcdRollbackArgs, KeyDrift,
    LaggingRouter,
};

use crate::audit::Audit;
use crate::rollout::intended::Intended;
use crate::rollout::operator_name;
use crate::routers::Routers;
use crate::routers::admin::AdminClient;
use crate::unix_ms_now;

/// Earlier values of a key looked at for a valid one to roll back to.
const MAX_ROLLBACK_STEPS: usize = 20;

/// Where the fleet's policy lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdPolicyConfig {
    /// How to reach etcd.
    pub etcd: EtcdConfig,
    /// The fleet's main policy key, e.g. `/fleetdeck/prod/policy`.
    pub key: String,
}

/// The etcd client and the fleet's main key.
#[derive(Debug)]
pub(crate) struct EtcdKey {
    client: EtcdClient,
    key: String,
}

impl EtcdKey {
    pub(crate) fn new(config: &EtcdPolicyConfig) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !config.key.trim().is_empty(),
            "--policy-key is empty; give the key the routers watch, e.g. /fleetdeck/FLEET/policy"
        );
        Ok(Self { client: EtcdClient::new(config.etcd.clone())?, key: config.key.clone() })
    }

    /// The fleet's main key.
    pub(crate) fn main_key(&self) -> &str {
        &self.key
    }

    /// The folder of the main key: group keys live in it.
    fn folder(&self) -> &str {
        self.key.rsplit_once('/').map_or("", |(folder, _)| folder)
    }

    /// The key asked for: the main key, or a group's key in the main key's folder.
    fn key(&self, asked: Option<&str>) -> Result<String, ApiError> {
        let Some(asked) = asked.map(str::trim).filter(|k| !k.is_empty()) else { return Ok(self.key.clone()) };
        let folder = format!("{}/", self.folder());
        if asked == self.key || asked.starts_with(&folder) && asked.len() > folder.len() {
            return Ok(asked.to_owned());
        }
        Err(ApiError::new(
            "bad_request",
            format!(
                "{asked} is not one of this fleet's policy keys; use {} or a group key in {folder} (e.g. {folder}canary)",
                self.key
            ),
        ))
    }
}

fn etcd_error(error: EtcdError) -> ApiError {
    let code = match error {
        EtcdError::Unreachable { .. } => "etcd_unreachable",
        _ => "etcd_error",
    };
    ApiError::new(code, format!("{error}; nothing was written"))
}

/// A value of the key as the routers would read it: the spec, or why they refuse it.
fn spec_of(value: &[u8]) -> Result<PolicySpec, String> {
    let text = std::str::from_utf8(value).map_err(|_| "the value is not UTF-8 text".to_owned())?;
    text.parse::<PolicySpec>().map_err(|e| e.to_string())
}

fn conflict(key: &str, reviewed: i64, current: i64) -> ApiError {
    ApiError::new(
        "revision_conflict",
        format!(
            "{key} changed since you reviewed it (revision {reviewed}, now {current}); nothing was written: read it again and push with if_revision {current}"
        ),
    )
}

/// What a router's `/admin/state` says about its store.
fn report_of(state: Result<crate::routers::admin::RouterState, String>) -> EtcdReport {
    match state {
        Err(error) => EtcdReport::Unreadable(error),
        Ok(state) => match state.etcd {
            None => EtcdReport::Read {
                key: None,
                revision: None,
                connected: false,
                last_rejected: None,
                error: None,
            },
            Some(store) => EtcdReport::Read {
                key: Some(store.key),
                revision: state.policy.etcd_revision,
                connected: store.connected,
                last_rejected: store.last_rejected.map(|r| (r.revision, r.reason)),
                error: store.error,
            },
        },
    }
}

/// The newest value before `current` that routers would accept (invalid ones are skipped).
async fn previous_valid(store: &EtcdKey, key: &str, current: &KeyValue) -> Result<PolicySpec, ApiError> {
    let mut at = current.clone();
    for _ in 0..MAX_ROLLBACK_STEPS {
        // A key's first value (its creation) has nothing before it.
        if at.mod_revision <= at.create_revision.max(1) {
            break;
        }
        let earlier = store.client.get_at(key, at.mod_revision - 1).await.map_err(|error| match error {
            EtcdError::Server { code: 11, .. } => ApiError::new(
                "no_previous_version",
                format!(
                    "etcd compacted {key}'s history, so its previous value is gone; push the version to restore from the history view"
                ),
            ),
            other => etcd_error(other),
        })?;
        let Some(kv) = earlier.kv else { break };
        if let Ok(spec) = spec_of(&kv.value) {
            return Ok(spec);
        }
        at = kv;
    }
    Err(ApiError::new(
        "no_previous_version",
        format!("{key} has no earlier valid value in etcd's history to roll back to"),
    ))
}

/// Writes `spec` (canonical JSON) to `key` if the key is still at `if_revision`; the new revision.
async fn put_spec(store: &EtcdKey, key: &str, spec: &PolicySpec, if_revision: i64) -> Result<i64, ApiError> {
    let outcome =
        store.client.put_if(key, spec.to_json().as_bytes(), if_revision).await.map_err(etcd_error)?;
    if outcome.succeeded {
        Ok(outcome.revision)
    } else {
        Err(conflict(key, if_revision, outcome.current.map_or(0, |kv| kv.mod_revision)))
    }
}

/// What a canary step does to a key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyChange<'a> {
    /// Write this spec.
    Push(&'a PolicySpec),
    /// Put the previous valid value back.
    Rollback,
}

/// How long a canary step waits for the routers of a key to report its new revision.
const APPLY_WAIT: Duration = Duration::from_secs(10);

/// The fleet's policy keys in etcd, when its routers watch one: the commands that read and write them, and
/// the canary's steps on routers that take their policy from a key. Cheap to clone.
#[derive(Debug, Clone)]
pub struct EtcdKeys {
    inner: Arc<EtcdKeysInner>,
}

#[derive(Debug)]
struct EtcdKeysInner {
    key: Option<EtcdKey>,
    routers: Routers,
    audit: Audit,
    intended: Intended,
}

impl EtcdKeys {
    pub(crate) fn new(key: Option<EtcdKey>, routers: Routers, audit: Audit, intended: Intended) -> Self {
        Self { inner: Arc::new(EtcdKeysInner { key, routers, audit, intended }) }
    }

    /// The fleet's main key, when there is one.
    pub(crate) fn main_key(&self) -> Option<&str> {
        self.inner.key.as_ref().map(EtcdKey::main_key)
    }

    fn etcd_key(&self) -> Result<&EtcdKey, ApiError> {
        self.inner.key.as_ref().ok_or_else(|| {
            ApiError::new(
                "no_etcd_key",
                "this fleet's policy is not in etcd; start fleetdeck with --policy-etcd URL --policy-key KEY (or push to the routers over HTTP)",
            )
        })
    }

    /// Where the policy lives, for the settings view (endpoints and key; never the credentials).
    pub(crate) fn setting(&self) -> Option<fleetdeck_api::EtcdSetting> {
        let store = self.inner.key.as_ref()?;
        Some(fleetdeck_api::EtcdSetting {
            endpoints: store.client.config().endpoints.clone(),
            key: store.key.clone(),
        })
    }

    /// The policy key as etcd holds it.
    pub async fn policy(&self, args: EtcdKeyArgs) -> Result<EtcdPolicy, ApiError> {
        let store = self.etcd_key()?;
        let key = store.key(args.key.as_deref())?;
        let range = store.client.get(&key).await.map_err(etcd_error)?;
        Ok(match range.kv {
            None => EtcdPolicy { key, revision: 0, text: None, invalid: None },
            Some(kv) => EtcdPolicy {
                key,
                revision: kv.mod_revision,
                text: Some(String::from_utf8_lossy(&kv.value).into_owned()),
                invalid: spec_of(&kv.value).err(),
            },
        })
    }

    /// Writes a spec to the key in one txn that holds only if the key is still at `if_revision`. An invalid
    /// spec is refused before etcd is called.
    pub async fn push(&self, args: EtcdPushArgs) -> Result<EtcdPushReport, ApiError> {
        let spec = super::spec_or_api_error(&args.text).await?;
        let store = self.etcd_key()?;
        let key = store.key(args.key.as_deref())?;
        let author = operator_name(args.operator.as_deref());
        let hint = format!("etcd-{}", spec.policy);
        self.write_key(store, &key, &spec, args.if_revision, &author, &hint).await
    }

    /// Puts back the key's previous valid value (skipping values routers would refuse), in one txn guarded
    /// by `if_revision`.
    pub async fn rollback(&self, args: EtcdRollbackArgs) -> Result<EtcdPushReport, ApiError> {
        let store = self.etcd_key()?;
        let key = store.key(args.key.as_deref())?;
        let author = operator_name(args.operator.as_deref());
        let range = store.client.get(&key).await.map_err(etcd_error)?;
        let Some(current) = range.kv else {
            return Err(ApiError::new(
                "no_previous_version",
                format!("{key} does not exist in etcd; nothing to roll back"),
            ));
        };
        if current.mod_revision != args.if_revision {
            return Err(conflict(&key, args.if_revision, current.mod_revision));
        }
        let spec = previous_valid(store, &key, &current).await?;
        let hint = format!("rollback-{}", spec.policy);
        self.write_key(store, &key, &spec, current.mod_revision, &author, &hint).await
    }

    /// The guarded write, recorded in the audit trail (the version first, then its outcome).
    async fn write_key(
        &self,
        store: &EtcdKey,
        key: &str,
        spec: &PolicySpec,
        if_revision: i64,
        author: &str,
        hint: &str,
    ) -> Result<EtcdPushReport, ApiError> {
        let routers: Vec<String> = self.inner.routers.urls().into_iter().map(|(url, _)| url).collect();
        let label = self.inner.audit.record_version(spec, author, &routers, hint).await?;
        let target = format!("etcd:{key}");
        let (record, result) = match put_spec(store, key, spec, if_revision).await {
            Ok(revision) => (
                fleet_store::PushOutcome::Acknowledged { acked_label: label.clone() },
                Ok(EtcdPushReport {
                    label: label.clone(),
                    author: author.to_owned(),
                    at_ms: unix_ms_now(),
                    key: key.to_owned(),
                    revision,
                    previous_revision: if_revision,
                }),
            ),
            Err(error) => (fleet_store::PushOutcome::Failed { error: error.message.clone() }, Err(error)),
        };
        self.inner.audit.record_push(&label, &target, &record).await;
        if result.is_ok() && key == store.key {
            self.inner.intended.set(&label, spec.clone());
        }
        result
    }

    /// Splits routers into those that watch one of the fleet's etcd keys (by key) and the others (pushed over
    /// HTTP). Without a store, or for a router that cannot be read, it is HTTP.
    pub(crate) async fn split_by_key(
        &self,
        clients: Vec<AdminClient>,
    ) -> (BTreeMap<String, Vec<AdminClient>>, Vec<AdminClient>) {
        if self.inner.key.is_none() {
            return (BTreeMap::new(), clients);
        }
        let states = futures_util::future::join_all(clients.iter().map(AdminClient::state)).await;
        let mut by_key: BTreeMap<String, Vec<AdminClient>> = BTreeMap::new();
        let mut http = Vec::new();
        for (client, state) in clients.into_iter().zip(states) {
            match state.ok().and_then(|s| s.etcd) {
                Some(store) => by_key.entry(store.key).or_default().push(client),
                None => http.push(client),
            }
        }
        (by_key, http)
    }

    /// A canary step on etcd keys: one guarded txn per key (guarded by the revision read right before, as
    /// the HTTP path reads each router's version), then each router's outcome once it reports the new
    /// revision, or why not after [`APPLY_WAIT`]. Also returns the spec a rollback restored.
    pub(crate) async fn change_keys(
        &self,
        by_key: &BTreeMap<String, Vec<AdminClient>>,
        change: KeyChange<'_>,
    ) -> (Vec<(String, PushOutcome)>, Option<PolicySpec>) {
        let mut outcomes = Vec::new();
        let mut restored = None;
        for (key, clients) in by_key {
            let written = async {
                let store = self.etcd_key()?;
                store.key(Some(key))?;
                let current = store.client.get(key).await.map_err(etcd_error)?.kv;
                let if_revision = current.as_ref().map_or(0, |kv| kv.mod_revision);
                let spec = match change {
                    KeyChange::Push(spec) => spec.clone(),
                    KeyChange::Rollback => {
                        let current = current.ok_or_else(|| {
                            ApiError::new(
                                "no_previous_version",
                                format!("{key} does not exist; nothing to roll back"),
                            )
                        })?;
                        previous_valid(store, key, &current).await?
                    }
                };
                let revision = put_spec(store, key, &spec, if_revision).await?;
                Ok::<_, ApiError>((revision, spec))
            }
            .await;
            match written {
                Ok((revision, spec)) => {
                    if matches!(change, KeyChange::Rollback) {
                        restored.get_or_insert(spec);
                    }
                    let waits = clients.iter().map(|client| await_revision(client, revision));
                    let results = futures_util::future::join_all(waits).await;
                    outcomes.extend(clients.iter().map(|c| c.url.clone()).zip(results));
                }
                Err(error) => outcomes.extend(clients.iter().map(|client| {
                    let message = format!("{key}: {}", error.message);
                    (
                        client.url.clone(),
                        PushOutcome::Refused { status: 409, code: error.code.clone(), message },
                    )
                })),
            }
        }
        (outcomes, restored)
    }

    /// Every router against the key it watches, read now (not from the once-a-second cache, so a push's
    /// effect shows as soon as the routers report it).
    pub async fn drift(&self) -> Result<EtcdDrift, ApiError> {
        let store = self.etcd_key()?;
        let clients = self.inner.routers.admin_clients();
        let states = futures_util::future::join_all(clients.iter().map(AdminClient::state)).await;
        let reports: Vec<(String, EtcdReport)> = clients
            .iter()
            .zip(states)
            .map(|(client, state)| (client.url.clone(), report_of(state.map_err(|e| e.to_string()))))
            .collect();
        let mut revisions = BTreeMap::new();
        for key in fleet_rollout::watched_keys(reports.iter().map(|(_, r)| r)) {
            let revision = store.client.get(&key).await.ok().map(|r| r.kv.map_or(0, |kv| kv.mod_revision));
            revisions.insert(key, revision);
        }
        let drift = fleet_rollout::etcd_drift(&reports, &revisions);
        let lag = |lag: fleet_rollout::Lag| LaggingRouter {
            url: lag.router,
            revision: lag.revision,
            reason: lag.reason,
        };
        Ok(EtcdDrift {
            keys: drift
                .keys
                .into_iter()
                .map(|(key, state)| KeyDrift {
                    key,
                    revision: state.revision.unwrap_or(0),
                    in_sync: state.in_sync,
                    lagging: state.lagging.into_iter().map(lag).collect(),
                })
                .collect(),
            not_on_etcd: drift.not_on_etcd,
            unreadable: drift
                .unreadable
                .into_iter()
                .map(|(url, reason)| LaggingRouter { url, revision: None, reason })
                .collect(),
        })
    }
}

/// Waits until `client`'s router runs `revision` of its key: applied (with the router's version), refused
/// (it found the value invalid) or unreachable (no report in time, with its last error).
async fn await_revision(client: &AdminClient, revision: i64) -> PushOutcome {
    let deadline = tokio::time::Instant::now() + APPLY_WAIT;
    loop {
        let last = match client.state().await {
            Ok(state) => {
                if state.policy.etcd_revision.is_some_and(|runs| runs >= revision) {
                    return PushOutcome::Applied { version: state.policy.version };
                }
                let store = state.etcd.unwrap_or_default();
                if let Some(refused) = store.last_rejected.filter(|r| r.revision == revision) {
                    return PushOutcome::Refused {
                        status: 422,
                        code: "invalid_spec".into(),
                        message: refused.reason,
                    };
                }
                store.error.unwrap_or_else(|| format!("it runs revision {:?}", state.policy.etcd_revision))
            }
            Err(error) => error.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return PushOutcome::Unreachable {
                error: format!("the router did not run revision {revision} within {APPLY_WAIT:?}: {last}"),
            };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_keys_live_beside_the_main_key() {
        let store = EtcdKey::new(&EtcdPolicyConfig {
            etcd: EtcdConfig::new("http://127.0.0.1:2379"),
            key: "/fleetdeck/prod/policy".into(),
        })
        .unwrap();
        assert_eq!(store.key(None).unwrap(), "/fleetdeck/prod/policy");
        assert_eq!(store.key(Some("/fleetdeck/prod/canary")).unwrap(), "/fleetdeck/prod/canary");
        for bad in ["/fleetdeck/other/policy", "/fleetdeck/prod/", "/etc/passwd"] {
            assert_eq!(store.key(Some(bad)).unwrap_err().code, "bad_request", "{bad}");
        }
    }

    #[test]
    fn values_are_read_as_routers_read_them() {
        assert_eq!(spec_of(br#"{"policy": "least_load"}"#).unwrap().policy, "least_load");
        assert!(spec_of(b"policy: no_such_policy").is_err());
        assert!(spec_of(&[0xff, 0xfe]).unwrap_err().contains("UTF-8"));
    }
}
