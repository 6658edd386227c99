//! Text that reaches a person's terminal: control characters made visible, and echoed values capped.
//!
//! Anything the command line prints that it did not write itself — model text, tool arguments and
//! results, paths, ids, server messages, values echoed in an error — may hold terminal escapes (an
//! OSC title change, a screen clear) or be megabytes long. `visible` renders every control
//! character except newline and tab in caret notation (`ESC` → `^[`, DEL → `^?`) and a C1 control
//! as `\u{9b}`, so nothing reaches the terminal as a command; `capped` cuts a value to
//! `ECHO_CHARS_MAX` characters with an ellipsis; `error_line` does both to a whole error line and
//! flattens it to one line. `--raw` output never passes through here: it stays exact.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Characters of a value echoed in an error message, and of a whole error line after its prefix.
pub const ECHO_CHARS_MAX: usize = 200;

/// Whether `c` must not reach a terminal as it is: C0 controls but newline and tab, DEL, and C1.
fn is_hidden_control(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t') || c == '\u{7f}'
}

/// `s` with every control character but newline and tab made visible (`^[`, `^M`, `^?`, `\u{9b}`).
pub fn visible(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_hidden_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if !is_hidden_control(c) => out.push(c),
            '\u{7f}' => out.push_str("^?"),
            c if (c as u32) < 0x20 => {
                out.push('^');
                out.push(char::from(b'@' + c as u8));
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// `s` cut to at most `chars_max` characters, ending with `…` when it was cut.
pub fn capped(s: &str, chars_max: usize) -> Cow<'_, str> {
    match s.char_indices().nth(chars_max) {
        None => Cow::Borrowed(s),
        Some(_) => {
            let keep = chars_max.saturating_sub(1);
            let end = s.char_indices().nth(keep).map_or(s.len(), |(i, _)| i);
            Cow::Owned(format!("{}…", &s[..end]))
        }
    }
}

/// A value for an error message: control characters visible, at most `ECHO_CHARS_MAX` characters.
pub fn echo(s: &str) -> String {
    visible(&capped(s, ECHO_CHARS_MAX)).into_owned()
}

/// A whole error message as one printable line: newlines become spaces, control characters are
/// visible, and the line is capped (a backstop for errors raised outside the command line that echo
/// a value without a bound).
pub fn error_line(message: &str) -> String {
    let capped = capped(message, ECHO_CHARS_MAX * 2);
    let flat = capped.replace(['\n', '\r'], " ");
    visible(&flat).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_become_visible_and_the_rest_stays() {
        assert_eq!(visible("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(
            visible("a\x1b]0;pwned\x07b\x1b[2Jc"),
            "a^[]0;pwned^Gb^[[2Jc"
        );
        assert_eq!(
            visible("del\u{7f} csi\u{9b}2J cr\r"),
            "del^? csi\\u{9b}2J cr^M"
        );
        assert_eq!(visible("héllo ␛"), "héllo ␛");
    }

    #[test]
    fn capped_values_end_with_an_ellipsis() {
        assert_eq!(capped("abc", 3), "abc");
        assert_eq!(capped("abcd", 3), "ab…");
        assert_eq!(capped("ééééé", 4), "ééé…");
        let long = "x".repeat(5_000_000);
        assert_eq!(echo(&long).chars().count(), ECHO_CHARS_MAX);
        let line = error_line(&format!("invalid id {long}\nsecond\x1b[2J"));
        assert_eq!(line.chars().count(), ECHO_CHARS_MAX * 2);
        assert!(line.ends_with('…') && !line.contains('\n'));
        assert_eq!(error_line("a\nb\x1b"), "a b^[");
    }
}
