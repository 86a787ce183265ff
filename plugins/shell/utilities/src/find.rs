//! `find`: a GNU-compatible subset of findutils' `find` on `std::fs` and `globset`.
//!
//! Supports starting points (default `.`), the global options `-maxdepth`, `-mindepth`,
//! `-depth`; the tests `-name`, `-iname`, `-path`/`-wholename`, `-ipath`, `-regex`,
//! `-iregex` (the `regex` crate's syntax, anchored on the whole path), `-type` (`f`, `d`,
//! `l`, comma lists), `-empty`, `-size [+-]N[cwbkMG]` (GNU's rounding up to units),
//! `-newer`, `-mtime`, `-mmin`, `-true`, `-false`; the operators `!`/`-not`, `-a`/`-and`
//! (implicit), `-o`/`-or`, `(` `)`; the actions `-print` (the default), `-print0`,
//! `-printf` (`%p %P %f %h %s %d %y %%` and `\n \t \0 \\`), `-prune`, `-delete` (implies
//! `-depth`) and `-quit`. Symbolic links are never followed (GNU's `-P`).
//!
//! Left out: `-exec`, `-execdir`, `-ok`, `-okdir` (no processes in the sandbox: the message
//! says to use `xargs`), owners and permissions (`-user`, `-perm`...), `-L`/`-H`, `-ls`,
//! `-fprint*`, the `,` operator, and the warning GNU prints for global options placed after
//! tests. Entries are visited sorted by name, not in directory order as GNU does, so that
//! output is deterministic.

use globset::{GlobBuilder, GlobMatcher};
use regex::{Regex, RegexBuilder};
use std::cmp::Ordering;
use std::ffi::OsString;
use std::fs::Metadata;
use std::io::{self, BufWriter, Write};
use std::time::SystemTime;

/// A parsed expression.
#[derive(Debug)]
enum Expr {
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Const(bool),
    /// A glob on the base name (`false`) or the whole path (`true`).
    Glob(GlobMatcher, bool),
    Regex(Regex),
    Type(Vec<char>),
    Empty,
    /// Size compared in units of the given bytes, rounded up.
    Size(Ordering, u64, u64),
    Newer(SystemTime),
    /// Age compared in units of the given seconds, rounded down.
    Age(Ordering, u64, u64),
    Print(u8),
    Printf(String),
    Prune,
    Delete,
    Quit,
}

/// Command line: starting points, global options and the expression.
#[derive(Debug)]
struct Command {
    paths: Vec<String>,
    max_depth: usize,
    min_depth: usize,
    depth_first: bool,
    expr: Expr,
}

/// A comparison `+N` (more than), `-N` (less than) or `N` (exactly).
fn cmp_arg(pred: &str, v: &str) -> Result<(Ordering, u64, String), String> {
    let (ord, rest) = match v.as_bytes().first() {
        Some(b'+') => (Ordering::Greater, &v[1..]),
        Some(b'-') => (Ordering::Less, &v[1..]),
        _ => (Ordering::Equal, v),
    };
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let n = rest[..digits]
        .parse()
        .map_err(|_| format!("invalid argument `{v}' to `{pred}'"))?;
    Ok((ord, n, rest[digits..].to_string()))
}

struct Parser<'a> {
    t: &'a [String],
    i: usize,
    cmd: Command,
    action: bool,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&str> {
        self.t.get(self.i).map(String::as_str)
    }

    fn or(&mut self) -> Result<Expr, String> {
        let mut l = self.and()?;
        while matches!(self.peek(), Some("-o" | "-or")) {
            self.i += 1;
            l = Expr::Or(Box::new(l), Box::new(self.and()?));
        }
        Ok(l)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut l = self.not()?;
        loop {
            match self.peek() {
                None | Some("-o" | "-or" | ")") => return Ok(l),
                Some("-a" | "-and") => self.i += 1,
                _ => {}
            }
            l = Expr::And(Box::new(l), Box::new(self.not()?));
        }
    }

    fn not(&mut self) -> Result<Expr, String> {
        if matches!(self.peek(), Some("!" | "-not")) {
            self.i += 1;
            return Ok(Expr::Not(Box::new(self.not()?)));
        }
        self.primary()
    }

    fn arg(&mut self, pred: &str) -> Result<String, String> {
        let v = self
            .t
            .get(self.i)
            .cloned()
            .ok_or(format!("missing argument to `{pred}'"))?;
        self.i += 1;
        Ok(v)
    }

    fn primary(&mut self) -> Result<Expr, String> {
        let Some(tok) = self.t.get(self.i).cloned() else {
            return Err("invalid expression".into());
        };
        self.i += 1;
        let pred = tok.as_str();
        Ok(match pred {
            "(" => {
                let e = self.or()?;
                if self.peek() != Some(")") {
                    return Err("invalid expression; I was expecting to find a ')' somewhere but did not see one.".into());
                }
                self.i += 1;
                e
            }
            "-name" | "-iname" | "-path" | "-wholename" | "-ipath" | "-iwholename" => {
                let v = self.arg(pred)?;
                let glob = GlobBuilder::new(&v)
                    .case_insensitive(pred.starts_with("-i"))
                    .build();
                let glob = glob.map_err(|e| format!("{pred} {v}: {e}"))?;
                Expr::Glob(
                    glob.compile_matcher(),
                    !pred.ends_with("name") || pred.ends_with("wholename"),
                )
            }
            "-regex" | "-iregex" => {
                let v = self.arg(pred)?;
                let re = RegexBuilder::new(&format!("^(?:{v})$"))
                    .case_insensitive(pred == "-iregex")
                    .build();
                Expr::Regex(re.map_err(|e| format!("{pred} {v}: {e}"))?)
            }
            "-type" => {
                let v = self.arg(pred)?;
                let kinds: Vec<char> = v.split(',').filter_map(|k| k.chars().next()).collect();
                if v.split(',').any(|k| k.len() != 1 || !"fdlbcps".contains(k)) {
                    return Err(format!("Unknown argument to -type: {v}"));
                }
                Expr::Type(kinds)
            }
            "-empty" => Expr::Empty,
            "-true" => Expr::Const(true),
            "-false" => Expr::Const(false),
            "-size" => {
                let v = self.arg(pred)?;
                let (ord, n, unit) = cmp_arg(pred, &v)?;
                let unit = match unit.as_str() {
                    "" | "b" => 512,
                    "c" => 1,
                    "w" => 2,
                    "k" => 1 << 10,
                    "M" => 1 << 20,
                    "G" => 1 << 30,
                    _ => return Err(format!("invalid -size type `{unit}'")),
                };
                Expr::Size(ord, n, unit)
            }
            "-mtime" | "-mmin" => {
                let v = self.arg(pred)?;
                let (ord, n, rest) = cmp_arg(pred, &v)?;
                if !rest.is_empty() {
                    return Err(format!("invalid argument `{v}' to `{pred}'"));
                }
                Expr::Age(ord, n, if pred == "-mtime" { 86400 } else { 60 })
            }
            "-newer" => {
                let v = self.arg(pred)?;
                let meta =
                    std::fs::metadata(&v).map_err(|e| format!("'{v}': {}", crate::io_msg(&e)))?;
                Expr::Newer(
                    meta.modified()
                        .map_err(|e| format!("'{v}': {}", crate::io_msg(&e)))?,
                )
            }
            "-maxdepth" | "-mindepth" => {
                let v = self.arg(pred)?;
                let n = v.parse().map_err(|_| {
                    format!("Expected a positive decimal integer argument to {pred}, but got '{v}'")
                })?;
                *(if pred == "-maxdepth" {
                    &mut self.cmd.max_depth
                } else {
                    &mut self.cmd.min_depth
                }) = n;
                Expr::Const(true)
            }
            "-depth" | "-d" => {
                self.cmd.depth_first = true;
                Expr::Const(true)
            }
            "-xdev" | "-mount" | "-noleaf" | "-ignore_readdir_race" => Expr::Const(true),
            "-print" | "-print0" => {
                self.action = true;
                Expr::Print(if pred == "-print0" { 0 } else { b'\n' })
            }
            "-printf" => {
                self.action = true;
                Expr::Printf(self.arg(pred)?)
            }
            "-prune" => Expr::Prune,
            "-quit" => Expr::Quit,
            "-delete" => {
                self.action = true;
                self.cmd.depth_first = true;
                Expr::Delete
            }
            "-exec" | "-execdir" | "-ok" | "-okdir" => {
                return Err(format!(
                    "{pred} is not available in the sandbox (no processes): pipe the paths to xargs instead"
                ));
            }
            "-user" | "-group" | "-uid" | "-gid" | "-perm" | "-nouser" | "-nogroup" | "-links"
            | "-inum" | "-samefile" | "-ls" | "-fls" | "-fprint" | "-fprint0" | "-fprintf"
            | "-atime" | "-ctime" | "-amin" | "-cmin" | "-anewer" | "-cnewer" | "-newermt"
            | "-readable" | "-writable" | "-executable" | "-lname" | "-ilname" | "-follow"
            | "-xtype" | "-fstype" | "-used" => {
                return Err(format!("{pred} is not supported by this find"));
            }
            _ if pred.starts_with('-') && pred.len() > 1 => {
                return Err(format!("unknown predicate '{pred}'"));
            }
            _ => return Err(format!("paths must precede expression: `{pred}'")),
        })
    }
}

/// Parses `args` (without the command name).
fn parse_args(args: &[String]) -> Result<Command, String> {
    let split = args
        .iter()
        .position(|a| a.starts_with('-') && a.len() > 1 || a == "(" || a == "!")
        .unwrap_or(args.len());
    let mut paths = args[..split].to_vec();
    if paths.is_empty() {
        paths.push(".".into());
    }
    let cmd = Command {
        paths,
        max_depth: usize::MAX,
        min_depth: 0,
        depth_first: false,
        expr: Expr::Const(true),
    };
    let tokens = &args[split..];
    let mut p = Parser {
        t: tokens,
        i: 0,
        cmd,
        action: false,
    };
    let expr = if tokens.is_empty() {
        Expr::Const(true)
    } else {
        p.or()?
    };
    if p.i < tokens.len() {
        return Err(format!("unexpected `{}'", tokens[p.i]));
    }
    let mut cmd = p.cmd;
    cmd.expr = if p.action {
        expr
    } else {
        Expr::And(Box::new(expr), Box::new(Expr::Print(b'\n')))
    };
    Ok(cmd)
}

/// One visited file.
struct Entry<'a> {
    path: &'a str,
    /// The path relative to its starting point (`%P`).
    rel: &'a str,
    meta: &'a Metadata,
    depth: usize,
}

impl Entry<'_> {
    fn name(&self) -> &str {
        let trimmed = self.path.trim_end_matches('/');
        if trimmed.is_empty() {
            return "/";
        }
        trimmed.rsplit('/').next().unwrap_or(trimmed)
    }
}

/// A traversal writing to `out` and `err`.
struct Find<'a> {
    out: &'a mut dyn Write,
    err: &'a mut dyn Write,
    now: SystemTime,
    failed: bool,
    quit: bool,
    prune: bool,
}

impl Find<'_> {
    fn fail(&mut self, msg: String) {
        self.failed = true;
        let _ = writeln!(self.err, "find: {msg}");
    }

    fn eval(&mut self, e: &Expr, en: &Entry) -> io::Result<bool> {
        let ft = en.meta.file_type();
        Ok(match e {
            Expr::And(a, b) => self.eval(a, en)? && self.eval(b, en)?,
            Expr::Or(a, b) => self.eval(a, en)? || self.eval(b, en)?,
            Expr::Not(a) => !self.eval(a, en)?,
            Expr::Const(b) => *b,
            Expr::Glob(g, whole) => g.is_match(if *whole { en.path } else { en.name() }),
            Expr::Regex(re) => re.is_match(en.path),
            Expr::Type(kinds) => kinds.iter().any(|k| match k {
                'f' => ft.is_file(),
                'd' => ft.is_dir(),
                'l' => ft.is_symlink(),
                _ => false,
            }),
            Expr::Empty => {
                if ft.is_dir() {
                    std::fs::read_dir(en.path).is_ok_and(|mut d| d.next().is_none())
                } else {
                    ft.is_file() && en.meta.len() == 0
                }
            }
            Expr::Size(ord, n, unit) => en.meta.len().div_ceil(*unit).cmp(n) == *ord,
            Expr::Newer(t) => en.meta.modified().is_ok_and(|m| m > *t),
            Expr::Age(ord, n, unit) => {
                let age = en
                    .meta
                    .modified()
                    .ok()
                    .and_then(|m| self.now.duration_since(m).ok());
                age.map_or(0, |d| d.as_secs() / unit).cmp(n) == *ord
            }
            Expr::Print(end) => {
                self.out.write_all(en.path.as_bytes())?;
                self.out.write_all(&[*end])?;
                true
            }
            Expr::Printf(f) => {
                self.out.write_all(&printf(f, en))?;
                true
            }
            Expr::Prune => {
                self.prune = true;
                true
            }
            Expr::Quit => {
                self.quit = true;
                true
            }
            Expr::Delete => {
                let done = if ft.is_dir() {
                    std::fs::remove_dir(en.path)
                } else {
                    std::fs::remove_file(en.path)
                };
                match done {
                    Ok(()) => true,
                    Err(e) => {
                        self.fail(format!(
                            "cannot delete '{}': {}",
                            en.path,
                            crate::io_msg(&e)
                        ));
                        false
                    }
                }
            }
        })
    }

    /// Visits `path` at `depth` and, unless pruned, what it contains.
    fn walk(&mut self, cmd: &Command, path: &str, rel: &str, depth: usize) -> io::Result<()> {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) => {
                self.fail(format!("'{path}': {}", crate::io_msg(&e)));
                return Ok(());
            }
        };
        let en = Entry {
            path,
            rel,
            meta: &meta,
            depth,
        };
        let here = depth >= cmd.min_depth;
        self.prune = false;
        if here && !cmd.depth_first {
            self.eval(&cmd.expr, &en)?;
        }
        let descend = meta.is_dir() && depth < cmd.max_depth && (cmd.depth_first || !self.prune);
        if descend && !self.quit {
            match std::fs::read_dir(path) {
                Ok(rd) => {
                    // Sorted by name for deterministic output; GNU uses directory order.
                    let mut names: Vec<String> = rd
                        .filter_map(Result::ok)
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect();
                    names.sort();
                    for name in names {
                        let child = if path.ends_with('/') {
                            format!("{path}{name}")
                        } else {
                            format!("{path}/{name}")
                        };
                        let child_rel = if rel.is_empty() {
                            name
                        } else {
                            format!("{rel}/{name}")
                        };
                        self.walk(cmd, &child, &child_rel, depth + 1)?;
                        if self.quit {
                            break;
                        }
                    }
                }
                Err(e) => self.fail(format!("'{path}': {}", crate::io_msg(&e))),
            }
        }
        if here && cmd.depth_first && !self.quit {
            self.eval(&cmd.expr, &en)?;
        }
        Ok(())
    }
}

/// Expands a `-printf` format for `en`.
fn printf(f: &str, en: &Entry) -> Vec<u8> {
    let mut out = String::new();
    let mut chars = f.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('0') => out.push('\0'),
                Some(o) => out.push(o),
                None => out.push('\\'),
            },
            '%' => match chars.next() {
                Some('p') => out.push_str(en.path),
                Some('P') => out.push_str(en.rel),
                Some('f') => out.push_str(en.name()),
                Some('h') => out.push_str(match en.path.trim_end_matches('/').rsplit_once('/') {
                    Some(("", _)) => "/",
                    Some((dir, _)) => dir,
                    None => ".",
                }),
                Some('s') => out.push_str(&en.meta.len().to_string()),
                Some('d') => out.push_str(&en.depth.to_string()),
                Some('y') => {
                    let ft = en.meta.file_type();
                    out.push(if ft.is_dir() {
                        'd'
                    } else if ft.is_symlink() {
                        'l'
                    } else {
                        'f'
                    });
                }
                Some('%') => out.push('%'),
                Some(o) => {
                    out.push('%');
                    out.push(o);
                }
                None => out.push('%'),
            },
            _ => out.push(c),
        }
    }
    out.into_bytes()
}

/// Runs the parsed `cmd`; its exit status.
fn run(cmd: &Command, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let mut f = Find {
        out,
        err,
        now: SystemTime::now(),
        failed: false,
        quit: false,
        prune: false,
    };
    let mut result = Ok(());
    for path in &cmd.paths {
        result = f.walk(cmd, path, "", 0);
        if result.is_err() || f.quit {
            break;
        }
    }
    if let Err(e) = result.and_then(|()| f.out.flush()) {
        if e.kind() == io::ErrorKind::BrokenPipe {
            return 141;
        }
        f.fail(format!("write error: {}", crate::io_msg(&e)));
    }
    i32::from(f.failed)
}

/// Runs `find` with `args` (the first is its name); its exit status.
pub fn main(args: Vec<OsString>) -> i32 {
    let args = crate::arguments(&args);
    let mut err = io::stderr().lock();
    match parse_args(&args) {
        Ok(cmd) => run(&cmd, &mut BufWriter::new(io::stdout().lock()), &mut err),
        Err(e) => {
            let _ = writeln!(err, "find: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(cmd: &str) -> (i32, String, String) {
        let args: Vec<String> = cmd.split_whitespace().map(str::to_string).collect();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = match parse_args(&args) {
            Ok(c) => run(&c, &mut out, &mut err),
            Err(e) => {
                err.extend(format!("find: {e}\n").bytes());
                1
            }
        };
        (
            code,
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        )
    }

    #[test]
    fn parses_expressions() {
        let c = parse_args(&[
            "src".into(),
            "-maxdepth".into(),
            "2".into(),
            "-name".into(),
            "*.rs".into(),
        ])
        .unwrap();
        assert_eq!((c.paths.clone(), c.max_depth), (vec!["src".to_string()], 2));
        assert!(matches!(c.expr, Expr::And(_, ref p) if matches!(**p, Expr::Print(b'\n'))));
        assert!(
            parse_args(&["-foo".into()])
                .unwrap_err()
                .contains("unknown predicate '-foo'")
        );
        assert!(
            parse_args(&["-name".into()])
                .unwrap_err()
                .contains("missing argument to `-name'")
        );
        assert!(parse_args(&["(".into(), "-true".into()]).is_err());
        assert!(parse_args(&["-type".into(), "q".into()]).is_err());
        assert_eq!(
            cmp_arg("-size", "+10k").unwrap(),
            (Ordering::Greater, 10, "k".into())
        );
        let e = parse_args(&[".".into(), "-exec".into(), "rm".into()]).unwrap_err();
        assert_eq!(
            e,
            "-exec is not available in the sandbox (no processes): pipe the paths to xargs instead"
        );
    }

    #[test]
    fn walks_and_filters() {
        let dir = std::env::temp_dir().join(format!("trellis-find-test-{}", std::process::id()));
        let d = dir.to_string_lossy().into_owned();
        std::fs::create_dir_all(dir.join("src/empty")).unwrap();
        std::fs::create_dir_all(dir.join("target/debug")).unwrap();
        std::fs::write(dir.join("src/main.rs"), "fn main() {}\n").unwrap();
        std::fs::write(dir.join("src/Lib.RS"), "").unwrap();
        std::fs::write(dir.join("target/debug/x.rs"), vec![b'x'; 2000]).unwrap();
        std::fs::write(dir.join("README.md"), "hi").unwrap();
        let (code, out, _) = find(&format!("{d} -name *.rs"));
        assert_eq!(
            (code, out),
            (0, format!("{d}/src/main.rs\n{d}/target/debug/x.rs\n"))
        );
        let (_, out, _) = find(&format!("{d} -iname *.rs -type f"));
        assert_eq!(
            out,
            format!("{d}/src/Lib.RS\n{d}/src/main.rs\n{d}/target/debug/x.rs\n")
        );
        let (_, out, _) = find(&format!("{d}/ -maxdepth 1"));
        assert_eq!(out, format!("{d}/\n{d}/README.md\n{d}/src\n{d}/target\n"));
        let (_, out, _) = find(&format!("{d} -path */target -prune -o -type f -print"));
        assert_eq!(
            out,
            format!("{d}/README.md\n{d}/src/Lib.RS\n{d}/src/main.rs\n")
        );
        let (_, out, _) = find(&format!("{d} -empty"));
        assert_eq!(out, format!("{d}/src/Lib.RS\n{d}/src/empty\n"));
        let (_, out, _) = find(&format!("{d} -type f -size +1k"));
        assert_eq!(out, format!("{d}/target/debug/x.rs\n"));
        let (_, out, _) = find(&format!("{d} -type f -size -1k"));
        assert_eq!(out, format!("{d}/src/Lib.RS\n"));
        let (_, out, _) = find(&format!("{d} -mindepth 2 -type d ( -name e* -o -name d* )"));
        assert_eq!(out, format!("{d}/src/empty\n{d}/target/debug\n"));
        let (_, out, _) = find(&format!("{d}/src -type f -printf %P:%s\\n"));
        assert_eq!(out, "Lib.RS:0\nmain.rs:13\n");
        let (_, out, _) = find(&format!("{d} ! -type d -name *.md -print0"));
        assert_eq!(out, format!("{d}/README.md\0"));
        let (_, out, _) = find(&format!("{d} -type f -print -quit"));
        assert_eq!(out, format!("{d}/README.md\n"));
        assert_eq!(
            find(&format!("{d} -mtime -1 -name README.md")).1,
            format!("{d}/README.md\n")
        );
        assert_eq!(find(&format!("{d} -mtime +1")).1, "");
        let (code, out, err) = find(&format!("{d}/missing {d}/README.md"));
        assert_eq!((code, out), (1, format!("{d}/README.md\n")));
        assert_eq!(
            err,
            format!("find: '{d}/missing': No such file or directory\n")
        );
        let (code, _, _) = find(&format!("{d}/target -delete"));
        assert!(code == 0 && !dir.join("target").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
