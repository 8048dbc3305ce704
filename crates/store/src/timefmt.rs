//! RFC 3339 times and `FROM..TO` windows as operators type them, to and from Unix ms.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// An example operators can copy when a time does not parse.
pub const EXAMPLE_RANGE: &str = "2025-06-01T12:00:00Z..2025-06-01T18:00:00Z";

/// A half-open span of time, `[from_ms, to_ms)`, in Unix milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWindow {
    pub from_ms: i64,
    pub to_ms: i64,
}

/// Why a time or a window given on the command line is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    #[error("{flag} {given:?} is not a window: write FROM..TO with two RFC 3339 times, e.g. {EXAMPLE_RANGE}")]
    NoSeparator { flag: String, given: String },
    #[error(
        "{flag} {given:?}: {part} {value:?} is not an RFC 3339 time ({reason}); write it like 2025-06-01T12:00:00Z or 2025-06-01T14:00:00+02:00, e.g. {flag} {EXAMPLE_RANGE}"
    )]
    NotRfc3339 { flag: String, given: String, part: &'static str, value: String, reason: String },
    #[error("{flag} {given:?}: FROM must be before TO, e.g. {flag} {EXAMPLE_RANGE}")]
    Reversed { flag: String, given: String },
}

/// Parses one RFC 3339 time into Unix milliseconds.
pub fn parse_rfc3339(value: &str) -> Result<i64, String> {
    let at = OffsetDateTime::parse(value.trim(), &Rfc3339).map_err(|e| e.to_string())?;
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).map_err(|_| "out of range".to_string())
}

/// Formats Unix milliseconds as RFC 3339 in UTC (e.g. `2025-06-01T12:00:00Z`).
pub fn format_rfc3339(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|at| at.format(&Rfc3339).ok())
        .unwrap_or_else(|| format!("{ms} ms since the Unix epoch"))
}

/// Parses `FROM..TO` given to `flag` (named in errors so the operator knows which to fix).
pub fn parse_range(flag: &str, given: &str) -> Result<TimeWindow, TimeError> {
    // RFC 3339 fractions use a single dot, so ".." can only be the separator.
    let Some((from, to)) = given.split_once("..") else {
        return Err(TimeError::NoSeparator { flag: flag.into(), given: given.into() });
    };
    let part = |part: &'static str, value: &str| {
        parse_rfc3339(value).map_err(|reason| TimeError::NotRfc3339 {
            flag: flag.into(),
            given: given.into(),
            part,
            value: value.into(),
            reason,
        })
    };
    let window = TimeWindow { from_ms: part("FROM", from)?, to_ms: part("TO", to)? };
    if window.from_ms >= window.to_ms {
        return Err(TimeError::Reversed { flag: flag.into(), given: given.into() });
    }
    Ok(window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_with_offsets_and_fractions() {
        let w = parse_range("--a", "2025-06-01T12:00:00Z..2025-06-01T14:00:00.5+02:00").unwrap();
        assert_eq!(w.to_ms - w.from_ms, 500);
        assert_eq!(format_rfc3339(w.from_ms), "2025-06-01T12:00:00Z");
    }

    #[test]
    fn bad_ranges_say_which_part_is_wrong_and_show_an_example() {
        let err = parse_range("--b", "2025-06-01T12:00:00Z..yesterday").unwrap_err().to_string();
        assert!(
            err.contains("--b") && err.contains("TO \"yesterday\"") && err.contains(EXAMPLE_RANGE),
            "{err}"
        );
        let err = parse_range("--a", "2025-06-01 12:00..2025-06-01T14:00:00Z").unwrap_err().to_string();
        assert!(err.contains("FROM \"2025-06-01 12:00\""), "{err}");
        let err = parse_range("--a", "2025-06-01T12:00:00Z").unwrap_err().to_string();
        assert!(err.contains("FROM..TO"), "{err}");
        let err = parse_range("--a", "2025-06-02T00:00:00Z..2025-06-01T00:00:00Z").unwrap_err().to_string();
        assert!(err.contains("FROM must be before TO"), "{err}");
    }
}
