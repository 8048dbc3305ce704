//! Traffic recording: a bounded in-memory ring of fleet-trace records and, optionally, a size-rotated file.
//!
//! Records carry only hashes and counts (never prompt text). The hot path hands a record to the ring under
//! a short lock and to the file writer through a bounded channel; the writer thread does all file I/O, so a
//! slow disk never slows requests (when the channel is full the record is counted as dropped from the file,
//! and stays in the ring).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use fleet_trace::{TraceRecord, write_record};

use crate::config::RecordConfig;

/// Records waiting for the file writer before new ones are dropped from the file.
const FILE_QUEUE: usize = 65_536;

/// The recorder shared by every request.
#[derive(Debug)]
pub struct Recorder {
    ring: Mutex<VecDeque<TraceRecord>>,
    capacity: usize,
    file: Option<SyncSender<TraceRecord>>,
    /// Records that could not be queued for the file.
    pub file_dropped: AtomicU64,
    /// Records written so far (ring).
    pub recorded: AtomicU64,
}

impl Recorder {
    /// A recorder; with `config.file` set, opens (appends to) the file and starts its writer thread.
    pub fn new(config: &RecordConfig) -> std::io::Result<Self> {
        let file = match &config.file {
            Some(path) => {
                let writer = RotatingFile::open(path.clone(), config.max_file_bytes, config.keep_files)?;
                let (sender, receiver) = sync_channel(FILE_QUEUE);
                std::thread::Builder::new()
                    .name("fleet-router-record".to_owned())
                    .spawn(move || write_loop(writer, receiver))?;
                Some(sender)
            }
            None => None,
        };
        Ok(Self {
            ring: Mutex::new(VecDeque::with_capacity(config.ring_capacity.min(4096))),
            capacity: config.ring_capacity,
            file,
            file_dropped: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
        })
    }

    /// Adds one record.
    pub fn record(&self, record: TraceRecord) {
        if let Some(file) = &self.file
            && let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = file.try_send(record.clone())
        {
            self.file_dropped.fetch_add(1, Ordering::Relaxed);
        }
        let mut ring = self.ring.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if ring.len() == self.capacity {
            ring.pop_front();
        }
        ring.push_back(record);
        self.recorded.fetch_add(1, Ordering::Relaxed);
    }

    /// Records with `timestamp >= since_ms`, oldest first.
    pub fn since(&self, since_ms: u64) -> Vec<TraceRecord> {
        let ring = self.ring.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Records are appended at completion, so timestamps (arrivals) are nearly but not strictly sorted.
        ring.iter().filter(|record| record.timestamp >= since_ms).cloned().collect()
    }
}

fn write_loop(mut file: RotatingFile, receiver: Receiver<TraceRecord>) {
    while let Ok(record) = receiver.recv() {
        let mut batch = vec![record];
        batch.extend(receiver.try_iter().take(4096));
        for record in &batch {
            if let Err(error) = file.write(record) {
                tracing::error!(%error, path = %file.path.display(), "cannot write the traffic record file");
            }
        }
        if let Err(error) = file.flush() {
            tracing::error!(%error, path = %file.path.display(), "cannot flush the traffic record file");
        }
    }
}

/// An append-only file rotated by size: `FILE` -> `FILE.1` -> ... -> `FILE.keep` (the oldest is deleted).
#[derive(Debug)]
pub struct RotatingFile {
    path: PathBuf,
    writer: BufWriter<File>,
    written: u64,
    max_bytes: u64,
    keep: usize,
}

impl RotatingFile {
    /// Opens `path` for appending.
    pub fn open(path: PathBuf, max_bytes: u64, keep: usize) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let written = file.metadata()?.len();
        Ok(Self { path, writer: BufWriter::new(file), written, max_bytes, keep })
    }

    /// Appends one record, rotating first when it would pass the size limit.
    pub fn write(&mut self, record: &TraceRecord) -> std::io::Result<()> {
        let mut line = Vec::with_capacity(256);
        write_record(&mut line, record)?;
        if self.written > 0 && self.written + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.writer.write_all(&line)?;
        self.written += line.len() as u64;
        Ok(())
    }

    /// Flushes buffered lines to the file.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.writer.flush()
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.writer.flush()?;
        if self.keep == 0 {
            std::fs::remove_file(&self.path)?;
        } else {
            for i in (1..self.keep).rev() {
                let from = numbered(&self.path, i);
                if from.exists() {
                    std::fs::rename(&from, numbered(&self.path, i + 1))?;
                }
            }
            std::fs::rename(&self.path, numbered(&self.path, 1))?;
        }
        let file = OpenOptions::new().create(true).append(true).open(&self.path)?;
        self.writer = BufWriter::new(file);
        self.written = 0;
        Ok(())
    }
}

fn numbered(path: &Path, i: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{i}"));
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(timestamp: u64) -> TraceRecord {
        TraceRecord { block_tokens: Some(16), ..TraceRecord::mooncake(timestamp, 64, 2, vec![1, 2, 3, 4]) }
    }

    #[test]
    fn the_ring_is_bounded_and_filters_by_time() {
        let recorder = Recorder::new(&RecordConfig { ring_capacity: 3, ..RecordConfig::default() }).unwrap();
        for t in 0..5 {
            recorder.record(record(t * 10));
        }
        let kept: Vec<u64> = recorder.since(0).iter().map(|r| r.timestamp).collect();
        assert_eq!(kept, [20, 30, 40]);
        assert_eq!(recorder.since(30).len(), 2);
    }

    #[test]
    fn the_file_rotates_by_size_and_every_file_reads_back_as_a_trace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("traffic.jsonl");
        let mut file = RotatingFile::open(path.clone(), 1024, 2).unwrap();
        for t in 0..100 {
            file.write(&record(t)).unwrap();
        }
        file.flush().unwrap();
        let mut total = 0;
        for candidate in [path.clone(), numbered(&path, 1), numbered(&path, 2)] {
            let text = std::fs::read_to_string(&candidate).unwrap();
            assert!(text.len() <= 1024, "{} is {} bytes", candidate.display(), text.len());
            total += fleet_trace::read_trace(text.as_bytes()).unwrap().records.len();
        }
        assert!(!numbered(&path, 3).exists(), "only 2 rotated files are kept");
        assert!(total > 0 && total < 100, "older records were rotated away: {total}");
    }
}
