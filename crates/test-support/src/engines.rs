//! Where a real engine's build is looked for: the folder `cargo xtask test` names in an environment
//! variable, else the engines cache `cargo xtask engines ...` fills beside or under the target folder.

use std::path::PathBuf;

use crate::process::bin_dir;

/// The folders that may hold an engine's build, in the order to try them: `env_var`'s folder when it is
/// set, else every `PREFIX*` folder of the engines cache, newest version first.
pub(crate) fn engine_dirs(env_var: &str, prefix: &str) -> Vec<PathBuf> {
    if let Some(dir) = std::env::var_os(env_var) {
        return vec![PathBuf::from(dir)];
    }
    let mut candidates = Vec::new();
    let Some(target) = bin_dir().parent().map(PathBuf::from) else { return candidates };
    for engines in
        [target.parent().map(|p| p.join("engines")), Some(target.join("engines"))].into_iter().flatten()
    {
        let Ok(entries) = std::fs::read_dir(&engines) else { continue };
        let mut dirs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)))
            .collect();
        dirs.sort();
        candidates.extend(dirs.into_iter().rev());
    }
    candidates
}
