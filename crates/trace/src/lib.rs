//! The request trace format Fleetdeck replays (`fleet-sim replay`) and records (`fleet-router --record`).
//!
//! JSON Lines, one request per line, compatible with the Mooncake trace release
//! (kvcache-ai/Mooncake, FAST'25): `timestamp` (ms), `input_length`, `output_length` and `hash_ids`, one id per
//! block of prompt tokens, where an equal id at the same position means the same prefix up to that block.
//! Fleetdeck adds optional fields (omitted when unknown) so that a router's own traffic, recorded with
//! fleet-policy's chained block hashes, replays the same way. No prompt text is ever part of a record.
//!
//! Parsing is pure and strict about what it reads (types, ranges, one block size per trace), and lenient about
//! what it does not know (unknown fields are ignored, so newer Mooncake releases still load). Every error names
//! the line and the field.

use std::io::{BufRead, Read, Write};

use serde::{Deserialize, Serialize};

/// Tokens per `hash_ids` entry in Mooncake traces, used when a record does not say.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// The longest line accepted: a 1M-token prompt in 16-token blocks of 20-digit hashes fits easily.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// One request of a trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// Arrival time in milliseconds: from the trace's start (Mooncake) or since the Unix epoch (recorded).
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Generated tokens.
    pub output_length: u32,
    /// One id per prompt block of `block_tokens` tokens; an id names its whole prefix.
    pub hash_ids: Vec<u64>,
    /// Tokens per entry of `hash_ids`; `None` means [`MOONCAKE_BLOCK_TOKENS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_tokens: Option<u32>,
    /// `hash_ids` are fleet-policy's chained prefix hashes already (as fleet-router records them), not ids
    /// to chain: a replay uses them as they are, so hash-keyed policies (consistent_hash's ring) see the very
    /// keys the live router saw. Absent (false) in Mooncake traces.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chained: bool,
    /// The served model the request asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A hash of the request's session key, when it had one (never the key itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<u64>,
    /// The replica (base URL) the router sent it to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// The router that recorded it (its admin URL as the app knows it). A router leaves it out: the app
    /// sets it when it merges several routers' recordings, so a replay sends each request through the
    /// router that served it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<String>,
    /// The policy branch that decided (`cache`, `balance`, `fallback`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The policy's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The router's policy version at the pick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<u64>,
    /// Prompt tokens the replica reported as served from its cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u32>,
    /// Prompt tokens the replica reported (`usage.prompt_tokens`, its own tokenizer's count). `input_length`
    /// is the router's count, in the units of `hash_ids`; the two differ when the router estimates tokens
    /// from text, so a hit rate from `cached_tokens` divides by this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_prompt_tokens: Option<u32>,
    /// Time to first token seen by the router, in milliseconds: until the first chunk that carried generated
    /// content (an SSE event with a non-empty `content`/`text`, or a whole answer that has one). `None` when
    /// no token came (an error answer, a stream that broke first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// Time to the first byte of the replica's answer body, in milliseconds (an SSE stream may open with a
    /// role-only chunk, and an error answer has a first byte but no token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_byte_ms: Option<f64>,
    /// HTTP status the client received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Why the answer failed although its status may say otherwise: `stream_broken` (the replica broke off
    /// mid-stream and the router ended it with an error event), `stream_error` (the replica's stream carried
    /// an error event), `no_replica` (every attempt failed; the client got a 502).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl TraceRecord {
    /// A plain Mooncake record.
    pub fn mooncake(timestamp: u64, input_length: u32, output_length: u32, hash_ids: Vec<u64>) -> Self {
        TraceRecord { timestamp, input_length, output_length, hash_ids, ..TraceRecord::default() }
    }

    /// The prompt length in the replica's own tokens (what `cached_tokens` counts in): its report when it
    /// made one, else the router's count.
    pub fn engine_prompt_tokens(&self) -> u32 {
        self.engine_prompt_tokens.unwrap_or(self.input_length)
    }

    /// Tokens per entry of `hash_ids`.
    pub fn block_tokens(&self) -> u32 {
        self.block_tokens.unwrap_or(MOONCAKE_BLOCK_TOKENS)
    }

    /// Checks the values serde cannot: a positive block size and prompt blocks that fit the prompt.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.block_tokens == Some(0) {
            return Err(("block_tokens", "must be at least 1 (tokens per hash id)".into()));
        }
        // A trailing partial block may carry an id (Mooncake does), so allow one block more than full ones.
        let max_blocks = (self.input_length as u64).div_ceil(self.block_tokens() as u64);
        if self.hash_ids.len() as u64 > max_blocks.max(1) {
            return Err((
                "hash_ids",
                format!(
                    "{} ids cannot cover a prompt of {} tokens in blocks of {}: at most {max_blocks}; \
                     check input_length and block_tokens",
                    self.hash_ids.len(),
                    self.input_length,
                    self.block_tokens()
                ),
            ));
        }
        Ok(())
    }
}

/// What is wrong with JSON that serde could not read, in words that never repeat what it read: the kind of
/// fault, where it is (line and column), and what was expected there (the reader's own types' words).
/// serde's own message names the value it found (`invalid type: string "..."`), and a body fetched from an
/// operator-typed URL, or a file the app was pointed at, must not come back through the app's answers; so
/// only the expectation is kept from it.
pub fn json_error_shape(error: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let at = match (error.line(), error.column()) {
        (0, _) => String::new(),
        (line, column) => format!(" at line {line} column {column}"),
    };
    match error.classify() {
        Category::Io => format!("the JSON could not be read{at}"),
        Category::Syntax => format!("not valid JSON{at}"),
        Category::Eof => format!("JSON that ends too early{at}"),
        Category::Data => {
            let text = error.to_string();
            let text = text.strip_suffix(&at).unwrap_or(&text);
            // `missing field `name`` names the reader's own field; everything else may quote the value.
            if text.starts_with("missing field `") && !text.contains('"') && text.len() < 100 {
                return format!("{text}{at}");
            }
            let expected = text
                .rsplit_once(", expected ")
                .map(|(_, expected)| expected)
                .filter(|expected| expected.len() < 200 && !expected.contains('"'));
            match expected {
                Some(expected) => format!("a value of another type or shape{at} (expected {expected})"),
                None => format!("a value this reader does not accept{at}"),
            }
        }
    }
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("reading the trace failed at line {line}: {source}")]
    Io { line: usize, source: std::io::Error },
    #[error(
        "line {line} is not a trace record: {} (expected a JSON object with timestamp, input_length, \
         output_length and hash_ids)",
        json_error_shape(source)
    )]
    Json { line: usize, source: serde_json::Error },
    #[error("line {line}, field `{field}`: {reason}")]
    Invalid { line: usize, field: &'static str, reason: String },
    #[error("line {line} is longer than {MAX_LINE_BYTES} bytes; is this a JSON Lines trace?")]
    LineTooLong { line: usize },
    #[error(
        "line {line} has block_tokens {found} but earlier records have {first}: a trace must use one block \
         size; split it or re-record"
    )]
    MixedBlockSizes { line: usize, first: u32, found: u32 },
    #[error("the trace has no records")]
    Empty,
}

/// Parses one line (1-based `line_no`, for the error) into a validated record.
pub fn parse_line(line: &str, line_no: usize) -> Result<TraceRecord, TraceError> {
    let record: TraceRecord =
        serde_json::from_str(line).map_err(|source| TraceError::Json { line: line_no, source })?;
    record.validate().map_err(|(field, reason)| TraceError::Invalid { line: line_no, field, reason })?;
    Ok(record)
}

/// A whole trace, sorted by arrival (stable, so equal timestamps keep the file's order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub records: Vec<TraceRecord>,
}

impl Trace {
    /// Sorts `records` by timestamp and checks they share one block size.
    pub fn from_records(mut records: Vec<TraceRecord>) -> Result<Self, TraceError> {
        check_block_sizes(&records)?;
        records.sort_by_key(|record| record.timestamp);
        Ok(Trace { records })
    }

    /// Tokens per hash id for every record of this trace.
    pub fn block_tokens(&self) -> u32 {
        self.records.first().map_or(MOONCAKE_BLOCK_TOKENS, TraceRecord::block_tokens)
    }

    /// Time from the first arrival to the last, in milliseconds.
    pub fn duration_ms(&self) -> u64 {
        match (self.records.first(), self.records.last()) {
            (Some(first), Some(last)) => last.timestamp - first.timestamp,
            _ => 0,
        }
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

fn check_block_sizes(records: &[TraceRecord]) -> Result<(), TraceError> {
    let Some(first) = records.first().map(TraceRecord::block_tokens) else { return Ok(()) };
    match records.iter().position(|record| record.block_tokens() != first) {
        Some(index) => {
            Err(TraceError::MixedBlockSizes { line: index + 1, first, found: records[index].block_tokens() })
        }
        None => Ok(()),
    }
}

/// Reads a JSON Lines trace; blank lines are skipped. An empty trace is an error.
pub fn read_trace(mut reader: impl BufRead) -> Result<Trace, TraceError> {
    let mut records = Vec::new();
    let mut buffer = String::new();
    let mut line_no = 0;
    let mut first_block_tokens = None;
    loop {
        buffer.clear();
        line_no += 1;
        // `take` bounds memory even for a file without newlines.
        let read = Read::take(reader.by_ref(), MAX_LINE_BYTES as u64 + 1)
            .read_line(&mut buffer)
            .map_err(|source| TraceError::Io { line: line_no, source })?;
        if read == 0 {
            break;
        }
        if buffer.len() > MAX_LINE_BYTES {
            return Err(TraceError::LineTooLong { line: line_no });
        }
        let line = buffer.trim();
        if line.is_empty() {
            continue;
        }
        let record = parse_line(line, line_no)?;
        let block_tokens = record.block_tokens();
        match first_block_tokens {
            None => first_block_tokens = Some(block_tokens),
            Some(first) if first != block_tokens => {
                return Err(TraceError::MixedBlockSizes { line: line_no, first, found: block_tokens });
            }
            Some(_) => {}
        }
        records.push(record);
    }
    if records.is_empty() {
        return Err(TraceError::Empty);
    }
    Trace::from_records(records)
}

/// Writes one record as one line.
pub fn write_record(writer: &mut impl Write, record: &TraceRecord) -> std::io::Result<()> {
    serde_json::to_writer(&mut *writer, record)?;
    writer.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOONCAKE: &str = r#"{"timestamp": 40, "input_length": 1030, "output_length": 6, "hash_ids": [0, 1, 2]}
{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 7]}

{"timestamp": 40, "input_length": 10, "output_length": 1, "hash_ids": [9], "future_field": true}
"#;

    #[test]
    fn reads_mooncake_lines_sorted_and_stable() {
        let trace = read_trace(MOONCAKE.as_bytes()).unwrap();
        let stamps: Vec<(u64, u32)> = trace.records.iter().map(|r| (r.timestamp, r.input_length)).collect();
        assert_eq!(stamps, vec![(0, 600), (40, 1030), (40, 10)]);
        assert_eq!(trace.block_tokens(), MOONCAKE_BLOCK_TOKENS);
        assert_eq!(trace.duration_ms(), 40);
    }

    #[test]
    fn recorded_fields_round_trip_and_absent_ones_stay_absent() {
        let record = TraceRecord {
            block_tokens: Some(16),
            replica: Some("http://127.0.0.1:8100".into()),
            branch: Some("cache".into()),
            policy_version: Some(3),
            cached_tokens: Some(32),
            ..TraceRecord::mooncake(1_700_000_000_000, 48, 5, vec![u64::MAX, 17, 4])
        };
        let mut out = Vec::new();
        write_record(&mut out, &record).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with('\n') && !text.contains("model") && !text.contains("ttft_ms"));
        assert!(!text.contains("chained"), "a Mooncake-style record stays one: {text}");
        assert_eq!(parse_line(text.trim(), 1).unwrap(), record);
        let recorded = TraceRecord { chained: true, ..record };
        let mut out = Vec::new();
        write_record(&mut out, &recorded).unwrap();
        assert_eq!(parse_line(String::from_utf8(out).unwrap().trim(), 1).unwrap(), recorded);
    }

    #[test]
    fn errors_name_the_line_and_the_field() {
        let missing = read_trace(&b"{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1}\n"[..]);
        let message = missing.unwrap_err().to_string();
        assert!(message.contains("line 1") && message.contains("hash_ids"), "{message}");

        let negative =
            parse_line(r#"{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": []}"#, 7);
        assert!(negative.unwrap_err().to_string().contains("line 7"));

        let too_many = parse_line(
            r#"{"timestamp": 1, "input_length": 16, "output_length": 1, "hash_ids": [1, 2], "block_tokens": 16}"#,
            2,
        );
        let message = too_many.unwrap_err().to_string();
        assert!(message.contains("`hash_ids`") && message.contains("at most 1"), "{message}");

        let zero = parse_line(
            r#"{"timestamp": 1, "input_length": 16, "output_length": 1, "hash_ids": [], "block_tokens": 0}"#,
            3,
        );
        assert!(zero.unwrap_err().to_string().contains("`block_tokens`"));
    }

    #[test]
    fn one_block_size_per_trace() {
        let mixed = "{\"timestamp\": 1, \"input_length\": 16, \"output_length\": 1, \"hash_ids\": [1], \"block_tokens\": 16}\n\
                     {\"timestamp\": 2, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1]}\n";
        match read_trace(mixed.as_bytes()) {
            Err(TraceError::MixedBlockSizes { line: 2, first: 16, found: 512 }) => {}
            other => panic!("expected a block size error on line 2, got {other:?}"),
        }
    }

    #[test]
    fn json_errors_never_repeat_the_values_they_read() {
        let secret = "root:x:0:0:SECRET";
        for line in [
            format!(r#"{{"timestamp": "{secret}", "input_length": 1, "output_length": 1, "hash_ids": []}}"#),
            format!(r#"{{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": ["{secret}"]}}"#),
            format!(r#"["{secret}"]"#),
            format!(r#"{{"timestamp": 1, "model": ["{secret}"]}}"#),
            secret.to_string(),
        ] {
            let error = parse_line(&line, 3).unwrap_err().to_string();
            assert!(!error.contains("SECRET") && !error.contains("root"), "{error}");
            assert!(error.contains("line 3"), "{error}");
        }
        let missing = parse_line(r#"{"timestamp": 1}"#, 1).unwrap_err().to_string();
        assert!(missing.contains("missing field `input_length`"), "{missing}");
        let wrong: serde_json::Error =
            serde_json::from_str::<TraceRecord>(r#"{"timestamp": "x"}"#).unwrap_err();
        assert_eq!(
            json_error_shape(&wrong),
            "a value of another type or shape at line 1 column 17 (expected u64)"
        );
    }

    #[test]
    fn empty_and_oversized_inputs_are_errors_not_panics() {
        assert!(matches!(read_trace(&b"\n\n"[..]), Err(TraceError::Empty)));
        let long = vec![b' '; MAX_LINE_BYTES + 10];
        assert!(matches!(read_trace(&long[..]), Err(TraceError::LineTooLong { line: 1 })));
        assert!(matches!(read_trace(&b"not json\n"[..]), Err(TraceError::Json { line: 1, .. })));
    }
}
