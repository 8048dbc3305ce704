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
    #[error("cannot read random bytes from the operating system (/dev/urandom): {0}")]
    Random(std::io::Error),
}

/// A secret string (an admin token, a launch or session key). It has no `Display` and its `Debug`
/// is redacted, so no log line or debug dump can carry it; [`Secret::expose`] is the one way to its
/// text, which keeps every use easy to find.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The secret's text, for the one place that must send or store it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this secret, in time that depends only on the secret's length: every
    /// byte is compared (XOR-accumulated, the length difference folded in), so timing never tells
    /// how much of a guess was right.
    pub fn matches(&self, presented: &str) -> bool {
        let (ours, theirs) = (self.0.as_bytes(), presented.as_bytes());
        let mut diff = u8::from(ours.len() != theirs.len());
        for (i, byte) in ours.iter().enumerate() {
            diff |= byte ^ theirs.get(i).copied().unwrap_or(0);
        }
        diff == 0
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Self {
        Self(text)
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Self {
        Self(text.to_owned())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// A fresh secret of 256 random bits from the operating system, as 64 hex digits.
pub fn random_token() -> Result<Secret, SecretError> {
    use std::io::Read as _;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(SecretError::Random)?;
    Ok(Secret(bytes.iter().map(|b| format!("{b:02x}")).collect()))
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
pub fn read_token_file(path: &Path) -> Result<Secret, SecretError> {
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
    Ok(Secret(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_shows_its_text_and_compares_whole() {
        let secret = Secret::new("s3cret");
        assert_eq!(format!("{secret:?}"), "Secret(<redacted>)");
        assert!(secret.matches("s3cret"));
        for wrong in ["s3cre", "s3cret!", "S3cret", "", "s3cret\0"] {
            assert!(!secret.matches(wrong), "{wrong:?}");
        }
    }

    #[test]
    fn random_tokens_are_long_and_fresh() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_eq!(a.expose().len(), 64);
        assert!(a.expose().chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
