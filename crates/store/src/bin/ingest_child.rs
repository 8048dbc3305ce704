//! The child process of the store's crash test: ingests batches into a history database
//! and prints each batch id once its transaction has committed, while maintenance passes
//! run alongside, until it is killed.
//!
//! Usage: `fleet-store-ingest-child DB_PATH BASE_MS REPLICAS`. Batch `k` holds one sample
//! per replica at `BASE_MS + k * 1000`; it resumes after the newest batch in the database.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use fleet_store::{MaintenanceConfig, SampleRow, SampleSignals, Store};

fn main() {
    if let Err(error) = run() {
        eprintln!("fleet-store-ingest-child: {error}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [db, base_ms, replicas] = args.as_slice() else {
        return Err("usage: fleet-store-ingest-child DB_PATH BASE_MS REPLICAS".into());
    };
    let (db, base_ms, replicas) = (PathBuf::from(db), base_ms.parse::<i64>()?, replicas.parse::<usize>()?);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let store = Store::open(&db).await?;
        let newest: Option<i64> =
            sqlx::query_scalar("SELECT MAX(ts_ms) FROM samples").fetch_one(store.pool()).await?;
        let mut batch = newest.map_or(1, |ts| (ts - base_ms) / 1000 + 1);
        // Maintenance follows the data's own clock so that what it does is reproducible;
        // raw retention (24 h) is far beyond what the test writes, so nothing expires.
        let data_now = Arc::new(AtomicI64::new(base_ms + batch * 1000));
        let maintenance = {
            let (store, data_now) = (store.clone(), data_now.clone());
            tokio::spawn(async move {
                let config = MaintenanceConfig { grace_ms: 0, ..MaintenanceConfig::default() };
                loop {
                    if let Err(error) = store.maintain(data_now.load(Ordering::Relaxed), &config).await {
                        eprintln!("maintenance: {error}");
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        };
        let mut stdout = std::io::stdout().lock();
        loop {
            let ts_ms = base_ms + batch * 1000;
            let rows: Vec<SampleRow> = (0..replicas)
                .map(|r| SampleRow {
                    url: format!("http://replica-{r}"),
                    model: "m".into(),
                    ts_ms,
                    signals: SampleSignals {
                        queue_depth: Some((batch % 7) as f64),
                        running: Some(r as f64),
                        hit_rate: Some(0.5),
                        ..SampleSignals::default()
                    },
                    ..SampleRow::default()
                })
                .collect();
            store.insert_samples(&rows).await?;
            data_now.store(ts_ms, Ordering::Relaxed);
            // The parent gone (broken pipe) ends the child too.
            if writeln!(stdout, "{batch}").and_then(|()| stdout.flush()).is_err() {
                maintenance.abort();
                return Ok::<(), Box<dyn std::error::Error>>(());
            }
            batch += 1;
        }
    })
}
