//! Pure text formatting for the fleet view: numbers, percentages, latencies and clock times.
//!
//! Kept free of browser APIs so the exact strings operators read are unit-tested on the host.
//! Every formatter maps `None` to [`NOT_PROVIDED`], because "the engine does not export this"
//! must never look like a measured zero.

/// What a cell shows when the signal is missing (not exported, or not yet scraped).
pub const NOT_PROVIDED: &str = "—";

/// A count such as queue depth or running requests. Gauges are usually integral; when the
/// engine reports a fractional value (an average), one decimal keeps it honest.
pub fn count(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => {
            if (v - v.round()).abs() < 1e-9 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        }
        _ => NOT_PROVIDED.to_owned(),
    }
}

/// A ratio in 0..=1 shown as a percentage with one decimal (KV usage, prefix hit rate).
pub fn percent(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{:.1}%", v * 100.0),
        _ => NOT_PROVIDED.to_owned(),
    }
}

/// A latency given in seconds, with the unit that keeps 2–3 significant digits readable:
/// milliseconds below one second, seconds above.
pub fn duration_s(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => {
            let ms = v * 1000.0;
            if ms.abs() < 10.0 {
                format!("{ms:.1} ms")
            } else if ms.abs() < 999.5 {
                format!("{ms:.0} ms")
            } else if v.abs() < 10.0 {
                format!("{v:.2} s")
            } else {
                format!("{v:.1} s")
            }
        }
        _ => NOT_PROVIDED.to_owned(),
    }
}

/// A throughput such as tokens per second: `850`, `12.5`, `3.4k`.
pub fn rate(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => {
            if v.abs() >= 1000.0 {
                format!("{:.1}k", v / 1000.0)
            } else if v.abs() >= 10.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        }
        _ => NOT_PROVIDED.to_owned(),
    }
}

/// Short axis-tick label for seconds (the chart's y axis), without trailing noise.
pub fn axis_seconds(v: f64) -> String {
    if v == 0.0 {
        "0".to_owned()
    } else if v.abs() < 0.1 {
        format!("{:.0} ms", v * 1000.0)
    } else if v.abs() < 10.0 {
        let s = format!("{v:.2}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        format!("{s} s")
    } else {
        format!("{v:.0} s")
    }
}

/// Wall-clock `HH:MM:SS` for a Unix-millisecond timestamp. `utc_offset_min` is local time minus
/// UTC in minutes (the browser supplies it), so this stays deterministic and testable.
pub fn clock(unix_ms: i64, utc_offset_min: i32) -> String {
    let local_s = unix_ms.div_euclid(1000) + i64::from(utc_offset_min) * 60;
    let day_s = local_s.rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", day_s / 3600, (day_s / 60) % 60, day_s % 60)
}

/// The "last good scrape" line of a failing row; `None` means it has never been scraped.
pub fn last_good_scrape(last_good_ms: Option<i64>, utc_offset_min: i32) -> String {
    match last_good_ms {
        Some(ms) => format!("last good scrape: {}", clock(ms, utc_offset_min)),
        None => "last good scrape: never".to_owned(),
    }
}

/// A replica URL without the parts every replica shares (`http://`, a trailing `/metrics`), for
/// places with little room such as the chart legend.
pub fn short_url(url: &str) -> &str {
    let s = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")).unwrap_or(url);
    let s = s.strip_suffix('/').unwrap_or(s);
    s.strip_suffix("/metrics").unwrap_or(s)
}

/// A decision's cached tokens: the index's prediction against the engine's count.
pub fn cached_tokens(c: &fleetdeck_api::CachedTokens) -> String {
    match (c.engine, c.within_block) {
        (Some(engine), Some(true)) => {
            format!(
                "cached tokens: index predicted {}, engine reported {engine} (within a block)",
                c.predicted
            )
        }
        (Some(engine), _) => {
            format!(
                "cached tokens: index predicted {}, engine reported {engine} (off by more than a block)",
                c.predicted
            )
        }
        (None, _) => format!("cached tokens: index predicted {}, engine did not report", c.predicted),
    }
}

/// A router chip's badge and text: fleet-router's policy and version (and its index accuracy once its index has
/// predicted a request's cached tokens); a third-party router's kind, policy
/// (from its metrics), workers and request counts.
pub fn router_summary(r: &fleetdeck_api::RouterSource) -> (String, String) {
    let badge = match (r.error.is_some(), r.kind.as_str()) {
        (true, "" | "fleet-router") => "router error".to_owned(),
        (true, kind) => format!("{kind} error"),
        (false, "") => "router".to_owned(),
        (false, kind) => kind.to_owned(),
    };
    if let Some(error) = &r.error {
        return (badge, error.clone());
    }
    let text = match (&r.policy, r.policy_version) {
        (Some(p), Some(v)) => format!("policy {p} v{v}"),
        (Some(p), None) => format!("policy {p}"),
        (None, _) if r.read_only.is_some() => "policy not seen yet".to_owned(),
        (None, _) => "ok".to_owned(),
    };
    if r.read_only.is_none() {
        // fleet-router's index accuracy, once its index has predicted a request's cached tokens.
        let text = match r.index_accuracy.and_then(|a| a.share().map(|share| (a, share))) {
            Some((a, share)) => format!(
                "{text} · index accuracy {} ({}/{} within a block)",
                percent(Some(share)),
                a.within_block,
                a.predictions
            ),
            None => text,
        };
        return (badge, text);
    }
    let healthy = r.workers.iter().filter(|w| w.healthy == Some(true)).count();
    let mut text = format!("{text} · {healthy}/{} workers healthy", r.workers.len());
    if let Some(requests) = r.requests_total {
        text.push_str(&format!(" · {} requests", count(Some(requests))));
    }
    if let Some(errors) = r.errors_total {
        text.push_str(&format!(", {} errors", count(Some(errors))));
    }
    (badge, text)
}

/// The warning the fleet view shows while storing the scrapes goes wrong (or went wrong and lost rounds):
/// the count, what was lost and the last error. `None` when every round was stored.
pub fn history_banner(h: &fleetdeck_api::HistoryWriteStatus) -> Option<String> {
    if h.failed_writes == 0
        && h.shed_rounds == 0
        && h.dropped_rounds == 0
        && h.scrape_observations_dropped == 0
    {
        return None;
    }
    let mut text = if h.failing {
        format!("History writes are failing ({} failed attempts, retrying)", h.failed_writes)
    } else {
        format!("History writes failed {} times (writing again now)", h.failed_writes)
    };
    if h.shed_rounds > 0 {
        text.push_str(&format!(" · {} oldest unwritten rounds shed (queue full)", h.shed_rounds));
    }
    if h.dropped_rounds > 0 {
        text.push_str(&format!(" · {} rounds dropped after every retry failed", h.dropped_rounds));
    }
    if h.scrape_observations_dropped > 0 {
        text.push_str(&format!(" · {} scrape results not stored", h.scrape_observations_dropped));
    }
    if let Some(error) = &h.last_error {
        text.push_str(&format!(" · last error: {error}"));
    }
    text.push_str(&format!(" · database {}", h.db_path));
    Some(text)
}

/// A guard's reading as one line: its figures in its own unit.
pub fn guard_line(r: &fleetdeck_api::GuardReadingView) -> String {
    let show = |v: Option<f64>| match r.guard.as_str() {
        "ttft_p95" => duration_s(v.map(|ms| ms / 1000.0)),
        _ => percent(v),
    };
    let name = match r.guard.as_str() {
        "ttft_p95" => "TTFT p95",
        "error_rate" => "error rate",
        "hit_rate" => "hit rate",
        other => other,
    };
    format!("{name}: canary {} vs baseline {} · {}", show(r.canary), show(r.baseline), r.detail)
}

/// The verdict in words.
pub fn verdict_words(verdict: &str) -> &'static str {
    match verdict {
        "holding" => "guards holding",
        "not_enough_data" => "not enough data: will not promote",
        "crossed" => "guard crossed",
        _ => "not judged yet",
    }
}

/// One router's view of a replica's load, for the agreement table: what its policy counts and where that
/// comes from ("7 seen · 2 own · engine"), what the other routers published there when they share their load
/// through etcd, marked when its engine figures are stale.
pub fn router_load_view(view: &fleetdeck_api::RouterLoadView) -> String {
    let stale = if view.stale { " · stale" } else { "" };
    let published =
        view.published_by_others.map_or_else(String::new, |n| format!(" · {n} published by others"));
    format!("{} seen · {} own{published} · {}{stale}", view.seen, view.own, view.source)
}

/// The engine's own load figure of a replica and its age ("9 (0.3 s ago)"), or why there is none.
pub fn engine_load(engine: Option<f64>, age_ms: Option<u64>) -> String {
    match (engine, age_ms) {
        (Some(load), Some(age)) => format!("{load:.0} ({:.1} s ago)", age as f64 / 1000.0),
        (Some(load), None) => format!("{load:.0}"),
        (None, _) => "no fresh figures".to_owned(),
    }
}

/// A P/D decision in one line: "P/D split: prefill at 127.0.0.1:8101 (12 ms); 1024 tokens, ...", or the
/// local branch with its reason (and why a split fell back).
pub fn pd_decision(pd: &fleetdeck_api::PdDecision) -> String {
    let mut line = match (&pd.prefill_replica, pd.branch.as_str()) {
        (Some(prefill), "split") => {
            let took = pd.prefill_ms.map_or(String::new(), |ms| format!(" ({ms:.0} ms)"));
            format!("P/D split: prefill at {}{took}", short_url(prefill))
        }
        _ => format!("P/D local ({})", pd.reason),
    };
    if !pd.explanation.is_empty() {
        line.push_str("; ");
        line.push_str(&pd.explanation);
    }
    if let Some(why) = &pd.fallback {
        line.push_str("; fell back: ");
        line.push_str(why);
    }
    line
}

/// A P/D decision reason in words, for legends: `split` -> "split", `short_prompt` -> "short prompt".
pub fn pd_reason(reason: &str) -> String {
    match reason {
        "split" => "split (remote prefill)".to_owned(),
        "cached_at_decode" => "cached at decode".to_owned(),
        "prefill_pool_busy" => "prefill pool busy".to_owned(),
        "no_prefill_replica" => "no prefill replica".to_owned(),
        "transfer_failed" => "transfer failed, local".to_owned(),
        "local" => "local (reason not given)".to_owned(),
        other => other.replace('_', " "),
    }
}

/// A worker type as a router reports it: "prefill: 2 workers, 500 prefill tokens, last TTFT 120 ms".
pub fn worker_type(t: &fleetdeck_api::PdWorkerType) -> String {
    let mut parts = vec![format!("{} worker{}", t.workers, if t.workers == 1 { "" } else { "s" })];
    if let Some(tokens) = t.active_prefill_tokens {
        parts.push(format!("{tokens:.0} prefill tokens"));
    }
    if let Some(blocks) = t.active_decode_blocks {
        parts.push(format!("{blocks:.0} decode blocks"));
    }
    if let Some(ms) = t.last_ttft_ms {
        parts.push(format!("last TTFT {}", duration_s(Some(ms / 1e3))));
    }
    format!("{}: {}", t.worker_type, parts.join(", "))
}

/// The shares of a split request's TTFT, as `(label, ms)` in order: the prefill leg, the KV transfer and the
/// first decode token, or the decode leg whole where the engines time no transfer. Empty without splits.
pub fn ttft_legs(t: &fleetdeck_api::PdTtftSplit) -> Vec<(&'static str, f64)> {
    let Some(prefill) = t.prefill_leg_mean_ms else { return Vec::new() };
    let mut legs = vec![("prefill leg", prefill)];
    match (t.transfer_mean_ms, t.first_decode_token_mean_ms, t.decode_leg_mean_ms) {
        (Some(transfer), Some(first), _) => {
            legs.extend([("KV transfer", transfer), ("first decode token", first)])
        }
        (_, _, Some(decode)) => legs.push(("decode leg (transfer not timed)", decode)),
        _ => {}
    }
    legs
}

/// The replicas a router names as a prefix's holders ("127.0.0.1:8101, 127.0.0.1:8102"), or that it
/// names none.
pub fn prefix_holders(holders: &[String]) -> String {
    if holders.is_empty() {
        return "none known".to_owned();
    }
    holders.iter().map(|h| short_url(h)).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pd_decision_says_where_it_prefilled_or_why_it_stayed_local() {
        let split = fleetdeck_api::PdDecision {
            branch: "split".into(),
            reason: "split".into(),
            explanation: "1024 uncached >= 512".into(),
            prefill_replica: Some("http://127.0.0.1:8101".into()),
            prefill_ms: Some(12.4),
            ..Default::default()
        };
        assert_eq!(pd_decision(&split), "P/D split: prefill at 127.0.0.1:8101 (12 ms); 1024 uncached >= 512");
        let fell_back = fleetdeck_api::PdDecision {
            branch: "local".into(),
            reason: "transfer_failed".into(),
            fallback: Some("the decode leg failed".into()),
            ..split.clone()
        };
        assert_eq!(
            pd_decision(&fell_back),
            "P/D local (transfer_failed); 1024 uncached >= 512; fell back: the decode leg failed"
        );
    }

    #[test]
    fn pd_reasons_read_as_words() {
        assert_eq!(pd_reason("split"), "split (remote prefill)");
        assert_eq!(pd_reason("short_prompt"), "short prompt");
        assert_eq!(pd_reason("transfer_failed"), "transfer failed, local");
    }

    #[test]
    fn ttft_legs_show_the_transfer_only_where_an_engine_timed_it() {
        let mut t = fleetdeck_api::PdTtftSplit::default();
        assert!(ttft_legs(&t).is_empty(), "no split, no legs");
        t.prefill_leg_mean_ms = Some(30.0);
        // The first byte counts from arrival: the decode leg is what follows the prefill leg.
        t.decode_first_byte_mean_ms = Some(80.0);
        t.decode_leg_mean_ms = Some(50.0);
        assert_eq!(ttft_legs(&t), [("prefill leg", 30.0), ("decode leg (transfer not timed)", 50.0)]);
        t.transfer_mean_ms = Some(8.0);
        t.first_decode_token_mean_ms = Some(42.0);
        assert_eq!(
            ttft_legs(&t),
            [("prefill leg", 30.0), ("KV transfer", 8.0), ("first decode token", 42.0)]
        );
    }

    #[test]
    fn worker_types_say_what_the_router_reports_and_nothing_more() {
        let t = fleetdeck_api::PdWorkerType {
            worker_type: "prefill".to_owned(),
            workers: 2,
            active_prefill_tokens: Some(500.0),
            active_decode_blocks: None,
            last_ttft_ms: Some(120.0),
        };
        assert_eq!(worker_type(&t), "prefill: 2 workers, 500 prefill tokens, last TTFT 120 ms");
        let one = fleetdeck_api::PdWorkerType {
            worker_type: "decode".to_owned(),
            workers: 1,
            ..Default::default()
        };
        assert_eq!(worker_type(&one), "decode: 1 worker");
    }

    #[test]
    fn prefix_holders_are_short_urls_or_say_none_is_known() {
        assert_eq!(prefix_holders(&[]), "none known");
        let holders = ["http://127.0.0.1:8101".to_owned(), "http://127.0.0.1:8102".to_owned()];
        assert_eq!(
            prefix_holders(&holders),
            format!("{}, {}", short_url(&holders[0]), short_url(&holders[1]))
        );
    }

    #[test]
    fn router_chips_say_what_kind_of_router_and_what_it_reports() {
        let mut r = fleetdeck_api::RouterSource {
            url: "http://127.0.0.1:30000".into(),
            error: None,
            policy: Some("cache_aware".into()),
            policy_version: None,
            kind: "smg".into(),
            read_only: Some("read-only: smg has no API to change its routing policy".into()),
            workers: vec![
                fleetdeck_api::RouterWorker { url: "a".into(), healthy: Some(true), load: Some(0.0) },
                fleetdeck_api::RouterWorker { url: "b".into(), healthy: Some(false), load: None },
            ],
            requests_total: Some(12.0),
            errors_total: Some(0.0),
            index_accuracy: None,
        };
        assert_eq!(
            router_summary(&r),
            ("smg".into(), "policy cache_aware · 1/2 workers healthy · 12 requests, 0 errors".into())
        );
        r.policy = None;
        assert!(router_summary(&r).1.starts_with("policy not seen yet"));
        r.error = Some("cannot reach".into());
        assert_eq!(router_summary(&r), ("smg error".into(), "cannot reach".into()));
        let ours = fleetdeck_api::RouterSource {
            kind: "fleet-router".into(),
            policy: Some("kv_precise".into()),
            policy_version: Some(3),
            read_only: None,
            workers: Vec::new(),
            error: None,
            ..r
        };
        assert_eq!(router_summary(&ours), ("fleet-router".into(), "policy kv_precise v3".into()));
        let no_predictions = fleetdeck_api::IndexAccuracy { predictions: 0, within_block: 0 };
        let quiet = fleetdeck_api::RouterSource { index_accuracy: Some(no_predictions), ..ours.clone() };
        assert_eq!(router_summary(&quiet).1, "policy kv_precise v3", "no figure before a prediction");
        let accurate = fleetdeck_api::IndexAccuracy { predictions: 40, within_block: 39 };
        let measured = fleetdeck_api::RouterSource { index_accuracy: Some(accurate), ..ours };
        assert_eq!(
            router_summary(&measured).1,
            "policy kv_precise v3 · index accuracy 97.5% (39/40 within a block)"
        );
    }

    #[test]
    fn a_decisions_cached_tokens_say_whether_the_index_was_right() {
        let c = |engine, within_block| fleetdeck_api::CachedTokens { predicted: 64, engine, within_block };
        assert_eq!(
            cached_tokens(&c(Some(64), Some(true))),
            "cached tokens: index predicted 64, engine reported 64 (within a block)"
        );
        assert!(
            cached_tokens(&c(Some(0), Some(false))).ends_with("engine reported 0 (off by more than a block)")
        );
        assert!(cached_tokens(&c(None, None)).ends_with("engine did not report"));
    }

    #[test]
    fn missing_is_a_dash_and_zero_is_zero() {
        assert_eq!(count(None), "—");
        assert_eq!(count(Some(0.0)), "0");
        assert_eq!(percent(None), "—");
        assert_eq!(percent(Some(0.0)), "0.0%");
        assert_eq!(duration_s(None), "—");
        assert_eq!(duration_s(Some(0.0)), "0.0 ms");
    }

    #[test]
    fn counts_show_decimals_only_when_fractional() {
        assert_eq!(count(Some(12.0)), "12");
        assert_eq!(count(Some(2.5)), "2.5");
        assert_eq!(count(Some(f64::NAN)), "—");
    }

    #[test]
    fn percentages_from_ratios() {
        assert_eq!(percent(Some(0.4234)), "42.3%");
        assert_eq!(percent(Some(1.0)), "100.0%");
    }

    #[test]
    fn durations_pick_a_unit() {
        assert_eq!(duration_s(Some(0.0042)), "4.2 ms");
        assert_eq!(duration_s(Some(0.085)), "85 ms");
        assert_eq!(duration_s(Some(0.9996)), "1.00 s");
        assert_eq!(duration_s(Some(1.234)), "1.23 s");
        assert_eq!(duration_s(Some(12.34)), "12.3 s");
    }

    #[test]
    fn rates_scale() {
        assert_eq!(rate(None), "—");
        assert_eq!(rate(Some(3.25)), "3.2");
        assert_eq!(rate(Some(850.4)), "850");
        assert_eq!(rate(Some(3400.0)), "3.4k");
    }

    #[test]
    fn axis_ticks_are_short() {
        assert_eq!(axis_seconds(0.0), "0");
        assert_eq!(axis_seconds(0.05), "50 ms");
        assert_eq!(axis_seconds(0.5), "0.5 s");
        assert_eq!(axis_seconds(1.25), "1.25 s");
        assert_eq!(axis_seconds(2.0), "2 s");
        assert_eq!(axis_seconds(30.0), "30 s");
    }

    #[test]
    fn clock_applies_the_offset_and_wraps_days() {
        // 2024-01-01T13:04:05Z
        let ms = 1_704_114_245_000;
        assert_eq!(clock(ms, 0), "13:04:05");
        assert_eq!(clock(ms, 60), "14:04:05");
        assert_eq!(clock(ms, -14 * 60), "23:04:05");
        assert_eq!(clock(ms + 999, 0), "13:04:05");
    }

    #[test]
    fn last_good_line() {
        assert_eq!(last_good_scrape(None, 0), "last good scrape: never");
        assert_eq!(last_good_scrape(Some(1_704_114_245_000), 0), "last good scrape: 13:04:05");
    }

    #[test]
    fn short_urls_drop_the_common_parts() {
        assert_eq!(short_url("http://127.0.0.1:8001/metrics"), "127.0.0.1:8001");
        assert_eq!(short_url("https://gpu-3:9000/"), "gpu-3:9000");
        assert_eq!(short_url("gpu-3:9000/stats"), "gpu-3:9000/stats");
    }

    #[test]
    fn the_history_banner_shows_only_when_something_was_not_stored() {
        let mut h = fleetdeck_api::HistoryWriteStatus {
            db_path: "/d/history.sqlite".into(),
            written_rounds: 40,
            ..Default::default()
        };
        assert_eq!(history_banner(&h), None);
        h.failed_writes = 3;
        h.shed_rounds = 7;
        h.failing = true;
        h.last_error = Some("database is locked".into());
        let text = history_banner(&h).unwrap();
        for words in [
            "failing (3 failed attempts",
            "7 oldest unwritten rounds shed",
            "database is locked",
            "/d/history.sqlite",
        ] {
            assert!(text.contains(words), "{text} lacks {words}");
        }
        h.failing = false;
        assert!(history_banner(&h).unwrap().contains("failed 3 times"));
    }

    #[test]
    fn guard_readings_read_in_their_own_units() {
        let reading = |guard: &str, canary, baseline| fleetdeck_api::GuardReadingView {
            guard: guard.into(),
            canary,
            baseline,
            state: "ok".into(),
            detail: "limit".into(),
        };
        assert_eq!(
            guard_line(&reading("ttft_p95", Some(250.0), Some(200.0))),
            "TTFT p95: canary 250 ms vs baseline 200 ms · limit"
        );
        assert_eq!(
            guard_line(&reading("error_rate", Some(0.1), Some(0.0))),
            "error rate: canary 10.0% vs baseline 0.0% · limit"
        );
        assert!(guard_line(&reading("hit_rate", None, None)).starts_with("hit rate: canary"));
        assert_eq!(verdict_words("not_enough_data"), "not enough data: will not promote");
    }

    #[test]
    fn a_routers_view_of_load_says_its_source_and_staleness() {
        let mut view = fleetdeck_api::RouterLoadView {
            router: "http://127.0.0.1:9000".into(),
            own: 2,
            seen: 7,
            source: "engine".into(),
            stale: false,
            published_by_others: None,
        };
        assert_eq!(router_load_view(&view), "7 seen · 2 own · engine");
        view.published_by_others = Some(5);
        assert_eq!(router_load_view(&view), "7 seen · 2 own · 5 published by others · engine");
        view.published_by_others = None;
        view.source = "own".into();
        view.stale = true;
        view.seen = 2;
        assert_eq!(router_load_view(&view), "2 seen · 2 own · own · stale");
        assert_eq!(engine_load(Some(9.0), Some(340)), "9 (0.3 s ago)");
        assert_eq!(engine_load(None, None), "no fresh figures");
    }
}
