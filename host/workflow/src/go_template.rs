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

use gtmpl::{Func, FuncError, Template, Value};

/// The longest template taken, in bytes: a message for each row is instructions, not data,
/// and what rendering costs grows with it.
pub const MAX_TEMPLATE_BYTES: usize = 64 * 1024;

/// How many links a field chain (`.a.b.c`) may have: gtmpl and the filling of missing
/// fields follow a chain by recursion.
pub const MAX_FIELD_CHAIN: usize = 32;

/// The widest width or precision a `printf` verb may ask for (Rust's formatting stops at
/// 65,535 and panics past it; a wide verb repeated costs memory without end).
pub const MAX_PRINTF_WIDTH: usize = 1000;

/// The most bytes a rendered message may be, and a function of a message (`printf`,
/// `print`, `println`, `urlquery`) may return.
pub const MAX_RENDERED_BYTES: usize = 4 * 1024 * 1024;

/// Parses `source` as a Go template; the error is one line. Its functions are gtmpl's,
/// with `printf`, `print`, `println` and `urlquery` bounded ([`MAX_PRINTF_WIDTH`],
/// [`MAX_RENDERED_BYTES`]).
pub fn parse(source: &str) -> Result<Template, String> {
    if source.len() > MAX_TEMPLATE_BYTES {
        return Err(format!(
            "the template is {} bytes; at most {MAX_TEMPLATE_BYTES} are taken",
            source.len()
        ));
    }
    check_lexable(source)?;
    check_nesting(source)?;
    let mut template = Template::default();
    template.add_funcs(&[
        ("printf", printf as Func),
        ("print", print as Func),
        ("println", println as Func),
        ("urlquery", urlquery as Func),
    ]);
    template.parse(source).map_err(|e| e.to_string())?;
    Ok(template)
}

/// What the functions of one rendering may make in all: a value a function returns is kept
/// as long as a variable holds it, so each return is counted against this.
pub const MAX_MADE_BYTES: usize = 4 * MAX_RENDERED_BYTES;

thread_local! {
    /// Bytes the functions of the rendering on this thread made so far ([`render`] resets
    /// it; gtmpl calls the functions on the thread that renders).
    static MADE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Renders `template` with `data`, stopping at [`MAX_RENDERED_BYTES`] of output and at
/// [`MAX_MADE_BYTES`] made by its functions.
pub fn render(template: &Template, data: &gtmpl::Context) -> Result<String, String> {
    MADE.with(|m| m.set(0));
    let mut out = Capped(Vec::new());
    match template.execute(&mut out, data) {
        Ok(()) => String::from_utf8(out.0).map_err(|e| e.to_string()),
        Err(_) if out.0.len() >= MAX_RENDERED_BYTES => Err(format!(
            "it renders to more than {MAX_RENDERED_BYTES} bytes, the most a message may be"
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// Output that refuses to grow past [`MAX_RENDERED_BYTES`].
struct Capped(Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDERED_BYTES {
            self.0.resize(MAX_RENDERED_BYTES, 0);
            return Err(std::io::Error::other("the message is too long"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// gtmpl's builtin function `name`.
fn builtin(name: &str) -> Func {
    gtmpl::funcs::BUILTINS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
        .unwrap_or_else(|| panic!("gtmpl has a builtin {name}"))
}

/// About how many bytes `value` prints as.
fn printed_size(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(printed_size).sum::<usize>() + a.len() + 2,
        Value::Object(o) | Value::Map(o) => {
            o.iter()
                .map(|(k, v)| k.len() + printed_size(v) + 2)
                .sum::<usize>()
                + 2
        }
        _ => 32,
    }
}

/// Calls gtmpl's builtin `name` when what it would make (the arguments' printed size times
/// `times`, plus `extra`) fits in a message and in what the rendering may still make, and
/// counts what it returned.
fn bounded(name: &str, args: &[Value], times: usize, extra: usize) -> Result<Value, FuncError> {
    let would = args
        .iter()
        .map(printed_size)
        .fold(extra, |sum, n| sum.saturating_add(n.saturating_mul(times)));
    let made = MADE.with(std::cell::Cell::get);
    if would > MAX_RENDERED_BYTES {
        return Err(FuncError::Generic(format!(
            "{name} would make about {would} bytes, more than the {MAX_RENDERED_BYTES} a \
             message may be"
        )));
    }
    if made.saturating_add(would) > MAX_MADE_BYTES {
        return Err(FuncError::Generic(format!(
            "{name}: the functions of this message made more than {MAX_MADE_BYTES} bytes, the \
             most one message may make"
        )));
    }
    let value = builtin(name)(args)?;
    let len = match &value {
        Value::String(s) => s.len(),
        _ => 0,
    };
    if len > MAX_RENDERED_BYTES {
        return Err(FuncError::Generic(format!(
            "{name} made {len} bytes, more than the {MAX_RENDERED_BYTES} a message may be"
        )));
    }
    MADE.with(|m| m.set(made.saturating_add(len)));
    Ok(value)
}

fn printf(args: &[Value]) -> Result<Value, FuncError> {
    let mut verbs = 0;
    if let Some(Value::String(format)) = args.first() {
        check_printf_format(format).map_err(FuncError::Generic)?;
        verbs = format.matches('%').count();
    }
    bounded("printf", args, 1, verbs.saturating_mul(MAX_PRINTF_WIDTH))
}

fn print(args: &[Value]) -> Result<Value, FuncError> {
    bounded("print", args, 1, args.len())
}

fn println(args: &[Value]) -> Result<Value, FuncError> {
    bounded("println", args, 1, args.len())
}

/// An escaped byte is three (`%2F`).
fn urlquery(args: &[Value]) -> Result<Value, FuncError> {
    bounded("urlquery", args, 3, args.len())
}

/// Refuses `printf` formats whose verbs take their width or precision from an argument
/// (`%*d`), name arguments by index (`%[1]d`: gtmpl's index arithmetic overflows on
/// `%[0]d`), or ask for a width or precision over [`MAX_PRINTF_WIDTH`].
pub fn check_printf_format(format: &str) -> Result<(), String> {
    let b = format.as_bytes();
    let mut i = 0;
    let number = |i: &mut usize| -> Result<(), String> {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        let digits = &format[start..*i];
        if digits.len() > 4 || digits.parse::<usize>().is_ok_and(|n| n > MAX_PRINTF_WIDTH) {
            return Err(format!(
                "printf: `%{digits}`: a width or precision may be at most {MAX_PRINTF_WIDTH}"
            ));
        }
        Ok(())
    };
    while i < b.len() {
        if b[i] != b'%' {
            i += 1;
            continue;
        }
        i += 1;
        if b.get(i) == Some(&b'%') {
            i += 1;
            continue;
        }
        while i < b.len() && b"+- #0".contains(&b[i]) {
            i += 1;
        }
        number(&mut i)?;
        if b.get(i) == Some(&b'.') {
            i += 1;
            number(&mut i)?;
        }
        match b.get(i) {
            Some(b'*') => {
                return Err(
                    "printf: a width or precision from an argument (`%*`) is not \
                            supported"
                        .to_string(),
                );
            }
            Some(b'[') => {
                return Err("printf: argument indexes (`%[n]`) are not supported".to_string());
            }
            _ => {}
        }
    }
    Ok(())
}

/// How deep parentheses inside an action, and blocks (`if`, `range`, `with` ... `end`), may
/// nest: gtmpl parses both by recursion, and a few thousand levels overflow the stack and end
/// the process.
pub const MAX_NESTING: usize = 100;

/// Refuses templates nesting parentheses or blocks deeper than [`MAX_NESTING`], and named
/// templates (one calling itself recurses until the stack overflows). String and raw-string
/// literals are skipped; the count is an upper bound of what gtmpl recurses on.
pub fn check_nesting(source: &str) -> Result<(), String> {
    // The open blocks, each with how many levels gtmpl recurses for it: one, and one more
    // for each `else if` / `else with` of its chain (parsed as a block inside the else).
    // A `range` inside a `range` is refused: the only collections of a row are the row and
    // the maps of its fields, so one level does all a message needs, and each level more
    // multiplies the work by the number of columns.
    let mut blocks_open: Vec<(usize, bool)> = Vec::new();
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
                if word == "range" && blocks_open.iter().any(|(_, range)| *range) {
                    return Err(
                        "a `range` inside a `range` is not supported in these messages".to_string(),
                    );
                }
                blocks_open.push((1, word == "range"));
                blocks += 1;
                max_blocks = max_blocks.max(blocks);
            }
            "else" => {
                let next = inner["else".len()..].trim_start();
                let chained = ["if", "with"].iter().any(|w| {
                    next.strip_prefix(w)
                        .is_some_and(|r| !r.starts_with(|c: char| c.is_ascii_alphanumeric()))
                });
                if chained && let Some((levels, _)) = blocks_open.last_mut() {
                    *levels += 1;
                    blocks += 1;
                    max_blocks = max_blocks.max(blocks);
                }
            }
            "end" => {
                blocks = blocks.saturating_sub(blocks_open.pop().map_or(0, |(levels, _)| levels))
            }
            _ => {}
        }
        check_printf_literals(&action[..end])?;
        // Links of the field chain being read (`.a.b.c`), outside string literals.
        let mut links = 0usize;
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
                    '.' => {
                        links += 1;
                        if links > MAX_FIELD_CHAIN {
                            return Err(format!(
                                "an action names a field chain of more than {MAX_FIELD_CHAIN} \
                                 links"
                            ));
                        }
                    }
                    c if c.is_ascii_alphanumeric() || c == '_' || c == '$' => {}
                    '"' | '`' | '\'' => {
                        links = 0;
                        quote = Some(c);
                    }
                    '(' => {
                        links = 0;
                        parens += 1;
                        if parens > MAX_NESTING {
                            return Err(format!(
                                "an action nests parentheses more than {MAX_NESTING} deep"
                            ));
                        }
                    }
                    ')' => {
                        links = 0;
                        parens = parens.saturating_sub(1);
                    }
                    _ => links = 0,
                },
            }
        }
        if max_blocks > MAX_NESTING {
            return Err(format!(
                "blocks (if, range, with, and the else if / else with of a chain) nest more \
                 than {MAX_NESTING} deep"
            ));
        }
        rest = &action[end.min(action.len())..];
    }
    Ok(())
}

/// Checks the format of each `printf` of an action given as a string literal
/// ([`check_printf_format`]); a format from a field is checked when it is rendered.
fn check_printf_literals(action: &str) -> Result<(), String> {
    let mut rest = action;
    while let Some(at) = rest.find("printf") {
        let before = rest[..at].chars().next_back();
        let after = rest[at + "printf".len()..].trim_start();
        rest = &rest[at + "printf".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            continue;
        }
        let literal = match after.chars().next() {
            Some('`') => after[1..].split('`').next(),
            Some('"') => after[1..].split('"').next(),
            _ => None,
        };
        if let Some(format) = literal {
            check_printf_format(format)?;
        }
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

    /// Found by attacking the host: each of these overflowed the stack, panicked or made
    /// hundreds of MiB from a small template.
    #[test]
    fn chains_wide_verbs_and_long_output_are_bounded() {
        let chain = |n: usize| format!("{{{{if 0}}}}{}{{{{end}}}}", "{{else if 0}}".repeat(n));
        assert!(parse(&chain(MAX_NESTING - 1)).is_ok());
        let err = parse(&chain(MAX_NESTING)).err().unwrap();
        assert!(err.contains("else if"), "{err}");
        // Chains that end close their levels: many in a row are fine.
        assert!(parse(&chain(10).repeat(50)).is_ok());

        let fields = |n: usize| format!("{{{{{}}}}}", ".a".repeat(n));
        assert!(parse(&fields(MAX_FIELD_CHAIN)).is_ok());
        let err = parse(&fields(MAX_FIELD_CHAIN + 1)).err().unwrap();
        assert!(err.contains("field chain"), "{err}");

        for (format, refused) in [
            ("%1000d", None),
            ("%.1000f|%-08.3f|%%70000d|%v", None),
            ("%1001d", Some("at most 1000")),
            ("%70000d", Some("at most 1000")),
            ("%.99999999999999999999f", Some("at most 1000")),
            ("%*d", Some("`%*`")),
            ("%.*d", Some("`%*`")),
            ("%[0]d", Some("indexes")),
        ] {
            let source = format!("{{{{printf \"{format}\" 1}}}}");
            match (parse(&source), refused) {
                (Ok(_), None) => {}
                (Err(e), Some(want)) => assert!(e.contains(want), "{format}: {e}"),
                (other, want) => panic!("{format}: {:?}, wanted {want:?}", other.err()),
            }
        }
        let err = parse("{{range .}}{{if 1}}{{range .}}{{end}}{{end}}{{end}}")
            .err()
            .unwrap();
        assert!(err.contains("inside a `range`"), "{err}");
        assert!(parse("{{range .}}{{end}}{{range .}}{{range .}}{{end}}").is_err());
        assert!(parse("{{range .}}{{end}}{{range .}}{{end}}").is_ok());
        let err = parse(&"x".repeat(MAX_TEMPLATE_BYTES + 1)).err().unwrap();
        assert!(err.contains("at most 65536"), "{err}");

        // Output stops at the cap, and a format from the data is checked as it renders.
        let t = parse("{{printf \"%900d\" 1}}").unwrap();
        assert_eq!(render(&t, &gtmpl::Context::empty()).unwrap().len(), 900);
        let wide = format!("{{{{$x := printf \"%1000d\" 1}}}}{}", "{{$x}}".repeat(5000));
        let err = render(&parse(&wide).unwrap(), &gtmpl::Context::empty()).unwrap_err();
        assert!(err.contains("more than 4194304 bytes"), "{err}");
        let t = parse("{{printf .}}").unwrap();
        let err = render(&t, &gtmpl::Context::from(gtmpl::Value::from("%70000d"))).unwrap_err();
        assert!(err.contains("at most 1000"), "{err}");

        // A call is refused before it makes what would be too long, and what the calls of one
        // rendering make in all is bounded (variables keep each value alive).
        let a = format!(
            "{{{{$a := printf \"{}\" {}}}}}",
            "%1000d".repeat(1000),
            "1 ".repeat(1000)
        );
        let b = format!("{a}{{{{$b := printf \"%s%s%s%s\" $a $a $a $a}}}}");
        let t = parse(&format!("{b}{{{{print {}}}}}", "$b ".repeat(300))).unwrap();
        let err = render(&t, &gtmpl::Context::empty()).unwrap_err();
        assert!(err.contains("print would make about"), "{err}");
        let many: String = (0..20)
            .map(|i| format!("{{{{$v{i} := print $a $a $a}}}}"))
            .collect();
        let t = parse(&format!("{a}{many}")).unwrap();
        let err = render(&t, &gtmpl::Context::empty()).unwrap_err();
        assert!(err.contains("made more than 16777216 bytes"), "{err}");
        // Another rendering starts afresh.
        assert_eq!(
            render(&parse("{{print 1}}").unwrap(), &gtmpl::Context::empty()).unwrap(),
            "1"
        );
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
