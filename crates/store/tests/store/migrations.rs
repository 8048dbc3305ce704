//! Migrations: forward-only, pinned once shipped, and upgrading a shipped schema keeps data.

use std::borrow::Cow;

use fleet_store::{MIGRATOR, Store};
use sqlx::migrate::{MigrationType, Migrator};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use crate::common::{T0, count, open};

/// SHA-384 of every migration that has been merged. A migration is never edited once
/// merged: change the schema with a new numbered file instead, and pin it here.
const PINNED: &[(i64, &str)] = &[
    (1, "4e91b7e87d1454df60ad11de32b8e45531a703c94b83f05ba65c61a2ad723bfc7e17e03e80c06d36864ef34c7edc02f0"),
    (2, "1c68dc64807586aab3c2f5492c037a2393d1144ea3e3c4fbe5c639d3f319c9ef2f5a7be143d3857a1a17a1d245fe62d3"),
];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn migrations_are_numbered_forward_only_and_pinned_ones_are_unchanged() {
    for (i, migration) in MIGRATOR.iter().enumerate() {
        assert_eq!(migration.version, i as i64 + 1, "migrations must be numbered 1, 2, 3, ... without gaps");
        assert_eq!(
            migration.migration_type,
            MigrationType::Simple,
            "migration {} has an up/down pair; migrations here are forward-only",
            migration.version
        );
    }
    for (version, checksum) in PINNED {
        let migration =
            MIGRATOR.iter().find(|m| m.version == *version).expect("a pinned migration was deleted");
        assert_eq!(
            hex(&migration.checksum),
            *checksum,
            "migration {version} ({}) was edited after it was merged; revert it and add a new migration",
            migration.description
        );
    }
    assert_eq!(MIGRATOR.iter().count(), PINNED.len(), "pin every new migration's checksum in PINNED");
}

#[sqlx::test(migrator = "fleet_store::MIGRATOR")]
async fn a_fresh_database_gets_every_table(pool: SqlitePool) {
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(&pool)
            .await
            .unwrap();
    for table in [
        "annotations",
        "downsample_progress",
        "fleet_10s",
        "fleet_1m",
        "fleets",
        "policy_targets",
        "policy_versions",
        "pushes",
        "replicas",
        "routers",
        "samples",
        "samples_10s",
        "samples_1m",
    ] {
        assert!(tables.iter().any(|t| t == table), "no table {table} in {tables:?}");
    }
    let applied: Vec<(i64, bool)> =
        sqlx::query_as("SELECT version, success FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(applied, MIGRATOR.iter().map(|m| (m.version, true)).collect::<Vec<_>>());
    let fleets: Vec<String> = sqlx::query_scalar("SELECT name FROM fleets").fetch_all(&pool).await.unwrap();
    assert_eq!(fleets, ["default"]);
}

#[sqlx::test(migrations = false)]
async fn a_database_of_the_first_release_upgrades_and_keeps_its_samples(
    pool_options: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    // The schema as shipped in the first release, with a sample written the way it wrote them.
    let first_release = Migrator {
        migrations: Cow::Owned(vec![MIGRATOR.iter().next().unwrap().clone()]),
        ..Migrator::DEFAULT
    };
    let pool = pool_options.connect_with(options.clone()).await.unwrap();
    first_release.run(&pool).await.unwrap();
    sqlx::query("INSERT INTO replicas (url, model, first_seen_ms) VALUES ('http://old', 'm', 1)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO samples (replica_id, ts_ms, hit_rate) VALUES (1, ?, 0.25)")
        .bind(T0)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;

    let store = open(options.clone()).await;
    let row: (f64, Option<f64>, Option<f64>, Option<i64>) = sqlx::query_as(
        "SELECT s.hit_rate, s.prompt_tok_s, s.gen_tok_s, r.fleet_id FROM samples s JOIN replicas r ON r.id = s.replica_id",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(row, (0.25, None, None, None), "old samples keep their values; new columns are NULL");
    store.close().await;

    // Opening again is a no-op: nothing re-applied, nothing lost.
    let store = open(options).await;
    assert_eq!(count(&store, "SELECT COUNT(*) FROM _sqlx_migrations").await, MIGRATOR.iter().count() as i64);
    assert_eq!(store.sample_count().await.unwrap(), 1);
}

#[sqlx::test(migrations = false)]
async fn the_store_opens_in_wal_mode_with_foreign_keys(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store: Store = open(options).await;
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(store.pool()).await.unwrap();
    assert_eq!(mode, "wal");
    let bad =
        sqlx::query("INSERT INTO samples (replica_id, ts_ms) VALUES (999, 1)").execute(store.pool()).await;
    assert!(bad.is_err(), "a sample of an unknown replica must be refused");
}

#[sqlx::test(migrations = false)]
async fn audit_rows_commit_with_synchronous_full_and_samples_with_normal(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store: Store = open(options).await;
    // PRAGMA synchronous: 1 = NORMAL, 2 = FULL.
    let samples: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(store.pool()).await.unwrap();
    let audit: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(store.audit_pool()).await.unwrap();
    assert_eq!((samples, audit), (1, 2));
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(store.audit_pool()).await.unwrap();
    assert_eq!(mode, "wal");
}
