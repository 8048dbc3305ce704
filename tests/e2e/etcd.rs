//! A fleet found and steered without typing a URL, in headless Chromium: the app reads its replicas and
//! routers from a discovery file (Settings shows the source and what it found) and the routers take their
//! policy from a real etcd key. The Push view's etcd card pushes through the key (every router reports the
//! new revision, drift clean), refuses to overwrite a key that moved since the operator reviewed it, pushes
//! again after a reload, and rolls back to the previous value.

use std::time::Duration;

use anyhow::{Context, Result};
use fantoccini::{Client, Locator};
use fleet_test_support::etcd::EtcdServer;
use fleet_test_support::process::{ChildProcess, spawn_headless, spawn_router_process};
use fleet_test_support::webdriver::{chromedriver, chromium_session};
use fleet_test_support::{eventually, spawn_sim};
use serde_json::{Value, json};

const TOKEN: &str = "e2e-store-token";
const KEY: &str = "/fleetdeck/e2e/policy";
const WAIT: Duration = Duration::from_secs(60);

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
    ];
    spawn_router_process(&args.map(str::to_owned)).await
}

/// The policy name a router runs and the etcd revision it reports.
async fn runs(url: &str) -> Result<(String, Option<i64>)> {
    let state: Value = reqwest::Client::new()
        .get(format!("{url}/admin/state"))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(5))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let policy = state["policy"]["name"].as_str().context("no policy name in /admin/state")?.to_owned();
    Ok((policy, state["policy"]["store_revision"].as_i64()))
}

/// Sets a form element's value the way typing would, firing input and change.
async fn type_into(browser: &Client, testid: &str, value: &str) -> Result<()> {
    let script = r#"
        const el = document.querySelector(`[data-testid="${arguments[0]}"]`);
        if (!el) { return false; }
        el.value = arguments[1];
        el.dispatchEvent(new Event('input', { bubbles: true }));
        return true;
    "#;
    let found = browser.execute(script, vec![json!(testid), json!(value)]).await?;
    anyhow::ensure!(found == json!(true), "no element with data-testid={testid}");
    Ok(())
}

async fn text_of(browser: &Client, css: &str) -> Result<String> {
    Ok(browser.find(Locator::Css(css)).await?.text().await?)
}

async fn click(browser: &Client, testid: &str) -> Result<()> {
    browser.find(Locator::Css(&format!("[data-testid={testid}]"))).await?.click().await?;
    Ok(())
}

/// The revision the etcd card shows as reviewed, once it shows `wanted`.
async fn reviewed_revision_becomes(browser: &Client, wanted: i64) -> Result<()> {
    eventually(&format!("the etcd card to show revision {wanted}"), WAIT, || async {
        let shown = text_of(browser, "[data-testid=store-revision]").await?;
        Ok((shown.trim() == wanted.to_string()).then_some(()))
    })
    .await
}

/// Both routers run `policy` at `revision`, and the card's drift table says so.
async fn both_run(browser: &Client, routers: &[String], policy: &str, revision: i64) -> Result<()> {
    for url in routers {
        eventually(&format!("{url} to run {policy} at revision {revision}"), WAIT, || async {
            let (runs_policy, runs_revision) = runs(url).await?;
            Ok((runs_policy == policy && runs_revision == Some(revision)).then_some(()))
        })
        .await?;
    }
    eventually("the etcd card's drift to be clean with both routers in sync", WAIT, || async {
        let clean = browser.find(Locator::Css("[data-testid=store-drift][data-clean=true]")).await.is_ok();
        let synced =
            browser.find_all(Locator::Css("[data-testid=store-router][data-state='in sync']")).await?;
        Ok((clean && synced.len() == 2).then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovered_fleet_is_pushed_through_etcd_from_the_browser() -> Result<()> {
    let etcd = EtcdServer::start().await?;
    let etcd_client = etcd.client()?;
    let sim = spawn_sim(2, Default::default()).await?;
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("router.token");
    fleet_store::secrets::write_token_file(&token_file, TOKEN)?;
    let (_router_a, a) = start_router(&etcd.url(), &sim.urls()[0], &token_file).await?;
    let (_router_b, b) = start_router(&etcd.url(), &sim.urls()[1], &token_file).await?;
    let routers = vec![a.clone(), b.clone()];

    // The fleet as operators template it for Prometheus: replicas, and routers with their token file.
    let host_port = |url: &str| url.trim_start_matches("http://").to_owned();
    let discovery = dir.path().join("fleet.json");
    let groups = json!([
        {"targets": sim.urls().iter().map(|u| host_port(u)).collect::<Vec<_>>(), "labels": {"job": "vllm"}},
        {"targets": [host_port(&a), host_port(&b)],
         "labels": {"fleetdeck_role": "router", "fleetdeck_token_file": token_file}},
    ]);
    std::fs::write(&discovery, groups.to_string())?;
    let args: Vec<String> = [
        "--db",
        &dir.path().join("history.sqlite").to_string_lossy(),
        "--discover-file",
        &discovery.to_string_lossy(),
        "--policy-etcd",
        &etcd.url(),
        "--policy-key",
        KEY,
    ]
    .map(str::to_owned)
    .into();
    let app = spawn_headless(&args, &[("FLEETDECK_OPERATOR", "e2e-operator")]).await?;
    let driver = chromedriver().await?;
    let browser = chromium_session(&driver).await?;

    // Settings: the source, what it found, and the policy key.
    browser.goto(&app.page("#/settings")).await?;
    let found = eventually("the discovery source with what it found", WAIT, || async {
        let text = text_of(&browser, "[data-testid=discovery-source]").await?;
        Ok(text.contains("2 replicas, 2 routers").then_some(text))
    })
    .await?;
    assert!(found.contains(&discovery.display().to_string()), "{found}");
    let store = text_of(&browser, "[data-testid=settings-policy-store]").await?;
    assert!(store.contains(KEY) && store.contains(&etcd.url()), "{store}");

    // Push view: the key does not exist yet (revision 0); the first push creates it.
    browser.goto(&app.view("#/push")).await?;
    reviewed_revision_becomes(&browser, 0).await?;
    type_into(&browser, "push-spec", "policy: least_load\n").await?;
    click(&browser, "store-push").await?;
    let pushed = eventually("the push's result", WAIT, || async {
        Ok(browser.find(Locator::Css("[data-testid=store-result]")).await.ok())
    })
    .await?
    .text()
    .await?;
    let first = etcd_client.get(KEY).await?.kv.context("the push wrote no key")?.mod_revision;
    assert!(pushed.contains(&format!("revision 0 → {first}")), "{pushed}");
    reviewed_revision_becomes(&browser, first).await?;
    both_run(&browser, &routers, "least_load", first).await?;

    // Someone else writes the key after the operator reviewed it: the push is refused, nothing overwritten.
    let theirs = etcd_client.put(KEY, br#"{"policy": "random"}"#).await?;
    type_into(&browser, "push-spec", "policy: power_of_two\n").await?;
    click(&browser, "store-push").await?;
    eventually("the conflict to be shown", WAIT, || async {
        Ok(browser.find(Locator::Css("[data-testid=store-error][data-code=revision_conflict]")).await.ok())
    })
    .await?;
    let error = text_of(&browser, "[data-testid=store-error]").await?;
    assert!(error.contains(&format!("now {theirs}")) && error.contains("Reload"), "{error}");
    both_run(&browser, &routers, "random", theirs).await?;

    // Reload shows their revision; the push then holds.
    click(&browser, "store-reload").await?;
    reviewed_revision_becomes(&browser, theirs).await?;
    click(&browser, "store-push").await?;
    let ours = eventually("the second push to land", WAIT, || async {
        let kv = etcd_client.get(KEY).await?.kv;
        Ok(kv.filter(|kv| kv.mod_revision > theirs).map(|kv| kv.mod_revision))
    })
    .await?;
    both_run(&browser, &routers, "power_of_two", ours).await?;

    // Roll back: the previous value (theirs) is written again as a new revision.
    reviewed_revision_becomes(&browser, ours).await?;
    click(&browser, "store-rollback").await?;
    let back = eventually("the rollback to land", WAIT, || async {
        let kv = etcd_client.get(KEY).await?.kv;
        Ok(kv.filter(|kv| kv.mod_revision > ours).map(|kv| kv.mod_revision))
    })
    .await?;
    both_run(&browser, &routers, "random", back).await?;
    let result = text_of(&browser, "[data-testid=store-result]").await?;
    assert!(result.starts_with("rolled back") || result.to_lowercase().contains("rolled back"), "{result}");
    Ok(())
}
