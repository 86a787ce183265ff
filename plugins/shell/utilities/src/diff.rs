//! `diff`: GNU diffutils' line comparison on the `similar` crate (Myers, on byte lines).
//!
//! Supports the normal format (`3c3`, `5a6,7`, `2d1`), the unified format (`-u`, `-U N`,
//! `--unified[=N]`, with GNU's `--- a<TAB>mtime` headers in UTC), `-q`/`--brief`, `-s`,
//! `-r` (with `Only in` lines, `Common subdirectories` without `-r`, and a `diff -u a/x
//! b/x` line before each file's diff), `-N`/`--new-file`, `-a`, `--color` (ignored), `-`
//! for stdin, a folder against a file (compares the file of the same name), binary files
//! (`Binary files a and b differ`) and `\ No newline at end of file`.
//!
//! Left out: `-i`, `-w`, `-b`, `-B`, `-E`, `-I` and other ignoring options, the context
//! (`-c`) and side-by-side (`-y`) formats, `--label`, `-x`/`--exclude` and `-p`: these
//! are refused as unsupported (status 2). Hunks are `similar`'s (Myers), which may differ
//! from GNU's in how a change is split, never in what it means.

use similar::{Algorithm, DiffOp, DiffTag, udiff::UnifiedHunkHeader};
use std::ffi::OsString;
use std::io::{self, BufWriter, Read, Write};
use std::time::{SystemTime, UNIX_EPOCH};

/// Parsed command line.
#[derive(Debug, Default)]
struct Opts {
    /// Context lines of the unified format, or `None` for the normal format.
    unified: Option<usize>,
    brief: bool,
    report_same: bool,
    recursive: bool,
    new_file: bool,
    /// The options as written, for the `diff ...` lines of `-r`.
    switches: Vec<String>,
    files: Vec<String>,
}

/// Parses `args` (without the command name).
fn parse_args(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--" {
            o.files.extend(it.by_ref().cloned());
            break;
        }
        if arg == "-" || !arg.starts_with('-') {
            o.files.push(arg.clone());
            continue;
        }
        o.switches.push(arg.clone());
        if let Some(long) = arg.strip_prefix("--") {
            let (name, value) = long
                .split_once('=')
                .map_or((long, None), |(n, v)| (n, Some(v)));
            match name {
                "unified" => {
                    o.unified = Some(value.map_or(Ok(3), |v| {
                        v.parse()
                            .map_err(|_| format!("invalid context length '{v}'"))
                    })?)
                }
                "brief" => o.brief = true,
                "report-identical-files" => o.report_same = true,
                "recursive" => o.recursive = true,
                "new-file" => o.new_file = true,
                "text" | "color" | "no-color" => {}
                _ => return Err(format!("unsupported option '{arg}'")),
            }
            continue;
        }
        let chars: Vec<char> = arg[1..].chars().collect();
        for (i, c) in chars.iter().enumerate() {
            match c {
                'u' => o.unified = Some(o.unified.unwrap_or(3)),
                'U' => {
                    let rest: String = chars[i + 1..].iter().collect();
                    let v = if rest.is_empty() {
                        it.next()
                            .cloned()
                            .ok_or("option requires an argument -- 'U'")?
                    } else {
                        rest
                    };
                    o.unified = Some(
                        v.parse()
                            .map_err(|_| format!("invalid context length '{v}'"))?,
                    );
                    if chars.len() == i + 1 {
                        o.switches.push(v);
                    }
                    break;
                }
                'q' => o.brief = true,
                's' => o.report_same = true,
                'r' => o.recursive = true,
                'N' => o.new_file = true,
                'a' => {}
                '0'..='9' => {
                    let n: String = chars[i..]
                        .iter()
                        .take_while(|c| c.is_ascii_digit())
                        .collect();
                    o.unified = Some(n.parse().map_err(|_| "invalid context length")?);
                    break;
                }
                _ => return Err(format!("unsupported option '-{c}'")),
            }
        }
    }
    match o.files.len() {
        2 => Ok(o),
        0 | 1 => Err(format!(
            "missing operand after '{}'",
            args.last().map_or("diff", String::as_str)
        )),
        _ => Err(format!("extra operand '{}'", o.files[2])),
    }
}

/// `t` as GNU prints it in unified headers: `2024-01-01 00:00:00.000000000 +0000` (UTC).
fn timestamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (days, secs) = ((d.as_secs() / 86400) as i64, d.as_secs() % 86400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    format!(
        "{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02}.{:09} +0000",
        d.subsec_nanos()
    )
}

/// `a` through `b` (1-based, inclusive) as GNU writes a range: `3` or `3,5`.
fn range(a: usize, b: usize) -> String {
    if a >= b {
        b.to_string()
    } else {
        format!("{a},{b}")
    }
}

fn write_line(out: &mut dyn Write, prefix: &str, line: &[u8]) -> io::Result<()> {
    out.write_all(prefix.as_bytes())?;
    out.write_all(line)?;
    if !line.ends_with(b"\n") {
        out.write_all(b"\n\\ No newline at end of file\n")?;
    }
    Ok(())
}

/// Writes the difference of two texts (`labels` are the header lines for `-u`); whether
/// they differ.
fn diff_texts(
    o: &Opts,
    old: &[u8],
    new: &[u8],
    labels: (&str, &str),
    out: &mut dyn Write,
) -> io::Result<bool> {
    if old == new {
        return Ok(false);
    }
    let (olds, news): (Vec<&[u8]>, Vec<&[u8]>) = (
        old.split_inclusive(|&c| c == b'\n').collect(),
        new.split_inclusive(|&c| c == b'\n').collect(),
    );
    let ops = similar::capture_diff_slices(Algorithm::Myers, &olds, &news);
    if let Some(n) = o.unified {
        writeln!(out, "--- {}\n+++ {}", labels.0, labels.1)?;
        for group in similar::group_diff_ops(ops, n) {
            writeln!(out, "{}", UnifiedHunkHeader::new(&group))?;
            for (tag, r_old, r_new) in group.iter().map(DiffOp::as_tag_tuple) {
                let (old_prefix, new_prefix) = match tag {
                    DiffTag::Equal => (Some(" "), None),
                    _ => (Some("-"), Some("+")),
                };
                for line in old_prefix.map_or(&[][..], |_| &olds[r_old]) {
                    write_line(out, old_prefix.unwrap_or_default(), line)?;
                }
                for line in new_prefix.map_or(&[][..], |_| &news[r_new]) {
                    write_line(out, new_prefix.unwrap_or_default(), line)?;
                }
            }
        }
        return Ok(true);
    }
    let mut ops = ops
        .iter()
        .filter(|op| !matches!(op, DiffOp::Equal { .. }))
        .peekable();
    while let Some(first) = ops.next() {
        let (mut o_end, mut n_end) = (first.old_range().end, first.new_range().end);
        let (o_start, n_start) = (first.old_range().start, first.new_range().start);
        while let Some(next) = ops.peek() {
            if next.old_range().start != o_end || next.new_range().start != n_end {
                break;
            }
            (o_end, n_end) = (next.old_range().end, next.new_range().end);
            ops.next();
        }
        let kind = if o_start == o_end {
            'a'
        } else if n_start == n_end {
            'd'
        } else {
            'c'
        };
        writeln!(
            out,
            "{}{kind}{}",
            range(o_start + 1, o_end),
            range(n_start + 1, n_end)
        )?;
        for line in &olds[o_start..o_end] {
            write_line(out, "< ", line)?;
        }
        if kind == 'c' {
            writeln!(out, "---")?;
        }
        for line in &news[n_start..n_end] {
            write_line(out, "> ", line)?;
        }
    }
    Ok(true)
}

/// A comparison writing to `out` and `err`; `trouble` records errors (status 2).
struct Diff<'a> {
    o: &'a Opts,
    out: &'a mut dyn Write,
    err: &'a mut dyn Write,
    stdin: &'a mut dyn Read,
    trouble: bool,
}

/// A file's contents and header time; `None` contents when it is missing and `-N` allows it.
type Loaded = (Option<Vec<u8>>, SystemTime);

impl Diff<'_> {
    fn load(&mut self, path: &str, missing_ok: bool) -> Option<Loaded> {
        if path == "-" {
            let mut data = Vec::new();
            return match self.stdin.read_to_end(&mut data) {
                Ok(_) => Some((Some(data), SystemTime::now())),
                Err(e) => self.fail(path, &e),
            };
        }
        match std::fs::read(path) {
            Ok(data) => {
                let t = std::fs::metadata(path)
                    .and_then(|m| m.modified())
                    .unwrap_or(UNIX_EPOCH);
                Some((Some(data), t))
            }
            Err(e) if missing_ok && e.kind() == io::ErrorKind::NotFound => Some((None, UNIX_EPOCH)),
            Err(e) => self.fail(path, &e),
        }
    }

    fn fail<T>(&mut self, path: &str, e: &io::Error) -> Option<T> {
        let s = e.to_string();
        let _ = writeln!(
            self.err,
            "diff: {path}: {}",
            s.split(" (os error").next().unwrap_or_default()
        );
        self.trouble = true;
        None
    }

    /// Compares two files; whether they differ.
    fn files(&mut self, a: &str, b: &str, header: bool) -> io::Result<bool> {
        let Some((da, ta)) = self.load(a, self.o.new_file) else {
            return Ok(false);
        };
        let Some((db, tb)) = self.load(b, self.o.new_file) else {
            return Ok(false);
        };
        let (da, db) = (da.unwrap_or_default(), db.unwrap_or_default());
        if da == db {
            if self.o.report_same {
                writeln!(self.out, "Files {a} and {b} are identical")?;
            }
            return Ok(false);
        }
        let binary = |d: &[u8]| d[..d.len().min(8192)].contains(&0);
        if self.o.brief || binary(&da) || binary(&db) {
            let what = if self.o.brief {
                "Files"
            } else {
                "Binary files"
            };
            writeln!(self.out, "{what} {a} and {b} differ")?;
            return Ok(true);
        }
        if header {
            let words: Vec<&str> = std::iter::once("diff")
                .chain(self.o.switches.iter().map(String::as_str))
                .chain([a, b])
                .collect();
            writeln!(self.out, "{}", words.join(" "))?;
        }
        let labels = (
            format!("{a}\t{}", timestamp(ta)),
            format!("{b}\t{}", timestamp(tb)),
        );
        diff_texts(self.o, &da, &db, (&labels.0, &labels.1), self.out)
    }

    /// Compares two folders; whether they differ.
    fn dirs(&mut self, a: &str, b: &str) -> io::Result<bool> {
        let list = |d: &str| -> io::Result<Vec<String>> {
            let mut v: Vec<String> = std::fs::read_dir(d)?
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            Ok(v)
        };
        let (la, lb) = match (list(a), list(b)) {
            (Ok(la), Ok(lb)) => (la, lb),
            (Err(e), _) => return Ok(self.fail(a, &e).unwrap_or(false)),
            (_, Err(e)) => return Ok(self.fail(b, &e).unwrap_or(false)),
        };
        let mut names: Vec<&String> = la.iter().chain(lb.iter()).collect();
        names.sort();
        names.dedup();
        let mut differ = false;
        let join = |d: &str, n: &str| {
            if d.ends_with('/') {
                format!("{d}{n}")
            } else {
                format!("{d}/{n}")
            }
        };
        for name in names {
            let (pa, pb) = (join(a, name), join(b, name));
            let (ina, inb) = (la.contains(name), lb.contains(name));
            let is_dir = |p: &str| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
            let as_empty = self.o.new_file && !is_dir(if ina { &pa } else { &pb });
            if (ina != inb) && !as_empty {
                writeln!(self.out, "Only in {}: {name}", if ina { a } else { b })?;
                differ = true;
            } else if is_dir(&pa) && is_dir(&pb) {
                if self.o.recursive {
                    differ |= self.dirs(&pa, &pb)?;
                } else {
                    writeln!(self.out, "Common subdirectories: {pa} and {pb}")?;
                }
            } else if is_dir(&pa) != is_dir(&pb) && ina && inb {
                let kind = |p: &str| {
                    if is_dir(p) {
                        "directory"
                    } else {
                        "regular file"
                    }
                };
                writeln!(
                    self.out,
                    "File {pa} is a {} while file {pb} is a {}",
                    kind(&pa),
                    kind(&pb)
                )?;
                differ = true;
            } else {
                differ |= self.files(&pa, &pb, true)?;
            }
        }
        Ok(differ)
    }
}

/// Runs the parsed `o`; its exit status.
fn run(o: &Opts, stdin: &mut dyn Read, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let mut d = Diff {
        o,
        out,
        err,
        stdin,
        trouble: false,
    };
    let (a, b) = (o.files[0].as_str(), o.files[1].as_str());
    let is_dir = |p: &str| p != "-" && std::fs::metadata(p).is_ok_and(|m| m.is_dir());
    let base = |p: &str| {
        p.trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or(p)
            .to_string()
    };
    let into = |d: &str, f: &str| format!("{}/{}", d.trim_end_matches('/'), base(f));
    let result = match (is_dir(a), is_dir(b)) {
        (true, true) => d.dirs(a, b),
        (true, false) => d.files(&into(a, b), b, false),
        (false, true) => d.files(a, &into(b, a), false),
        (false, false) => d.files(a, b, false),
    };
    match result.and_then(|differ| d.out.flush().map(|()| differ)) {
        Ok(_) if d.trouble => 2,
        Ok(differ) => i32::from(differ),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => 141,
        Err(_) => 2,
    }
}

/// Runs `diff` with `args` (the first is its name); its exit status.
pub fn main(args: Vec<OsString>) -> i32 {
    let args = crate::arguments(&args);
    let mut err = io::stderr().lock();
    match parse_args(&args) {
        Ok(o) => run(
            &o,
            &mut io::stdin().lock(),
            &mut BufWriter::new(io::stdout().lock()),
            &mut err,
        ),
        Err(e) => {
            let _ = writeln!(
                err,
                "diff: {e}\ndiff: Try 'diff --help' for more information."
            );
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(args: &str) -> Opts {
        parse_args(
            &args
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>(),
        )
        .expect("parse")
    }

    fn text_diff(args: &str, old: &str, new: &str) -> String {
        let mut out = Vec::new();
        diff_texts(
            &opts(args),
            old.as_bytes(),
            new.as_bytes(),
            ("a", "b"),
            &mut out,
        )
        .expect("write");
        String::from_utf8(out).expect("utf-8")
    }

    fn diff(args: &str) -> (i32, String, String) {
        let o = opts(args);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(&o, &mut &b""[..], &mut out, &mut err);
        (
            code,
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        )
    }

    #[test]
    fn parses_options() {
        assert_eq!(opts("-u a b").unified, Some(3));
        assert_eq!(opts("-U1 a b").unified, Some(1));
        assert_eq!(opts("-U 0 a b").unified, Some(0));
        assert_eq!(opts("--unified=5 a b").unified, Some(5));
        let o = opts("-rq a b");
        assert!(o.recursive && o.brief);
        assert!(
            parse_args(&["-i".into(), "a".into(), "b".into()])
                .unwrap_err()
                .contains("unsupported option '-i'")
        );
        assert!(parse_args(&["a".into()]).is_err());
    }

    #[test]
    fn formats_timestamps() {
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01 00:00:00.000000000 +0000");
        let t = UNIX_EPOCH + std::time::Duration::new(1_709_251_199, 5);
        assert_eq!(timestamp(t), "2024-02-29 23:59:59.000000005 +0000");
    }

    #[test]
    fn normal_format() {
        assert_eq!(
            text_diff("a b", "1\n2\n3\n", "1\nX\n3\n"),
            "2c2\n< 2\n---\n> X\n"
        );
        assert_eq!(
            text_diff("a b", "1\n2\n", "1\n2\n3\n4\n"),
            "2a3,4\n> 3\n> 4\n"
        );
        assert_eq!(text_diff("a b", "1\n2\n3\n", "1\n3\n"), "2d1\n< 2\n");
        assert_eq!(
            text_diff("a b", "1\n2", "1\n3"),
            "2c2\n< 2\n\\ No newline at end of file\n---\n> 3\n\\ No newline at end of file\n"
        );
        assert_eq!(text_diff("a b", "same\n", "same\n"), "");
    }

    #[test]
    fn unified_format() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let new = "a\nb\nc\nD\ne\nf\ng\nh\ni\n";
        assert_eq!(
            text_diff("-u a b", old, new),
            "--- a\n+++ b\n@@ -1,8 +1,9 @@\n a\n b\n c\n-d\n+D\n e\n f\n g\n h\n+i\n"
        );
        assert_eq!(
            text_diff("-U1 a b", old, new),
            "--- a\n+++ b\n@@ -3,3 +3,3 @@\n c\n-d\n+D\n e\n@@ -8 +8,2 @@\n h\n+i\n"
        );
        assert_eq!(
            text_diff("-U0 a b", "x\n", "x"),
            "--- a\n+++ b\n@@ -1 +1 @@\n-x\n+x\n\\ No newline at end of file\n"
        );
    }

    #[test]
    fn files_and_folders() {
        let dir = std::env::temp_dir().join(format!("trellis-diff-test-{}", std::process::id()));
        let d = dir.to_string_lossy().into_owned();
        for sub in ["x/s", "y/s"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::fs::write(dir.join("x/same"), "1\n").unwrap();
        std::fs::write(dir.join("y/same"), "1\n").unwrap();
        std::fs::write(dir.join("x/s/f"), "old\n").unwrap();
        std::fs::write(dir.join("y/s/f"), "new\n").unwrap();
        std::fs::write(dir.join("x/gone"), "g\n").unwrap();
        std::fs::write(dir.join("y/bin"), b"\0\x01").unwrap();
        assert_eq!(
            diff(&format!("{d}/x/same {d}/y/same")),
            (0, String::new(), String::new())
        );
        assert_eq!(
            diff(&format!("-q {d}/x/s/f {d}/y/s/f")).1,
            format!("Files {d}/x/s/f and {d}/y/s/f differ\n")
        );
        let (code, out, _) = diff(&format!("-ru {d}/x {d}/y"));
        assert_eq!(code, 1);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], format!("Only in {d}/y: bin"));
        assert_eq!(lines[1], format!("Only in {d}/x: gone"));
        assert_eq!(lines[2], format!("diff -ru {d}/x/s/f {d}/y/s/f"));
        assert!(lines[3].starts_with(&format!("--- {d}/x/s/f\t")) && lines[3].ends_with(" +0000"));
        assert_eq!(&lines[5..], ["@@ -1 +1 @@", "-old", "+new"]);
        let (_, out, _) = diff(&format!("{d}/x {d}/y"));
        assert!(out.contains(&format!("Common subdirectories: {d}/x/s and {d}/y/s\n")));
        let (code, out, _) = diff(&format!("-N {d}/x/gone {d}/y/gone"));
        assert_eq!((code, out), (1, "1d0\n< g\n".to_string()));
        assert_eq!(
            diff(&format!("{d}/x/same {d}/y/bin")).1,
            format!("Binary files {d}/x/same and {d}/y/bin differ\n")
        );
        assert_eq!(
            diff(&format!("{d}/x/s/f {d}/y/s")).1,
            "1c1\n< old\n---\n> new\n"
        );
        let (code, _, err) = diff(&format!("{d}/nope {d}/y/bin"));
        assert_eq!(
            (code, err),
            (2, format!("diff: {d}/nope: No such file or directory\n"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
