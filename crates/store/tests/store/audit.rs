//! The audit trail: fleets, policy versions with their routers, pushes, annotations.

use fleet_store::{AnnotationKind, NewAnnotation, NewPolicyVersion, PushOutcome, SampleSignals, StoreError};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

use crate::common::{HOUR_MS, T0, open, sample};

#[sqlx::test(migrations = false)]
async fn policy_versions_record_spec_author_time_routers_and_every_push(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store = open(options).await;
    store.create_fleet("eu", T0).await.unwrap();
    store.register_router("eu", "http://router-b", None).await.unwrap();
    store.register_router("eu", "http://router-a", None).await.unwrap();
    let v1 = NewPolicyVersion {
        fleet: "eu",
        label: "v1",
        spec: "{\"kind\": \"least_loaded\"}",
        author: "alice",
        created_ms: T0,
        routers: &["http://router-b", "http://router-a"],
    };
    store.record_policy_version(&v1).await.unwrap();
    let duplicate = store.record_policy_version(&v1).await.unwrap_err();
    assert!(matches!(duplicate, StoreError::DuplicatePolicy { .. }), "{duplicate}");
    let unknown_router = store
        .record_policy_version(&NewPolicyVersion { label: "v2", routers: &["http://nope"], ..v1.clone() })
        .await;
    assert!(matches!(unknown_router, Err(StoreError::UnknownRouter { .. })));

    let versions = store.policy_versions("eu").await.unwrap();
    assert_eq!(versions.len(), 1, "a version whose routers are unknown is not half-recorded");
    assert_eq!(
        (versions[0].spec.as_str(), versions[0].author.as_str(), versions[0].created_ms),
        ("{\"kind\": \"least_loaded\"}", "alice", T0)
    );
    assert_eq!(versions[0].routers, ["http://router-a", "http://router-b"]);

    store
        .record_push("v1", "http://router-a", T0 + 1, &PushOutcome::Acknowledged { acked_label: "v1".into() })
        .await
        .unwrap();
    store
        .record_push(
            "v1",
            "http://router-b",
            T0 + 2,
            &PushOutcome::Failed { error: "401 unauthorized".into() },
        )
        .await
        .unwrap();
    let pushes = store.pushes("v1").await.unwrap();
    assert_eq!(pushes.len(), 2);
    assert_eq!(pushes[0].router_url, "http://router-a");
    assert_eq!(pushes[1].outcome, PushOutcome::Failed { error: "401 unauthorized".into() });
    assert!(store.policy_versions("us").await.unwrap_err().to_string().contains("default, eu"));
}

#[sqlx::test(migrations = false)]
async fn annotations_are_found_by_the_windows_they_overlap(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store = open(options).await;
    let note = NewAnnotation {
        fleet: "default",
        kind: AnnotationKind::Note,
        start_ms: T0,
        end_ms: None,
        author: "bob",
        text: "raised max batch size",
    };
    store.add_annotation(&note).await.unwrap();
    store
        .add_annotation(&NewAnnotation {
            kind: AnnotationKind::Incident,
            start_ms: T0 + HOUR_MS,
            end_ms: Some(T0 + 3 * HOUR_MS),
            text: "replica 3 OOM loop",
            ..note.clone()
        })
        .await
        .unwrap();
    let during = store.annotations("default", T0 + 2 * HOUR_MS, T0 + 4 * HOUR_MS).await.unwrap();
    assert_eq!(during.len(), 1);
    assert_eq!((during[0].kind, during[0].text.as_str()), (AnnotationKind::Incident, "replica 3 OOM loop"));
    assert_eq!(store.annotations("default", T0, T0 + 4 * HOUR_MS).await.unwrap().len(), 2);
    assert!(store.annotations("default", T0 + 5 * HOUR_MS, T0 + 6 * HOUR_MS).await.unwrap().is_empty());
}

#[sqlx::test(migrations = false)]
async fn replicas_keep_their_identity_across_restarts_and_belong_to_fleets(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let store = open(options.clone()).await;
    store.insert_samples(&[sample(0, T0, SampleSignals::default())]).await.unwrap();
    store.create_fleet("eu", T0).await.unwrap();
    store.assign_replica("http://replica-0", "m", "eu", T0).await.unwrap();
    store.close().await;
    // A new process (fresh id cache) sees the same replica; a new model is a new replica.
    let store = open(options).await;
    store.insert_samples(&[sample(0, T0 + 1000, SampleSignals::default())]).await.unwrap();
    let mut other_model = sample(0, T0 + 1000, SampleSignals::default());
    other_model.model = "m2".into();
    store.insert_samples(&[other_model]).await.unwrap();
    let replicas: Vec<(String, String, Option<i64>, i64)> = sqlx::query_as(
        "SELECT url, model, fleet_id, (SELECT COUNT(*) FROM samples s WHERE s.replica_id = r.id)
         FROM replicas r ORDER BY id",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    let eu = store.fleet_id("eu").await.unwrap();
    assert_eq!(
        replicas,
        [
            ("http://replica-0".into(), "m".into(), Some(eu), 2),
            ("http://replica-0".into(), "m2".into(), None, 1)
        ]
    );
}
