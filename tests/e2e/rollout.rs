//! The whole "change the fleet safely" loop in headless Chromium against the headless app,
//! fleet-sim and two fleet-routers with admin tokens: edit a policy (validation as you type),
//! preview it (what-if), push it (both routers report the new version), run a canary that
//! fleet-sim's fault injection makes slower (it rolls back by itself), compare both versions in
//! History; then a stale push is shown as refused and an invalid spec never reaches a router.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use fantoccini::{Client, Locator};
use fleet_sim::{Faults, ModelConfig};
use fleet_test_support::admin_router::spawn_admin_router;
use fleet_test_support::process::{artifacts_dir, spawn_headless};
use fleet_test_support::webdriver::{chromedriver, chromium_session};
use fleet_test_support::{RouterHandle, eventually, spawn_sim};
use serde_json::{Value, json};

use crate::browser::steady_traffic;

const TOKEN: &str = "e2e-rollout-token";
const WAIT: Duration = Duration::from_secs(60);

async fn admin(
    router: &RouterHandle,
    method: reqwest::Method,
    path: &str,
) -> Result<reqwest::RequestBuilder> {
    Ok(reqwest::Client::new()
        .request(method, format!("{}{path}", router.url()))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(5)))
}

/// `(version, spec)` as the router's admin API reports them.
async fn router_policy(router: &RouterHandle) -> Result<(u64, Value)> {
    let body: Value =
        admin(router, reqwest::Method::GET, "/admin/policy").await?.send().await?.json().await?;
    Ok((body["version"].as_u64().context("no version")?, body["spec"].clone()))
}

/// Requests the router recorded since `since_ms`.
async fn recorded_since(router: &RouterHandle, since_ms: u64) -> Result<usize> {
    let text = admin(router, reqwest::Method::GET, &format!("/admin/trace?since={since_ms}"))
        .await?
        .send()
        .await?
        .text()
        .await?;
    Ok(text.lines().filter(|l| !l.trim().is_empty()).count())
}

/// Sets a form element's value (or checkbox state) the way typing would, firing input and change.
async fn set(browser: &Client, testid: &str, value: Value) -> Result<()> {
    let script = r#"
        const el = document.querySelector(`[data-testid="${arguments[0]}"]`);
        if (!el) { return false; }
        if (el.type === 'checkbox') { el.checked = arguments[1]; } else { el.value = arguments[1]; }
        el.dispatchEvent(new Event('input', { bubbles: true }));
        el.dispatchEvent(new Event('change', { bubbles: true }));
        return true;
    "#;
    let found = browser.execute(script, vec![json!(testid), value]).await?;
    if found != json!(true) {
        bail!("no element with data-testid={testid}");
    }
    Ok(())
}

async fn text_of(browser: &Client, css: &str) -> Result<String> {
    Ok(browser.find(Locator::Css(css)).await?.text().await?)
}

async fn click(browser: &Client, testid: &str) -> Result<()> {
    browser.find(Locator::Css(&format!("[data-testid={testid}]"))).await?.click().await?;
    Ok(())
}

async fn screenshot(browser: &Client, name: &str) -> Result<()> {
    let shot = artifacts_dir()?.join(name);
    std::fs::write(&shot, browser.screenshot().await?)?;
    println!("screenshot: {}", shot.display());
    Ok(())
}

/// Now in Unix milliseconds, in the unit the router's trace records carry.
fn now_ms() -> u64 {
    u64::try_from(fleet_base::time::unix_ms_now()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edit_preview_push_canary_rollback_and_compare_in_the_browser() -> Result<()> {
    // fleet-sim: four replicas; router a serves 0 and 1, router b serves 2 and 3.
    let sim = spawn_sim(4, ModelConfig::default()).await?;
    let router_a = spawn_admin_router(&sim.urls()[0..2], TOKEN).await?;
    let router_b = spawn_admin_router(&sim.urls()[2..4], TOKEN).await?;
    let _traffic_a = steady_traffic(router_a.url());
    let _traffic_b = steady_traffic(router_b.url());

    let dir = tempfile::tempdir()?;
    let mut args = vec!["--db".to_owned()];
    args.push(dir.path().join("history.sqlite").to_string_lossy().into_owned());
    for url in sim.urls() {
        args.extend(["--replica".to_owned(), url.clone()]);
    }
    for (i, router) in [&router_a, &router_b].into_iter().enumerate() {
        let token_file = dir.path().join(format!("router-{i}.token"));
        fleet_store::secrets::write_token_file(&token_file, TOKEN)?;
        args.extend(["--router".to_owned(), router.url()]);
        args.extend(["--router-token-file".to_owned(), token_file.to_string_lossy().into_owned()]);
    }
    let app = spawn_headless(&args, &[("FLEETDECK_OPERATOR", "e2e-operator")]).await?;
    let driver = chromedriver().await?;
    let browser = chromium_session(&driver).await?;

    // 1. Edit: pick consistent_hash, type an out-of-range load factor, then a good one.
    browser.goto(&app.page("#/policy")).await?;
    eventually("the policy editor with both routers", WAIT, || async {
        let rows = browser.find_all(Locator::Css("[data-testid=diff-row]")).await?;
        Ok((rows.len() == 2).then_some(()))
    })
    .await?;
    set(&browser, "policy-select", json!("consistent_hash")).await?;
    eventually("the consistent_hash parameters", WAIT, || async {
        Ok(browser.find(Locator::Css("[data-testid=param-load_factor]")).await.is_ok().then_some(()))
    })
    .await?;
    set(&browser, "param-load_factor", json!("0.2")).await?;
    let problem = eventually("a validation message naming the field", WAIT, || async {
        let text = text_of(&browser, "[data-testid=spec-problem]").await?;
        Ok(text.contains("params.load_factor").then_some(text))
    })
    .await?;
    assert!(problem.contains("out of range"), "{problem}");
    set(&browser, "param-load_factor", json!("1.5")).await?;
    let diff = eventually("a valid spec diffed against both routers", WAIT, || async {
        browser.find(Locator::Css("[data-testid=spec-valid]")).await?;
        let diff = text_of(&browser, "[data-testid=spec-diff]").await?;
        Ok((diff.matches("round_robin → consistent_hash").count() == 2).then_some(diff))
    })
    .await?;
    assert!(diff.contains("load_factor"), "{diff}");
    // The P/D thresholds are edited in the same document, and the diff shows them.
    browser.find(Locator::Css("[data-testid=pd-thresholds] summary")).await?.click().await?;
    set(&browser, "pd-param-min_uncached_tokens", json!("1024")).await?;
    let diff = eventually("the P/D threshold in the diff", WAIT, || async {
        browser.find(Locator::Css("[data-testid=spec-valid]")).await?;
        let diff = text_of(&browser, "[data-testid=spec-diff]").await?;
        Ok(diff.contains("pd.min_uncached_tokens").then_some(diff))
    })
    .await?;
    assert!(diff.contains("load_factor"), "the form kept the policy's parameter: {diff}");
    screenshot(&browser, "rollout-policy.png").await?;

    // 2. Preview: candidate vs active on the routers' recorded traffic.
    browser.goto(&app.view("#/whatif")).await?;
    let whatif = eventually("the what-if result", WAIT, || async {
        // Headings are upper-cased by CSS and WebDriver reports rendered text.
        let text = text_of(&browser, "[data-testid=whatif-result]").await?.to_lowercase();
        Ok((text.contains("candidate: consistent_hash") && text.contains("active: round_robin"))
            .then_some(text))
    })
    .await?;
    assert!(whatif.contains("replayed in"), "{whatif}");
    // Where the figures come from: coverage, the engine profile the fleet's metrics chose, the fidelity.
    assert!(whatif.contains("coverage: read all"), "{whatif}");
    assert!(whatif.contains("engine profile: llama-3.1-8b-h100"), "{whatif}");
    assert!(whatif.contains("fidelity"), "{whatif}");
    // And whether the TTFTs include the time outside the engine measured from the recording.
    assert!(
        whatif.contains("spends outside the engine") || whatif.contains("the engine model's alone"),
        "{whatif}"
    );
    println!("what-if: {}", text_of(&browser, "[data-testid=whatif-elapsed]").await?);
    screenshot(&browser, "rollout-whatif.png").await?;

    // 3. Push to both routers; both report the new version.
    let (v_a, _) = router_policy(&router_a).await?;
    let (v_b, _) = router_policy(&router_b).await?;
    browser.goto(&app.view("#/push")).await?;
    eventually("both routers listed with their diff", WAIT, || async {
        let rows = browser.find_all(Locator::Css("[data-testid=diff-row]")).await?;
        Ok((rows.len() == 2).then_some(()))
    })
    .await?;
    click(&browser, "push-confirm").await?;
    eventually("both routers to apply the push", WAIT, || async {
        let applied =
            browser.find_all(Locator::Css("[data-testid=push-outcome][data-outcome=applied]")).await?;
        Ok((applied.len() == 2).then_some(()))
    })
    .await?;
    let pushed_ms = now_ms();
    for (router, before) in [(&router_a, v_a), (&router_b, v_b)] {
        let (version, spec) = router_policy(router).await?;
        assert_eq!(version, before + 1);
        assert_eq!(spec["policy"], "consistent_hash");
        assert_eq!(spec["params"]["load_factor"].as_f64(), Some(1.5));
        assert_eq!(spec["pd"]["min_uncached_tokens"], 1024, "the P/D threshold went with the policy");
    }
    eventually("both drift badges in sync", WAIT, || async {
        let badges = text_of(&browser, "[data-testid=push-routers]").await?.to_lowercase();
        Ok((badges.matches("in sync").count() == 2).then_some(()))
    })
    .await?;
    screenshot(&browser, "rollout-push.png").await?;
    // Let the pushed version serve long enough to have history of its own.
    eventually("traffic under the pushed version", WAIT, || async {
        Ok((recorded_since(&router_a, pushed_ms).await? >= 250).then_some(()))
    })
    .await?;

    // 4. Canary on router a that fault injection makes slower: it rolls back by itself.
    set(&browser, "push-spec", json!("policy: least_load\n")).await?;
    set(&browser, "canary-pick-0", json!(true)).await?;
    set(&browser, "canary-pick-1", json!(false)).await?;
    set(&browser, "canary-observe", json!("300")).await?;
    set(&browser, "canary-ratio", json!("1.5")).await?;
    // Millisecond TTFTs differ by ratios on noise alone; the stall below adds hundreds of ms.
    set(&browser, "canary-increase", json!("100")).await?;
    set(&browser, "canary-drop", json!("1.0")).await?;
    set(&browser, "canary-min", json!("15")).await?;
    click(&browser, "canary-start").await?;
    eventually("the canary to be watched", WAIT, || async {
        let status = browser.find(Locator::Css("[data-testid=canary-status]")).await?;
        Ok((status.attr("data-phase").await?.as_deref() == Some("observing")).then_some(()))
    })
    .await?;
    assert_eq!(router_policy(&router_a).await?.1["policy"], "least_load");
    assert_eq!(
        router_policy(&router_b).await?.1["policy"],
        "consistent_hash",
        "the baseline keeps the fleet's spec"
    );
    let canary_ms = now_ms();
    eventually("traffic under the canary", WAIT, || async {
        Ok((recorded_since(&router_a, canary_ms).await? >= 250).then_some(()))
    })
    .await?;
    let status = browser.find(Locator::Css("[data-testid=canary-status]")).await?;
    assert_eq!(
        status.attr("data-phase").await?.as_deref(),
        Some("observing"),
        "healthy, the canary holds its guards"
    );
    // The verdict and every guard's reading are shown while it is watched.
    let verdict = eventually("the canary's verdict to hold", WAIT, || async {
        let verdict = browser.find(Locator::Css("[data-testid=canary-verdict]")).await?;
        Ok((verdict.attr("data-verdict").await?.as_deref() == Some("holding")).then_some(verdict))
    })
    .await?;
    let verdict_text = verdict.text().await?.to_lowercase();
    assert!(verdict_text.contains("guards holding"), "{verdict_text}");
    let guards = browser.find_all(Locator::Css("[data-testid=canary-guard]")).await?;
    let mut read = Vec::new();
    for guard in guards {
        read.push((guard.attr("data-guard").await?.unwrap_or_default(), guard.text().await?));
    }
    let names: Vec<&str> = read.iter().map(|(g, _)| g.as_str()).collect();
    assert_eq!(names, ["error_rate", "ttft_p95", "hit_rate"], "{read:?}");
    assert!(read[0].1.to_lowercase().contains("error rate: canary 0.0%"), "{read:?}");
    for replica in 0..2 {
        sim.fleet.set_faults(replica, Faults { stall_ms: 400, ..Default::default() })?;
    }
    let reason = eventually("the canary to roll itself back", Duration::from_secs(120), || async {
        let status = browser.find(Locator::Css("[data-testid=canary-status]")).await?;
        if status.attr("data-phase").await?.as_deref() != Some("rolled_back") {
            return Ok(None);
        }
        Ok(Some(text_of(&browser, "[data-testid=canary-reason]").await?))
    })
    .await?;
    assert!(reason.contains("TTFT"), "{reason}");
    let crossed = browser.find(Locator::Css("[data-testid=canary-guard][data-guard=ttft_p95]")).await?;
    assert_eq!(crossed.attr("data-state").await?.as_deref(), Some("crossed"));
    for replica in 0..2 {
        sim.fleet.set_faults(replica, Faults::default())?;
    }
    let (_, restored) = router_policy(&router_a).await?;
    assert_eq!(restored["policy"], "consistent_hash", "router a runs the fleet's spec again");
    let steps = text_of(&browser, "[data-testid=canary-steps]").await?;
    assert!(steps.contains("observing") && steps.contains("rolled_back"), "{steps}");
    screenshot(&browser, "rollout-canary.png").await?;

    // 5. History: both versions, compared with deltas.
    browser.goto(&app.view("#/history")).await?;
    let (first, canary) = eventually("the versions in the audit trail", WAIT, || async {
        let rows = browser.find_all(Locator::Css("[data-testid=history-version]")).await?;
        let mut labels = Vec::new();
        for row in rows {
            labels.push(row.text().await?);
        }
        let first = labels.iter().find(|l| l.starts_with("consistent_hash@")).cloned();
        let canary = labels.iter().find(|l| l.starts_with("canary-least_load@")).cloned();
        Ok(first.zip(canary))
    })
    .await?;
    let label = |row: &str| row.split_whitespace().next().unwrap_or_default().to_owned();
    assert!(first.contains("e2e-operator"), "{first}");
    set(&browser, "history-a", json!(label(&first))).await?;
    set(&browser, "history-b", json!(label(&canary))).await?;
    click(&browser, "history-run").await?;
    let ttft_delta = eventually("the delta table", WAIT, || async {
        let row = browser.find(Locator::Css("[data-testid=delta-row][data-metric=ttft_p95_s]")).await?;
        let delta = row.find(Locator::Css("[data-testid=delta]")).await?.text().await?;
        Ok((delta != "—").then_some(delta))
    })
    .await?;
    let ttft_delta: f64 = ttft_delta.parse().with_context(|| format!("delta {ttft_delta:?}"))?;
    assert!(ttft_delta.is_finite());
    let charts = browser.find(Locator::Css("[data-testid=history-charts]")).await?.html(true).await?;
    assert!(charts.contains("<svg") && charts.matches("<svg").count() >= 3, "{charts}");
    click(&browser, "export-csv").await?;
    click(&browser, "export-png").await?;
    eventually("the PNG to be rendered", WAIT, || async {
        let text = text_of(&browser, "[data-testid=exported]").await?;
        Ok(text.contains("png").then_some(()))
    })
    .await?;
    screenshot(&browser, "rollout-history.png").await?;

    // 6. A push whose version went stale is refused and shown as moved; an invalid spec reaches no router.
    browser.goto(&app.view("#/push")).await?;
    set(&browser, "push-spec", json!("policy: consistent_hash\nparams:\n  load_factor: 2\n")).await?;
    eventually("a diff against the current versions", WAIT, || async {
        let diff = text_of(&browser, "[data-testid=push-routers]").await?;
        Ok(diff.contains("load_factor: 1.5 → 2").then_some(()))
    })
    .await?;
    // Someone changes router a behind the operator's back.
    let (current, _) = router_policy(&router_a).await?;
    let changed = admin(&router_a, reqwest::Method::PUT, "/admin/policy")
        .await?
        .header("If-Match", format!("\"{current}\""))
        .body("policy: round_robin\n")
        .send()
        .await?;
    assert!(changed.status().is_success());
    click(&browser, "push-confirm").await?;
    let refused = eventually("router a's refusal", WAIT, || async {
        let rows = browser.find_all(Locator::Css("[data-testid=push-outcome]")).await?;
        let mut texts = Vec::new();
        for row in rows {
            texts.push((row.attr("data-outcome").await?.unwrap_or_default(), row.text().await?));
        }
        Ok((texts.len() == 2).then_some(texts))
    })
    .await?;
    let a_row = refused.iter().find(|(_, t)| t.contains(&router_a.url())).context("router a's row")?;
    assert_eq!(a_row.0, "moved", "{refused:?}");
    assert!(a_row.1.contains("moved meanwhile") && a_row.1.contains("you reviewed version"), "{refused:?}");
    assert_eq!(router_policy(&router_a).await?.1["policy"], "round_robin");

    let versions = (router_policy(&router_a).await?.0, router_policy(&router_b).await?.0);
    set(&browser, "push-spec", json!("policy: consistent_hash\nparams:\n  load_factr: 2\n")).await?;
    eventually("the typo to be named", WAIT, || async {
        let text = text_of(&browser, "[data-testid=spec-problem]").await?;
        Ok(text.contains("did you mean load_factor").then_some(()))
    })
    .await?;
    click(&browser, "push-confirm").await?;
    eventually("the push to be refused by the app", WAIT, || async {
        let banner = text_of(&browser, "[data-testid=error-banner]").await?;
        Ok(banner.contains("invalid_spec").then_some(()))
    })
    .await?;
    assert_eq!((router_policy(&router_a).await?.0, router_policy(&router_b).await?.0), versions);
    screenshot(&browser, "rollout-stale.png").await?;
    browser.close().await?;
    Ok(())
}
