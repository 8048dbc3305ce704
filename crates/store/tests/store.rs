//! The store's integration tests: migrations, downsampling and retention, comparison, the
//! audit trail, token files, and a crash test with a real child process killed by SIGKILL.
//!
//! Database tests use `#[sqlx::test]`: for SQLite, sqlx 0.9 creates a fresh file per test
//! under `target/sqlx/test-dbs/` (relative to this crate) and needs no `DATABASE_URL`.
//! They take the connect options rather than a pool, so the database is opened the way
//! the app opens it (`Store::connect_with`: WAL, foreign keys, our migrations).

#[path = "store/audit.rs"]
mod audit;
#[path = "store/common.rs"]
mod common;
#[path = "store/compare.rs"]
mod compare;
#[path = "store/crash.rs"]
mod crash;
#[path = "store/migrations.rs"]
mod migrations;
#[path = "store/secrets.rs"]
mod secrets;
#[path = "store/tiers.rs"]
mod tiers;
