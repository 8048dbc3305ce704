//! A fleet on etcd at scale: one real etcd, 50 fleet-router processes (one worker thread each) watching one
//! key, and the app pushing 20 policy versions and a rollback through the key. Every router reaches every
//! version (each one's revision, then its swap counter: one swap per good value, none missed, none twice),
//! an invalid value written straight into etcd is refused by every router, a stale push and an invalid spec
//! are refused by the app before etcd, etcd killed and restarted mid-run leaves every router on its last
//! policy until it catches up, and the app's drift view is empty at the end.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use fleet_test_support::etcd::EtcdServer;
use fleet_test_support::process::{ChildProcess, spawn_router_process};
use fleet_test_support::{eventually, spawn_sim};
use fleetdeck_api::{EtcdKeyArgs, EtcdPushArgs, EtcdRollbackArgs};
use fleetdeck_control::fleet_etcd::EtcdConfig;
use fleetdeck_control::{Control, ControlConfig, EtcdPolicyConfig, RouterTarget};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const ROUTERS: usize = 50;
const VERSIONS: usize = 20;
const KEY: &str = "/fleetdeck/scale/policy";
const TOKEN: &str = "etcd-scale-test-token";
/// The push after which an invalid value goes straight into etcd, and the one after which etcd is killed.
const INVALID_AFTER: usize = 7;
const OUTAGE_AFTER: usize = 12;

/// Version `i`'s spec: the policies take turns, so consecutive versions differ.
fn spec(i: usize) -> String {
    let policy = ["round_robin", "least_load", "power_of_two", "random"][i % 4];
    format!(r#"{{"policy": "{policy}"}}"#)
}

fn policy_name(i: usize) -> &'static str {
    ["round_robin", "least_load", "power_of_two", "random"][i % 4]
}

/// One fleet-router process watching `KEY`.
async fn start_router(
    etcd_url: &str,
    replica: &str,
    token_file: &std::path::Path,
) -> Result<(ChildProcess, String)> {
    let token_file = token_file.to_string_lossy();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--replica",
        replica,
        "--admin-token-file",
        &token_file,
        "--policy-etcd",
        etcd_url,
        "--policy-key",
        KEY,
        "--worker-threads",
        "1",
        "--health-interval-ms",
        "5000",
    ];
    spawn_router_process(&args.map(str::to_owned)).await
}

/// Every router's `/admin/state`.
async fn states(http: &reqwest::Client, urls: &[String]) -> Result<Vec<Value>> {
    let reads = urls.iter().map(|url| async move {
        let response = http.get(format!("{url}/admin/state")).bearer_auth(TOKEN).send().await?;
        anyhow::Ok(response.error_for_status()?.json::<Value>().await?)
    });
    futures_util::future::join_all(reads).await.into_iter().collect()
}

/// Waits until the app's drift view has every router on `revision` of the key and none lagging.
async fn all_on(control: &Control, revision: i64) -> Result<()> {
    eventually(
        &format!("all {ROUTERS} routers on revision {revision}"),
        Duration::from_secs(60),
        || async move {
            let drift = control.etcd().drift().await?;
            let [key] = drift.keys.as_slice() else { bail!("routers watch {} keys", drift.keys.len()) };
            if key.revision != revision {
                bail!("the key is at {}, not {revision}", key.revision);
            }
            if key.in_sync.len() == ROUTERS && drift.is_empty() {
                return Ok(Some(()));
            }
            bail!("{} in sync; first lagging: {:?}", key.in_sync.len(), key.lagging.first())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_routers_follow_every_push_refuse_a_bad_value_and_ride_out_an_etcd_restart() -> Result<()> {
    let mut etcd = EtcdServer::start().await?;
    let sim = spawn_sim(1, Default::default()).await?;
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("router.token");
    std::fs::write(&token_file, TOKEN)?;
    let store = etcd.client()?;
    let start_revision = store.put(KEY, spec(0).as_bytes()).await?;

    let etcd_url = etcd.url();
    let starts = (0..ROUTERS).map(|_| start_router(&etcd_url, &sim.urls()[0], &token_file));
    let started: Vec<(ChildProcess, String)> =
        futures_util::future::join_all(starts).await.into_iter().collect::<Result<_>>()?;
    let urls: Vec<String> = started.iter().map(|(_, url)| url.clone()).collect();

    let mut config = ControlConfig::new(Vec::new(), dir.path().join("history.db"));
    config.routers = urls
        .iter()
        .map(|url| RouterTarget { url: url.clone(), token: Some(TOKEN.into()), ..RouterTarget::default() })
        .collect();
    config.etcd_policy = Some(EtcdPolicyConfig { etcd: EtcdConfig::new(&etcd.url()), key: KEY.into() });
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let control = Control::start(config, stop).await?;
    all_on(&control, start_revision).await?;

    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let mut pushed = Vec::new();
    for i in 1..=VERSIONS {
        let reviewed = control.etcd().policy(EtcdKeyArgs::default()).await?;
        let report = control
            .etcd()
            .push(EtcdPushArgs {
                text: spec(i),
                if_revision: reviewed.revision,
                key: None,
                operator: Some("scale test".into()),
            })
            .await?;
        assert_eq!(report.previous_revision, reviewed.revision);
        all_on(&control, report.revision).await?;
        pushed.push(report.revision);

        if i == INVALID_AFTER {
            // Written past the app, straight into etcd: every router must refuse it and keep version i.
            let bad = store.put(KEY, br#"{"policy": "no_such_policy"}"#).await?;
            let drift =
                eventually("every router to refuse the invalid value", Duration::from_secs(60), || async {
                    let drift = control.etcd().drift().await?;
                    let refused = drift.keys.first().map_or(0, |k| {
                        k.lagging
                            .iter()
                            .filter(|l| l.revision == Some(report.revision) && l.reason.contains("refused"))
                            .count()
                    });
                    Ok((refused == ROUTERS).then_some(drift))
                })
                .await?;
            assert_eq!(drift.keys[0].revision, bad);
            for state in states(&http, &urls).await? {
                assert_eq!(state["policy"]["name"], policy_name(i), "{state}");
                assert_eq!(state["policy_store"]["rejected_total"], 1, "{state}");
            }
            // The app shows the key's value as invalid, and never writes one itself.
            let shown = control.etcd().policy(EtcdKeyArgs::default()).await?;
            assert_eq!(shown.revision, bad);
            assert!(shown.invalid.as_deref().unwrap_or("").contains("no_such_policy"), "{shown:?}");
            let refused = control
                .etcd()
                .push(EtcdPushArgs {
                    text: r#"{"policy": "no_such_policy"}"#.into(),
                    if_revision: bad,
                    key: None,
                    operator: None,
                })
                .await
                .unwrap_err();
            assert_eq!(refused.code, "invalid_spec", "{refused:?}");
            assert_eq!(store.get(KEY).await?.kv.map(|kv| kv.mod_revision), Some(bad));
        }

        if i == OUTAGE_AFTER {
            etcd.kill();
            let seen = eventually("every router to notice etcd is gone", Duration::from_secs(60), || async {
                let states = states(&http, &urls).await?;
                Ok(states.iter().all(|s| s["policy_store"]["connected"] == false).then_some(states))
            })
            .await?;
            // Each keeps its last policy through the outage.
            for state in &seen {
                assert_eq!(state["policy"]["store_revision"].as_i64(), Some(report.revision), "{state}");
                assert_eq!(state["policy"]["name"], policy_name(i), "{state}");
            }
            etcd.restart().await?;
        }
    }

    // A push reviewed against an old revision is refused and writes nothing.
    let before = control.etcd().policy(EtcdKeyArgs::default()).await?;
    let stale = control
        .etcd()
        .push(EtcdPushArgs { text: spec(1), if_revision: pushed[0], key: None, operator: None })
        .await
        .unwrap_err();
    assert_eq!(stale.code, "revision_conflict", "{stale:?}");
    assert_eq!(control.etcd().policy(EtcdKeyArgs::default()).await?.revision, before.revision);

    // Rollback: one guarded txn back to the previous value, and every router follows.
    let back = control
        .etcd()
        .rollback(EtcdRollbackArgs { if_revision: before.revision, key: None, operator: None })
        .await?;
    all_on(&control, back.revision).await?;
    let drift = control.etcd().drift().await?;
    assert!(drift.is_empty(), "{drift:?}");
    for state in states(&http, &urls).await? {
        assert_eq!(state["policy"]["name"], policy_name(VERSIONS - 1), "{state}");
        assert_eq!(state["policy_store"]["rejected_total"], 1, "{state}");
    }
    // Every router swapped exactly once per good value: the start, 20 pushes, the rollback. None was
    // skipped (each push waited for all) and the invalid value never ran.
    for url in &urls {
        let metrics = http.get(format!("{url}/metrics")).send().await?.text().await?;
        let swaps = metrics
            .lines()
            .find_map(|line| line.strip_prefix("fleet_router_policy_swaps_total "))
            .context("no swap counter")?;
        assert_eq!(swaps.trim(), (VERSIONS + 2).to_string(), "{url}");
    }
    // The audit trail has every write, attributed.
    let versions = control.audit().policy_history().await?;
    assert!(versions.versions.len() > VERSIONS, "{} versions recorded", versions.versions.len());
    Ok(())
}

/// A canary on a fleet on etcd: the canary router watches a group key of its own, so the canary is a write
/// to that key, its rollback a write of the key's previous value, and its promotion a write to the main key
/// (which the baseline watches).
#[tokio::test]
async fn a_canary_on_etcd_writes_its_group_key_rolls_it_back_and_promotes_through_the_main_key() -> Result<()>
{
    use fleet_test_support::admin_router::spawn_router_with;
    use fleetdeck_api::{AbortCanaryArgs, CanaryArgs, CanaryGuards};

    const MAIN: &str = "/fleetdeck/canary-test/policy";
    const GROUP: &str = "/fleetdeck/canary-test/canary";
    let etcd = EtcdServer::start().await?;
    let store = etcd.client()?;
    store.put(MAIN, spec(0).as_bytes()).await?;
    store.put(GROUP, spec(0).as_bytes()).await?;
    let sim = spawn_sim(2, Default::default()).await?;
    let router_on = |key: &str, replica: &str| fleet_router::RouterConfig {
        replicas: vec![replica.to_owned()],
        admin_token: Some(TOKEN.into()),
        policy_etcd: Some(fleet_router::EtcdPolicySource::new(&etcd.url(), key)),
        ..Default::default()
    };
    let canary = spawn_router_with(router_on(GROUP, &sim.urls()[0])).await?;
    let baseline = spawn_router_with(router_on(MAIN, &sim.urls()[1])).await?;
    let dir = tempfile::tempdir()?;
    let mut config = ControlConfig::new(Vec::new(), dir.path().join("history.db"));
    config.routers = [&canary, &baseline]
        .iter()
        .map(|r| RouterTarget { url: r.url(), token: Some(TOKEN.into()), ..RouterTarget::default() })
        .collect();
    config.etcd_policy = Some(EtcdPolicyConfig { etcd: EtcdConfig::new(&etcd.url()), key: MAIN.into() });
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let control = Control::start(config, stop).await?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let policy_of = |url: String| {
        let http = http.clone();
        async move {
            anyhow::Ok(
                states(&http, &[url]).await?.remove(0)["policy"]["name"].as_str().unwrap_or("").to_owned(),
            )
        }
    };
    let args = |observe_s: u64| CanaryArgs {
        text: "policy: least_load".into(),
        canary: vec![canary.url()],
        baseline: vec![baseline.url()],
        observe_s,
        guards: CanaryGuards {
            max_ttft_p95_ratio: Some(10.0),
            min_ttft_p95_increase_ms: Some(10_000.0),
            max_hit_rate_drop: Some(1.0),
            min_requests: Some(5),
            ..CanaryGuards::default()
        },
        check_every_ms: Some(300),
        operator: Some("ana".into()),
        reviewed: Vec::new(),
    };
    let phase = |wanted: &'static str| {
        let control = control.clone();
        async move {
            eventually(&format!("the canary to be {wanted}"), Duration::from_secs(60), || {
                let control = control.clone();
                async move { Ok(control.canary().status().await?.canary.filter(|c| c.phase == wanted)) }
            })
            .await
        }
    };

    // Aborted while observing: the group key goes back to its previous value, and so does the canary router.
    control.canary().start(args(600)).await?;
    phase("observing").await?;
    assert_eq!(policy_of(canary.url()).await?, "least_load");
    assert_eq!(policy_of(baseline.url()).await?, policy_name(0), "the baseline keeps its policy");
    control.canary().abort(AbortCanaryArgs { reason: "test".into() }).await?;
    let done = eventually("the canary to finish", Duration::from_secs(60), || async {
        Ok(control.canary().status().await?.canary.filter(|c| c.finished))
    })
    .await?;
    assert_eq!(done.phase, "rolled_back", "{done:?}");
    assert_eq!(policy_of(canary.url()).await?, policy_name(0));
    let group = control.etcd().policy(EtcdKeyArgs { key: Some(GROUP.into()) }).await?;
    assert!(group.text.unwrap_or_default().contains(policy_name(0)));

    // Watched with traffic on both sides and promoted: the main key takes the candidate.
    let _load_a = crate::rollout::traffic(&canary, 20.0, 1);
    let _load_b = crate::rollout::traffic(&baseline, 20.0, 2);
    control.canary().start(args(2)).await?;
    let promoted = phase("promoted").await?;
    assert!(promoted.finished, "{promoted:?}");
    assert_eq!(policy_of(baseline.url()).await?, "least_load");
    let main = control.etcd().policy(EtcdKeyArgs::default()).await?;
    assert!(main.text.unwrap_or_default().contains("least_load"));
    assert!(control.etcd().drift().await?.is_empty());
    let history = control.audit().policy_history().await?;
    assert!(history.versions.iter().any(|v| v.label.starts_with("rollback-of-canary-least_load@")));
    Ok(())
}

/// The app reaches an etcd that serves https and asks for a client certificate: with the CA and its
/// certificate it reads and pushes; without the certificate etcd turns it away and nothing is written.
#[tokio::test]
async fn the_app_pushes_to_an_etcd_over_https_with_a_client_certificate() -> Result<()> {
    let etcd = EtcdServer::start_tls().await?;
    let dir = tempfile::tempdir()?;
    let mut config = ControlConfig::new(Vec::new(), dir.path().join("history.db"));
    config.etcd_policy = Some(EtcdPolicyConfig { etcd: etcd.config(), key: KEY.into() });
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let control = Control::start(config, stop.child_token()).await?;
    let empty = control.etcd().policy(EtcdKeyArgs::default()).await?;
    assert_eq!((empty.revision, empty.text), (0, None));
    let pushed = control
        .etcd()
        .push(EtcdPushArgs { text: spec(1), if_revision: 0, key: None, operator: None })
        .await?;
    let read = control.etcd().policy(EtcdKeyArgs::default()).await?;
    assert_eq!(read.revision, pushed.revision);
    assert!(read.text.unwrap_or_default().contains(policy_name(1)));

    let mut no_certificate = etcd.config();
    no_certificate.tls.cert = None;
    no_certificate.tls.key = None;
    let mut config = ControlConfig::new(Vec::new(), dir.path().join("other.db"));
    config.etcd_policy = Some(EtcdPolicyConfig { etcd: no_certificate, key: KEY.into() });
    let turned_away = Control::start(config, stop.child_token()).await?;
    let error = turned_away
        .etcd()
        .push(EtcdPushArgs { text: spec(2), if_revision: pushed.revision, key: None, operator: None })
        .await
        .unwrap_err();
    assert_eq!(error.code, "etcd_unreachable", "{error:?}");
    assert_eq!(control.etcd().policy(EtcdKeyArgs::default()).await?.revision, pushed.revision);
    Ok(())
}
