//! `fleetdeck history ...`: query the history database from the command line.

use anyhow::Result;

#[derive(clap::Args, Debug)]
pub struct HistoryArgs {}

pub fn run(_args: HistoryArgs) -> Result<()> {
    anyhow::bail!("history commands are not available in this build yet")
}
