//! `grep`: GNU-compatible line search on the `regex` crate (byte lines, so invalid UTF-8
//! never fails).
//!
//! Supports `-e`/`-f` patterns, `-G` (BRE, translated), `-E`, `-F`, `-P` (taken as the
//! `regex` crate's syntax), `-i -v -w -x -o -n -c -l -L -q -s -H -h -m -A -B -C -NUM`,
//! `-r`/`-R`, `--include`, `--exclude`, `--exclude-dir`, `-I`, `-a`, `--binary-files`,
//! `--color` (ignored), combined short flags, options after operands (as GNU permutes) and
//! `--`. A binary file (NUL in its first 8 KiB) that matches is reported as GNU 3.8 does,
//! `grep: FILE: binary file matches` on stderr.
//!
//! Left out: back-references (`\1`: the `regex` crate has none), `-z`, `-Z`, `-b`, `-T`,
//! `--label`, `--line-buffered`, abbreviated long options, and colour. `-R` does not follow
//! symbolic links found while recursing (like `-r`); links named as operands are followed.
//! `\d` is taken as a digit class, which GNU's BRE/ERE do not do.

use globset::{Glob, GlobSet, GlobSetBuilder};
use regex::bytes::{Regex, RegexBuilder};
use std::ffi::OsString;
use std::io::{self, BufWriter, Read, Write};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Syntax {
    #[default]
    Basic,
    Extended,
    Fixed,
}

/// Parsed command line.
#[derive(Debug, Default)]
struct Opts {
    patterns: Vec<String>,
    syntax: Syntax,
    ignore_case: bool,
    invert: bool,
    line_number: bool,
    list: bool,
    list_missing: bool,
    count: bool,
    word: bool,
    whole_line: bool,
    only: bool,
    with_filename: Option<bool>,
    quiet: bool,
    silent: bool,
    max_count: Option<u64>,
    after: usize,
    before: usize,
    recursive: bool,
    skip_binary: bool,
    text: bool,
    include: Vec<String>,
    exclude: Vec<String>,
    exclude_dir: Vec<String>,
    files: Vec<String>,
}

fn num<T: std::str::FromStr>(opt: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("invalid {opt} argument '{v}'"))
}

/// Parses `args` (without the command name).
fn parse_args(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts::default();
    let mut explicit = false;
    let mut operands = Vec::new();
    let mut it = args.iter();
    let mut value = |o: &mut Opts, name: &str, v: String| -> Result<(), String> {
        match name {
            "e" | "regexp" => o.patterns.push(v),
            "f" | "file" => {
                let text = std::fs::read_to_string(&v)
                    .map_err(|e| format!("{v}: {}", crate::io_msg(&e)))?;
                o.patterns.extend(text.lines().map(str::to_string));
            }
            "m" | "max-count" => o.max_count = Some(num("max count", &v)?),
            "A" | "after-context" => o.after = num("context length", &v)?,
            "B" | "before-context" => o.before = num("context length", &v)?,
            "C" | "context" => {
                (o.after, o.before) = (num("context length", &v)?, num("context length", &v)?)
            }
            "include" => o.include.push(v),
            "exclude" => o.exclude.push(v),
            "exclude-dir" => o.exclude_dir.push(v),
            "binary-files" => match v.as_str() {
                "without-match" => o.skip_binary = true,
                "text" => o.text = true,
                "binary" => {}
                _ => return Err(format!("invalid argument '{v}' for '--binary-files'")),
            },
            _ => {}
        }
        if matches!(name, "e" | "regexp" | "f" | "file") {
            explicit = true;
        }
        Ok(())
    };
    while let Some(arg) = it.next() {
        if arg == "--" {
            operands.extend(it.by_ref().cloned());
            break;
        } else if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let flag = |o: &mut Opts| -> bool {
                match name {
                    "recursive" | "dereference-recursive" => o.recursive = true,
                    "line-number" => o.line_number = true,
                    "ignore-case" => o.ignore_case = true,
                    "no-ignore-case" => o.ignore_case = false,
                    "invert-match" => o.invert = true,
                    "files-with-matches" => o.list = true,
                    "files-without-match" => o.list_missing = true,
                    "count" => o.count = true,
                    "extended-regexp" | "perl-regexp" => o.syntax = Syntax::Extended,
                    "fixed-strings" => o.syntax = Syntax::Fixed,
                    "basic-regexp" => o.syntax = Syntax::Basic,
                    "word-regexp" => o.word = true,
                    "line-regexp" => o.whole_line = true,
                    "only-matching" => o.only = true,
                    "with-filename" => o.with_filename = Some(true),
                    "no-filename" => o.with_filename = Some(false),
                    "quiet" | "silent" => o.quiet = true,
                    "no-messages" => o.silent = true,
                    "text" => o.text = true,
                    "color" | "colour" | "no-color" => {}
                    _ => return false,
                }
                true
            };
            if inline.is_none() && flag(&mut o) {
                continue;
            }
            if matches!(name, "color" | "colour") {
                continue;
            }
            let takes = [
                "regexp",
                "file",
                "max-count",
                "after-context",
                "before-context",
                "context",
            ];
            let takes_eq = ["include", "exclude", "exclude-dir", "binary-files"];
            if !takes.contains(&name) && !takes_eq.contains(&name) {
                return Err(format!("unrecognized option '{arg}'"));
            }
            let v = match inline {
                Some(v) => v,
                None => it
                    .next()
                    .cloned()
                    .ok_or(format!("option '--{name}' requires an argument"))?,
            };
            value(&mut o, name, v)?;
        } else if arg.len() > 1 && arg.starts_with('-') {
            let chars: Vec<char> = arg[1..].chars().collect();
            let mut i = 0;
            while i < chars.len() {
                let c = chars[i];
                i += 1;
                match c {
                    'r' | 'R' => o.recursive = true,
                    'n' => o.line_number = true,
                    'i' | 'y' => o.ignore_case = true,
                    'v' => o.invert = true,
                    'l' => o.list = true,
                    'L' => o.list_missing = true,
                    'c' => o.count = true,
                    'E' | 'P' => o.syntax = Syntax::Extended,
                    'F' => o.syntax = Syntax::Fixed,
                    'G' => o.syntax = Syntax::Basic,
                    'w' => o.word = true,
                    'x' => o.whole_line = true,
                    'o' => o.only = true,
                    'H' => o.with_filename = Some(true),
                    'h' => o.with_filename = Some(false),
                    'q' => o.quiet = true,
                    's' => o.silent = true,
                    'I' => o.skip_binary = true,
                    'a' => o.text = true,
                    'U' => {}
                    '0'..='9' => {
                        let start = i - 1;
                        while i < chars.len() && chars[i].is_ascii_digit() {
                            i += 1;
                        }
                        let n: String = chars[start..i].iter().collect();
                        value(&mut o, "C", n)?;
                    }
                    'e' | 'f' | 'm' | 'A' | 'B' | 'C' => {
                        let rest: String = chars[i..].iter().collect();
                        let v = if rest.is_empty() {
                            it.next()
                                .cloned()
                                .ok_or(format!("option requires an argument -- '{c}'"))?
                        } else {
                            rest
                        };
                        value(&mut o, &c.to_string(), v)?;
                        break;
                    }
                    _ => return Err(format!("invalid option -- '{c}'")),
                }
            }
        } else {
            operands.push(arg.clone());
        }
    }
    let mut operands = operands.into_iter();
    if !explicit {
        o.patterns.push(operands.next().ok_or("no pattern given")?);
    }
    o.files = operands.collect();
    Ok(o)
}

/// Translates a POSIX BRE (`basic`) or ERE into the `regex` crate's syntax.
fn translate(p: &str, basic: bool) -> Result<String, String> {
    let c: Vec<char> = p.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    let mut at_start = true;
    let lit = |out: &mut String, ch: char| out.push_str(&regex::escape(&ch.to_string()));
    while i < c.len() {
        let ch = c[i];
        let start = std::mem::replace(&mut at_start, false);
        i += 1;
        match ch {
            '\\' => {
                let n = *c.get(i).ok_or("trailing backslash (\\)")?;
                i += 1;
                match n {
                    '{' if basic => i = interval(&c, i, true, &mut out)?,
                    '(' | '|' if basic => {
                        out.push_str(if n == '(' { "(?:" } else { "|" });
                        at_start = true;
                    }
                    ')' | '}' | '+' | '?' if basic => out.push(n),
                    '1'..='9' => return Err("back-references are not supported".into()),
                    'w' | 'W' | 's' | 'S' | 'b' | 'B' | '<' | '>' => {
                        out.push('\\');
                        out.push(n);
                    }
                    'd' => out.push_str("[0-9]"),
                    'D' => out.push_str("[^0-9]"),
                    '`' => out.push_str(r"\A"),
                    '\'' => out.push_str(r"\z"),
                    _ => lit(&mut out, n),
                }
            }
            '[' => i = bracket(&c, i, &mut out)?,
            '*' if start => out.push_str(r"\*"),
            '^' if basic && !start => out.push_str(r"\^"),
            '^' => {
                out.push('^');
                at_start = true;
            }
            '$' if basic
                && !(i == c.len()
                    || c.get(i) == Some(&'\\') && matches!(c.get(i + 1), Some(')' | '|'))) =>
            {
                out.push_str(r"\$")
            }
            '(' | ')' | '|' | '+' | '?' | '{' | '}' if basic => lit(&mut out, ch),
            '(' => {
                out.push_str("(?:");
                at_start = true;
            }
            '|' => {
                out.push('|');
                at_start = true;
            }
            '+' | '?' if start => lit(&mut out, ch),
            '{' if !start && interval(&c, i, false, &mut String::new()).is_ok() => {
                i = interval(&c, i, false, &mut out)?
            }
            '{' | '}' => lit(&mut out, ch),
            _ => out.push(ch),
        }
    }
    Ok(out)
}

/// Copies the interval `{m,n}` whose body starts at `c[i]` (closed by `\}` in a BRE); the
/// index after it.
fn interval(c: &[char], mut i: usize, basic: bool, out: &mut String) -> Result<usize, String> {
    let mut body = String::new();
    while let Some(&ch) = c.get(i) {
        if ch.is_ascii_digit() || ch == ',' {
            body.push(ch);
            i += 1;
        } else {
            break;
        }
    }
    let close = if basic {
        c.get(i) == Some(&'\\') && c.get(i + 1) == Some(&'}')
    } else {
        c.get(i) == Some(&'}')
    };
    if !close || body.is_empty() || body.matches(',').count() > 1 {
        return Err(if basic {
            "Unmatched \\{"
        } else {
            "Invalid content of \\{\\}"
        }
        .into());
    }
    if body.starts_with(',') {
        body.insert(0, '0');
    }
    out.push('{');
    out.push_str(&body);
    out.push('}');
    Ok(i + if basic { 2 } else { 1 })
}

/// Copies the POSIX bracket expression whose body starts at `c[i]`; the index after it.
fn bracket(c: &[char], mut i: usize, out: &mut String) -> Result<usize, String> {
    let mut s = String::from("[");
    if c.get(i) == Some(&'^') {
        s.push('^');
        i += 1;
    }
    let mut first = true;
    loop {
        let ch = *c.get(i).ok_or("Unmatched [, [^, [:, [., or [=")?;
        match ch {
            ']' if !first => {
                out.push_str(&s);
                out.push(']');
                return Ok(i + 1);
            }
            '[' if matches!(c.get(i + 1), Some(':' | '=' | '.')) => {
                let kind = c[i + 1];
                let end = (i + 2..c.len().saturating_sub(1))
                    .find(|&j| c[j] == kind && c[j + 1] == ']')
                    .ok_or("Unmatched [, [^, [:, [., or [=")?;
                if kind == ':' {
                    s.extend(&c[i..end + 2]);
                } else {
                    for x in &c[i + 2..end] {
                        s.push('\\');
                        s.push(*x);
                    }
                }
                i = end + 2;
            }
            '\\' | '[' | ']' | '&' | '~' => {
                s.push('\\');
                s.push(ch);
                i += 1;
            }
            _ => {
                s.push(ch);
                i += 1;
            }
        }
        first = false;
    }
}

/// The regex selecting lines for `o`; `None` when there is no pattern at all.
fn build_regex(o: &Opts) -> Result<Option<Regex>, String> {
    let mut parts = Vec::new();
    for p in o.patterns.iter().flat_map(|p| p.split('\n')) {
        parts.push(match o.syntax {
            Syntax::Fixed => regex::escape(p),
            Syntax::Basic => translate(p, true)?,
            Syntax::Extended => translate(p, false)?,
        });
    }
    if parts.is_empty() {
        return Ok(None);
    }
    let mut re = parts
        .iter()
        .map(|p| format!("(?:{p})"))
        .collect::<Vec<_>>()
        .join("|");
    if o.whole_line {
        re = format!("^(?:{re})$");
    } else if o.word {
        re = format!(r"\b{{start-half}}(?:{re})\b{{end-half}}");
    }
    let built = RegexBuilder::new(&re)
        .case_insensitive(o.ignore_case)
        .size_limit(1 << 28)
        .build();
    built.map(Some).map_err(|e| e.to_string())
}

fn globs(list: &[String]) -> Result<Option<GlobSet>, String> {
    if list.is_empty() {
        return Ok(None);
    }
    let mut b = GlobSetBuilder::new();
    for g in list {
        b.add(Glob::new(g).map_err(|e| e.to_string())?);
    }
    b.build().map(Some).map_err(|e| e.to_string())
}

/// A search over files, writing to `out` and `err`.
struct Grep<'a> {
    o: &'a Opts,
    re: Option<Regex>,
    include: Option<GlobSet>,
    exclude: Option<GlobSet>,
    exclude_dir: Option<GlobSet>,
    out: &'a mut dyn Write,
    err: &'a mut dyn Write,
    selected: bool,
    error: bool,
    done: bool,
    grouped: bool,
}

impl Grep<'_> {
    fn fail(&mut self, path: &str, msg: &str) {
        self.error = true;
        if !self.o.silent {
            let _ = writeln!(self.err, "grep: {path}: {msg}");
        }
    }

    fn search(
        &mut self,
        path: &str,
        top: bool,
        implicit: bool,
        stdin: &mut dyn Read,
    ) -> io::Result<()> {
        if self.done {
            return Ok(());
        }
        let many = self.o.files.len() > 1;
        if top && path == "-" {
            let mut data = Vec::new();
            if let Err(e) = stdin.read_to_end(&mut data) {
                self.fail("(standard input)", &crate::io_msg(&e));
                return Ok(());
            }
            let show = self.o.with_filename.unwrap_or(many);
            return self.grep_data("(standard input)", show, &data);
        }
        let meta = if top {
            std::fs::metadata(path)
        } else {
            std::fs::symlink_metadata(path)
        };
        let meta = match meta {
            Ok(m) => m,
            Err(e) => {
                self.fail(path, &crate::io_msg(&e));
                return Ok(());
            }
        };
        let base = path
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or(path);
        if meta.is_dir() {
            if !self.o.recursive {
                self.fail(path, "Is a directory");
                return Ok(());
            }
            if !implicit && self.exclude_dir.as_ref().is_some_and(|g| g.is_match(base)) {
                return Ok(());
            }
            let mut names: Vec<String> = match std::fs::read_dir(path) {
                Ok(rd) => rd
                    .filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect(),
                Err(e) => {
                    self.fail(path, &crate::io_msg(&e));
                    return Ok(());
                }
            };
            names.sort();
            for name in names {
                let child = match path {
                    "." if implicit => name,
                    p if p.ends_with('/') => format!("{p}{name}"),
                    p => format!("{p}/{name}"),
                };
                self.search(&child, false, false, stdin)?;
            }
            return Ok(());
        }
        if meta.file_type().is_symlink() {
            return Ok(());
        }
        if self.include.as_ref().is_some_and(|g| !g.is_match(base))
            || self.exclude.as_ref().is_some_and(|g| g.is_match(base))
        {
            return Ok(());
        }
        match std::fs::read(path) {
            Ok(data) => self.grep_data(path, self.o.with_filename.unwrap_or(many || !top), &data),
            Err(e) => {
                self.fail(path, &crate::io_msg(&e));
                Ok(())
            }
        }
    }

    fn line(&mut self, name: &str, show: bool, n: usize, sep: char, text: &[u8]) -> io::Result<()> {
        if show {
            write!(self.out, "{name}{sep}")?;
        }
        if self.o.line_number {
            write!(self.out, "{}{sep}", n + 1)?;
        }
        self.out.write_all(text)?;
        self.out.write_all(b"\n")
    }

    /// Searches the contents `data` of the file `name`.
    fn grep_data(&mut self, name: &str, show: bool, data: &[u8]) -> io::Result<()> {
        let o = self.o;
        let binary = !o.text && data[..data.len().min(8192)].contains(&0);
        if binary && o.skip_binary {
            return Ok(());
        }
        let body = data.strip_suffix(b"\n").unwrap_or(data);
        let lines: Vec<&[u8]> = if data.is_empty() {
            Vec::new()
        } else {
            body.split(|&b| b == b'\n').collect()
        };
        let silent = o.quiet || o.list || o.list_missing || o.count || binary;
        let ctx = !silent && !o.only && (o.after > 0 || o.before > 0);
        let (mut count, mut last, mut after_left) = (0u64, None::<usize>, 0usize);
        for (i, text) in lines.iter().enumerate() {
            if o.max_count.is_some_and(|m| count >= m) {
                if after_left == 0 || !ctx {
                    break;
                }
                self.line(name, show, i, '-', text)?;
                after_left -= 1;
                continue;
            }
            let matched = self.re.as_ref().is_some_and(|r| r.is_match(text));
            if matched == o.invert {
                if ctx && after_left > 0 {
                    self.line(name, show, i, '-', text)?;
                    last = Some(i);
                    after_left -= 1;
                }
                continue;
            }
            count += 1;
            self.selected = true;
            if o.quiet {
                self.done = true;
                return Ok(());
            }
            if silent {
                if o.list || o.list_missing || (binary && !o.count) {
                    break;
                }
                continue;
            }
            if ctx {
                let from = i.saturating_sub(o.before).max(last.map_or(0, |l| l + 1));
                if self.grouped && last.is_none_or(|l| from > l + 1) {
                    writeln!(self.out, "--")?;
                }
                for (j, t) in lines.iter().enumerate().take(i).skip(from) {
                    self.line(name, show, j, '-', t)?;
                }
                self.grouped = true;
                last = Some(i);
                after_left = o.after;
            }
            if !o.only {
                self.line(name, show, i, ':', text)?;
            } else if let Some(re) = self.re.as_ref().filter(|_| !o.invert) {
                let found: Vec<_> = re
                    .find_iter(text)
                    .filter(|m| !m.is_empty())
                    .map(|m| m.range())
                    .collect();
                for r in found {
                    self.line(name, show, i, ':', &text[r])?;
                }
            }
        }
        if o.count {
            if show {
                write!(self.out, "{name}:")?;
            }
            writeln!(self.out, "{count}")?;
        }
        if (o.list && count > 0) || (o.list_missing && count == 0) {
            writeln!(self.out, "{name}")?;
        } else if binary && count > 0 && !o.count && !o.list_missing {
            self.out.flush()?;
            let _ = writeln!(self.err, "grep: {name}: binary file matches");
        }
        Ok(())
    }
}

/// Runs grep for the parsed `o`; its exit status.
fn run(o: &Opts, stdin: &mut dyn Read, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let built = (|| {
        Ok::<_, String>((
            build_regex(o)?,
            globs(&o.include)?,
            globs(&o.exclude)?,
            globs(&o.exclude_dir)?,
        ))
    })();
    let (re, include, exclude, exclude_dir) = match built {
        Ok(b) => b,
        Err(e) => {
            let _ = writeln!(err, "grep: {e}");
            return 2;
        }
    };
    let mut g = Grep {
        o,
        re,
        include,
        exclude,
        exclude_dir,
        out,
        err,
        selected: false,
        error: false,
        done: false,
        grouped: false,
    };
    let implicit = o.files.is_empty() && o.recursive;
    let files = if o.files.is_empty() {
        vec![if o.recursive { "." } else { "-" }.to_string()]
    } else {
        o.files.clone()
    };
    if o.max_count == Some(0) {
        return 1;
    }
    let mut result = files
        .iter()
        .try_for_each(|f| g.search(f, true, implicit, stdin));
    if result.is_ok() {
        result = g.out.flush();
    }
    if let Err(e) = result {
        if e.kind() == io::ErrorKind::BrokenPipe {
            return 141;
        }
        let _ = writeln!(g.err, "grep: write error: {}", crate::io_msg(&e));
        return 2;
    }
    // As GNU 3.8, even with -L: 0 when some line was selected.
    match (g.selected, g.error) {
        (true, _) if o.quiet => 0,
        (_, true) => 2,
        (true, false) => 0,
        (false, false) => 1,
    }
}

/// Runs `grep` with `args` (the first is its name); its exit status.
pub fn main(args: Vec<OsString>) -> i32 {
    let args = crate::arguments(&args);
    let mut err = io::stderr().lock();
    let o = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            let _ = writeln!(err, "grep: {e}\nUsage: grep [OPTION]... PATTERNS [FILE]...");
            return 2;
        }
    };
    let mut out = BufWriter::new(io::stdout().lock());
    run(&o, &mut io::stdin().lock(), &mut out, &mut err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    /// Runs grep on `input` as stdin; (status, stdout, stderr).
    fn grep(cmd: &str, input: &str) -> (i32, String, String) {
        let o = parse_args(&args(cmd)).expect("parse");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(&o, &mut input.as_bytes(), &mut out, &mut err);
        (
            code,
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        )
    }

    #[test]
    fn translates_bre_and_ere() {
        assert_eq!(translate(r"a\(b\|c\)*", true).unwrap(), "a(?:b|c)*");
        assert_eq!(translate("a(b|c)+?{", true).unwrap(), r"a\(b\|c\)\+\?\{");
        assert_eq!(translate(r"x\{2,\}", true).unwrap(), "x{2,}");
        assert_eq!(translate(r"*a^b$c$", true).unwrap(), r"\*a\^b\$c$");
        assert_eq!(translate("a{,3}b{x", false).unwrap(), r"a{0,3}b\{x");
        assert_eq!(
            translate(r"[\.]x[]a][[:digit:]]", false).unwrap(),
            r"[\\.]x[\]a][[:digit:]]"
        );
        assert!(translate(r"\(a\)\1", true).is_err());
        assert!(translate("[abc", false).is_err());
    }

    #[test]
    fn parses_combined_flags_and_values() {
        let o = parse_args(&args("-rnI -A3 -m 2 foo src --include=*.rs -e bar")).unwrap();
        assert!(o.recursive && o.line_number && o.skip_binary);
        assert_eq!((o.after, o.max_count), (3, Some(2)));
        assert_eq!(o.patterns, ["bar"]);
        assert_eq!(o.files, ["foo", "src"]);
        assert_eq!(o.include, ["*.rs"]);
        let o = parse_args(&args("-2 -- -x")).unwrap();
        assert_eq!(
            (o.before, o.after, o.patterns.clone()),
            (2, 2, vec!["-x".to_string()])
        );
        assert!(parse_args(&args("-k x")).is_err());
        assert!(parse_args(&args("--bogus x")).is_err());
    }

    #[test]
    fn basic_matching() {
        let text = "alpha\nbeta\nGamma\nalphabet\n";
        assert_eq!(
            grep("alpha", text),
            (0, "alpha\nalphabet\n".into(), String::new())
        );
        assert_eq!(grep("-n -i gamma", text).1, "3:Gamma\n");
        assert_eq!(grep("-v a", text).1, "");
        assert_eq!(grep("-c -v alpha", text).1, "2\n");
        assert_eq!(grep("-w alpha", text).1, "alpha\n");
        assert_eq!(grep("-x beta", text).1, "beta\n");
        assert_eq!(grep("-o -E l[a-z]", text).1, "lp\nlp\n");
        assert_eq!(grep("-E alpha|beta -m 2", text).1, "alpha\nbeta\n");
        assert_eq!(grep("a|b", text).0, 1);
        assert_eq!(grep("-F a.b", "a.b\naxb\n").1, "a.b\n");
        assert_eq!(grep("-q beta", text), (0, String::new(), String::new()));
        assert_eq!(grep("zeta", text).0, 1);
        assert_eq!(grep("-e zeta -e Gam", text).1, "Gamma\n");
        assert_eq!(grep(r"\(al\)\{1\}p", text).1, "alpha\nalphabet\n");
        assert_eq!(grep("-E (", text).0, 2);
    }

    #[test]
    fn context_groups() {
        let text = "1\n2\nx\n4\n5\n6\n7\nx\n9\n";
        assert_eq!(
            grep("-n -C1 x", text).1,
            "2-2\n3:x\n4-4\n--\n7-7\n8:x\n9-9\n"
        );
        assert_eq!(grep("-A1 x", "x\nx\ny\nz\n").1, "x\nx\ny\n");
        assert_eq!(grep("-B2 x", "a\nb\nc\nx\n").1, "b\nc\nx\n");
    }

    #[test]
    fn invalid_utf8_and_binary() {
        let o = parse_args(&args("foo")).unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(&o, &mut &b"\xff foo\nbar\n"[..], &mut out, &mut err);
        assert_eq!((code, out), (0, b"\xff foo\n".to_vec()));
        let (code, out, err) = grep("foo", "a\0b\nfoo\n");
        assert_eq!((code, out.as_str()), (0, ""));
        assert_eq!(err, "grep: (standard input): binary file matches\n");
        assert_eq!(grep("-I foo", "a\0b\nfoo\n").0, 1);
        assert_eq!(grep("-c foo", "a\0b\nfoo\n").1, "1\n");
    }

    #[test]
    fn recursive_search_with_globs() {
        let dir = std::env::temp_dir().join(format!("trellis-grep-test-{}", std::process::id()));
        let d = dir.to_string_lossy().into_owned();
        std::fs::create_dir_all(dir.join("sub/skip")).unwrap();
        std::fs::write(dir.join("b.txt"), "foo\nbar\n").unwrap();
        std::fs::write(dir.join("a.rs"), "let foo = 1;\n").unwrap();
        std::fs::write(dir.join("sub/c.txt"), "x\nfoo\n").unwrap();
        std::fs::write(dir.join("sub/skip/d.txt"), "foo\n").unwrap();
        let (code, out, _) = grep(&format!("-rn foo {d} --exclude-dir=skip"), "");
        assert_eq!(code, 0);
        assert_eq!(
            out,
            format!("{d}/a.rs:1:let foo = 1;\n{d}/b.txt:1:foo\n{d}/sub/c.txt:2:foo\n")
        );
        let (_, out, _) = grep(&format!("-rl foo {d}/ --include=*.txt"), "");
        assert_eq!(
            out,
            format!("{d}/b.txt\n{d}/sub/c.txt\n{d}/sub/skip/d.txt\n")
        );
        let (_, out, _) = grep(&format!("-c foo {d}/b.txt {d}/a.rs"), "");
        assert_eq!(out, format!("{d}/b.txt:1\n{d}/a.rs:1\n"));
        let (_, out, _) = grep(&format!("-L bar {d}/b.txt {d}/a.rs"), "");
        assert_eq!(out, format!("{d}/a.rs\n"));
        let (code, _, err) = grep(&format!("foo {d}/missing {d}/b.txt"), "");
        assert_eq!(
            (code, err),
            (2, format!("grep: {d}/missing: No such file or directory\n"))
        );
        let (code, _, err) = grep(&format!("foo {d}"), "");
        assert_eq!((code, err), (2, format!("grep: {d}: Is a directory\n")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
