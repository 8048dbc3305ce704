//! `fleetdeck history ...`: query the history database from the command line.
//!
//! `history compare` answers "did the change help?" for two time windows or two policy
//! versions, with each metric's difference and a bootstrap confidence interval, as a table,
//! as JSON (`--json`) or as CSV (`--csv FILE`). It reads the clock once, here at the edge,
//! to know where a still-active policy window ends.

use std::path::PathBuf;

use anyhow::{Context, Result};
use fleet_store::timefmt::parse_range;
use fleet_store::{CompareOptions, Comparison, MetricDiff, Store, WindowSpec, WindowSummary};

#[derive(clap::Args, Debug)]
pub struct HistoryArgs {
    #[command(subcommand)]
    command: HistoryCommand,
}

#[derive(clap::Subcommand, Debug)]
enum HistoryCommand {
    /// Compare two windows (time ranges or policy versions): per-metric values, the
    /// difference B - A, and a bootstrap confidence interval on it.
    Compare(CompareArgs),
}

#[derive(clap::Args, Debug)]
#[command(
    group(clap::ArgGroup::new("window_a").required(true).args(["a", "a_policy"])),
    group(clap::ArgGroup::new("window_b").required(true).args(["b", "b_policy"])),
)]
struct CompareArgs {
    /// The history file (default: fleetdeck/history.sqlite in the user's data folder).
    #[arg(long, value_name = "FILE")]
    db: Option<PathBuf>,
    /// Window A ("before") as FROM..TO in RFC 3339, e.g. 2025-06-01T12:00:00Z..2025-06-01T18:00:00Z.
    #[arg(long, value_name = "FROM..TO", allow_hyphen_values = true)]
    a: Option<String>,
    /// Window B ("after") as FROM..TO in RFC 3339.
    #[arg(long, value_name = "FROM..TO", allow_hyphen_values = true)]
    b: Option<String>,
    /// Window A is the active window of this policy version.
    #[arg(long, value_name = "VERSION")]
    a_policy: Option<String>,
    /// Window B is the active window of this policy version.
    #[arg(long, value_name = "VERSION")]
    b_policy: Option<String>,
    /// Print {"a": ..., "b": ..., "metrics": [...]} as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the metrics as CSV to FILE.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// The fleet to compare.
    #[arg(long, default_value = fleet_store::DEFAULT_FLEET)]
    fleet: String,
    /// Bootstrap resamples behind each confidence interval.
    #[arg(long, default_value_t = 1000)]
    resamples: u32,
    /// Seed of the bootstrap; the same data and seed always give the same intervals.
    #[arg(long)]
    seed: Option<u64>,
}

pub fn run(args: HistoryArgs) -> Result<()> {
    match args.command {
        HistoryCommand::Compare(args) => compare(args),
    }
}

fn default_db() -> Result<PathBuf> {
    Ok(dirs::data_dir()
        .context("cannot find the user's data folder; pass --db FILE")?
        .join("fleetdeck")
        .join("history.sqlite"))
}

fn window(range: Option<String>, policy: Option<String>, flag: &str) -> Result<WindowSpec> {
    match (range, policy) {
        (Some(range), _) => Ok(WindowSpec::Time(parse_range(flag, &range)?)),
        (None, Some(label)) => Ok(WindowSpec::Policy(label)),
        // clap's groups require one of the two.
        (None, None) => anyhow::bail!("give {flag} FROM..TO or {flag}-policy VERSION"),
    }
}

fn compare(args: CompareArgs) -> Result<()> {
    let a = window(args.a, args.a_policy, "--a")?;
    let b = window(args.b, args.b_policy, "--b")?;
    let db = match args.db {
        Some(db) => db,
        None => default_db()?,
    };
    // A query must not create an empty database where the operator mistyped a path.
    anyhow::ensure!(
        db.is_file(),
        "no history database at {}; pass --db FILE with the file the app writes (it prints `history: PATH` when it starts)",
        db.display()
    );
    let mut options =
        CompareOptions { fleet: args.fleet, resamples: args.resamples, ..CompareOptions::default() };
    if let Some(seed) = args.seed {
        options.seed = seed;
    }
    let now_ms = fleet_store::unix_ms_now();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let comparison = runtime.block_on(async {
        let store = Store::open(&db).await?;
        let comparison = store.compare(&a, &b, now_ms, &options).await;
        store.close().await;
        anyhow::Ok(comparison?)
    })?;
    if let Some(path) = &args.csv {
        std::fs::write(path, comparison.to_csv())
            .with_context(|| format!("cannot write the CSV export to {}", path.display()))?;
    }
    let report = if args.json {
        format!("{}\n", serde_json::to_string_pretty(&comparison)?)
    } else {
        table(&comparison)
    };
    crate::write_stdout(&report)
}

fn describe(name: &str, w: &WindowSummary) -> String {
    let policy = w.policy.as_ref().map(|p| format!(" (policy {p})")).unwrap_or_default();
    format!(
        "{name}  {} .. {}{policy}: {} buckets of {} s, {} samples, up to {} replicas\n",
        w.from, w.to, w.buckets, w.resolution_s, w.samples, w.max_replicas
    )
}

fn number(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.4}")).unwrap_or_else(|| "no data".into())
}

fn verdict(m: &MetricDiff) -> &'static str {
    match (m.ci_low, m.ci_high) {
        (Some(low), _) if low > 0.0 => "higher in B",
        (_, Some(high)) if high < 0.0 => "lower in B",
        (Some(_), Some(_)) => "no clear change",
        _ => "too little data",
    }
}

fn table(c: &Comparison) -> String {
    let mut out = describe("A", &c.a) + &describe("B", &c.b);
    let ci = format!("{:.0}% CI of delta", c.confidence * 100.0);
    out.push_str(&format!("\n{:<18}{:>12}{:>12}{:>12}  {ci:<24}\n", "metric", "A", "B", "delta"));
    for m in &c.metrics {
        let interval = match (m.ci_low, m.ci_high) {
            (Some(low), Some(high)) => format!("[{low:+.4}, {high:+.4}]"),
            _ => "-".into(),
        };
        let delta = m.delta.map(|d| format!("{d:+.4}")).unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:<18}{:>12}{:>12}{:>12}  {interval:<24}{}\n",
            m.name,
            number(m.a),
            number(m.b),
            delta,
            verdict(m)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        history: HistoryArgs,
    }

    fn parse(args: &[&str]) -> Result<CompareArgs, clap::Error> {
        let cli = Cli::try_parse_from(std::iter::once("history").chain(args.iter().copied()))?;
        let HistoryCommand::Compare(args) = cli.history.command;
        Ok(args)
    }

    #[test]
    fn each_side_takes_a_range_or_a_policy() {
        let args =
            parse(&["compare", "--db", "h.sqlite", "--a-policy", "v1", "--b", "x..y", "--json"]).unwrap();
        assert_eq!(
            (args.a_policy.as_deref(), args.b.as_deref(), args.json),
            (Some("v1"), Some("x..y"), true)
        );
        assert!(parse(&["compare", "--a", "x..y"]).is_err(), "B is required");
        assert!(parse(&["compare", "--a", "x..y", "--a-policy", "v1", "--b", "x..y"]).is_err());
    }

    #[test]
    fn a_bad_range_names_the_flag_and_the_part() {
        let err = window(Some("2025-06-01T00:00:00Z..noon".into()), None, "--b").unwrap_err().to_string();
        assert!(err.contains("--b") && err.contains("TO \"noon\"") && err.contains("RFC 3339"), "{err}");
    }
}
