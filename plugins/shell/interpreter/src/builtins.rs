//! The builtins: the commands that change the shell itself (`cd`, `export`, `local`,
//! `return`, `set`, ...), and `echo`, `printf`, `test`, `read`, which every script uses and
//! which cost nothing in the shell.

use brush_parser::ast::{BinaryPredicate, ExtendedTestExpr, TestExpr, UnaryPredicate};

use crate::exec::{Flow, Halt, Step};
use crate::io::{FileKind, Streams, normalize};
use crate::{Shell, System};

const BUILTINS: &[&str] = &[
    ":", ".", "[", "break", "cd", "continue", "echo", "eval", "exit", "export", "false", "local",
    "printf", "pwd", "read", "return", "set", "shift", "source", "test", "true", "type", "unset",
];

/// The builtins' names, sorted.
pub fn names() -> &'static [&'static str] {
    BUILTINS
}

pub(crate) fn is_builtin(name: &str) -> bool {
    BUILTINS.contains(&name)
}

impl<S: System> Shell<S> {
    pub(crate) fn builtin(&mut self, argv: &[String], io: &Streams) -> Step {
        let args = &argv[1..];
        let name = argv[0].as_str();
        let fail = |sh: &mut Self, message: String| -> Step {
            io.err.write_str(&format!("{name}: {message}\n"));
            sh.status = if name == "exit" || name == "return" {
                2
            } else {
                1
            };
            Ok(())
        };
        self.status = 0;
        match name {
            ":" | "true" => {}
            "false" => self.status = 1,
            "echo" => {
                let mut newline = true;
                let mut escapes = false;
                let mut rest = args;
                while let Some(first) = rest.first() {
                    if first.len() > 1
                        && first.starts_with('-')
                        && first[1..].chars().all(|c| "neE".contains(c))
                    {
                        for c in first[1..].chars() {
                            match c {
                                'n' => newline = false,
                                'e' => escapes = true,
                                _ => escapes = false,
                            }
                        }
                        rest = &rest[1..];
                    } else {
                        break;
                    }
                }
                let mut text = rest.join(" ");
                if escapes {
                    let (decoded, stop) = backslash_escapes(&text);
                    text = decoded;
                    // `\c` ends the output, its newline too.
                    newline &= !stop;
                }
                if newline {
                    text.push('\n');
                }
                io.out.write_str(&text);
            }
            "printf" => {
                let Some((format, values)) = args.split_first() else {
                    return fail(self, "usage: printf FORMAT [ARGUMENT]...".into());
                };
                match printf(format, values) {
                    Ok(text) => {
                        io.out.write_str(&text);
                    }
                    Err(message) => return fail(self, message),
                }
            }
            "pwd" => {
                io.out.write_str(&format!("{}\n", self.cwd));
            }
            "cd" => {
                let target = match args.first().map(String::as_str) {
                    None => self.vars.get("HOME").cloned().unwrap_or_else(|| "/".into()),
                    Some("-") => self
                        .vars
                        .get("OLDPWD")
                        .cloned()
                        .unwrap_or_else(|| self.cwd.clone()),
                    Some(path) => path.to_string(),
                };
                let path = normalize(&self.cwd, &target);
                if self.sys.kind(&path) != Some(FileKind::Dir) {
                    return fail(self, format!("{target}: No such file or directory"));
                }
                let old = std::mem::replace(&mut self.cwd, path.clone());
                self.vars.insert("OLDPWD".into(), old);
                self.vars.insert("PWD".into(), path);
            }
            "export" | "local" => {
                if name == "local" && self.locals.is_empty() {
                    return fail(self, "can only be used in a function".into());
                }
                for arg in args.iter().filter(|a| !a.starts_with('-')) {
                    let (var, value) = match arg.split_once('=') {
                        Some((var, value)) => (var, Some(value.to_string())),
                        None => (arg.as_str(), None),
                    };
                    if !valid_name(var) {
                        return fail(self, format!("`{arg}': not a valid identifier"));
                    }
                    if name == "local" {
                        let saved = self.vars.get(var).cloned();
                        if let Some(frame) = self.locals.last_mut() {
                            frame.push((var.to_string(), saved));
                        }
                        self.set_var(var, value.unwrap_or_default())?;
                    } else {
                        if let Some(value) = value {
                            self.set_var(var, value)?;
                        }
                        self.exported.insert(var.to_string());
                    }
                }
            }
            "unset" => {
                for arg in args.iter().filter(|a| !a.starts_with('-')) {
                    if args.iter().any(|a| a == "-f") {
                        self.funcs.remove(arg);
                    } else {
                        self.vars.remove(arg);
                        self.exported.remove(arg);
                    }
                }
            }
            "shift" => {
                let n = match args.first() {
                    Some(n) => match n.parse::<usize>() {
                        Ok(n) => n,
                        Err(_) => return fail(self, format!("{n}: numeric argument required")),
                    },
                    None => 1,
                };
                if n > self.positional.len() {
                    self.status = 1;
                } else {
                    self.positional.drain(..n);
                }
            }
            "set" => return self.set(args, io),
            "return" | "exit" => {
                let status = match args.first() {
                    Some(n) => match n.parse::<i64>() {
                        Ok(n) => (n & 0xff) as i32,
                        Err(_) => return fail(self, format!("{n}: numeric argument required")),
                    },
                    None => self.status,
                };
                self.status = status;
                if name == "exit" {
                    return Err(Halt::Exit);
                }
                if self.locals.is_empty() {
                    return fail(
                        self,
                        "can only `return' from a function or sourced script".into(),
                    );
                }
                self.flow = Flow::Return;
            }
            "break" | "continue" => {
                let n = match args.first() {
                    Some(n) => match n.parse::<u32>() {
                        Ok(n) if n > 0 => n,
                        _ => return fail(self, format!("{n}: loop count out of range")),
                    },
                    None => 1,
                };
                self.flow = if name == "break" {
                    Flow::Break(n)
                } else {
                    Flow::Continue(n)
                };
            }
            "test" | "[" => {
                let mut args = args.to_vec();
                if name == "[" {
                    if args.last().map(String::as_str) != Some("]") {
                        return fail(self, "missing `]'".into());
                    }
                    args.pop();
                }
                if args.is_empty() {
                    self.status = 1;
                    return Ok(());
                }
                let expr = match brush_parser::test_command::parse(&args) {
                    Ok(expr) => expr,
                    Err(e) => return fail(self, e.to_string()),
                };
                let ok = self.test(&expr)?;
                self.status = i32::from(!ok);
            }
            "read" => {
                let raw = args.iter().any(|a| a == "-r");
                let names: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
                let Some((line, ended)) = io.stdin.read_line() else {
                    self.status = 1;
                    return Ok(());
                };
                let line = if raw {
                    line
                } else {
                    backslash_escapes(&line).0
                };
                let ifs = self
                    .vars
                    .get("IFS")
                    .cloned()
                    .unwrap_or_else(|| " \t\n".into());
                if names.is_empty() {
                    self.set_var("REPLY", line)?;
                } else {
                    let mut rest = line.trim_start_matches(|c| ifs.contains(c)).to_string();
                    for (i, var) in names.iter().enumerate() {
                        let value = if i + 1 == names.len() {
                            std::mem::take(&mut rest)
                                .trim_end_matches(|c: char| ifs.contains(c) && c.is_whitespace())
                                .to_string()
                        } else {
                            let end = rest.find(|c| ifs.contains(c)).unwrap_or(rest.len());
                            let value = rest[..end].to_string();
                            rest = rest[end..]
                                .trim_start_matches(|c| ifs.contains(c))
                                .to_string();
                            value
                        };
                        self.set_var(var, value)?;
                    }
                }
                self.status = i32::from(!ended);
            }
            "eval" => {
                let text = args.join(" ");
                return self.deeper(|sh| sh.run_text(&text, io));
            }
            "source" | "." => {
                let Some(path) = args.first() else {
                    return fail(self, "filename argument required".into());
                };
                let path = normalize(&self.cwd, path);
                let text = match self.sys.read_file(&path, self.limits.script_bytes) {
                    Ok(data) => String::from_utf8_lossy(&data).into_owned(),
                    Err(e) => return fail(self, format!("{path}: {e}")),
                };
                return self.deeper(|sh| sh.run_text(&text, io));
            }
            "type" => {
                for arg in args {
                    let what = if self.funcs.contains_key(arg) {
                        "a function"
                    } else if is_builtin(arg) {
                        "a shell builtin"
                    } else {
                        "a command of the sandbox, if it has one of that name"
                    };
                    io.out.write_str(&format!("{arg} is {what}\n"));
                }
            }
            other => return Err(Halt::Fatal(format!("{other}: builtin without a body"))),
        }
        Ok(())
    }

    fn set(&mut self, args: &[String], io: &Streams) -> Step {
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            if arg == "--" {
                self.positional = args.cloned().collect();
                return Ok(());
            }
            let (on, flags) = match arg.strip_prefix('-') {
                Some(flags) => (true, flags),
                None => match arg.strip_prefix('+') {
                    Some(flags) => (false, flags),
                    None => {
                        self.positional = std::iter::once(arg).chain(args).cloned().collect();
                        return Ok(());
                    }
                },
            };
            for flag in flags.chars() {
                match flag {
                    'e' => self.options.errexit = on,
                    'u' => self.options.nounset = on,
                    'x' | 'v' | 'f' | 'h' | 'B' | 'C' => {}
                    'o' => {
                        let option = args.next().map(String::as_str).unwrap_or("");
                        match option {
                            "errexit" => self.options.errexit = on,
                            "nounset" => self.options.nounset = on,
                            "pipefail" => self.options.pipefail = on,
                            "xtrace" | "verbose" | "noclobber" | "noglob" => {}
                            other => {
                                io.err
                                    .write_str(&format!("set: {other}: invalid option name\n"));
                                self.status = 2;
                                return Ok(());
                            }
                        }
                    }
                    other => {
                        io.err
                            .write_str(&format!("set: -{other}: invalid option\n"));
                        self.status = 2;
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    fn file_test(&mut self, predicate: &UnaryPredicate, operand: &str) -> Option<bool> {
        let path = normalize(&self.cwd, operand);
        let kind = self.sys.kind(&path);
        Some(match predicate {
            UnaryPredicate::FileExists | UnaryPredicate::FileExistsAndIsReadable => kind.is_some(),
            UnaryPredicate::FileExistsAndIsDir | UnaryPredicate::FileExistsAndIsExecutable => {
                kind == Some(FileKind::Dir)
            }
            UnaryPredicate::FileExistsAndIsRegularFile => kind == Some(FileKind::File),
            UnaryPredicate::FileExistsAndIsWritable => kind.is_some(),
            UnaryPredicate::FileExistsAndIsNotZeroLength => {
                self.sys.len(&path).is_some_and(|n| n > 0)
            }
            UnaryPredicate::FileExistsAndIsSymlink
            | UnaryPredicate::FileExistsAndIsFifo
            | UnaryPredicate::FileExistsAndIsSocket
            | UnaryPredicate::FileExistsAndIsBlockSpecialFile
            | UnaryPredicate::FileExistsAndIsCharSpecialFile => kind == Some(FileKind::Other),
            _ => return None,
        })
    }

    fn unary(&mut self, predicate: &UnaryPredicate, operand: &str) -> Result<bool, Halt> {
        if let Some(answer) = self.file_test(predicate, operand) {
            return Ok(answer);
        }
        Ok(match predicate {
            UnaryPredicate::StringHasZeroLength => operand.is_empty(),
            UnaryPredicate::StringHasNonZeroLength => !operand.is_empty(),
            UnaryPredicate::ShellVariableIsSetAndAssigned => self.vars.contains_key(operand),
            _ => false,
        })
    }

    fn binary(
        &mut self,
        predicate: &BinaryPredicate,
        left: &str,
        right: &str,
        patterns: bool,
    ) -> Result<bool, Halt> {
        let number = |text: &str| -> Result<i64, Halt> {
            text.trim()
                .parse::<i64>()
                .map_err(|_| Halt::Fatal(format!("{text}: integer expression expected")))
        };
        Ok(match predicate {
            BinaryPredicate::StringExactlyMatchesPattern if patterns => {
                crate::expand::pattern_matches(right, left)?
            }
            BinaryPredicate::StringDoesNotExactlyMatchPattern if patterns => {
                !crate::expand::pattern_matches(right, left)?
            }
            BinaryPredicate::StringExactlyMatchesPattern
            | BinaryPredicate::StringExactlyMatchesString => left == right,
            BinaryPredicate::StringDoesNotExactlyMatchPattern
            | BinaryPredicate::StringDoesNotExactlyMatchString => left != right,
            BinaryPredicate::StringMatchesRegex => regex::RegexBuilder::new(right)
                .size_limit(1 << 20)
                .build()
                .map_err(|e| Halt::Fatal(format!("{right}: bad regular expression: {e}")))?
                .is_match(left),
            BinaryPredicate::StringContainsSubstring => left.contains(right),
            BinaryPredicate::LeftSortsBeforeRight => left < right,
            BinaryPredicate::LeftSortsAfterRight => left > right,
            BinaryPredicate::ArithmeticEqualTo => number(left)? == number(right)?,
            BinaryPredicate::ArithmeticNotEqualTo => number(left)? != number(right)?,
            BinaryPredicate::ArithmeticLessThan => number(left)? < number(right)?,
            BinaryPredicate::ArithmeticLessThanOrEqualTo => number(left)? <= number(right)?,
            BinaryPredicate::ArithmeticGreaterThan => number(left)? > number(right)?,
            BinaryPredicate::ArithmeticGreaterThanOrEqualTo => number(left)? >= number(right)?,
            BinaryPredicate::FilesReferToSameDeviceAndInodeNumbers
            | BinaryPredicate::LeftFileIsNewerOrExistsWhenRightDoesNot
            | BinaryPredicate::LeftFileIsOlderOrDoesNotExistWhenRightDoes => {
                return Err(Halt::Fatal(format!(
                    "{predicate:?}: this test is not supported"
                )));
            }
        })
    }

    fn test(&mut self, expr: &TestExpr) -> Result<bool, Halt> {
        Ok(match expr {
            TestExpr::False => false,
            TestExpr::Literal(text) => !text.is_empty(),
            TestExpr::And(a, b) => self.test(a)? && self.test(b)?,
            TestExpr::Or(a, b) => self.test(a)? || self.test(b)?,
            TestExpr::Not(a) => !self.test(a)?,
            TestExpr::Parenthesized(a) => self.test(a)?,
            TestExpr::UnaryTest(predicate, operand) => self.unary(predicate, operand)?,
            TestExpr::BinaryTest(predicate, left, right) => {
                self.binary(predicate, left, right, false)?
            }
        })
    }

    pub(crate) fn extended_test(
        &mut self,
        expr: &ExtendedTestExpr,
        io: &Streams,
    ) -> Result<bool, Halt> {
        self.step()?;
        Ok(match expr {
            ExtendedTestExpr::And(a, b) => {
                self.extended_test(a, io)? && self.extended_test(b, io)?
            }
            ExtendedTestExpr::Or(a, b) => {
                self.extended_test(a, io)? || self.extended_test(b, io)?
            }
            ExtendedTestExpr::Not(a) => !self.extended_test(a, io)?,
            ExtendedTestExpr::Parenthesized(a) => self.extended_test(a, io)?,
            ExtendedTestExpr::UnaryTest(predicate, word) => {
                let operand = self.expand_string(&word.value, io)?;
                self.unary(predicate, &operand)?
            }
            ExtendedTestExpr::BinaryTest(predicate, left, right) => {
                let left = self.expand_string(&left.value, io)?;
                let right = match predicate {
                    BinaryPredicate::StringExactlyMatchesPattern
                    | BinaryPredicate::StringDoesNotExactlyMatchPattern => {
                        self.expand_pattern(&right.value, io)?
                    }
                    _ => self.expand_string(&right.value, io)?,
                };
                self.binary(predicate, &left, &right, true)?
            }
        })
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `echo -e` / `printf %b` escapes; the second value says a `\c` ended the text.
fn backslash_escapes(text: &str) -> (String, bool) {
    crate::expand::decode_escapes(text, false)
}

/// The most bytes one `printf` makes; its widths are bounded too.
const PRINTF_BYTES: usize = 1 << 20;

/// `printf FORMAT ARGS...`: the format reused while arguments remain, as in bash.
fn printf(format: &str, values: &[String]) -> Result<String, String> {
    let mut out = String::new();
    let mut values = values.iter();
    loop {
        let mut used = false;
        let mut chars = format.chars().peekable();
        while let Some(c) = chars.next() {
            if out.len() > PRINTF_BYTES {
                return Err(format!(
                    "the output is more than the {PRINTF_BYTES} bytes one printf makes"
                ));
            }
            if c == '\\' {
                let mut escape = String::from('\\');
                escape.extend(chars.next());
                if escape == "\\0" || escape == "\\x" {
                    while chars.peek().is_some_and(char::is_ascii_hexdigit) && escape.len() < 5 {
                        escape.extend(chars.next());
                    }
                }
                out.push_str(&backslash_escapes(&escape).0);
                continue;
            }
            if c != '%' {
                out.push(c);
                continue;
            }
            if chars.peek() == Some(&'%') {
                chars.next();
                out.push('%');
                continue;
            }
            let mut flags = String::new();
            while let Some(&f) = chars.peek() {
                if "-+ 0#".contains(f) {
                    flags.push(f);
                    chars.next();
                } else {
                    break;
                }
            }
            let mut width = String::new();
            while chars.peek().is_some_and(char::is_ascii_digit) {
                width.extend(chars.next());
            }
            let mut precision = None;
            if chars.peek() == Some(&'.') {
                chars.next();
                let mut digits = String::new();
                while chars.peek().is_some_and(char::is_ascii_digit) {
                    digits.extend(chars.next());
                }
                precision = Some(digits.parse::<usize>().unwrap_or(0).min(1000));
            }
            let width = width.parse::<usize>().unwrap_or(0).min(1000);
            let Some(conversion) = chars.next() else {
                return Err("missing format character".into());
            };
            let value = values.next();
            used |= value.is_some();
            let value = value.map(String::as_str).unwrap_or("");
            let number = || -> Result<i64, String> {
                if value.is_empty() {
                    return Ok(0);
                }
                if let Some(c) = value.strip_prefix('\'').or_else(|| value.strip_prefix('"')) {
                    return Ok(c.chars().next().map_or(0, |c| c as i64));
                }
                let (digits, radix) = if let Some(hex) = value
                    .strip_prefix("0x")
                    .or_else(|| value.strip_prefix("0X"))
                {
                    (hex, 16)
                } else {
                    (value, 10)
                };
                i64::from_str_radix(digits.trim(), radix)
                    .map_err(|_| format!("{value}: invalid number"))
            };
            let body = match conversion {
                's' => match precision {
                    Some(p) => value.chars().take(p).collect(),
                    None => value.to_string(),
                },
                'b' => {
                    let (text, stop) = backslash_escapes(value);
                    if stop {
                        // `\c` in an argument ends all of printf's output.
                        out.push_str(&text);
                        return Ok(out);
                    }
                    text
                }
                'c' => value.chars().next().map(String::from).unwrap_or_default(),
                'd' | 'i' => {
                    let n = number()?;
                    if flags.contains('+') && n >= 0 {
                        format!("+{n}")
                    } else {
                        n.to_string()
                    }
                }
                'u' => (number()? as u64).to_string(),
                'x' => format!("{:x}", number()?),
                'X' => format!("{:X}", number()?),
                'o' => format!("{:o}", number()?),
                'f' | 'e' | 'g' => {
                    let f: f64 = if value.is_empty() {
                        0.0
                    } else {
                        value
                            .trim()
                            .parse()
                            .map_err(|_| format!("{value}: invalid number"))?
                    };
                    let p = precision.unwrap_or(6);
                    match conversion {
                        'e' => format!("{f:.p$e}"),
                        _ => format!("{f:.p$}"),
                    }
                }
                other => return Err(format!("%{other}: invalid directive")),
            };
            let pad = width.saturating_sub(body.chars().count());
            if flags.contains('-') {
                out.push_str(&body);
                out.extend(std::iter::repeat_n(' ', pad));
            } else if flags.contains('0') && "diuxXofeg".contains(conversion) {
                let (sign, digits) = match body.strip_prefix('-') {
                    Some(rest) => ("-", rest),
                    None => ("", body.as_str()),
                };
                out.push_str(sign);
                out.extend(std::iter::repeat_n('0', pad));
                out.push_str(digits);
            } else {
                out.extend(std::iter::repeat_n(' ', pad));
                out.push_str(&body);
            }
        }
        if !used || values.len() == 0 {
            return Ok(out);
        }
    }
}
