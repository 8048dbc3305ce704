//! Headless Chromium loads the headless app's UI: one row per replica, numbers that move.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use fantoccini::{Client, Locator};
use fleet_sim::ModelConfig;
use fleet_sim::load::{self, LoadConfig, LoadStats};
use fleet_test_support::process::{artifacts_dir, spawn_headless_app};
use fleet_test_support::webdriver::{chromedriver, chromium_session};
use fleet_test_support::{eventually, spawn_router, spawn_sim};
use tokio_util::sync::{CancellationToken, DropGuard};

/// Text of every replica row, in order.
pub async fn row_texts(browser: &Client) -> Result<Vec<String>> {
    let mut texts = Vec::new();
    for row in browser.find_all(Locator::Css("[data-testid=replica-row]")).await? {
        texts.push(row.text().await?);
    }
    Ok(texts)
}

/// Sends steady traffic through `router_url` until the returned guard is dropped.
pub fn steady_traffic(router_url: String) -> DropGuard {
    let config = LoadConfig { target: router_url, rps: 10.0, ..LoadConfig::default() };
    let stop = CancellationToken::new();
    tokio::spawn(load::run(config, reqwest::Client::new(), Arc::new(LoadStats::default()), stop.clone()));
    stop.drop_guard()
}

#[tokio::test]
async fn chromium_shows_one_live_row_per_replica_and_the_ttft_chart() -> Result<()> {
    let sim = spawn_sim(4, ModelConfig::default()).await?;
    let router = spawn_router(sim.urls()).await?;
    let _traffic = steady_traffic(router.url());
    let db_dir = tempfile::tempdir()?;
    let app = spawn_headless_app(sim.urls(), &db_dir.path().join("history.sqlite")).await?;
    let driver = chromedriver().await?;
    let browser = chromium_session(&driver).await?;
    browser.goto(&app.page("")).await?;

    let first = eventually("four replica rows with numbers", Duration::from_secs(60), || async {
        let rows = row_texts(&browser).await?;
        Ok((rows.len() == 4 && rows.iter().all(|r| r.contains('%'))).then_some(rows))
    })
    .await?;
    for (row, url) in first.iter().zip(sim.urls()) {
        let port = url.rsplit(':').next().unwrap_or_default();
        assert!(row.contains(port), "row {row:?} does not name its replica {url}");
    }
    let second = eventually("the rows' numbers to change", Duration::from_secs(60), || async {
        let rows = row_texts(&browser).await?;
        Ok((rows.len() == 4 && rows != first).then_some(rows))
    })
    .await?;
    assert_eq!(second.len(), 4);

    let chart = eventually("the TTFT chart to draw lines", Duration::from_secs(60), || async {
        let chart = browser.find(Locator::Css("[data-testid=ttft-chart]")).await?;
        let html = chart.html(true).await?;
        Ok((html.contains("<svg") && html.contains("polyline")).then_some(html))
    })
    .await?;
    assert!(chart.contains("<svg"));

    let shot = artifacts_dir()?.join("browser-fleet.png");
    std::fs::write(&shot, browser.screenshot().await?)?;
    println!("screenshot: {}", shot.display());
    browser.close().await?;
    Ok(())
}
