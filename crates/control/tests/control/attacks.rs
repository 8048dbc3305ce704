//! The attack round's findings against the app core, replayed over real HTTP on loopback: a router whose
//! answers are larger than the app reads at once is paged through, not failed; what a fetched body says is
//! never echoed; a redirect never takes a scrape or an admin call to another origin; two routers never share
//! a token file.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Query;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use fleet_test_support::endpoints::serve;
use fleet_test_support::eventually;
use fleetdeck_api::{AddEndpointArgs, EndpointKind, RemoveEndpointArgs};
use fleetdeck_control::routers::admin::{AdminClient, MAX_ADMIN_BODY, MAX_TRACE_BODY};
use fleetdeck_control::{Control, ControlConfig};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    after: usize,
    limit: usize,
}

/// A body of `count` copies of `line`, announced with its length (so a reader with a smaller limit
/// refuses it before reading), produced as it is sent.
fn repeated(line: Bytes, count: usize) -> Response {
    let length = line.len() * count;
    let stream = futures_util::stream::iter((0..count).map(move |_| Ok::<_, std::io::Error>(line.clone())));
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(header::CONTENT_LENGTH, length.into());
    response
}

#[tokio::test]
async fn a_router_with_pages_too_large_to_read_at_once_is_paged_not_failed() -> Result<()> {
    // A router that bounds its pages by records only (as fleet-router did): 100 records of about 850 KB,
    // 85 MB for a page of 10,000 (the app reads at most 64 MiB a page); and decisions of 200 KB each.
    const RECORDS: usize = 100;
    let ids: Vec<String> = (0..50_000u64).map(|i| (1_000_000_000_000_000 + i).to_string()).collect();
    let record = format!(
        "{{\"timestamp\": {}, \"input_length\": 800000, \"output_length\": 1, \"block_tokens\": 16, \"hash_ids\": [{}]}}\n",
        fleetdeck_control_now_ms(),
        ids.join(",")
    );
    let record = Bytes::from(record);
    let asked = Arc::new(AtomicUsize::new(0));
    let decision = Bytes::from(format!(
        "{{\"ts_ms\": 1, \"request_id\": 1, \"replica\": \"r\", \"policy\": \"p\", \"decision\": {{\"replica\": 0, \
         \"branch\": \"b\", \"reason\": \"{}\", \"candidates\": []}}}}",
        "r".repeat(200_000)
    ));
    let trace = {
        let (record, asked) = (record.clone(), asked.clone());
        move |Query(page): Query<Page>| {
            let (record, asked) = (record.clone(), asked.clone());
            async move {
                asked.fetch_add(1, Ordering::Relaxed);
                let count = page.limit.min(RECORDS.saturating_sub(page.after));
                let mut response = repeated(record, count);
                let headers = response.headers_mut();
                headers.insert("x-fleet-trace-next", (page.after + count).into());
                headers.insert("x-fleet-trace-more", (RECORDS - page.after - count).into());
                headers.insert("x-fleet-trace-epoch", 1.into());
                response
            }
        }
    };
    let decisions = move |Query(page): Query<Page>| {
        let decision = decision.clone();
        async move {
            let body = vec![decision; page.limit].join(&b","[..]);
            ([(header::CONTENT_TYPE, "application/json")], [b"[".as_slice(), &body, b"]"].concat())
        }
    };
    let router = serve(
        Router::new()
            .route("/admin/trace", get(trace))
            .route("/admin/decisions", get(decisions))
            .route("/admin/state", get(|| async { (StatusCode::OK, "{}") })),
    )
    .await?;
    let client = AdminClient::new(http()?, &router.url(), Some("token".into()));

    let window = client.trace_window(0, 500_000).await?;
    assert_eq!(window.records.len(), RECORDS, "every record was read");
    assert!(window.pages >= 2, "in more than one page: {}", window.pages);
    assert!(record.len() * 10_000 > MAX_TRACE_BODY, "the first page asked for was over the app's limit");
    eprintln!("{} records in {} pages after {} asks", RECORDS, window.pages, asked.load(Ordering::Relaxed));

    let entries = client.decisions(50, &Default::default()).await?;
    assert!(!entries.is_empty() && entries.len() < 50, "fewer decisions, not none: {}", entries.len());
    assert!(entries.len() * 200_000 <= MAX_ADMIN_BODY);
    Ok(())
}

fn http() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?)
}

fn fleetdeck_control_now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The app core with nothing to watch, its files in a temporary folder.
async fn control(dir: &std::path::Path) -> Result<(Control, tokio_util::sync::DropGuard)> {
    let stop = CancellationToken::new();
    let config = ControlConfig::new(Vec::new(), dir.join("history.sqlite"));
    let control = Control::start(config, stop.clone()).await?;
    Ok((control, stop.drop_guard()))
}

#[tokio::test]
async fn a_fetched_body_is_never_echoed_and_redirects_stay_on_the_origin() -> Result<()> {
    // Another port the redirects point to: it must never be asked anything.
    let elsewhere_hits = Arc::new(AtomicUsize::new(0));
    let elsewhere = {
        let hits = elsewhere_hits.clone();
        let count = move || {
            let hits = hits.clone();
            async move {
                hits.fetch_add(1, Ordering::Relaxed);
                "vllm:num_requests_running 1\n"
            }
        };
        serve(Router::new().route("/metrics", get(count.clone())).route("/admin/state", get(count))).await?
    };
    let away = format!("{}/metrics", elsewhere.url());
    let away_state = format!("{}/admin/state", elsewhere.url());
    const SECRET: &str = "SOME-TEXT-7f3a";
    let endpoint = serve(
        Router::new()
            // A "router" whose state is a string where the app expects an object (serde quoted it back).
            .route("/admin/state", get(|| async { format!(r#"{{"policy":"{SECRET}"}}"#) }))
            .route("/metrics", get(move || async move { (StatusCode::FOUND, [(header::LOCATION, away)]) }))
            .route(
                "/moved/admin/state",
                get(move || async move { (StatusCode::FOUND, [(header::LOCATION, away_state)]) }),
            )
            // A redirect within the origin is followed.
            .route(
                "/here/metrics",
                get(|| async { (StatusCode::FOUND, [(header::LOCATION, "/real/metrics")]) }),
            )
            .route(
                "/real/metrics",
                get(|| async { "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n" }),
            ),
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let (control, _stop) = control(dir.path()).await?;
    let add = |kind: EndpointKind, url: String, token: Option<&str>| {
        let settings = control.settings().clone();
        let token = token.map(str::to_owned);
        async move { settings.add_endpoint(AddEndpointArgs { kind, url, token }).await }
    };

    let router = add(EndpointKind::Router, endpoint.url(), Some("t")).await?;
    let said = serde_json::to_string(&router)?;
    assert!(!said.contains(SECRET), "the body came back: {said}");
    assert!(router.error.as_deref().is_some_and(|e| e.contains("expected struct")), "{said}");

    let replica = add(EndpointKind::Replica, endpoint.url(), None).await?;
    let said = serde_json::to_string(&replica)?;
    assert!(
        replica.error.as_deref().is_some_and(|e| e.contains("302")),
        "the redirect is not followed: {said}"
    );
    let moved = add(EndpointKind::Router, format!("{}/moved", endpoint.url()), Some("t")).await?;
    assert!(moved.error.as_deref().is_some_and(|e| e.contains("302")), "{moved:?}");
    // The app's scrapes of the replica keep running; give them a few rounds to go astray.
    let snapshot = eventually("a few scrapes of the redirecting replica", Duration::from_secs(20), || async {
        let snapshot = control.fleet().snapshot(Default::default()).await?;
        let failures = snapshot
            .replicas
            .iter()
            .filter(|r| matches!(&r.scrape, fleetdeck_api::ScrapeState::Error { message, .. } if message.contains("302")))
            .count();
        Ok((failures > 0).then_some(snapshot))
    })
    .await?;
    assert!(!serde_json::to_string(&snapshot)?.contains(SECRET));
    let followed = add(EndpointKind::Replica, format!("{}/here/metrics", endpoint.url()), None).await?;
    assert_eq!(followed.error, None, "a redirect within the origin is followed: {followed:?}");
    assert_eq!(elsewhere_hits.load(Ordering::Relaxed), 0, "a redirect took a request to another port");
    Ok(())
}

#[tokio::test]
async fn two_routers_never_share_a_token_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (control, _stop) = control(dir.path()).await?;
    let base = fleet_test_support::endpoints::unreachable_url().await?;
    let (a, b) = (format!("{base}/a/b"), format!("{base}/a_b"));
    let settings = control.settings().clone();
    for (url, token) in [(&a, "token-of-a"), (&b, "token-of-b")] {
        let args =
            AddEndpointArgs { kind: EndpointKind::Router, url: url.clone(), token: Some(token.into()) };
        settings.add_endpoint(args).await?;
    }
    let view = settings.view().await?;
    let file_of = |url: &str| -> Result<std::path::PathBuf> {
        let row = view.routers.iter().find(|r| r.url == url).context("router not listed")?;
        Ok(row.token_file.clone().context("no token file")?.into())
    };
    let (file_a, file_b) = (file_of(&a)?, file_of(&b)?);
    assert_ne!(file_a, file_b, "the two routers share a token file");
    // Adding B left A's token alone; removing B leaves A's file.
    assert_eq!(std::fs::read_to_string(&file_a)?, "token-of-a");
    settings.remove_endpoint(RemoveEndpointArgs { kind: EndpointKind::Router, url: b.clone() }).await?;
    assert!(!file_b.exists(), "B's own file goes with it");
    assert_eq!(std::fs::read_to_string(&file_a)?, "token-of-a", "A's token survives B's removal");
    Ok(())
}
