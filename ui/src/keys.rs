//! Keyboard navigation, as a pure mapping from keys to actions so it is tested on the host:
//! number keys open the nav's views in order (1 = Fleet), `g` then a letter jumps (`g f` fleet, `g h` heat,
//! `g d` decisions, `g r` headroom, `g s` settings), `t` switches the theme, `/` focuses the
//! view's filter. Keys typed into form fields are never taken.

use crate::route::Route;

/// What a key press asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAction {
    Go(Route),
    ToggleTheme,
    FocusFilter,
    /// `g` was pressed: wait for the letter.
    Prefix,
}

/// The action of `key` (a `KeyboardEvent.key`) given whether `g` came just before it.
pub fn action(key: &str, after_g: bool) -> Option<KeyAction> {
    if after_g {
        let letter = key.chars().next().filter(|_| key.chars().count() == 1)?;
        return Route::NAV.iter().copied().find(|r| r.key() == letter).map(KeyAction::Go);
    }
    match key {
        "g" => Some(KeyAction::Prefix),
        "t" => Some(KeyAction::ToggleTheme),
        "/" => Some(KeyAction::FocusFilter),
        _ => {
            // One digit: 1..9 follow the nav; views past the ninth have only their `g` letter.
            let n = key.chars().next().filter(|_| key.len() == 1)?.to_digit(10)? as usize;
            Route::NAV.get(n.checked_sub(1)?).copied().map(KeyAction::Go)
        }
    }
}

/// The one-line help the footer shows.
pub const HELP: &str = "keys: 1–9 views · g f/h/d/r/s/o/w/u/y/x · t theme · / filter · arrows move in lists";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_follow_the_nav() {
        assert_eq!(action("1", false), Some(KeyAction::Go(Route::Fleet)));
        assert_eq!(action("2", false), Some(KeyAction::Go(Route::Heat)));
        assert_eq!(action("5", false), Some(KeyAction::Go(Route::Settings)));
        assert_eq!(action("6", false), Some(KeyAction::Go(Route::Policy)));
        assert_eq!(action("10", false), None);
        assert_eq!(action("0", false), None);
    }

    #[test]
    fn g_then_a_letter_jumps() {
        assert_eq!(action("g", false), Some(KeyAction::Prefix));
        assert_eq!(action("d", true), Some(KeyAction::Go(Route::Decisions)));
        assert_eq!(action("r", true), Some(KeyAction::Go(Route::Headroom)));
        assert_eq!(action("x", true), Some(KeyAction::Go(Route::Pd)));
        assert_eq!(action("q", true), None);
        assert_eq!(action("Enter", true), None);
        assert_eq!(action("d", false), None, "a bare letter does nothing");
    }

    #[test]
    fn theme_and_filter() {
        assert_eq!(action("t", false), Some(KeyAction::ToggleTheme));
        assert_eq!(action("/", false), Some(KeyAction::FocusFilter));
    }
}
