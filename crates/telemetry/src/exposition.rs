//! A parser for the Prometheus text exposition format (0.0.4) and OpenMetrics 1.0 text, apart
//! from any I/O.
//!
//! It reads what engines emit: `# HELP` (unescaped), `# TYPE`, `# UNIT`, escaped label values,
//! `+Inf` / `-Inf` / `NaN`, optional timestamps, OpenMetrics exemplars (`# {labels} value
//! [timestamp]`, validated and kept), `_created` series (kept as samples and tied to their
//! family by [`Exposition::family_of`]), and `# EOF` (nothing after it is read). Input is capped
//! at [`MAX_EXPOSITION_BYTES`]. Every error names the line, says what was expected, and quotes
//! the line, so an operator can find the fault in the engine's output.
//!
//! Written here rather than taken from a crate because the maintained Rust options either pull
//! a whole client library (`prometheus`, `prometheus-client` are for *producing* metrics) or
//! reject details engines really emit (`# EOF`, exemplars, Python's `_created` gauges beside a
//! counter family). It is fuzzed (`crates/telemetry/fuzz`, target `parse`).

use std::collections::HashMap;

/// Largest exposition accepted; the scraper enforces the same cap on the wire.
pub const MAX_EXPOSITION_BYTES: usize = 16 * 1024 * 1024;

/// A metric family's declared type (`# TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
    Info,
    StateSet,
    GaugeHistogram,
}

/// An OpenMetrics exemplar attached to a sample (`# {trace_id="..."} 0.5 1700000000.1`).
#[derive(Debug, Clone, PartialEq)]
pub struct Exemplar {
    pub labels: Vec<(String, String)>,
    pub value: f64,
    pub timestamp: Option<f64>,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
    /// As written: milliseconds in the Prometheus format, seconds in OpenMetrics.
    pub timestamp: Option<f64>,
    pub exemplar: Option<Box<Exemplar>>,
}

impl Sample {
    /// The value of label `name`, if present.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// A parsed exposition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    /// Declared types by family name, as written after `# TYPE`.
    pub types: HashMap<String, MetricType>,
    /// Help texts by family name, unescaped.
    pub help: HashMap<String, String>,
    /// Sample indices by sample name, so lookups do not scan every line.
    by_name: HashMap<String, Vec<usize>>,
}

/// Suffixes a family's samples may carry, longest first so `_gcount` wins over `_count`.
const SAMPLE_SUFFIXES: [&str; 9] =
    ["_created", "_gcount", "_bucket", "_total", "_count", "_gsum", "_info", "_sum", ""];

impl Exposition {
    /// Samples named exactly `name`.
    pub fn samples_named<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a Sample> + 'a {
        let indices = self.by_name.get(name).map(Vec::as_slice).unwrap_or(&[]);
        indices.iter().map(|&i| &self.samples[i])
    }

    /// Whether any sample named `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Whether any sample name starts with `prefix`.
    pub fn has_prefix(&self, prefix: &str) -> bool {
        self.by_name.keys().any(|name| name.starts_with(prefix))
    }

    /// Distinct sample names, in no particular order.
    pub fn sample_names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// The family a sample name belongs to: `x_total`, `x_created`, `x_bucket`... map to `x`
    /// when `x` is declared with a type that has that suffix; otherwise the name itself.
    pub fn family_of<'a>(&self, sample_name: &'a str) -> &'a str {
        for suffix in SAMPLE_SUFFIXES {
            let Some(base) = sample_name.strip_suffix(suffix) else { continue };
            if suffix.is_empty() {
                break;
            }
            let fits = match self.types.get(base) {
                Some(MetricType::Counter) => matches!(suffix, "_total" | "_created"),
                Some(MetricType::Histogram) => matches!(suffix, "_bucket" | "_count" | "_sum" | "_created"),
                Some(MetricType::Summary) => matches!(suffix, "_count" | "_sum" | "_created"),
                Some(MetricType::GaugeHistogram) => matches!(suffix, "_bucket" | "_gcount" | "_gsum"),
                Some(MetricType::Info) => suffix == "_info",
                _ => false,
            };
            if fits {
                return base;
            }
        }
        sample_name
    }

    /// Distinct family names seen (declared or sampled), sorted, for "unsupported" reports.
    /// `_created` series and a counter's `_total` fold into their family's name.
    pub fn family_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.types.keys().cloned().collect();
        names.extend(self.by_name.keys().map(|n| self.family_of(n).to_string()));
        names.sort();
        names.dedup();
        names
    }
}

/// Why an exposition could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("exposition is {size} bytes, over the {max}-byte limit")]
    TooLarge { size: usize, max: usize },
    /// `text` (the start of the offending line) is kept for logs and tests but left out of the
    /// message: the message reaches the UI, and a body fetched from an operator-typed URL must never
    /// be echoed back through it.
    #[error("line {line}: {message}")]
    Line { line: usize, message: String, text: String },
}

/// Parses a whole exposition.
pub fn parse(text: &str) -> Result<Exposition, ParseError> {
    parse_families(text, |_| true)
}

/// Parses only the sample lines, and the TYPE lines, of the metric names `keep` accepts (a histogram's
/// `_bucket`, `_sum` and `_count` are names of their own); other lines are skipped after reading their
/// name. For readers that need a few families of a large exposition, again and again.
pub fn parse_families(text: &str, keep: impl Fn(&str) -> bool) -> Result<Exposition, ParseError> {
    if text.len() > MAX_EXPOSITION_BYTES {
        return Err(ParseError::TooLarge { size: text.len(), max: MAX_EXPOSITION_BYTES });
    }
    let mut exposition = Exposition::default();
    for (index, raw) in text.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let fail = |message: &str| ParseError::Line {
            line: index + 1,
            message: message.to_string(),
            text: line.chars().take(120).collect(),
        };
        let trimmed = line.trim_start();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            if !keep(comment_name(comment)) && comment.trim() != "EOF" {
                continue;
            }
            if parse_comment(comment, &mut exposition).map_err(fail)? == Comment::Eof {
                break;
            }
            continue;
        }
        if !keep(sample_name(trimmed)) {
            continue;
        }
        let sample = parse_sample(trimmed).map_err(fail)?;
        let at = exposition.samples.len();
        match exposition.by_name.get_mut(sample.name.as_str()) {
            Some(indices) => indices.push(at),
            None => {
                exposition.by_name.insert(sample.name.clone(), vec![at]);
            }
        }
        exposition.samples.push(sample);
    }
    Ok(exposition)
}

/// The metric name a sample line starts with (before its labels or value), unchecked.
fn sample_name(line: &str) -> &str {
    line.split(['{', ' ', '\t']).next().unwrap_or(line)
}

/// The metric name of a `# TYPE name ...` or `# HELP name ...` comment, unchecked ("" for other comments).
fn comment_name(comment: &str) -> &str {
    let mut words = comment.split_whitespace();
    match words.next() {
        Some("TYPE" | "HELP" | "UNIT") => words.next().unwrap_or(""),
        _ => "",
    }
}

#[derive(PartialEq)]
enum Comment {
    Eof,
    Other,
}

fn parse_comment(comment: &str, exposition: &mut Exposition) -> Result<Comment, &'static str> {
    let comment = comment.trim_start();
    let (keyword, rest) = comment.split_once([' ', '\t']).unwrap_or((comment, ""));
    match keyword {
        "EOF" if rest.trim().is_empty() => return Ok(Comment::Eof),
        "TYPE" => {
            let mut words = rest.split_whitespace();
            let name = words.next().ok_or("TYPE line without a metric name")?;
            check_metric_name(name)?;
            let kind = words.next().ok_or("TYPE line without a type (counter, gauge, histogram, ...)")?;
            let kind = parse_type(kind).ok_or("unknown metric type (expected counter, gauge, histogram, summary, untyped, info, stateset or gaugehistogram)")?;
            if words.next().is_some() {
                return Err("unexpected text after the TYPE line's type");
            }
            exposition.types.insert(name.to_string(), kind);
        }
        "HELP" => {
            let rest = rest.trim_start();
            let (name, help) = rest.split_once([' ', '\t']).unwrap_or((rest, ""));
            if name.is_empty() {
                return Err("HELP line without a metric name");
            }
            check_metric_name(name)?;
            exposition.help.insert(name.to_string(), unescape_help(help));
        }
        // UNIT and free-form comments carry nothing signals need.
        _ => {}
    }
    Ok(Comment::Other)
}

fn check_metric_name(name: &str) -> Result<(), &'static str> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(is_name_start) && chars.all(is_name_char);
    if valid { Ok(()) } else { Err("invalid metric name (expected [a-zA-Z_:][a-zA-Z0-9_:]*)") }
}

fn unescape_help(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (c, chars.clone().next()) {
            ('\\', Some('n')) => {
                out.push('\n');
                chars.next();
            }
            ('\\', Some('\\')) => {
                out.push('\\');
                chars.next();
            }
            ('\\', Some('"')) => {
                out.push('"');
                chars.next();
            }
            _ => out.push(c),
        }
    }
    out
}

fn parse_type(word: &str) -> Option<MetricType> {
    Some(match word {
        "counter" => MetricType::Counter,
        "gauge" => MetricType::Gauge,
        "histogram" => MetricType::Histogram,
        "summary" => MetricType::Summary,
        "untyped" | "unknown" => MetricType::Untyped,
        "info" => MetricType::Info,
        "stateset" => MetricType::StateSet,
        "gaugehistogram" => MetricType::GaugeHistogram,
        _ => return None,
    })
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

fn is_label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn parse_sample(line: &str) -> Result<Sample, &'static str> {
    let name_end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    let name = &line[..name_end];
    if !name.starts_with(is_name_start) {
        return Err("expected a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*) at the start of the line");
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after_brace) = rest.strip_prefix('{') {
        rest = parse_labels(after_brace, &mut labels)?;
    }
    if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
        return Err("expected a space between the metric name or labels and the value");
    }
    // The exemplar starts at the first `#` outside label values, which all lie before `rest`.
    let (main, exemplar) = match rest.split_once('#') {
        Some((main, exemplar)) => (main, Some(exemplar)),
        None => (rest, None),
    };
    let mut fields = main.split_whitespace();
    let value = fields.next().ok_or("sample without a value")?;
    let value = parse_value(value).ok_or("sample value is not a number (nor +Inf, -Inf, NaN)")?;
    let timestamp = match fields.next() {
        None => None,
        Some(ts) => Some(parse_timestamp(ts).ok_or("unexpected text after the value (not a timestamp)")?),
    };
    if fields.next().is_some() {
        return Err("unexpected text after the timestamp");
    }
    let exemplar = exemplar.map(parse_exemplar).transpose()?.map(Box::new);
    Ok(Sample { name: name.to_string(), labels, value, timestamp, exemplar })
}

fn parse_exemplar(text: &str) -> Result<Exemplar, &'static str> {
    let text = text.trim_start();
    let after_brace = text.strip_prefix('{').ok_or("exemplar must start with '{' after '#'")?;
    let mut labels = Vec::new();
    let rest = parse_labels(after_brace, &mut labels)?;
    let mut fields = rest.split_whitespace();
    let value = fields.next().ok_or("exemplar without a value")?;
    let value = parse_value(value).ok_or("exemplar value is not a number")?;
    let timestamp = match fields.next() {
        None => None,
        Some(ts) => Some(parse_timestamp(ts).ok_or("exemplar timestamp is not a number")?),
    };
    if fields.next().is_some() {
        return Err("unexpected text after the exemplar");
    }
    Ok(Exemplar { labels, value, timestamp })
}

/// Parses `k="v",...}` and returns what follows the closing brace.
fn parse_labels<'a>(mut rest: &'a str, labels: &mut Vec<(String, String)>) -> Result<&'a str, &'static str> {
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Ok(after);
        }
        let key_end = rest.find(|c: char| !is_label_char(c)).unwrap_or(rest.len());
        if key_end == 0 || rest.starts_with(|c: char| c.is_ascii_digit()) {
            return Err("expected a label name ([a-zA-Z_][a-zA-Z0-9_]*) or '}'");
        }
        let key = &rest[..key_end];
        rest = rest[key_end..].trim_start().strip_prefix('=').ok_or("expected '=' after a label name")?;
        rest = rest.trim_start().strip_prefix('"').ok_or("label value must be in double quotes")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("unterminated label value (missing closing '\"')"),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, other)) => {
                        value.push('\\');
                        value.push(other);
                    }
                    None => return Err("unterminated label value (missing closing '\"')"),
                },
                Some((_, c)) => value.push(c),
            }
        };
        if labels.iter().any(|(k, _)| k == key) {
            return Err("the same label name appears twice");
        }
        labels.push((key.to_string(), value));
        rest = rest[end + 1..].trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err("expected ',' or '}' after a label value");
        }
    }
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        // Rust also accepts "infinity" and the like; the formats do not.
        _ if text.bytes().any(|b| b.is_ascii_alphabetic() && !matches!(b, b'e' | b'E')) => None,
        _ => text.parse().ok(),
    }
}

fn parse_timestamp(text: &str) -> Option<f64> {
    parse_value(text).filter(|t| t.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_types_labels_escapes_and_special_values() {
        let text = "# HELP x_total Help with \\\\ and \\n.\n# TYPE x_total counter\n\
                    x_total{a=\"1\",b=\"q\\\"uote\\\\back\\nline\"} 3.5 1700000000000\n\
                    y +Inf\nz{} NaN\nh_bucket{le=\"+Inf\"} 4 # {trace_id=\"abc\"} 1.2 1700000000.5\n\
                    # EOF\nignored here";
        let exp = parse(text).unwrap();
        assert_eq!(exp.types["x_total"], MetricType::Counter);
        assert_eq!(exp.help["x_total"], "Help with \\ and \n.");
        assert_eq!(exp.samples.len(), 4);
        let x = &exp.samples[0];
        assert_eq!(x.value, 3.5);
        assert_eq!(x.timestamp, Some(1_700_000_000_000.0));
        assert_eq!(x.label("b"), Some("q\"uote\\back\nline"));
        assert!(exp.samples[1].value.is_infinite());
        assert!(exp.samples[2].value.is_nan());
        let h = &exp.samples[3];
        assert_eq!(h.label("le"), Some("+Inf"));
        let exemplar = h.exemplar.as_deref().unwrap();
        assert_eq!((exemplar.value, exemplar.timestamp), (1.2, Some(1_700_000_000.5)));
        assert_eq!(exemplar.labels, [("trace_id".to_string(), "abc".to_string())]);
    }

    #[test]
    fn a_hash_inside_a_label_value_is_not_an_exemplar() {
        let exp = parse("x{path=\"/a#b\"} 1\n").unwrap();
        assert_eq!(exp.samples[0].label("path"), Some("/a#b"));
        assert!(exp.samples[0].exemplar.is_none());
    }

    #[test]
    fn errors_name_the_line() {
        let err = parse("ok 1\n<html>bad</html>\n").unwrap_err();
        let ParseError::Line { line, .. } = &err else { panic!("{err}") };
        assert_eq!(*line, 2);
        assert!(err.to_string().contains("line 2"));
        for bad in [
            "x{a=\"unterminated} 1",
            "x 1 2 3",
            "x abc",
            "x infinity",
            "# TYPE x sideways",
            "x{a=\"1\",a=\"2\"} 1",
            "x{1a=\"1\"} 1",
            "x 1 # trace 1",
            "x{a=\"1\"}1",
            "# TYPE 9x gauge",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn oversized_input_is_refused_before_parsing() {
        let text = "x 1\n".repeat(MAX_EXPOSITION_BYTES / 4 + 1);
        assert!(matches!(parse(&text), Err(ParseError::TooLarge { .. })));
    }

    #[test]
    fn created_and_total_series_belong_to_their_family() {
        let exp = parse(
            "# TYPE c counter\nc_total 1\nc_created 1.7e9\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\n\
             h_count 1\nh_sum 0.5\nh_created 1.7e9\n# TYPE g gauge\ng_created 3\n",
        )
        .unwrap();
        assert_eq!(exp.family_of("c_total"), "c");
        assert_eq!(exp.family_of("c_created"), "c");
        assert_eq!(exp.family_of("h_bucket"), "h");
        assert_eq!(exp.family_of("h_created"), "h");
        // A gauge that happens to end in _created is its own family.
        assert_eq!(exp.family_of("g_created"), "g_created");
        assert_eq!(exp.family_names(), ["c", "g", "g_created", "h"]);
    }

    #[test]
    fn family_names_are_sorted_and_unique() {
        let exp = parse("# TYPE b gauge\nb 1\na 2\n").unwrap();
        assert_eq!(exp.family_names(), ["a", "b"]);
        assert!(exp.has("a") && exp.has_prefix("b") && !exp.has("c"));
    }
}
