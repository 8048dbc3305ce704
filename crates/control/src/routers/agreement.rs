//! Whether a fleet's routers agree: on each replica's load, every router's view (the load its policy counts)
//! beside the engine's own figure (waiting + running, as the router with the freshest scrape read it), and
//! which routers are off; and on where each busy prefix group lives, the replicas each router's index names.
//! Pure: the routers' states come in as values.
//!
//! A router that cannot read a replica's `/metrics` (scrapes off, failing or stale) counts only its own
//! requests there, so with several routers it under-counts by what the others sent: that is the
//! disagreement this view exists to show. Routers that share their load through etcd also say what the
//! others told them (`published_by_others`); its own plus that falling well short of the engine's figure
//! means some router sending there does not publish (no `--peer-load-prefix`), so its requests are
//! weighed by an average, not their size.

use std::collections::{BTreeMap, BTreeSet};

use fleetdeck_api::{PrefixPlacement, ReplicaLoadAgreement, RouterLoadView, RouterPrefixView};

use crate::routers::admin::RouterState;

/// A view is off when it differs from the reference by more than this many requests...
const TOLERANCE_REQUESTS: f64 = 2.0;
/// ...and by more than this share of the reference.
const TOLERANCE_SHARE: f64 = 0.25;

fn off(view: f64, reference: f64) -> bool {
    (view - reference).abs() > TOLERANCE_REQUESTS.max(TOLERANCE_SHARE * reference)
}

/// One entry per replica any router lists, in the order first listed.
pub fn build(states: &[(String, RouterState)]) -> Vec<ReplicaLoadAgreement> {
    let mut order: Vec<String> = Vec::new();
    let mut by_replica: BTreeMap<String, ReplicaLoadAgreement> = BTreeMap::new();
    for (router, state) in states {
        for replica in &state.replicas {
            let entry = by_replica.entry(replica.url.clone()).or_insert_with(|| {
                order.push(replica.url.clone());
                ReplicaLoadAgreement { replica: replica.url.clone(), ..Default::default() }
            });
            let engine = replica.engine.as_ref();
            let stale = engine.is_none_or(|e| e.stale);
            if let Some(figures) = engine.filter(|e| !e.stale)
                && (figures.waiting.is_some() || figures.running.is_some())
                && entry.engine_age_ms.is_none_or(|age| figures.age_ms.unwrap_or(u64::MAX) < age)
            {
                entry.engine = Some(figures.waiting.unwrap_or(0.0) + figures.running.unwrap_or(0.0));
                entry.engine_age_ms = Some(figures.age_ms.unwrap_or(u64::MAX));
            }
            let (own, seen, source, published_by_others) = match &replica.load {
                Some(load) => (load.own, load.seen, load.source.clone(), load.peers.map(|p| p.requests)),
                // A router that reports no `load` (older than issue 35) counts its own requests only.
                None => (replica.outstanding, replica.outstanding, "own".to_owned(), None),
            };
            entry.routers.push(RouterLoadView {
                router: router.clone(),
                own,
                seen,
                source,
                stale,
                published_by_others,
            });
        }
    }
    let mut agreements = Vec::with_capacity(order.len());
    for url in order {
        let Some(mut entry) = by_replica.remove(&url) else { continue };
        let views: Vec<f64> = entry.routers.iter().map(|r| r.seen as f64).collect();
        // The engine's own figure when a router has it fresh, else the largest view (a router never sees
        // more than the replica holds, short of requests completed since its last scrape).
        let (reference, against) = match entry.engine {
            Some(engine) => (engine, "the engine holds"),
            None => (views.iter().copied().fold(0.0, f64::max), "another router sees"),
        };
        let mut off_routers = Vec::new();
        for view in &entry.routers {
            if off(view.seen as f64, reference) {
                let why = if view.source == "own" { "its own requests only" } else { "the engine's figures" };
                off_routers.push(format!("{} sees {} ({why})", view.router, view.seen));
            } else if let Some(published) = view.published_by_others
                && entry.engine.is_some()
                && off((view.own + published) as f64, reference)
            {
                off_routers.push(format!(
                    "{} knows the size of {} ({} own + {published} published by other routers): a router \
                     sending there does not publish its load",
                    view.router,
                    view.own + published,
                    view.own
                ));
            }
        }
        entry.disagree = !off_routers.is_empty();
        if entry.disagree {
            entry.note = Some(format!("{}; {against} {reference}", off_routers.join(", ")));
        }
        agreements.push(entry);
    }
    agreements
}

/// Groups the placement view lists at most.
pub const MAX_PLACEMENTS: usize = 10;

/// Where each router believes the prefix groups that two or more routers report are cached. A router's
/// holders of a group are the replicas its index credits with at least half the blocks of the replica it
/// credits most (a partial match elsewhere is not a home). Approximate prefix trees learn only from their own
/// router's requests, so with several routers they part ways: one sends a tenant to a replica the others do
/// not know holds it, and the prefix is computed twice. Routers fed by the engines' KV events agree.
/// Groups the routers disagree on come first, then the busiest.
pub fn prefix_placement(states: &[(String, RouterState)]) -> Vec<PrefixPlacement> {
    let mut by_group: BTreeMap<String, PrefixPlacement> = BTreeMap::new();
    for (router, state) in states {
        let urls = state.urls_by_id();
        for group in &state.prefix_groups {
            let most = group.replicas.iter().map(|r| r.cached_blocks).max().unwrap_or(0);
            let holders: BTreeSet<String> = group
                .replicas
                .iter()
                .filter(|r| most > 0 && r.cached_blocks * 2 >= most)
                .map(|r| urls.get(&r.id).cloned().unwrap_or_else(|| r.id.clone()))
                .collect();
            let entry = by_group
                .entry(group.group.clone())
                .or_insert_with(|| PrefixPlacement { group: group.group.clone(), ..Default::default() });
            entry.requests += group.requests;
            entry.routers.push(RouterPrefixView {
                router: router.clone(),
                holders: holders.into_iter().collect(),
                requests: group.requests,
            });
        }
    }
    let mut placements: Vec<PrefixPlacement> = by_group
        .into_values()
        .filter(|p| p.routers.len() > 1)
        .map(|mut p| {
            // A router whose index names no holder (a policy without one) has no view to disagree with.
            let views: Vec<&Vec<String>> =
                p.routers.iter().map(|r| &r.holders).filter(|h| !h.is_empty()).collect();
            p.disagree = views.windows(2).any(|pair| pair[0] != pair[1]);
            p
        })
        .collect();
    placements.sort_by(|a, b| {
        b.disagree.cmp(&a.disagree).then(b.requests.cmp(&a.requests)).then_with(|| a.group.cmp(&b.group))
    });
    placements.truncate(MAX_PLACEMENTS);
    placements
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routers::admin::parse_state;

    /// A router's state listing one replica with the given `load` and `engine` JSON (or none).
    fn state(load: &str, engine: &str) -> RouterState {
        parse_state(
            format!(
                r#"{{"policy": {{"name": "least_load", "version": 1}}, "window_s": 60, "prefix_groups": [],
                 "replicas": [{{"id": 0, "url": "http://r0", "outstanding": 1, "load": {load}, "engine": {engine}}}]}}"#
            )
            .as_bytes(),
        )
        .expect("a router state")
    }

    /// One prefix group as a router reports it: its id, its requests, and (replica id, cached blocks).
    type Group<'a> = (&'a str, u64, &'a [(u32, u64)]);

    /// A router's state with prefix groups over replicas r0..r2.
    fn with_groups(groups: &[Group<'_>]) -> RouterState {
        let groups: Vec<String> = groups
            .iter()
            .map(|(group, requests, replicas)| {
                let replicas: Vec<String> = replicas
                    .iter()
                    .map(|(id, blocks)| {
                        format!(
                            r#"{{"id": {id}, "requests": 1, "cached_blocks": {blocks}, "hit_share": 0.5}}"#
                        )
                    })
                    .collect();
                format!(
                    r#"{{"group": "{group}", "requests": {requests}, "share": 0.1, "replicas": [{}]}}"#,
                    replicas.join(",")
                )
            })
            .collect();
        parse_state(
            format!(
                r#"{{"policy": {{"name": "cache_aware_approx", "version": 1}}, "window_s": 60,
                 "replicas": [{{"id": 0, "url": "http://r0"}}, {{"id": 1, "url": "http://r1"}}, {{"id": 2, "url": "http://r2"}}],
                 "prefix_groups": [{}]}}"#,
                groups.join(",")
            )
            .as_bytes(),
        )
        .expect("a router state")
    }

    #[test]
    fn routers_naming_other_holders_of_a_prefix_disagree_and_come_first() {
        let a = with_groups(&[("aa", 50, &[(0, 40), (1, 4)]), ("bb", 30, &[(2, 10)]), ("cc", 9, &[(1, 8)])]);
        let b = with_groups(&[("aa", 40, &[(0, 38)]), ("bb", 20, &[(1, 12), (2, 3)])]);
        let placement = prefix_placement(&[("http://a".to_owned(), a), ("http://b".to_owned(), b)]);
        // "cc" only one router reports: nothing to compare.
        assert_eq!(placement.iter().map(|p| p.group.as_str()).collect::<Vec<_>>(), ["bb", "aa"]);
        let bb = &placement[0];
        assert!(bb.disagree, "{bb:?}");
        assert_eq!(bb.requests, 50);
        assert_eq!(bb.routers[0].holders, ["http://r2"]);
        assert_eq!(bb.routers[1].holders, ["http://r1"], "3 of 12 blocks is a partial match, not a home");
        let aa = &placement[1];
        assert!(!aa.disagree, "both name r0 (r1's 4 of 40 blocks is no home): {aa:?}");
    }

    #[test]
    fn a_router_whose_index_names_no_holder_has_no_view_to_disagree_with() {
        // Round-robin routers keep no index: their groups credit no replica with cached blocks.
        let blind = || with_groups(&[("aa", 10, &[(0, 0), (1, 0)])]);
        let indexed = |replica: u32| with_groups(&[("aa", 10, &[(replica, 20)])]);
        let placement =
            prefix_placement(&[("http://a".to_owned(), blind()), ("http://b".to_owned(), indexed(1))]);
        assert_eq!(placement.len(), 1);
        assert!(placement[0].routers[0].holders.is_empty());
        assert!(!placement[0].disagree, "{placement:?}");
        let placement = prefix_placement(&[
            ("http://a".to_owned(), blind()),
            ("http://b".to_owned(), indexed(1)),
            ("http://c".to_owned(), indexed(2)),
        ]);
        assert!(placement[0].disagree, "{placement:?}");
    }

    #[test]
    fn routers_reading_the_engine_agree_and_one_on_its_own_counts_is_flagged() {
        let fresh = r#"{"waiting": 3, "running": 6, "kv_usage": 0.4, "age_ms": 120, "stale": false}"#;
        let older = r#"{"waiting": 2, "running": 6, "kv_usage": 0.4, "age_ms": 240, "stale": false}"#;
        let stale = r#"{"waiting": 0, "running": 1, "age_ms": 9000, "stale": true, "error": "no answer"}"#;
        let states = vec![
            ("http://a".to_owned(), state(r#"{"own": 4, "seen": 10, "source": "engine"}"#, fresh)),
            ("http://b".to_owned(), state(r#"{"own": 0, "seen": 8, "source": "engine"}"#, older)),
        ];
        let agreement = build(&states);
        assert_eq!(agreement.len(), 1);
        let replica = &agreement[0];
        assert_eq!((replica.engine, replica.engine_age_ms), (Some(9.0), Some(120)), "the freshest scrape");
        assert!(!replica.disagree, "10 and 8 against 9 are within tolerance: {replica:?}");
        assert_eq!(replica.routers.len(), 2);
        assert_eq!(replica.routers[1].own, 0);

        // A third router whose scrapes went stale counts only its own request: it is flagged.
        let mut states = states;
        states.push(("http://c".to_owned(), state(r#"{"own": 1, "seen": 1, "source": "own"}"#, stale)));
        let replica = &build(&states)[0];
        assert!(replica.disagree, "{replica:?}");
        assert!(replica.routers[2].stale);
        let note = replica.note.as_deref().unwrap_or_default();
        assert!(note.contains("http://c sees 1 (its own requests only)"), "{note}");
        assert!(!note.contains("http://a"), "{note}");
        assert!(note.contains("the engine holds 9"), "{note}");
    }

    #[test]
    fn routers_sharing_load_say_what_the_others_published_and_a_silent_router_shows() {
        let fresh = r#"{"waiting": 2, "running": 8, "age_ms": 100, "stale": false}"#;
        let sharing = |own: u64, published: u64| {
            state(
                &format!(
                    r#"{{"own": {own}, "seen": 10, "source": "engine", "peers": {{"requests": {published}, "prefill_blocks": 40, "decode_blocks": 7}}}}"#
                ),
                fresh,
            )
        };
        // Two routers, each told of the other's requests: 4 + 6 = 10, what the engine holds.
        let states = vec![("http://a".to_owned(), sharing(4, 6)), ("http://b".to_owned(), sharing(6, 4))];
        let replica = &build(&states)[0];
        assert!(!replica.disagree, "{replica:?}");
        assert_eq!(replica.routers[0].published_by_others, Some(6));
        // A third router sends 6 more but publishes nothing: the two sharing routers know the size of only
        // 10 of the 16 the engine holds.
        let fresh = r#"{"waiting": 6, "running": 10, "age_ms": 100, "stale": false}"#;
        let states = vec![
            (
                "http://a".to_owned(),
                state(r#"{"own": 4, "seen": 16, "source": "engine", "peers": {"requests": 6}}"#, fresh),
            ),
            (
                "http://b".to_owned(),
                state(r#"{"own": 6, "seen": 16, "source": "engine", "peers": {"requests": 4}}"#, fresh),
            ),
            ("http://c".to_owned(), state(r#"{"own": 6, "seen": 16, "source": "engine"}"#, fresh)),
        ];
        let replica = &build(&states)[0];
        assert!(replica.disagree, "{replica:?}");
        let note = replica.note.as_deref().unwrap_or_default();
        assert!(
            note.contains("http://a knows the size of 10 (4 own + 6 published by other routers)"),
            "{note}"
        );
        assert!(!note.contains("http://c"), "c shares nothing, so claims nothing: {note}");
        assert_eq!(replica.routers[2].published_by_others, None);
    }

    #[test]
    fn without_engine_figures_routers_are_compared_with_each_other() {
        // Older routers (no `load`, no `engine`): their outstanding counts are all they see.
        let old = |outstanding: u64| {
            parse_state(
                format!(
                    r#"{{"policy": {{"name": "p", "version": 1}}, "replicas": [{{"id": 0, "url": "http://r0", "outstanding": {outstanding}}}]}}"#
                )
                .as_bytes(),
            )
            .expect("a router state")
        };
        let states = vec![("http://a".to_owned(), old(12)), ("http://b".to_owned(), old(1))];
        let replica = &build(&states)[0];
        assert_eq!(replica.engine, None);
        assert!(replica.disagree, "{replica:?}");
        assert_eq!(replica.routers[0].source, "own");
        let note = replica.note.as_deref().unwrap_or_default();
        assert!(note.contains("http://b sees 1") && note.contains("another router sees 12"), "{note}");
        let agreeing = vec![("http://a".to_owned(), old(3)), ("http://b".to_owned(), old(2))];
        assert!(!build(&agreeing)[0].disagree);
    }
}
