//! The fleet overview's pure parts: which signal colours the tiles, the heat scale, sorting
//! and filtering. Host-tested; the view only wires them to the DOM.

use fleetdeck_api::{ReplicaRow, ScrapeState};

use crate::format;

/// The signal that colours the tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TileSignal {
    /// Prefix hit rate as heat: hot = many hits.
    #[default]
    HitRate,
    QueueDepth,
    KvUsage,
    TtftP95,
}

impl TileSignal {
    pub const ALL: [TileSignal; 4] =
        [TileSignal::HitRate, TileSignal::QueueDepth, TileSignal::KvUsage, TileSignal::TtftP95];

    pub fn slug(self) -> &'static str {
        match self {
            TileSignal::HitRate => "hit_rate",
            TileSignal::QueueDepth => "queue_depth",
            TileSignal::KvUsage => "kv_usage",
            TileSignal::TtftP95 => "ttft_p95",
        }
    }

    pub fn from_slug(slug: &str) -> TileSignal {
        TileSignal::ALL.into_iter().find(|s| s.slug() == slug).unwrap_or_default()
    }

    pub fn label(self) -> &'static str {
        match self {
            TileSignal::HitRate => "Prefix hit rate",
            TileSignal::QueueDepth => "Queue depth",
            TileSignal::KvUsage => "KV usage",
            TileSignal::TtftP95 => "TTFT p95",
        }
    }

    /// The row's value of this signal.
    pub fn value(self, row: &ReplicaRow) -> Option<f64> {
        let s = &row.signals;
        match self {
            TileSignal::HitRate => s.hit_rate,
            TileSignal::QueueDepth => s.queue_depth,
            TileSignal::KvUsage => s.kv_usage,
            TileSignal::TtftP95 => s.ttft_p95_s,
        }
        .filter(|v| v.is_finite())
    }

    /// The value as the tile prints it.
    pub fn text(self, row: &ReplicaRow) -> String {
        let v = self.value(row);
        match self {
            TileSignal::HitRate | TileSignal::KvUsage => format::percent(v),
            TileSignal::QueueDepth => format::count(v),
            TileSignal::TtftP95 => format::duration_s(v),
        }
    }

    /// Where `value` sits on the colour scale, 0..=1. Ratios are absolute; queue depth and
    /// TTFT are relative to the fleet's largest value (`max`), so the worst replica stands out.
    pub fn level(self, value: f64, max: f64) -> f64 {
        let level = match self {
            TileSignal::HitRate | TileSignal::KvUsage => value,
            TileSignal::QueueDepth | TileSignal::TtftP95 => {
                if max > 0.0 {
                    value / max
                } else {
                    0.0
                }
            }
        };
        level.clamp(0.0, 1.0)
    }
}

/// The fleet's largest value of `signal` (the scale's top for relative signals).
pub fn fleet_max(rows: &[ReplicaRow], signal: TileSignal) -> f64 {
    rows.iter().filter_map(|r| signal.value(r)).fold(0.0, f64::max)
}

/// A tile's background for `level` in 0..=1: cool blue through yellow to hot red, readable
/// with dark text at every step. Quantised to 10 steps so nearby values share a colour and a
/// small wobble does not restyle a tile.
pub fn heat_colour(level: f64) -> &'static str {
    const STEPS: [&str; 11] = [
        "#dbe9f6", "#c6dbef", "#c7e9c0", "#d9f0a3", "#f7fcb9", "#fee391", "#fec44f", "#fdae6b", "#fc9272",
        "#fb6a4a", "#ef3b2c",
    ];
    let level = if level.is_finite() { level.clamp(0.0, 1.0) } else { 0.0 };
    STEPS[(level * 10.0).round() as usize]
}

/// How tiles are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortBy {
    /// The order replicas were added.
    #[default]
    Added,
    /// Highest value of the colouring signal first (missing values last).
    SignalDesc,
    /// Lowest first.
    SignalAsc,
    /// By URL.
    Name,
}

impl SortBy {
    pub const ALL: [SortBy; 4] = [SortBy::Added, SortBy::SignalDesc, SortBy::SignalAsc, SortBy::Name];

    pub fn slug(self) -> &'static str {
        match self {
            SortBy::Added => "added",
            SortBy::SignalDesc => "signal_desc",
            SortBy::SignalAsc => "signal_asc",
            SortBy::Name => "name",
        }
    }

    pub fn from_slug(slug: &str) -> SortBy {
        SortBy::ALL.into_iter().find(|s| s.slug() == slug).unwrap_or_default()
    }

    pub fn label(self) -> &'static str {
        match self {
            SortBy::Added => "as added",
            SortBy::SignalDesc => "highest first",
            SortBy::SignalAsc => "lowest first",
            SortBy::Name => "by URL",
        }
    }
}

/// Whether `row` matches the filter text (case-insensitive, in URL, engine or model; every
/// word must match) and, when `errors_only`, is failing.
pub fn matches(row: &ReplicaRow, filter: &str, errors_only: bool) -> bool {
    if errors_only && !matches!(row.scrape, ScrapeState::Error { .. }) {
        return false;
    }
    let haystack =
        format!("{} {} {}", row.url, row.engine.as_deref().unwrap_or(""), row.model.as_deref().unwrap_or(""))
            .to_lowercase();
    filter.split_whitespace().all(|word| haystack.contains(&word.to_lowercase()))
}

/// Ids of the rows to show, filtered and in order.
pub fn visible_ids(
    rows: &[ReplicaRow],
    signal: TileSignal,
    sort: SortBy,
    filter: &str,
    errors_only: bool,
) -> Vec<u32> {
    let mut shown: Vec<&ReplicaRow> = rows.iter().filter(|r| matches(r, filter, errors_only)).collect();
    match sort {
        SortBy::Added => shown.sort_by_key(|r| r.id),
        SortBy::Name => shown.sort_by(|a, b| a.url.cmp(&b.url)),
        SortBy::SignalDesc | SortBy::SignalAsc => {
            let desc = sort == SortBy::SignalDesc;
            shown.sort_by(|a, b| match (signal.value(a), signal.value(b)) {
                (Some(x), Some(y)) => {
                    let order = x.total_cmp(&y);
                    (if desc { order.reverse() } else { order }).then(a.id.cmp(&b.id))
                }
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => a.id.cmp(&b.id),
            });
        }
    }
    shown.into_iter().map(|r| r.id).collect()
}

#[cfg(test)]
mod tests {
    use fleetdeck_api::Signals;

    use super::*;

    fn row(id: u32, url: &str, hit: Option<f64>, error: bool) -> ReplicaRow {
        ReplicaRow {
            id,
            url: url.into(),
            engine: Some("vllm".into()),
            model: Some("Llama".into()),
            signals: Signals { hit_rate: hit, queue_depth: Some(f64::from(id)), ..Signals::default() },
            scrape: if error {
                ScrapeState::Error { message: "down".into(), last_good_ms: None }
            } else {
                ScrapeState::Ok { last_good_ms: 1 }
            },
            tokens_per_s: None,
        }
    }

    #[test]
    fn sorting_by_signal_puts_missing_values_last() {
        let rows = [row(0, "c", Some(0.2), false), row(1, "a", None, false), row(2, "b", Some(0.9), false)];
        assert_eq!(visible_ids(&rows, TileSignal::HitRate, SortBy::SignalDesc, "", false), [2, 0, 1]);
        assert_eq!(visible_ids(&rows, TileSignal::HitRate, SortBy::SignalAsc, "", false), [0, 2, 1]);
        assert_eq!(visible_ids(&rows, TileSignal::HitRate, SortBy::Name, "", false), [1, 2, 0]);
        assert_eq!(visible_ids(&rows, TileSignal::HitRate, SortBy::Added, "", false), [0, 1, 2]);
    }

    #[test]
    fn filters_match_every_word_anywhere_and_errors_only() {
        let rows = [row(0, "http://gpu-1:8000", Some(0.1), false), row(1, "http://gpu-2:8000", None, true)];
        assert_eq!(visible_ids(&rows, TileSignal::HitRate, SortBy::Added, "GPU-2", false), [1]);
        assert_eq!(visible_ids(&rows, TileSignal::HitRate, SortBy::Added, "vllm llama", false), [0, 1]);
        assert_eq!(
            visible_ids(&rows, TileSignal::HitRate, SortBy::Added, "sglang", false),
            Vec::<u32>::new()
        );
        assert_eq!(visible_ids(&rows, TileSignal::HitRate, SortBy::Added, "", true), [1]);
    }

    #[test]
    fn levels_and_colours() {
        assert_eq!(TileSignal::QueueDepth.level(5.0, 10.0), 0.5);
        assert_eq!(TileSignal::QueueDepth.level(5.0, 0.0), 0.0);
        assert_eq!(TileSignal::HitRate.level(1.7, 0.0), 1.0);
        assert_eq!(heat_colour(0.0), "#dbe9f6");
        assert_eq!(heat_colour(1.0), "#ef3b2c");
        assert_eq!(heat_colour(f64::NAN), heat_colour(0.0));
        assert_eq!(heat_colour(0.51), heat_colour(0.49), "quantised");
        let rows = [row(3, "a", None, false), row(7, "b", None, false)];
        assert_eq!(fleet_max(&rows, TileSignal::QueueDepth), 7.0);
    }

    #[test]
    fn slugs_round_trip() {
        for s in TileSignal::ALL {
            assert_eq!(TileSignal::from_slug(s.slug()), s);
        }
        for s in SortBy::ALL {
            assert_eq!(SortBy::from_slug(s.slug()), s);
        }
        let r = row(0, "a", Some(0.5), false);
        assert_eq!(TileSignal::HitRate.text(&r), "50.0%");
        assert_eq!(TileSignal::KvUsage.text(&r), "—");
    }
}
