//! The README's example command lines, so that each program's tests can check that every
//! example parses and that the examples in its `--help` are the README's.

/// The project's README.
pub const README: &str = include_str!("../../../README.md");

/// Every command line in `text` that runs `program`, as its words: lines ending in `\` are
/// joined, `# comments` and output redirections (`>`, `|`) are cut. In the README only the
/// fenced `sh` blocks are read.
///
/// Panics on a line that needs shell quoting, which these plain splits cannot read.
pub fn commands(text: &str, program: &str) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.split(" #").next().unwrap_or_default().trim_end();
        if let Some(start) = line.strip_suffix('\\') {
            pending.push_str(start);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let words: Vec<String> = pending
            .split_whitespace()
            .take_while(|w| !matches!(*w, ">" | "|" | ">>" | "2>" | "&&"))
            .map(str::to_owned)
            .collect();
        pending.clear();
        if words.first().map(String::as_str) == Some(program) {
            assert!(
                !words.iter().any(|w| w.contains(['"', '\'', '$', '`'])),
                "an example of {program} needs shell quoting: {}",
                words.join(" ")
            );
            commands.push(words);
        }
    }
    commands
}

/// [`commands`] of `program` in the README's `sh` blocks.
pub fn readme_commands(program: &str) -> Vec<Vec<String>> {
    let mut blocks = String::new();
    let mut inside = false;
    for line in README.lines() {
        match line.trim() {
            "```sh" => inside = true,
            "```" => inside = false,
            _ if inside => {
                blocks.push_str(line);
                blocks.push('\n');
            }
            _ => {}
        }
    }
    commands(&blocks, program)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuations_comments_and_redirections_are_handled() {
        let text = "x-tool a --b c \\\n  --d e   # a comment\nother x-tool\nx-tool gen --n 3 > out.jsonl\n";
        let found = commands(text, "x-tool");
        assert_eq!(
            found,
            vec![vec!["x-tool", "a", "--b", "c", "--d", "e"], vec!["x-tool", "gen", "--n", "3"]]
        );
    }

    #[test]
    fn the_readme_has_examples_of_every_program() {
        for program in ["fleetdeck", "fleet-router", "fleet-sim"] {
            assert!(!readme_commands(program).is_empty(), "no example of {program} in the README");
        }
    }
}
