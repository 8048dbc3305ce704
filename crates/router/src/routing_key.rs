//! Routing keys: what of an OpenAI request the policy sees (model, prompt blocks, session), computed without I/O.
//!
//! Chat messages are rendered canonically, the same bytes for the same messages every time:
//! for each message `"<|" role "|>\n" content "\n"`, where a content given as parts contributes its text
//! parts in order (other parts contribute `"<|" type "|>"`), so a shared system prompt always gives the same
//! leading bytes. `/v1/completions` prompts are used as given (a list of prompts is joined with `\n`; token
//! prompts are used as tokens). Without a tokenizer the bytes are cut into fleet-policy's byte chunks
//! (`block_hashes_from_text`, `chunk_bytes` per block); with one, the rendered text is tokenized and cut into
//! token-exact blocks (`block_hashes_from_tokens`). A tokenizer that comes with the model's chat template
//! (`chat_template.rs`) renders chats with it instead of canonically, and tokenizes the result without adding
//! special tokens (the template writes them); completion prompts are tokenized with them (a BOS), as vLLM
//! does by default (a request's `add_special_tokens` overrides both). Then the blocks are the engine's
//! blocks for chats as well as completions.
//!
//! Two readers of the body: a fast one that borrows the body's strings (serde structs over `Cow<str>`)
//! and takes the shapes nearly every request has, and a thorough one over `serde_json::Value`s that
//! takes every shape the API allows and names what is wrong. The thorough one runs only when the
//! fast one declines, and a property test holds them to the same key. On a chat with a 4 KB system
//! prompt the fast reader cut `routing_input` from 4.2 to 2.8 us (`cargo bench -p fleet-router
//! --bench routing_key`), as it copies each string once (into the rendering) instead of twice.

use fleet_policy::{HashingParams, RequestView, block_hashes_from_text, block_hashes_from_tokens};
use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

/// Turns text into token ids (a Hugging Face tokenizer, or anything else that tokenizes), and chats into
/// text when it knows the model's chat template.
pub trait Tokenize: Send + Sync + std::fmt::Debug {
    /// Token ids of `text`; `add_special_tokens` adds what the tokenizer adds around a prompt (a BOS).
    fn tokenize(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String>;

    /// Whether [`Tokenize::render_chat`] renders with the model's template.
    fn has_chat_template(&self) -> bool {
        false
    }

    /// The chat of a `/v1/chat/completions` body rendered with the model's chat template.
    fn render_chat(&self, _request: &Value) -> Result<String, String> {
        Err("no chat template".to_owned())
    }

    /// Appends the tokenizer's own figures to the router's `/metrics` text (none by default).
    fn render_metrics(&self, _out: &mut String) {}
}

/// A Hugging Face `tokenizer.json` (build feature `tokenizer`), with the model's chat template when it has one.
#[cfg(feature = "tokenizer")]
#[derive(Debug)]
pub struct HfTokenizer {
    tokenizer: tokenizers::Tokenizer,
    template: Option<crate::chat_template::ChatTemplate>,
    /// Token ids of prompt chunks seen before, when they are provably the whole prompt's (`token_memo.rs`).
    memo: Option<crate::token_memo::ChunkMemo>,
}

#[cfg(feature = "tokenizer")]
impl HfTokenizer {
    /// Loads `tokenizer.json`, and the chat template: `chat_template` when given, else the one beside it
    /// (`tokenizer_config.json`, `chat_template.jinja`), else none (chats are then rendered canonically);
    /// with a memo of prompt chunks of up to `memo_bytes` when that is exact for this tokenizer (none at 0).
    pub fn from_file(
        path: &std::path::Path,
        chat_template: Option<&std::path::Path>,
        memo_bytes: u64,
    ) -> anyhow::Result<Self> {
        let tokenizer = tokenizers::Tokenizer::from_file(path)
            .map_err(|error| anyhow::anyhow!("cannot load --tokenizer {}: {error}", path.display()))?;
        let template = crate::chat_template::ChatTemplate::for_tokenizer(path, chat_template)?;
        match &template {
            Some(template) => {
                tracing::info!(source = %template.source_name, "chats rendered with the model's chat template")
            }
            None => tracing::warn!(
                tokenizer = %path.display(),
                "no chat template beside the tokenizer and no --chat-template: chats are rendered canonically, so their blocks will not match the engine's"
            ),
        }
        let memo = match memo_bytes {
            0 => None,
            bytes => match crate::token_memo::ChunkMemo::new(&tokenizer, bytes) {
                Ok(memo) => {
                    tracing::info!(
                        mib = bytes >> 20,
                        "prompt chunks a prefix shares are tokenized once (memo)"
                    );
                    Some(memo)
                }
                Err(why) => {
                    tracing::warn!(tokenizer = %path.display(), "every prompt is tokenized whole: {why}");
                    None
                }
            },
        };
        Ok(Self { tokenizer, template, memo })
    }
}

#[cfg(feature = "tokenizer")]
impl Tokenize for HfTokenizer {
    fn tokenize(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        match &self.memo {
            Some(memo) => memo.tokenize(&self.tokenizer, text, add_special_tokens),
            None => crate::token_memo::encode(&self.tokenizer, text, add_special_tokens),
        }
    }

    fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    fn render_chat(&self, request: &Value) -> Result<String, String> {
        match &self.template {
            Some(template) => template.render(request),
            None => Err("no chat template".to_owned()),
        }
    }

    fn render_metrics(&self, out: &mut String) {
        if let Some(memo) = &self.memo {
            memo.render_metrics(out);
        }
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
    /// The model's chat template refused the chat (its own `raise_exception`, or a shape it cannot render).
    #[error("the model's chat template cannot render these messages: {0}")]
    ChatTemplate(String),
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
    /// Whether the blocks are token blocks (a tokenizer, or a token prompt), not byte chunks: only then
    /// can the index's matched blocks predict an engine's cached tokens.
    pub token_exact: bool,
}

/// Which OpenAI route the body came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// What the router keys a request by, read from its body by either reader below.
struct KeyFields<'a> {
    model: Option<Cow<'a, str>>,
    stream: bool,
    prompt: Prompt<'a>,
    user: Option<Cow<'a, str>>,
    /// Whether to tokenize the prompt with the tokenizer's special tokens (a BOS).
    add_special_tokens: bool,
}

/// The prompt as the router keys it.
enum Prompt<'a> {
    Text(Cow<'a, str>),
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
    // A chat for a model whose template the router has is read as JSON values and rendered with it.
    // Otherwise the borrowing reader takes the common shapes; anything else (or anything wrong) is read again
    // as JSON values, which take every shape the API allows and name what is wrong.
    let fields = match tokenizer {
        Some(tokenizer) if route == Route::Chat && tokenizer.has_chat_template() => {
            read_templated_chat(body, tokenizer)?
        }
        _ => match read_borrowed(route, body) {
            Some(fields) => fields,
            None => read_values(route, body)?,
        },
    };
    let session = session_header.map(str::to_owned).or(match fields.user {
        Some(user) if !user.is_empty() => Some(user.into_owned()),
        _ => None,
    });
    let token_exact = tokenizer.is_some() || matches!(fields.prompt, Prompt::Tokens(_));
    let (view, block_tokens) = match (fields.prompt, tokenizer) {
        (Prompt::Tokens(tokens), _) => {
            (RequestView::from_tokens(&tokens, hashing), hashing.block_tokens as u32)
        }
        (Prompt::Text(text), Some(tokenizer)) => {
            let tokens = tokenizer.tokenize(&text, fields.add_special_tokens).map_err(KeyError::Tokenizer)?;
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
    Ok(RoutingInput {
        model: fields.model.map(Cow::into_owned),
        view,
        stream: fields.stream,
        block_tokens,
        token_exact,
    })
}

/// The fast reader: the body's strings are borrowed where they hold no escapes, and only the fields
/// the key needs are kept, in the shapes nearly every request has (string model, `messages` of
/// string or part-list contents, a string prompt, boolean stream, string user). `None` for anything
/// else, including invalid JSON, token prompts and duplicate fields: [`read_values`] then decides.
/// The module's tests check both readers key the same bodies the same.
fn read_borrowed(route: Route, body: &[u8]) -> Option<KeyFields<'_>> {
    let fields: borrowed::Fields<'_> = serde_json::from_slice(body).ok()?;
    if fields.add_special_tokens.is_some() {
        return None;
    }
    let prompt = match route {
        Route::Chat => Prompt::Text(Cow::Owned(borrowed::render(&fields.messages?, body.len()))),
        Route::Completions => Prompt::Text(fields.prompt.map_or(Cow::Borrowed(""), |text| text.0)),
    };
    Some(KeyFields {
        model: fields.model.map(|model| model.0),
        stream: fields.stream == Some(true),
        prompt,
        user: fields.user.map(|user| user.0),
        add_special_tokens: route == Route::Completions,
    })
}

/// A chat rendered with the model's template (the request as JSON values, as the template takes them).
fn read_templated_chat(body: &[u8], tokenizer: &dyn Tokenize) -> Result<KeyFields<'static>, KeyError> {
    let request: Value =
        serde_json::from_slice(body).map_err(|error| KeyError::NotJson(error.to_string()))?;
    if !matches!(request.get("messages"), Some(Value::Array(_))) {
        return Err(KeyError::BadField {
            field: "messages",
            problem: "must be a list of {\"role\", \"content\"} objects".to_owned(),
        });
    }
    let text = tokenizer.render_chat(&request).map_err(KeyError::ChatTemplate)?;
    let model = match request.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(model)) => Some(Cow::Owned(model.clone())),
        Some(other) => {
            return Err(KeyError::BadField {
                field: "model",
                problem: format!("must be a string, got {other}"),
            });
        }
    };
    Ok(KeyFields {
        model,
        stream: request.get("stream") == Some(&Value::Bool(true)),
        prompt: Prompt::Text(Cow::Owned(text)),
        user: match request.get("user") {
            Some(Value::String(user)) => Some(Cow::Owned(user.clone())),
            _ => None,
        },
        add_special_tokens: request.get("add_special_tokens").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// The thorough reader: the fields as JSON values, every shape the API allows, and errors that name
/// the field and what is wrong with it.
fn read_values(route: Route, body: &[u8]) -> Result<KeyFields<'static>, KeyError> {
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
        #[serde(default)]
        add_special_tokens: Option<Value>,
    }
    let fields: RequestFields =
        serde_json::from_slice(body).map_err(|error| KeyError::NotJson(error.to_string()))?;
    let model = match fields.model {
        None | Some(Value::Null) => None,
        Some(Value::String(model)) => Some(Cow::Owned(model)),
        Some(other) => {
            return Err(KeyError::BadField {
                field: "model",
                problem: format!("must be a string, got {other}"),
            });
        }
    };
    let prompt = match route {
        Route::Chat => Prompt::Text(Cow::Owned(render_messages(fields.messages.as_ref())?)),
        Route::Completions => completion_prompt(fields.prompt)?,
    };
    let user = match fields.user {
        Some(Value::String(user)) => Some(Cow::Owned(user)),
        _ => None,
    };
    let add_special_tokens = match fields.add_special_tokens {
        Some(Value::Bool(add)) => add,
        _ => route == Route::Completions,
    };
    Ok(KeyFields {
        model,
        stream: matches!(fields.stream, Some(Value::Bool(true))),
        prompt,
        user,
        add_special_tokens,
    })
}

/// The canonical rendering of chat messages (see the module docs).
pub fn render_messages(messages: Option<&Value>) -> Result<String, KeyError> {
    let Some(Value::Array(messages)) = messages else {
        return Err(KeyError::BadField {
            field: "messages",
            problem: "must be a list of {\"role\", \"content\"} objects".to_owned(),
        });
    };
    let mut out = Rendering::with_capacity(0);
    for message in messages {
        out.message(message.get("role").and_then(Value::as_str), |out| match message.get("content") {
            Some(Value::String(text)) => out.text(text),
            Some(Value::Array(parts)) => {
                for part in parts {
                    out.part(
                        part.get("text").and_then(Value::as_str),
                        part.get("type").and_then(Value::as_str),
                    );
                }
            }
            _ => {}
        });
    }
    Ok(out.0)
}

/// The canonical rendering of chat messages (see the module docs), written piece by piece by either
/// reader, so the markers and the defaults for a missing role or part text are spelled once.
struct Rendering(String);

impl Rendering {
    fn with_capacity(capacity: usize) -> Self {
        Self(String::with_capacity(capacity))
    }

    /// One message: its role (`user` when it names none), then whatever `content` writes.
    fn message(&mut self, role: Option<&str>, content: impl FnOnce(&mut Self)) {
        self.0.push_str("<|");
        self.0.push_str(role.unwrap_or("user"));
        self.0.push_str("|>\n");
        content(self);
        self.0.push('\n');
    }

    fn text(&mut self, text: &str) {
        self.0.push_str(text);
    }

    /// One content part: its text, or else a marker naming its type (`part` when it names none).
    fn part(&mut self, text: Option<&str>, kind: Option<&str>) {
        match text {
            Some(text) => self.0.push_str(text),
            None => {
                self.0.push_str("<|");
                self.0.push_str(kind.unwrap_or("part"));
                self.0.push_str("|>");
            }
        }
    }
}

fn completion_prompt(prompt: Option<Value>) -> Result<Prompt<'static>, KeyError> {
    let bad = |problem: &str| KeyError::BadField { field: "prompt", problem: problem.to_owned() };
    let tokens = |items: &[Value]| -> Vec<u32> {
        items.iter().filter_map(Value::as_u64).map(|token| u32::try_from(token).unwrap_or(u32::MAX)).collect()
    };
    match prompt {
        None | Some(Value::Null) => Ok(Prompt::Text(Cow::Borrowed(""))),
        Some(Value::String(text)) => Ok(Prompt::Text(Cow::Owned(text))),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => Ok(Prompt::Text(Cow::Owned(
            items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n"),
        ))),
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => Ok(Prompt::Tokens(tokens(&items))),
        Some(Value::Array(items)) => match items.first() {
            // A batch of token prompts: the first one keys the request.
            Some(Value::Array(first)) if first.iter().all(Value::is_u64) => Ok(Prompt::Tokens(tokens(first))),
            _ => Err(bad("must be a string, a list of strings, or token ids")),
        },
        Some(_) => Err(bad("must be a string, a list of strings, or token ids")),
    }
}

/// The borrowing reader's types: serde structs whose strings point into the body.
mod borrowed {
    use std::borrow::Cow;
    use std::fmt;

    use serde::Deserialize;
    use serde::de::{self, Deserializer, SeqAccess, Visitor};

    use super::Rendering;

    #[derive(Deserialize)]
    pub(super) struct Fields<'a> {
        #[serde(default, borrow)]
        pub model: Option<Text<'a>>,
        #[serde(default, borrow)]
        pub messages: Option<Vec<Message<'a>>>,
        #[serde(default, borrow)]
        pub prompt: Option<Text<'a>>,
        #[serde(default)]
        pub stream: Option<bool>,
        #[serde(default, borrow)]
        pub user: Option<Text<'a>>,
        /// Present: the thorough reader decides (it is rare).
        #[serde(default)]
        pub add_special_tokens: Option<serde::de::IgnoredAny>,
    }

    #[derive(Deserialize)]
    pub(super) struct Message<'a> {
        #[serde(default, borrow)]
        role: Option<Text<'a>>,
        #[serde(default, borrow)]
        content: Option<Content<'a>>,
    }

    #[derive(Deserialize)]
    struct Part<'a> {
        #[serde(default, borrow)]
        text: Option<Text<'a>>,
        #[serde(default, borrow, rename = "type")]
        kind: Option<Text<'a>>,
    }

    /// A JSON string, borrowed from the body unless it holds escapes. (`Option<Cow<str>>` would
    /// always copy: serde borrows only into a bare `Cow<str>` field.)
    pub(super) struct Text<'a>(pub Cow<'a, str>);

    impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_str(TextVisitor)
        }
    }

    struct TextVisitor;

    impl<'de> Visitor<'de> for TextVisitor {
        type Value = Text<'de>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Self::Value, E> {
            Ok(Text(Cow::Borrowed(text)))
        }
        fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
            Ok(Text(Cow::Owned(text.to_owned())))
        }
        fn visit_string<E>(self, text: String) -> Result<Self::Value, E> {
            Ok(Text(Cow::Owned(text)))
        }
    }

    /// A message's content: a string or a list of parts (anything else fails the fast reader).
    enum Content<'a> {
        Text(Text<'a>),
        Parts(Vec<Part<'a>>),
    }

    impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct ContentVisitor;
            impl<'de> Visitor<'de> for ContentVisitor {
                type Value = Content<'de>;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a string or a list of content parts")
                }
                // Strings as `Text` reads them.
                fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
                    TextVisitor.visit_borrowed_str(text).map(Content::Text)
                }
                fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                    TextVisitor.visit_str(text).map(Content::Text)
                }
                fn visit_string<E: de::Error>(self, text: String) -> Result<Self::Value, E> {
                    TextVisitor.visit_string(text).map(Content::Text)
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                    let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                    while let Some(part) = seq.next_element()? {
                        parts.push(part);
                    }
                    Ok(Content::Parts(parts))
                }
            }
            deserializer.deserialize_any(ContentVisitor)
        }
    }

    /// The canonical rendering of the messages. `capacity`: the body's length, which the rendering
    /// of a usual body does not exceed (JSON spends more bytes on keys and quotes than the rendering
    /// on its markers).
    pub(super) fn render(messages: &[Message<'_>], capacity: usize) -> String {
        fn text<'t>(text: &'t Option<Text<'_>>) -> Option<&'t str> {
            text.as_ref().map(|text| &*text.0)
        }
        let mut out = Rendering::with_capacity(capacity);
        for message in messages {
            out.message(text(&message.role), |out| match &message.content {
                Some(Content::Text(content)) => out.text(&content.0),
                Some(Content::Parts(parts)) => {
                    for part in parts {
                        out.part(text(&part.text), text(&part.kind));
                    }
                }
                None => {}
            });
        }
        out.0
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
    use proptest::prelude::*;
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

    /// A reader's result in a comparable form.
    fn comparable(fields: KeyFields<'_>) -> (Option<String>, bool, Result<String, Vec<u32>>, Option<String>) {
        let prompt = match fields.prompt {
            Prompt::Text(text) => Ok(text.into_owned()),
            Prompt::Tokens(tokens) => Err(tokens),
        };
        (fields.model.map(Cow::into_owned), fields.stream, prompt, fields.user.map(Cow::into_owned))
    }

    /// JSON strings, escapes and non-ASCII included.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![Just(String::new()), "[a-z ]{1,12}", "[\\PC\"\\\\\n\t]{0,8}"]
    }

    /// Any JSON value a client might put where a string belongs.
    fn loose(text: BoxedStrategy<String>) -> impl Strategy<Value = Value> {
        prop_oneof![
            6 => text.prop_map(Value::from),
            1 => Just(Value::Null),
            1 => any::<u8>().prop_map(Value::from),
            1 => Just(json!({"nested": true})),
        ]
    }

    fn message() -> impl Strategy<Value = Value> {
        let part = (proptest::option::of(loose(text().boxed())), proptest::option::of(loose(text().boxed())))
            .prop_map(|(text, kind)| {
                let mut part = serde_json::Map::new();
                if let Some(text) = text {
                    part.insert("text".into(), text);
                }
                if let Some(kind) = kind {
                    part.insert("type".into(), kind);
                }
                Value::Object(part)
            });
        let content = prop_oneof![
            4 => loose(text().boxed()),
            2 => proptest::collection::vec(part, 0..4).prop_map(Value::from),
        ];
        (proptest::option::of(loose(text().boxed())), proptest::option::of(content)).prop_map(
            |(role, content)| {
                let mut message = serde_json::Map::new();
                if let Some(role) = role {
                    message.insert("role".into(), role);
                }
                if let Some(content) = content {
                    message.insert("content".into(), content);
                }
                Value::Object(message)
            },
        )
    }

    fn body() -> impl Strategy<Value = Value> {
        (
            proptest::option::of(loose(text().boxed())),
            proptest::option::of(proptest::collection::vec(message(), 0..4).prop_map(Value::from)),
            proptest::option::of(prop_oneof![
                3 => loose(text().boxed()),
                1 => proptest::collection::vec(any::<u16>(), 0..6).prop_map(Value::from),
            ]),
            proptest::option::of(prop_oneof![Just(json!(true)), Just(json!(false)), Just(json!("yes"))]),
            proptest::option::of(loose(text().boxed())),
        )
            .prop_map(|(model, messages, prompt, stream, user)| {
                let mut body = serde_json::Map::new();
                for (name, value) in [
                    ("model", model),
                    ("messages", messages),
                    ("prompt", prompt),
                    ("stream", stream),
                    ("user", user),
                ] {
                    if let Some(value) = value {
                        body.insert(name.into(), value);
                    }
                }
                body.insert("max_tokens".into(), json!(16));
                Value::Object(body)
            })
    }

    proptest! {
        // About 30 % of the generated bodies have only the usual shapes the fast reader takes (a count
        // of one run of 256: 74), so about 300 of the 1,024 compare the two readers.
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Whatever the fast reader accepts, it keys exactly as the JSON-value reader does.
        #[test]
        fn both_readers_key_a_body_the_same(body in body(), chat in any::<bool>()) {
            let route = if chat { Route::Chat } else { Route::Completions };
            let bytes = body.to_string();
            if let Some(fast) = read_borrowed(route, bytes.as_bytes()) {
                let thorough = read_values(route, bytes.as_bytes());
                prop_assert!(thorough.is_ok(), "the fast reader took a body the thorough one refuses: {bytes}");
                prop_assert_eq!(comparable(fast), comparable(thorough.unwrap()), "body: {}", bytes);
            }
        }
    }

    #[test]
    fn the_fast_reader_takes_the_usual_shapes_and_leaves_the_rest() {
        let usual = [
            json!({"model": "m", "messages": [{"role": "system", "content": "be brief \"ok\" \u{e9}"}, {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]}], "stream": true, "temperature": 0.2, "tools": [{"type": "function"}]}),
            json!({"model": null, "messages": [{"content": "no role"}, {"role": "assistant", "content": null, "tool_calls": []}], "user": "u1"}),
        ];
        for body in usual {
            let bytes = body.to_string();
            let fast = read_borrowed(Route::Chat, bytes.as_bytes())
                .expect("the fast reader takes a usual chat body");
            assert_eq!(comparable(fast), comparable(read_values(Route::Chat, bytes.as_bytes()).unwrap()));
        }
        let prompt = json!({"model": "m", "prompt": "once upon a time", "max_tokens": 8}).to_string();
        let fast = read_borrowed(Route::Completions, prompt.as_bytes()).expect("a string prompt is usual");
        assert!(
            matches!(fast.prompt, Prompt::Text(Cow::Borrowed("once upon a time"))),
            "borrowed, not copied"
        );
        for unusual in [
            json!({"prompt": [1, 2, 3]}),
            json!({"model": 5, "prompt": "x"}),
            json!({"messages": [{"role": 1, "content": "x"}]}),
            json!({"messages": [{"content": 5}]}),
        ] {
            let route = if unusual.get("messages").is_some() { Route::Chat } else { Route::Completions };
            assert!(read_borrowed(route, unusual.to_string().as_bytes()).is_none(), "{unusual}");
        }
        assert!(
            read_borrowed(Route::Chat, br#"{"messages": [], "messages": []}"#).is_none(),
            "duplicate fields"
        );
    }

    #[derive(Debug)]
    struct WordTokenizer;
    impl Tokenize for WordTokenizer {
        fn tokenize(&self, text: &str, _add_special_tokens: bool) -> Result<Vec<u32>, String> {
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
        let tokens = WordTokenizer.tokenize(&"a bb ccc ".repeat(20), true).unwrap();
        assert_eq!(key.view.block_hashes, token_blocks(&tokens, 16));
        assert_eq!(key.view.prompt_tokens, 60);
    }
}
