//! A model's own chat template (build feature `tokenizer`): chats rendered to the text the engine tokenises,
//! so the router's token blocks are the engine's blocks.
//!
//! The template is Jinja, as Hugging Face models ship it: the `chat_template` of `tokenizer_config.json` (a
//! string, or a list of named templates of which `default` is taken), else `chat_template.jinja` beside it,
//! or a file given with `--chat-template`. It is rendered with minijinja the way transformers (and so vLLM)
//! render it: `trim_blocks` and `lstrip_blocks` on, loop controls, `tojson`, Python's string methods
//! (`.strip()`, `.startswith()`...), `raise_exception(message)`, and the variables `messages`, `tools`,
//! `add_generation_prompt`, `continue_final_message`, the request's `chat_template_kwargs`, and the
//! tokenizer's special tokens (`bos_token`, `eos_token`, `pad_token`, `unk_token`).
//!
//! Message contents are given to the template in the shape vLLM gives them. vLLM looks at the template: one
//! that loops over a message's `content` gets every content as a list of parts (a string becomes one text
//! part); any other gets strings, a list of parts becoming its text parts joined with `\n`. The router
//! decides the same way, from whether the template's source loops over `message['content']` (or
//! `message.content`).
//!
//! The rendered text is tokenised without adding special tokens (the template writes them), as vLLM does for
//! `/v1/chat/completions` unless the request says `add_special_tokens: true`.

use std::path::{Path, PathBuf};

use minijinja::{Environment, Error, ErrorKind, Value as JinjaValue};
use serde_json::{Map, Value};

/// Why a chat template could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// A file could not be read.
    #[error("cannot read {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// `tokenizer_config.json` is not the JSON expected.
    #[error("{path}: {problem}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The template does not compile.
    #[error("the chat template from {source_name} does not compile: {error}")]
    Syntax {
        /// Where the template came from.
        source_name: String,
        /// minijinja's error.
        error: String,
    },
}

/// A compiled chat template with the special tokens it may use.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    special: Map<String, Value>,
    content_as_parts: bool,
    /// Where it came from, for logs.
    pub source_name: String,
}

const TEMPLATE: &str = "chat";

/// What `tokenizer_config.json` says: the template (if any) and the special tokens.
#[derive(Debug, Default)]
struct TokenizerConfig {
    template: Option<String>,
    special: Map<String, Value>,
}

fn read(path: &Path) -> Result<String, TemplateError> {
    std::fs::read_to_string(path).map_err(|error| TemplateError::Read { path: path.to_owned(), error })
}

fn read_config(path: &Path) -> Result<TokenizerConfig, TemplateError> {
    let bad = |problem: String| TemplateError::Config { path: path.to_owned(), problem };
    let config: Value =
        serde_json::from_str(&read(path)?).map_err(|error| bad(format!("not JSON: {error}")))?;
    let Value::Object(config) = config else { return Err(bad("not a JSON object".to_owned())) };
    let template = match config.get("chat_template") {
        None | Some(Value::Null) => None,
        Some(Value::String(template)) => Some(template.clone()),
        Some(Value::Array(named)) => {
            let default = named.iter().find(|t| t.get("name").and_then(Value::as_str) == Some("default"));
            let template = default.and_then(|t| t.get("template")).and_then(Value::as_str);
            Some(
                template
                    .ok_or_else(|| bad("`chat_template` is a list without a `default` template".to_owned()))?
                    .to_owned(),
            )
        }
        Some(other) => return Err(bad(format!("`chat_template` must be a string or a list, got {other}"))),
    };
    let mut special = Map::new();
    for name in ["bos_token", "eos_token", "pad_token", "unk_token"] {
        // A token is a string, or an AddedToken object with its text in `content`.
        let token = match config.get(name) {
            Some(Value::String(token)) => Some(token.clone()),
            Some(Value::Object(token)) => token.get("content").and_then(Value::as_str).map(str::to_owned),
            _ => None,
        };
        if let Some(token) = token {
            special.insert(name.to_owned(), Value::String(token));
        }
    }
    Ok(TokenizerConfig { template, special })
}

impl ChatTemplate {
    /// The template for the tokenizer at `tokenizer` (a `tokenizer.json`): `explicit` when given, else the
    /// one in `tokenizer_config.json` or `chat_template.jinja` beside it; `Ok(None)` when there is none.
    /// Special tokens come from `tokenizer_config.json` when it exists.
    pub fn for_tokenizer(tokenizer: &Path, explicit: Option<&Path>) -> Result<Option<Self>, TemplateError> {
        let folder = tokenizer.parent().unwrap_or(Path::new("."));
        let config_path = folder.join("tokenizer_config.json");
        let config =
            if config_path.exists() { read_config(&config_path)? } else { TokenizerConfig::default() };
        let jinja_path = folder.join("chat_template.jinja");
        let (source, source_name) = match (explicit, config.template) {
            (Some(path), _) => (read(path)?, path.display().to_string()),
            (None, Some(template)) => (template, config_path.display().to_string()),
            (None, None) if jinja_path.exists() => (read(&jinja_path)?, jinja_path.display().to_string()),
            (None, None) => return Ok(None),
        };
        Self::new(source, source_name, config.special).map(Some)
    }

    /// Compiles `source`; `special` holds the special tokens' texts by variable name (`bos_token`...).
    pub fn new(
        source: String,
        source_name: String,
        special: Map<String, Value>,
    ) -> Result<Self, TemplateError> {
        let content_as_parts = loops_over_content(&source);
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|error| TemplateError::Syntax {
                source_name: source_name.clone(),
                error: error.to_string(),
            })?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<JinjaValue, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned(TEMPLATE, source).map_err(|error| TemplateError::Syntax {
            source_name: source_name.clone(),
            error: format!("{error:#}"),
        })?;
        Ok(Self { env, special, content_as_parts, source_name })
    }

    /// Renders the chat of an OpenAI `/v1/chat/completions` request body (already parsed).
    pub fn render(&self, request: &Value) -> Result<String, String> {
        let Some(Value::Array(messages)) = request.get("messages") else {
            return Err("`messages` must be a list of {\"role\", \"content\"} objects".to_owned());
        };
        let messages: Vec<Value> = messages.iter().map(|message| self.message(message)).collect();
        let flag = |name: &str, default: bool| request.get(name).and_then(Value::as_bool).unwrap_or(default);
        let mut context = self.special.clone();
        if let Some(Value::Object(kwargs)) = request.get("chat_template_kwargs") {
            context.extend(kwargs.iter().map(|(key, value)| (key.clone(), value.clone())));
        }
        context.insert("messages".to_owned(), Value::Array(messages));
        context.insert("add_generation_prompt".to_owned(), Value::Bool(flag("add_generation_prompt", true)));
        context
            .insert("continue_final_message".to_owned(), Value::Bool(flag("continue_final_message", false)));
        context.insert("tools".to_owned(), request.get("tools").cloned().unwrap_or(Value::Null));
        let template = self.env.get_template(TEMPLATE).map_err(|error| error.to_string())?;
        template
            .render(JinjaValue::from(minijinja::value::Serde(&context)))
            .map_err(|error| format!("the chat template failed on this request: {error:#}"))
    }

    /// One message with its content in the shape the template takes (see the module docs).
    fn message(&self, message: &Value) -> Value {
        let Value::Object(fields) = message else { return message.clone() };
        let mut fields = fields.clone();
        let content = match fields.get("content") {
            Some(Value::String(text)) if self.content_as_parts => {
                Some(Value::Array(vec![serde_json::json!({"type": "text", "text": text})]))
            }
            Some(Value::Array(parts)) if !self.content_as_parts => {
                let texts: Vec<&str> =
                    parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect();
                Some(Value::String(texts.join("\n")))
            }
            _ => None,
        };
        if let Some(content) = content {
            fields.insert("content".to_owned(), content);
        }
        Value::Object(fields)
    }
}

/// Whether a template loops over a message's content (then it takes content parts): a `for` tag whose
/// iterable ends in `.content` or `['content']`.
fn loops_over_content(source: &str) -> bool {
    let compact: String = source.chars().filter(|c| !c.is_whitespace()).collect();
    compact.split("%}").filter_map(|tag| tag.rsplit_once("{%")).any(|(_, tag)| {
        let tag = tag.trim_start_matches(['-', '+']).trim_end_matches('-');
        tag.starts_with("for")
            && [".content", "['content']", "[\"content\"]"].iter().any(|end| tag.ends_with(end))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LLAMA3: &str = "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";

    fn special() -> Map<String, Value> {
        let mut special = Map::new();
        special.insert("bos_token".into(), json!("<|begin_of_text|>"));
        special
    }

    #[test]
    fn a_llama3_template_renders_as_transformers_does() {
        let template = ChatTemplate::new(LLAMA3.into(), "test".into(), special()).expect("compiles");
        let request = json!({"messages": [
            {"role": "system", "content": "  be brief "},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]},
        ]});
        assert_eq!(
            template.render(&request).expect("renders"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\na\nb<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        let no_prompt =
            json!({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false});
        assert!(template.render(&no_prompt).expect("renders").ends_with("x<|eot_id|>"));
    }

    #[test]
    fn templates_that_loop_over_content_get_parts_and_python_methods_work() {
        let source = "{% for m in messages %}{% for p in m.content %}{{ p.text.strip() }}|{% endfor %}{% endfor %}\
                      {% if greeting %}{{ greeting.upper() }}{% endif %}";
        let template = ChatTemplate::new(source.into(), "test".into(), Map::new()).expect("compiles");
        let request = json!({"messages": [{"role": "user", "content": " hi "}], "chat_template_kwargs": {"greeting": "yo"}});
        assert_eq!(template.render(&request).expect("renders"), "hi|YO");
    }

    #[test]
    fn raise_exception_and_bad_templates_are_errors_that_say_so() {
        let source =
            "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}";
        let template = ChatTemplate::new(source.into(), "test".into(), Map::new()).expect("compiles");
        let error = template.render(&json!({"messages": [{"role": "system", "content": ""}]})).unwrap_err();
        assert!(error.contains("first must be user"), "{error}");
        let error = ChatTemplate::new("{% for %}".into(), "broken.jinja".into(), Map::new()).unwrap_err();
        assert!(error.to_string().contains("broken.jinja"), "{error}");
        assert!(template.render(&json!({"prompt": "x"})).unwrap_err().contains("messages"));
    }

    #[test]
    fn the_template_and_special_tokens_come_from_tokenizer_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tokenizer = dir.path().join("tokenizer.json");
        assert!(ChatTemplate::for_tokenizer(&tokenizer, None).expect("no config is fine").is_none());
        let config = json!({
            "bos_token": {"content": "<s>", "lstrip": false},
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"}],
        });
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).expect("write");
        let template = ChatTemplate::for_tokenizer(&tokenizer, None).expect("loads").expect("a template");
        assert_eq!(
            template.render(&json!({"messages": [{"role": "user", "content": "hi"}]})).unwrap(),
            "<s>hi"
        );
        let explicit = dir.path().join("other.jinja");
        std::fs::write(&explicit, "[{{ messages | length }}]").expect("write");
        let template =
            ChatTemplate::for_tokenizer(&tokenizer, Some(&explicit)).expect("loads").expect("given");
        assert_eq!(template.render(&json!({"messages": []})).unwrap(), "[0]");
        std::fs::write(dir.path().join("tokenizer_config.json"), "{\"chat_template\": 3}").expect("write");
        let error = ChatTemplate::for_tokenizer(&tokenizer, None).unwrap_err();
        assert!(error.to_string().contains("tokenizer_config.json"), "{error}");
    }
}
