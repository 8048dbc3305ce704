//! Fetching one `/metrics` endpoint: bounded in time and size, errors worded for operators.

use std::time::Duration;

pub use fleet_base::error::error_chain;
use fleet_base::http::{BodyError, read_limited};

use crate::engines::{self, UnsupportedEngine};
use crate::exposition::{self, MAX_EXPOSITION_BYTES, ParseError};
use crate::signals::Reading;

/// Limits of one scrape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScrapeLimits {
    /// Whole-scrape deadline: connect, headers and body.
    pub timeout: Duration,
    /// Largest body read; a larger one is refused rather than buffered.
    pub max_bytes: usize,
}

impl Default for ScrapeLimits {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(2), max_bytes: MAX_EXPOSITION_BYTES }
    }
}

/// Why a scrape failed, in words an operator can act on.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("cannot connect to {url}: is the replica running? ({detail})")]
    Unreachable { url: String, detail: String },
    #[error("the TLS certificate of {url} is not trusted ({detail}); {TRUST_HINT}")]
    UntrustedCertificate { url: String, detail: String },
    #[error("no answer from {url} within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("{url} answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error(
        "{url} sent more than {max} bytes of metrics; raise the size limit if the engine really exports that much"
    )]
    TooLarge { url: String, max: usize },
    #[error("{url} sent metrics that are not UTF-8 text")]
    NotText { url: String },
    #[error("{url} sent a malformed exposition: {source}")]
    Parse { url: String, source: ParseError },
    #[error("{url}: {source}")]
    Unsupported { url: String, source: UnsupportedEngine },
}

/// What to do about a certificate the machine does not trust.
pub const TRUST_HINT: &str =
    "add its CA to the system's trust store, or point SSL_CERT_FILE at a PEM file that holds it";

/// Whether a connection failed on the peer's TLS certificate (OpenSSL's words for it).
/// A peer's own error message made fit to show: at most 120 characters, control characters and runs of
/// white space folded to one space. For messages a peer's API gives in a structured field; a raw body
/// is never shown (the URL was typed by whoever uses the app, so its answer may be anything).
pub fn short_reason(message: &str) -> String {
    const MAX_CHARS: usize = 120;
    let folded: Vec<&str> =
        message.split(|c: char| c.is_whitespace() || c.is_control()).filter(|w| !w.is_empty()).collect();
    let folded = folded.join(" ");
    match folded.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{}...", &folded[..cut]),
        None => folded,
    }
}

pub fn untrusted_certificate(detail: &str) -> bool {
    detail.contains("certificate verify failed")
}

/// A failed connection's cause chain, with [`TRUST_HINT`] when the certificate was not trusted.
pub fn connect_detail(error: &dyn std::error::Error) -> String {
    let detail = error_chain(error);
    if untrusted_certificate(&detail) { format!("{detail}; {TRUST_HINT}") } else { detail }
}

fn connect_error(url: &str, error: &reqwest::Error) -> ScrapeError {
    let detail = error_chain(error);
    if untrusted_certificate(&detail) {
        ScrapeError::UntrustedCertificate { url: url.to_owned(), detail }
    } else {
        ScrapeError::Unreachable { url: url.to_owned(), detail }
    }
}

/// Redirects followed within one request, at most.
pub const MAX_REDIRECTS: usize = 5;

/// The redirect policy of every client that reads what an operator pointed the app at (replicas, routers,
/// Prometheus servers): a redirect is followed only within the first URL's origin (scheme, host and port),
/// at most [`MAX_REDIRECTS`] times. A redirect elsewhere is not followed: the answer is the 3xx itself, an
/// error naming its status, so a replica answering 302 cannot send the app's scrapes (or an admin call
/// and its token) to another port or host.
pub fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let next = attempt.url();
        let origin = |url: &reqwest::Url| {
            (url.scheme().to_owned(), url.host_str().map(str::to_owned), url.port_or_known_default())
        };
        let same = attempt.previous().first().is_some_and(|first| origin(first) == origin(next));
        if !same {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    })
}

/// An HTTP client fit for scraping: connect deadline, kept-alive connections, redirects only within the
/// target's origin ([`same_origin_redirects`]).
pub fn client(connect_timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(Duration::from_secs(30))
        .redirect(same_origin_redirects())
        .build()
}

/// The metrics URL of a target: a bare base URL gets `/metrics`; a URL with a path is kept.
pub fn metrics_url(target: &str) -> String {
    let trimmed = target.trim_end_matches('/');
    let after_scheme = trimmed.split_once("://").map_or(trimmed, |(_, rest)| rest);
    if after_scheme.contains('/') { trimmed.to_string() } else { format!("{trimmed}/metrics") }
}

/// Fetches the exposition text at `url`.
pub async fn fetch(client: &reqwest::Client, url: &str, limits: ScrapeLimits) -> Result<String, ScrapeError> {
    let accept = "text/plain;version=0.0.4;q=1,application/openmetrics-text;q=0.5,*/*;q=0.1";
    let (status, body) = fetch_any(client, url, accept, limits).await?;
    if !(200..300).contains(&status) {
        return Err(ScrapeError::Status { url: url.to_string(), status });
    }
    Ok(body)
}

/// GETs `url` within `limits` and returns the status and the text body, whatever the status
/// (an API's error body explains its error).
pub(crate) async fn fetch_any(
    client: &reqwest::Client,
    url: &str,
    accept: &str,
    limits: ScrapeLimits,
) -> Result<(u16, String), ScrapeError> {
    let work = async {
        let response = client
            .get(url)
            .header(reqwest::header::ACCEPT, accept)
            .send()
            .await
            .map_err(|e| connect_error(url, &e))?;
        let status = response.status().as_u16();
        let body = read_limited(response, limits.max_bytes).await.map_err(|error| match error {
            BodyError::TooLarge => ScrapeError::TooLarge { url: url.to_string(), max: limits.max_bytes },
            BodyError::Broken(detail) => ScrapeError::Unreachable { url: url.to_string(), detail },
        })?;
        let text = String::from_utf8(body).map_err(|_| ScrapeError::NotText { url: url.to_string() })?;
        Ok((status, text))
    };
    tokio::time::timeout(limits.timeout, work)
        .await
        .unwrap_or_else(|_| Err(ScrapeError::Timeout { url: url.to_string(), timeout: limits.timeout }))
}

/// Fetches, parses and reads one target.
pub async fn scrape(
    client: &reqwest::Client,
    target: &str,
    limits: ScrapeLimits,
) -> Result<Reading, ScrapeError> {
    let url = metrics_url(target);
    let text = fetch(client, &url, limits).await?;
    let exposition =
        exposition::parse(&text).map_err(|source| ScrapeError::Parse { url: url.clone(), source })?;
    engines::read(&exposition).map_err(|source| ScrapeError::Unsupported { url, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_reasons_are_short_and_on_one_line() {
        assert_eq!(short_reason("  bad\n\tquery\u{7}  here "), "bad query here");
        let long = short_reason(&"é".repeat(500));
        assert_eq!(long.chars().count(), 123);
        assert!(long.ends_with("..."));
    }

    #[test]
    fn an_untrusted_certificate_says_what_to_do() {
        let tls = std::io::Error::other(
            "error:0A000086:SSL routines:tls_post_process_server_certificate:certificate verify failed",
        );
        assert!(connect_detail(&tls).ends_with(TRUST_HINT));
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        assert_eq!(connect_detail(&refused), "connection refused");
    }

    #[test]
    fn metrics_url_appends_the_default_path_only_to_bare_urls() {
        assert_eq!(metrics_url("http://h:1"), "http://h:1/metrics");
        assert_eq!(metrics_url("http://h:1/"), "http://h:1/metrics");
        assert_eq!(metrics_url("http://h:1/engine/metrics"), "http://h:1/engine/metrics");
    }
}
