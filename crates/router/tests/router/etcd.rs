//! The policy from etcd, against a real etcd (Debian's etcd-server, started by the test on loopback): the
//! router starts with the key's value, swaps on every change, refuses an invalid value and keeps its last
//! good policy (counted, shown), refuses admin policy changes, keeps its policy through an etcd outage and
//! catches up after it, and reads a key behind etcd's user/password auth. Routers over one fleet share
//! their in-flight load through etcd (`peer_load`): each hears of the others' requests, forgets a router
//! whose key goes (its lease expired, or it shut down), and places a prefix where another router sent it;
//! they split the reads of the replicas' `/metrics` among themselves, and take over a gone router's share.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use fleet_etcd::Credentials;
use fleet_router::engine_load::reader_of;
use fleet_router::{EngineMetricsConfig, EtcdPolicySource, PeerLoadConfig, RouterConfig};
use fleet_sim::ModelConfig;
use fleet_test_support::endpoints::gated_replica;
use fleet_test_support::etcd::EtcdServer;
use fleet_test_support::{eventually, spawn_sim};
use serde_json::Value;

use crate::support::{TOKEN, TestRouter, client, router};

const KEY: &str = "/fleetdeck/test/policy";

async fn etcd_router(source: EtcdPolicySource) -> Result<TestRouter> {
    router(RouterConfig {
        admin_token: Some(TOKEN.into()),
        policy_etcd: Some(source),
        ..RouterConfig::default()
    })
    .await
}

fn source(etcd: &EtcdServer) -> EtcdPolicySource {
    let mut source = EtcdPolicySource::new(&etcd.url(), KEY);
    source.check_every = Duration::from_millis(500);
    source
}

/// Waits until the router's `/admin/state` satisfies `check`; returns that state.
async fn state_until(router: &TestRouter, what: &str, check: impl Fn(&Value) -> bool) -> Result<Value> {
    let http = client();
    eventually(what, Duration::from_secs(20), || {
        let http = http.clone();
        let check = &check;
        async move {
            let state = router.admin_get(&http, "/admin/state").await?;
            Ok(check(&state).then_some(state))
        }
    })
    .await
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find(|line| line.starts_with(name))?.rsplit(' ').next()?.parse().ok()
}

#[tokio::test]
async fn the_policy_follows_the_key_refuses_bad_values_and_survives_an_etcd_outage() -> Result<()> {
    let mut etcd = EtcdServer::start().await?;
    let store = etcd.client()?;
    let first = store.put(KEY, br#"{"policy": "least_load"}"#).await?;
    let router = etcd_router(source(&etcd)).await?;
    // Read at start: the router serves the key's policy from its first request.
    let policy = router.state.policy.load_full();
    assert_eq!((policy.name, policy.store_revision), ("least_load", Some(first)));

    let second = store.put(KEY, b"policy: power_of_two\n").await?;
    let state = state_until(&router, "the router to run revision 2", |s| {
        s["policy"]["store_revision"].as_i64() == Some(second)
    })
    .await?;
    assert_eq!(state["policy"]["name"], "power_of_two");
    assert_eq!(state["policy_store"]["key"], KEY);
    assert_eq!(state["policy_store"]["connected"], true);

    // An invalid value is refused: the last good policy stays, and the refusal is counted and shown.
    let bad = store.put(KEY, br#"{"policy": "no_such_policy"}"#).await?;
    let state = state_until(&router, "the router to see the bad value", |s| {
        s["policy_store"]["seen_revision"].as_i64() == Some(bad)
    })
    .await?;
    assert_eq!(state["policy"]["name"], "power_of_two");
    assert_eq!(state["policy"]["store_revision"].as_i64(), Some(second));
    assert_eq!(state["policy_store"]["rejected_total"], 1);
    assert_eq!(state["policy_store"]["last_rejected"]["revision"].as_i64(), Some(bad));
    assert!(
        state["policy_store"]["last_rejected"]["reason"].as_str().unwrap_or("").contains("no_such_policy")
    );
    let metrics = client().get(format!("{}/metrics", router.url)).send().await?.text().await?;
    assert_eq!(metric(&metrics, "fleet_router_policy_store_rejected_total"), Some(1.0), "{metrics}");
    assert_eq!(metric(&metrics, "fleet_router_policy_store_revision"), Some(second as f64));
    crate::admin::promtool_check(&metrics).await?;
    // Garbage that is not even text is refused the same way.
    let binary = store.put(KEY, &[0xff, 0x00, 0xfe]).await?;
    state_until(&router, "the binary value refused", |s| {
        s["policy_store"]["rejected_total"] == 2
            && s["policy_store"]["seen_revision"].as_i64() == Some(binary)
    })
    .await?;
    assert_eq!(router.state.policy.load().name, "power_of_two");

    // The admin API no longer changes the policy: the store would undo it.
    let http = client();
    let put = http
        .put(format!("{}/admin/policy", router.url))
        .bearer_auth(TOKEN)
        .header("If-Match", format!("\"{}\"", router.state.policy.load().version))
        .body(r#"{"policy": "random"}"#)
        .send()
        .await?;
    assert_eq!(put.status(), 409);
    let body: Value = put.json().await?;
    assert_eq!(body["code"], "policy_from_store");
    let rollback =
        http.post(format!("{}/admin/policy/rollback", router.url)).bearer_auth(TOKEN).send().await?;
    assert_eq!(rollback.status(), 409);

    // etcd dies: the router keeps its policy and says it lost the store.
    etcd.kill();
    let state = state_until(&router, "the router to notice etcd is gone", |s| {
        s["policy_store"]["connected"] == false
    })
    .await?;
    assert_eq!(state["policy"]["name"], "power_of_two");
    assert!(state["policy_store"]["error"].is_string(), "{state}");
    // etcd comes back (same data): the router reconnects and takes the next change.
    etcd.restart().await?;
    let store = etcd.client()?;
    let after = store.put(KEY, br#"{"policy": "round_robin"}"#).await?;
    let state = state_until(&router, "the router to catch up after the outage", |s| {
        s["policy"]["store_revision"].as_i64() == Some(after)
    })
    .await?;
    assert_eq!(state["policy"]["name"], "round_robin");
    assert!(state["policy_store"]["reconnects_total"].as_u64().unwrap_or(0) >= 1, "{state}");
    // Every good value was applied once (start, revision 2, after the outage); no bad one ever ran.
    assert_eq!(router.state.metrics.policy_swaps.load(std::sync::atomic::Ordering::Relaxed), 3);
    Ok(())
}

/// Runs etcdctl against `etcd` (as root once auth is on).
fn etcdctl(etcd: &EtcdServer, args: &[&str]) -> Result<()> {
    let output = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(etcd.url())
        .args(args)
        .output()
        .context("cannot run etcdctl; run `cargo xtask setup --test` (Debian's etcd-client)")?;
    if !output.status.success() {
        bail!("etcdctl {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(())
}

#[tokio::test]
async fn the_router_reads_a_key_behind_etcd_auth_and_says_when_its_password_is_wrong() -> Result<()> {
    let etcd = EtcdServer::start().await?;
    etcd.client()?.put(KEY, br#"{"policy": "least_load"}"#).await?;
    for args in [
        &["user", "add", "root:root-pw"][..],
        &["user", "grant-role", "root", "root"],
        &["role", "add", "policy-reader"],
        &["role", "grant-permission", "policy-reader", "read", "/fleetdeck/", "--prefix=true"],
        &["user", "add", "router:router-pw"],
        &["user", "grant-role", "router", "policy-reader"],
        &["auth", "enable"],
    ] {
        etcdctl(&etcd, args)?;
    }
    // Without credentials the key cannot be read any more.
    assert!(etcd.client()?.get(KEY).await.is_err());

    let good = etcd.dir().join("router.user");
    std::fs::write(&good, "router:router-pw\n")?;
    let mut with_auth = source(&etcd);
    with_auth.etcd.credentials = Some(Credentials::from_file(&good)?);
    let router = etcd_router(with_auth).await?;
    assert_eq!(router.state.policy.load().name, "least_load");

    let mut wrong = source(&etcd);
    wrong.etcd.credentials = Some(Credentials::new("router", "not-the-password"));
    let refused = etcd_router(wrong).await?;
    let state = state_until(&refused, "the wrong password to be reported", |s| {
        s["policy_store"]["error"].as_str().is_some_and(|e| e.contains("authentication failed"))
    })
    .await?;
    assert_eq!(state["policy_store"]["connected"], false);
    assert_eq!(state["policy"]["name"], "round_robin");
    // The password never shows, in the state or in the config's debug form.
    assert!(!state.to_string().contains("not-the-password"));
    assert!(!format!("{:?}", refused.state.config).contains("not-the-password"));
    Ok(())
}

const LOAD_PREFIX: &str = "/fleetdeck/test/load/";

/// The `peer_load.peers` names in a router's state.
fn peer_names(state: &Value) -> Vec<String> {
    state["peer_load"]["peers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|peer| peer["name"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn routers_share_their_in_flight_load_through_etcd_and_forget_a_router_whose_key_goes() -> Result<()> {
    let etcd = EtcdServer::start().await?;
    let store = etcd.client()?;
    let gated = gated_replica().await?;
    let sharing = |name: &str| {
        let mut share = PeerLoadConfig::new(&etcd.url(), LOAD_PREFIX, name);
        share.interval = Duration::from_millis(50);
        share
    };
    let over_the_replica = |name: &str| RouterConfig {
        replicas: vec![gated.endpoint.url()],
        admin_token: Some(TOKEN.into()),
        peer_load: Some(sharing(name)),
        ..RouterConfig::default()
    };
    let a = router(over_the_replica("a")).await?;
    let b = router(over_the_replica("b")).await?;
    let http = client();

    // A request through router a waits at the replica: b hears of it from a's summary, not from its own counts.
    let prompt = "fleetdeck ".repeat(128);
    let sent = tokio::spawn({
        let (http, url) = (http.clone(), a.url.clone());
        async move {
            http.post(format!("{url}/v1/completions"))
                .json(&serde_json::json!({"model": "m", "prompt": prompt, "max_tokens": 3}))
                .send()
                .await
        }
    });
    gated.arrived().await;
    let state =
        state_until(&b, "b to hear of a's request", |s| s["replicas"][0]["load"]["peers"]["requests"] == 1)
            .await?;
    let heard = &state["replicas"][0];
    assert_eq!(heard["outstanding"], 0, "b routed nothing itself: {state}");
    assert!(heard["load"]["peers"]["prefill_blocks"].as_u64().unwrap_or(0) >= 10, "{state}");
    assert_eq!(peer_names(&state), ["a"]);
    assert_eq!(state["peer_load"]["peers"][0]["counted"], true);
    assert_eq!(state["peer_load"]["key"], format!("{LOAD_PREFIX}b"));
    // b's watcher can hear of a before b's own first write lands: connected means both have succeeded.
    let state =
        state_until(&b, "b's publisher and watcher to both succeed", |s| s["peer_load"]["connected"] == true)
            .await?;
    assert!(state["peer_load"]["publish_error"].is_null() && state["peer_load"]["watch_error"].is_null());
    let metrics = http.get(format!("{}/metrics", b.url)).send().await?.text().await?;
    assert_eq!(metric(&metrics, "fleet_router_peer_routers"), Some(1.0), "{metrics}");
    crate::admin::promtool_check(&metrics).await?;
    // A router never counts itself: a hears only of b, which is idle.
    let state = state_until(&a, "a to hear of b", |s| peer_names(s) == ["b"]).await?;
    assert_eq!(state["replicas"][0]["outstanding"], 1);

    // The request ends: its load leaves b's view with a's next summary.
    gated.open();
    let answer = sent.await??;
    assert!(answer.status().is_success(), "{}", answer.status());
    state_until(&b, "a's finished request to leave b's view", |s| {
        s["replicas"][0]["load"]["peers"]["requests"] == 0
    })
    .await?;

    // A value under the prefix that is no summary is skipped and counted.
    store.put(&format!("{LOAD_PREFIX}junk"), b"not a summary").await?;
    state_until(&b, "the junk value to be counted", |s| s["peer_load"]["malformed_total"] == 1).await?;

    // A router that dies without a word: its key goes when its lease expires, and its load with it.
    let replica_url = state["replicas"][0]["url"].as_str().context("the replica's URL")?.to_owned();
    let summary = serde_json::json!({
        "router": "c",
        "replicas": {replica_url: {"requests": 5, "prefill_blocks": 100, "decode_blocks": 0}},
    });
    let lease = store.grant_lease(2).await?;
    store.put_with_lease(&format!("{LOAD_PREFIX}c"), summary.to_string().as_bytes(), lease.id).await?;
    state_until(&b, "c's load to count", |s| s["replicas"][0]["load"]["peers"]["requests"] == 5).await?;
    state_until(&b, "c to be forgotten when its lease expires", |s| !peer_names(s).contains(&"c".to_owned()))
        .await?;

    // A router that shuts down is forgotten too (it revokes its lease; the lease's expiry would do it
    // within 3 s, which this test cannot tell apart without timing it).
    drop(a);
    let state = state_until(&b, "a to be forgotten once it stopped", |s| peer_names(s).is_empty()).await?;
    assert!(state["replicas"][0]["load"]["peers"].is_null(), "{state}");
    Ok(())
}

#[tokio::test]
async fn a_router_places_a_prefix_where_another_router_sent_it() -> Result<()> {
    let etcd = EtcdServer::start().await?;
    let sim = spawn_sim(3, ModelConfig::default()).await?;
    let over_the_fleet = |name: &str| -> Result<RouterConfig> {
        let mut share = PeerLoadConfig::new(&etcd.url(), LOAD_PREFIX, name);
        share.interval = Duration::from_millis(50);
        Ok(RouterConfig {
            replicas: sim.urls().to_vec(),
            admin_token: Some(TOKEN.into()),
            policy: "policy: cache_aware_approx\n".parse()?,
            peer_load: Some(share),
            ..RouterConfig::default()
        })
    };
    let a = router(over_the_fleet("a")?).await?;
    let b = router(over_the_fleet("b")?).await?;
    let http = client();
    let complete = |url: String, prompt: String| {
        let http = http.clone();
        async move {
            let response = http
                .post(format!("{url}/v1/completions"))
                .json(&serde_json::json!({"prompt": prompt, "max_tokens": 2}))
                .send()
                .await?;
            anyhow::ensure!(response.status().is_success(), "{}", response.status());
            let replica = response.headers()["x-fleet-replica"].to_str()?.to_owned();
            response.bytes().await?;
            Ok(replica)
        }
    };
    // Two prompts through router a, one after the other: the second goes to another replica than the
    // first (an idle fleet's tie goes to the replica a's index credits with fewer blocks).
    let first = complete(a.url.clone(), "an unrelated prompt ".repeat(100)).await?;
    let shared = "You are the support assistant of ACME. Answer briefly and politely. ".repeat(30);
    let placed = complete(a.url.clone(), format!("{shared} first question")).await?;
    assert_ne!(first, placed);
    state_until(&b, "b to receive a's two prompts", |s| s["peer_load"]["prompts_received_total"] == 2)
        .await?;
    let state = b.admin_get(&http, "/admin/state").await?;
    let marks = |url: &str| {
        state["replicas"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["url"] == url)
            .map(|r| r["load"]["peer_marks"].clone())
    };
    assert!(marks(&placed).and_then(|m| m.as_u64()) > Some(0), "{state}");

    // Router b never routed the prompt, yet sends it where a did, for the cache.
    assert_eq!(complete(b.url.clone(), format!("{shared} second question")).await?, placed);
    let decisions = b.admin_get(&http, "/admin/decisions?limit=1").await?;
    let decision = &decisions[0]["decision"];
    assert_eq!(decision["branch"], "cache", "{decision}");
    let metrics = http.get(format!("{}/metrics", a.url)).send().await?.text().await?;
    assert_eq!(metric(&metrics, "fleet_router_peer_prompts_published_total"), Some(2.0), "{metrics}");
    Ok(())
}

#[tokio::test]
async fn routers_split_the_replicas_metrics_reads_and_one_takes_over_when_another_goes() -> Result<()> {
    let etcd = EtcdServer::start().await?;
    let sim = spawn_sim(4, ModelConfig::default()).await?;
    // Routers a and b share their engine reads; c reads every replica itself (--engine-metrics-read-all).
    let over_the_fleet = |name: &str, share_engine_reads: bool| {
        let mut share = PeerLoadConfig::new(&etcd.url(), LOAD_PREFIX, name);
        share.interval = Duration::from_millis(50);
        share.share_engine_reads = share_engine_reads;
        RouterConfig {
            replicas: sim.urls().to_vec(),
            admin_token: Some(TOKEN.into()),
            engine_metrics: EngineMetricsConfig {
                interval: Duration::from_millis(100),
                ..EngineMetricsConfig::default()
            },
            peer_load: Some(share),
            ..RouterConfig::default()
        }
    };
    let a = router(over_the_fleet("a", true)).await?;
    let b = router(over_the_fleet("b", true)).await?;
    let c = router(over_the_fleet("c", false)).await?;
    // Each replica is read by a or b, whichever ranks first for its URL (c takes no share), and the other
    // holds that router's figures, fresh.
    let reader = |url: &str| reader_of(url, ["a", "b"]).map(str::to_owned);
    let split_as_hashed = |me: &str, state: &Value| {
        state["replicas"].as_array().is_some_and(|replicas| {
            replicas.len() == 4
                && replicas.iter().all(|replica| {
                    let engine = &replica["engine"];
                    let expected = reader(replica["url"].as_str().unwrap_or_default())
                        .filter(|reader| reader != me)
                        .map_or(Value::Null, Value::from);
                    engine["stale"] == false && engine["read_by"] == expected
                })
        })
    };
    // The routers start one after another, so b may split the reads with a before c's first summary
    // reaches it, and hold a's figures before its own next tick leaves a replica to a: wait for all three.
    let hears_of_c = |state: &Value| {
        state["peer_load"]["peers"].as_array().is_some_and(|peers| peers.iter().any(|p| p["name"] == "c"))
    };
    let delegated_to_a = |state: &Value| {
        state["replicas"].as_array().is_some_and(|replicas| {
            replicas.iter().all(|replica| {
                reader(replica["url"].as_str().unwrap_or_default()).as_deref() != Some("a")
                    || replica["engine"]["scrapes_delegated"].as_u64() > Some(0)
            })
        })
    };
    let state = state_until(&b, "b to read its replicas, take a's reads of the others and hear of c", |s| {
        split_as_hashed("b", s) && hears_of_c(s) && delegated_to_a(s)
    })
    .await?;
    let peers = state["peer_load"]["peers"].as_array().context("b's peers")?;
    let c_entry = peers.iter().find(|p| p["name"] == "c").context("b hears of c")?;
    assert!(c_entry["engine_reads"].is_null(), "c shares no reads: {state}");
    state_until(&a, "a to read its replicas and take b's reads of the others", |s| split_as_hashed("a", s))
        .await?;
    // b left a's replicas to a on some ticks, and says so in its metrics too.
    let metrics = client().get(format!("{}/metrics", b.url)).send().await?.text().await?;
    crate::admin::promtool_check(&metrics).await?;
    let delegated: f64 = metrics
        .lines()
        .filter(|line| line.starts_with("fleet_router_replica_engine_scrapes_delegated_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let a_reads = sim.urls().iter().filter(|url| reader(url).as_deref() == Some("a")).count();
    assert_eq!(
        delegated > 0.0,
        a_reads > 0,
        "a reads {a_reads} replicas, b delegated {delegated}: {metrics}"
    );
    // c reads everything itself, whatever the others share.
    state_until(&c, "c to read every replica itself", |s| {
        s["replicas"].as_array().is_some_and(|replicas| {
            replicas.iter().all(|r| r["engine"]["stale"] == false && r["engine"]["read_by"].is_null())
        })
    })
    .await?;

    // a goes: b reads every replica itself again, its figures never lapsing for want of a reader.
    drop(a);
    state_until(&b, "b to read every replica itself once a is gone", |s| {
        s["replicas"].as_array().is_some_and(|replicas| {
            replicas.iter().all(|r| r["engine"]["stale"] == false && r["engine"]["read_by"].is_null())
        })
    })
    .await?;
    Ok(())
}
