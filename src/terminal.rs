//! Text from guests, models and workspaces as the CLI prints it: control characters (an
//! escape sequence can retitle the terminal, clear it, move the cursor over earlier lines
//! or, on some terminals, answer with input) are shown escaped, never sent to the terminal;
//! so are the characters that change how text around them reads without being seen
//! (bidirectional overrides and isolates, zero-width characters, the line and paragraph
//! separators): a path or argument shown is the one there.

use std::borrow::Cow;

/// Whether `c` reorders or hides text without showing itself: every Bidi_Control and
/// Default_Ignorable_Code_Point character of Unicode (marks, embeddings, overrides,
/// isolates, zero-width characters, joiners, the soft hyphen, variation selectors, tag
/// characters, the Hangul fillers), and the line and paragraph separators.
fn invisible(c: char) -> bool {
    matches!(
        c as u32,
        0x00AD
            | 0x034F
            | 0x061C
            | 0x115F..=0x1160
            | 0x17B4..=0x17B5
            | 0x180B..=0x180F
            | 0x200B..=0x200F
            | 0x2028..=0x202E
            | 0x2060..=0x206F
            | 0x3164
            | 0xFE00..=0xFE0F
            | 0xFEFF
            | 0xFFA0
            | 0xFFF0..=0xFFF8
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0000..=0xE0FFF
    )
}

/// `text` with every control character but newline and tab written as `\xNN` (`\u{NNNN}`
/// for the C1 controls and the invisible characters above).
pub fn shown(text: &str) -> Cow<'_, str> {
    escape(text, |c| {
        (c.is_control() && c != '\n' && c != '\t') || invisible(c)
    })
}

/// A name or path (one line: a file a guest named): [`shown`], with newline and tab
/// escaped too, so a name cannot print lines of its own among the host's.
pub fn shown_name(text: &str) -> Cow<'_, str> {
    escape(text, |c| c.is_control() || invisible(c))
}

fn escape(text: &str, escaped: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(&escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !escaped(c) => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

/// `println!` whose text goes through [`shown`], for the commands that print what models,
/// guests and workspaces wrote (`use crate::terminal::println_shown as println;`).
macro_rules! println_shown {
    () => {
        std::println!()
    };
    ($($arg:tt)*) => {
        std::println!("{}", $crate::terminal::shown(&format!($($arg)*)))
    };
}
pub(crate) use println_shown;

/// `println!` of one line whose text goes through [`shown_name`]: what a model or guest named
/// (a tool, a model, an item, a status) cannot print a line of its own.
macro_rules! println_line {
    () => {
        std::println!()
    };
    ($($arg:tt)*) => {
        std::println!("{}", $crate::terminal::shown_name(&format!($($arg)*)))
    };
}
pub(crate) use println_line;

/// `eprintln!` whose text goes through [`shown`].
macro_rules! eprintln_shown {
    () => {
        std::eprintln!()
    };
    ($($arg:tt)*) => {
        std::eprintln!("{}", $crate::terminal::shown(&format!($($arg)*)))
    };
}
pub(crate) use eprintln_shown;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_plain_text_is_not_copied() {
        assert!(matches!(shown("plain\ttext\nnext"), Cow::Borrowed(_)));
        assert_eq!(shown("\x1b]0;title\x07"), "\\x1b]0;title\\x07");
        assert_eq!(shown("a\rb\x7f"), "a\\x0db\\x7f");
        assert_eq!(shown("\u{9b}2J é"), "\\u{009b}2J é");
        // A name keeps to its line.
        assert_eq!(
            shown_name("x\nstatus: completed\tz"),
            "x\\x0astatus: completed\\x09z"
        );
        assert_eq!(shown("a\nb"), "a\nb");
        // A right-to-left override makes `evil\u{202e}txt.exe` read as `evilexe.txt`.
        assert_eq!(shown("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        assert_eq!(
            shown("a\u{200b}b\u{2066}c\u{2028}d\u{feff}"),
            "a\\u{200b}b\\u{2066}c\\u{2028}d\\u{feff}"
        );
        // The Arabic letter mark (a bidi control), tag characters that spell hidden text,
        // the soft hyphen, a variation selector and a Hangul filler.
        assert_eq!(
            shown("a\u{61c}b\u{e0049}\u{e0047}c\u{ad}d\u{fe0f}e\u{3164}"),
            "a\\u{061c}b\\u{e0049}\\u{e0047}c\\u{00ad}d\\u{fe0f}e\\u{3164}"
        );
    }
}
