//! Hash routes (`#/fleet`, ...): the views the nav links to.
//!
//! Hash routing needs no server support, so the same `index.html` works from Tauri's custom
//! protocol and from the headless HTTP server. New views add a variant here and an arm in the
//! app's router; the nav is generated from [`Route::ALL`].

/// One top-level view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Route {
    /// The live replica table and TTFT chart.
    #[default]
    Fleet,
}

impl Route {
    /// Every route, in nav order.
    pub const ALL: &'static [Route] = &[Route::Fleet];

    /// The route for a `location.hash` value. Unknown or empty hashes fall back to the default
    /// view rather than a blank page, since operators often open a bare URL.
    pub fn from_hash(hash: &str) -> Route {
        let path = hash.trim_start_matches('#').trim_start_matches('/');
        let path = path.split(['?', '/']).next().unwrap_or("");
        Route::ALL.iter().copied().find(|r| r.slug() == path).unwrap_or_default()
    }

    /// The path segment after `#/`.
    pub fn slug(self) -> &'static str {
        match self {
            Route::Fleet => "fleet",
        }
    }

    /// The `href` of this route's nav link.
    pub fn href(self) -> String {
        format!("#/{}", self.slug())
    }

    /// The nav label.
    pub fn label(self) -> &'static str {
        match self {
            Route::Fleet => "Fleet",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_is_the_default() {
        assert_eq!(Route::from_hash(""), Route::Fleet);
        assert_eq!(Route::from_hash("#"), Route::Fleet);
        assert_eq!(Route::from_hash("#/nope"), Route::Fleet);
    }

    #[test]
    fn hrefs_round_trip() {
        for r in Route::ALL {
            assert_eq!(Route::from_hash(&r.href()), *r);
            assert_eq!(Route::from_hash(&format!("{}?x=1", r.href())), *r);
        }
        assert_eq!(Route::Fleet.href(), "#/fleet");
    }
}
