//! Go templates (foreach messages) parsed with `gtmpl`, after a check of what its lexer cannot
//! take.
//!
//! gtmpl lexes in a thread of its own and, where Go steps back over the last character read,
//! steps back one byte. At the end of the text, inside an action (`Summary {{ `), that moves it
//! back onto the last character for ever: it sends tokens without end and the parse never
//! returns while memory grows. After a character of several bytes it lands inside that
//! character and the thread panics. Both happen only where Go would report an error or where
//! a non-ASCII character stands outside the string literals of an action, so such templates
//! are refused here, with a message, before gtmpl sees them. Its parser unquotes string
//! literals by byte offsets too: the escapes it would panic or loop on are refused as well.

use gtmpl::Template;

/// Parses `source` as a Go template; the error is one line.
pub fn parse(source: &str) -> Result<Template, String> {
    check_lexable(source)?;
    check_nesting(source)?;
    let mut template = Template::default();
    template.parse(source).map_err(|e| e.to_string())?;
    Ok(template)
}

/// How deep parentheses inside an action, and blocks (`if`, `range`, `with` ... `end`), may
/// nest: gtmpl parses both by recursion, and a few thousand levels overflow the stack and end
/// the process.
pub const MAX_NESTING: usize = 100;

/// Refuses templates nesting parentheses or blocks deeper than [`MAX_NESTING`], and named
/// templates (one calling itself recurses until the stack overflows). String and raw-string
/// literals are skipped; the count is an upper bound of what gtmpl recurses on.
pub fn check_nesting(source: &str) -> Result<(), String> {
    let (mut blocks, mut max_blocks) = (0usize, 0usize);
    let mut rest = source;
    while let Some(open) = rest.find("{{") {
        let action = &rest[open + 2..];
        let end = action.find("}}").unwrap_or(action.len());
        let inner = action[..end].trim_start_matches('-').trim_start();
        let word = inner
            .split(|c: char| !c.is_ascii_alphabetic())
            .next()
            .unwrap_or("");
        match word {
            // A named template that calls itself recurses in gtmpl's renderer until the stack
            // overflows (Go stops at a depth limit): named templates are not taken.
            "define" | "template" | "block" => {
                return Err(format!(
                    "`{{{{{word}}}}}`: named templates (define, template, block) are not \
                     supported in these messages"
                ));
            }
            "if" | "range" | "with" => {
                blocks += 1;
                max_blocks = max_blocks.max(blocks);
            }
            "end" => blocks = blocks.saturating_sub(1),
            _ => {}
        }
        let mut parens = 0usize;
        let mut quote: Option<char> = None;
        let mut escaped = false;
        for c in action[..end].chars() {
            match quote {
                Some(q) => {
                    if escaped {
                        escaped = false;
                    } else if c == '\\' && q == '"' {
                        escaped = true;
                    } else if c == q {
                        quote = None;
                    }
                }
                None => match c {
                    '"' | '`' | '\'' => quote = Some(c),
                    '(' => {
                        parens += 1;
                        if parens > MAX_NESTING {
                            return Err(format!(
                                "an action nests parentheses more than {MAX_NESTING} deep"
                            ));
                        }
                    }
                    ')' => parens = parens.saturating_sub(1),
                    _ => {}
                },
            }
        }
        if max_blocks > MAX_NESTING {
            return Err(format!(
                "blocks (if, range, with) nest more than {MAX_NESTING} deep"
            ));
        }
        rest = &action[end.min(action.len())..];
    }
    Ok(())
}

/// Refuses what would make gtmpl's lexer loop or panic (see the module header). Positions
/// are followed as gtmpl's lexer follows them; where gtmpl stops at an error of its own
/// (a newline inside a string, an unclosed comment) the check stops and lets gtmpl report it.
pub fn check_lexable(source: &str) -> Result<(), String> {
    let mut pos = 0;
    while let Some(found) = source[pos..].find("{{") {
        let open = pos + found;
        let mut at = open + 2;
        if source[at..].starts_with("- ") {
            // gtmpl trims the text before `{{- ` by the byte length of its last character.
            let before = source[pos..open].trim_end();
            if before.chars().next_back().is_some_and(|c| !c.is_ascii()) {
                return Err(format!(
                    "byte {open}: a `{{{{- ` right after a non-ASCII character is not supported; \
                     put a space without the trim (`{{{{ `) or an ASCII character before it"
                ));
            }
            at += 2;
        }
        if source[at..].starts_with("/*") {
            let Some(end) = source[at + 2..].find("*/") else {
                return Ok(());
            };
            pos = at + 2 + end + 2;
            match right_delim(&source[pos..]) {
                Some(len) => pos += len,
                None => return Ok(()),
            }
            continue;
        }
        pos = action_end(source, open, at)?;
    }
    Ok(())
}

/// The length of the `}}` or ` -}}` that `rest` starts with.
fn right_delim(rest: &str) -> Option<usize> {
    if rest.starts_with("}}") {
        Some(2)
    } else if rest.starts_with(" -}}") {
        Some(4)
    } else {
        None
    }
}

/// Where the action opened at `open` (its body starting at `at`) ends, past its `}}`.
fn action_end(source: &str, open: usize, mut at: usize) -> Result<usize, String> {
    let unclosed = || {
        let shown: String = source[open..].chars().take(40).collect();
        format!("byte {open}: the action `{shown}` is not closed by `}}}}`")
    };
    loop {
        if let Some(len) = right_delim(&source[at..]) {
            return Ok(at + len);
        }
        let c = source[at..].chars().next().ok_or_else(unclosed)?;
        at += c.len_utf8();
        match c {
            '"' | '\'' | '`' => {
                // A literal; gtmpl reads it a character at a time, whatever they are, and
                // (unlike Go) takes a `\` after a `\` as escaping the next one too.
                let mut escaped = false;
                let content = at;
                loop {
                    let d = source[at..].chars().next().ok_or_else(unclosed)?;
                    at += d.len_utf8();
                    match d {
                        '\\' if c != '`' => escaped = true,
                        d if d == c && !escaped => break,
                        _ => escaped = false,
                    }
                }
                check_escapes(&source[content..at - 1], content)?;
            }
            c if !c.is_ascii() => {
                return Err(format!(
                    "byte {}: the character `{c}` inside the action `{{{{…}}}}` is not supported \
                     outside a quoted string",
                    at - c.len_utf8()
                ));
            }
            _ => {}
        }
    }
}

/// gtmpl unquotes a literal (a raw one too) by byte offsets from its first `\\` on: a
/// non-ASCII character there or a `\\` at the end made it panic, and a `\\x` or `\\u` with
/// too few characters after it made it loop for ever.
fn check_escapes(content: &str, offset: usize) -> Result<(), String> {
    let Some(first) = content.find('\\') else {
        return Ok(());
    };
    let refuse = |what: &str| -> Result<(), String> {
        Err(format!(
            "byte {}: the string `{content}` is not supported: {what}",
            offset + first
        ))
    };
    let tail = &content.as_bytes()[first..];
    if !tail.is_ascii() {
        return refuse("a non-ASCII character after a `\\` escape");
    }
    let mut i = 0;
    while i < tail.len() {
        if tail[i] != b'\\' {
            i += 1;
            continue;
        }
        let needs = match tail.get(i + 1) {
            Some(b'x') => 4,
            Some(b'u') => 6,
            _ => 2,
        };
        if tail.len() - i < needs {
            return refuse(if needs == 2 {
                "a `\\` at the end"
            } else {
                "an escape cut short by the end of the string"
            });
        }
        i += 2;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `foreach_template` fuzz target: a few thousand nested parentheses
    /// overflowed the stack in gtmpl's parser and ended the process.
    #[test]
    fn deep_nesting_is_refused_before_it_overflows_the_stack() {
        let parens = |n: usize| format!("{{{{{}1{}}}}}", "(".repeat(n), ")".repeat(n));
        assert!(parse(&parens(MAX_NESTING)).is_ok());
        let err = parse(&parens(3000)).err().unwrap();
        assert!(err.contains("parentheses"), "{err}");
        let blocks = |n: usize| format!("{}x{}", "{{if 1}}".repeat(n), "{{end}}".repeat(n));
        assert!(parse(&blocks(MAX_NESTING)).is_ok());
        let err = parse(&blocks(3000)).err().unwrap();
        assert!(err.contains("blocks"), "{err}");
        // A named template calling itself recursed until the stack overflowed.
        let err = parse(r#"{{define "a"}}{{template "a"}}{{end}}{{template "a"}}"#)
            .err()
            .unwrap();
        assert!(err.contains("named templates"), "{err}");
        // Parentheses inside a string are text, not nesting.
        assert!(parse(&format!("{{{{\"{}\"}}}}", "(".repeat(3000))).is_ok());
    }

    #[test]
    fn valid_templates_parse() {
        for source in [
            "Ticket {{.id}}: {{.title}}",
            "{{if .urgent}}URGENT {{end}}{{range .tags}}[{{.}}]{{end}}",
            "{{- .a -}} and {{/* a comment with }} inside */}} {{\"}}é\" | printf \"%s\"}}",
            "é {{ .x }} ü",
            "no action at all",
            "{{`raw }} é`}}",
        ] {
            assert!(parse(source).is_ok(), "{source}: {:?}", parse(source).err());
        }
    }

    #[test]
    fn an_action_open_at_the_end_is_refused_instead_of_hanging() {
        // Each of these made gtmpl's lexer send tokens for ever (found by the fuzz target
        // `foreach_template`: `{{}}{ {{and `).
        for source in [
            "{{}}{ {{and ",
            "Summary {{ ",
            "{{ .x",
            "{{1",
            "{{.",
            "{{$",
            "{{ \"}}",
        ] {
            let e = parse(source)
                .err()
                .unwrap_or_else(|| panic!("{source} parsed"));
            assert!(e.contains("is not closed by `}}`"), "{source}: {e}");
        }
    }

    #[test]
    fn non_ascii_where_gtmpl_would_panic_is_refused() {
        for source in ["{{a€}}", "{{ é}}", "{{.名前}}", "é{{- .x}}", "€ \n{{- .x}}"] {
            let e = parse(source)
                .err()
                .unwrap_or_else(|| panic!("{source} parsed"));
            assert!(e.contains("not supported"), "{source}: {e}");
        }
    }

    #[test]
    fn escapes_gtmpl_would_panic_or_loop_on_are_refused() {
        // Found by the fuzz target `foreach_template`: a raw string ending in `\` panicked
        // inside the parser, on the caller's thread.
        for source in [
            "{{` .p}}}} {{.000\\` .p.p}} s",
            "{{`\\`}}",
            "{{\"\\x4\"}}",
            "{{\"\\u12\"}}",
            "{{\"\\né\"}}",
            "{{\"\\x41é\"}}",
        ] {
            let e = parse(source)
                .err()
                .unwrap_or_else(|| panic!("{source} parsed"));
            assert!(e.contains("is not supported"), "{source}: {e}");
        }
        for source in ["{{\"é\\n\"}}", "{{\"\\x41 \\t\"}}", "{{`a\\\\`}}"] {
            assert!(parse(source).is_ok(), "{source}: {:?}", parse(source).err());
        }
    }

    #[test]
    fn gtmpl_reports_its_own_errors() {
        for source in ["{{.x\n}}", "{{/* unclosed", "{{ \"a\nb\" }}", "{{ end }}"] {
            assert!(parse(source).is_err(), "{source}");
        }
    }
}
