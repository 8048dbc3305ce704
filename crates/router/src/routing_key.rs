//! Routing keys: what of an OpenAI request the policy sees (model, prompt blocks, session), computed without I/O.
//!
//! Chat messages are rendered canonically, the same bytes for the same messages every time:
//! for each message `"<|" role "|>\n" content "\n"`, where a content given as parts contributes its text
//! parts in order (other parts contribute `"<|" type "|>"`), so a shared system prompt always gives the same
//! leading bytes. `/v1/completions` prompts are used as given (a list of prompts is joined with `\n`; token
//! prompts are used as tokens). Without a tokenizer the bytes are cut into fleet-policy's byte chunks
//! (`block_hashes_from_text`, `chunk_bytes` per block); with one, the rendered text is tokenized and cut into
//! token-exact blocks (`block_hashes_from_tokens`). Token-exact blocks match an engine's own blocks for
//! completion prompts; for chat they match only when the engine's chat template renders like ours.

use fleet_policy::{HashingParams, RequestView, block_hashes_from_text, block_hashes_from_tokens};
use serde::Deserialize;
use serde_json::Value;

/// Turns text into token ids (a Hugging Face tokenizer, or anything else that tokenizes).
pub trait Tokenize: Send + Sync + std::fmt::Debug {
    /// Token ids of `text` (no special tokens added).
    fn tokenize(&self, text: &str) -> Result<Vec<u32>, String>;
}

/// A Hugging Face `tokenizer.json` (build feature `tokenizer`).
#[cfg(feature = "tokenizer")]
#[derive(Debug)]
pub struct HfTokenizer(tokenizers::Tokenizer);

#[cfg(feature = "tokenizer")]
impl HfTokenizer {
    /// Loads `tokenizer.json`.
    pub fn from_file(path: &std::path::Path) -> anyhow::Result<Self> {
        let tokenizer = tokenizers::Tokenizer::from_file(path)
            .map_err(|error| anyhow::anyhow!("cannot load --tokenizer {}: {error}", path.display()))?;
        Ok(Self(tokenizer))
    }
}

#[cfg(feature = "tokenizer")]
impl Tokenize for HfTokenizer {
    fn tokenize(&self, text: &str) -> Result<Vec<u32>, String> {
        self.0
            .encode(text, false)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|error| error.to_string())
    }
}

/// Why a request body cannot be routed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The body is not a JSON object.
    #[error(
        "the request body is not a JSON object: {0}; send Content-Type: application/json with an OpenAI request"
    )]
    NotJson(String),
    /// A field has the wrong shape.
    #[error("`{field}` {problem}")]
    BadField {
        /// The field.
        field: &'static str,
        /// What is wrong and the fix.
        problem: String,
    },
    /// The tokenizer failed.
    #[error("the tokenizer could not tokenize the prompt: {0}")]
    Tokenizer(String),
}

/// The parts of a request the router routes and records by.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingInput {
    /// The requested model, if any.
    pub model: Option<String>,
    /// What the policy sees.
    pub view: RequestView,
    /// Whether the client asked for an SSE stream.
    pub stream: bool,
    /// Tokens per block of `view.block_hashes`, as recorded in traces (bytes/4 for byte chunks).
    pub block_tokens: u32,
}

#[derive(Deserialize)]
struct RequestFields {
    #[serde(default)]
    model: Option<Value>,
    #[serde(default)]
    messages: Option<Value>,
    #[serde(default)]
    prompt: Option<Value>,
    #[serde(default)]
    stream: Option<Value>,
    #[serde(default)]
    user: Option<Value>,
}

/// Which OpenAI route the body came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// The prompt as the router keys it.
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// Reads the routing key of a request body. `session_header` (e.g. `x-session-id`) wins over the body's `user`.
pub fn routing_input(
    route: Route,
    body: &[u8],
    session_header: Option<&str>,
    hashing: HashingParams,
    tokenizer: Option<&dyn Tokenize>,
) -> Result<RoutingInput, KeyError> {
    let fields: RequestFields =
        serde_json::from_slice(body).map_err(|error| KeyError::NotJson(error.to_string()))?;
    let model = match fields.model {
        None | Some(Value::Null) => None,
        Some(Value::String(model)) => Some(model),
        Some(other) => {
            return Err(KeyError::BadField {
                field: "model",
                problem: format!("must be a string, got {other}"),
            });
        }
    };
    let stream = matches!(fields.stream, Some(Value::Bool(true)));
    let prompt = match route {
        Route::Chat => Prompt::Text(render_messages(fields.messages.as_ref())?),
        Route::Completions => completion_prompt(fields.prompt.as_ref())?,
    };
    let session = session_header.map(str::to_owned).or(match fields.user {
        Some(Value::String(user)) if !user.is_empty() => Some(user),
        _ => None,
    });
    let (view, block_tokens) = match (prompt, tokenizer) {
        (Prompt::Tokens(tokens), _) => {
            (RequestView::from_tokens(&tokens, hashing), hashing.block_tokens as u32)
        }
        (Prompt::Text(text), Some(tokenizer)) => {
            let tokens = tokenizer.tokenize(&text).map_err(KeyError::Tokenizer)?;
            (RequestView::from_tokens(&tokens, hashing), hashing.block_tokens as u32)
        }
        (Prompt::Text(text), None) => {
            (RequestView::from_text(text.as_bytes(), hashing), hashing.chunk_bytes.div_ceil(4).max(1) as u32)
        }
    };
    let view = match session {
        Some(key) => view.with_session(key),
        None => view,
    };
    Ok(RoutingInput { model, view, stream, block_tokens })
}

/// The canonical rendering of chat messages (see the module docs).
pub fn render_messages(messages: Option<&Value>) -> Result<String, KeyError> {
    let Some(Value::Array(messages)) = messages else {
        return Err(KeyError::BadField {
            field: "messages",
            problem: "must be a list of {\"role\", \"content\"} objects".to_owned(),
        });
    };
    let mut out = String::new();
    for message in messages {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("user");
        out.push_str("<|");
        out.push_str(role);
        out.push_str("|>\n");
        match message.get("content") {
            Some(Value::String(text)) => out.push_str(text),
            Some(Value::Array(parts)) => {
                for part in parts {
                    match part.get("text").and_then(Value::as_str) {
                        Some(text) => out.push_str(text),
                        None => {
                            let kind = part.get("type").and_then(Value::as_str).unwrap_or("part");
                            out.push_str("<|");
                            out.push_str(kind);
                            out.push_str("|>");
                        }
                    }
                }
            }
            _ => {}
        }
        out.push('\n');
    }
    Ok(out)
}

fn completion_prompt(prompt: Option<&Value>) -> Result<Prompt, KeyError> {
    let bad = |problem: &str| KeyError::BadField { field: "prompt", problem: problem.to_owned() };
    match prompt {
        None | Some(Value::Null) => Ok(Prompt::Text(String::new())),
        Some(Value::String(text)) => Ok(Prompt::Text(text.clone())),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
            Ok(Prompt::Text(items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n")))
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => Ok(Prompt::Tokens(
            items
                .iter()
                .filter_map(Value::as_u64)
                .map(|token| u32::try_from(token).unwrap_or(u32::MAX))
                .collect(),
        )),
        Some(Value::Array(items)) => match items.first() {
            // A batch of token prompts: the first one keys the request.
            Some(Value::Array(first)) if first.iter().all(Value::is_u64) => Ok(Prompt::Tokens(
                first
                    .iter()
                    .filter_map(Value::as_u64)
                    .map(|token| u32::try_from(token).unwrap_or(u32::MAX))
                    .collect(),
            )),
            _ => Err(bad("must be a string, a list of strings, or token ids")),
        },
        Some(_) => Err(bad("must be a string, a list of strings, or token ids")),
    }
}

/// Chained hashes of `tokens` in `block_tokens` blocks (re-exported for callers that tokenize themselves).
pub fn token_blocks(tokens: &[u32], block_tokens: usize) -> Vec<u64> {
    block_hashes_from_tokens(tokens, block_tokens)
}

/// A stable 64-bit hash of a session key, the only form in which sessions are recorded.
pub fn session_hash(key: &str) -> u64 {
    block_hashes_from_text(key.as_bytes(), usize::MAX).first().copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn hashing() -> HashingParams {
        HashingParams { block_tokens: 16, chunk_bytes: 64 }
    }

    #[test]
    fn chat_rendering_is_canonical_and_shares_prefixes() {
        let system = "You are a helpful assistant. ".repeat(10);
        let a = json!({"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": "one"}]});
        let b = json!({"messages": [{"role": "system", "content": [{"type": "text", "text": system}]}, {"role": "user", "content": "two"}], "stream": true});
        let ka = routing_input(Route::Chat, a.to_string().as_bytes(), None, hashing(), None).unwrap();
        let kb = routing_input(Route::Chat, b.to_string().as_bytes(), None, hashing(), None).unwrap();
        assert_eq!(ka.model.as_deref(), Some("m"));
        assert!(!ka.stream && kb.stream);
        let shared = (system.len() + "<|system|>\n".len()) / 64;
        assert!(shared >= 4);
        assert_eq!(ka.view.block_hashes[..shared], kb.view.block_hashes[..shared]);
        assert_ne!(ka.view.block_hashes.last(), kb.view.block_hashes.last());
        // Same request, same key, every time.
        let again = routing_input(Route::Chat, a.to_string().as_bytes(), None, hashing(), None).unwrap();
        assert_eq!(again, ka);
    }

    #[test]
    fn completion_prompts_as_text_or_tokens_and_sessions() {
        let tokens: Vec<u32> = (0..40).collect();
        let body = json!({"prompt": tokens, "user": "alice"});
        let key =
            routing_input(Route::Completions, body.to_string().as_bytes(), None, hashing(), None).unwrap();
        assert_eq!(key.view.block_hashes, block_hashes_from_tokens(&tokens, 16));
        assert_eq!(key.view.session_key.as_deref(), Some("alice"));
        let key = routing_input(Route::Completions, body.to_string().as_bytes(), Some("s1"), hashing(), None)
            .unwrap();
        assert_eq!(key.view.session_key.as_deref(), Some("s1"));
        assert_ne!(session_hash("s1"), session_hash("s2"));
        assert_eq!(session_hash("s1"), session_hash("s1"));
    }

    #[test]
    fn bad_bodies_are_explained() {
        let error = routing_input(Route::Chat, b"not json", None, hashing(), None).unwrap_err();
        assert!(matches!(error, KeyError::NotJson(_)));
        let error = routing_input(Route::Chat, br#"{"messages": "hi"}"#, None, hashing(), None).unwrap_err();
        assert!(error.to_string().contains("messages"), "{error}");
        let error =
            routing_input(Route::Completions, br#"{"prompt": 5}"#, None, hashing(), None).unwrap_err();
        assert!(error.to_string().contains("prompt"), "{error}");
        let error = routing_input(Route::Completions, br#"{"model": 5}"#, None, hashing(), None).unwrap_err();
        assert!(error.to_string().contains("model"), "{error}");
    }

    #[derive(Debug)]
    struct WordTokenizer;
    impl Tokenize for WordTokenizer {
        fn tokenize(&self, text: &str) -> Result<Vec<u32>, String> {
            Ok(text.split_whitespace().map(|word| word.len() as u32).collect())
        }
    }

    #[test]
    fn a_tokenizer_gives_token_exact_blocks() {
        let body = json!({"prompt": "a bb ccc ".repeat(20)});
        let key = routing_input(
            Route::Completions,
            body.to_string().as_bytes(),
            None,
            hashing(),
            Some(&WordTokenizer),
        )
        .unwrap();
        let tokens = WordTokenizer.tokenize(&"a bb ccc ".repeat(20)).unwrap();
        assert_eq!(key.view.block_hashes, token_blocks(&tokens, 16));
        assert_eq!(key.view.prompt_tokens, 60);
    }
}
