//! Router admin tokens live in 0600 files; SQLite holds only their path.

use std::os::unix::fs::PermissionsExt;

use fleet_store::secrets::{SecretError, read_token_file, write_token_file};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

use crate::common::open;

const TOKEN: &str = "fd-admin-7f3c9a1e5b2d4c6e8a0b";

#[test]
fn token_files_are_private_and_too_open_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens").join("router-1.token");
    write_token_file(&path, TOKEN).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(read_token_file(&path).unwrap().expose(), TOKEN);

    // Rewriting replaces the token and keeps the mode.
    write_token_file(&path, "second").unwrap();
    assert_eq!(read_token_file(&path).unwrap().expose(), "second");

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = read_token_file(&path).unwrap_err();
    assert!(matches!(err, SecretError::TooOpen { mode: 0o644, .. }), "{err}");
    assert!(err.to_string().contains("chmod 600"), "{err}");
}

#[sqlx::test(migrations = false)]
async fn the_database_holds_the_token_path_never_the_token(
    _pool: SqlitePoolOptions,
    options: SqliteConnectOptions,
) {
    let dir = tempfile::tempdir().unwrap();
    let token_path = dir.path().join("router-1.token");
    write_token_file(&token_path, TOKEN).unwrap();
    let db = options.get_filename().to_path_buf();
    let store = open(options).await;
    store.register_router("default", "http://router-1", Some(&token_path)).await.unwrap();
    let stored = store.router_token_path("http://router-1").await.unwrap().unwrap();
    assert_eq!(read_token_file(&stored).unwrap().expose(), TOKEN);
    store.close().await;

    // Nothing in the database file (or what is left of its WAL) contains the token.
    for suffix in ["", "-wal"] {
        let mut file = db.clone().into_os_string();
        file.push(suffix);
        if let Ok(bytes) = std::fs::read(&file) {
            assert!(!bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()), "token found in {file:?}");
        }
    }
}
