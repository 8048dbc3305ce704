//! The router's optional build features, end to end: HTTPS with rustls (`tls`) and token-exact blocks from a
//! Hugging Face tokenizer.json (`tokenizer`). `cargo xtask test` runs these with
//! `--features tls,tokenizer`; a build without the features compiles them out.

#[cfg(feature = "tls")]
mod tls {
    use std::path::Path;
    use std::time::Duration;

    use anyhow::{Context, Result};
    use fleet_router::{RouterConfig, TlsConfig};
    use fleet_sim::ModelConfig;
    use fleet_test_support::{loopback_listener, spawn_sim};
    use tokio::process::Command;
    use tokio_util::sync::CancellationToken;

    async fn self_signed(dir: &Path) -> Result<TlsConfig> {
        let (cert, key) = fleet_test_support::tls::self_signed_certificate(dir).await?;
        Ok(TlsConfig { cert, key })
    }

    /// curl (a real TLS client) POSTing `body` to `url`, trusting `ca`; returns (exit ok, headers + body).
    async fn curl(url: &str, ca: &Path, body: &str) -> Result<(bool, String)> {
        let output = Command::new("curl")
            .args(["-sS", "--max-time", "20", "-D", "-", "-H", "content-type: application/json"])
            .arg("--cacert")
            .arg(ca)
            .args(["--data", body, url])
            .output()
            .await
            .context("cannot run curl")?;
        let text =
            String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
        Ok((output.status.success(), text))
    }

    #[tokio::test]
    async fn https_serves_completions_and_a_silent_client_holds_up_no_one() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let tls = self_signed(dir.path()).await?;
        let sim = spawn_sim(1, ModelConfig::default()).await?;
        let listener = loopback_listener().await?;
        let address = listener.local_addr()?;
        let stop = CancellationToken::new();
        let _guard = stop.clone().drop_guard();
        let config =
            RouterConfig { replicas: sim.urls().to_vec(), tls: Some(tls.clone()), ..RouterConfig::default() };
        let stopped = stop.clone();
        let (_state, _server) =
            fleet_router::start(listener, config, async move { stopped.cancelled().await }).await?;

        // A client that connects and never says a word must not block the next one's handshake.
        let _silent = tokio::net::TcpStream::connect(address).await?;
        let request = r#"{"prompt": "hello over tls", "max_tokens": 2}"#;
        let url = format!("https://127.0.0.1:{}/v1/completions", address.port());
        let (ok, answer) = tokio::time::timeout(Duration::from_secs(30), curl(&url, &tls.cert, request))
            .await
            .context("the HTTPS request hung")??;
        assert!(ok, "{answer}");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains(&format!("x-fleet-replica: {}", sim.urls()[0])), "{answer}");
        assert!(answer.contains("\"text_completion\""), "{answer}");

        // Plain HTTP to the TLS port is refused (the handshake fails), within seconds rather than a hang.
        let plain = format!("http://127.0.0.1:{}/v1/completions", address.port());
        let (ok, answer) = tokio::time::timeout(Duration::from_secs(5), curl(&plain, &tls.cert, request))
            .await
            .context("plain HTTP on the TLS port hung")??;
        assert!(!ok, "plain HTTP got an answer: {answer}");
        Ok(())
    }

    #[tokio::test]
    async fn a_wrong_key_file_is_named() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let tls = self_signed(dir.path()).await?;
        let swapped = TlsConfig { cert: tls.cert.clone(), key: tls.cert.clone() };
        let config = RouterConfig { tls: Some(swapped), ..RouterConfig::default() };
        let listener = loopback_listener().await?;
        let error =
            fleet_router::start(listener, config, std::future::pending()).await.err().context("started")?;
        assert!(format!("{error:#}").contains("--tls-key"), "{error:#}");
        Ok(())
    }
}

/// The policy from an etcd that serves https and asks for a client certificate (`--etcd-ca`, `--etcd-cert`,
/// `--etcd-key`), which the `tls` feature's client offers.
#[cfg(feature = "tls")]
mod etcd_tls {
    use std::time::Duration;

    use anyhow::Result;
    use fleet_etcd::EtcdClient;
    use fleet_router::{EtcdPolicySource, RouterConfig};
    use fleet_test_support::etcd::EtcdServer;
    use fleet_test_support::eventually;

    #[tokio::test]
    async fn the_router_watches_a_key_over_https_with_its_client_certificate() -> Result<()> {
        let etcd = EtcdServer::start_tls().await?;
        let store = EtcdClient::new(etcd.config())?;
        store.put("/fleetdeck/tls/policy", br#"{"policy": "least_load"}"#).await?;
        let mut source = EtcdPolicySource::new(&etcd.url(), "/fleetdeck/tls/policy");
        source.etcd = etcd.config();
        let router =
            crate::support::router(RouterConfig { policy_etcd: Some(source), ..Default::default() }).await?;
        assert_eq!(router.state.policy.load().name, "least_load");
        let next = store.put("/fleetdeck/tls/policy", br#"{"policy": "random"}"#).await?;
        eventually("the router to take the change over https", Duration::from_secs(20), || async {
            Ok((router.state.policy.load().store_revision == Some(next)).then_some(()))
        })
        .await?;
        Ok(())
    }
}

#[cfg(feature = "tokenizer")]
mod tokenizer {
    use std::collections::BTreeMap;

    use anyhow::{Context, Result};
    use fleet_router::RouterConfig;
    use fleet_sim::ModelConfig;
    use fleet_test_support::spawn_sim;
    use serde_json::{Value, json};

    use crate::support::{TOKEN, client, router};

    const WORDS: [&str; 8] = ["the", "cache", "keeps", "every", "prefix", "warm", "for", "routing"];

    /// A Hugging Face tokenizer.json: whitespace pre-tokenizer, a word-level vocabulary (ids from 1).
    fn word_level_tokenizer() -> Value {
        let vocab: BTreeMap<String, u32> = std::iter::once(("[UNK]".to_owned(), 0))
            .chain(WORDS.iter().enumerate().map(|(i, word)| (word.to_string(), i as u32 + 1)))
            .collect();
        json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
            "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
        })
    }

    #[tokio::test]
    async fn a_tokenizer_json_gives_token_exact_blocks_in_the_trace() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, word_level_tokenizer().to_string())?;
        let sim = spawn_sim(1, ModelConfig::default()).await?;
        let router = router(RouterConfig {
            replicas: sim.urls().to_vec(),
            admin_token: Some(TOKEN.into()),
            tokenizer: Some(path),
            ..RouterConfig::default()
        })
        .await?;
        // 8 words x 9 = 72 tokens, ids 1..=8 in turn, plus one unknown word.
        let prompt = WORDS.iter().cycle().take(72).copied().collect::<Vec<_>>().join(" ") + " zebra";
        let expected: Vec<u32> = (0..72).map(|i| i % 8 + 1).chain(std::iter::once(0)).collect();
        let http = client();
        let response = http
            .post(format!("{}/v1/completions", router.url))
            .json(&json!({"prompt": prompt, "max_tokens": 1}))
            .send()
            .await?;
        assert_eq!(response.status(), 200);
        response.bytes().await?;

        let trace = http
            .get(format!("{}/admin/trace?since=0", router.url))
            .bearer_auth(TOKEN)
            .send()
            .await?
            .text()
            .await?;
        let record: Value = serde_json::from_str(trace.lines().last().context("no trace record")?)?;
        let block_tokens = router.state.policy.load().hashing.block_tokens;
        let hashes: Vec<u64> = serde_json::from_value(record["hash_ids"].clone())?;
        assert_eq!(hashes.len(), 73 / block_tokens, "{record}");
        assert_eq!(hashes, fleet_policy::block_hashes_from_tokens(&expected, block_tokens), "{record}");
        assert_eq!(record["input_length"], 73, "{record}");
        assert_eq!(record["block_tokens"], block_tokens, "{record}");
        Ok(())
    }

    #[tokio::test]
    async fn a_broken_tokenizer_file_is_named() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, "{\"model\": 5}")?;
        let error = fleet_router::load_tokenizer(Some(&path), None, 1 << 20)
            .err()
            .context("loaded a broken tokenizer")?;
        assert!(error.to_string().contains("--tokenizer"), "{error}");
        Ok(())
    }
}
