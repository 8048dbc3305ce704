//! A parser for the Prometheus text exposition format (0.0.4) and the OpenMetrics subset
//! engines emit, apart from any I/O.
//!
//! It keeps what signal extraction needs (sample name, labels, value, declared type) and
//! skips what it does not (timestamps, exemplars, HELP text). Every error names the line.
//! Written here rather than taken from a crate because the maintained Rust options either
//! pull a whole client library or reject valid OpenMetrics details (`# EOF`, exemplars).

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

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
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
}

impl Exposition {
    /// Samples named exactly `name`.
    pub fn samples_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// Whether any sample named `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }

    /// Distinct family names seen (declared or sampled), sorted, for "unsupported" reports.
    pub fn family_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.types.keys().cloned().collect();
        names.extend(self.samples.iter().map(|s| s.name.clone()));
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
    #[error("line {line}: {message}: {text:?}")]
    Line { line: usize, message: String, text: String },
}

/// Parses a whole exposition.
pub fn parse(text: &str) -> Result<Exposition, ParseError> {
    if text.len() > MAX_EXPOSITION_BYTES {
        return Err(ParseError::TooLarge { size: text.len(), max: MAX_EXPOSITION_BYTES });
    }
    let mut exposition = Exposition::default();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim_end_matches('\r');
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
            let mut words = comment.split_whitespace();
            match words.next() {
                Some("EOF") => break,
                Some("TYPE") => {
                    let name = words.next().ok_or_else(|| fail("TYPE line without a metric name"))?;
                    let kind = words.next().ok_or_else(|| fail("TYPE line without a type"))?;
                    let kind = parse_type(kind).ok_or_else(|| fail("unknown metric type"))?;
                    exposition.types.insert(name.to_string(), kind);
                }
                _ => {} // HELP, UNIT and free comments carry nothing we need.
            }
            continue;
        }
        exposition.samples.push(parse_sample(trimmed).map_err(|m| fail(m))?);
    }
    Ok(exposition)
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

fn parse_sample(line: &str) -> Result<Sample, &'static str> {
    let name_end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    let name = &line[..name_end];
    if !name.starts_with(is_name_start) {
        return Err("expected a metric name");
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after_brace) = rest.strip_prefix('{') {
        rest = parse_labels(after_brace, &mut labels)?;
    }
    let mut fields = rest.split_whitespace();
    let value = fields.next().ok_or("sample without a value")?;
    let value = parse_value(value).ok_or("sample value is not a number")?;
    // An optional timestamp, then an optional OpenMetrics exemplar (`# {...} v [ts]`).
    match fields.next() {
        None | Some("#") => {}
        Some(timestamp) if timestamp.parse::<f64>().is_ok() => {
            if fields.next().is_some_and(|f| f != "#") {
                return Err("unexpected text after the timestamp");
            }
        }
        Some(_) => return Err("unexpected text after the value"),
    }
    Ok(Sample { name: name.to_string(), labels, value })
}

/// Parses `k="v",...}` and returns what follows the closing brace.
fn parse_labels<'a>(mut rest: &'a str, labels: &mut Vec<(String, String)>) -> Result<&'a str, &'static str> {
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Ok(after);
        }
        let key_end = rest.find(|c: char| !is_name_char(c)).unwrap_or(rest.len());
        if key_end == 0 {
            return Err("expected a label name");
        }
        let key = &rest[..key_end];
        rest = rest[key_end..].trim_start().strip_prefix('=').ok_or("expected '=' after a label name")?;
        rest = rest.trim_start().strip_prefix('"').ok_or("label value must be quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("unterminated label value"),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, other)) => {
                        value.push('\\');
                        value.push(other);
                    }
                    None => return Err("unterminated label value"),
                },
                Some((_, c)) => value.push(c),
            }
        };
        labels.push((key.to_string(), value));
        rest = rest[end + 1..].trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err("expected ',' or '}' after a label");
        }
    }
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_types_labels_escapes_and_special_values() {
        let text = "# HELP x_total Help with \"quotes\".\n# TYPE x_total counter\n\
                    x_total{a=\"1\",b=\"q\\\"uote\\\\back\\nline\"} 3.5 1700000000000\n\
                    y +Inf\nz{} NaN\nh_bucket{le=\"+Inf\"} 4 # {trace_id=\"abc\"} 1.2\n# EOF\nignored here";
        let exp = parse(text).unwrap();
        assert_eq!(exp.types["x_total"], MetricType::Counter);
        assert_eq!(exp.samples.len(), 4);
        let x = &exp.samples[0];
        assert_eq!(x.value, 3.5);
        assert_eq!(x.label("b"), Some("q\"uote\\back\nline"));
        assert!(exp.samples[1].value.is_infinite());
        assert!(exp.samples[2].value.is_nan());
        assert_eq!(exp.samples[3].label("le"), Some("+Inf"));
    }

    #[test]
    fn errors_name_the_line() {
        let err = parse("ok 1\n<html>bad</html>\n").unwrap_err();
        let ParseError::Line { line, .. } = &err else { panic!("{err}") };
        assert_eq!(*line, 2);
        assert!(err.to_string().contains("line 2"));
        assert!(parse("x{a=\"unterminated} 1").is_err());
        assert!(parse("x 1 2 3").is_err());
        assert!(parse("x abc").is_err());
        assert!(parse("# TYPE x sideways").is_err());
    }

    #[test]
    fn family_names_are_sorted_and_unique() {
        let exp = parse("# TYPE b gauge\nb 1\na 2\n").unwrap();
        assert_eq!(exp.family_names(), ["a", "b"]);
    }
}
