//! The policy specification operators write (YAML or JSON), its validation, and the parameter docs.
//!
//! A [`PolicySpec`] is the operator's document as written: `schema_version`, `policy` and a `params`
//! map. [`PolicySpec::validate`] checks it against the parameter table ([`param_docs`]), the single
//! source of truth for names, types, ranges, defaults and meanings; [`PolicySpec::resolve`] turns it into
//! typed parameters with every omitted parameter at its documented default.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The only schema version this crate reads. A missing `schema_version` means this one.
pub const SCHEMA_VERSION: u32 = 1;

/// Every policy name, in the order the UI lists them. Other tools and checks rely on these strings.
pub const POLICY_NAMES: [&str; 8] = [
    "round_robin",
    "random",
    "least_load",
    "power_of_two",
    "consistent_hash",
    "cache_aware_approx",
    "kv_precise",
    "weighted_scorers",
];

/// The policies that route by prompt prefix, each reviewed by the shared load guard (`load_guard`,
/// `spread_wait_tokens`, `decode_wait_weight`): the ones judged against round_robin's TTFT and a peer's hit rate.
pub const CACHE_AWARE_POLICY_NAMES: [&str; 4] =
    ["consistent_hash", "cache_aware_approx", "kv_precise", "weighted_scorers"];

/// One line on what each policy does, for the UI's policy picker.
pub fn policy_summary(policy: &str) -> Option<&'static str> {
    Some(match policy {
        "round_robin" => "Each healthy replica in turn.",
        "random" => "A uniformly random healthy replica (seeded).",
        "least_load" => "The replica where a request would wait least (or: fewest outstanding requests).",
        "power_of_two" => "Two seeded random replicas; the less loaded wins.",
        "consistent_hash" => {
            "Consistent hashing with bounded load (CHWBL): a prefix or session sticks to one replica \
             unless it is over the load bound."
        }
        "cache_aware_approx" => {
            "SGLang-style: balance load when imbalanced, else the replica the router last sent the \
             longest matching prefix to."
        }
        "kv_precise" => {
            "Dynamo-style: minimum cost from the replicas' KV-cache events (uncached prefill plus active \
             prefill and decode blocks)."
        }
        "weighted_scorers" => {
            "llm-d-style: filter unhealthy or overloaded replicas, then a weighted sum of prefix, KV usage, \
             queue and running-request scores."
        }
        _ => return None,
    })
}

/// The operator's policy document. `Default` is `round_robin` with no parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// Format version of this document; only [`SCHEMA_VERSION`] is accepted.
    #[serde(default = "schema_version_default")]
    pub schema_version: u32,
    /// One of [`POLICY_NAMES`].
    pub policy: String,
    /// Parameters of that policy; omitted ones take their documented defaults.
    #[serde(default)]
    pub params: Map<String, Value>,
    /// Prefill/decode disaggregation thresholds ([`crate::PdParams`], [`crate::pd_param_docs`]), used by
    /// routers whose fleet has prefill replicas; omitted ones take their defaults.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub pd: Map<String, Value>,
}

fn schema_version_default() -> u32 {
    SCHEMA_VERSION
}

impl Default for PolicySpec {
    fn default() -> Self {
        Self::named("round_robin")
    }
}

impl PolicySpec {
    /// A spec for `policy` with every parameter at its default.
    pub fn named(policy: &str) -> Self {
        Self { schema_version: SCHEMA_VERSION, policy: policy.to_owned(), params: Map::new(), pd: Map::new() }
    }

    /// Sets one parameter (builder style, for code and tests).
    pub fn with(mut self, param: &str, value: impl Into<Value>) -> Self {
        self.params.insert(param.to_owned(), value.into());
        self
    }

    /// Sets one field of the `pd` section (builder style, for code and tests).
    pub fn with_pd(mut self, field: &str, value: impl Into<Value>) -> Self {
        self.pd.insert(field.to_owned(), value.into());
        self
    }

    /// The `pd` section, checked, with defaults filled in.
    pub fn pd_params(&self) -> Result<crate::PdParams, SpecError> {
        crate::PdParams::from_section(&self.pd)
    }

    /// Checks the schema version, the policy name, every parameter name, type and range, and the `pd` section.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.resolve().map(|_| ())
    }

    /// Validates, then returns the typed parameters with defaults filled in.
    pub fn resolve(&self) -> Result<ResolvedPolicy, SpecError> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(SpecError::UnsupportedSchemaVersion { found: self.schema_version });
        }
        self.pd_params()?;
        let docs = param_docs(&self.policy);
        if !POLICY_NAMES.contains(&self.policy.as_str()) {
            return Err(SpecError::UnknownPolicy {
                name: self.policy.clone(),
                suggestion: closest(&self.policy, POLICY_NAMES.iter().copied()),
            });
        }
        for (name, value) in &self.params {
            let Some(doc) = docs.iter().find(|doc| doc.name == name) else {
                return Err(SpecError::UnknownField {
                    field: format!("params.{name}"),
                    policy: self.policy.clone(),
                    allowed: docs.iter().map(|doc| doc.name.to_owned()).collect(),
                    suggestion: closest(name, docs.iter().map(|doc| doc.name)),
                });
            };
            doc.check(value)?;
        }
        let values = ResolvedValues { docs: &docs, given: &self.params };
        let policy = match self.policy.as_str() {
            "round_robin" => ResolvedPolicy::RoundRobin,
            "random" => ResolvedPolicy::Random,
            "least_load" => ResolvedPolicy::LeastLoad(LoadParams::read(&values)),
            "power_of_two" => ResolvedPolicy::PowerOfTwo(LoadParams::read(&values)),
            "consistent_hash" => ResolvedPolicy::ConsistentHash(ConsistentHashParams {
                virtual_nodes: values.integer("virtual_nodes") as u32,
                load_factor: values.float("load_factor"),
                prefix_blocks: values.integer("prefix_blocks") as usize,
                use_session_key: values.boolean("use_session_key"),
                guard: LoadGuardParams::read(&values),
                hashing: HashingParams::read(&values),
            }),
            "cache_aware_approx" => ResolvedPolicy::CacheAwareApprox(CacheAwareParams {
                cache_threshold: values.float("cache_threshold"),
                balance_abs_threshold: values.integer("balance_abs_threshold") as u64,
                balance_rel_threshold: values.float("balance_rel_threshold"),
                max_blocks_per_replica: values.integer("max_blocks_per_replica") as usize,
                guard: LoadGuardParams::read(&values),
                hashing: HashingParams::read(&values),
            }),
            "kv_precise" => ResolvedPolicy::KvPrecise(KvPreciseParams {
                prefill_weight: values.float("prefill_weight"),
                overlap_weight: values.float("overlap_weight"),
                decode_weight: values.float("decode_weight"),
                temperature: values.float("temperature"),
                max_blocks_per_replica: values.integer("max_blocks_per_replica") as usize,
                guard: LoadGuardParams::read(&values),
                hashing: HashingParams::read(&values),
            }),
            "weighted_scorers" => {
                let params = WeightedScorersParams {
                    prefix_weight: values.float("prefix_weight"),
                    kv_usage_weight: values.float("kv_usage_weight"),
                    queue_weight: values.float("queue_weight"),
                    running_weight: values.float("running_weight"),
                    max_queue_depth: values.integer("max_queue_depth") as u32,
                    max_kv_usage: values.float("max_kv_usage"),
                    prefix_source: if values.choice("prefix_source") == "kv_events" {
                        PrefixSource::KvEvents
                    } else {
                        PrefixSource::Routed
                    },
                    max_blocks_per_replica: values.integer("max_blocks_per_replica") as usize,
                    guard: LoadGuardParams::read(&values),
                    hashing: HashingParams::read(&values),
                };
                let total = params.prefix_weight
                    + params.kv_usage_weight
                    + params.queue_weight
                    + params.running_weight;
                if total <= 0.0 {
                    return Err(SpecError::OutOfRange {
                        field: "params.prefix_weight".to_owned(),
                        value: "0 (all four weights are 0)".to_owned(),
                        allowed: "at least one weight above 0".to_owned(),
                        fix: "give at least one scorer a positive weight, for example prefix_weight: 3"
                            .to_owned(),
                    });
                }
                ResolvedPolicy::WeightedScorers(params)
            }
            _ => ResolvedPolicy::RoundRobin,
        };
        Ok(policy)
    }

    /// This spec as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// This spec as YAML.
    pub fn to_yaml(&self) -> String {
        serde_norway::to_string(self).unwrap_or_default()
    }
}

/// Longest spec text read, in bytes. A spec is a policy name and a flat mapping of parameters, a few hundred
/// bytes; the parsers' cost grows faster than the text on some inputs, so nothing longer reaches them.
pub const MAX_SPEC_BYTES: usize = 64 * 1024;
/// Deepest nesting read (mappings and sequences, block or flow style). A spec nests two levels (the document
/// and `params`); YAML's cost grows with the square of its flow nesting (`policy: [[[[...`), so deeper text
/// never reaches the parser.
pub const MAX_SPEC_DEPTH: usize = 16;
/// How long a caller on an async runtime lets one parse run (on a blocking thread) before answering that it
/// took too long. Text within [`MAX_SPEC_BYTES`] and [`MAX_SPEC_DEPTH`] parses in milliseconds; this is the
/// backstop, so a parser's worst case never holds a caller.
pub const SPEC_PARSE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// Checks spec text against [`MAX_SPEC_BYTES`] and [`MAX_SPEC_DEPTH`], and refuses YAML anchors and aliases,
/// before any parser sees it: one pass over the bytes, linear whatever they are. [`PolicySpec::from_str`] runs
/// it first; callers holding the text as bytes can run it before even checking UTF-8.
///
/// Aliases are refused because expanding them is the one way short YAML becomes a large document (each
/// alias repeats its anchor's whole subtree, and anchors can name aliases): a spec has no use for them.
pub fn check_spec_text(text: &[u8]) -> Result<(), SpecError> {
    if text.len() > MAX_SPEC_BYTES {
        return Err(SpecError::TooLarge { bytes: text.len(), limit: MAX_SPEC_BYTES });
    }
    let shape = scan_spec_text(text);
    if shape.depth > MAX_SPEC_DEPTH {
        return Err(SpecError::TooDeep { depth: shape.depth, limit: MAX_SPEC_DEPTH });
    }
    if let Some(line) = shape.alias_line {
        return Err(SpecError::YamlAlias { line });
    }
    Ok(())
}

/// What [`scan_spec_text`] finds.
struct TextShape {
    /// The deepest nesting (at least what a parser would meet).
    depth: usize,
    /// The first line (1-based) with an anchor (`&NAME`) or an alias (`*NAME`).
    alias_line: Option<usize>,
}

/// The deepest nesting of YAML (or JSON) text, counted without parsing: open flow brackets (`[`, `{`)
/// outside quotes and comments, plus the block levels a line sits in (indentation levels, and the `- ` and
/// `? ` indicators that open one on the same line); and the first anchor or alias. It may count more than a
/// parser would (a bracket in a plain scalar, a quoted scalar running over lines), never less: a quote
/// hides what follows only where YAML starts a quoted scalar too.
fn scan_spec_text(text: &[u8]) -> TextShape {
    let blank = |b: u8| b == b' ' || b == b'\t';
    let mut shape = TextShape { depth: 0, alias_line: None };
    let mut flow = 0usize;
    // Indentation of the block levels open (strictly increasing).
    let mut indents: Vec<usize> = Vec::new();
    for (number, line) in text.split(|&b| b == b'\n').enumerate() {
        let indent = line.iter().take_while(|&&b| blank(b)).count();
        let content = line.get(indent).is_some_and(|&b| b != b'#' && b != b'\r');
        let mut at = indent;
        if flow == 0 && content {
            while indents.last().is_some_and(|&open| open >= indent) {
                indents.pop();
            }
            indents.push(indent);
            // `- - - x` and `? x` open a level each on the same line.
            while line.len() > at + 1 && matches!(line[at], b'-' | b'?') && blank(line[at + 1]) {
                at += 2;
                while line.get(at).is_some_and(|&b| blank(b)) {
                    at += 1;
                }
                indents.push(at);
            }
        }
        let mut quote: Option<u8> = None;
        // Where a node may start: after blanks, a flow indicator or the line's indicators.
        let mut node_start = true;
        let mut i = at;
        while i < line.len() {
            let b = line[i];
            match quote {
                Some(b'"') if b == b'\\' => i += 1,
                Some(open) if b == open => quote = None,
                Some(_) => {}
                None => match b {
                    b'"' | b'\'' if node_start => quote = Some(b),
                    b'#' if node_start => break,
                    b'&' | b'*' if node_start => {
                        shape.alias_line.get_or_insert(number + 1);
                    }
                    b'[' | b'{' => {
                        flow += 1;
                        shape.depth = shape.depth.max(indents.len() + flow);
                    }
                    b']' | b'}' => flow = flow.saturating_sub(1),
                    _ => {}
                },
            }
            node_start = quote.is_none() && (blank(b) || matches!(b, b'[' | b'{' | b','));
            i += 1;
        }
        shape.depth = shape.depth.max(indents.len() + flow);
    }
    shape
}

impl FromStr for PolicySpec {
    type Err = SpecError;

    /// Checks the text's size and nesting ([`check_spec_text`]), parses JSON when it starts with `{`, YAML
    /// otherwise, then validates it.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        check_spec_text(text.as_bytes())?;
        let is_json = text.trim_start().starts_with('{');
        let document: Value = if is_json {
            // A YAML flow mapping (`{policy: least_load}`) opens with a brace too: JSON's error stands
            // only when the text is not YAML either.
            serde_json::from_str(text).or_else(|error| {
                serde_norway::from_str(text)
                    .map_err(|_| SpecError::Parse { format: "JSON", message: error.to_string() })
            })?
        } else {
            serde_norway::from_str(text)
                .map_err(|error| SpecError::Parse { format: "YAML", message: error.to_string() })?
        };
        let Value::Object(mut top) = document else {
            return Err(SpecError::Parse {
                format: if is_json { "JSON" } else { "YAML" },
                message: "the document must be a mapping with `policy:` and optional `params:`".to_owned(),
            });
        };
        const TOP_FIELDS: [&str; 4] = ["schema_version", "policy", "params", "pd"];
        if let Some(unknown) = top.keys().find(|key| !TOP_FIELDS.contains(&key.as_str())) {
            return Err(SpecError::UnknownField {
                field: unknown.clone(),
                policy: "the spec".to_owned(),
                allowed: TOP_FIELDS.iter().map(|field| (*field).to_owned()).collect(),
                suggestion: closest(unknown, TOP_FIELDS.iter().copied()),
            });
        }
        let schema_version = match top.remove("schema_version") {
            None => SCHEMA_VERSION,
            Some(value) => {
                value.as_u64().and_then(|v| u32::try_from(v).ok()).ok_or_else(|| SpecError::WrongType {
                    field: "schema_version".to_owned(),
                    value: value.to_string(),
                    expected: "the integer 1".to_owned(),
                })?
            }
        };
        let policy = match top.remove("policy") {
            Some(Value::String(name)) => name,
            Some(other) => {
                return Err(SpecError::WrongType {
                    field: "policy".to_owned(),
                    value: other.to_string(),
                    expected: format!("a policy name: one of {}", POLICY_NAMES.join(", ")),
                });
            }
            None => return Err(SpecError::MissingPolicy),
        };
        let params = match top.remove("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(params)) => params,
            Some(other) => {
                return Err(SpecError::WrongType {
                    field: "params".to_owned(),
                    value: other.to_string(),
                    expected: "a mapping of parameter names to values".to_owned(),
                });
            }
        };
        let pd = match top.remove("pd") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(pd)) => pd,
            Some(other) => {
                return Err(SpecError::WrongType {
                    field: "pd".to_owned(),
                    value: other.to_string(),
                    expected: "a mapping of P/D thresholds (min_uncached_tokens, min_prompt_tokens, max_prefill_queue)"
                        .to_owned(),
                });
            }
        };
        let spec = Self { schema_version, policy, params, pd };
        spec.validate()?;
        Ok(spec)
    }
}

/// Why a spec was rejected. `Display` is one sentence naming the field, the value, what is allowed and the fix.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// The text is not valid JSON or YAML.
    #[error("the policy spec is not valid {format}: {message}; fix the syntax and try again")]
    Parse {
        /// "JSON" or "YAML".
        format: &'static str,
        /// The parser's message.
        message: String,
    },
    /// The text is longer than [`MAX_SPEC_BYTES`]; no parser read it.
    #[error(
        "the policy spec is {bytes} bytes, more than the {limit} read (a spec is a policy name and its \
         params, a few hundred bytes); send only the spec"
    )]
    TooLarge {
        /// Its length.
        bytes: usize,
        /// [`MAX_SPEC_BYTES`].
        limit: usize,
    },
    /// The text nests deeper than [`MAX_SPEC_DEPTH`]; no parser read it.
    #[error(
        "the policy spec nests {depth} levels deep, more than the {limit} read (a spec is `policy` and a flat \
         `params` mapping); remove the nested brackets or indentation"
    )]
    TooDeep {
        /// How deep it nests (at least).
        depth: usize,
        /// [`MAX_SPEC_DEPTH`].
        limit: usize,
    },
    /// The text has a YAML anchor or alias; no parser read it.
    #[error(
        "the policy spec uses a YAML anchor or alias (`&NAME` or `*NAME`) on line {line}; a spec has no use \
         for them: write the values out"
    )]
    YamlAlias {
        /// The first line (1-based) with one.
        line: usize,
    },
    /// The parse did not finish within [`SPEC_PARSE_DEADLINE`] (reported by the async callers that run it on
    /// a blocking thread).
    #[error(
        "the policy spec took longer than {limit_ms} ms to read and was abandoned; send a plain spec \
         (`policy: NAME` and flat `params`)"
    )]
    TooSlow {
        /// The deadline, in milliseconds.
        limit_ms: u64,
    },
    /// `policy:` is absent.
    #[error(
        "the policy spec has no `policy` field; add `policy: NAME` with NAME one of round_robin, random, \
         least_load, power_of_two, consistent_hash, cache_aware_approx, kv_precise, weighted_scorers"
    )]
    MissingPolicy,
    /// `schema_version` is not one this crate reads.
    #[error("schema_version {found} is not supported (allowed: 1); set `schema_version: 1` or omit it")]
    UnsupportedSchemaVersion {
        /// The version found.
        found: u32,
    },
    /// The policy name is not one of [`POLICY_NAMES`].
    #[error(
        "policy = {name:?} is not a known policy (allowed: round_robin, random, least_load, power_of_two, \
         consistent_hash, cache_aware_approx, kv_precise, weighted_scorers); {}",
        fix_by_suggestion(suggestion.as_deref(), "policy")
    )]
    UnknownPolicy {
        /// The name found.
        name: String,
        /// The closest known name, if any is close.
        suggestion: Option<String>,
    },
    /// A field the spec (or that policy) does not have.
    #[error(
        "{field} is not a field of {policy} (allowed: {}); {}",
        list_or_none(allowed),
        fix_by_suggestion(suggestion.as_deref(), "the field")
    )]
    UnknownField {
        /// The field, as `params.NAME` for parameters.
        field: String,
        /// The policy (or "the spec" for top-level fields).
        policy: String,
        /// The fields that exist there.
        allowed: Vec<String>,
        /// The closest allowed field, if any is close.
        suggestion: Option<String>,
    },
    /// A value of the wrong type.
    #[error("{field} = {value} has the wrong type (allowed: {expected}); write it as {expected}")]
    WrongType {
        /// The field.
        field: String,
        /// The value found, as JSON.
        value: String,
        /// What is expected.
        expected: String,
    },
    /// A value outside its range.
    #[error("{field} = {value} is out of range (allowed: {allowed}); {fix}")]
    OutOfRange {
        /// The field.
        field: String,
        /// The value found.
        value: String,
        /// The allowed range.
        allowed: String,
        /// How to fix it.
        fix: String,
    },
}

fn fix_by_suggestion(suggestion: Option<&str>, what: &str) -> String {
    match suggestion {
        Some(name) => format!("did you mean {name}? rename {what} to {name}"),
        None => format!("remove {what} or use one of the allowed names"),
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() { "none, this policy takes no parameters".to_owned() } else { items.join(", ") }
}

/// The allowed-name closest to `given` by edit distance, if it is close enough to be a likely typo.
pub(crate) fn closest<'a>(given: &str, allowed: impl Iterator<Item = &'a str>) -> Option<String> {
    allowed
        .map(|name| (edit_distance(given, name), name))
        .filter(|(distance, name)| *distance <= (name.len() / 3).max(2))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name.to_owned())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The type and allowed values of a parameter.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ParamKind {
    /// A whole number in `min..=max`.
    Integer {
        /// Smallest allowed.
        min: i64,
        /// Largest allowed.
        max: i64,
    },
    /// A real number in `min..=max`.
    Float {
        /// Smallest allowed.
        min: f64,
        /// Largest allowed.
        max: f64,
    },
    /// `true` or `false`.
    Bool,
    /// One of a fixed set of strings.
    Choice {
        /// The allowed strings.
        options: Vec<&'static str>,
    },
}

/// One parameter of one policy: what a UI editor needs to show and check it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ParamDoc {
    /// Name under `params:`.
    pub name: &'static str,
    /// Type and range.
    pub kind: ParamKind,
    /// Value when omitted.
    pub default: Value,
    /// What it means, in a sentence.
    pub meaning: &'static str,
}

impl ParamDoc {
    fn allowed(&self) -> String {
        match &self.kind {
            ParamKind::Integer { min, max } => format!("an integer from {min} to {max}"),
            ParamKind::Float { min, max } => format!("a number from {min} to {max}"),
            ParamKind::Bool => "true or false".to_owned(),
            ParamKind::Choice { options } => format!("one of {}", options.join(", ")),
        }
    }

    fn check(&self, value: &Value) -> Result<(), SpecError> {
        self.check_field(&format!("params.{}", self.name), value)
    }

    /// Checks `value` against the type and range, naming it `field` in the error.
    pub(crate) fn check_field(&self, field: &str, value: &Value) -> Result<(), SpecError> {
        let field = field.to_owned();
        let wrong_type = || SpecError::WrongType {
            field: field.clone(),
            value: value.to_string(),
            expected: self.allowed(),
        };
        let out_of_range = || SpecError::OutOfRange {
            field: field.clone(),
            value: value.to_string(),
            allowed: self.allowed(),
            fix: format!("set it within that range, or omit it to use the default {}", self.default),
        };
        match &self.kind {
            ParamKind::Integer { min, max } => {
                let number = value.as_f64().ok_or_else(wrong_type)?;
                if number.fract() != 0.0 {
                    return Err(wrong_type());
                }
                if number < *min as f64 || number > *max as f64 {
                    return Err(out_of_range());
                }
            }
            ParamKind::Float { min, max } => {
                let number = value.as_f64().ok_or_else(wrong_type)?;
                if !(number >= *min && number <= *max) {
                    return Err(out_of_range());
                }
            }
            ParamKind::Bool => {
                value.as_bool().ok_or_else(wrong_type)?;
            }
            ParamKind::Choice { options } => {
                let text = value.as_str().ok_or_else(wrong_type)?;
                if !options.contains(&text) {
                    return Err(SpecError::OutOfRange {
                        field,
                        value: value.to_string(),
                        allowed: self.allowed(),
                        fix: match closest(text, options.iter().copied()) {
                            Some(name) => format!("did you mean {name}? use one of the allowed values"),
                            None => format!("use one of the allowed values, or omit it for {}", self.default),
                        },
                    });
                }
            }
        }
        Ok(())
    }
}

fn integer(name: &'static str, min: i64, max: i64, default: i64, meaning: &'static str) -> ParamDoc {
    ParamDoc { name, kind: ParamKind::Integer { min, max }, default: Value::from(default), meaning }
}

fn float(name: &'static str, min: f64, max: f64, default: f64, meaning: &'static str) -> ParamDoc {
    ParamDoc { name, kind: ParamKind::Float { min, max }, default: Value::from(default), meaning }
}

fn choice(
    name: &'static str,
    options: Vec<&'static str>,
    default: &'static str,
    meaning: &'static str,
) -> ParamDoc {
    ParamDoc { name, kind: ParamKind::Choice { options }, default: Value::from(default), meaning }
}

fn load_metric_docs() -> Vec<ParamDoc> {
    vec![
        choice(
            "load_metric",
            vec!["wait", "requests", "prefill_tokens"],
            "wait",
            "What counts as load: the expected wait, in blocks of prefill: the prefill queued there (of prompts \
             not cached there when routed) plus decode_wait_weight x the blocks its decoding requests hold, other \
             routers' requests counted from the replica's fresh metrics; or outstanding requests (SGLang's \
             least-load); or prompt tokens of requests still in prefill.",
        ),
        float(
            "decode_wait_weight",
            0.0,
            1000.0,
            DEFAULT_DECODE_WAIT_WEIGHT,
            "With load_metric wait: blocks of prefill each block held by a replica's decoding requests adds to \
             its expected wait.",
        ),
    ]
}

fn hashing_docs() -> [ParamDoc; 2] {
    [
        integer(
            "block_tokens",
            1,
            4096,
            DEFAULT_BLOCK_TOKENS as i64,
            "Tokens per KV block when prompts come as tokens; must equal the engines' block size for kv_precise.",
        ),
        integer(
            "chunk_bytes",
            1,
            65536,
            64,
            "Bytes per block when prompts come as raw text (the byte-chunk scheme).",
        ),
    ]
}

/// The load guard's parameters, shared by the cache-aware policies (see `LoadGuardParams`), with the
/// policy's default bound.
fn load_guard_docs(spread_wait_tokens: i64) -> Vec<ParamDoc> {
    vec![
        ParamDoc {
            name: "load_guard",
            kind: ParamKind::Bool,
            default: Value::Bool(true),
            meaning: "Review every pick by expected wait: the chosen replica keeps the request only while its queued \
                      prefill blocks (+ decode_wait_weight x its decoding blocks) plus the prompt blocks it would \
                      prefill are within spread_wait_tokens of the \
                      replica where that sum is least; otherwise the request (and so its prefix) goes there. \
                      false keeps the policy's choice as it is.",
        },
        integer(
            "spread_wait_tokens",
            0,
            1_000_000_000,
            spread_wait_tokens,
            "Load guard bound, in prompt tokens of prefill: how much later than the soonest replica the policy's \
             choice may start a request before the prefix is spread. 0 always takes the soonest start; larger \
             values keep more traffic on prefix owners (hit rate) at the price of queueing there.",
        ),
        float(
            "decode_wait_weight",
            0.0,
            1000.0,
            DEFAULT_DECODE_WAIT_WEIGHT,
            "Load guard: blocks of prefill each block held by a replica's decoding requests adds to its expected \
             wait (their attention runs in every engine step, slowing the prefill behind them).",
        ),
    ]
}

/// The load guard's default bound, in prompt tokens of prefill (see `load_guard_docs`), for the policies
/// that guess what a replica holds (from their own routing, or a hash ring). A guess misses evictions, so it
/// counts too little prefill at a prefix's owner: a looser bound (16,384) let cache_aware_approx and
/// weighted_scorers queue the hot tenant of `bench peers`' gen workload to a TTFT p95 of 1.5 s (replay),
/// 2.7 times this bound's.
const DEFAULT_SPREAD_WAIT_TOKENS: i64 = 8192;
/// kv_precise's default bound: its index follows the replicas' evictions, so its expected waits hold and a
/// looser bound buys hit rate without the queueing (Mooncake: 0.95 of the pooled bound against 0.93 at
/// 8,192 tokens, the same TTFT p95).
const PRECISE_SPREAD_WAIT_TOKENS: i64 = 16_384;
/// Tokens per block the router cuts token prompts into unless told (`block_tokens`).
pub(crate) const DEFAULT_BLOCK_TOKENS: usize = 16;
/// The load guard's default weight of decoding blocks in the expected wait (see `load_guard_docs`).
const DEFAULT_DECODE_WAIT_WEIGHT: f64 = 0.1;

/// Parameters of `policy` with type, range, default and meaning (empty for parameterless or unknown policies).
pub fn param_docs(policy: &str) -> Vec<ParamDoc> {
    match policy {
        "least_load" | "power_of_two" => load_metric_docs(),
        "consistent_hash" => {
            let mut docs = vec![
                integer(
                    "virtual_nodes",
                    1,
                    4096,
                    256,
                    "Points per replica on the hash ring; more gives a more even spread.",
                ),
                float(
                    "load_factor",
                    1.0,
                    10.0,
                    1.25,
                    "Load bound as a multiple of the mean: a replica takes a request only while its load + 1 is at most \
                 ceil(load_factor x (total load + 1) / healthy replicas).",
                ),
                integer(
                    "prefix_blocks",
                    1,
                    4096,
                    4,
                    "The hash key is the prompt's first K blocks (K = this).",
                ),
                ParamDoc {
                    name: "use_session_key",
                    kind: ParamKind::Bool,
                    default: Value::Bool(true),
                    meaning: "Hash the request's session key instead of its prefix when one is present.",
                },
            ];
            docs.extend(load_guard_docs(DEFAULT_SPREAD_WAIT_TOKENS));
            docs.extend(hashing_docs());
            docs
        }
        "cache_aware_approx" => {
            let mut docs = vec![
                float(
                    "cache_threshold",
                    0.0,
                    1.0,
                    0.3,
                    "Route to the longest-match replica only if its matched share of the prompt is above this.",
                ),
                integer(
                    "balance_abs_threshold",
                    0,
                    1_000_000,
                    64,
                    "Load is imbalanced when max - min outstanding requests is above this (and the relative test holds).",
                ),
                float(
                    "balance_rel_threshold",
                    1.0,
                    1000.0,
                    1.5,
                    "Load is imbalanced when max outstanding is above this times min (and the absolute test holds).",
                ),
                integer(
                    "max_blocks_per_replica",
                    16,
                    1 << 28,
                    1 << 20,
                    "Approximate-index entries kept per replica; least recently used blocks are evicted beyond it.",
                ),
            ];
            docs.extend(load_guard_docs(DEFAULT_SPREAD_WAIT_TOKENS));
            docs.extend(hashing_docs());
            docs
        }
        "kv_precise" => {
            let mut docs = vec![
                float(
                    "prefill_weight",
                    0.0,
                    1000.0,
                    1.0,
                    "Cost weight of blocks to prefill (uncached prompt + active prefill).",
                ),
                float(
                    "overlap_weight",
                    0.0,
                    1000.0,
                    4.0,
                    "Extra weight of the request's own uncached blocks (Dynamo's overlap score weight): above 1 \
                     favours replicas holding the prefix over less loaded ones.",
                ),
                float(
                    "decode_weight",
                    0.0,
                    1000.0,
                    0.1,
                    "Cost weight of the replica's active decode blocks.",
                ),
                float(
                    "temperature",
                    0.0,
                    100.0,
                    0.0,
                    "0 picks the minimum cost; above 0 samples replicas with softmax(-normalised cost / temperature).",
                ),
                integer(
                    "max_blocks_per_replica",
                    16,
                    1 << 28,
                    1 << 22,
                    "Safety bound on indexed blocks per replica in case removal events are lost; LRU beyond it.",
                ),
            ];
            docs.extend(load_guard_docs(PRECISE_SPREAD_WAIT_TOKENS));
            docs.extend(hashing_docs());
            docs
        }
        "weighted_scorers" => {
            let mut docs = vec![
                float(
                    "prefix_weight",
                    0.0,
                    100.0,
                    // llm-d's example profile weighs prefix 3 against KV usage 2 and queue 2. Behind the load
                    // guard, which keeps a busy owner from queueing, that let KV usage (high where prefixes
                    // are kept) pull sessions off their replica: 76.9 % hits on `bench peers`' gen workload
                    // against 79.4 % at 6, with a lower TTFT p95 too (replay with engine metrics).
                    6.0,
                    "Weight of the prefix-match score (matched share of the prompt).",
                ),
                float(
                    "kv_usage_weight",
                    0.0,
                    100.0,
                    2.0,
                    "Weight of the KV-usage score (1 - reported KV cache usage).",
                ),
                float(
                    "queue_weight",
                    0.0,
                    100.0,
                    2.0,
                    "Weight of the queue score (shorter waiting queue scores higher).",
                ),
                float(
                    "running_weight",
                    0.0,
                    100.0,
                    1.0,
                    "Weight of the running-requests score (fewer scores higher).",
                ),
                integer(
                    "max_queue_depth",
                    1,
                    1_000_000,
                    128,
                    "Filter: replicas reporting more waiting requests than this are dropped.",
                ),
                float(
                    "max_kv_usage",
                    0.0,
                    1.0,
                    0.95,
                    "Filter: replicas reporting KV cache usage above this are dropped.",
                ),
                choice(
                    "prefix_source",
                    vec!["routed", "kv_events"],
                    "routed",
                    "Where prefix matches come from: the router's own routing history, or replicas' KV events.",
                ),
                integer(
                    "max_blocks_per_replica",
                    16,
                    1 << 28,
                    1 << 20,
                    "Prefix-index entries kept per replica; least recently used blocks are evicted beyond it.",
                ),
            ];
            docs.extend(load_guard_docs(DEFAULT_SPREAD_WAIT_TOKENS));
            docs.extend(hashing_docs());
            docs
        }
        _ => Vec::new(),
    }
}

/// Given values over documented defaults; only used after every given value was checked.
struct ResolvedValues<'a> {
    docs: &'a [ParamDoc],
    given: &'a Map<String, Value>,
}

impl ResolvedValues<'_> {
    fn value(&self, name: &str) -> Value {
        self.given.get(name).cloned().unwrap_or_else(|| {
            self.docs
                .iter()
                .find(|doc| doc.name == name)
                .map(|doc| doc.default.clone())
                .unwrap_or(Value::Null)
        })
    }
    fn integer(&self, name: &str) -> i64 {
        self.value(name).as_f64().map_or(0, |v| v as i64)
    }
    fn float(&self, name: &str) -> f64 {
        self.value(name).as_f64().unwrap_or(0.0)
    }
    fn boolean(&self, name: &str) -> bool {
        self.value(name).as_bool().unwrap_or(false)
    }
    fn choice(&self, name: &str) -> String {
        self.value(name).as_str().unwrap_or_default().to_owned()
    }
}

/// A validated policy with typed parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum ResolvedPolicy {
    /// `round_robin`.
    RoundRobin,
    /// `random`.
    Random,
    /// `least_load`.
    LeastLoad(LoadParams),
    /// `power_of_two`.
    PowerOfTwo(LoadParams),
    /// `consistent_hash`.
    ConsistentHash(ConsistentHashParams),
    /// `cache_aware_approx`.
    CacheAwareApprox(CacheAwareParams),
    /// `kv_precise`.
    KvPrecise(KvPreciseParams),
    /// `weighted_scorers`.
    WeightedScorers(WeightedScorersParams),
}

impl ResolvedPolicy {
    /// The policy's name as written in specs.
    pub fn name(&self) -> &'static str {
        match self {
            Self::RoundRobin => "round_robin",
            Self::Random => "random",
            Self::LeastLoad(_) => "least_load",
            Self::PowerOfTwo(_) => "power_of_two",
            Self::ConsistentHash(_) => "consistent_hash",
            Self::CacheAwareApprox(_) => "cache_aware_approx",
            Self::KvPrecise(_) => "kv_precise",
            Self::WeightedScorers(_) => "weighted_scorers",
        }
    }

    /// The load guard's parameters, which exactly the cache-aware policies have (`CACHE_AWARE_POLICY_NAMES`).
    pub fn guard(&self) -> Option<&LoadGuardParams> {
        match self {
            Self::ConsistentHash(p) => Some(&p.guard),
            Self::CacheAwareApprox(p) => Some(&p.guard),
            Self::KvPrecise(p) => Some(&p.guard),
            Self::WeightedScorers(p) => Some(&p.guard),
            Self::RoundRobin | Self::Random | Self::LeastLoad(_) | Self::PowerOfTwo(_) => None,
        }
    }

    /// Whether picks weigh the requests other routers sent (from replicas' fresh metrics) in blocks: the
    /// load guard does, and so does the `wait` load metric.
    pub fn weighs_other_routers(&self) -> bool {
        match self {
            Self::LeastLoad(p) | Self::PowerOfTwo(p) => p.load_metric == LoadMetric::Wait,
            _ => self.guard().is_some(),
        }
    }

    /// How the caller should cut prompts into blocks for this policy (defaults for policies without the parameters).
    pub fn hashing(&self) -> HashingParams {
        match self {
            Self::ConsistentHash(p) => p.hashing,
            Self::CacheAwareApprox(p) => p.hashing,
            Self::KvPrecise(p) => p.hashing,
            Self::WeightedScorers(p) => p.hashing,
            _ => HashingParams::default(),
        }
    }
}

/// How prompts become blocks: see [`crate::hashing`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashingParams {
    /// Tokens per block (token prompts).
    pub block_tokens: usize,
    /// Bytes per block (raw-text prompts).
    pub chunk_bytes: usize,
}

impl Default for HashingParams {
    fn default() -> Self {
        Self { block_tokens: DEFAULT_BLOCK_TOKENS, chunk_bytes: 64 }
    }
}

impl HashingParams {
    fn read(values: &ResolvedValues<'_>) -> Self {
        Self {
            block_tokens: values.integer("block_tokens") as usize,
            chunk_bytes: values.integer("chunk_bytes") as usize,
        }
    }
}

/// What `least_load` and `power_of_two` count as load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadMetric {
    /// Requests routed and not yet completed.
    Requests,
    /// Prompt tokens of requests routed and not yet past their first token.
    PrefillTokens,
    /// The load guard's expected wait, in blocks of prefill: queued prefill (of prompts not cached where
    /// they were routed) plus `decode_wait_weight` per block in decode, other routers' requests included
    /// where metrics are fresh. Unlike a count of requests it tells a long prompt from a short one, and
    /// unlike prompt tokens it sees what a replica's cache saved and what its decoding costs.
    Wait,
}

/// Parameters of `least_load` and `power_of_two`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadParams {
    /// What counts as load.
    pub load_metric: LoadMetric,
    /// With [`LoadMetric::Wait`]: prefill blocks each decoding block adds to the wait.
    pub decode_wait_weight: f64,
}

impl LoadParams {
    /// Outstanding requests as load (the cache-aware policies' fallback when their choice is off balance).
    pub const REQUESTS: Self = Self { load_metric: LoadMetric::Requests, decode_wait_weight: 0.0 };

    fn read(values: &ResolvedValues<'_>) -> Self {
        Self {
            load_metric: match values.choice("load_metric").as_str() {
                "prefill_tokens" => LoadMetric::PrefillTokens,
                "wait" => LoadMetric::Wait,
                _ => LoadMetric::Requests,
            },
            decode_wait_weight: values.float("decode_wait_weight"),
        }
    }
}

/// Parameters of `consistent_hash`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConsistentHashParams {
    /// Ring points per replica.
    pub virtual_nodes: u32,
    /// Bound as a multiple of the mean load.
    pub load_factor: f64,
    /// Blocks of prompt prefix in the key.
    pub prefix_blocks: usize,
    /// Prefer the session key when present.
    pub use_session_key: bool,
    /// The load guard reviewing the ring's choice: the bound counts requests, the guard the prefill queued
    /// behind them, which is what a hot prefix piles onto its ring home.
    pub guard: LoadGuardParams,
    /// Prompt cutting (the key covers the first `prefix_blocks` blocks).
    pub hashing: HashingParams,
}

/// The load guard every cache-aware policy shares (parameters `load_guard`, `spread_wait_tokens` and
/// `decode_wait_weight`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadGuardParams {
    /// Whether the guard reviews picks.
    pub enabled: bool,
    /// How many prompt tokens of prefill later than the soonest replica the policy's choice may start a
    /// request. In tokens, not blocks: the same bound whatever the block size (the router's 16-token
    /// blocks, an engine's 32, a Mooncake trace's 512, 64-byte text chunks).
    pub spread_wait_tokens: u64,
    /// Blocks of prefill one block held by a decoding request counts as in the expected wait.
    pub decode_wait_weight: f64,
}

impl LoadGuardParams {
    fn read(values: &ResolvedValues<'_>) -> Self {
        Self {
            enabled: values.boolean("load_guard"),
            spread_wait_tokens: values.integer("spread_wait_tokens") as u64,
            decode_wait_weight: values.float("decode_wait_weight"),
        }
    }
}

/// Parameters of `cache_aware_approx`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheAwareParams {
    /// Matched share needed to follow the cache.
    pub cache_threshold: f64,
    /// Absolute imbalance threshold (outstanding requests).
    pub balance_abs_threshold: u64,
    /// Relative imbalance threshold.
    pub balance_rel_threshold: f64,
    /// Index bound per replica.
    pub max_blocks_per_replica: usize,
    /// The shared load guard.
    pub guard: LoadGuardParams,
    /// Prompt cutting.
    pub hashing: HashingParams,
}

/// Parameters of `kv_precise`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvPreciseParams {
    /// Weight of prefill blocks.
    pub prefill_weight: f64,
    /// Extra weight of the request's own uncached blocks.
    pub overlap_weight: f64,
    /// Weight of decode blocks.
    pub decode_weight: f64,
    /// Softmax temperature (0 = argmin).
    pub temperature: f64,
    /// Index bound per replica.
    pub max_blocks_per_replica: usize,
    /// The shared load guard.
    pub guard: LoadGuardParams,
    /// Prompt cutting.
    pub hashing: HashingParams,
}

/// Where `weighted_scorers` takes prefix matches from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefixSource {
    /// The router's own routing history (approximate).
    Routed,
    /// The replicas' KV events (precise).
    KvEvents,
}

/// Parameters of `weighted_scorers`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WeightedScorersParams {
    /// Prefix scorer weight.
    pub prefix_weight: f64,
    /// KV usage scorer weight.
    pub kv_usage_weight: f64,
    /// Queue scorer weight.
    pub queue_weight: f64,
    /// Running-requests scorer weight.
    pub running_weight: f64,
    /// Overload filter on waiting requests.
    pub max_queue_depth: u32,
    /// Overload filter on KV usage.
    pub max_kv_usage: f64,
    /// Prefix feed.
    pub prefix_source: PrefixSource,
    /// Index bound per replica.
    pub max_blocks_per_replica: usize,
    /// The shared load guard.
    pub guard: LoadGuardParams,
    /// Prompt cutting.
    pub hashing: HashingParams,
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_the_cache_aware_policies_take_the_load_guards_parameters() {
        for name in POLICY_NAMES {
            let guarded = param_docs(name).iter().any(|doc| doc.name == "load_guard");
            assert_eq!(guarded, CACHE_AWARE_POLICY_NAMES.contains(&name), "{name}");
            let resolved = PolicySpec::named(name).resolve().expect("defaults resolve");
            assert_eq!(resolved.guard().is_some(), guarded, "{name}: the engine's guard() must agree");
        }
    }

    #[test]
    fn default_is_round_robin_and_valid() {
        let spec = PolicySpec::default();
        assert_eq!(spec.policy, "round_robin");
        assert_eq!(spec.resolve(), Ok(ResolvedPolicy::RoundRobin));
    }

    #[test]
    fn yaml_and_json_are_both_read() {
        let yaml: PolicySpec = "schema_version: 1\npolicy: consistent_hash\nparams:\n  load_factor: 1.5\n"
            .parse()
            .expect("yaml parses");
        let json: PolicySpec =
            r#"{"schema_version":1,"policy":"consistent_hash","params":{"load_factor":1.5}}"#
                .parse()
                .expect("json parses");
        assert_eq!(yaml, json);
        let ResolvedPolicy::ConsistentHash(params) = yaml.resolve().expect("valid") else {
            panic!("wrong policy");
        };
        assert_eq!(params.load_factor, 1.5);
        assert_eq!(params.virtual_nodes, 256, "omitted parameters take defaults");
        let round_trip: PolicySpec = yaml.to_yaml().parse().expect("own YAML parses");
        assert_eq!(round_trip, yaml);
        let round_trip: PolicySpec = yaml.to_json().parse().expect("own JSON parses");
        assert_eq!(round_trip, yaml);
    }

    #[test]
    fn out_of_range_names_field_value_range_and_fix() {
        let error =
            PolicySpec::named("consistent_hash").with("load_factor", 0.5).validate().expect_err("invalid");
        let text = error.to_string();
        assert!(text.contains("params.load_factor"), "{text}");
        assert!(text.contains("0.5"), "{text}");
        assert!(text.contains("from 1 to 10"), "{text}");
        assert!(text.contains("default 1.25"), "{text}");
    }

    #[test]
    fn unknown_names_get_suggestions() {
        let error = "policy: kv_precice".parse::<PolicySpec>().expect_err("unknown policy");
        assert!(error.to_string().contains("did you mean kv_precise"), "{error}");
        let error =
            "policy: kv_precise\nparams:\n  temprature: 1\n".parse::<PolicySpec>().expect_err("unknown");
        assert!(error.to_string().contains("params.temprature"), "{error}");
        assert!(error.to_string().contains("did you mean temperature"), "{error}");
        let error = "polcy: random\n".parse::<PolicySpec>().expect_err("unknown top field");
        assert!(error.to_string().contains("did you mean policy"), "{error}");
        let error = PolicySpec::named("round_robin").with("x", 1).validate().expect_err("no params");
        assert!(error.to_string().contains("takes no parameters"), "{error}");
    }

    #[test]
    fn wrong_types_and_versions_are_rejected() {
        let error =
            PolicySpec::named("consistent_hash").with("virtual_nodes", 1.5).validate().expect_err("int");
        assert!(matches!(error, SpecError::WrongType { .. }), "{error}");
        let error =
            PolicySpec::named("least_load").with("load_metric", "tokens").validate().expect_err("choice");
        assert!(error.to_string().contains("one of wait, requests, prefill_tokens"), "{error}");
        let error = "schema_version: 2\npolicy: random\n".parse::<PolicySpec>().expect_err("version");
        assert_eq!(error, SpecError::UnsupportedSchemaVersion { found: 2 });
        assert!(matches!("{".parse::<PolicySpec>(), Err(SpecError::Parse { format: "JSON", .. })));
        // A YAML flow mapping opens with a brace as JSON does, and is a spec all the same.
        let flow = "{policy: least_load, params: {load_metric: requests}}".parse::<PolicySpec>();
        assert_eq!(flow, Ok(PolicySpec::named("least_load").with("load_metric", "requests")));
        assert_eq!("params: {}\n".parse::<PolicySpec>(), Err(SpecError::MissingPolicy));
        let error = PolicySpec::named("weighted_scorers")
            .with("prefix_weight", 0)
            .with("kv_usage_weight", 0)
            .with("queue_weight", 0)
            .with("running_weight", 0)
            .validate()
            .expect_err("all zero");
        assert!(error.to_string().contains("positive weight"), "{error}");
    }

    #[test]
    fn oversized_deep_or_aliased_text_is_refused_before_any_parser_runs() {
        // The attack: `policy: ` and 65,000 `[` took YAML's parser about 14 s (the editor checks on every
        // keystroke). Refused now by the one linear pass, with the limit named.
        let deep = format!("policy: {}", "[".repeat(65_000));
        let started = std::time::Instant::now();
        let error = deep.parse::<PolicySpec>().unwrap_err();
        let refused_in = started.elapsed();
        assert!(matches!(error, SpecError::TooDeep { limit: MAX_SPEC_DEPTH, .. }), "{error}");
        assert!(error.to_string().contains(&format!("more than the {MAX_SPEC_DEPTH}")), "{error}");
        // Limit: 100 ms on a shared 2-core box (measured: well under 1 ms).
        assert!(refused_in < std::time::Duration::from_millis(100), "refused in {refused_in:?}");
        let json_deep = format!("{{\"policy\": {}", "[".repeat(40));
        assert!(matches!(json_deep.parse::<PolicySpec>(), Err(SpecError::TooDeep { .. })));
        let block_deep: String = (0..40).map(|level| format!("{}k{level}:\n", " ".repeat(level))).collect();
        assert!(matches!(block_deep.parse::<PolicySpec>(), Err(SpecError::TooDeep { .. })), "indentation");
        let dashes = format!("policy: x\nparams:\n  {}1\n", "- ".repeat(40));
        assert!(matches!(dashes.parse::<PolicySpec>(), Err(SpecError::TooDeep { .. })), "- - - ...");

        let large = format!("policy: random\n{}", "#".repeat(MAX_SPEC_BYTES));
        let error = large.parse::<PolicySpec>().unwrap_err();
        assert_eq!(error, SpecError::TooLarge { bytes: large.len(), limit: MAX_SPEC_BYTES });
        assert!(error.to_string().contains("65536"), "{error}");

        // A billion laughs stays within both limits; its anchors are refused.
        let laughs =
            "policy: random\na: &a [1, 1, 1, 1, 1, 1, 1, 1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n";
        assert_eq!(laughs.parse::<PolicySpec>(), Err(SpecError::YamlAlias { line: 2 }));

        // Brackets, hashes, ampersands and stars inside quotes and comments are text, not structure.
        let quoted = "policy: random # [[[[[[[[[[[[[[[[[[[[ &x *y\nparams: {}\n";
        assert_eq!(quoted.parse::<PolicySpec>(), Ok(PolicySpec::named("random")));
        let in_strings = format!(
            "{{\"policy\": \"least_load\", \"params\": {{\"load_metric\": \"requests\"}}, \"x\": \"{}&*\"}}",
            "[".repeat(40)
        );
        assert!(matches!(in_strings.parse::<PolicySpec>(), Err(SpecError::UnknownField { .. })));
        // The deepest a real spec goes parses as before.
        let nested = "policy: weighted_scorers\nparams:\n  prefix_weight: 3\n  prefix_source: routed\n";
        assert!(nested.parse::<PolicySpec>().is_ok());
    }

    #[test]
    fn text_within_the_limits_parses_in_bounded_time() {
        // The worst shapes that pass the checks: the deepest flow nesting allowed, repeated up to the size
        // limit, in YAML and JSON; and as many parameters as fit. Each is read (and refused as a spec) fast.
        let nest = |levels: usize| format!("{}{}", "[".repeat(levels), "]".repeat(levels));
        let fill = |unit: &str, room: usize| vec![unit; room / (unit.len() + 2)].join(", ");
        let yaml = format!("policy: [{}]\n", fill(&nest(MAX_SPEC_DEPTH - 2), MAX_SPEC_BYTES - 16));
        let json = format!("{{\"policy\": [{}]}}", fill(&nest(MAX_SPEC_DEPTH - 3), MAX_SPEC_BYTES - 16));
        let mut params = String::from("policy: random\nparams:\n");
        for i in 0.. {
            let line = format!("  k{i}: 1\n");
            if params.len() + line.len() > MAX_SPEC_BYTES {
                break;
            }
            params.push_str(&line);
        }
        for (name, text) in [("yaml", yaml), ("json", json), ("params", params)] {
            assert!(
                text.len() <= MAX_SPEC_BYTES && text.len() > MAX_SPEC_BYTES - 1024,
                "{name}: {}",
                text.len()
            );
            let started = std::time::Instant::now();
            let error = text.parse::<PolicySpec>().unwrap_err();
            let took = started.elapsed();
            assert!(
                !matches!(error, SpecError::TooDeep { .. } | SpecError::TooLarge { .. }),
                "{name}: {error}"
            );
            eprintln!("{name}: {} bytes read in {took:?}", text.len());
            // Limit: 1 s on a shared 2-core box, in a debug build (measured: tens of ms at most).
            assert!(took < std::time::Duration::from_secs(1), "{name} took {took:?}");
        }
    }

    #[test]
    fn every_default_is_within_its_own_range() {
        for policy in POLICY_NAMES {
            assert!(policy_summary(policy).is_some());
            let mut spec = PolicySpec::named(policy);
            for doc in param_docs(policy) {
                doc.check(&doc.default).expect("default in range");
                spec = spec.with(doc.name, doc.default.clone());
            }
            assert_eq!(spec.resolve(), PolicySpec::named(policy).resolve(), "{policy}");
        }
    }
}
