//! The real Tauri window under Xvfb, driven through tauri-driver: the same UI as the browser,
//! through the overview (tiles, table, chart) and a replica's detail charts.

use std::time::Duration;

use anyhow::Result;
use fantoccini::Locator;
use fleet_sim::ModelConfig;
use fleet_test_support::process::{artifacts_dir, bin_path};
use fleet_test_support::webdriver::{tauri_driver, tauri_session, xvfb};
use fleet_test_support::{eventually, spawn_router, spawn_sim};

use crate::browser::{row_texts, steady_traffic};

#[tokio::test]
async fn the_desktop_window_shows_the_overview_and_a_replica_detail() -> Result<()> {
    let sim = spawn_sim(4, ModelConfig::default()).await?;
    let router = spawn_router(sim.urls()).await?;
    let _traffic = steady_traffic(router.url());
    let db_dir = tempfile::tempdir()?;
    let mut args =
        vec!["--db".to_string(), db_dir.path().join("history.sqlite").to_string_lossy().into_owned()];
    for url in sim.urls() {
        args.extend(["--replica".to_string(), url.clone()]);
    }

    let display = xvfb().await?;
    let driver = tauri_driver(&display.display).await?;
    let window = tauri_session(&driver, &bin_path("fleetdeck")?, &args).await?;

    let first =
        eventually("four replica rows with numbers in the window", Duration::from_secs(90), || async {
            let rows = row_texts(&window).await?;
            Ok((rows.len() == 4 && rows.iter().all(|r| r.contains('%'))).then_some(rows))
        })
        .await?;
    eventually("the window's numbers to change", Duration::from_secs(60), || async {
        let rows = row_texts(&window).await?;
        Ok((rows.len() == 4 && rows != first).then_some(()))
    })
    .await?;
    eventually("the TTFT chart to draw in the window", Duration::from_secs(60), || async {
        let html = window.find(Locator::Css("[data-testid=ttft-chart]")).await?.html(true).await?;
        Ok(html.contains("<svg").then_some(()))
    })
    .await?;

    eventually("four tiles in the overview", Duration::from_secs(30), || async {
        let tiles = window.find_all(Locator::Css("[data-testid=replica-tile]")).await?;
        Ok((tiles.len() == 4).then_some(()))
    })
    .await?;
    let shot = artifacts_dir()?.join("desktop-fleet.png");
    std::fs::write(&shot, window.screenshot().await?)?;
    println!("screenshot: {}", shot.display());

    // A replica's detail: click its tile, its history charts draw in the window.
    window.find(Locator::Css("[data-testid=replica-tile]")).await?.click().await?;
    eventually("the replica's charts in the window", Duration::from_secs(60), || async {
        let ttft = window.find(Locator::Css("[data-testid=chart-ttft]")).await?.html(true).await?;
        let kv = window.find(Locator::Css("[data-testid=chart-kv]")).await?.html(true).await?;
        Ok((ttft.contains("polyline") && kv.contains("<svg")).then_some(()))
    })
    .await?;
    let meta = window.find(Locator::Css("[data-testid=replica-meta]")).await?.text().await?;
    assert!(meta.contains("vllm"), "the detail names the engine: {meta}");
    let shot = artifacts_dir()?.join("desktop-replica.png");
    std::fs::write(&shot, window.screenshot().await?)?;
    println!("screenshot: {}", shot.display());

    // Back to the overview with the link.
    window.find(Locator::Css("[data-testid=back-to-fleet]")).await?.click().await?;
    eventually("the overview again", Duration::from_secs(30), || async {
        Ok((window.find_all(Locator::Css("[data-testid=replica-tile]")).await?.len() == 4).then_some(()))
    })
    .await?;
    window.close().await?;
    Ok(())
}
