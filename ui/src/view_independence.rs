//! Host test of a rule of the ui's layout: a view never imports another view. What two views
//! share (the candidate spec, the policy diff, the routers' status line, ...) has a module of its
//! own outside `views/`, so each concept has one home and a view can change without breaking
//! another.

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, at any depth, sorted so failures read the same on every run.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The views `views/mod.rs` declares (`pub mod fleet;` -> `fleet`).
fn declared_views(mod_rs: &str) -> Vec<String> {
    mod_rs
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line.strip_prefix("pub mod ").or_else(|| line.strip_prefix("mod "))?;
            Some(rest.strip_suffix(';')?.trim().to_owned())
        })
        .collect()
}

/// The lines of `source` that reach into another view than `own_view`: through `crate::views`,
/// or through `super::` back up to `views/` (`depth` is how many `super::` that takes: 1 for
/// `views/push.rs`, 2 for `views/push/etcd.rs`). Comment lines are skipped.
fn foreign_view_imports(source: &str, own_view: &str, depth: usize, views: &[String]) -> Vec<String> {
    let up_to_views = "super::".repeat(depth);
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| {
            line.contains("crate::views")
                || views
                    .iter()
                    .filter(|view| view.as_str() != own_view)
                    .any(|view| line.contains(&format!("{up_to_views}{view}::")))
        })
        .map(|(n, line)| format!("{}: {}", n + 1, line.trim()))
        .collect()
}

#[test]
fn no_view_imports_another_view() {
    let views_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/views");
    let mod_rs = views_dir.join("mod.rs");
    let views = declared_views(&fs::read_to_string(&mod_rs).expect("views/mod.rs"));
    assert!(views.len() >= 10, "views/mod.rs should declare every view, found {views:?}");

    let mut offences = Vec::new();
    let files = rust_files(&views_dir);
    assert!(files.len() > views.len(), "expected every view's file under {}", views_dir.display());
    for file in files.iter().filter(|f| **f != mod_rs) {
        let relative = file.strip_prefix(&views_dir).expect("under views/");
        let own_view = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|first| first.trim_end_matches(".rs").to_owned())
            .expect("a file name");
        let depth = relative.components().count();
        let source = fs::read_to_string(file).expect("a view's source");
        for line in foreign_view_imports(&source, &own_view, depth, &views) {
            offences.push(format!("ui/src/views/{}:{line}", relative.display()));
        }
    }
    assert!(
        offences.is_empty(),
        "a view imports another view; move what they share to a module outside ui/src/views:\n{}",
        offences.join("\n")
    );
}

#[test]
fn a_borrowed_view_is_caught_whichever_way_it_is_reached() {
    let views = vec!["heat".to_owned(), "policy".to_owned(), "push".to_owned()];
    let through_crate = "use crate::components::ErrorBanner;\nuse crate::views::heat::RouterStatus;\n";
    assert_eq!(
        foreign_view_imports(through_crate, "push", 1, &views),
        ["2: use crate::views::heat::RouterStatus;"]
    );
    let through_super = "use super::policy::diff_row;\n";
    assert_eq!(foreign_view_imports(through_super, "push", 1, &views).len(), 1);
    let from_a_part = "use super::super::heat::RouterStatus;\n";
    assert_eq!(foreign_view_imports(from_a_part, "push", 2, &views).len(), 1);
    // A part of a view may use its own view, and a comment may name any view.
    let own =
        "use super::push_helper;\n// crate::views::heat is where the map lives\nuse super::super::push::X;\n";
    assert!(foreign_view_imports(own, "push", 2, &views).is_empty());
}
