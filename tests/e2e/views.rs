//! Every view of the operator's desktop in headless Chromium, against live data: the headless
//! app's embedded demo (fleet-sim replicas, a fleet-router with its admin API and a cache-aware
//! policy, steady traffic), plus traffic the tests send to make things happen (a hotspot, a
//! policy change). Screenshots of every view land in the artifacts folder as `view-*.png`.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;
use fantoccini::{Client, Locator};
use fleet_base::quantile;
use fleet_sim::ModelConfig;
use fleet_test_support::endpoints::garbage_metrics;
use fleet_test_support::process::{HeadlessApp, artifacts_dir, spawn_headless};
use fleet_test_support::webdriver::{chromedriver, chromium_session};
use fleet_test_support::{eventually, spawn_sim};
use fleetdeck_api::SettingsView;
use serde_json::{Value, json};

/// Starts `fleetdeck --headless` with `extra` arguments and its history in `db_dir`.
pub async fn headless(extra: &[&str], db_dir: &Path) -> Result<HeadlessApp> {
    let mut args = vec!["--db".to_string(), db_dir.join("history.sqlite").to_string_lossy().into_owned()];
    args.extend(extra.iter().map(|s| s.to_string()));
    spawn_headless(&args, &[]).await
}

pub fn http() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder().timeout(Duration::from_secs(20)).build()?)
}

pub async fn call(client: &reqwest::Client, app: &HeadlessApp, command: &str, args: Value) -> Result<Value> {
    let response = client.post(app.api(command)).bearer_auth(&app.token).json(&args).send().await?;
    let status = response.status();
    let body: Value = response.json().await?;
    if !status.is_success() {
        bail!("{command} answered {status}: {body}");
    }
    Ok(body)
}

pub async fn screenshot(browser: &Client, name: &str) -> Result<()> {
    let path = artifacts_dir()?.join(name);
    std::fs::write(&path, browser.screenshot().await?)?;
    println!("screenshot: {}", path.display());
    Ok(())
}

/// Presses and releases `key` on the page as a keyboard would (WebDriver actions).
async fn press(browser: &Client, key: char) -> Result<()> {
    let actions = KeyActions::new("keyboard".into())
        .then(KeyAction::Down { value: key })
        .then(KeyAction::Up { value: key });
    browser.perform_actions(actions).await?;
    Ok(())
}

async fn texts(browser: &Client, css: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for element in browser.find_all(Locator::Css(css)).await? {
        out.push(element.text().await?);
    }
    Ok(out)
}

/// Sends `n` requests sharing one long prompt prefix through `router`, `concurrency` at a time.
async fn burst(router: &str, n: usize, concurrency: usize) -> Result<usize> {
    use futures_util::StreamExt;
    let client = http()?;
    let prefix = "You are the hotspot tenant's assistant. ".repeat(12);
    let ok = futures_util::stream::iter(0..n)
        .map(|i| {
            let (client, body) =
                (client.clone(), json!({"prompt": format!("{prefix} question {i}"), "max_tokens": 1}));
            async move {
                client
                    .post(format!("{router}/v1/completions"))
                    .json(&body)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }
        })
        .buffer_unordered(concurrency)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    Ok(ok)
}

/// Replaces `router`'s policy with `spec` through its admin API, conditioned on the version it runs now;
/// returns the new version.
async fn put_policy(client: &reqwest::Client, router: &str, token: &str, spec: &str) -> Result<u64> {
    let url = format!("{router}/admin/policy");
    let current: Value = client.get(&url).bearer_auth(token).send().await?.error_for_status()?.json().await?;
    let version = current["version"].as_u64().context("GET /admin/policy has a version")?;
    client
        .put(&url)
        .bearer_auth(token)
        .header("if-match", format!("\"{version}\""))
        .header("content-type", "application/json")
        .body(spec.to_owned())
        .send()
        .await?
        .error_for_status()?;
    Ok(version + 1)
}

#[tokio::test]
async fn chromium_walks_every_view_of_the_demo_fleet_with_live_data() -> Result<()> {
    let db_dir = tempfile::tempdir()?;
    let app = headless(&["--demo"], db_dir.path()).await?;
    let client = http()?;
    let settings: SettingsView = serde_json::from_value(call(&client, &app, "settings", json!({})).await?)?;
    let router = settings.routers.first().context("the demo configures its router")?.url.clone();
    let token = std::fs::read_to_string(db_dir.path().join("tokens").join("demo-router.token"))?;

    let driver = chromedriver().await?;
    let browser = chromium_session(&driver).await?;
    browser.goto(&app.page("#/fleet")).await?;

    // ---- fleet overview: four tiles whose numbers move
    let first = eventually("four tiles with hit rates", Duration::from_secs(90), || async {
        let tiles = texts(&browser, "[data-testid=replica-tile]").await?;
        Ok((tiles.len() == 4 && tiles.iter().all(|t| t.contains('%') && t.contains("vllm"))).then_some(tiles))
    })
    .await?;
    eventually("the tiles' numbers to change", Duration::from_secs(60), || async {
        let tiles = texts(&browser, "[data-testid=replica-tile]").await?;
        Ok((tiles.len() == 4 && tiles != first).then_some(()))
    })
    .await?;
    // Colour by queue depth: the tile values become counts.
    browser.find(Locator::Css("[data-testid=signal-select]")).await?.select_by_value("queue_depth").await?;
    eventually("tiles to show queue depth", Duration::from_secs(10), || async {
        let values = texts(&browser, "[data-testid=tile-value]").await?;
        Ok((values.len() == 4 && values.iter().all(|v| !v.contains('%'))).then_some(()))
    })
    .await?;
    // Filtering by one replica's port leaves its tile alone.
    let port = settings.replicas[1].url.rsplit(':').next().unwrap_or_default().to_owned();
    browser.find(Locator::Css("[data-testid=fleet-filter]")).await?.send_keys(&port).await?;
    eventually("the filter to leave one tile", Duration::from_secs(10), || async {
        let tiles = texts(&browser, "[data-testid=replica-tile]").await?;
        Ok((tiles.len() == 1 && tiles[0].contains(&port)).then_some(()))
    })
    .await?;
    // Erase the filter as a user would (WebDriver's clear fires no input event).
    let filter = browser.find(Locator::Css("[data-testid=fleet-filter]")).await?;
    filter.send_keys(&char::from(Key::Backspace).to_string().repeat(port.len())).await?;
    browser.find(Locator::Css("[data-testid=signal-select]")).await?.select_by_value("hit_rate").await?;
    eventually("all tiles back", Duration::from_secs(10), || async {
        Ok((texts(&browser, "[data-testid=replica-tile]").await?.len() == 4).then_some(()))
    })
    .await?;
    screenshot(&browser, "view-fleet.png").await?;

    // ---- keyboard: "2" opens the heat map, "t" switches the theme (keys are for the page, not
    // for a focused form control, so first click away from the toolbar as a user would)
    browser.find(Locator::Css(".fleet h2")).await?.click().await?;
    press(&browser, '2').await?;
    eventually("key 2 to open the heat map", Duration::from_secs(10), || async {
        Ok(browser.current_url().await?.fragment().is_some_and(|f| f == "/heat").then_some(()))
    })
    .await?;

    // ---- heat map: groups from the router, then a hotspot made by a burst of one prefix
    eventually("heat map rows from the router", Duration::from_secs(60), || async {
        let rows = texts(&browser, "[data-testid=heat-row]").await?;
        Ok((!rows.is_empty()).then_some(()))
    })
    .await?;
    let threshold = browser.find(Locator::Css("[data-testid=hotspot-threshold]")).await?;
    threshold.clear().await?;
    threshold.send_keys(&format!("60{}", char::from(Key::Tab))).await?;
    eventually(
        "no hotspot at a 60% threshold under the demo's spread traffic",
        Duration::from_secs(20),
        || async {
            let warnings = browser.find_all(Locator::Css("[data-testid=hotspot-warning]")).await?;
            let settled = texts(&browser, "[data-testid=router-status]").await?.concat().contains("policy");
            Ok((warnings.is_empty() && settled).then_some(()))
        },
    )
    .await?;
    // The hotspot to see is one replica serving a burst of one prefix alone. The load guard would spread
    // the burst as soon as the owner's queue (which grows with how starved of CPU this machine is) passes its
    // bound, so it is turned off for the burst, as an operator would to reproduce a hotspot. How many
    // requests it takes to pass 60% depends on how much of the demo's own traffic is in the router's heat
    // window (five minutes), which grows with how long the steps above took: so the burst goes on in
    // rounds until the warning shows, and the map's largest shares name a failure.
    put_policy(
        &client,
        &router,
        token.trim(),
        r#"{"policy": "cache_aware_approx", "params": {"load_guard": false}}"#,
    )
    .await?;
    let mut warning = None;
    for round in 0..6 {
        let sent = burst(&router, 300, 4).await?;
        assert!(sent > 270, "only {sent} of round {round}'s 300 requests succeeded");
        // The view polls every second; not shown within ten, the share is still short: another round.
        let shown = eventually("the hotspot warning", Duration::from_secs(10), || async {
            Ok(texts(&browser, "[data-testid=hotspot-warning]").await?.into_iter().next())
        })
        .await;
        if let Ok(shown) = shown {
            warning = Some(shown);
            break;
        }
    }
    let Some(warning) = warning else {
        let map = call(&client, &app, "heat_map", json!({"hotspot_share": 0.05})).await?;
        anyhow::bail!("no hotspot warning after six bursts of 300; the largest shares: {}", map["hotspots"]);
    };
    assert!(warning.contains("Hotspot") && warning.contains("of all traffic"), "{warning}");
    assert!(!browser.find_all(Locator::Css("td.hot")).await?.is_empty(), "the hot cell is marked");
    // The router reads the replicas' own /metrics: beside each replica's engine figure, its view of the load.
    let agreement =
        eventually("the router's view of load beside the engines'", Duration::from_secs(30), || async {
            let rows = texts(&browser, "[data-testid=agreement-row]").await?;
            Ok((rows.len() == 4 && rows.iter().all(|r| r.contains("seen") && r.contains("s ago")))
                .then_some(rows))
        })
        .await?;
    assert!(agreement.iter().all(|r| r.contains("engine") || r.contains("own")), "{agreement:?}");
    screenshot(&browser, "view-heat.png").await?;

    // ---- decisions: each shows its branch and every candidate with matched blocks
    browser.goto(&app.view("#/decisions")).await?;
    let decision = eventually("a decision with its candidates", Duration::from_secs(30), || async {
        let Some(first) = browser.find_all(Locator::Css("[data-testid=decision]")).await?.into_iter().next()
        else {
            return Ok(None);
        };
        let candidates = first.find_all(Locator::Css("[data-testid=candidate]")).await?;
        let branch = first.find(Locator::Css("[data-testid=decision-branch]")).await?.text().await?;
        Ok((candidates.len() == 4 && !branch.is_empty()).then_some(first.text().await?))
    })
    .await?;
    assert!(decision.contains('✓'), "the chosen candidate is marked: {decision}");
    assert!(decision.contains("cache_aware_approx"), "{decision}");
    screenshot(&browser, "view-decisions.png").await?;

    // ---- headroom: achieved next to the pooled bound, from the recorded traffic
    browser.goto(&app.view("#/headroom")).await?;
    let (achieved, bound) =
        eventually("headroom figures for the demo model", Duration::from_secs(60), || async {
            let rows = browser.find_all(Locator::Css("[data-testid=headroom-model]")).await?;
            let Some(row) = rows.into_iter().next() else { return Ok(None) };
            let achieved = row.find(Locator::Css("[data-testid=achieved]")).await?.text().await?;
            // Achieved is compared with the bound of the requests it was measured on: the
            // separate bar when only some requests reported usage, the overall bound otherwise.
            let measured = row.find_all(Locator::Css("[data-testid=pooled-bound-measured]")).await?;
            let bound = match measured.into_iter().next() {
                Some(bar) => bar.text().await?,
                None => row.find(Locator::Css("[data-testid=pooled-bound]")).await?.text().await?,
            };
            let parse = |s: &str| s.trim_end_matches('%').parse::<f64>().ok();
            Ok(parse(&achieved).zip(parse(&bound)))
        })
        .await?;
    assert!(
        bound > 0.0 && achieved <= bound + 1e-9,
        "achieved {achieved}% must not beat the pooled bound {bound}%"
    );
    screenshot(&browser, "view-headroom.png").await?;

    // ---- replica detail: charts from the history, and a marker once the policy changes
    browser.goto(&app.view("#/fleet")).await?;
    let tile = eventually("a tile to click", Duration::from_secs(30), || async {
        Ok(browser.find_all(Locator::Css("[data-testid=replica-tile]")).await?.into_iter().next())
    })
    .await?;
    tile.click().await?;
    eventually("the replica's charts to draw", Duration::from_secs(60), || async {
        let html = browser.find(Locator::Css("[data-testid=chart-ttft]")).await?.html(true).await?;
        let queue = browser.find(Locator::Css("[data-testid=chart-queue]")).await?.html(true).await?;
        Ok((html.contains("polyline") && queue.contains("<svg")).then_some(()))
    })
    .await?;
    assert!(browser.current_url().await?.fragment().unwrap_or_default().starts_with("/replica/"));
    // Change the router's policy through its admin API; the chart marks the moment.
    let version = put_policy(&client, &router, token.trim(), r#"{"policy": "least_load"}"#).await?;
    eventually("the policy change marker on the charts", Duration::from_secs(30), || async {
        let html = browser.find(Locator::Css("[data-testid=chart-ttft]")).await?.html(true).await?;
        Ok(html.contains(&format!("least_load v{version}")).then_some(()))
    })
    .await?;
    screenshot(&browser, "view-replica.png").await?;

    // ---- dark theme
    let before = browser.execute("return document.documentElement.dataset.theme", vec![]).await?;
    press(&browser, 't').await?;
    let pressed = browser.execute("return document.documentElement.dataset.theme", vec![]).await?;
    assert_ne!(before, pressed, "key t flips the theme");
    let before = pressed;
    browser.find(Locator::Css("[data-testid=theme-toggle]")).await?.click().await?;
    let after = browser.execute("return document.documentElement.dataset.theme", vec![]).await?;
    assert_ne!(before, after, "the theme switch flips data-theme");
    browser.goto(&app.view("#/fleet")).await?;
    if after != json!("dark") {
        browser.find(Locator::Css("[data-testid=theme-toggle]")).await?.click().await?;
    }
    eventually("tiles in the dark theme", Duration::from_secs(30), || async {
        Ok((texts(&browser, "[data-testid=replica-tile]").await?.len() == 4).then_some(()))
    })
    .await?;
    screenshot(&browser, "view-fleet-dark.png").await?;
    browser.close().await?;
    Ok(())
}

#[tokio::test]
async fn settings_probe_added_endpoints_and_keep_router_tokens_out_of_sqlite() -> Result<()> {
    let db_dir = tempfile::tempdir()?;
    let app = headless(&[], db_dir.path()).await?;
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let garbage = garbage_metrics().await?;
    let driver = chromedriver().await?;
    let browser = chromium_session(&driver).await?;
    browser.goto(&app.page("#/fleet")).await?;

    // An empty fleet says what to do: the three ways in, and where the rest is.
    let first_run = eventually("the first-run panel", Duration::from_secs(30), || async {
        Ok(texts(&browser, "[data-testid=first-run]").await?.into_iter().next())
    })
    .await?;
    for way in ["Add replica", "Add Prometheus", "Start the demo fleet", "Settings"] {
        assert!(first_run.contains(way), "{first_run}");
    }

    browser.goto(&app.view("#/settings")).await?;
    let add = |url: String| {
        let browser = &browser;
        async move {
            let field = browser.find(Locator::Css("[data-testid=settings-url]")).await?;
            field.clear().await?;
            field.send_keys(&url).await?;
            browser.find(Locator::Css("[data-testid=settings-add]")).await?.click().await?;
            eventually("the probe result", Duration::from_secs(30), || async {
                let result = texts(browser, "[data-testid=probe-result]").await?;
                Ok(result.into_iter().find(|r| r.contains(&url)))
            })
            .await
        }
    };
    let found = add(sim.urls()[0].clone()).await?;
    assert!(found.contains("detected vllm") && found.contains(fleet_sim::DEFAULT_MODEL), "{found}");
    let bad = add(garbage.url()).await?;
    assert!(bad.contains("probe failed") && bad.contains("malformed"), "{bad}");
    eventually("both replicas listed with what was detected", Duration::from_secs(30), || async {
        let items = texts(&browser, "[data-testid=settings-replica]").await?;
        Ok((items.len() == 2 && items[0].contains("vllm")).then_some(()))
    })
    .await?;

    // A router with its token: the token goes to a 0600 file and never into SQLite.
    let token = "e2e-secret-token-5f1c";
    browser.find(Locator::Css("[data-testid=settings-kind]")).await?.select_by_value("router").await?;
    browser.find(Locator::Css("[data-testid=settings-url]")).await?.send_keys("http://127.0.0.1:9").await?;
    browser.find(Locator::Css("[data-testid=settings-token]")).await?.send_keys(token).await?;
    browser.find(Locator::Css("[data-testid=settings-add]")).await?.click().await?;
    let report = eventually("the router's probe", Duration::from_secs(30), || async {
        Ok(texts(&browser, "[data-testid=probe-result]")
            .await?
            .into_iter()
            .find(|r| r.contains("127.0.0.1:9")))
    })
    .await?;
    assert!(report.contains("cannot reach"), "{report}");
    let token_file =
        fleetdeck_control::settings::token_file_for(&db_dir.path().join("tokens"), "http://127.0.0.1:9");
    assert_eq!(std::fs::read_to_string(&token_file)?, token);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&token_file)?.permissions().mode() & 0o777, 0o600);
    }
    for entry in std::fs::read_dir(db_dir.path())? {
        let path = entry?.path();
        if path.is_file() {
            let bytes = std::fs::read(&path)?;
            assert!(
                !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
                "the token leaked into {}",
                path.display()
            );
        }
    }

    // The interval is validated with a fix in the message.
    let interval = browser.find(Locator::Css("[data-testid=scrape-interval]")).await?;
    interval.clear().await?;
    interval.send_keys("0").await?;
    browser.find(Locator::Css("[data-testid=save-interval]")).await?.click().await?;
    let note = eventually("the interval error", Duration::from_secs(10), || async {
        Ok(texts(&browser, "[data-testid=interval-note]").await?.into_iter().next())
    })
    .await?;
    assert!(note.contains("pick"), "{note}");
    screenshot(&browser, "view-settings.png").await?;

    // The fleet now shows the added replica with its engine.
    browser.goto(&app.view("#/fleet")).await?;
    eventually("the added replica's tile", Duration::from_secs(30), || async {
        let tiles = texts(&browser, "[data-testid=replica-tile]").await?;
        Ok(tiles.iter().any(|t| t.contains("vllm")).then_some(()))
    })
    .await?;
    browser.close().await?;
    Ok(())
}

#[tokio::test]
async fn the_overview_renders_1000_replicas_and_reports_its_time_per_update() -> Result<()> {
    let db_dir = tempfile::tempdir()?;
    let app = headless(&[], db_dir.path()).await?;
    let driver = chromedriver().await?;
    let browser = chromium_session(&driver).await?;
    browser.goto(&app.page("#/fleet?synthetic=1000")).await?;

    let first = eventually("1000 tiles", Duration::from_secs(60), || async {
        let n = browser.find_all(Locator::Css("[data-testid=replica-tile]")).await?.len();
        let sample = browser
            .execute("return document.querySelector('[data-testid=replica-tile]').innerText", vec![])
            .await?;
        Ok((n == 1000).then_some(sample))
    })
    .await?;
    // Wait for a dozen updates of all 1000 rows after the first paint.
    let samples: Vec<f64> = eventually("12 updates of 1000 rows", Duration::from_secs(120), || async {
        let v = browser
            .execute(
                "return (window.__fleetdeck_render || []).filter(r => r.rows === 1000).map(r => r.ms)",
                vec![],
            )
            .await?;
        let all: Vec<f64> = serde_json::from_value(v)?;
        Ok((all.len() >= 13).then(|| all[1..].to_vec()))
    })
    .await?;
    let later = browser
        .execute("return document.querySelector('[data-testid=replica-tile]').innerText", vec![])
        .await?;
    assert_ne!(first, later, "the synthetic replicas' numbers move between updates");
    let mut sorted = samples.clone();
    sorted.sort_by(f64::total_cmp);
    let median = quantile::median(&sorted).context("no render samples")?;
    let p95 = quantile::nearest_rank(&sorted, 0.95).context("no render samples")?;
    let report = json!({"rows": 1000, "updates": samples.len(), "median_ms": median, "p95_ms": p95, "samples_ms": samples});
    let path = artifacts_dir()?.join("fleet-render-1000.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&report)?)?;
    println!(
        "render time per update at 1000 replicas: median {median:.1} ms, p95 {p95:.1} ms ({})",
        path.display()
    );
    screenshot(&browser, "view-fleet-1000.png").await?;
    browser.close().await?;
    Ok(())
}

#[tokio::test]
async fn the_first_window_adds_a_replica_or_starts_the_demo() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let (first_dir, second_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let app = headless(&[], first_dir.path()).await?;
    let driver = chromedriver().await?;
    let browser = chromium_session(&driver).await?;
    browser.goto(&app.page("#/fleet")).await?;
    let tiles = || async {
        Ok::<_, anyhow::Error>(browser.find_all(Locator::Css("[data-testid=replica-tile]")).await?.len())
    };

    // A typo is named with the fix, and nothing is added.
    let field = browser.wait().for_element(Locator::Css("[data-testid=first-run-replica-url]")).await?;
    screenshot(&browser, "view-first-run.png").await?;
    field.send_keys("localhost:8000").await?;
    browser.find(Locator::Css("[data-testid=first-run-add-replica]")).await?.click().await?;
    let typo = eventually("the typo to be refused", Duration::from_secs(30), || async {
        Ok(texts(&browser, "[data-testid=first-run-result]").await?.into_iter().next())
    })
    .await?;
    assert!(typo.contains("http://"), "{typo}");
    assert_eq!(tiles().await?, 0);

    // A replica's URL: the panel gives way to the replica's tile.
    field.clear().await?;
    field.send_keys(&sim.urls()[0]).await?;
    browser.find(Locator::Css("[data-testid=first-run-add-replica]")).await?.click().await?;
    eventually("the added replica's tile, instead of the panel", Duration::from_secs(30), || async {
        let panel = browser.find_all(Locator::Css("[data-testid=first-run]")).await?.len();
        Ok((tiles().await? == 1 && panel == 0).then_some(()))
    })
    .await?;

    // Another empty app: one click starts the demo fleet inside it, and its replicas fill the view.
    let empty = headless(&[], second_dir.path()).await?;
    browser.goto(&empty.page("#/fleet")).await?;
    browser.wait().for_element(Locator::Css("[data-testid=first-run-demo]")).await?.click().await?;
    eventually("the demo's 4 replicas, scraped", Duration::from_secs(60), || async {
        let values = texts(&browser, "[data-testid=replica-tile] .badge-engine").await?;
        Ok((values.len() == 4 && values.iter().all(|v| v == "vllm")).then_some(()))
    })
    .await?;
    screenshot(&browser, "view-first-run-demo.png").await?;
    browser.close().await?;
    Ok(())
}

/// A P/D fleet in Chromium: one prefill and one decode fleet-sim replica behind a fleet-router in P/D
/// mode. The P/D view shows the 1:1 ratio, both roles, the decisions by reason and a split request's TTFT
/// divided into the prefill leg, the KV transfer (timed by the decode engine) and the first decode token.
#[tokio::test]
async fn chromium_shows_a_pd_fleet_its_roles_decisions_and_ttft_legs() -> Result<()> {
    const TOKEN: &str = "pd-view-e2e-token";
    let fleet = fleet_test_support::admin_router::spawn_pd_fleet(TOKEN).await?;
    let (router, model) = (&fleet.router, fleet_sim::DEFAULT_MODEL);
    let replicas = fleet.replica_urls();
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("router.token");
    fleet_store::secrets::write_token_file(&token_file, TOKEN)?;
    let token_file = token_file.to_string_lossy().into_owned();
    let router_url = router.url();
    let args = [
        "--replica",
        &replicas[0],
        "--replica",
        &replicas[1],
        "--router",
        &router_url,
        "--router-token-file",
        &token_file,
    ];
    let app = headless(&args, dir.path()).await?;
    let driver = chromedriver().await?;
    let browser = chromium_session(&driver).await?;
    browser.goto(&app.page("#/pd")).await?;

    let client = http()?;
    let complete = |prompt: String| {
        let request = client
            .post(format!("{router_url}/v1/completions"))
            .json(&json!({"model": model, "prompt": prompt, "max_tokens": 2}));
        async move { anyhow::Ok(request.send().await?.error_for_status()?.headers().get("x-fleet-pd").cloned()) }
    };
    for i in 0..2 {
        let branch = complete(format!("a short question {i}")).await?;
        assert_eq!(branch.as_ref().and_then(|v| v.to_str().ok()), Some("short_prompt"));
    }
    // A long unique prompt each round until the view shows all three legs: the transfer time is a delta
    // between two scrapes of the decode replica, so transfers before its first scrape do not show.
    let mut round = 0;
    let legs = eventually("the three legs of a split request's TTFT", Duration::from_secs(90), || {
        round += 1;
        let prompt = format!("tenant {round} brings a long system prompt of its own; ").repeat(64);
        let (complete, browser) = (&complete, &browser);
        async move {
            let branch = complete(prompt).await?;
            assert_eq!(branch.as_ref().and_then(|v| v.to_str().ok()), Some("split"));
            let legs = texts(browser, "[data-testid=pd-leg]").await?;
            Ok((legs.len() == 3).then_some(legs))
        }
    })
    .await?;
    assert!(legs[0].starts_with("prefill leg: ") && legs[1].starts_with("KV transfer: "), "{legs:?}");
    assert!(legs[2].starts_with("first decode token: "), "{legs:?}");
    assert_eq!(texts(&browser, "[data-testid=pd-ratio]").await?, ["P:D 1:1"]);
    let roles = browser.find_all(Locator::Css("[data-testid=pd-role]")).await?;
    let mut names = Vec::new();
    for row in &roles {
        names.push(row.attr("data-role").await?.unwrap_or_default());
    }
    assert_eq!(names, ["prefill", "decode"]);
    let transfer = texts(&browser, "[data-role=decode] [data-testid=pd-role-transfer]").await?;
    assert!(
        transfer.first().is_some_and(|t| t.ends_with("ms")),
        "the decode side's transfer time: {transfer:?}"
    );
    let reasons = eventually("both reasons in the legend", Duration::from_secs(30), || async {
        let reasons = texts(&browser, "[data-testid=pd-reason]").await?;
        Ok((reasons.len() == 2).then_some(reasons))
    })
    .await?;
    assert!(reasons.iter().any(|r| r.starts_with("short prompt: 2 ")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.starts_with("split (remote prefill): ")), "{reasons:?}");
    let bars = browser.find_all(Locator::Css("[data-testid=pd-over-time] .pd-seg")).await?;
    assert!(!bars.is_empty(), "decisions over time are drawn");
    // The router's own row: its splits and their TTFT as it timed them.
    let splits =
        texts(&browser, "[data-testid=pd-router][data-kind=fleet-router] [data-testid=pd-router-splits]")
            .await?;
    assert!(splits.first().and_then(|s| s.parse::<u64>().ok()).is_some_and(|n| n >= 1), "{splits:?}");
    let ttft =
        texts(&browser, "[data-testid=pd-router][data-kind=fleet-router] [data-testid=pd-router-ttft]")
            .await?;
    assert!(ttft.first().is_some_and(|t| t.ends_with("ms") || t.ends_with(" s")), "{ttft:?}");
    screenshot(&browser, "view-pd.png").await?;

    // The what-if replays the recording with the prefill pool the routers tag: one prefill, one decode.
    browser.goto(&app.view("#/whatif")).await?;
    let split = eventually("the what-if's P/D rows", Duration::from_secs(60), || async {
        let heading = texts(&browser, "[data-testid=whatif-result] h2").await?;
        let split = texts(&browser, "[data-testid=whatif-pd-split] [data-testid=active]").await?;
        Ok((heading.first().is_some_and(|h| h.ends_with("on 1 prefill + 1 decode replicas"))
            && !split.is_empty())
        .then_some(split))
    })
    .await?;
    assert!(
        split[0].ends_with('%') && split[0] != "0.0%",
        "the active thresholds split long prompts: {split:?}"
    );
    screenshot(&browser, "view-whatif-pd.png").await?;
    Ok(())
}
