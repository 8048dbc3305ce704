//! Router admin tokens, kept out of SQLite: each lives in its own file that only the user
//! can read (mode 0600), and the database stores just the file's path.
//!
//! Why a file rather than the OS keyring: on Linux the keyring crate needs either a running
//! Secret Service (absent on headless servers, CI and containers, where Fleetdeck also
//! runs) or the kernel keyring, whose keys do not survive a reboot. A 0600 file in the
//! user's data folder works everywhere, survives reboots and is what ssh and kubectl do.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Errors reading or writing a token file.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot write the token file {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot read the token file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error(
        "the token file {path} can be read by other users (mode {mode:o}); restrict it with `chmod 600 {path}` and try again"
    )]
    TooOpen { path: PathBuf, mode: u32 },
    #[error("the token file {path} is empty; write the router's admin token into it")]
    Empty { path: PathBuf },
}

/// Writes `token` to `path` with mode 0600, replacing it atomically (a temporary file in the
/// same folder, then a rename), so a crash never leaves a half-written or world-readable
/// token behind.
pub fn write_token_file(path: &Path, token: &str) -> Result<(), SecretError> {
    let err = |source| SecretError::Write { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let mut temp = path.as_os_str().to_owned();
    temp.push(".tmp");
    let temp = PathBuf::from(temp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&temp).map_err(err)?;
    // A leftover temporary file from an earlier crash may have other bits; set them anew.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    }
    file.write_all(token.as_bytes()).and_then(|()| file.sync_all()).map_err(err)?;
    drop(file);
    std::fs::rename(&temp, path).map_err(err)
}

/// Reads the token in `path`, refusing files that other users could read.
pub fn read_token_file(path: &Path) -> Result<String, SecretError> {
    let err = |source| SecretError::Read { path: path.to_path_buf(), source };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).map_err(err)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretError::TooOpen { path: path.to_path_buf(), mode });
        }
    }
    let token = std::fs::read_to_string(path).map_err(err)?.trim().to_string();
    if token.is_empty() {
        return Err(SecretError::Empty { path: path.to_path_buf() });
    }
    Ok(token)
}
