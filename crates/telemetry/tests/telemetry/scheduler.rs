//! The scrape scheduler against real HTTP on loopback: emulated replicas, an endpoint that
//! sends garbage, one that never answers and one where nothing listens.

use std::time::Duration;

use anyhow::Result;
use fleet_sim::ModelConfig;
use fleet_telemetry::scheduler::{Scheduler, SchedulerConfig, TargetSpec};
use fleet_telemetry::{Engine, ScrapeLimits};
use fleet_test_support::endpoints::{garbage_metrics, silent_metrics, unreachable_url};
use fleet_test_support::{eventually, spawn_sim};
use tokio_util::sync::CancellationToken;

fn spec(url: &str, interval_ms: u64) -> TargetSpec {
    TargetSpec {
        url: url.to_string(),
        interval: Duration::from_millis(interval_ms),
        limits: ScrapeLimits { timeout: Duration::from_millis(500), max_bytes: 1 << 20 },
    }
}

#[tokio::test]
async fn each_target_keeps_its_own_interval_error_state_and_last_good_time() -> Result<()> {
    let sim = spawn_sim(2, ModelConfig::default()).await?;
    let garbage = garbage_metrics().await?;
    let silent = silent_metrics().await?;
    let gone = unreachable_url().await?;
    let targets = vec![
        spec(&sim.urls()[0], 100),
        spec(&sim.urls()[1], 1000),
        spec(&garbage.url(), 100),
        spec(&silent.url(), 100),
        spec(&gone, 100),
    ];
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let config = SchedulerConfig {
        max_concurrent: 2,
        max_backoff: Duration::from_secs(5),
        ..SchedulerConfig::default()
    };
    let (scheduler, mut observations) = Scheduler::start(
        targets,
        config,
        fleet_telemetry::scrape::client(Duration::from_secs(1))?,
        cancel.clone(),
    );
    // Observations are drained so scraping never waits on them; count the first target's.
    let counted = tokio::spawn(async move {
        let mut fast = 0u64;
        while let Some(o) = observations.recv().await {
            if o.index == 0 && o.result.is_ok() {
                fast += 1;
            }
        }
        fast
    });

    let statuses = eventually("the fast replica to be scraped 15 times", Duration::from_secs(30), || async {
        let statuses = scheduler.statuses();
        Ok((statuses[0].scrapes_ok >= 15 && statuses[4].scrapes_failed >= 2).then_some(statuses))
    })
    .await?;

    // Per-target intervals: 100 ms against 1 s.
    let (fast, slow) = (&statuses[0], &statuses[1]);
    assert!(
        slow.scrapes_ok >= 1 && slow.scrapes_ok * 3 < fast.scrapes_ok,
        "fast {} slow {}",
        fast.scrapes_ok,
        slow.scrapes_ok
    );
    let signals = fast.signals.as_ref().expect("signals after good scrapes");
    assert_eq!(signals.engine, Engine::Vllm);
    assert_eq!(signals.model.as_deref(), Some(fleet_sim::DEFAULT_MODEL));
    assert!(signals.total.running.is_some() && signals.total.queue_depth.is_some());
    assert!(fast.error.is_none() && fast.last_good.is_some());

    // Each failing target says why, has no last good time, and backs off.
    let message = |i: usize| statuses[i].error.clone().unwrap_or_default();
    assert!(message(2).contains("malformed exposition") && message(2).contains("line 1"), "{}", message(2));
    assert!(message(3).contains("no answer"), "{}", message(3));
    assert!(message(4).contains("cannot connect"), "{}", message(4));
    for failing in &statuses[2..] {
        assert_eq!(failing.last_good, None);
        assert!(failing.signals.is_none());
        assert!(failing.consecutive_failures >= 1);
        // Backoff: 100 ms doubling, so far fewer attempts than the healthy 100 ms target.
        assert!(
            failing.scrapes_failed * 2 < fast.scrapes_ok,
            "{} tried {} times while the healthy target was scraped {} times",
            failing.url,
            failing.scrapes_failed,
            fast.scrapes_ok
        );
    }

    // A replica that goes away keeps its last good signals and time, marked as an error.
    let last_good = fast.last_good;
    drop(sim);
    let after = eventually("the stopped replica to show an error", Duration::from_secs(30), || async {
        let status = scheduler.status(0).expect("target 0");
        Ok(status.error.is_some().then_some(status))
    })
    .await?;
    assert!(after.last_good >= last_good && after.last_good.is_some());
    assert!(after.signals.is_some_and(|s| s.total.running.is_some()));

    cancel.cancel();
    let fast_observed = tokio::time::timeout(Duration::from_secs(10), counted).await??;
    assert!(fast_observed >= 15, "every good scrape is observed once: {fast_observed}");
    Ok(())
}

#[tokio::test]
async fn an_oversized_exposition_is_refused_with_the_limit_in_the_error() -> Result<()> {
    let sim = spawn_sim(1, ModelConfig::default()).await?;
    let mut target = spec(&sim.urls()[0], 100);
    target.limits.max_bytes = 64; // a vLLM exposition is several kilobytes
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let (scheduler, _observations) = Scheduler::start(
        vec![target],
        SchedulerConfig::default(),
        fleet_telemetry::scrape::client(Duration::from_secs(1))?,
        cancel.clone(),
    );
    let error = eventually("the size cap to refuse the scrape", Duration::from_secs(20), || async {
        Ok(scheduler.status(0).and_then(|s| s.error))
    })
    .await?;
    assert!(error.contains("more than 64 bytes"), "{error}");
    Ok(())
}

#[tokio::test]
async fn targets_join_and_leave_a_running_scheduler_without_disturbing_the_others() -> Result<()> {
    let sim = spawn_sim(2, ModelConfig::default()).await?;
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let (scheduler, mut observations) = Scheduler::new(
        SchedulerConfig::default(),
        fleet_telemetry::scrape::client(Duration::from_secs(1))?,
        cancel.clone(),
    );
    let seen = tokio::spawn(async move {
        let mut ids = std::collections::BTreeSet::new();
        while let Some(o) = observations.recv().await {
            ids.insert(o.index);
        }
        ids
    });
    assert!(scheduler.is_empty());
    scheduler.add(7, spec(&sim.urls()[0], 100));
    eventually("the first target scraped", Duration::from_secs(30), || async {
        Ok(scheduler.status(7).is_some_and(|s| s.scrapes_ok >= 3).then_some(()))
    })
    .await?;
    let before = scheduler.status(7).expect("target 7").scrapes_ok;
    scheduler.add(9, spec(&sim.urls()[1], 100));
    assert!(scheduler.contains_url(&sim.urls()[1]) && scheduler.id_of(&sim.urls()[1]) == Some(9));
    eventually("the second target scraped while the first goes on", Duration::from_secs(30), || async {
        let (first, second) = (scheduler.status(7), scheduler.status(9));
        Ok((second.is_some_and(|s| s.scrapes_ok >= 3) && first.is_some_and(|s| s.scrapes_ok > before))
            .then_some(()))
    })
    .await?;
    // The first target kept its window: it was never restarted by the second's arrival.
    assert!(scheduler.status(7).expect("target 7").scrapes_ok > before);

    assert!(scheduler.remove(7));
    assert!(!scheduler.remove(7), "removing twice");
    assert_eq!(scheduler.targets().iter().map(|(id, _)| *id).collect::<Vec<_>>(), [9]);
    assert!(!scheduler.contains_url(&sim.urls()[0]));

    // A new interval restarts every loop on it.
    scheduler.set_interval(Duration::from_millis(50), Duration::from_secs(1));
    eventually("the remaining target scraped on the new interval", Duration::from_secs(30), || async {
        Ok(scheduler.status(9).is_some_and(|s| s.scrapes_ok >= 5).then_some(()))
    })
    .await?;
    cancel.cancel();
    let ids = tokio::time::timeout(Duration::from_secs(10), seen).await??;
    assert_eq!(ids.into_iter().collect::<Vec<_>>(), [7, 9], "observations ended after the cancel");
    Ok(())
}
