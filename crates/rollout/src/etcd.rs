//! Drift of routers that take their policy from a store (etcd): a router is in sync when the revision it
//! runs is the key's, and lags otherwise, with the likeliest reason (it refused the value, it lost the
//! store, it has not caught up yet).
//!
//! Revisions, not specs, are compared: etcd's `mod_revision` names one write, so a router at the key's
//! revision runs exactly the bytes the app wrote, and one behind it does not, whatever the specs say.

use std::collections::BTreeMap;

/// What one router reported (`GET /admin/state`), or why it could not be read.
#[derive(Clone, Debug, PartialEq)]
pub enum EtcdReport {
    /// It answered.
    Read {
        /// The key it watches; `None` when it takes no policy from the store.
        key: Option<String>,
        /// The `mod_revision` of the value it runs (`None`: nothing from the store yet).
        revision: Option<i64>,
        /// Whether its last call to the store succeeded.
        connected: bool,
        /// The last value it refused: `(revision, reason)`.
        last_rejected: Option<(i64, String)>,
        /// Its watcher's last error.
        error: Option<String>,
    },
    /// It did not answer.
    Unreadable(String),
}

/// One router behind its key.
#[derive(Clone, Debug, PartialEq)]
pub struct Lag {
    /// The router.
    pub router: String,
    /// The revision it runs.
    pub revision: Option<i64>,
    /// Why it is behind, for the operator.
    pub reason: String,
}

/// The routers of one key.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct KeyState {
    /// The key's `mod_revision` (0: absent; `None`: the app could not read it).
    pub revision: Option<i64>,
    /// Routers at it.
    pub in_sync: Vec<String>,
    /// Routers behind it.
    pub lagging: Vec<Lag>,
}

/// The drift of a fleet on a store.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct EtcdDrift {
    /// By key.
    pub keys: BTreeMap<String, KeyState>,
    /// Routers that take no policy from the store.
    pub not_on_etcd: Vec<String>,
    /// Routers that did not answer.
    pub unreadable: Vec<(String, String)>,
}

/// The keys the routers watch, each once, in order: the ones whose revisions the app must read.
pub fn watched_keys<'a>(reports: impl IntoIterator<Item = &'a EtcdReport>) -> Vec<String> {
    let mut keys: Vec<String> = reports
        .into_iter()
        .filter_map(|report| match report {
            EtcdReport::Read { key: Some(key), .. } => Some(key.clone()),
            _ => None,
        })
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Compares each router with the revision of the key it watches (`key_revisions`: key -> its revision,
/// `None` when the app could not read it).
pub fn etcd_drift(
    reports: &[(String, EtcdReport)],
    key_revisions: &BTreeMap<String, Option<i64>>,
) -> EtcdDrift {
    let mut drift = EtcdDrift::default();
    for (router, report) in reports {
        let (key, revision, connected, last_rejected, error) = match report {
            EtcdReport::Unreadable(why) => {
                drift.unreadable.push((router.clone(), why.clone()));
                continue;
            }
            EtcdReport::Read { key: None, .. } => {
                drift.not_on_etcd.push(router.clone());
                continue;
            }
            EtcdReport::Read { key: Some(key), revision, connected, last_rejected, error } => {
                (key, *revision, *connected, last_rejected, error)
            }
        };
        let key_revision = key_revisions.get(key).copied().flatten();
        let state = drift.keys.entry(key.clone()).or_default();
        state.revision = key_revision;
        let Some(target) = key_revision else {
            state.lagging.push(Lag {
                router: router.clone(),
                revision,
                reason: "the app cannot read the key from etcd, so it cannot tell".to_owned(),
            });
            continue;
        };
        if target == 0 || revision.is_some_and(|runs| runs >= target) {
            // An absent key asks nothing of a router; one at or past the key runs what it holds.
            state.in_sync.push(router.clone());
            continue;
        }
        let reason = match (last_rejected, connected, error) {
            (Some((refused, why)), _, _) if *refused == target => {
                format!(
                    "it refused the key's value (revision {refused}) and keeps its last good policy: {why}"
                )
            }
            (_, false, Some(error)) => format!("it cannot reach etcd: {error}"),
            (_, false, None) => "it has not reached etcd yet".to_owned(),
            _ => format!("it has not applied revision {target} yet"),
        };
        state.lagging.push(Lag { router: router.clone(), revision, reason });
    }
    drift
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(key: &str, revision: Option<i64>) -> EtcdReport {
        EtcdReport::Read {
            key: Some(key.into()),
            revision,
            connected: true,
            last_rejected: None,
            error: None,
        }
    }

    #[test]
    fn each_router_is_judged_against_its_own_key() {
        let reports = vec![
            ("a".to_owned(), read("/f/policy", Some(7))),
            ("b".to_owned(), read("/f/policy", Some(5))),
            ("c".to_owned(), read("/f/canary", Some(9))),
            (
                "d".to_owned(),
                EtcdReport::Read {
                    key: None,
                    revision: None,
                    connected: false,
                    last_rejected: None,
                    error: None,
                },
            ),
            ("e".to_owned(), EtcdReport::Unreadable("timeout".into())),
            (
                "f".to_owned(),
                EtcdReport::Read {
                    key: Some("/f/policy".into()),
                    revision: Some(5),
                    connected: true,
                    last_rejected: Some((7, "unknown policy".into())),
                    error: None,
                },
            ),
            (
                "g".to_owned(),
                EtcdReport::Read {
                    key: Some("/f/policy".into()),
                    revision: Some(5),
                    connected: false,
                    last_rejected: None,
                    error: Some("connection refused".into()),
                },
            ),
        ];
        assert_eq!(watched_keys(reports.iter().map(|(_, r)| r)), ["/f/canary", "/f/policy"]);
        let revisions =
            BTreeMap::from([("/f/policy".to_owned(), Some(7)), ("/f/canary".to_owned(), Some(9))]);
        let drift = etcd_drift(&reports, &revisions);
        let main = &drift.keys["/f/policy"];
        assert_eq!(main.in_sync, ["a"]);
        let reasons: Vec<(&str, &str)> =
            main.lagging.iter().map(|l| (l.router.as_str(), l.reason.as_str())).collect();
        assert_eq!(reasons[0], ("b", "it has not applied revision 7 yet"));
        assert!(reasons[1].1.contains("refused") && reasons[1].1.contains("unknown policy"), "{reasons:?}");
        assert!(reasons[2].1.contains("connection refused"), "{reasons:?}");
        assert_eq!(drift.keys["/f/canary"].in_sync, ["c"]);
        assert_eq!(drift.not_on_etcd, ["d"]);
        assert_eq!(drift.unreadable, [("e".to_owned(), "timeout".to_owned())]);
    }

    #[test]
    fn an_absent_key_is_no_drift_and_an_unreadable_one_is_not_sync() {
        let reports = vec![("a".to_owned(), read("/k", None))];
        let absent = etcd_drift(&reports, &BTreeMap::from([("/k".to_owned(), Some(0))]));
        assert_eq!(absent.keys["/k"].in_sync, ["a"]);
        let unknown = etcd_drift(&reports, &BTreeMap::from([("/k".to_owned(), None)]));
        assert_eq!(unknown.keys["/k"].lagging.len(), 1);
    }
}
