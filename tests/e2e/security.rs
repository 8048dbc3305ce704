//! The headless app against an attacker on the same laptop: no sign-in, a cross-site page (CSRF), a
//! DNS-rebinding page, SSRF and local-file reads through the API, listening beyond loopback in clear
//! text. Each attack is sent for real to the `fleetdeck` binary and must change nothing.

use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::routing::get;
use fleet_sim::ModelConfig;
use fleet_test_support::admin_router::spawn_admin_router;
use fleet_test_support::endpoints::serve;
use fleet_test_support::process::{HeadlessApp, bin_path, spawn_headless};
use fleet_test_support::spawn_sim;
use fleet_test_support::tls::self_signed_certificate;
use fleetdeck_api::ApiError;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE, HOST, ORIGIN, SET_COOKIE};
use serde_json::{Value, json};

const ROUTER_TOKEN: &str = "security-test-router-token";
const SPEC: &str = r#"{"policy": "round_robin"}"#;

/// A client that sends nothing it is not told to: no cookies, no redirects followed.
fn bare_client() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()?)
}

async fn refusal(response: reqwest::Response) -> Result<(StatusCode, ApiError)> {
    let status = response.status();
    let body = response.text().await?;
    let error = serde_json::from_str(&body).with_context(|| format!("{status}: not an ApiError: {body}"))?;
    Ok((status, error))
}

/// Signs in as a browser does: `GET /?token=` answers a redirect and the session cookie. Returns the
/// cookie to send (`name=value`) and the whole `Set-Cookie` line.
async fn sign_in(client: &reqwest::Client, app: &HeadlessApp) -> Result<(String, String)> {
    let answer = client.get(app.page("")).send().await?;
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    assert_eq!(answer.headers()["location"], "/", "the redirect drops the secret from the address bar");
    let set_cookie = answer.headers()[SET_COOKIE].to_str()?.to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set_cookie.contains(attribute), "the session cookie lacks {attribute}: {set_cookie}");
    }
    let cookie = set_cookie.split(';').next().context("an empty cookie")?.to_owned();
    Ok((cookie, set_cookie))
}

/// The version of the policy the router runs, read from its own admin API.
async fn router_version(client: &reqwest::Client, router: &str) -> Result<u64> {
    let policy: Value = client
        .get(format!("{router}/admin/policy"))
        .bearer_auth(ROUTER_TOKEN)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    policy["version"].as_u64().with_context(|| format!("no version in {policy}"))
}

#[tokio::test]
async fn every_command_and_page_needs_the_launch_secret() -> Result<()> {
    let db = tempfile::tempdir()?;
    let app =
        spawn_headless(&["--db".into(), db.path().join("h.sqlite").to_string_lossy().into_owned()], &[])
            .await?;
    let client = bare_client()?;

    // The command table itself is walked, so a command added later cannot skip the check.
    assert!(fleetdeck_control::commands::COMMANDS.len() >= 20);
    for command in fleetdeck_control::commands::COMMANDS {
        let (status, error) = refusal(client.post(app.api(command)).json(&json!({})).send().await?).await?;
        assert_eq!((status, error.code.as_str()), (StatusCode::UNAUTHORIZED, "unauthorized"), "{command}");
        let wrong =
            client.post(app.api(command)).bearer_auth("not-the-token").json(&json!({})).send().await?;
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED, "{command} with a wrong token");
        let forged = client
            .post(app.api(command))
            .header(COOKIE, format!("fleetdeck-{}=guess", app.url.rsplit(':').next().unwrap_or_default()))
            .json(&json!({}))
            .send()
            .await?;
        assert_eq!(forged.status(), StatusCode::UNAUTHORIZED, "{command} with a forged cookie");
    }
    // Signed in, the same calls go through (so the 401s above are the gate, not a broken server).
    let signed_in = client.post(app.api("settings")).bearer_auth(&app.token).json(&json!({})).send().await?;
    assert_eq!(signed_in.status(), StatusCode::OK);

    // The app's metrics (history writes, shed rounds) too: for the token's holder only.
    let metrics = format!("{}/metrics", app.url.trim_end_matches('/'));
    assert_eq!(client.get(&metrics).send().await?.status(), StatusCode::UNAUTHORIZED);
    let scraped = client.get(&metrics).bearer_auth(&app.token).send().await?;
    assert_eq!(scraped.status(), StatusCode::OK);
    let text = scraped.text().await?;
    assert!(text.contains("fleetdeck_history_rounds_shed_total 0"), "{text}");
    assert!(text.contains("fleetdeck_history_write_failures_total 0"), "{text}");

    // The UI's pages too: a stranger gets a page saying how to sign in, not the app.
    let page = client.get(&app.url).send().await?;
    assert_eq!(page.status(), StatusCode::UNAUTHORIZED);
    assert!(page.text().await?.contains("?token="));
    let wrong_link = client.get(format!("{}?token=guess", app.url)).send().await?;
    assert_eq!(wrong_link.status(), StatusCode::UNAUTHORIZED);

    // The browser's way in: the secret for a cookie, then the UI and its API with the cookie alone.
    let (cookie, _) = sign_in(&client, &app).await?;
    let index = client.get(&app.url).header(COOKIE, &cookie).send().await?;
    assert_eq!(index.status(), StatusCode::OK);
    let headers = index.headers().clone();
    assert!(headers["content-security-policy"].to_str()?.contains("script-src 'self' 'wasm-unsafe-eval'"));
    assert_eq!(headers["referrer-policy"], "no-referrer");
    assert!(index.text().await?.contains("boot.js"));
    let api = client.post(app.api("settings")).header(COOKIE, &cookie).json(&json!({})).send().await?;
    assert_eq!(api.status(), StatusCode::OK);
    Ok(())
}

#[tokio::test]
async fn cross_site_and_rebinding_requests_push_nothing() -> Result<()> {
    let sim = spawn_sim(2, ModelConfig::default()).await?;
    let router = spawn_admin_router(sim.urls(), ROUTER_TOKEN).await?;
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("router.token");
    fleet_store::secrets::write_token_file(&token_file, ROUTER_TOKEN)?;
    let args = [
        "--db".to_owned(),
        dir.path().join("h.sqlite").to_string_lossy().into_owned(),
        "--router".into(),
        router.url(),
        "--router-token-file".into(),
        token_file.to_string_lossy().into_owned(),
    ];
    let app = spawn_headless(&args, &[]).await?;
    let client = bare_client()?;
    let (cookie, _) = sign_in(&client, &app).await?;
    let before = router_version(&client, &router.url()).await?;
    let push = json!({"text": SPEC, "targets": [{"url": router.url()}]});
    let host = app.url.trim_start_matches("http://").trim_end_matches('/').to_owned();
    let port = host.rsplit(':').next().unwrap_or_default().to_owned();

    // A page elsewhere posts `text/plain` JSON with the operator's cookie (a "simple" request, no preflight).
    let plain = client
        .post(app.api("push_policy"))
        .header(COOKIE, &cookie)
        .header(CONTENT_TYPE, "text/plain")
        .body(push.to_string())
        .send()
        .await?;
    let (status, error) = refusal(plain).await?;
    assert_eq!((status, error.code.as_str()), (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"));
    // The same as the browser sends it: with its Origin, and the browser's own cross-site verdict.
    let cross_origin = client
        .post(app.api("push_policy"))
        .header(COOKIE, &cookie)
        .header(ORIGIN, "http://evil.example")
        .json(&push)
        .send()
        .await?;
    let (status, error) = refusal(cross_origin).await?;
    assert_eq!((status, error.code.as_str()), (StatusCode::FORBIDDEN, "bad_origin"));
    let cross_site = client
        .post(app.api("push_policy"))
        .header(COOKIE, &cookie)
        .header("sec-fetch-site", "cross-site")
        .json(&push)
        .send()
        .await?;
    assert_eq!(refusal(cross_site).await?.1.code, "cross_site");
    // A DNS-rebinding page: the right address, its own name in Host (it cannot have the cookie, but
    // even a request that had it is refused).
    let rebound = client
        .post(app.api("push_policy"))
        .header(HOST, format!("evil.example:{port}"))
        .header(COOKIE, &cookie)
        .json(&push)
        .send()
        .await?;
    let (status, error) = refusal(rebound).await?;
    assert_eq!((status, error.code.as_str()), (StatusCode::MISDIRECTED_REQUEST, "bad_host"));
    let rebound_page = client.get(&app.url).header(HOST, format!("evil.example:{port}")).send().await?;
    assert_eq!(rebound_page.status(), StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(router_version(&client, &router.url()).await?, before, "an attack moved the router's policy");

    // The UI's own request (same origin, JSON, the cookie) does push: the checks above could fail.
    let own = client
        .post(app.api("push_policy"))
        .header(COOKIE, &cookie)
        .header(ORIGIN, format!("http://{host}"))
        .header("sec-fetch-site", "same-origin")
        .json(&push)
        .send()
        .await?;
    assert_eq!(own.status(), StatusCode::OK, "{}", own.text().await?);
    assert_eq!(router_version(&client, &router.url()).await?, before + 1);
    Ok(())
}

#[tokio::test]
async fn the_api_reads_no_local_file_and_echoes_no_body() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let traces = dir.path().join("traces");
    std::fs::create_dir(&traces)?;
    std::fs::write(dir.path().join("secret.jsonl"), "{}")?;
    let args = [
        "--db".to_owned(),
        dir.path().join("h.sqlite").to_string_lossy().into_owned(),
        "--trace-dir".into(),
        traces.to_string_lossy().into_owned(),
    ];
    let app = spawn_headless(&args, &[]).await?;
    let client = app.client()?;

    for path in ["/etc/passwd", "../secret.jsonl", "/proc/self/environ"] {
        let args = json!({"text": SPEC, "window_s": 600, "trace_path": path});
        let (status, error) = refusal(client.post(app.api("start_whatif")).json(&args).send().await?).await?;
        assert_eq!((status, error.code.as_str()), (StatusCode::FORBIDDEN, "forbidden_path"), "{path}");
        assert!(!error.message.contains("root:"), "{}", error.message);
    }

    // An internal page behind a URL the API is asked to add: its body never comes back.
    const SECRET: &str = "internal-secret-7d1f";
    let internal = serve(
        Router::new()
            .route("/metrics", get(|| async { format!("{SECRET} is not an exposition\n") }))
            .route("/api/v1/targets", get(|| async { (StatusCode::NOT_FOUND, format!("<h1>{SECRET}</h1>")) }))
            .route("/admin/state", get(|| async { (StatusCode::FORBIDDEN, format!("<h1>{SECRET}</h1>")) })),
    )
    .await?;
    for (kind, token) in [("replica", None), ("prometheus", None), ("router", Some("t"))] {
        let args = json!({"kind": kind, "url": internal.url(), "token": token});
        let answer = client.post(app.api("add_endpoint")).json(&args).send().await?;
        let text = answer.text().await?;
        assert!(!text.contains(SECRET), "add_endpoint {kind} echoed the body: {text}");
    }
    let snapshot = client.post(app.api("fleet_snapshot")).json(&json!({})).send().await?.text().await?;
    assert!(!snapshot.contains(SECRET), "the fleet view echoed the body: {snapshot}");
    for url in ["ftp://127.0.0.1/", "file:///etc/passwd", "gopher://127.0.0.1:25/"] {
        let args = json!({"kind": "replica", "url": url});
        let (status, _) = refusal(client.post(app.api("add_endpoint")).json(&args).send().await?).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "only http(s) URLs are fetched: {url}");
    }
    Ok(())
}

#[tokio::test]
async fn beyond_loopback_needs_tls_and_tls_serves() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("h.sqlite").to_string_lossy().into_owned();
    let refused = tokio::process::Command::new(bin_path("fleetdeck")?)
        .args(["--headless", "--listen", "0.0.0.0:0", "--db", &db])
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    assert!(!refused.status.success(), "the app served beyond loopback in clear text");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("--tls-cert") && said.contains("--tls-key"), "{said}");

    let (cert, key) = self_signed_certificate(dir.path()).await?;
    let args = [
        "--db".to_owned(),
        db,
        "--tls-cert".into(),
        cert.to_string_lossy().into_owned(),
        "--tls-key".into(),
        key.to_string_lossy().into_owned(),
    ];
    let app = spawn_headless(&args, &[]).await?;
    assert!(app.url.starts_with("https://127.0.0.1:"), "{}", app.url);
    let trusted = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(&cert)?)?)
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()?;
    let (_, set_cookie) = sign_in(&trusted, &app).await?;
    assert!(set_cookie.contains("; Secure"), "an HTTPS session cookie is Secure: {set_cookie}");
    let settings = trusted.post(app.api("settings")).bearer_auth(&app.token).json(&json!({})).send().await?;
    assert_eq!(settings.status(), StatusCode::OK);
    let clear = bare_client()?.get(app.url.replacen("https://", "http://", 1)).send().await;
    assert!(clear.is_err() || clear.is_ok_and(|r| !r.status().is_success()), "plain HTTP was served");
    Ok(())
}
