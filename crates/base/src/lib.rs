//! Fleetdeck's shared vocabulary: the definitions several crates need, each written once so they
//! cannot drift apart.
//!
//! - [`quantile`]: the two quantile definitions (nearest rank, linear interpolation), named for
//!   what they compute.
//! - [`time`]: the wall clock in Unix milliseconds.
//! - [`error`]: an error and its causes on one line.
//! - `http` (feature `http`): the one reader of a response body capped in size.
//!
//! Standard library only unless `http` is on, so it builds in a second and for wasm32.

pub mod error;
#[cfg(feature = "http")]
pub mod http;
pub mod quantile;
pub mod time;
