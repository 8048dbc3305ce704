//! The settings file: the endpoints an operator added in the app, kept across restarts in a small JSON file
//! next to the history database (written atomically), and the checks of what an operator types.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// Shortest and longest scrape intervals the app accepts.
pub const MIN_SCRAPE_INTERVAL: Duration = Duration::from_millis(200);
pub const MAX_SCRAPE_INTERVAL: Duration = Duration::from_secs(300);

/// What the settings file holds.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SavedSettings {
    pub replicas: Vec<String>,
    pub routers: Vec<SavedRouter>,
    pub prometheus: Vec<String>,
    /// `None`: the command line's (or the default) interval.
    pub scrape_interval_s: Option<f64>,
}

/// A router and where its token is kept.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SavedRouter {
    pub url: String,
    pub token_file: Option<PathBuf>,
}

impl SavedSettings {
    /// The saved routers as targets to read (their tokens in the files named).
    pub(crate) fn router_targets(&self) -> Vec<crate::RouterTarget> {
        self.routers
            .iter()
            .map(|r| crate::RouterTarget {
                url: r.url.clone(),
                token: None,
                token_file: r.token_file.clone(),
                metrics_url: None,
            })
            .collect()
    }

    /// Reads `path`; a missing file is the empty default, a corrupt one an error naming it.
    pub fn load(path: &Path) -> Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text).with_context(|| {
                format!("the settings file {} is not valid; fix or delete it", path.display())
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e).with_context(|| format!("cannot read the settings file {}", path.display())),
        }
    }

    /// Writes `path` atomically and durably: a temporary file in the same folder, flushed to disk, renamed
    /// over `path`, then the folder flushed so the rename itself survives a power cut. A crash at any point
    /// leaves either the old file or the new one, never a torn or empty one.
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).context("cannot encode the settings")?;
        write_atomically(path, text.as_bytes())
    }
}

/// Replaces `path` with `bytes` atomically: temp file beside it (mode 0600) + fsync + rename + fsync of the
/// folder.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let name =
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "settings".into());
    // Unique per process and call, so two saves at once never share a temporary file.
    let temp =
        dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let written = (|| -> std::io::Result<()> {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        // Readable by its owner only, as the token files it names (whatever the umask).
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()
    })();
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(error).with_context(|| format!("cannot write {}", temp.display()));
    }
    if let Err(error) = std::fs::rename(&temp, path) {
        let _ = std::fs::remove_file(&temp);
        return Err(error).with_context(|| format!("cannot replace {}", path.display()));
    }
    // The rename is an entry of the folder: flush the folder too (Unix; elsewhere opening a folder fails).
    #[cfg(unix)]
    std::fs::File::open(dir).and_then(|d| d.sync_all()).with_context(|| {
        format!("cannot flush the folder {} after replacing {}", dir.display(), path.display())
    })?;
    Ok(())
}

/// Checks an endpoint URL typed by an operator: http(s), a host, no spaces.
pub fn validate_url(url: &str) -> Result<String, String> {
    let url = url.trim().trim_end_matches('/');
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?} is not an http(s) URL; write it like http://10.0.0.5:8000"))?;
    if rest.is_empty() || rest.starts_with('/') || rest.contains(char::is_whitespace) {
        return Err(format!("{url:?} has no host or contains spaces; write it like http://10.0.0.5:8000"));
    }
    Ok(url.to_owned())
}

/// Checks a scrape interval in seconds.
pub fn validate_interval(seconds: f64) -> Result<Duration, String> {
    let (min, max) = (MIN_SCRAPE_INTERVAL.as_secs_f64(), MAX_SCRAPE_INTERVAL.as_secs_f64());
    if !seconds.is_finite() || seconds < min || seconds > max {
        return Err(format!("the scrape interval {seconds} s is out of range; pick {min} to {max} seconds"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Longest escaped URL in a token file's name; a longer URL is cut there and given its hash.
const MAX_TOKEN_STEM: usize = 160;

/// The token file of router `url` inside `dir`: a readable name, and one no other URL gets. Letters,
/// digits, `.` and `-` stay; every other byte is written `_XX` (its hex), `_` included, so the escaping
/// can be undone and two URLs never share a file (`.../a/b` and `.../a_b` did when both became `_`). A URL
/// too long for a file name keeps its first bytes and adds `~` and a 64-bit FNV-1a hash of the whole URL.
pub fn token_file_for(dir: &Path, url: &str) -> PathBuf {
    let mut stem = String::with_capacity(url.len());
    for byte in url.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'.' || byte == b'-' {
            stem.push(char::from(byte));
        } else {
            stem.push_str(&format!("_{byte:02X}"));
        }
    }
    if stem.len() > MAX_TOKEN_STEM {
        // The escaped text is ASCII: any byte is a character boundary.
        stem.truncate(MAX_TOKEN_STEM);
        let hash = url.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        stem.push_str(&format!("~{hash:016x}"));
    }
    dir.join(format!("router-{stem}.token"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("settings.json");
        assert_eq!(SavedSettings::load(&path).unwrap(), SavedSettings::default());
        let saved = SavedSettings {
            replicas: vec!["http://a:1".into()],
            routers: vec![SavedRouter { url: "http://r:2".into(), token_file: Some("/t".into()) }],
            prometheus: vec![],
            scrape_interval_s: Some(2.0),
        };
        saved.save(&path).unwrap();
        assert_eq!(SavedSettings::load(&path).unwrap(), saved);
        std::fs::write(&path, "{not json").unwrap();
        let err = SavedSettings::load(&path).unwrap_err();
        assert!(format!("{err:#}").contains("settings.json"), "{err:#}");
    }

    #[test]
    fn a_save_replaces_the_file_whole_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        for n in 0..20 {
            let saved = SavedSettings { replicas: vec![format!("http://a:{n}")], ..SavedSettings::default() };
            saved.save(&path).unwrap();
            assert_eq!(SavedSettings::load(&path).unwrap(), saved);
        }
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["settings.json"]);
        // A folder that cannot be written: a clear error, the old file intact.
        let blocked = dir.path().join("file-not-folder");
        std::fs::write(&blocked, "x").unwrap();
        let err = SavedSettings::default().save(&blocked.join("settings.json")).unwrap_err();
        assert!(format!("{err:#}").contains("file-not-folder"), "{err:#}");
    }

    #[cfg(unix)]
    #[test]
    fn the_settings_file_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        SavedSettings::default().save(&path).unwrap();
        // Whatever the umask (the attack found 0644 under 022).
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn urls_and_intervals_are_checked_with_a_fix() {
        assert_eq!(validate_url(" http://a:1/ ").unwrap(), "http://a:1");
        assert!(validate_url("a:1").unwrap_err().contains("http://"));
        assert!(validate_url("http://").is_err());
        assert!(validate_url("http://a b").is_err());
        assert_eq!(validate_interval(1.0).unwrap(), Duration::from_secs(1));
        assert!(validate_interval(0.0).unwrap_err().contains("pick"));
        assert!(validate_interval(f64::NAN).is_err());
    }

    #[test]
    fn token_files_are_named_after_the_router_and_never_shared() {
        let path = token_file_for(Path::new("/d"), "http://127.0.0.1:8080");
        assert_eq!(path, Path::new("/d/router-http_3A_2F_2F127.0.0.1_3A8080.token"));
        // The attack: these two shared one file (`/` and `_` both became `_`).
        let slash = token_file_for(Path::new("/d"), "http://127.0.0.1:27900/a/b");
        let underscore = token_file_for(Path::new("/d"), "http://127.0.0.1:27900/a_b");
        assert_ne!(slash, underscore);
        let long =
            |tail: &str| token_file_for(Path::new("/d"), &format!("http://h/{}{tail}", "x".repeat(300)));
        assert_ne!(long("1"), long("2"), "long URLs differ by their hash");
        let name = long("1").file_name().unwrap().len();
        assert!(name < 255, "a file name fits: {name}");
    }
}
