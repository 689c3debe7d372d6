//! Text that reaches a terminal: what clients send as names, comments, `by` and reasons is
//! refused at input if it holds control characters or bidirectional overrides (which can
//! rewrite what an operator sees), and what the CLI prints of the server's text is
//! escaped, so even a value that got in some other way (an executor's reason, a step
//! name from an older version) cannot move the cursor or reorder a line.

use std::borrow::Cow;

/// Characters that change how a line displays rather than being displayed: the C0 and C1
/// controls and the Unicode bidirectional controls.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
        )
}

/// Why `value` cannot be accepted as display text, if it cannot. `multiline` allows line
/// breaks and tabs (a comment, a gate message).
pub fn check(value: &str, multiline: bool) -> Result<(), String> {
    match value
        .chars()
        .find(|&c| is_unsafe(c) && !(multiline && (c == '\n' || c == '\t')))
    {
        Some(c) => Err(format!(
            "must not contain control or bidirectional characters (found U+{:04X})",
            u32::from(c)
        )),
        None => Ok(()),
    }
}

/// `value` with every unsafe character written as `\u{XXXX}`.
pub fn escape(value: &str) -> Cow<'_, str> {
    if !value.chars().any(is_unsafe) {
        return Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        if is_unsafe(c) {
            out.push_str(&format!("\\u{{{:04X}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_overrides_are_refused_and_escaped() {
        assert!(check("release-manager (alice)", false).is_ok());
        assert!(check("line one\nline two", true).is_ok());
        for bad in [
            "a\u{1b}[2Jb",
            "x\u{202E}gnp.exe",
            "tab\there",
            "nl\n",
            "c1\u{9b}",
        ] {
            assert!(check(bad, false).is_err(), "{bad:?}");
        }
        assert!(check("nl\nok\u{7}", true).is_err());
        assert_eq!(escape("ok"), "ok");
        assert_eq!(escape("a\u{1b}[2J"), "a\\u{001B}[2J");
        assert_eq!(escape("x\u{202E}y"), "x\\u{202E}y");
    }
}
