//! Benchmarks of the history store against the targets: sustained ingestion of at
//! least 5,000 samples/s (one transaction per scrape round, maintenance running alongside),
//! and a 24 h vs 24 h comparison at 100 replicas within 100 ms.
//!
//! Run: `cargo bench -p fleet-store --bench history` (`-- --quick` for a smaller run,
//! `-- --compare-only` to skip ingestion).

use std::time::{Duration, Instant};

use fleet_store::{
    CompareOptions, MaintenanceConfig, SampleRow, SampleSignals, Store, Tier, TimeWindow, WindowSpec,
};

const REPLICAS: usize = 100;
const HOUR_MS: i64 = 3_600_000;
/// A fixed "now" so that runs are comparable: 2025-06-01T00:00:00Z.
const NOW_MS: i64 = 1_748_736_000_000;

fn round(ts_ms: i64, k: i64) -> Vec<SampleRow> {
    (0..REPLICAS)
        .map(|r| {
            // Deterministic, varied values: a replica-dependent level plus a slow wave.
            let x = ((k * 31 + r as i64 * 17) % 100) as f64 / 100.0;
            SampleRow {
                url: format!("http://10.0.{}.{}:8000", r / 250, r % 250),
                model: "llama-3-8b".into(),
                ts_ms,
                signals: SampleSignals {
                    queue_depth: Some((r % 5) as f64 + x),
                    running: Some(8.0 + x),
                    kv_usage: Some(0.4 + x / 2.0),
                    hit_rate: Some(0.3 + x / 2.0),
                    ttft_p50_s: Some(0.1 + x / 10.0),
                    ttft_p95_s: Some(0.4 + x / 5.0),
                },
                prompt_tok_s: Some(2000.0 + 100.0 * x),
                gen_tok_s: Some(400.0 + 10.0 * x),
            }
        })
        .collect()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(async {
        if !std::env::args().any(|a| a == "--compare-only") {
            ingestion(if quick { 50_000 } else { 300_000 }).await;
        }
        compare(if quick { 60_000 } else { 10_000 }).await;
    });
}

/// One scrape round of 100 replicas per transaction, as the app writes, while maintenance
/// passes run every 100 ms on the same database.
async fn ingestion(samples: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(&dir.path().join("ingest.sqlite")).await.expect("open");
    let rounds = samples / REPLICAS;
    let start_ms = NOW_MS - 2 * HOUR_MS;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let maintenance = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::pin!(stop_rx);
            let config = MaintenanceConfig { grace_ms: 0, ..MaintenanceConfig::default() };
            let mut passes = 0u64;
            loop {
                tokio::select! {
                    _ = &mut stop_rx => return passes,
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                let newest: Option<i64> = sqlx::query_scalar("SELECT MAX(ts_ms) FROM samples")
                    .fetch_one(store.pool())
                    .await
                    .unwrap();
                store.maintain(newest.unwrap_or(start_ms), &config).await.expect("maintenance");
                passes += 1;
            }
        })
    };
    let mut worst = Duration::ZERO;
    let began = Instant::now();
    for k in 0..rounds as i64 {
        let batch = round(start_ms + k * 1000, k);
        let t = Instant::now();
        store.insert_samples(&batch).await.expect("insert");
        worst = worst.max(t.elapsed());
    }
    let elapsed = began.elapsed();
    let _ = stop_tx.send(());
    let passes = maintenance.await.expect("maintenance task");
    println!(
        "ingestion: {} samples in {} rounds of {REPLICAS} in {:.2} s = {:.0} samples/s \
         (slowest round {:.1} ms, {passes} maintenance passes alongside)",
        rounds * REPLICAS,
        rounds,
        elapsed.as_secs_f64(),
        (rounds * REPLICAS) as f64 / elapsed.as_secs_f64(),
        worst.as_secs_f64() * 1000.0,
    );
    store.close().await;
}

/// 48 h of history at 100 replicas, scraped every `step_ms`, summarised by maintenance;
/// then the last 24 h compared with the 24 h before. The database is built once and kept
/// in Cargo's bench scratch folder, since building it takes minutes.
async fn compare(step_ms: i64) {
    let path =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("history-compare-{step_ms}.sqlite"));
    let expected = 48 * HOUR_MS / step_ms * REPLICAS as i64;
    let mut store = Store::open(&path).await.expect("open");
    if store.sample_count().await.unwrap() != expected {
        store.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        store = Store::open(&path).await.expect("open");
        let from = NOW_MS - 48 * HOUR_MS;
        let began = Instant::now();
        let (mut ts, mut k) = (from, 0);
        while ts < NOW_MS {
            store.insert_samples(&round(ts, k)).await.expect("insert");
            ts += step_ms;
            k += 1;
        }
        let loaded = began.elapsed();
        let began = Instant::now();
        // Raw retention beyond 48 h, so the samples stay for the next run to find.
        let config = MaintenanceConfig {
            retention: fleet_store::Retention { raw_ms: 100 * HOUR_MS, ..Default::default() },
            grace_ms: 0,
            ..MaintenanceConfig::default()
        };
        store.maintain(NOW_MS, &config).await.expect("maintenance");
        println!(
            "compare setup: {expected} samples over 48 h ({} s scrape interval) loaded in {:.1} s, \
             summarised in {:.1} s",
            step_ms / 1000,
            loaded.as_secs_f64(),
            began.elapsed().as_secs_f64()
        );
    }
    let a = WindowSpec::Time(TimeWindow { from_ms: NOW_MS - 48 * HOUR_MS, to_ms: NOW_MS - 24 * HOUR_MS });
    let b = WindowSpec::Time(TimeWindow { from_ms: NOW_MS - 24 * HOUR_MS, to_ms: NOW_MS });
    // As shipped (24 h windows read at 1 min), then forced to 10 s buckets for reference.
    let fine = CompareOptions { fine_max_ms: 48 * HOUR_MS, ..CompareOptions::default() };
    for options in [CompareOptions::default(), fine] {
        time_compare(&store, &a, &b, &options).await;
    }
    store.close().await;
}

async fn time_compare(store: &Store, a: &WindowSpec, b: &WindowSpec, options: &CompareOptions) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..20 {
        let t = Instant::now();
        last = Some(store.compare(a, b, NOW_MS, options).await.expect("compare"));
        times.push(t.elapsed());
    }
    times.sort();
    let result = last.expect("ran");
    // Where the time goes: reading the bucket series alone.
    let fleet = store.fleet_id("default").await.unwrap();
    let tier = if result.a.resolution_s == 10 { Tier::TenSeconds } else { Tier::OneMinute };
    let t = Instant::now();
    for window in [a, b] {
        let WindowSpec::Time(w) = window else { unreachable!() };
        store.fleet_buckets(fleet, tier, *w).await.unwrap();
    }
    let read = t.elapsed();
    println!(
        "compare 24 h vs 24 h at {REPLICAS} replicas ({} + {} buckets of {} s, {} resamples): \
         median {:.1} ms, max {:.1} ms (of which reading buckets {:.1} ms)",
        result.a.buckets,
        result.b.buckets,
        result.a.resolution_s,
        options.resamples,
        times[times.len() / 2].as_secs_f64() * 1000.0,
        times[times.len() - 1].as_secs_f64() * 1000.0,
        read.as_secs_f64() * 1000.0,
    );
}
