//! The crate's one integration-test binary: data-driven decision fixtures, property tests and API checks.

#[path = "policy/api.rs"]
mod api;
#[path = "policy/decisions.rs"]
mod decisions;
#[path = "policy/properties.rs"]
mod properties;
