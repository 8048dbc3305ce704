//! Comparison of two windows: aggregates, differences, bootstrap intervals, the same answer
//! from raw samples and from tiers, policy windows, and the JSON and CSV shapes.

use fleet_store::{
    CompareOptions, Comparison, MaintenanceConfig, NewPolicyVersion, PushOutcome, SampleRow, SampleSignals,
    StoreError, TimeWindow, WindowSpec,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

use crate::common::{DAY_MS, HOUR_MS, T0, fill, open, sample};

/// Before T0 + 1 h: hit rate ~0.4, p95 ~1.0 s, loads 1 and 3 (imbalance 0.5).
/// After: hit rate ~0.6, p95 ~0.8 s, loads 2 and 2 (imbalance 0). Noise is seeded.
fn shifted(r: usize, ts: i64, k: i64) -> SampleRow {
    let mut rng = StdRng::seed_from_u64((k as u64) << 8 | r as u64);
    let noise = rng.random_range(-0.05..0.05);
    let after = ts >= T0 + HOUR_MS;
    let load = if after {
        2.0
    } else if r == 0 {
        1.0
    } else {
        3.0
    };
    SampleRow {
        prompt_tok_s: Some(if after { 1200.0 } else { 1000.0 }),
        gen_tok_s: Some(100.0),
        ..sample(
            r,
            ts,
            SampleSignals {
                hit_rate: Some(if after { 0.6 } else { 0.4 } + noise),
                ttft_p50_s: Some(0.3 + noise),
                ttft_p95_s: Some(if after { 0.8 } else { 1.0 } + noise),
                queue_depth: Some(load - 1.0),
                running: Some(1.0),
                kv_usage: Some(0.5),
            },
        )
    }
}

fn window(from_ms: i64, to_ms: i64) -> WindowSpec {
    WindowSpec::Time(TimeWindow { from_ms, to_ms })
}

fn metric<'a>(c: &'a Comparison, name: &str) -> &'a fleet_store::MetricDiff {
    c.metrics.iter().find(|m| m.name == name).unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_real_shift_is_measured_with_an_interval_that_excludes_zero(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store = open(options).await;
    fill(&store, 2, T0, T0 + 2 * HOUR_MS, 5000, shifted).await;
    let (a, b) = (window(T0, T0 + HOUR_MS), window(T0 + HOUR_MS, T0 + 2 * HOUR_MS));
    let now = T0 + 2 * HOUR_MS;
    let c = store.compare(&a, &b, now, &CompareOptions::default()).await.unwrap();

    assert_eq!((c.a.buckets, c.b.buckets, c.a.resolution_s), (360, 360, 10));
    assert_eq!((c.a.samples, c.a.max_replicas), (1440, 2));
    let hit = metric(&c, "hit_rate");
    assert!((hit.delta.unwrap() - 0.2).abs() < 0.01, "{hit:?}");
    assert!(hit.ci_low.unwrap() > 0.15 && hit.ci_high.unwrap() < 0.25, "{hit:?}");
    let p95 = metric(&c, "ttft_p95_s");
    assert!((p95.delta.unwrap() + 0.2).abs() < 0.01 && p95.ci_high.unwrap() < 0.0, "{p95:?}");
    // No change in p50: the interval straddles zero.
    let p50 = metric(&c, "ttft_p50_s");
    assert!(p50.ci_low.unwrap() < 0.0 && p50.ci_high.unwrap() > 0.0, "{p50:?}");
    let imbalance = metric(&c, "imbalance");
    assert!((imbalance.a.unwrap() - 0.5).abs() < 1e-9, "{imbalance:?}");
    // Perfectly even load after: no bucket has a coefficient of variation above zero.
    assert!(imbalance.b.unwrap().abs() < 1e-9, "{imbalance:?}");
    let throughput = metric(&c, "throughput_tok_s");
    assert_eq!((throughput.a, throughput.b), (Some(2200.0), Some(2600.0)));
    let queue = metric(&c, "queue_depth");
    assert_eq!((queue.a, queue.b, queue.delta), (Some(1.0), Some(1.0), Some(0.0)));

    // The same data and seed give the same answer; another seed moves only the interval.
    let again = store.compare(&a, &b, now, &CompareOptions::default()).await.unwrap();
    assert_eq!(again, c);
    let reseeded =
        store.compare(&a, &b, now, &CompareOptions { seed: 99, ..Default::default() }).await.unwrap();
    assert_eq!(metric(&reseeded, "hit_rate").delta, hit.delta);
    assert_ne!(metric(&reseeded, "hit_rate").ci_low, hit.ci_low);
}

#[sqlx::test(migrations = false)]
async fn raw_samples_and_summarised_tiers_give_the_same_comparison(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store = open(options).await;
    fill(&store, 3, T0, T0 + 2 * HOUR_MS, 2000, shifted).await;
    let (a, b) = (window(T0, T0 + HOUR_MS), window(T0 + HOUR_MS, T0 + 2 * HOUR_MS));
    let now = T0 + 2 * HOUR_MS;
    let from_raw = store.compare(&a, &b, now, &CompareOptions::default()).await.unwrap();
    // Summarise half of it: the answer then comes from tiers and raw together...
    store.maintain(T0 + 90 * 60_000, &MaintenanceConfig { grace_ms: 0, ..Default::default() }).await.unwrap();
    let mixed = store.compare(&a, &b, now, &CompareOptions::default()).await.unwrap();
    // ...and, once all is summarised and raw samples have expired, from tiers alone.
    store.maintain(now + 2 * DAY_MS, &MaintenanceConfig { grace_ms: 0, ..Default::default() }).await.unwrap();
    assert_eq!(store.sample_count().await.unwrap(), 0);
    let from_tiers = store.compare(&a, &b, now, &CompareOptions::default()).await.unwrap();
    for other in [&mixed, &from_tiers] {
        assert_eq!(other.a.buckets, from_raw.a.buckets);
        for (x, y) in from_raw.metrics.iter().zip(&other.metrics) {
            for (u, v) in [(x.a, y.a), (x.b, y.b), (x.ci_low, y.ci_low), (x.ci_high, y.ci_high)] {
                assert!((u.unwrap() - v.unwrap()).abs() < 1e-9, "{x:?} vs {y:?}");
            }
        }
    }
}

#[sqlx::test(migrations = false)]
async fn windows_older_than_the_10s_tier_are_compared_at_one_minute(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store = open(options).await;
    fill(&store, 2, T0, T0 + 2 * HOUR_MS, 10_000, shifted).await;
    let now = T0 + 10 * DAY_MS;
    store.maintain(now, &MaintenanceConfig::default()).await.unwrap();
    let c = store
        .compare(
            &window(T0, T0 + HOUR_MS),
            &window(T0 + HOUR_MS, T0 + 2 * HOUR_MS),
            now,
            &CompareOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!((c.a.resolution_s, c.a.buckets, c.b.buckets), (60, 60, 60));
    assert!((metric(&c, "hit_rate").delta.unwrap() - 0.2).abs() < 0.01);

    // Recent but long windows are read at 1 min too; short recent ones at 10 s.
    let now = T0 + 2 * HOUR_MS;
    let long = CompareOptions { fine_max_ms: HOUR_MS / 2, ..CompareOptions::default() };
    let (a, b) = (window(T0, T0 + HOUR_MS), window(T0 + HOUR_MS, now));
    assert_eq!(store.compare(&a, &b, now, &long).await.unwrap().a.resolution_s, 60);
    assert_eq!(store.compare(&a, &b, now, &CompareOptions::default()).await.unwrap().a.resolution_s, 10);
}

#[sqlx::test(migrations = false)]
async fn missing_signals_stay_missing_and_empty_windows_have_no_numbers(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store = open(options).await;
    // Engines that report no throughput and no TTFT (no traffic), only queue and hit rate.
    fill(&store, 2, T0, T0 + HOUR_MS, 5000, |r, ts, _| {
        sample(
            r,
            ts,
            SampleSignals { queue_depth: Some(0.0), hit_rate: Some(0.5), ..SampleSignals::default() },
        )
    })
    .await;
    let c = store
        .compare(
            &window(T0, T0 + HOUR_MS),
            &window(T0 + 5 * HOUR_MS, T0 + 6 * HOUR_MS),
            T0 + 6 * HOUR_MS,
            &CompareOptions::default(),
        )
        .await
        .unwrap();
    let throughput = metric(&c, "throughput_tok_s");
    assert_eq!((throughput.a, throughput.n_a), (None, 0));
    assert_eq!(metric(&c, "hit_rate").a, Some(0.5));
    // No load at all: imbalance is undefined, not 0.
    assert_eq!(metric(&c, "imbalance").a, None);
    assert_eq!(c.b.buckets, 0);
    for m in &c.metrics {
        assert_eq!((m.b, m.delta, m.ci_low, m.ci_high), (None, None, None, None), "{m:?}");
    }
}

#[sqlx::test(migrations = false)]
async fn policy_versions_are_compared_over_their_active_windows(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store = open(options).await;
    fill(&store, 2, T0, T0 + 2 * HOUR_MS, 5000, shifted).await;
    store.register_router("default", "http://router-1", None).await.unwrap();
    for (label, at) in [("v1", T0), ("v2", T0 + HOUR_MS), ("v3", T0 + 3 * HOUR_MS)] {
        store
            .record_policy_version(&NewPolicyVersion {
                fleet: "default",
                label,
                spec: "{\"kind\":\"prefix_affinity\"}",
                author: "ops@example.org",
                created_ms: at - 60_000,
                routers: &["http://router-1"],
            })
            .await
            .unwrap();
    }
    let ack = |label: &str| PushOutcome::Acknowledged { acked_label: label.into() };
    store.record_push("v1", "http://router-1", T0, &ack("v1")).await.unwrap();
    // A failed push, and one the router answered but still ran the old version, do not
    // start v2's window; the acknowledged one does.
    store
        .record_push(
            "v2",
            "http://router-1",
            T0 + 30 * 60_000,
            &PushOutcome::Failed { error: "timeout".into() },
        )
        .await
        .unwrap();
    store.record_push("v2", "http://router-1", T0 + 40 * 60_000, &ack("v1")).await.unwrap();
    store.record_push("v2", "http://router-1", T0 + HOUR_MS, &ack("v2")).await.unwrap();

    let now = T0 + 2 * HOUR_MS;
    let v1 = store.policy_window("v1", now).await.unwrap();
    assert_eq!((v1.from_ms, v1.to_ms, v1.still_active), (T0, T0 + HOUR_MS, false));
    let v2 = store.policy_window("v2", now).await.unwrap();
    assert_eq!((v2.from_ms, v2.to_ms, v2.still_active), (T0 + HOUR_MS, now, true));
    // The whole fleet's pushes in one read give the same windows; v3 was never in force.
    let pushes = store.fleet_pushes("default").await.unwrap();
    let labels: Vec<&str> = pushes.iter().map(|p| p.label.as_str()).collect();
    assert_eq!(labels, ["v1", "v2", "v2", "v2"]);
    let windows = fleet_store::active_windows(&pushes, now);
    assert_eq!((windows.get("v1"), windows.get("v2"), windows.get("v3")), (Some(&v1), Some(&v2), None));

    let options = CompareOptions::default();
    let by_policy = store
        .compare(&WindowSpec::Policy("v1".into()), &WindowSpec::Policy("v2".into()), now, &options)
        .await
        .unwrap();
    let by_time =
        store.compare(&window(T0, T0 + HOUR_MS), &window(T0 + HOUR_MS, now), now, &options).await.unwrap();
    assert_eq!(by_policy.metrics, by_time.metrics);
    assert_eq!((by_policy.a.policy.as_deref(), by_policy.b.policy.as_deref()), (Some("v1"), Some("v2")));

    let never =
        store.compare(&WindowSpec::Policy("v3".into()), &window(T0, now), now, &options).await.unwrap_err();
    assert!(matches!(never, StoreError::PolicyNeverActive { .. }), "{never}");
    let unknown =
        store.compare(&WindowSpec::Policy("v9".into()), &window(T0, now), now, &options).await.unwrap_err();
    assert!(unknown.to_string().contains("v1, v2, v3"), "{unknown}");

    // v1 pushed again after v2 takes over from v2 there.
    store.record_push("v1", "http://router-1", T0 + 90 * 60_000, &ack("v1")).await.unwrap();
    let windows = fleet_store::active_windows(&store.fleet_pushes("default").await.unwrap(), now);
    assert_eq!(windows["v2"], store.policy_window("v2", now).await.unwrap());
    assert_eq!((windows["v2"].to_ms, windows["v1"].from_ms), (T0 + 90 * 60_000, T0));
}

#[sqlx::test(migrations = false)]
async fn json_and_csv_exports_have_the_documented_shape(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store = open(options).await;
    fill(&store, 2, T0, T0 + 2 * HOUR_MS, 10_000, shifted).await;
    let c = store
        .compare(
            &window(T0, T0 + HOUR_MS),
            &window(T0 + HOUR_MS, T0 + 2 * HOUR_MS),
            T0 + 2 * HOUR_MS,
            &CompareOptions::default(),
        )
        .await
        .unwrap();
    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(json["a"]["from"], "2025-06-01T00:00:00Z");
    assert_eq!(json["b"]["to"], "2025-06-01T02:00:00Z");
    let names: Vec<&str> =
        json["metrics"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["hit_rate", "ttft_p50_s", "ttft_p95_s", "queue_depth", "throughput_tok_s", "imbalance"]
    );
    for m in json["metrics"].as_array().unwrap() {
        for key in ["a", "b", "delta", "ci_low", "ci_high"] {
            assert!(m.get(key).is_some(), "metric {m} has no {key}");
        }
    }
    let csv = c.to_csv();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 7);
    assert!(lines[0].starts_with("metric,a,b,delta,ci_low,ci_high"));
    let hit_a: f64 = lines[1].strip_prefix("hit_rate,").unwrap().split(',').next().unwrap().parse().unwrap();
    assert!((hit_a - 0.4).abs() < 0.01, "{}", lines[1]);
    assert!(lines.iter().all(|l| l.split(',').count() == 12), "{csv}");
}
