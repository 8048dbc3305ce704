//! OpenAI request parsing and response/chunk building, apart from any I/O.
//!
//! Accepts what real clients send (unknown fields are ignored, as vLLM does) and produces
//! the JSON vLLM's OpenAI server produces, including `usage.prompt_tokens_details.cached_tokens`.

use serde::Deserialize;
use serde_json::{Value, json};

/// Completions default to 16 tokens when `max_tokens` is absent (OpenAI's documented default).
pub const DEFAULT_MAX_TOKENS: usize = 16;
/// Upper bound on generated tokens per request, so one request cannot occupy a replica forever.
pub const MAX_MAX_TOKENS: usize = 4096;

/// Which endpoint a request came through; the response shapes differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
}

/// A request reduced to what the model needs.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    pub api: Api,
    pub model: Option<String>,
    /// The prompt text the model tokenises (chat messages rendered by [`render_chat`]).
    pub prompt: String,
    pub max_tokens: usize,
    pub stream: bool,
    pub include_usage: bool,
}

/// Why a request was refused, worded for the client (OpenAI's `invalid_request_error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidRequest {
    pub message: String,
    pub param: Option<&'static str>,
}

impl InvalidRequest {
    fn new(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self { message: message.into(), param }
    }

    /// The OpenAI error body for this refusal.
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": "invalid_request_error", "param": self.param, "code": null}})
    }
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct CompletionBody {
    model: Option<String>,
    prompt: Value,
    max_tokens: Option<i64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Value,
}

#[derive(Deserialize)]
struct ChatBody {
    model: Option<String>,
    messages: Vec<ChatMessage>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
}

/// Parses a `/v1/completions` or `/v1/chat/completions` body.
pub fn parse(api: Api, body: &[u8]) -> Result<GenerationRequest, InvalidRequest> {
    match api {
        Api::Completions => {
            let body: CompletionBody = serde_json::from_slice(body).map_err(|e| {
                InvalidRequest::new(format!("request body is not a valid completions request: {e}"), None)
            })?;
            let prompt = match body.prompt {
                Value::String(s) => s,
                Value::Array(items) if items.iter().all(Value::is_string) => {
                    items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("")
                }
                _ => {
                    return Err(InvalidRequest::new(
                        "`prompt` must be a string or an array of strings (token-id prompts are not emulated)",
                        Some("prompt"),
                    ));
                }
            };
            Ok(GenerationRequest {
                api,
                model: body.model,
                prompt,
                max_tokens: max_tokens(body.max_tokens)?,
                stream: body.stream,
                include_usage: body.stream_options.is_some_and(|o| o.include_usage),
            })
        }
        Api::Chat => {
            let body: ChatBody = serde_json::from_slice(body).map_err(|e| {
                InvalidRequest::new(format!("request body is not a valid chat request: {e}"), None)
            })?;
            if body.messages.is_empty() {
                return Err(InvalidRequest::new("`messages` must not be empty", Some("messages")));
            }
            Ok(GenerationRequest {
                api,
                model: body.model,
                prompt: render_chat(&body.messages)?,
                max_tokens: max_tokens(body.max_completion_tokens.or(body.max_tokens))?,
                stream: body.stream,
                include_usage: body.stream_options.is_some_and(|o| o.include_usage),
            })
        }
    }
}

fn max_tokens(requested: Option<i64>) -> Result<usize, InvalidRequest> {
    match requested {
        None => Ok(DEFAULT_MAX_TOKENS),
        Some(n) if (1..=MAX_MAX_TOKENS as i64).contains(&n) => Ok(n as usize),
        Some(n) => Err(InvalidRequest::new(
            format!("`max_tokens` is {n}; it must be between 1 and {MAX_MAX_TOKENS}"),
            Some("max_tokens"),
        )),
    }
}

/// Renders chat messages into one prompt, the same way every time, so that conversations
/// sharing leading messages share a prompt prefix (and therefore cached blocks).
fn render_chat(messages: &[ChatMessage]) -> Result<String, InvalidRequest> {
    let mut prompt = String::new();
    for message in messages {
        prompt.push_str("<|");
        prompt.push_str(&message.role);
        prompt.push_str("|>\n");
        match &message.content {
            Value::String(s) => prompt.push_str(s),
            Value::Null => {}
            Value::Array(parts) => {
                for part in parts {
                    if let Some(text) = part.get("text").and_then(Value::as_str) {
                        prompt.push_str(text);
                    }
                }
            }
            _ => {
                return Err(InvalidRequest::new(
                    "message `content` must be a string or an array of content parts",
                    Some("messages"),
                ));
            }
        }
        prompt.push('\n');
    }
    prompt.push_str("<|assistant|>\n");
    Ok(prompt)
}

/// Token accounting reported in `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

impl Usage {
    fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// Identity fields every response and chunk of one request shares.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub api: Api,
}

impl ResponseMeta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Completions, _) => "text_completion",
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value, usage: Option<Usage>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage.map(Usage::to_json),
        })
    }

    /// The complete non-streaming response.
    pub fn full_response(&self, text: &str, finish_reason: &str, usage: Usage) -> Value {
        let choice = match self.api {
            Api::Completions => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason})
            }
            Api::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish_reason,
            }),
        };
        self.envelope(false, json!([choice]), Some(usage))
    }

    /// A streamed chunk carrying one token (chat's first chunk also carries the role).
    pub fn token_chunk(&self, token: &str, first: bool) -> Value {
        let choice = match self.api {
            Api::Completions => json!({"index": 0, "text": token, "logprobs": null, "finish_reason": null}),
            Api::Chat if first => {
                json!({"index": 0, "delta": {"role": "assistant", "content": token}, "logprobs": null, "finish_reason": null})
            }
            Api::Chat => {
                json!({"index": 0, "delta": {"content": token}, "logprobs": null, "finish_reason": null})
            }
        };
        self.envelope(true, json!([choice]), None)
    }

    /// The chunk that closes the choice with its finish reason.
    pub fn finish_chunk(&self, finish_reason: &str) -> Value {
        let choice = match self.api {
            Api::Completions => {
                json!({"index": 0, "text": "", "logprobs": null, "finish_reason": finish_reason})
            }
            Api::Chat => json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_reason}),
        };
        self.envelope(true, json!([choice]), None)
    }

    /// The usage-only chunk sent when `stream_options.include_usage` is set.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        self.envelope(true, json!([]), Some(usage))
    }
}

/// The emulated output text: deterministic words seeded by the prompt, so the same request always
/// produces the same completion (streamed or not) and tests can compare them. Token `i` is word `i`
/// (with a leading space after the first).
#[derive(Debug, Clone)]
pub struct OutputWords {
    state: u64,
    first: bool,
}

impl OutputWords {
    const WORDS: [&'static str; 16] = [
        "the", "cache", "routes", "tokens", "fleet", "prefix", "replica", "warm", "queue", "batch", "block",
        "latency", "decode", "prefill", "load", "hit",
    ];

    pub fn new(prompt: &str) -> Self {
        // FNV-1a of the prompt; never zero, which xorshift needs.
        let mut state = 0xcbf2_9ce4_8422_2325_u64;
        for &b in prompt.as_bytes() {
            state ^= u64::from(b);
            state = state.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Self { state: state | 1, first: true }
    }
}

impl Iterator for OutputWords {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let word = Self::WORDS[(self.state % Self::WORDS.len() as u64) as usize];
        let first = std::mem::replace(&mut self.first, false);
        Some(if first { word.to_string() } else { format!(" {word}") })
    }
}

/// One server-sent event carrying `payload`.
pub fn sse_event(payload: &Value) -> String {
    format!("data: {payload}\n\n")
}

/// The terminal event of every OpenAI stream.
pub const SSE_DONE: &str = "data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_completion_with_defaults() {
        let req = parse(Api::Completions, br#"{"model":"m","prompt":"hi","extra":1}"#).unwrap();
        assert_eq!(req.prompt, "hi");
        assert_eq!(req.max_tokens, DEFAULT_MAX_TOKENS);
        assert!(!req.stream);
    }

    #[test]
    fn chat_rendering_is_prefix_stable() {
        let one = parse(Api::Chat, br#"{"messages":[{"role":"system","content":"S"}]}"#).unwrap();
        let two = parse(
            Api::Chat,
            br#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":[{"type":"text","text":"U"}]}],"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        let shared = "<|system|>\nS\n";
        assert!(one.prompt.starts_with(shared) && two.prompt.starts_with(shared));
        assert!(two.prompt.contains("<|user|>\nU\n"));
        assert!(two.stream && two.include_usage);
    }

    #[test]
    fn bad_requests_name_the_parameter() {
        let err = parse(Api::Completions, br#"{"prompt":"x","max_tokens":0}"#).unwrap_err();
        assert_eq!(err.param, Some("max_tokens"));
        assert!(err.message.contains("between 1 and"));
        let err = parse(Api::Chat, br#"{"messages":[]}"#).unwrap_err();
        assert_eq!(err.param, Some("messages"));
        assert!(parse(Api::Chat, b"not json").is_err());
        assert_eq!(parse(Api::Completions, br#"{"prompt":[1,2]}"#).unwrap_err().param, Some("prompt"));
    }

    #[test]
    fn output_is_deterministic_per_prompt() {
        let a: Vec<String> = OutputWords::new("hello").take(5).collect();
        assert_eq!(a, OutputWords::new("hello").take(5).collect::<Vec<_>>());
        assert_ne!(a, OutputWords::new("world").take(5).collect::<Vec<_>>());
        assert!(!a[0].starts_with(' ') && a[1].starts_with(' '));
    }

    #[test]
    fn chunks_have_openai_shapes() {
        let meta = ResponseMeta { id: "x".into(), created: 1, model: "m".into(), api: Api::Chat };
        let first = meta.token_chunk("a", true);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        let usage = meta.usage_chunk(Usage { prompt_tokens: 3, completion_tokens: 2, cached_tokens: 0 });
        assert_eq!(usage["usage"]["total_tokens"], 5);
        assert_eq!(sse_event(&json!({"a":1})), "data: {\"a\":1}\n\n");
    }
}
