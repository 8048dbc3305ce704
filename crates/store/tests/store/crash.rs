//! Crash safety: a real child process ingests batches and is killed with SIGKILL at
//! seeded-random moments, 20 times in a row on the same database. After each kill the
//! database passes `PRAGMA integrity_check`, every batch the child acknowledged (printed
//! after its commit) is there in full, and no batch is there in part.
//!
//! This test needs a file another process can write, so it uses a temporary folder rather
//! than `#[sqlx::test]`'s managed databases.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::ConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;

use crate::common::T0;

const KILLS: usize = 20;
const REPLICAS: i64 = 25;
/// Longest the child may take to acknowledge a batch before the test gives up on it.
const ACK_DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn acknowledged_batches_survive_sigkill_at_random_moments() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.sqlite");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut rng = StdRng::seed_from_u64(0x000c_4a54_2025);
    let mut acked: Vec<i64> = Vec::new();
    for run in 0..KILLS {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fleet-store-ingest-child"))
            .arg(&db)
            .arg(T0.to_string())
            .arg(REPLICAS.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the ingesting child");
        let stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let (lines_tx, lines) = mpsc::channel::<i64>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let id =
                    line.trim().parse().unwrap_or_else(|_| panic!("child printed {line:?}, not a batch id"));
                if lines_tx.send(id).is_err() {
                    break;
                }
            }
        });

        // The moment: after a random number of acknowledgements, plus a random spin of up
        // to 3 ms so the kill lands anywhere in the write cycle (mid-transaction, during
        // commit, during a maintenance pass...).
        let wait_for = rng.random_range(1..=40);
        for _ in 0..wait_for {
            match lines.recv_timeout(ACK_DEADLINE) {
                Ok(id) => acked.push(id),
                Err(_) => {
                    let _ = child.kill();
                    let mut err = String::new();
                    let _ = stderr.read_to_string(&mut err);
                    panic!("run {run}: the child stopped acknowledging batches; its stderr: {err}");
                }
            }
        }
        let spin = Duration::from_micros(rng.random_range(0..3000));
        let started = Instant::now();
        while started.elapsed() < spin {
            std::hint::spin_loop();
        }
        child.kill().expect("SIGKILL the child");
        let status = child.wait().unwrap();
        assert!(
            !status.success(),
            "run {run}: the child exited by itself ({status}) instead of being killed"
        );
        // Acknowledgements already written to the pipe before the kill count too.
        reader.join().unwrap();
        acked.extend(lines.try_iter());

        let (integrity, batches) = runtime.block_on(inspect(&db));
        assert_eq!(integrity, "ok", "run {run}: integrity_check after SIGKILL");
        for (ts, rows) in &batches {
            assert_eq!(*rows, REPLICAS, "run {run}: batch at {ts} is only partly stored");
        }
        for id in &acked {
            assert!(
                batches.contains_key(&(T0 + id * 1000)),
                "run {run}: batch {id} was acknowledged but is missing after the kill"
            );
        }
    }
    assert!(acked.windows(2).all(|w| w[0] < w[1]), "batch ids must keep increasing across restarts");
    assert!(acked.len() >= KILLS, "too few batches acknowledged to mean anything: {}", acked.len());
}

/// `PRAGMA integrity_check` and the row count of every stored batch (by timestamp).
async fn inspect(db: &std::path::Path) -> (String, BTreeMap<i64, i64>) {
    let mut conn = SqliteConnectOptions::new().filename(db).connect().await.expect("open after the kill");
    let integrity: String = sqlx::query_scalar("PRAGMA integrity_check").fetch_one(&mut conn).await.unwrap();
    let batches: Vec<(i64, i64)> = sqlx::query_as("SELECT ts_ms, COUNT(*) FROM samples GROUP BY ts_ms")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    drop(conn);
    (integrity, batches.into_iter().collect())
}
