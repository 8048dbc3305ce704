//! Replicas and routers found instead of typed: a file the app watches (YAML, then Prometheus file_sd JSON)
//! and DNS SRV records served by a real dnsmasq on loopback. Replicas that appear are scraped and shown in
//! the fleet view, those that leave go, and a broken source keeps what it found with the error.

use std::time::Duration;

use anyhow::Result;
use fleet_test_support::admin_router::spawn_admin_router;
use fleet_test_support::dns::{DnsServer, SrvRecord};
use fleet_test_support::{eventually, spawn_sim};
use fleetdeck_api::{FleetSnapshotArgs, ScrapeState};
use fleetdeck_control::{Control, ControlConfig, DiscoverySource};
use tokio_util::sync::CancellationToken;

async fn start(dir: &std::path::Path, source: DiscoverySource, stop: &CancellationToken) -> Result<Control> {
    let mut config = ControlConfig::new(Vec::new(), dir.join("history.db"));
    config.discovery = vec![source];
    Control::start(config, stop.child_token()).await
}

/// The URLs in the fleet view, once every one of them has been scraped.
async fn fleet_becomes(control: &Control, wanted: &[&str]) -> Result<()> {
    let mut wanted: Vec<String> = wanted.iter().map(|s| s.to_string()).collect();
    wanted.sort();
    eventually(&format!("the fleet view to show exactly {wanted:?}"), Duration::from_secs(20), || {
        let wanted = wanted.clone();
        async move {
            let args = FleetSnapshotArgs { window_s: 60, synthetic: 0, skip_series: true };
            let snapshot = control.fleet().snapshot(args).await?;
            let mut shown: Vec<String> = snapshot.replicas.iter().map(|r| r.url.clone()).collect();
            shown.sort();
            let scraped = snapshot.replicas.iter().all(|r| matches!(r.scrape, ScrapeState::Ok { .. }));
            Ok((shown == wanted && scraped).then_some(()))
        }
    })
    .await
}

#[tokio::test]
async fn a_watched_file_adds_and_removes_replicas_and_routers() -> Result<()> {
    let sim = spawn_sim(2, Default::default()).await?;
    let (a, b) = (sim.urls()[0].as_str(), sim.urls()[1].as_str());
    let router = spawn_admin_router(&[a.to_owned()], "discovery-token").await?;
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("router.token");
    std::fs::write(&token_file, "discovery-token")?;
    let file = dir.path().join("fleet.yaml");
    std::fs::write(&file, format!("replicas:\n  - {a}\n"))?;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let control = start(dir.path(), DiscoverySource::File(file.clone()), &stop).await?;
    fleet_becomes(&control, &[a]).await?;

    // Rewritten as Prometheus file_sd (what operators template for Prometheus already), with a router.
    let host_port = |url: &str| url.trim_start_matches("http://").to_owned();
    let sd = serde_json::json!([
        {"targets": [host_port(a), host_port(b)], "labels": {"job": "vllm"}},
        {"targets": [host_port(&router.url())], "labels": {"fleetdeck_role": "router", "fleetdeck_token_file": token_file}},
    ]);
    std::fs::write(&file, sd.to_string())?;
    fleet_becomes(&control, &[a, b]).await?;
    let routers = eventually("the discovered router to be read", Duration::from_secs(20), || async {
        let settings = control.settings().view().await?;
        Ok(settings.routers.iter().any(|r| r.url == router.url()).then_some(settings.routers))
    })
    .await?;
    assert_eq!(routers.len(), 1, "{routers:?}");

    // A replica leaves the file: it leaves the view. So does the router.
    std::fs::write(&file, format!("[\"{b}\"]"))?;
    fleet_becomes(&control, &[b]).await?;
    assert!(control.settings().view().await?.routers.is_empty());

    // A broken file keeps what was found, with the error.
    std::fs::write(&file, "replicas: [")?;
    let status = eventually("the broken file to be reported", Duration::from_secs(20), || async {
        let status = control.discovery().status();
        Ok(status[0].error.as_ref().is_some_and(|e| e.contains("not valid YAML")).then_some(status))
    })
    .await?;
    assert_eq!(status[0].found.replicas.len(), 1);
    fleet_becomes(&control, &[b]).await?;
    Ok(())
}

#[tokio::test]
async fn dns_srv_records_add_and_remove_replicas() -> Result<()> {
    let sim = spawn_sim(2, Default::default()).await?;
    let port = |url: &str| url.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()).unwrap_or(0);
    let record = |i: usize| SrvRecord {
        service: "_vllm._tcp.fleet.test".into(),
        host: format!("r{i}.fleet.test"),
        port: port(&sim.urls()[i]),
        address: std::net::Ipv4Addr::LOCALHOST,
    };
    let mut dns = DnsServer::start(&[record(0), record(1)]).await?;
    let dir = tempfile::tempdir()?;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let source = DiscoverySource::Srv { name: "_vllm._tcp.fleet.test".into(), server: Some(dns.addr()) };
    let control = start(dir.path(), source, &stop).await?;
    let (a, b) = (sim.urls()[0].as_str(), sim.urls()[1].as_str());
    fleet_becomes(&control, &[a, b]).await?;
    // Instance 0 leaves the service.
    dns.serve(&[record(1)]).await?;
    fleet_becomes(&control, &[b]).await?;
    // A name with no records is an empty service, not an error.
    assert!(control.discovery().status()[0].error.is_none());
    Ok(())
}

/// "Within one scrape interval", stated in the source's own reads rather than in wall-clock time (which a
/// loaded CI machine stretches): the source is read once per interval and a read applies what it found
/// before it counts as done, so once two reads have finished after the file changed (the second one
/// started after the change), the new replica must be in the fleet view. Its first scrape is not waited
/// for by a later read: it is due at once and done within the next interval.
#[tokio::test]
async fn a_new_replica_shows_within_one_read_of_the_file() -> Result<()> {
    let sim = spawn_sim(2, Default::default()).await?;
    let (a, b) = (sim.urls()[0].as_str(), sim.urls()[1].as_str());
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("fleet.json");
    std::fs::write(&file, format!("[\"{a}\"]"))?;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let control = start(dir.path(), DiscoverySource::File(file.clone()), &stop).await?;
    control.settings().set_scrape_interval(fleetdeck_api::ScrapeIntervalArgs { seconds: 0.5 }).await?;
    fleet_becomes(&control, &[a]).await?;

    let reads_before = control.discovery().status()[0].reads;
    std::fs::write(&file, format!("[\"{a}\", \"{b}\"]"))?;
    let scraped_after =
        eventually("the new replica to be listed and scraped", Duration::from_secs(20), || async {
            // Reads first, then the view: a read counted here has been applied to the view read next.
            let reads = control.discovery().status()[0].reads - reads_before;
            let args = FleetSnapshotArgs { window_s: 60, synthetic: 0, skip_series: true };
            let snapshot = control.fleet().snapshot(args).await?;
            let row = snapshot.replicas.iter().find(|r| r.url == b);
            anyhow::ensure!(
                row.is_some() || reads < 2,
                "{reads} reads of the file finished after it changed, and {b} is still not in the fleet view"
            );
            Ok(row.filter(|r| matches!(r.scrape, ScrapeState::Ok { .. })).map(|_| reads))
        })
        .await?;
    // Generous: the scrape is due at once, and a loaded machine delays reads and scrapes alike.
    assert!(
        scraped_after <= 4,
        "first scraped only after {scraped_after} reads of the file, one per interval"
    );
    Ok(())
}
