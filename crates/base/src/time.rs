//! The wall clock in Unix milliseconds, the unit of every timestamp the history and the UI carry.

use std::time::{SystemTime, UNIX_EPOCH};

/// `at` in milliseconds since the Unix epoch: 0 for a time before it, `i64::MAX` past what fits.
pub fn unix_ms(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)).unwrap_or(0)
}

/// Now, in milliseconds since the Unix epoch. Only the edges (background tasks, commands) read the
/// clock; pure code takes the time as an argument.
pub fn unix_ms_now() -> i64 {
    unix_ms(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn times_convert_to_unix_milliseconds() {
        assert_eq!(unix_ms(UNIX_EPOCH + Duration::from_millis(1_733_000_000_123)), 1_733_000_000_123);
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0, "before the epoch");
        assert!(unix_ms_now() > 1_700_000_000_000);
    }
}
