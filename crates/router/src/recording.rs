//! Traffic recording: a bounded in-memory ring of fleet-trace records and, optionally, a size-rotated file.
//!
//! Records carry only hashes and counts (never prompt text). The hot path hands a record to the ring under
//! a short lock and to the file writer through a bounded channel; the writer thread does all file I/O, so a
//! slow disk never slows requests (when the channel is full the record is counted as dropped from the file,
//! and stays in the ring).
//!
//! The ring is bounded twice: by records (`ring_capacity`) and by bytes (`max_ring_bytes`, each record
//! weighed by [`weight`], an upper bound of its JSON line), and every record is bounded before it enters:
//! at most [`MAX_RECORDED_BLOCKS`] block hashes (a prompt's first blocks: the hashes are chained, so they
//! are its prefix) and a model name of at most [`MAX_KEPT_NAME_BYTES`]. A client's data of unbounded size
//! (a 1 MiB model name, a 15 MiB prompt) therefore never grows the router's memory or its trace pages
//! beyond those bounds. A page of `GET /admin/trace` is bounded by bytes too ([`Recorder::page`]).
//!
//! Records are numbered 1, 2, ... in the order they are added (at each request's completion, so not quite in
//! arrival order). A reader that keeps the number of the last record it saw (the cursor of a [`TracePage`])
//! asks for what was added after it, and never misses a long request that arrived early but finished late,
//! as an arrival-time filter alone would.

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
/// Most block hashes a record keeps: the first ones of its prompt (its prefix). 65,536 blocks are a
/// prompt of a million tokens at 16 tokens a block.
pub const MAX_RECORDED_BLOCKS: usize = 65_536;
/// Longest name (a requested model) a record or a decision keeps, in bytes; a longer one is cut, and says so.
pub const MAX_KEPT_NAME_BYTES: usize = 256;

/// `name` as the router keeps it: whole up to [`MAX_KEPT_NAME_BYTES`], else cut there (at a character
/// boundary) and marked with `...`. No model name is that long; a client that sends one gets no more of the
/// router's memory than one that does not.
pub fn kept_name(name: &str) -> String {
    if name.len() <= MAX_KEPT_NAME_BYTES {
        return name.to_owned();
    }
    let mut cut = MAX_KEPT_NAME_BYTES;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &name[..cut])
}

/// An upper bound of a record's size, as a JSON line and in memory: its fixed fields, 21 bytes a block
/// hash (20 digits and a comma), and 6 bytes a byte of text (the longest JSON escape, `\u0000`).
pub fn weight(record: &TraceRecord) -> usize {
    let text = [&record.model, &record.replica, &record.branch, &record.policy, &record.error]
        .iter()
        .map(|field| field.as_ref().map_or(0, String::len))
        .sum::<usize>()
        + record.session.map_or(0, |_| 16);
    384 + 21 * record.hash_ids.len() + 6 * text
}

/// The ring and what it weighs.
#[derive(Debug, Default)]
struct Ring {
    records: VecDeque<TraceRecord>,
    /// The sum of the records' [`weight`]s.
    bytes: usize,
}

/// The recorder shared by every request.
#[derive(Debug)]
pub struct Recorder {
    ring: Mutex<Ring>,
    capacity: usize,
    max_bytes: usize,
    file: Option<SyncSender<TraceRecord>>,
    /// Records that could not be queued for the file.
    pub file_dropped: AtomicU64,
    /// When this recorder started (Unix ms): numbering starts again from 1 in a new epoch (a restart).
    pub epoch: u64,
    /// Records written so far (ring); also the number of the newest one. Changed only under the ring's lock,
    /// so that a reader holding it sees the ring and the count agree.
    pub recorded: AtomicU64,
}

/// Records added after a cursor.
#[derive(Debug, Default, PartialEq)]
pub struct TracePage {
    /// The records, oldest added first.
    pub records: Vec<TraceRecord>,
    /// The number of the newest record: the cursor to ask with next time.
    pub next: u64,
    /// Records added after the cursor that the ring no longer holds (the reader came back too late);
    /// always 0 for a first read (`after` 0), which asks only for what the ring holds.
    pub missed: u64,
    /// Matching records the ring holds after this page (the page stopped at its limit of records or of
    /// bytes): ask again with `next` to read them. 0 when the page reached the newest record.
    pub more: u64,
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
        let records = VecDeque::with_capacity(config.ring_capacity.min(4096));
        Ok(Self {
            ring: Mutex::new(Ring { records, bytes: 0 }),
            capacity: config.ring_capacity,
            max_bytes: config.max_ring_bytes,
            file,
            file_dropped: AtomicU64::new(0),
            epoch: crate::state::unix_ms(),
            recorded: AtomicU64::new(0),
        })
    }

    /// Adds one record (bounded first: its first [`MAX_RECORDED_BLOCKS`] hashes, its model name cut at
    /// [`MAX_KEPT_NAME_BYTES`]); the oldest records leave to keep the ring within its count and bytes.
    pub fn record(&self, mut record: TraceRecord) {
        record.hash_ids.truncate(MAX_RECORDED_BLOCKS);
        if let Some(model) = &mut record.model
            && model.len() > MAX_KEPT_NAME_BYTES
        {
            *model = kept_name(model);
        }
        if let Some(file) = &self.file
            && let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = file.try_send(record.clone())
        {
            self.file_dropped.fetch_add(1, Ordering::Relaxed);
        }
        let added = weight(&record);
        let mut ring = self.ring.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while ring.records.len() >= self.capacity
            || (!ring.records.is_empty() && ring.bytes + added > self.max_bytes)
        {
            let Some(oldest) = ring.records.pop_front() else { break };
            ring.bytes -= weight(&oldest);
        }
        ring.bytes += added;
        ring.records.push_back(record);
        self.recorded.fetch_add(1, Ordering::Relaxed);
    }

    /// What the ring holds: records and their summed [`weight`].
    pub fn held(&self) -> (usize, usize) {
        let ring = self.ring.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (ring.records.len(), ring.bytes)
    }

    /// Records added after record number `after` (0: from the first) whose arrival is at or after
    /// `since_ms`, at most `limit` of them and at most `max_bytes` of [`weight`] (but always one, when one
    /// matches). A cursor past the newest record (the router restarted since the reader's last call) counts
    /// as 0, and the page's `next` is then below it. A page cut at either limit ends at its last record
    /// (`next` is that record's number) and says how many more match (`more`).
    pub fn page(&self, since_ms: u64, after: u64, limit: usize, max_bytes: usize) -> TracePage {
        let ring = self.ring.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let newest = self.recorded.load(Ordering::Relaxed);
        let after = if after > newest { 0 } else { after };
        // The ring holds records `oldest + 1 ..= newest`.
        let oldest = newest - ring.records.len() as u64;
        let skip = usize::try_from(after.saturating_sub(oldest)).unwrap_or(usize::MAX);
        let mut records = Vec::new();
        let mut next = newest;
        let mut more = 0u64;
        let mut bytes = 0usize;
        let mut full = false;
        for (offset, record) in ring.records.iter().enumerate().skip(skip) {
            if record.timestamp < since_ms {
                continue;
            }
            let added = weight(record);
            if !full && !records.is_empty() && bytes + added > max_bytes {
                full = true;
                next = oldest + offset as u64;
            }
            if full {
                more += 1;
                continue;
            }
            bytes += added;
            records.push(record.clone());
            if records.len() == limit {
                full = true;
                next = oldest + offset as u64 + 1;
            }
        }
        if more == 0 {
            next = newest;
        }
        let missed = if after == 0 { 0 } else { oldest.saturating_sub(after) };
        TracePage { records, next, missed, more }
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
        let kept: Vec<u64> =
            recorder.page(0, 0, usize::MAX, usize::MAX).records.iter().map(|r| r.timestamp).collect();
        assert_eq!(kept, [20, 30, 40]);
        assert_eq!(recorder.page(30, 0, usize::MAX, usize::MAX).records.len(), 2);
    }

    #[test]
    fn a_cursor_pages_through_records_in_the_order_they_were_added() {
        let recorder = Recorder::new(&RecordConfig { ring_capacity: 4, ..RecordConfig::default() }).unwrap();
        let arrivals = |page: &TracePage| page.records.iter().map(|r| r.timestamp).collect::<Vec<_>>();
        assert_eq!(recorder.page(0, 0, usize::MAX, usize::MAX), TracePage::default());
        // A long request that arrived first (at 5) completes after two short ones.
        for t in [10, 20, 5] {
            recorder.record(record(t));
        }
        let first = recorder.page(0, 0, usize::MAX, usize::MAX);
        assert_eq!((arrivals(&first), first.next, first.missed), (vec![10, 20, 5], 3, 0));
        recorder.record(record(30));
        let second = recorder.page(0, first.next, usize::MAX, usize::MAX);
        assert_eq!((arrivals(&second), second.next, second.missed), (vec![30], 4, 0));
        // The arrival filter still applies to the page.
        assert_eq!(arrivals(&recorder.page(15, 0, usize::MAX, usize::MAX)), [20, 30]);
        // Six more: the ring (4) dropped two records the reader never saw.
        for t in 40..46 {
            recorder.record(record(t));
        }
        let late = recorder.page(0, second.next, usize::MAX, usize::MAX);
        assert_eq!((arrivals(&late), late.next, late.missed), (vec![42, 43, 44, 45], 10, 2));
        // A first read asks for what the ring holds: nothing counts as missed.
        assert_eq!(recorder.page(0, 0, usize::MAX, usize::MAX).missed, 0);
        // A cursor from before a restart (past the newest record) reads everything again.
        let restarted = recorder.page(0, 99, usize::MAX, usize::MAX);
        assert_eq!((restarted.records.len(), restarted.next), (4, 10));
        assert!(restarted.next < 99);
    }

    #[test]
    fn a_limited_page_ends_at_its_last_record_and_counts_the_rest() {
        let recorder = Recorder::new(&RecordConfig { ring_capacity: 10, ..RecordConfig::default() }).unwrap();
        for t in [5, 10, 1, 20, 30, 40, 50] {
            recorder.record(record(t));
        }
        let arrivals = |page: &TracePage| page.records.iter().map(|r| r.timestamp).collect::<Vec<_>>();
        // Arrivals from 10 on: record 3 (arrival 1) is skipped but the cursor moves past it.
        let first = recorder.page(10, 0, 3, usize::MAX);
        assert_eq!((arrivals(&first), first.next, first.more), (vec![10, 20, 30], 5, 2));
        let second = recorder.page(10, first.next, 3, usize::MAX);
        assert_eq!((arrivals(&second), second.next, second.more), (vec![40, 50], 7, 0));
        // Exactly at the limit with nothing after: the page ends at the newest record.
        let exact = recorder.page(40, 0, 2, usize::MAX);
        assert_eq!((arrivals(&exact), exact.next, exact.more), (vec![40, 50], 7, 0));
    }

    #[test]
    fn the_ring_and_its_pages_are_bounded_by_bytes_and_each_record_is_bounded() {
        let one = weight(&record(0));
        let config =
            RecordConfig { ring_capacity: 1000, max_ring_bytes: 10 * one, ..RecordConfig::default() };
        let recorder = Recorder::new(&config).unwrap();
        for t in 0..25 {
            recorder.record(record(t));
        }
        assert_eq!(recorder.held(), (10, 10 * one), "the ring keeps what its bytes allow");
        // A page of 4 records' bytes: cut there, the rest counted, the cursor on its last record.
        let page = recorder.page(0, 0, 100, 4 * one);
        let arrivals: Vec<u64> = page.records.iter().map(|r| r.timestamp).collect();
        assert_eq!((arrivals, page.next, page.more), (vec![15, 16, 17, 18], 19, 6));
        let rest = recorder.page(0, page.next, 100, 4 * one);
        assert_eq!((rest.records.len(), rest.next, rest.more), (4, 23, 2));
        // One record heavier than the page's bytes still comes, alone.
        assert_eq!(recorder.page(0, 0, 100, 1).records.len(), 1);

        // A client's unbounded data: a 1 MiB model name and a prompt of 200,000 blocks.
        let huge = TraceRecord {
            model: Some("m".repeat(1 << 20)),
            ..TraceRecord::mooncake(99, 3_200_000, 1, (0..200_000).collect())
        };
        recorder.record(huge);
        let kept = recorder.page(99, 0, 1, usize::MAX).records.remove(0);
        assert_eq!(kept.hash_ids.len(), MAX_RECORDED_BLOCKS);
        assert_eq!(kept.hash_ids[..3], [0, 1, 2], "the prefix is kept");
        let model = kept.model.unwrap();
        assert!(model.len() <= MAX_KEPT_NAME_BYTES + 3 && model.ends_with("..."), "{}", model.len());
        assert_eq!(kept_name(&"€".repeat(100)).len(), 255 + 3, "cut at a character boundary");
        // Heavier than the whole ring: it stays alone (the bound is its own, fixed).
        assert_eq!(recorder.held().0, 1);
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
