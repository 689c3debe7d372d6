//! Text that reaches a terminal: what clients send as names, comments, `by` and reasons is
//! refused at input if it holds control characters or bidirectional overrides (which can
//! rewrite what an operator sees), and what the CLI prints of the server's text is
//! escaped, so even a value that got in some other way (an executor's reason, a step
//! name from an older version) cannot move the cursor or reorder a line.

use std::borrow::Cow;

/// `text` as one percent-encoded URL path segment or query value.
pub fn url_encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

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

/// Whether `text` fits `max_bytes` counted as if every character were as wide in UTF-8
/// as its widest one: at most `max_bytes / widest` characters. Never more than
/// `max_bytes` bytes, and exactly what a JSON Schema can state per character width
/// (`maxLength` counts characters), so the API and its OpenAPI document agree on every
/// string.
pub fn fits(text: &str, max_bytes: usize) -> bool {
    let widest = text.chars().map(char::len_utf8).max().unwrap_or(1);
    text.chars().count() <= max_bytes / widest
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

    #[test]
    fn fits_counts_every_character_as_wide_as_the_widest() {
        assert!(fits(&"a".repeat(100), 100));
        assert!(!fits(&"a".repeat(101), 100));
        assert!(fits(&"é".repeat(50), 100));
        assert!(!fits(&"é".repeat(51), 100));
        // 60 ASCII and one 4-byte character: 64 bytes, but 61 characters > 100 / 4.
        let mixed = format!("{}😍", "a".repeat(60));
        assert!(!fits(&mixed, 100));
        assert!(fits(&format!("{}😍", "a".repeat(24)), 100));
        assert!(fits("", 100));
    }
}
