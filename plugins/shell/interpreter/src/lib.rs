//! A bash-compatible command interpreter for Trellis's sandboxed shell.
//!
//! The syntax is bash's, parsed by brush-parser; this crate walks the tree. It has no
//! process, pipe or file handle of its own: the commands that are not shell builtins, the
//! files of redirections and the folder listings of globs go to a [`System`] the embedder
//! gives (in the shell plugin: the sandbox's own filesystem, and the host, which runs each
//! utility as a fresh component under the same grant). Pipelines run one stage after the
//! other, each stage's output the next one's input. Every run is bounded ([`Limits`]): steps
//! (commands, loop rounds, calls), nesting, and the bytes of every buffer, so no script makes
//! the interpreter loop or grow without end; past a bound the run stops with a message
//! naming it.
//!
//! Not supported, each refused with a message rather than run differently: arrays, background
//! jobs (`&` runs the command in the foreground), process substitution, coprocesses.

mod arith;
mod builtins;
mod exec;
mod expand;
mod io;

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

pub use builtins::names as builtin_names;
pub use io::{Command, FileKind, Output, System, normalize};

/// The bounds of one run of a script.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Commands, loop rounds, function calls and glob matches one run may execute.
    pub steps: u64,
    /// Function calls, subshells, command substitutions and `eval`s nested in one another.
    pub depth: u32,
    /// Bytes of stdout and of stderr the run returns, each; the rest is dropped and said.
    pub output_bytes: usize,
    /// Bytes one pipe, command substitution, here-document, file read or variable holds.
    pub pipe_bytes: usize,
    /// Bytes of the script itself.
    pub script_bytes: usize,
    /// Time the run may take, looked at on every step (a command running when it passes
    /// is not interrupted: its own deadline is the embedder's).
    pub time: Option<std::time::Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            steps: 100_000,
            depth: 64,
            output_bytes: 1 << 20,
            pipe_bytes: 16 << 20,
            script_bytes: 64 << 10,
            time: None,
        }
    }
}

/// How deep a script's text may nest ([`nesting`]).
const MAX_NESTING: usize = 200;

/// How deep the texts running inside each other may nest together: a script, the `eval`s,
/// substitutions and function bodies it runs, arithmetic ([`Shell::nested`]).
const MAX_ACTIVE_NESTING: usize = 400;

/// How deep the parser would recurse on script `text`, counted on the text before it is
/// parsed: the deepest of `(`, `[` and `{` nesting (quoted or not); of compound commands (an
/// unquoted `if`, `while`, `until`, `for`, `select` or `case` where a command starts, against
/// `fi`, `done`, `esac`; here-document bodies are text); of `!`s in a row; and within double
/// brackets, arithmetic's own ([`arithmetic_nesting`]). A bound, not a parse: every text the
/// shell parses later (substitutions, `eval`, arithmetic) is counted again then.
pub(crate) fn nesting(text: &str) -> usize {
    let (mut brackets, mut compound, mut conditional) = (0usize, 0usize, 0usize);
    let (mut prefixes, mut deepest) = (0usize, 0usize);
    let mut word = String::new();
    // Whether the word being read starts a command: after the start, a line's end, `;`,
    // `&`, `|`, a bracket, or a word that a command follows.
    let (mut command_start, mut word_starts_command) = (true, true);
    let mut quote: Option<char> = None;
    // Here-documents: the delimiters of those opened on this line, then the body being read.
    let mut pending: Vec<(String, bool)> = Vec::new();
    let mut lines = text.split_inclusive('\n');
    while let Some(line) = lines.next() {
        let mut chars = line.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            if let Some(q) = quote {
                if c == q {
                    quote = None;
                } else if q == '"' && c == '\\' {
                    chars.next();
                    continue;
                }
                match c {
                    '(' | '[' | '{' => brackets += 1,
                    ')' | ']' | '}' => brackets = brackets.saturating_sub(1),
                    _ => {}
                }
                deepest = deepest.max(brackets);
                continue;
            }
            if c.is_alphanumeric() || c == '_' {
                if word.is_empty() {
                    word_starts_command = command_start;
                }
                if word.len() < 8 {
                    word.push(c);
                }
                prefixes = 0;
                continue;
            }
            if !word.is_empty() {
                command_start = false;
                match word.as_str() {
                    "if" | "while" | "until" | "for" | "select" | "case" if word_starts_command => {
                        compound += 1
                    }
                    "fi" | "done" | "esac" => compound = compound.saturating_sub(1),
                    "then" | "do" | "else" | "elif" => command_start = true,
                    _ => {}
                }
                word.clear();
            }
            match c {
                '\'' | '"' => quote = Some(c),
                '\\' => {
                    chars.next();
                }
                '#' if command_start || line[..at].ends_with(char::is_whitespace) => break,
                '<' if line[at..].starts_with("<<") && !line[at..].starts_with("<<<") => {
                    chars.next();
                    if let Some(delimiter) = heredoc_delimiter(&line[at + 2..]) {
                        pending.push(delimiter);
                    }
                }
                '(' | '[' | '{' => brackets += 1,
                ')' | ']' | '}' => brackets = brackets.saturating_sub(1),
                '?' if brackets >= 2 => conditional += 1,
                ':' if brackets >= 2 => conditional = conditional.saturating_sub(1),
                '!' => prefixes += 1,
                '-' | '+' | '~' if brackets >= 2 => prefixes += 1,
                c if c.is_whitespace() => {}
                _ => prefixes = 0,
            }
            if matches!(c, '\n' | ';' | '&' | '|' | '(' | ')' | '{' | '!') {
                command_start = true;
            } else if !c.is_whitespace() {
                command_start = false;
            }
            deepest = deepest
                .max(brackets)
                .max(compound)
                .max(conditional)
                .max(prefixes);
        }
        if line.ends_with('\n') {
            if !word.is_empty() {
                if matches!(
                    word.as_str(),
                    "if" | "while" | "until" | "for" | "select" | "case"
                ) && word_starts_command
                {
                    compound += 1;
                }
                word.clear();
            }
            command_start = true;
        }
        // The bodies of the here-documents opened on this line follow it.
        for (delimiter, strip_tabs) in pending.drain(..) {
            for body in lines.by_ref() {
                let body_line = body.trim_end_matches('\n');
                let body_line = if strip_tabs {
                    body_line.trim_start_matches('\t')
                } else {
                    body_line
                };
                if body_line == delimiter {
                    break;
                }
            }
        }
    }
    if matches!(
        word.as_str(),
        "if" | "while" | "until" | "for" | "select" | "case"
    ) && word_starts_command
    {
        compound += 1;
    }
    deepest.max(compound)
}

/// The delimiter of a here-document whose `<<` `rest` follows, and whether its body's
/// leading tabs are stripped (`<<-`).
fn heredoc_delimiter(rest: &str) -> Option<(String, bool)> {
    let (strip_tabs, rest) = match rest.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let rest = rest.trim_start_matches([' ', '\t']);
    let mut delimiter = String::new();
    let mut quote = None;
    for c in rest.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => delimiter.push(c),
            (None, '\'' | '"') => quote = Some(c),
            (None, '\\') => {}
            (None, c) if c.is_whitespace() || ";&|<>()".contains(c) => break,
            (None, c) => delimiter.push(c),
        }
    }
    (!delimiter.is_empty()).then_some((delimiter, strip_tabs))
}

/// How deep the arithmetic parser would recurse on `text`: the deepest of bracket nesting,
/// of `?` against `:`, and of prefix operators (`!`, `-`, `+`, `~`) in a row; or how many
/// operators that bind to the right (`**`, `=` and the assignments) it has, whichever is
/// more, each of which nests the rest of the expression under it.
pub(crate) fn arithmetic_nesting(text: &str) -> usize {
    let (mut brackets, mut conditional, mut prefixes, mut deepest) =
        (0usize, 0usize, 0usize, 0usize);
    let mut rightward = 0usize;
    let mut previous = ' ';
    for c in text.chars() {
        match c {
            '(' | '[' => brackets += 1,
            ')' | ']' => brackets = brackets.saturating_sub(1),
            '?' => conditional += 1,
            ':' => conditional = conditional.saturating_sub(1),
            '!' | '-' | '+' | '~' => prefixes += 1,
            c if c.is_whitespace() => {}
            _ => prefixes = 0,
        }
        if c == '=' || (c == '*' && previous == '*') {
            rightward += 1;
        }
        previous = if c == '*' && previous == '*' { ' ' } else { c };
        deepest = deepest.max(brackets).max(conditional).max(prefixes);
    }
    deepest.max(rightward)
}

/// An error when `depth` is past [`MAX_NESTING`]: the text is not parsed.
pub(crate) fn refuse_nesting(depth: usize) -> Result<(), String> {
    if depth > MAX_NESTING {
        return Err(format!(
            "the command nests {depth} deep (brackets, compound commands, `?`, `!` or `-` in \
             a row), more than the {MAX_NESTING} a command may"
        ));
    }
    Ok(())
}

/// What a run of a script gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The exit status: the last command's, or the one `exit` gave; 2 for a syntax error
    /// or a bound reached.
    pub status: i32,
    /// What the script wrote on its standard output, up to [`Limits::output_bytes`].
    pub stdout: Vec<u8>,
    /// What the script wrote on its standard error, up to [`Limits::output_bytes`].
    pub stderr: Vec<u8>,
    /// Bytes of stdout dropped past [`Limits::output_bytes`].
    pub stdout_dropped: u64,
    /// Bytes of stderr dropped past [`Limits::output_bytes`].
    pub stderr_dropped: u64,
}

/// The interpreter's state: variables, functions, positional parameters, the working folder.
pub struct Shell<S: System> {
    sys: S,
    limits: Limits,
    vars: HashMap<String, String>,
    exported: HashSet<String>,
    funcs: HashMap<String, Rc<exec::Function>>,
    positional: Vec<String>,
    cwd: String,
    status: i32,
    steps: u64,
    depth: u32,
    /// Saved values of the variables `local` shadowed, one frame per function call.
    locals: Vec<Vec<(String, Option<String>)>>,
    flow: exec::Flow,
    options: exec::Options,
    /// The status of the last command substitution of the simple command being expanded.
    substituted: Option<i32>,
    /// Above zero while a condition (`if`, `while`, `&&`, `!`) runs: `set -e` does not stop it.
    in_condition: u32,
    /// When the shell was made, for [`Limits::time`].
    started: std::time::Instant,
    /// The nesting of the texts running inside each other now (a script, the `eval`s and
    /// substitutions in it, the function bodies called, arithmetic), added up: what the
    /// parser's and the walker's recursion take of the stack ([`MAX_ACTIVE_NESTING`]).
    nesting_in_use: usize,
    /// The nesting of the text running now, which a function defined in it keeps.
    text_nesting: usize,
}

impl<S: System> std::fmt::Debug for Shell<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shell")
            .field("cwd", &self.cwd)
            .field("status", &self.status)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl<S: System> Shell<S> {
    /// A shell whose working folder is `cwd` (an absolute path) and whose environment is
    /// `env`, every variable of it exported.
    pub fn new(sys: S, limits: Limits, cwd: &str, env: &[(String, String)]) -> Self {
        let mut shell = Shell {
            sys,
            limits,
            vars: HashMap::new(),
            exported: HashSet::new(),
            funcs: HashMap::new(),
            positional: Vec::new(),
            cwd: io::normalize("/", cwd),
            status: 0,
            steps: 0,
            depth: 0,
            locals: Vec::new(),
            flow: exec::Flow::Normal,
            options: exec::Options::default(),
            in_condition: 0,
            substituted: None,
            started: std::time::Instant::now(),
            nesting_in_use: 0,
            text_nesting: 0,
        };
        for (name, value) in env {
            shell.vars.insert(name.clone(), value.clone());
            shell.exported.insert(name.clone());
        }
        let cwd = shell.cwd.clone();
        shell.vars.insert("PWD".into(), cwd.clone());
        shell.exported.insert("PWD".into());
        shell.vars.entry("HOME".into()).or_insert(cwd);
        shell.vars.entry("IFS".into()).or_insert(" \t\n".into());
        shell
    }

    /// Runs `script` to its end, or to the first bound it reaches.
    pub fn run(&mut self, script: &str) -> Finished {
        let out = io::Sink::new(self.limits.output_bytes);
        let err = io::Sink::new(self.limits.output_bytes);
        let streams = io::Streams {
            stdin: io::Input::empty(),
            out: out.clone(),
            err: err.clone(),
        };
        let nested = nesting(script);
        let status = if script.len() > self.limits.script_bytes {
            err.write_str(&format!(
                "shell: the command is {} bytes, more than the {} a command may have\n",
                script.len(),
                self.limits.script_bytes
            ));
            2
        } else if let Err(why) = refuse_nesting(nested) {
            // The parser recurses on nesting: refused before it could overflow its stack.
            err.write_str(&format!("shell: {why}\n"));
            2
        } else {
            match self.run_text(script, &streams) {
                Ok(()) | Err(exec::Halt::Exit) => self.status,
                Err(exec::Halt::Fatal(message)) => {
                    err.write_str(&format!("shell: {message}\n"));
                    2
                }
            }
        };
        let (stdout, stdout_dropped) = out.take();
        let (stderr, stderr_dropped) = err.take();
        Finished {
            status,
            stdout,
            stderr,
            stdout_dropped,
            stderr_dropped,
        }
    }

    /// The working folder the script left.
    pub fn cwd(&self) -> &str {
        &self.cwd
    }

    /// The system the shell runs commands with.
    pub fn system(&mut self) -> &mut S {
        &mut self.sys
    }
}

#[cfg(test)]
mod tests;
