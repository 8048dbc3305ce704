//! The routers a what-if replays, modelled as deployed: as many routers as recorded the traffic, each
//! reading the replicas' engine load as often as the live routers say they do, and handing the others its
//! in-flight load when the live routers share theirs through etcd.
//!
//! Both matter to the prediction. A router that reads engine figures weighs load by what the replicas
//! report (other routers' requests included, seconds old at most), one that does not by its own
//! outstanding requests; and N routers each place a prefix by what they alone have seen. Replaying one
//! router that reads nothing predicted another fleet: least_load and power_of_two 3-4 points of hit rate
//! off (`cargo xtask bench fidelity`, 2026-12-05).

use fleetdeck_api::WhatIfRouterModel;

/// What the what-if learnt of one router.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RouterFacts {
    pub url: String,
    /// Requests of the window read from it.
    pub requests: u64,
    /// How often it reads engine figures, in ms (`Some(0)`: never); `None`: it did not say (its state
    /// could not be read, or it predates the field and reads none).
    pub engine_metrics_ms: Option<u64>,
    /// How often it publishes its in-flight load to the other routers, in ms (`None`: it shares none).
    pub peer_load_ms: Option<u64>,
}

/// The routers to replay and how they read engine load, with notes on what was assumed.
///
/// `recorded` is the number of distinct routers the replayed traffic names (0: none, as in a trace file
/// without router tags); `pd` says the replay has a prefill pool, which fleet-sim replays behind one router
/// only.
pub(crate) fn deployed(facts: &[RouterFacts], recorded: usize, pd: bool) -> (WhatIfRouterModel, Vec<String>) {
    let mut notes = Vec::new();
    let mut routers = recorded.max(1) as u32;
    if pd && routers > 1 {
        notes.push(format!(
            "{routers} routers recorded the traffic, but a P/D replay models one router: all of it goes through \
             one policy engine, which sees every request"
        ));
        routers = 1;
    }
    // The interval of the routers that carried most of the traffic (all of them when none recorded any).
    let carried: Vec<&RouterFacts> = if facts.iter().any(|f| f.requests > 0) {
        facts.iter().filter(|f| f.requests > 0).collect()
    } else {
        facts.iter().collect()
    };
    let mut intervals: Vec<(u64, u64)> = Vec::new();
    let mut silent: Vec<&str> = Vec::new();
    for fact in &carried {
        match fact.engine_metrics_ms {
            Some(ms) => match intervals.iter_mut().find(|(known, _)| *known == ms) {
                Some(entry) => entry.1 += fact.requests,
                None => intervals.push((ms, fact.requests)),
            },
            None => silent.push(&fact.url),
        }
    }
    let chosen = intervals
        .iter()
        .enumerate()
        .max_by_key(|(i, (_, requests))| (*requests, std::cmp::Reverse(*i)))
        .map(|(_, (ms, _))| *ms);
    for url in silent {
        notes.push(format!(
            "{url} did not say how often it reads the replicas' engine load (a fleet-router before this version \
             reads none); it is replayed {}",
            match chosen {
                Some(ms) => format!("as the others read it, {}", interval_text(ms)),
                None => "reading none".to_owned(),
            }
        ));
    }
    if intervals.len() > 1 {
        let listed: Vec<String> = intervals.iter().map(|(ms, _)| interval_text(*ms)).collect();
        notes.push(format!(
            "the routers read the replicas' engine load at different intervals ({}); every replayed router \
             reads it {}, as the routers that carried most of the traffic do",
            listed.join(", "),
            chosen.map_or_else(|| "never".to_owned(), interval_text)
        ));
    }
    let engine_metrics_ms = chosen.filter(|ms| *ms > 0);
    // Shared load, as the routers that carried most of the traffic share it (fleets share all or none).
    let sharing = carried.iter().filter(|f| f.peer_load_ms.is_some()).count();
    let peer_load_ms = (routers > 1 && sharing * 2 > carried.len())
        .then(|| carried.iter().filter_map(|f| f.peer_load_ms).max())
        .flatten();
    if routers > 1 && sharing > 0 && sharing < carried.len() {
        notes.push(format!(
            "{sharing} of {} routers share their load through etcd; the replayed routers {}",
            carried.len(),
            if peer_load_ms.is_some() { "all do" } else { "do not" }
        ));
    }
    let reading = match (engine_metrics_ms, chosen) {
        (Some(ms), _) => format!("reading the replicas' engine load {}", interval_text(ms)),
        (None, Some(_)) => "reading no engine load (the routers' --engine-metrics-ms is 0)".to_owned(),
        (None, None) => "reading no engine load (no router said it reads any)".to_owned(),
    };
    let summary = if routers == 1 {
        format!("1 router, {reading}")
    } else {
        let shared = match peer_load_ms {
            Some(ms) => format!(
                "what the replicas publish (KV events, metrics) and their own in-flight load every {ms} ms, \
                 through etcd"
            ),
            None => "only what the replicas publish (KV events, metrics)".to_owned(),
        };
        format!(
            "{routers} routers, each with its own policy engine and its recorded requests, each {reading}; they \
             share {shared}"
        )
    };
    (WhatIfRouterModel { routers, engine_metrics_ms, peer_load_ms, summary }, notes)
}

fn interval_text(ms: u64) -> String {
    if ms == 0 { "never".to_owned() } else { format!("every {ms} ms") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(url: &str, requests: u64, engine_metrics_ms: Option<u64>) -> RouterFacts {
        RouterFacts { url: url.to_owned(), requests, engine_metrics_ms, peer_load_ms: None }
    }

    #[test]
    fn routers_sharing_their_load_are_replayed_sharing_it() {
        let sharing = |url: &str| RouterFacts { peer_load_ms: Some(25), ..router(url, 100, Some(250)) };
        let (model, notes) = deployed(&[sharing("http://a"), sharing("http://b")], 2, false);
        assert_eq!((model.routers, model.peer_load_ms), (2, Some(25)));
        assert!(model.summary.contains("in-flight load every 25 ms, through etcd"), "{}", model.summary);
        assert!(notes.is_empty(), "{notes:?}");
        // One of three shares: the replay does not, and says so.
        let facts =
            [sharing("http://a"), router("http://b", 100, Some(250)), router("http://c", 100, Some(250))];
        let (model, notes) = deployed(&facts, 3, false);
        assert_eq!(model.peer_load_ms, None);
        assert!(model.summary.contains("share only what the replicas publish"), "{}", model.summary);
        assert!(notes.iter().any(|n| n.starts_with("1 of 3 routers share")), "{notes:?}");
        // One router has no one to share with.
        let (one, _) = deployed(&[sharing("http://a")], 1, false);
        assert_eq!(one.peer_load_ms, None);
    }

    #[test]
    fn one_router_is_replayed_as_it_reads_engine_load() {
        let (model, notes) = deployed(&[router("http://r1", 300, Some(250))], 1, false);
        assert_eq!((model.routers, model.engine_metrics_ms), (1, Some(250)));
        assert_eq!(model.summary, "1 router, reading the replicas' engine load every 250 ms");
        assert!(notes.is_empty(), "{notes:?}");
        let (off, _) = deployed(&[router("http://r1", 300, Some(0))], 1, false);
        assert_eq!(off.engine_metrics_ms, None);
        assert!(off.summary.contains("--engine-metrics-ms is 0"), "{}", off.summary);
    }

    #[test]
    fn the_interval_of_most_traffic_wins_and_the_difference_is_noted() {
        let facts = [
            router("http://a", 100, Some(1000)),
            router("http://b", 250, Some(250)),
            router("http://c", 0, Some(50)),
            router("http://d", 10, None),
        ];
        let (model, notes) = deployed(&facts, 3, false);
        assert_eq!((model.routers, model.engine_metrics_ms), (3, Some(250)));
        assert!(model.summary.starts_with("3 routers"), "{}", model.summary);
        // c recorded nothing, so its interval does not count; d did not say.
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].starts_with("http://d did not say"), "{notes:?}");
        assert!(
            notes[1].contains("every 1000 ms, every 250 ms") && !notes[1].contains("every 50 ms"),
            "{notes:?}"
        );
    }

    #[test]
    fn a_pd_replay_or_a_trace_file_without_routers_is_one_router() {
        let facts = [router("http://a", 10, Some(250)), router("http://b", 10, Some(250))];
        let (pd, notes) = deployed(&facts, 2, true);
        assert_eq!(pd.routers, 1);
        assert!(notes[0].contains("P/D replay models one router"), "{notes:?}");
        // A trace file names no router; the routers read nothing from it, so all of them say the interval.
        let idle = [router("http://a", 0, Some(100))];
        let (file, notes) = deployed(&idle, 0, false);
        assert_eq!((file.routers, file.engine_metrics_ms), (1, Some(100)));
        assert!(notes.is_empty(), "{notes:?}");
        let (unknown, _) = deployed(&[], 0, false);
        assert_eq!((unknown.routers, unknown.engine_metrics_ms), (1, None));
        assert!(unknown.summary.contains("no router said"), "{}", unknown.summary);
    }
}
