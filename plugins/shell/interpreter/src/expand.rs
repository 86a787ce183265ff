//! Word expansion: parameters, command substitution, arithmetic, tildes, quote removal,
//! field splitting and pathname (glob) expansion, in bash's order.

use brush_parser::word::{
    self, Parameter, ParameterExpr, ParameterTestType, SpecialParameter, WordPiece,
};

use crate::exec::{Halt, parser_options};
use crate::io::{FileKind, Sink, Streams, normalize};
use crate::{Shell, System};

/// How a character of an expanded word came to be, which decides what happens to it next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Unquoted text of the script: globbing applies, splitting does not.
    Literal,
    /// Unquoted result of an expansion: splitting and globbing apply.
    Expanded,
    /// Quoted: taken as it is.
    Quoted,
}

/// One field being built: its characters and their origins.
#[derive(Debug, Default, Clone)]
struct Field {
    chars: Vec<(char, Origin)>,
    /// Something quoted was in it, so it stays even when empty (`""`).
    quoted: bool,
}

impl Field {
    fn push(&mut self, text: &str, origin: Origin) {
        self.chars.extend(text.chars().map(|c| (c, origin)));
        if origin == Origin::Quoted {
            self.quoted = true;
        }
    }

    fn text(&self) -> String {
        self.chars.iter().map(|(c, _)| c).collect()
    }
}

/// Expanded pieces: the fields of `"$@"` break a word into several.
#[derive(Debug, Default)]
struct Fields {
    done: Vec<Field>,
    current: Field,
}

impl Fields {
    fn push(&mut self, text: &str, origin: Origin) {
        self.current.push(text, origin);
    }

    fn break_field(&mut self) {
        let field = std::mem::take(&mut self.current);
        self.done.push(field);
    }

    fn finish(mut self) -> Vec<Field> {
        self.done.push(self.current);
        self.done
    }
}

impl<S: System> Shell<S> {
    /// A word as the arguments of a command get it: zero or more fields.
    pub(crate) fn expand_fields(&mut self, text: &str, io: &Streams) -> Result<Vec<String>, Halt> {
        let pieces = self.parse_word(text)?;
        let mut fields = Fields::default();
        self.pieces(&pieces, false, &mut fields, io)?;
        let ifs = self
            .vars
            .get("IFS")
            .cloned()
            .unwrap_or_else(|| " \t\n".into());
        let mut out = Vec::new();
        for field in fields.finish() {
            for field in split(field, &ifs) {
                self.glob(&field, &mut out)?;
            }
        }
        Ok(out)
    }

    /// A word expanded to one string, unsplit and unglobbed (assignments, redirection
    /// targets, `case` values).
    pub(crate) fn expand_string(&mut self, text: &str, io: &Streams) -> Result<String, Halt> {
        let pieces = self.parse_word(text)?;
        let mut fields = Fields::default();
        self.pieces(&pieces, false, &mut fields, io)?;
        Ok(fields
            .finish()
            .iter()
            .map(Field::text)
            .collect::<Vec<_>>()
            .join(" "))
    }

    /// A word as a pattern (`case`, `${x#...}`): its quoted characters escaped, so they
    /// match only themselves.
    pub(crate) fn expand_pattern(&mut self, text: &str, io: &Streams) -> Result<String, Halt> {
        let pieces = self.parse_word(text)?;
        let mut fields = Fields::default();
        self.pieces(&pieces, false, &mut fields, io)?;
        Ok(fields
            .finish()
            .iter()
            .map(|f| pattern_text(&f.chars))
            .collect::<Vec<_>>()
            .join(" "))
    }

    /// The body of a here-document: parameters, substitutions and arithmetic expanded,
    /// quotes kept as they are.
    pub(crate) fn expand_heredoc(&mut self, text: &str, io: &Streams) -> Result<String, Halt> {
        let pieces = word::parse_heredoc(text, &parser_options())
            .map_err(|e| Halt::Fatal(format!("bad here-document: {e}")))?;
        let mut fields = Fields::default();
        self.pieces(&pieces, true, &mut fields, io)?;
        Ok(fields.finish().iter().map(Field::text).collect())
    }

    fn parse_word(&mut self, text: &str) -> Result<Vec<word::WordPieceWithSource>, Halt> {
        word::parse(text, &parser_options())
            .map_err(|e| Halt::Fatal(format!("bad word {text:?}: {e}")))
    }

    fn pieces(
        &mut self,
        pieces: &[word::WordPieceWithSource],
        quoted: bool,
        fields: &mut Fields,
        io: &Streams,
    ) -> Result<(), Halt> {
        let unquoted = if quoted {
            Origin::Quoted
        } else {
            Origin::Expanded
        };
        for piece in pieces {
            match &piece.piece {
                WordPiece::Text(text) => {
                    fields.push(
                        text,
                        if quoted {
                            Origin::Quoted
                        } else {
                            Origin::Literal
                        },
                    );
                }
                WordPiece::SingleQuotedText(text) => fields.push(text, Origin::Quoted),
                WordPiece::AnsiCQuotedText(text) => fields.push(&ansi_c(text), Origin::Quoted),
                WordPiece::EscapeSequence(text) => {
                    let escaped = text.strip_prefix('\\').unwrap_or(text);
                    if quoted && !matches!(escaped, "$" | "`" | "\"" | "\\" | "\n") {
                        fields.push(text, Origin::Quoted);
                    } else if escaped != "\n" {
                        fields.push(escaped, Origin::Quoted);
                    }
                }
                WordPiece::DoubleQuotedSequence(inner)
                | WordPiece::GettextDoubleQuotedSequence(inner) => {
                    fields.current.quoted = true;
                    self.pieces(inner, true, fields, io)?;
                }
                WordPiece::TildeExpansion(_) => {
                    let home = self.vars.get("HOME").cloned().unwrap_or_else(|| "/".into());
                    fields.push(&home, Origin::Quoted);
                }
                WordPiece::ParameterExpansion(expr) => {
                    if let Some(all) = self.all_positional(expr) {
                        if quoted && !all {
                            // "$@": one field per parameter.
                            let params = self.positional.clone();
                            for (i, param) in params.iter().enumerate() {
                                if i > 0 {
                                    fields.break_field();
                                }
                                fields.push(param, Origin::Quoted);
                            }
                            if params.is_empty() && fields.current.chars.is_empty() {
                                fields.current.quoted = false;
                            }
                        } else {
                            let joiner = if quoted {
                                self.vars
                                    .get("IFS")
                                    .and_then(|ifs| ifs.chars().next())
                                    .map(String::from)
                                    .unwrap_or_default()
                            } else {
                                " ".to_string()
                            };
                            let joined = self.positional.join(&joiner);
                            fields.push(&joined, unquoted);
                        }
                        continue;
                    }
                    let value = self.parameter_expr(expr, io)?;
                    fields.push(&value, unquoted);
                }
                WordPiece::CommandSubstitution(text)
                | WordPiece::BackquotedCommandSubstitution(text) => {
                    let value = self.substitute(text, io)?;
                    fields.push(&value, unquoted);
                }
                WordPiece::ArithmeticExpression(expr) => {
                    let value = self.arithmetic(&expr.value, io)?;
                    fields.push(&value.to_string(), unquoted);
                }
            }
        }
        Ok(())
    }

    /// `Some(concatenate)` when `expr` is `$@` (false) or `$*` (true) by itself.
    fn all_positional(&self, expr: &ParameterExpr) -> Option<bool> {
        match expr {
            ParameterExpr::Parameter {
                parameter:
                    Parameter::Special(SpecialParameter::AllPositionalParameters { concatenate }),
                indirect: false,
            } => Some(*concatenate),
            _ => None,
        }
    }

    /// `$(...)`: the text run in a subshell, its output without its trailing newlines.
    pub(crate) fn substitute(&mut self, text: &str, io: &Streams) -> Result<String, Halt> {
        let out = Sink::new(self.limits.pipe_bytes);
        let streams = Streams {
            stdin: io.stdin.clone(),
            out: out.clone(),
            err: io.err.clone(),
        };
        self.subshell(|sh| sh.run_text(text, &streams))?;
        self.substituted = Some(self.status);
        let (data, dropped) = out.take();
        if dropped > 0 {
            return Err(Halt::Fatal(format!(
                "stopped: a command substitution gave more than the {} bytes one may",
                self.limits.pipe_bytes
            )));
        }
        let mut value = String::from_utf8_lossy(&data).into_owned();
        while value.ends_with('\n') {
            value.pop();
        }
        Ok(value)
    }

    /// The value of a parameter, `None` when unset.
    fn parameter(&mut self, parameter: &Parameter, indirect: bool) -> Result<Option<String>, Halt> {
        let value = match parameter {
            Parameter::Positional(0) => Some("bash".to_string()),
            Parameter::Positional(n) => self.positional.get(*n as usize - 1).cloned(),
            Parameter::Special(special) => Some(match special {
                SpecialParameter::AllPositionalParameters { .. } => self.positional.join(" "),
                SpecialParameter::PositionalParameterCount => self.positional.len().to_string(),
                SpecialParameter::LastExitStatus => self.status.to_string(),
                SpecialParameter::CurrentOptionFlags => String::new(),
                SpecialParameter::ProcessId => "1".to_string(),
                SpecialParameter::LastBackgroundProcessId => String::new(),
                SpecialParameter::ShellName => "bash".to_string(),
            }),
            Parameter::Named(name) => self.vars.get(name).cloned(),
            Parameter::NamedWithIndex { .. } | Parameter::NamedWithAllIndices { .. } => {
                return Err(Halt::Fatal("arrays are not supported".into()));
            }
        };
        if indirect {
            return match value {
                Some(name) => Ok(self.vars.get(&name).cloned()),
                None => Ok(None),
            };
        }
        Ok(value)
    }

    fn parameter_expr(&mut self, expr: &ParameterExpr, io: &Streams) -> Result<String, Halt> {
        let missing = |value: &Option<String>, test: &ParameterTestType| match test {
            ParameterTestType::UnsetOrNull => value.as_deref().is_none_or(str::is_empty),
            ParameterTestType::Unset => value.is_none(),
        };
        Ok(match expr {
            ParameterExpr::Parameter {
                parameter,
                indirect,
            } => {
                let value = self.parameter(parameter, *indirect)?;
                if value.is_none() && self.options.nounset {
                    return Err(Halt::Fatal(format!("{parameter}: unbound variable")));
                }
                value.unwrap_or_default()
            }
            ParameterExpr::UseDefaultValues {
                parameter,
                indirect,
                test_type,
                default_value,
            } => {
                let value = self.parameter(parameter, *indirect)?;
                if missing(&value, test_type) {
                    self.expand_string(default_value.as_deref().unwrap_or(""), io)?
                } else {
                    value.unwrap_or_default()
                }
            }
            ParameterExpr::AssignDefaultValues {
                parameter,
                indirect,
                test_type,
                default_value,
            } => {
                let value = self.parameter(parameter, *indirect)?;
                if missing(&value, test_type) {
                    let value = self.expand_string(default_value.as_deref().unwrap_or(""), io)?;
                    let Parameter::Named(name) = parameter else {
                        return Err(Halt::Fatal(format!(
                            "{parameter}: cannot assign in this way"
                        )));
                    };
                    self.set_var(name, value.clone())?;
                    value
                } else {
                    value.unwrap_or_default()
                }
            }
            ParameterExpr::IndicateErrorIfNullOrUnset {
                parameter,
                indirect,
                test_type,
                error_message,
            } => {
                let value = self.parameter(parameter, *indirect)?;
                if missing(&value, test_type) {
                    let message = match error_message {
                        Some(text) => self.expand_string(text, io)?,
                        None => "parameter null or not set".into(),
                    };
                    io.err
                        .write_str(&format!("shell: {parameter}: {message}\n"));
                    self.status = 1;
                    return Err(crate::exec::Halt::Exit);
                }
                value.unwrap_or_default()
            }
            ParameterExpr::UseAlternativeValue {
                parameter,
                indirect,
                test_type,
                alternative_value,
            } => {
                let value = self.parameter(parameter, *indirect)?;
                if missing(&value, test_type) {
                    String::new()
                } else {
                    self.expand_string(alternative_value.as_deref().unwrap_or(""), io)?
                }
            }
            ParameterExpr::ParameterLength {
                parameter,
                indirect,
            } => {
                let value = self.parameter(parameter, *indirect)?;
                value.unwrap_or_default().chars().count().to_string()
            }
            ParameterExpr::RemoveSmallestSuffixPattern {
                parameter,
                indirect,
                pattern,
            }
            | ParameterExpr::RemoveLargestSuffixPattern {
                parameter,
                indirect,
                pattern,
            }
            | ParameterExpr::RemoveSmallestPrefixPattern {
                parameter,
                indirect,
                pattern,
            }
            | ParameterExpr::RemoveLargestPrefixPattern {
                parameter,
                indirect,
                pattern,
            } => {
                let value = self.parameter(parameter, *indirect)?.unwrap_or_default();
                let pattern = self.expand_pattern(pattern.as_deref().unwrap_or(""), io)?;
                let regex = pattern_regex(&pattern)?;
                let prefix = matches!(
                    expr,
                    ParameterExpr::RemoveSmallestPrefixPattern { .. }
                        | ParameterExpr::RemoveLargestPrefixPattern { .. }
                );
                let largest = matches!(
                    expr,
                    ParameterExpr::RemoveLargestSuffixPattern { .. }
                        | ParameterExpr::RemoveLargestPrefixPattern { .. }
                );
                let mut cuts: Vec<usize> = value
                    .char_indices()
                    .map(|(i, _)| i)
                    .chain([value.len()])
                    .collect();
                // Prefixes from the shortest, suffixes from the shortest (the latest start).
                if prefix == largest {
                    cuts.reverse();
                }
                let mut result = value.clone();
                for cut in cuts {
                    self.step()?;
                    let (piece, rest) = if prefix {
                        (&value[..cut], &value[cut..])
                    } else {
                        (&value[cut..], &value[..cut])
                    };
                    if regex.is_match(piece) {
                        result = rest.to_string();
                        break;
                    }
                }
                result
            }
            ParameterExpr::Substring {
                parameter,
                indirect,
                offset,
                length,
            } => {
                let value = self.parameter(parameter, *indirect)?.unwrap_or_default();
                let chars: Vec<char> = value.chars().collect();
                let count = chars.len() as i64;
                let mut start = self.arithmetic(&offset.value, io)?;
                if start < 0 {
                    start = (count + start).max(0);
                }
                let start = start.min(count);
                let end = match length {
                    Some(length) => {
                        let length = self.arithmetic(&length.value, io)?;
                        if length < 0 {
                            (count + length).max(start)
                        } else {
                            start.saturating_add(length).min(count)
                        }
                    }
                    None => count,
                };
                chars[start as usize..end as usize].iter().collect()
            }
            ParameterExpr::UppercaseFirstChar {
                parameter,
                indirect,
                ..
            }
            | ParameterExpr::UppercasePattern {
                parameter,
                indirect,
                ..
            }
            | ParameterExpr::LowercaseFirstChar {
                parameter,
                indirect,
                ..
            }
            | ParameterExpr::LowercasePattern {
                parameter,
                indirect,
                ..
            } => {
                let value = self.parameter(parameter, *indirect)?.unwrap_or_default();
                let upper = matches!(
                    expr,
                    ParameterExpr::UppercaseFirstChar { .. }
                        | ParameterExpr::UppercasePattern { .. }
                );
                let first_only = matches!(
                    expr,
                    ParameterExpr::UppercaseFirstChar { .. }
                        | ParameterExpr::LowercaseFirstChar { .. }
                );
                let change = |c: char| -> String {
                    if upper {
                        c.to_uppercase().collect()
                    } else {
                        c.to_lowercase().collect()
                    }
                };
                if first_only {
                    let mut chars = value.chars();
                    match chars.next() {
                        Some(c) => change(c) + chars.as_str(),
                        None => String::new(),
                    }
                } else {
                    value.chars().map(change).collect()
                }
            }
            ParameterExpr::ReplaceSubstring {
                parameter,
                indirect,
                pattern,
                replacement,
                match_kind,
            } => {
                let value = self.parameter(parameter, *indirect)?.unwrap_or_default();
                let all = pattern.starts_with('/');
                let pattern =
                    self.expand_pattern(pattern.strip_prefix('/').unwrap_or(pattern), io)?;
                let replacement = self.expand_string(replacement.as_deref().unwrap_or(""), io)?;
                let body = brush_parser::pattern::pattern_to_regex_str(&pattern, false)
                    .map_err(|e| Halt::Fatal(format!("bad pattern {pattern:?}: {e}")))?;
                let anchored = match match_kind {
                    word::SubstringMatchKind::Prefix => format!("^(?:{body})"),
                    word::SubstringMatchKind::Suffix => format!("(?:{body})$"),
                    _ => format!("(?:{body})"),
                };
                let regex = build_regex(&anchored)?;
                if all {
                    regex
                        .replace_all(&value, regex::NoExpand(&replacement))
                        .into_owned()
                } else {
                    regex
                        .replace(&value, regex::NoExpand(&replacement))
                        .into_owned()
                }
            }
            ParameterExpr::VariableNames {
                prefix,
                concatenate: _,
            } => {
                let mut names: Vec<&String> = self
                    .vars
                    .keys()
                    .filter(|n| n.starts_with(prefix.as_str()))
                    .collect();
                names.sort();
                names
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            }
            ParameterExpr::Transform { .. } | ParameterExpr::MemberKeys { .. } => {
                return Err(Halt::Fatal(format!(
                    "{expr:?}: this expansion is not supported"
                )));
            }
        })
    }

    /// Adds a field's names to `out`: its glob matches, sorted, or the field itself when
    /// it has no unquoted glob character or matches nothing.
    fn glob(&mut self, field: &Field, out: &mut Vec<String>) -> Result<(), Halt> {
        let text = field.text();
        let globbing = field
            .chars
            .iter()
            .any(|(c, o)| *o != Origin::Quoted && matches!(c, '*' | '?' | '['));
        if !globbing {
            out.push(text);
            return Ok(());
        }
        let pattern = pattern_text(&field.chars);
        let absolute = pattern.starts_with('/');
        let mut found: Vec<String> = vec![if absolute { "/".into() } else { String::new() }];
        for part in pattern.split('/').filter(|p| !p.is_empty()) {
            let has_glob = brush_parser::pattern::pattern_has_glob_metacharacters(part, false);
            let mut next = Vec::new();
            for base in &found {
                self.step()?;
                if !has_glob {
                    let literal = unescape(part);
                    let path = join(base, &literal);
                    if self.sys.kind(&normalize(&self.cwd, &path)).is_some() {
                        next.push(path);
                    }
                    continue;
                }
                let dir = normalize(&self.cwd, if base.is_empty() { "." } else { base });
                if self.sys.kind(&dir) != Some(FileKind::Dir) {
                    continue;
                }
                let regex = pattern_regex(part)?;
                let mut names = self.sys.read_dir(&dir).unwrap_or_default();
                names.sort();
                for name in names {
                    self.step()?;
                    if name.starts_with('.') && !part.starts_with('.') {
                        continue;
                    }
                    if regex.is_match(&name) {
                        next.push(join(base, &name));
                    }
                }
            }
            found = next;
        }
        if found.is_empty() || (found.len() == 1 && (found[0].is_empty() || found[0] == "/")) {
            out.push(text);
        } else {
            out.extend(found);
        }
        Ok(())
    }
}

fn join(base: &str, name: &str) -> String {
    match base {
        "" => name.to_string(),
        "/" => format!("/{name}"),
        _ => format!("{base}/{name}"),
    }
}

/// A field's text as a pattern: quoted characters escaped.
fn pattern_text(chars: &[(char, Origin)]) -> String {
    let mut out = String::new();
    for (c, origin) in chars {
        if *origin == Origin::Quoted && matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(*c);
    }
    out
}

/// A pattern's backslash escapes removed.
fn unescape(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Splits a field on `ifs` where its characters came from unquoted expansions.
fn split(field: Field, ifs: &str) -> Vec<Field> {
    if ifs.is_empty() || !field.chars.iter().any(|(_, o)| *o == Origin::Expanded) {
        return if field.chars.is_empty() && !field.quoted {
            Vec::new()
        } else {
            vec![field]
        };
    }
    let mut out = Vec::new();
    let mut current = Field {
        chars: Vec::new(),
        quoted: false,
    };
    let mut pending = false;
    for (c, origin) in field.chars {
        if origin == Origin::Expanded && ifs.contains(c) {
            // A field ends at a separator; two non-blank separators in a row (`a::b` with
            // IFS=:) make an empty field between them.
            if !current.chars.is_empty() || current.quoted || (!c.is_whitespace() && pending) {
                out.push(std::mem::take(&mut current));
            }
            pending = !c.is_whitespace();
            continue;
        }
        pending = false;
        current.chars.push((c, origin));
        if origin == Origin::Quoted {
            current.quoted = true;
        }
    }
    if !current.chars.is_empty() || current.quoted {
        out.push(current);
    }
    out
}

/// `$'...'` text with its escapes made characters.
fn ansi_c(text: &str) -> String {
    decode_escapes(text, true).0
}

/// Backslash escapes made characters: those of `$'...'` (`ansi`: octal as `\nnn`, `\'`,
/// `\"` and `\?` as themselves), or those of `echo -e` and `printf %b` (octal as `\0nnn`,
/// `\c` ends the text, which the second value says). An unknown escape stays as written.
pub(crate) fn decode_escapes(text: &str, ansi: bool) -> (String, bool) {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    /// A number of at most `most` digits in `radix`, `first` its first, as a character.
    fn digits(
        chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
        first: Option<char>,
        most: usize,
        radix: u32,
    ) -> Option<char> {
        let mut number: String = first.into_iter().collect();
        while number.len() < most && chars.peek().is_some_and(|c| c.is_digit(radix)) {
            number.extend(chars.next());
        }
        u32::from_str_radix(if number.is_empty() { "0" } else { &number }, radix)
            .ok()
            .and_then(char::from_u32)
    }
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some('a') => out.push('\x07'),
            Some('b') => out.push('\x08'),
            Some('e' | 'E') => out.push('\x1b'),
            Some('f') => out.push('\x0c'),
            Some('v') => out.push('\x0b'),
            Some('c') if !ansi => return (out, true),
            Some(q @ ('\'' | '"' | '?')) if ansi => out.push(q),
            Some('0') if !ansi => out.extend(digits(&mut chars, None, 3, 8)),
            Some(d @ '0'..='7') if ansi => out.extend(digits(&mut chars, Some(d), 3, 8)),
            Some('x') => {
                if chars.peek().is_some_and(char::is_ascii_hexdigit) {
                    out.extend(digits(&mut chars, None, 2, 16));
                } else {
                    out.push_str("\\x");
                }
            }
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    (out, false)
}

fn build_regex(text: &str) -> Result<regex::Regex, Halt> {
    regex::RegexBuilder::new(text)
        .size_limit(1 << 20)
        .dfa_size_limit(1 << 20)
        .build()
        .map_err(|e| Halt::Fatal(format!("the pattern cannot be used: {e}")))
}

/// A shell pattern as a regex matching whole strings.
pub(crate) fn pattern_regex(pattern: &str) -> Result<regex::Regex, Halt> {
    let body = brush_parser::pattern::pattern_to_regex_str(pattern, false)
        .map_err(|e| Halt::Fatal(format!("bad pattern {pattern:?}: {e}")))?;
    build_regex(&format!("^(?s:{body})$"))
}

/// Whether `value` matches the shell pattern `pattern` whole.
pub(crate) fn pattern_matches(pattern: &str, value: &str) -> Result<bool, Halt> {
    Ok(pattern_regex(pattern)?.is_match(value))
}
