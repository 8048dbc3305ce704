//! Who may use the headless server, decided from header values alone (no I/O, so every rule is
//! unit-tested here and the server only applies the verdicts).
//!
//! The threats are the operator's own laptop and browser: another local user (or a container in
//! the same network namespace) reaching the loopback port, a web page the operator visits posting to
//! it (CSRF), and a DNS-rebinding page that reads and writes it under a hostname it controls. So:
//! - a secret per launch, printed in the URL at start (as Jupyter does), is exchanged for an
//!   `HttpOnly`, `SameSite=Strict` session cookie; scripts may send it as `Authorization: Bearer`
//!   instead, which no other web page can add to a request without a CORS preflight we never grant;
//! - the `Host` header must name this server as it listens (loopback names, the bound address, or a
//!   `--public-name`), which is what defeats DNS rebinding;
//! - an `Origin` (or `Sec-Fetch-Site: cross-site`) from anywhere else is refused;
//! - API bodies must be `application/json`, which a cross-site form or `text/plain` fetch cannot send
//!   without a preflight.

use std::net::{IpAddr, SocketAddr};

use fleet_store::secrets::Secret;

/// Why a request is refused, as the HTTP status and the `{code, message}` the client gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into() }
    }
}

/// The rules of one running server: its secrets and the names it answers as.
#[derive(Debug)]
pub struct Gate {
    /// The secret in the printed URL (`?token=`), or a script's bearer token.
    launch: Secret,
    /// The value of the session cookie a browser gets for the launch secret.
    session: Secret,
    /// Cookies are scoped to a host, not a port, so the name carries the port: two Fleetdecks on one
    /// laptop never overwrite each other's session.
    cookie_name: String,
    /// Lower-case `host:port` forms a request's `Host` may take.
    hosts: Vec<String>,
    /// `scheme://host:port` forms a request's `Origin` may take.
    origins: Vec<String>,
    tls: bool,
}

impl Gate {
    /// The gate of a server bound to `addr`; `public_names` are extra host names (optionally with a
    /// port) it is reached by, e.g. through a VPN name when it listens beyond loopback.
    pub fn new(
        launch: Secret,
        session: Secret,
        addr: SocketAddr,
        public_names: &[String],
        tls: bool,
    ) -> Self {
        let port = addr.port();
        let mut hosts =
            vec![format!("localhost:{port}"), format!("127.0.0.1:{port}"), format!("[::1]:{port}")];
        if !addr.ip().is_unspecified() && !addr.ip().is_loopback() {
            hosts.push(match addr.ip() {
                IpAddr::V4(ip) => format!("{ip}:{port}"),
                IpAddr::V6(ip) => format!("[{ip}]:{port}"),
            });
        }
        for name in public_names {
            let name = name.trim().to_ascii_lowercase();
            let has_port = name.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok())
                && (!name.starts_with('[') || name.contains("]:"));
            hosts.push(if has_port { name } else { format!("{name}:{port}") });
        }
        // A browser leaves the port out of `Host` when it is the scheme's default.
        let default_port = if tls { 443 } else { 80 };
        if port == default_port {
            let bare: Vec<String> =
                hosts.iter().filter_map(|h| h.strip_suffix(&format!(":{port}")).map(str::to_owned)).collect();
            hosts.extend(bare);
        }
        let scheme = if tls { "https" } else { "http" };
        let origins = hosts.iter().map(|h| format!("{scheme}://{h}")).collect();
        Self { launch, session, cookie_name: format!("fleetdeck-{port}"), hosts, origins, tls }
    }

    /// The `Host` header must be one this server answers as; anything else is a request meant for
    /// another name, such as a DNS-rebinding page's.
    pub fn check_host(&self, host: Option<&str>) -> Result<(), Refusal> {
        let Some(host) = host.map(str::trim).filter(|h| !h.is_empty()) else {
            return Err(Refusal::new(400, "bad_host", "the request has no Host header"));
        };
        if self.hosts.iter().any(|allowed| allowed.eq_ignore_ascii_case(host)) {
            return Ok(());
        }
        Err(Refusal::new(
            421,
            "bad_host",
            format!(
                "this server does not answer as {host:?}; reach it as {} (start fleetdeck with --public-name NAME to add a name)",
                self.hosts[..2].join(" or ")
            ),
        ))
    }

    /// A request another site's page made: an `Origin` that is not this server's, or the browser's
    /// own `Sec-Fetch-Site: cross-site` verdict.
    pub fn check_origin(&self, origin: Option<&str>, fetch_site: Option<&str>) -> Result<(), Refusal> {
        if fetch_site.is_some_and(|site| site.trim().eq_ignore_ascii_case("cross-site")) {
            return Err(Refusal::new(403, "cross_site", "requests from other sites are refused"));
        }
        match origin.map(str::trim) {
            None => Ok(()),
            Some(origin) if self.origins.iter().any(|o| o.eq_ignore_ascii_case(origin)) => Ok(()),
            Some(origin) => Err(Refusal::new(
                403,
                "bad_origin",
                format!("requests from {origin:?} are refused; use the Fleetdeck UI this server serves"),
            )),
        }
    }

    /// The session cookie, or the launch secret as a bearer token (the scheme in any case, RFC 7235).
    pub fn check_auth(&self, cookies: Option<&str>, authorization: Option<&str>) -> Result<(), Refusal> {
        let bearer = authorization.and_then(fleet_router::admin::bearer_token);
        if bearer.is_some_and(|token| self.launch.matches(token)) {
            return Ok(());
        }
        if self.cookie(cookies).is_some_and(|value| self.session.matches(value)) {
            return Ok(());
        }
        let message = if bearer.is_some() {
            "the bearer token is wrong; use the token in the URL fleetdeck printed at start"
        } else {
            "not signed in; open the URL with ?token= that fleetdeck printed at start"
        };
        Err(Refusal::new(401, "unauthorized", message))
    }

    /// The value of our session cookie in a `Cookie` header.
    fn cookie<'a>(&self, cookies: Option<&'a str>) -> Option<&'a str> {
        cookies?.split(';').find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name.trim() == self.cookie_name).then(|| value.trim())
        })
    }

    /// The sign-in: `?token=` in a query exchanged for the session cookie. `None`: the query has no
    /// token, so this is not a sign-in.
    pub fn sign_in(&self, query: Option<&str>) -> Option<Result<String, Refusal>> {
        let token = query?.split('&').find_map(|pair| pair.strip_prefix("token="))?;
        if !self.launch.matches(token) {
            return Some(Err(Refusal::new(
                401,
                "unauthorized",
                "this sign-in link is not the current one; use the URL fleetdeck printed at its last start",
            )));
        }
        let secure = if self.tls { "; Secure" } else { "" };
        Some(Ok(format!(
            "{}={}; Path=/; HttpOnly; SameSite=Strict{secure}",
            self.cookie_name,
            self.session.expose()
        )))
    }

    /// API bodies must be JSON: a cross-site page can send `text/plain` or a form without a preflight,
    /// but not `application/json`.
    pub fn check_json(content_type: Option<&str>) -> Result<(), Refusal> {
        let media = content_type.and_then(|c| c.split(';').next()).map(str::trim).unwrap_or_default();
        if media.eq_ignore_ascii_case("application/json") {
            return Ok(());
        }
        Err(Refusal::new(
            415,
            "unsupported_media_type",
            format!(
                "the API takes JSON bodies only (Content-Type: application/json), not {:?}",
                content_type.unwrap_or("no Content-Type")
            ),
        ))
    }
}

/// Where a sign-in sends the browser back to: the path it asked for when that is a path of this server,
/// else `/`. A path starting `//` (or `/\`, or with a backslash or a control character anywhere) is one a
/// browser reads as another host (`GET //evil.example?token=...` would answer `Location: //evil.example`).
pub fn local_redirect(path: &str) -> &str {
    let local = path.starts_with('/')
        && !path.starts_with("//")
        && !path.contains('\\')
        && !path.chars().any(|c| c.is_control());
    if local { path } else { "/" }
}

/// Where the server may listen: loopback always; beyond it only with TLS, because the session
/// cookie and the launch secret would otherwise cross the network in clear text.
pub fn check_listen(addr: SocketAddr, tls: bool) -> Result<(), String> {
    if addr.ip().is_loopback() || tls {
        return Ok(());
    }
    Err(format!(
        "--listen {addr} is beyond loopback: others on the network could reach the app that steers your \
         routers, and its sign-in secret would cross the network in clear text. Give --tls-cert FILE and \
         --tls-key FILE (PEM) to serve HTTPS there, or listen on 127.0.0.1"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> Gate {
        Gate::new("launch-1".into(), "session-1".into(), "127.0.0.1:8610".parse().unwrap(), &[], false)
    }

    #[test]
    fn only_the_names_the_server_listens_as_are_answered() {
        let gate = gate();
        for host in ["127.0.0.1:8610", "localhost:8610", "LOCALHOST:8610", "[::1]:8610"] {
            assert_eq!(gate.check_host(Some(host)), Ok(()), "{host}");
        }
        for host in ["evil.example:8610", "127.0.0.1:8611", "localhost", "127.0.0.1.nip.io:8610"] {
            let refusal = gate.check_host(Some(host)).unwrap_err();
            assert_eq!((refusal.status, refusal.code), (421, "bad_host"), "{host}");
            assert!(refusal.message.contains("--public-name"), "{}", refusal.message);
        }
        assert_eq!(gate.check_host(None).unwrap_err().status, 400);
    }

    #[test]
    fn public_names_and_a_bound_address_are_answered_too() {
        let addr: SocketAddr = "0.0.0.0:9443".parse().unwrap();
        let gate = Gate::new("l".into(), "s".into(), addr, &["deck.example".into(), "vpn:1234".into()], true);
        assert_eq!(gate.check_host(Some("deck.example:9443")), Ok(()));
        assert_eq!(gate.check_host(Some("vpn:1234")), Ok(()));
        assert!(gate.check_host(Some("0.0.0.0:9443")).is_err());
        assert_eq!(gate.check_origin(Some("https://deck.example:9443"), None), Ok(()));
        assert!(gate.check_origin(Some("http://deck.example:9443"), None).is_err(), "the scheme counts");
        let bound = Gate::new("l".into(), "s".into(), "10.1.2.3:443".parse().unwrap(), &[], true);
        assert_eq!(bound.check_host(Some("10.1.2.3")), Ok(()), "the default port may be left out");
    }

    #[test]
    fn other_sites_are_refused() {
        let gate = gate();
        assert_eq!(gate.check_origin(None, None), Ok(()));
        assert_eq!(gate.check_origin(Some("http://127.0.0.1:8610"), Some("same-origin")), Ok(()));
        for origin in ["http://evil.example", "null", "http://127.0.0.1:8611", "https://127.0.0.1:8610"] {
            assert_eq!(gate.check_origin(Some(origin), None).unwrap_err().code, "bad_origin", "{origin}");
        }
        assert_eq!(gate.check_origin(None, Some("cross-site")).unwrap_err().code, "cross_site");
    }

    #[test]
    fn the_session_cookie_or_the_launch_secret_signs_a_request_in() {
        let gate = gate();
        assert_eq!(gate.check_auth(Some("a=b; fleetdeck-8610=session-1"), None), Ok(()));
        assert_eq!(gate.check_auth(None, Some("Bearer launch-1")), Ok(()));
        let cases = [
            (None, None),
            (Some("fleetdeck-8610=session-2"), None),
            (Some("fleetdeck-8611=session-1"), None),
            (Some("fleetdeck-8610=launch-1"), None),
            (None, Some("Bearer session-1")),
            (None, Some("Basic launch-1")),
        ];
        for authorization in ["bearer launch-1", "BEARER launch-1", "Bearer  launch-1 "] {
            assert_eq!(gate.check_auth(None, Some(authorization)), Ok(()), "{authorization:?}");
        }
        for (cookies, authorization) in cases {
            let refusal = gate.check_auth(cookies, authorization).unwrap_err();
            assert_eq!(
                (refusal.status, refusal.code),
                (401, "unauthorized"),
                "{cookies:?} {authorization:?}"
            );
        }
    }

    #[test]
    fn sign_in_exchanges_the_launch_secret_for_a_strict_http_only_cookie() {
        let gate = gate();
        assert_eq!(gate.sign_in(None), None);
        assert_eq!(gate.sign_in(Some("x=1")), None);
        let cookie = gate.sign_in(Some("x=1&token=launch-1")).unwrap().unwrap();
        assert_eq!(cookie, "fleetdeck-8610=session-1; Path=/; HttpOnly; SameSite=Strict");
        assert_eq!(gate.sign_in(Some("token=launch-2")).unwrap().unwrap_err().status, 401);
        let tls = Gate::new("l".into(), "s".into(), "127.0.0.1:1".parse().unwrap(), &[], true);
        assert!(tls.sign_in(Some("token=l")).unwrap().unwrap().ends_with("; Secure"));
    }

    #[test]
    fn a_sign_in_goes_back_to_a_path_of_this_server_only() {
        for path in ["/", "/index.html", "/a/b", "/a//b"] {
            assert_eq!(local_redirect(path), path);
        }
        for path in
            ["//evil.example", "///evil.example", "/\\evil.example", "/a\\b", "/\t/evil.example", "evil", ""]
        {
            assert_eq!(local_redirect(path), "/", "{path:?}");
        }
    }

    #[test]
    fn api_bodies_must_be_json() {
        assert_eq!(Gate::check_json(Some("application/json")), Ok(()));
        assert_eq!(Gate::check_json(Some("Application/JSON; charset=utf-8")), Ok(()));
        for other in
            [None, Some("text/plain"), Some("application/x-www-form-urlencoded"), Some("multipart/form-data")]
        {
            assert_eq!(Gate::check_json(other).unwrap_err().status, 415, "{other:?}");
        }
    }

    #[test]
    fn listening_beyond_loopback_needs_tls() {
        assert!(check_listen("127.0.0.1:0".parse().unwrap(), false).is_ok());
        assert!(check_listen("[::1]:0".parse().unwrap(), false).is_ok());
        assert!(check_listen("0.0.0.0:8610".parse().unwrap(), true).is_ok());
        let refused = check_listen("0.0.0.0:8610".parse().unwrap(), false).unwrap_err();
        assert!(refused.contains("--tls-cert") && refused.contains("--tls-key"), "{refused}");
    }
}
