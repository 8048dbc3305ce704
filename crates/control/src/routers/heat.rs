//! The prefix-cache heat map: every router's recent prefix groups merged into one
//! replicas x groups grid, and the hotspots in it. Pure: the routers' states come in as values.

use std::collections::HashMap;

use fleetdeck_api::{HeatCell, HeatGroup, HeatMap, Hotspot, RouterSource};

use crate::routers::admin::RouterState;

/// Rows the map shows at most (the routers report their top 20 each).
pub const MAX_GROUPS: usize = 20;

/// Merges `states` (one per router that answered) into the heat map.
///
/// Groups with the same id from several routers are summed; a group's share is recomputed over
/// the traffic of all routers, approximated from each router's own shares. A hotspot is one
/// replica whose requests of one group exceed `hotspot_share` of all requests.
pub fn build(states: &[RouterState], routers: Vec<RouterSource>, hotspot_share: f64, now_ms: i64) -> HeatMap {
    let mut replicas: Vec<String> = Vec::new();
    let mut column: HashMap<String, usize> = HashMap::new();
    for state in states {
        for r in &state.replicas {
            if !column.contains_key(&r.url) {
                column.insert(r.url.clone(), replicas.len());
                replicas.push(r.url.clone());
            }
        }
    }
    // Total traffic per router, from a group's requests over its share: the routers report
    // shares of their whole window, not only of the top groups.
    let mut total_requests = 0.0;
    for state in states {
        let router_total = state
            .prefix_groups
            .iter()
            .find(|g| g.share > 0.0 && g.requests > 0)
            .map(|g| g.requests as f64 / g.share)
            .unwrap_or_else(|| state.prefix_groups.iter().map(|g| g.requests as f64).sum());
        total_requests += router_total;
    }
    let mut groups: Vec<HeatGroup> = Vec::new();
    let mut row: HashMap<String, usize> = HashMap::new();
    for state in states {
        let urls = state.urls_by_id();
        for g in &state.prefix_groups {
            let index = *row.entry(g.group.clone()).or_insert_with(|| {
                groups.push(HeatGroup {
                    group: g.group.clone(),
                    requests: 0,
                    share: 0.0,
                    cells: vec![HeatCell::default(); replicas.len()],
                });
                groups.len() - 1
            });
            let group = &mut groups[index];
            group.requests += g.requests;
            for r in &g.replicas {
                let url = urls.get(&r.id).cloned().unwrap_or_else(|| r.id.clone());
                let col = match column.get(&url) {
                    Some(&c) => c,
                    None => {
                        // A replica only a group names (the router's state omitted it).
                        column.insert(url.clone(), replicas.len());
                        replicas.push(url);
                        for g in &mut groups {
                            g.cells.push(HeatCell::default());
                        }
                        replicas.len() - 1
                    }
                };
                let cell = &mut groups[index].cells[col];
                // Hit shares are per-request means: weight them by requests when merging.
                let before = cell.requests as f64;
                let added = r.requests as f64;
                cell.hit_share = if before + added > 0.0 {
                    (cell.hit_share * before + r.hit_share * added) / (before + added)
                } else {
                    r.hit_share.max(cell.hit_share)
                };
                cell.requests += r.requests;
                cell.cached_blocks = cell.cached_blocks.max(r.cached_blocks);
            }
        }
    }
    for g in &mut groups {
        g.share = if total_requests > 0.0 { g.requests as f64 / total_requests } else { 0.0 };
    }
    groups.sort_by(|a, b| b.requests.cmp(&a.requests).then_with(|| a.group.cmp(&b.group)));
    groups.truncate(MAX_GROUPS);
    let mut hotspots = Vec::new();
    if total_requests > 0.0 {
        for g in &groups {
            for (col, cell) in g.cells.iter().enumerate() {
                let share = cell.requests as f64 / total_requests;
                if share > hotspot_share {
                    hotspots.push(Hotspot { group: g.group.clone(), replica: replicas[col].clone(), share });
                }
            }
        }
    }
    hotspots.sort_by(|a, b| b.share.total_cmp(&a.share));
    let window_s = states.iter().map(|s| s.window_s).max().unwrap_or(0);
    HeatMap {
        now_ms,
        routers,
        replicas,
        groups,
        hotspots,
        window_s,
        load_agreement: Vec::new(),
        prefix_placement: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routers::admin::parse_state;

    fn state(groups: &str) -> RouterState {
        parse_state(
            format!(
                r#"{{"policy": {{"name": "p", "version": 1}}, "window_s": 60,
                 "replicas": [{{"id": 0, "url": "http://a"}}, {{"id": 1, "url": "http://b"}}],
                 "prefix_groups": {groups}}}"#
            )
            .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn a_replica_carrying_a_big_group_alone_is_a_hotspot() {
        let s = state(
            r#"[{"group": "aa", "requests": 60, "share": 0.6,
                 "replicas": [{"id": 1, "requests": 58, "cached_blocks": 30, "hit_share": 0.95},
                              {"id": 0, "requests": 2, "cached_blocks": 1, "hit_share": 0.1}]},
                {"group": "bb", "requests": 40, "share": 0.4,
                 "replicas": [{"id": 0, "requests": 20, "cached_blocks": 5, "hit_share": 0.5},
                              {"id": 1, "requests": 20, "cached_blocks": 5, "hit_share": 0.5}]}]"#,
        );
        let map = build(&[s], vec![], 0.3, 7);
        assert_eq!(map.replicas, ["http://a", "http://b"]);
        assert_eq!(map.groups[0].group, "aa");
        assert_eq!(map.groups[0].cells[1].cached_blocks, 30);
        assert!((map.groups[0].share - 0.6).abs() < 1e-9);
        assert_eq!(map.hotspots.len(), 1, "{:?}", map.hotspots);
        assert_eq!(map.hotspots[0].replica, "http://b");
        assert!((map.hotspots[0].share - 0.58).abs() < 1e-9);
        // A higher threshold clears it; spread traffic never makes one.
        let s = state(
            r#"[{"group": "aa", "requests": 60, "share": 0.6, "replicas": [{"id": 1, "requests": 58}]}]"#,
        );
        assert!(build(&[s], vec![], 0.7, 7).hotspots.is_empty());
    }

    #[test]
    fn groups_from_two_routers_merge() {
        let one = state(
            r#"[{"group": "aa", "requests": 10, "share": 0.5, "replicas": [{"id": 0, "requests": 10, "hit_share": 1.0}]}]"#,
        );
        let two = state(
            r#"[{"group": "aa", "requests": 30, "share": 0.5, "replicas": [{"id": 0, "requests": 30, "hit_share": 0.0}]}]"#,
        );
        let map = build(&[one, two], vec![], 0.9, 0);
        assert_eq!(map.groups.len(), 1);
        assert_eq!(map.groups[0].requests, 40);
        assert!((map.groups[0].share - 0.5).abs() < 1e-9, "40 of 80 requests");
        assert!((map.groups[0].cells[0].hit_share - 0.25).abs() < 1e-9, "request-weighted");
    }

    #[test]
    fn no_routers_is_an_empty_map() {
        let map = build(&[], vec![], 0.3, 0);
        assert!(map.groups.is_empty() && map.hotspots.is_empty() && map.replicas.is_empty());
    }
}
