//! `fleetdeck probe URL`: scrape one endpoint twice and print its engine and signals.

use anyhow::Result;

#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// The metrics endpoint (a replica base URL or a full metrics URL).
    pub url: String,
}

pub fn run(args: ProbeArgs) -> Result<()> {
    anyhow::bail!("probe of {} is not available in this build yet", args.url)
}
