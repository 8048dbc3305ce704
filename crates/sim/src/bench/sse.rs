//! Reading an OpenAI streaming answer (server-sent events) as it arrives (pure).
//!
//! [`SseReader`] takes the body's bytes in whatever pieces the network delivers and yields each event's
//! data; [`classify`] says what an event means for the benchmark: generated text (a token arrived), the
//! final usage, an error event, or the end (`[DONE]`).

use serde_json::Value;

/// Splits a byte stream into SSE events and returns their `data:` payloads (multi-line data joined by
/// `\n`, as the SSE specification says). Lines may end in `\n` or `\r\n`.
#[derive(Debug, Default)]
pub struct SseReader {
    pending: Vec<u8>,
    data: Option<String>,
}

impl SseReader {
    /// Feeds `bytes` and returns the payloads of the events they completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(offset) = self.pending[start..].iter().position(|b| *b == b'\n') {
            let end = start + offset;
            let line = &self.pending[start..end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    events.push(data);
                }
            } else if let Some(value) = line.strip_prefix(b"data:") {
                let value = String::from_utf8_lossy(value.strip_prefix(b" ").unwrap_or(value));
                match &mut self.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(&value);
                    }
                    None => self.data = Some(value.into_owned()),
                }
            }
            // Comments (":"), `event:`, `id:` and `retry:` lines carry nothing the benchmark needs.
            start = end + 1;
        }
        self.pending.drain(..start);
        events
    }

    /// Bytes of an unfinished line held back (a bound on it keeps a never-ending line from growing memory).
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

/// Token accounting from a stream's final usage chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `prompt_tokens_details.cached_tokens`, when the server reports it.
    pub cached_tokens: Option<u64>,
}

/// What one event means.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StreamEvent {
    /// Bytes of generated text it carries (0 for role-only, finish or usage chunks).
    pub text_bytes: usize,
    pub usage: Option<StreamUsage>,
    /// An error event's message (servers send `{"error": {...}}` mid-stream when they fail).
    pub error: Option<String>,
    /// `[DONE]`: the answer ended as it should.
    pub done: bool,
}

/// Reads one event's data: chat (`choices[].delta.content`) and completions (`choices[].text`) alike.
pub fn classify(data: &str) -> StreamEvent {
    let data = data.trim();
    if data == "[DONE]" {
        return StreamEvent { done: true, ..StreamEvent::default() };
    }
    let Ok(value) = serde_json::from_str::<Value>(data) else {
        return StreamEvent {
            error: Some(format!("an event is not JSON: {:.80}", data)),
            ..Default::default()
        };
    };
    let mut event = StreamEvent::default();
    if let Some(error) = value.get("error") {
        let message =
            error.get("message").and_then(Value::as_str).map_or_else(|| error.to_string(), str::to_owned);
        event.error = Some(message);
        return event;
    }
    if let Some(choices) = value.get("choices").and_then(Value::as_array) {
        for choice in choices {
            let text = choice
                .get("delta")
                .and_then(|d| d.get("content").or_else(|| d.get("reasoning_content")))
                .or_else(|| choice.get("text"))
                .and_then(Value::as_str);
            event.text_bytes += text.map_or(0, str::len);
        }
    }
    if let Some(usage) = value.get("usage").filter(|u| !u.is_null()) {
        let number = |v: Option<&Value>| v.and_then(Value::as_u64);
        event.usage = Some(StreamUsage {
            prompt_tokens: number(usage.get("prompt_tokens")).unwrap_or(0),
            completion_tokens: number(usage.get("completion_tokens")).unwrap_or(0),
            cached_tokens: number(usage.get("prompt_tokens_details").and_then(|d| d.get("cached_tokens"))),
        });
    }
    event
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_reads_are_reassembled() {
        let mut reader = SseReader::default();
        assert!(reader.push(b"data: {\"a\"").is_empty());
        assert_eq!(reader.push(b":1}\n\ndata: [DO"), vec!["{\"a\":1}".to_owned()]);
        assert_eq!(reader.push(b"NE]\r\n\r\n"), vec!["[DONE]".to_owned()]);
        assert_eq!(reader.pending_len(), 0);
    }

    #[test]
    fn comments_and_other_fields_are_skipped_and_multiline_data_joined() {
        let mut reader = SseReader::default();
        let events = reader.push(b": keep-alive\n\nevent: message\nid: 3\ndata: x\ndata: y\n\n");
        assert_eq!(events, vec!["x\ny".to_owned()]);
    }

    #[test]
    fn chat_and_completion_chunks_carry_text() {
        let chat = classify(r#"{"choices":[{"index":0,"delta":{"content":" the"}}]}"#);
        assert_eq!(chat.text_bytes, 4);
        let role = classify(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#);
        assert_eq!(role.text_bytes, 0);
        let completion = classify(r#"{"choices":[{"index":0,"text":"ab"}]}"#);
        assert_eq!(completion.text_bytes, 2);
        assert!(classify("[DONE]").done);
    }

    #[test]
    fn usage_and_errors_are_read() {
        let usage = classify(
            r#"{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":64}}}"#,
        );
        assert_eq!(
            usage.usage,
            Some(StreamUsage { prompt_tokens: 100, completion_tokens: 5, cached_tokens: Some(64) })
        );
        let error = classify(r#"{"error":{"message":"replica stalled","type":"upstream_error"}}"#);
        assert_eq!(error.error.as_deref(), Some("replica stalled"));
        assert!(classify("not json").error.is_some());
    }
}
