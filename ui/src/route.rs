//! Hash routes (`#/fleet`, `#/replica/3`, ...): the views the nav and the keyboard switch
//! between.
//!
//! Hash routing needs no server support, so the same `index.html` works from Tauri's custom
//! protocol and from the headless HTTP server. New views add a variant here and an arm in the
//! app's router; the nav is generated from [`Route::NAV`].

/// One view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Route {
    /// Fleet overview: a tile per replica.
    #[default]
    Fleet,
    /// Prefix-cache heat map.
    Heat,
    /// One replica's history charts (its `ReplicaRow::id`).
    Replica(u32),
    /// Recent routing decisions.
    Decisions,
    /// Achieved vs achievable hit rate.
    Headroom,
    /// Fleets and settings.
    Settings,
    /// Policy editor (issue #10).
    Policy,
    /// What-if replay of the candidate policy.
    WhatIf,
    /// Push with compare-and-swap, and the canary.
    Push,
    /// Compare two policy versions.
    History,
    /// A disaggregated fleet: roles, split decisions by reason, TTFT by leg.
    Pd,
}

impl Route {
    /// The views in the nav, in order; number keys 1..=5 follow this order.
    pub const NAV: &'static [Route] = &[
        Route::Fleet,
        Route::Heat,
        Route::Decisions,
        Route::Headroom,
        Route::Settings,
        Route::Policy,
        Route::WhatIf,
        Route::Push,
        Route::History,
        Route::Pd,
    ];

    /// The route for a `location.hash` value. Unknown or empty hashes fall back to the default
    /// view rather than a blank page, since operators often open a bare URL.
    pub fn from_hash(hash: &str) -> Route {
        let path = hash.trim_start_matches('#').trim_start_matches('/');
        let path = path.split('?').next().unwrap_or("");
        let mut parts = path.split('/');
        match (parts.next().unwrap_or(""), parts.next()) {
            ("replica", Some(id)) => id.parse().map(Route::Replica).unwrap_or_default(),
            (slug, _) => Route::NAV.iter().copied().find(|r| r.slug() == slug).unwrap_or_default(),
        }
    }

    /// The first path segment after `#/`.
    pub fn slug(self) -> &'static str {
        match self {
            Route::Fleet => "fleet",
            Route::Heat => "heat",
            Route::Replica(_) => "replica",
            Route::Decisions => "decisions",
            Route::Headroom => "headroom",
            Route::Settings => "settings",
            Route::Policy => "policy",
            Route::WhatIf => "whatif",
            Route::Push => "push",
            Route::History => "history",
            Route::Pd => "pd",
        }
    }

    /// The link to this route.
    pub fn href(self) -> String {
        match self {
            Route::Replica(id) => format!("#/replica/{id}"),
            other => format!("#/{}", other.slug()),
        }
    }

    /// The nav label.
    pub fn label(self) -> &'static str {
        match self {
            Route::Fleet => "Fleet",
            Route::Heat => "Cache heat",
            Route::Replica(_) => "Replica",
            Route::Decisions => "Decisions",
            Route::Headroom => "Headroom",
            Route::Settings => "Settings",
            Route::Policy => "Policy",
            Route::WhatIf => "What-if",
            Route::Push => "Push",
            Route::History => "History",
            Route::Pd => "P/D",
        }
    }

    /// The letter that follows `g` to jump here.
    pub fn key(self) -> char {
        match self {
            Route::Fleet => 'f',
            Route::Heat => 'h',
            Route::Replica(_) => 'p',
            Route::Decisions => 'd',
            Route::Headroom => 'r',
            Route::Settings => 's',
            Route::Policy => 'o',
            Route::WhatIf => 'w',
            Route::Push => 'u',
            Route::History => 'y',
            Route::Pd => 'x',
        }
    }

    /// Whether a nav entry for `self` is the current place (a replica detail belongs to Fleet).
    pub fn nav_active(self, current: Route) -> bool {
        self == current || (self == Route::Fleet && matches!(current, Route::Replica(_)))
    }
}

/// The value of `name` in the hash's query (`#/fleet?synthetic=1000`).
pub fn query_param<'a>(hash: &'a str, name: &str) -> Option<&'a str> {
    let (_, query) = hash.split_once('?')?;
    query.split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| v)
}

/// The page's hash as the browser has it now (`#/fleet?synthetic=1000`); the one read of the
/// location, so routes and query parameters come from the same place.
#[cfg(target_arch = "wasm32")]
pub fn current_hash() -> String {
    leptos::prelude::window().location().hash().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_is_the_default() {
        assert_eq!(Route::from_hash(""), Route::Fleet);
        assert_eq!(Route::from_hash("#"), Route::Fleet);
        assert_eq!(Route::from_hash("#/nope"), Route::Fleet);
        assert_eq!(Route::from_hash("#/replica/x"), Route::Fleet);
    }

    #[test]
    fn hrefs_round_trip() {
        for r in Route::NAV.iter().copied().chain([Route::Replica(0), Route::Replica(42)]) {
            assert_eq!(Route::from_hash(&r.href()), r);
            assert_eq!(Route::from_hash(&format!("{}?x=1", r.href())), r);
        }
        assert_eq!(Route::Fleet.href(), "#/fleet");
        assert_eq!(Route::Replica(7).href(), "#/replica/7");
    }

    #[test]
    fn nav_keys_are_distinct() {
        let mut keys: Vec<char> = Route::NAV.iter().map(|r| r.key()).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), Route::NAV.len());
        assert!(Route::Fleet.nav_active(Route::Replica(3)));
        assert!(!Route::Heat.nav_active(Route::Replica(3)));
    }

    #[test]
    fn query_params_are_read_from_the_hash() {
        assert_eq!(query_param("#/fleet?synthetic=1000&x=2", "synthetic"), Some("1000"));
        assert_eq!(query_param("#/fleet?x=2", "synthetic"), None);
        assert_eq!(query_param("#/fleet", "synthetic"), None);
    }
}
