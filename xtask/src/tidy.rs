//! Tidy checks of the workspace's shape, run by `cargo test -p xtask`: every crate's workspace-internal
//! dependencies (its `[dependencies]`, target-specific ones included; dev-dependencies are free) must be
//! among those ARCHITECTURE.md's `## Allowed dependencies` table allows it, and the table must name only
//! crates that exist, every one of them.
//!
//! The table is a markdown table `| crate | may depend on |`; each cell names crates in backticks
//! (anything else in a cell is prose, for people). A crate cell may end in `(planned)`: a crate the
//! table already describes but the workspace does not have yet; the check then insists it does not
//! exist, so the marker goes when the crate comes. Cargo.toml files are read by hand: the few lines
//! needed (members, the package name, dependency keys) are simple TOML here, and xtask stays std only.

use std::collections::{BTreeMap, BTreeSet};

/// A crate's row in the table: what it may depend on, and whether it is still to be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Allowed {
    pub(crate) may_depend_on: BTreeSet<String>,
    pub(crate) planned: bool,
}

/// The heading of the table in ARCHITECTURE.md.
const TABLE_HEADING: &str = "## Allowed dependencies";
/// The marker of a crate the table describes before it exists.
const PLANNED: &str = "(planned)";

/// The names in backticks of a table cell, in order.
fn backticked(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// The `## Allowed dependencies` table of `architecture` (ARCHITECTURE.md's text): crate -> its row.
pub(crate) fn allowed_table(architecture: &str) -> Result<BTreeMap<String, Allowed>, String> {
    let section = architecture
        .split_once(&format!("\n{TABLE_HEADING}\n"))
        .map(|(_, rest)| rest)
        .ok_or_else(|| format!("ARCHITECTURE.md has no `{TABLE_HEADING}` section"))?;
    let mut rows =
        section.lines().skip_while(|line| !line.starts_with('|')).take_while(|line| line.starts_with('|'));
    let header = rows.next().ok_or_else(|| format!("`{TABLE_HEADING}` holds no table"))?;
    if header.split('|').map(str::trim).filter(|c| !c.is_empty()).collect::<Vec<_>>()
        != ["crate", "may depend on"]
    {
        return Err(format!(
            "the `{TABLE_HEADING}` table's header must be `| crate | may depend on |`, not {header:?}"
        ));
    }
    let mut table = BTreeMap::new();
    for line in rows.skip(1) {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        let [crate_cell, allowed_cell] = cells.as_slice() else {
            return Err(format!("a row of `{TABLE_HEADING}` has not two cells: {line:?}"));
        };
        let [name] = backticked(crate_cell).try_into().map_err(|names: Vec<String>| {
            format!("a row of `{TABLE_HEADING}` must name one crate in backticks, not {names:?}: {line:?}")
        })?;
        let row = Allowed {
            may_depend_on: backticked(allowed_cell).into_iter().collect(),
            planned: crate_cell.trim_end().ends_with(PLANNED),
        };
        if table.insert(name.clone(), row).is_some() {
            return Err(format!("`{TABLE_HEADING}` has two rows for {name}"));
        }
    }
    Ok(table)
}

/// The member paths of the workspace manifest `manifest` (its `members = [...]`).
pub(crate) fn workspace_members(manifest: &str) -> Vec<String> {
    let after = manifest.split_once("\nmembers = [").map_or("", |(_, rest)| rest);
    let list = after.split_once(']').map_or("", |(list, _)| list);
    list.split(',')
        .map(|item| item.trim().trim_matches('"').to_owned())
        .filter(|item| !item.is_empty())
        .collect()
}

/// One `key = value` line of a manifest (not a section header, comment or continuation): the key.
fn key_of(line: &str) -> Option<&str> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    let valid = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    valid.then_some(key)
}

/// The package a renamed dependency names: `alias = { package = "real-name", ... }`.
fn renamed_package(line: &str) -> Option<&str> {
    let (_, value) = line.split_once('=')?;
    value.split([',', '{', '}']).find_map(|item| {
        let (key, value) = item.split_once('=')?;
        (key.trim() == "package").then(|| value.trim().trim_matches('"'))
    })
}

/// A crate manifest's package name and the names of its `[dependencies]` (target-specific ones
/// included; a renamed dependency by the package it names).
pub(crate) fn read_manifest(manifest: &str) -> Result<(String, Vec<String>), String> {
    let mut section = String::new();
    let mut name = None;
    let mut dependencies = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_owned();
            // `[dependencies.NAME]`: one dependency as a table of its own.
            if let Some(dependency) = section.strip_prefix("dependencies.") {
                dependencies.push(dependency.trim_matches('"').to_owned());
            }
            continue;
        }
        let Some(key) = key_of(line) else { continue };
        let is_dependencies = section == "dependencies"
            || (section.starts_with("target.") && section.ends_with(".dependencies"));
        if section == "package" && key == "name" {
            name = line.split('"').nth(1).map(str::to_owned);
        } else if is_dependencies {
            let key = key.split('.').next().unwrap_or(key);
            dependencies.push(renamed_package(line).unwrap_or(key).to_owned());
        }
    }
    let name = name.ok_or("a manifest without `[package] name`")?;
    Ok((name, dependencies))
}

/// Every way `manifests` ((package name, its dependencies) per workspace crate) and `table` disagree,
/// one sentence each naming the crate and the dependency.
pub(crate) fn check(manifests: &[(String, Vec<String>)], table: &BTreeMap<String, Allowed>) -> Vec<String> {
    let packages: BTreeSet<&str> = manifests.iter().map(|(name, _)| name.as_str()).collect();
    let mut problems = Vec::new();
    for (name, dependencies) in manifests {
        let Some(row) = table.get(name) else {
            problems.push(format!(
                "{name} is a workspace crate without a row in ARCHITECTURE.md's `{TABLE_HEADING}`"
            ));
            continue;
        };
        if row.planned {
            problems.push(format!("{name} exists now: remove `{PLANNED}` from its row in `{TABLE_HEADING}`"));
        }
        for dependency in dependencies.iter().filter(|d| packages.contains(d.as_str())) {
            if !row.may_depend_on.contains(dependency) {
                problems.push(format!(
                    "{name} depends on {dependency}, which its row in ARCHITECTURE.md's `{TABLE_HEADING}` does not allow"
                ));
            }
        }
    }
    for (name, row) in table {
        if !row.planned && !packages.contains(name.as_str()) {
            problems.push(format!("`{TABLE_HEADING}` has a row for {name}, which is no workspace crate"));
        }
        for allowed in &row.may_depend_on {
            let planned = table.get(allowed).is_some_and(|r| r.planned);
            if !packages.contains(allowed.as_str()) && !planned {
                problems.push(format!(
                    "`{TABLE_HEADING}` lets {name} depend on {allowed}, which is no workspace crate"
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    const TABLE: &str = "# Architecture\n\n## Allowed dependencies\n\nWhat each crate may use.\n\n\
        | crate | may depend on |\n|---|---|\n\
        | `base` | none |\n\
        | `api` | `base` |\n\
        | `app` | `api`, `base` (until the move: see below) |\n\
        | `demo` (planned) | `base` |\n\nA note.\n\n## Next\n| `not` | `a row` |\n";

    #[test]
    fn the_table_is_read_by_its_backticked_names() {
        let table = allowed_table(TABLE).unwrap();
        assert_eq!(table.keys().collect::<Vec<_>>(), ["api", "app", "base", "demo"]);
        assert_eq!(table["app"].may_depend_on, set(&["api", "base"]));
        assert_eq!(table["base"].may_depend_on, set(&[]));
        assert!(table["demo"].planned && !table["app"].planned);
        assert!(allowed_table("# no table\n").unwrap_err().contains("no `## Allowed dependencies`"));
        let two = TABLE.replace("| `base` | none |", "| `base` | none |\n| `base` | `api` |");
        assert!(allowed_table(&two).unwrap_err().contains("two rows for base"));
    }

    #[test]
    fn manifests_give_their_normal_dependencies_only() {
        let manifest = r#"[package]
name = "app"
description = "name = \"not this\""

[[bin]]
name = "app-bin"

[dependencies]
api.workspace = true
base = { workspace = true, features = [
    "http",
] }
my-package-thing = "1"
renamed = { package = "store", path = "../store" }

[target.'cfg(target_arch = "wasm32")'.dependencies]
wasm-only = "1"

[dependencies.tabled]
version = "1"

[dev-dependencies]
test-support.workspace = true

[build-dependencies]
builder = "1"
"#;
        let (name, dependencies) = read_manifest(manifest).unwrap();
        assert_eq!(name, "app");
        assert_eq!(dependencies, ["api", "base", "my-package-thing", "store", "wasm-only", "tabled"]);
        let members = workspace_members(
            "[workspace]\nmembers = [\n    \"crates/a\",\n    \"xtask\",\n]\nother = [\"x\"]\n",
        );
        assert_eq!(members, ["crates/a", "xtask"]);
    }

    #[test]
    fn a_dependency_the_table_does_not_allow_is_named_with_its_crate() {
        let table = allowed_table(TABLE).unwrap();
        let manifests = vec![
            ("base".to_owned(), vec!["serde".to_owned()]),
            ("api".to_owned(), vec!["base".to_owned(), "app".to_owned()]),
            ("app".to_owned(), vec!["api".to_owned(), "base".to_owned()]),
        ];
        assert_eq!(
            check(&manifests, &table),
            [
                "api depends on app, which its row in ARCHITECTURE.md's `## Allowed dependencies` does not allow"
            ]
        );
    }

    #[test]
    fn the_table_may_name_only_crates_that_exist_or_are_planned() {
        let table = allowed_table(
            &TABLE.replace("| `api` | `base` |", "| `api` | `base`, `bsae` |\n| `gone` | none |"),
        )
        .unwrap();
        let manifests = vec![
            ("base".to_owned(), vec![]),
            ("api".to_owned(), vec![]),
            ("app".to_owned(), vec![]),
            ("demo".to_owned(), vec![]),
            ("new".to_owned(), vec![]),
        ];
        let problems = check(&manifests, &table);
        assert_eq!(
            problems,
            [
                "demo exists now: remove `(planned)` from its row in `## Allowed dependencies`",
                "new is a workspace crate without a row in ARCHITECTURE.md's `## Allowed dependencies`",
                "`## Allowed dependencies` lets api depend on bsae, which is no workspace crate",
                "`## Allowed dependencies` has a row for gone, which is no workspace crate",
            ]
        );
    }

    /// The real workspace against the real table.
    #[test]
    fn every_crate_depends_only_on_what_architecture_md_allows() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let read = |path: &Path| {
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
        };
        let table = allowed_table(&read(&root.join("ARCHITECTURE.md"))).unwrap();
        let members = workspace_members(&read(&root.join("Cargo.toml")));
        assert!(members.len() > 10, "the workspace's members were not found: {members:?}");
        let manifests: Vec<(String, Vec<String>)> = members
            .iter()
            .map(|member| {
                let path = root.join(member).join("Cargo.toml");
                read_manifest(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            })
            .collect();
        let problems = check(&manifests, &table);
        assert!(problems.is_empty(), "the crates and ARCHITECTURE.md disagree:\n{}", problems.join("\n"));
    }
}
