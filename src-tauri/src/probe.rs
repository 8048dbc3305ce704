//! `fleetdeck probe URL`: scrape one endpoint twice, SECONDS apart, and print the detected
//! engine and its normalised signals, for operators (a table) and scripts (`--json`).
//!
//! A malformed exposition or an unreachable endpoint exits non-zero with the reason (the
//! parser names the offending line). An endpoint whose metrics match no known engine is a
//! valid answer: engine `unknown` with the metric families seen, exit status 0.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fleet_telemetry::scrape::{self, ScrapeError, ScrapeLimits};
use fleet_telemetry::{EngineSignals, ReplicaSignals, Window, exposition, read};
use serde_json::{Value, json};

#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// The metrics endpoint (a replica base URL or a full metrics URL).
    pub url: String,
    /// Seconds between the two scrapes (rates and quantiles cover this span).
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    pub interval: f64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Deadline of each scrape, in seconds.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub timeout: f64,
}

/// What the probe found.
enum Found {
    Engine(Box<ReplicaSignals>),
    Unknown(Vec<String>),
}

pub fn run(args: ProbeArgs) -> Result<()> {
    if !(args.url.starts_with("http://") || args.url.starts_with("https://")) {
        bail!("{:?} is not an http(s) URL; write it like http://127.0.0.1:8000/metrics", args.url);
    }
    if !(args.interval.is_finite() && args.interval > 0.0 && args.interval <= 3600.0) {
        bail!(
            "--interval {} is out of range; give seconds between 0 and 3600, e.g. --interval 5",
            args.interval
        );
    }
    if !(args.timeout.is_finite() && args.timeout > 0.0 && args.timeout <= 600.0) {
        bail!("--timeout {} is out of range; give seconds between 0 and 600", args.timeout);
    }
    // `main` calls this outside any runtime; one thread is plenty for two requests.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let url = scrape::metrics_url(&args.url);
    let found = runtime.block_on(probe(&url, &args))?;
    let mut report = if args.json {
        serde_json::to_string_pretty(&to_json(&url, args.interval, &found))?
    } else {
        let mut table = String::new();
        write_table(&mut table, &url, args.interval, &found)?;
        table
    };
    report.push('\n');
    crate::write_stdout(&report)
}

async fn probe(url: &str, args: &ProbeArgs) -> Result<Found> {
    let limits = ScrapeLimits { timeout: Duration::from_secs_f64(args.timeout), ..ScrapeLimits::default() };
    let client = scrape::client(limits.timeout).context("cannot build the HTTP client")?;
    let mut window = Window::new(Duration::from_secs_f64(args.interval));
    let start = Instant::now();
    for scrape_number in 1..=2 {
        if scrape_number == 2 {
            tokio::time::sleep(Duration::from_secs_f64(args.interval)).await;
        }
        let at = start.elapsed().as_secs_f64();
        let text = scrape::fetch(&client, url, limits).await.map_err(explain)?;
        let parsed =
            exposition::parse(&text).with_context(|| format!("{url} sent a malformed exposition"))?;
        match read(&parsed) {
            Ok(reading) => window.push(at, &reading),
            // Nothing to derive: waiting for a second scrape would only delay the answer.
            Err(unsupported) => return Ok(Found::Unknown(unsupported.families)),
        }
    }
    Ok(Found::Engine(Box::new(window.signals().context("no signals after two good scrapes")?)))
}

fn explain(error: ScrapeError) -> anyhow::Error {
    anyhow::Error::new(error).context("the probe could not read the endpoint")
}

fn to_json(url: &str, interval: f64, found: &Found) -> Value {
    let mut object = serde_json::Map::new();
    object.insert("url".into(), json!(url));
    object.insert("interval_s".into(), json!(interval));
    match found {
        Found::Engine(signals) => {
            object.insert("engine".into(), json!(signals.engine.name()));
            object.insert("flavor".into(), json!(signals.flavor));
            object.insert("model".into(), json!(signals.model));
            for (name, value) in signals.total.fields() {
                object.insert(name.into(), json!(value));
            }
            let ranks: Vec<Value> = signals
                .ranks
                .iter()
                .map(|(rank, s)| {
                    let mut r = serde_json::Map::new();
                    r.insert("rank".into(), json!(rank));
                    for (name, value) in s.fields() {
                        r.insert(name.into(), json!(value));
                    }
                    Value::Object(r)
                })
                .collect();
            object.insert("ranks".into(), Value::Array(ranks));
        }
        Found::Unknown(families) => {
            object.insert("engine".into(), json!("unknown"));
            object.insert("flavor".into(), Value::Null);
            object.insert("model".into(), Value::Null);
            for (name, value) in EngineSignals::default().fields() {
                object.insert(name.into(), json!(value));
            }
            object.insert("ranks".into(), json!([]));
            object.insert("families".into(), json!(families));
        }
    }
    Value::Object(object)
}

fn write_table(out: &mut String, url: &str, interval: f64, found: &Found) -> std::fmt::Result {
    writeln!(out, "endpoint   {url}")?;
    match found {
        Found::Unknown(families) => {
            writeln!(out, "engine     unknown: unsupported engine")?;
            writeln!(out, "families   {} seen:", families.len())?;
            for family in families {
                writeln!(out, "  {family}")?;
            }
        }
        Found::Engine(signals) => {
            writeln!(out, "engine     {} ({})", signals.engine.name(), signals.flavor)?;
            writeln!(out, "model      {}", signals.model.as_deref().unwrap_or("not provided"))?;
            writeln!(out, "window     {interval} s between two scrapes")?;
            writeln!(out)?;
            write_signals(out, &signals.total)?;
            for (rank, s) in &signals.ranks {
                writeln!(out)?;
                writeln!(out, "rank {rank}")?;
                write_signals(out, s)?;
            }
        }
    }
    Ok(())
}

fn write_signals(out: &mut String, s: &EngineSignals) -> std::fmt::Result {
    let show = |value: Option<f64>, unit: &str| match value {
        // "Not provided" (or no data in the window) is not zero.
        None => "—  (not provided, or no data in the window)".to_string(),
        Some(v) if unit == "%" => format!("{:.1} %", v * 100.0),
        Some(v) if unit == "ms" => format!("{:.1} ms", v * 1000.0),
        Some(v) => format!("{v:.2}{unit}"),
    };
    let rows = [
        ("queue depth", show(s.queue_depth, "")),
        ("running", show(s.running, "")),
        ("KV usage", show(s.kv_usage, "%")),
        ("hit rate", show(s.hit_rate, "%")),
        ("TTFT p50", show(s.ttft_p50_s, "ms")),
        ("TTFT p95", show(s.ttft_p95_s, "ms")),
        ("TTFT p99", show(s.ttft_p99_s, "ms")),
        ("ITL p50", show(s.itl_p50_s, "ms")),
        ("ITL p95", show(s.itl_p95_s, "ms")),
        ("ITL mean", show(s.itl_mean_s, "ms")),
        ("prompt tok/s", show(s.prompt_tokens_per_s, "")),
        ("gen tok/s", show(s.generation_tokens_per_s, "")),
        ("preempt/s", show(s.preemptions_per_s, "")),
    ];
    for (name, value) in rows {
        writeln!(out, "  {name:<13} {value}")?;
    }
    Ok(())
}
