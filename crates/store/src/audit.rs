//! The audit trail: fleets, routers, policy versions (spec, when, by whom, for which
//! routers), every push with its per-router result, and operator annotations.
//!
//! Versions are immutable once recorded. A version's active window runs from its first
//! push that a router acknowledged (reported running that version) to the first
//! acknowledged push of another version of the same fleet after it, or to now.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sqlx::Row;

use crate::{Store, StoreError};

/// A policy version to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewPolicyVersion<'a> {
    pub fleet: &'a str,
    pub label: &'a str,
    /// The spec as the operator wrote it (JSON or TOML text), stored verbatim.
    pub spec: &'a str,
    pub author: &'a str,
    pub created_ms: i64,
    /// Router URLs the version is meant for; each must be registered.
    pub routers: &'a [&'a str],
}

/// A recorded policy version.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyVersion {
    pub label: String,
    pub spec: String,
    pub author: String,
    pub created_ms: i64,
    pub routers: Vec<String>,
}

/// What came of pushing a version to one router.
#[derive(Debug, Clone, PartialEq)]
pub enum PushOutcome {
    /// The router accepted it and then reported running `acked_label`.
    Acknowledged {
        acked_label: String,
    },
    Failed {
        error: String,
    },
}

/// One recorded push.
#[derive(Debug, Clone, PartialEq)]
pub struct PushRecord {
    pub label: String,
    pub router_url: String,
    pub pushed_ms: i64,
    pub outcome: PushOutcome,
}

/// Where a policy version was in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyWindow {
    pub from_ms: i64,
    pub to_ms: i64,
    /// True when no later version replaced it (the window ends at the `now_ms` given).
    pub still_active: bool,
}

/// Kinds of annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnnotationKind {
    Note,
    Incident,
}

impl AnnotationKind {
    fn as_str(self) -> &'static str {
        match self {
            AnnotationKind::Note => "note",
            AnnotationKind::Incident => "incident",
        }
    }
}

/// An annotation to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAnnotation<'a> {
    pub fleet: &'a str,
    pub kind: AnnotationKind,
    pub start_ms: i64,
    pub end_ms: Option<i64>,
    pub author: &'a str,
    pub text: &'a str,
}

/// A recorded annotation.
#[derive(Debug, Clone, PartialEq)]
pub struct Annotation {
    pub kind: AnnotationKind,
    pub start_ms: i64,
    pub end_ms: Option<i64>,
    pub author: String,
    pub text: String,
}

impl Store {
    /// The id of fleet `name`, or an error listing the fleets there are.
    pub async fn fleet_id(&self, name: &str) -> Result<i64, StoreError> {
        let id: Option<i64> = sqlx::query_scalar("SELECT id FROM fleets WHERE name = ?")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        match id {
            Some(id) => Ok(id),
            None => Err(StoreError::UnknownFleet {
                name: name.into(),
                known: sqlx::query_scalar("SELECT name FROM fleets ORDER BY name")
                    .fetch_all(&self.pool)
                    .await?,
            }),
        }
    }

    /// Creates fleet `name` if it does not exist; returns its id.
    pub async fn create_fleet(&self, name: &str, now_ms: i64) -> Result<i64, StoreError> {
        sqlx::query("INSERT OR IGNORE INTO fleets (name, created_ms) VALUES (?, ?)")
            .bind(name)
            .bind(now_ms)
            .execute(&self.audit_pool)
            .await?;
        self.fleet_id(name).await
    }

    /// Puts the replica (url, model) in `fleet`; its later samples count towards that fleet.
    pub async fn assign_replica(
        &self,
        url: &str,
        model: &str,
        fleet: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let fleet_id = self.fleet_id(fleet).await?;
        sqlx::query(
            "INSERT INTO replicas (url, model, first_seen_ms, fleet_id) VALUES (?, ?, ?, ?)
             ON CONFLICT (url, model) DO UPDATE SET fleet_id = excluded.fleet_id",
        )
        .bind(url)
        .bind(model)
        .bind(now_ms)
        .bind(fleet_id)
        .execute(&self.audit_pool)
        .await?;
        Ok(())
    }

    /// Registers (or updates) a router of `fleet`. Its admin token stays outside SQLite: pass
    /// the path of the 0600 file that holds it (see `secrets`), never the token.
    pub async fn register_router(
        &self,
        fleet: &str,
        url: &str,
        token_path: Option<&Path>,
    ) -> Result<i64, StoreError> {
        let fleet_id = self.fleet_id(fleet).await?;
        let token_path = token_path.map(|p| p.to_string_lossy().into_owned());
        Ok(sqlx::query_scalar(
            "INSERT INTO routers (fleet_id, url, token_path) VALUES (?, ?, ?)
             ON CONFLICT (url) DO UPDATE SET fleet_id = excluded.fleet_id, token_path = excluded.token_path
             RETURNING id",
        )
        .bind(fleet_id)
        .bind(url)
        .bind(token_path)
        .fetch_one(&self.audit_pool)
        .await?)
    }

    /// Where the admin token of router `url` is kept, if it has one.
    pub async fn router_token_path(&self, url: &str) -> Result<Option<PathBuf>, StoreError> {
        let path: Option<Option<String>> = sqlx::query_scalar("SELECT token_path FROM routers WHERE url = ?")
            .bind(url)
            .fetch_optional(&self.pool)
            .await?;
        match path {
            Some(path) => Ok(path.map(PathBuf::from)),
            None => Err(StoreError::UnknownRouter { url: url.into() }),
        }
    }

    async fn router_id(&self, tx: &mut sqlx::SqliteConnection, url: &str) -> Result<i64, StoreError> {
        let id: Option<i64> = sqlx::query_scalar("SELECT id FROM routers WHERE url = ?")
            .bind(url)
            .fetch_optional(&mut *tx)
            .await?;
        id.ok_or_else(|| StoreError::UnknownRouter { url: url.into() })
    }

    /// Records a new policy version and the routers it is meant for, in one transaction.
    pub async fn record_policy_version(&self, version: &NewPolicyVersion<'_>) -> Result<i64, StoreError> {
        let fleet_id = self.fleet_id(version.fleet).await?;
        let mut tx = self.audit_pool.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO policy_versions (fleet_id, label, spec, created_ms, author) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT (label) DO NOTHING",
        )
        .bind(fleet_id)
        .bind(version.label)
        .bind(version.spec)
        .bind(version.created_ms)
        .bind(version.author)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::DuplicatePolicy { label: version.label.into() });
        }
        let version_id = inserted.last_insert_rowid();
        for url in version.routers {
            let router_id = self.router_id(&mut tx, url).await?;
            sqlx::query("INSERT OR IGNORE INTO policy_targets (version_id, router_id) VALUES (?, ?)")
                .bind(version_id)
                .bind(router_id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(version_id)
    }

    async fn policy_id(&self, label: &str) -> Result<(i64, i64), StoreError> {
        let row = sqlx::query("SELECT id, fleet_id FROM policy_versions WHERE label = ?")
            .bind(label)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => Ok((row.try_get(0)?, row.try_get(1)?)),
            None => Err(StoreError::UnknownPolicy {
                label: label.into(),
                known: sqlx::query_scalar("SELECT label FROM policy_versions ORDER BY created_ms, id")
                    .fetch_all(&self.pool)
                    .await?,
            }),
        }
    }

    /// The versions of `fleet`, oldest first, each with its target routers.
    pub async fn policy_versions(&self, fleet: &str) -> Result<Vec<PolicyVersion>, StoreError> {
        let fleet_id = self.fleet_id(fleet).await?;
        let rows = sqlx::query(
            "SELECT v.label, v.spec, v.author, v.created_ms,
                    (SELECT group_concat(url, char(10)) FROM
                       (SELECT r.url FROM policy_targets t JOIN routers r ON r.id = t.router_id
                        WHERE t.version_id = v.id ORDER BY r.url))
             FROM policy_versions v WHERE v.fleet_id = ? ORDER BY v.created_ms, v.id",
        )
        .bind(fleet_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let routers: Option<String> = row.try_get(4)?;
                Ok(PolicyVersion {
                    label: row.try_get(0)?,
                    spec: row.try_get(1)?,
                    author: row.try_get(2)?,
                    created_ms: row.try_get(3)?,
                    routers: routers.map(|r| r.lines().map(String::from).collect()).unwrap_or_default(),
                })
            })
            .collect()
    }

    /// Records the result of pushing version `label` to router `router_url`.
    pub async fn record_push(
        &self,
        label: &str,
        router_url: &str,
        pushed_ms: i64,
        outcome: &PushOutcome,
    ) -> Result<i64, StoreError> {
        let (version_id, _) = self.policy_id(label).await?;
        let mut conn = self.audit_pool.acquire().await?;
        let router_id = self.router_id(&mut conn, router_url).await?;
        let (ok, acked, error) = match outcome {
            PushOutcome::Acknowledged { acked_label } => (true, Some(acked_label.as_str()), None),
            PushOutcome::Failed { error } => (false, None, Some(error.as_str())),
        };
        Ok(sqlx::query(
            "INSERT INTO pushes (version_id, router_id, pushed_ms, ok, acked_label, error) VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(version_id)
        .bind(router_id)
        .bind(pushed_ms)
        .bind(ok)
        .bind(acked)
        .bind(error)
        .execute(&mut *conn)
        .await?
        .last_insert_rowid())
    }

    /// Every push of version `label`, oldest first.
    pub async fn pushes(&self, label: &str) -> Result<Vec<PushRecord>, StoreError> {
        let (version_id, _) = self.policy_id(label).await?;
        let rows = sqlx::query(
            "SELECT r.url, p.pushed_ms, p.ok, p.acked_label, p.error FROM pushes p
             JOIN routers r ON r.id = p.router_id WHERE p.version_id = ? ORDER BY p.pushed_ms, p.id",
        )
        .bind(version_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| push_record(label.to_owned(), row, 0)).collect()
    }

    /// Every push of every version of `fleet`, oldest first: one query however long the audit trail.
    pub async fn fleet_pushes(&self, fleet: &str) -> Result<Vec<PushRecord>, StoreError> {
        let fleet_id = self.fleet_id(fleet).await?;
        let rows = sqlx::query(
            "SELECT v.label, r.url, p.pushed_ms, p.ok, p.acked_label, p.error FROM pushes p
             JOIN policy_versions v ON v.id = p.version_id JOIN routers r ON r.id = p.router_id
             WHERE v.fleet_id = ? ORDER BY p.pushed_ms, p.id",
        )
        .bind(fleet_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| push_record(row.try_get(0)?, row, 1)).collect()
    }

    /// When version `label` was in force, as seen at `now_ms`.
    pub async fn policy_window(&self, label: &str, now_ms: i64) -> Result<PolicyWindow, StoreError> {
        let (version_id, fleet_id) = self.policy_id(label).await?;
        let from_ms: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(pushed_ms) FROM pushes WHERE version_id = ? AND ok = 1 AND acked_label = ?",
        )
        .bind(version_id)
        .bind(label)
        .fetch_one(&self.pool)
        .await?;
        let Some(from_ms) = from_ms else {
            return Err(StoreError::PolicyNeverActive { label: label.into() });
        };
        let next: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(p.pushed_ms) FROM pushes p JOIN policy_versions v ON v.id = p.version_id
             WHERE v.fleet_id = ? AND v.id != ? AND p.ok = 1 AND p.acked_label = v.label AND p.pushed_ms > ?",
        )
        .bind(fleet_id)
        .bind(version_id)
        .bind(from_ms)
        .fetch_one(&self.pool)
        .await?;
        Ok(PolicyWindow { from_ms, to_ms: next.unwrap_or(now_ms), still_active: next.is_none() })
    }

    /// Records an operator note or incident.
    pub async fn add_annotation(&self, annotation: &NewAnnotation<'_>) -> Result<i64, StoreError> {
        let fleet_id = self.fleet_id(annotation.fleet).await?;
        Ok(sqlx::query(
            "INSERT INTO annotations (fleet_id, start_ms, end_ms, kind, author, text) VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(fleet_id)
        .bind(annotation.start_ms)
        .bind(annotation.end_ms)
        .bind(annotation.kind.as_str())
        .bind(annotation.author)
        .bind(annotation.text)
        .execute(&self.audit_pool)
        .await?
        .last_insert_rowid())
    }

    /// Annotations of `fleet` that overlap `[from_ms, to_ms)`, oldest first.
    pub async fn annotations(
        &self,
        fleet: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<Annotation>, StoreError> {
        let fleet_id = self.fleet_id(fleet).await?;
        let rows = sqlx::query(
            "SELECT kind, start_ms, end_ms, author, text FROM annotations
             WHERE fleet_id = ? AND start_ms < ? AND COALESCE(end_ms, start_ms) >= ?
             ORDER BY start_ms, id",
        )
        .bind(fleet_id)
        .bind(to_ms)
        .bind(from_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let kind: String = row.try_get(0)?;
                Ok(Annotation {
                    kind: if kind == "incident" { AnnotationKind::Incident } else { AnnotationKind::Note },
                    start_ms: row.try_get(1)?,
                    end_ms: row.try_get(2)?,
                    author: row.try_get(3)?,
                    text: row.try_get(4)?,
                })
            })
            .collect()
    }
}

/// A push from a row whose columns from `first` on are `url, pushed_ms, ok, acked_label, error`.
fn push_record(label: String, row: &sqlx::sqlite::SqliteRow, first: usize) -> Result<PushRecord, StoreError> {
    let ok: bool = row.try_get(first + 2)?;
    let outcome = if ok {
        PushOutcome::Acknowledged {
            acked_label: row.try_get::<Option<String>, _>(first + 3)?.unwrap_or_default(),
        }
    } else {
        PushOutcome::Failed { error: row.try_get::<Option<String>, _>(first + 4)?.unwrap_or_default() }
    };
    Ok(PushRecord { label, router_url: row.try_get(first)?, pushed_ms: row.try_get(first + 1)?, outcome })
}

/// The active window of every version in `pushes` (a fleet's, oldest first) that was ever in force, as
/// seen at `now_ms`: the windows [`Store::policy_window`] gives one by one, from one read of the pushes.
/// A version is in force from its first acknowledged push until another version's next one.
pub fn active_windows(pushes: &[PushRecord], now_ms: i64) -> BTreeMap<String, PolicyWindow> {
    let acked: Vec<&PushRecord> = pushes
        .iter()
        .filter(
            |p| matches!(&p.outcome, PushOutcome::Acknowledged { acked_label } if *acked_label == p.label),
        )
        .collect();
    let mut windows = BTreeMap::new();
    for (i, first) in acked.iter().enumerate() {
        if windows.contains_key(&first.label) {
            continue;
        }
        let next = acked[i + 1..]
            .iter()
            .find(|p| p.label != first.label && p.pushed_ms > first.pushed_ms)
            .map(|p| p.pushed_ms);
        let window = PolicyWindow {
            from_ms: first.pushed_ms,
            to_ms: next.unwrap_or(now_ms),
            still_active: next.is_none(),
        };
        windows.insert(first.label.clone(), window);
    }
    windows
}
