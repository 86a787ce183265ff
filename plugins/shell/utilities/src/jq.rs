//! `jq`: jq filters run by jaq (`jaq-core`, `jaq-std`, `jaq-json`), with jq's options,
//! output format and exit statuses.
//!
//! Supports `-r`, `-j`, `-c`, `-n`, `-s`, `-e`, `-S`, `-R` (raw input lines), `--tab`,
//! `--indent N`, `--arg`, `--argjson`, `--slurpfile`, `--rawfile`, `-f`/`--from-file`,
//! `$ENV` and `env`, `$ARGS.named`, `-M`/`-C`/`-a` (accepted and ignored),
//! combined short flags (`-rc`) and options after the filter. Inputs are streams of JSON
//! values from files or stdin, parsed here so that object keys keep their order. Exit
//! statuses: 2 usage or unparsable input, 3 filter compile error, 5 runtime error, and with
//! `-e` 1 when the last output is `false` or `null`, 4 when there was none.
//!
//! Left out: `--stream`, `--seq`, `--args`/`--jsonargs`, `--raw-output0`, `input_filename`,
//! `$__loc__` in messages, and colour. Error texts are jaq's (`cannot index 1 with "a"`),
//! not jq's. Numbers print as jaq prints them (`1.0` stays `1.0`). jaq 2 (jaq-json 1.1)
//! refuses to index or update `null` (`null | .a` is an error, jq gives `null`; upstream
//! jaq PR #336 changes indexing): the error message then adds a note on how to write it.

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Filter, Native, RcIter};
use jaq_json::Val;
use std::ffi::OsString;
use std::io::{self, BufWriter, Read, Write};
use std::rc::Rc;

/// Parsed command line.
#[derive(Debug, Default)]
struct Opts {
    filter: String,
    files: Vec<String>,
    raw: bool,
    join: bool,
    compact: bool,
    null_input: bool,
    slurp: bool,
    raw_input: bool,
    exit_status: bool,
    sort_keys: bool,
    /// Indentation: `None` for a tab.
    indent: Option<usize>,
    vars: Vec<(String, Val)>,
}

/// Reads a whole file, or stdin for `-`.
fn read_file(path: &str) -> Result<String, String> {
    let mut s = String::new();
    let r = if path == "-" {
        io::stdin().read_to_string(&mut s).map(|_| ())
    } else {
        std::fs::File::open(path).and_then(|mut f| f.read_to_string(&mut s).map(|_| ()))
    };
    r.map_err(|e| {
        format!(
            "{path}: {}",
            e.to_string().split(" (os error").next().unwrap_or_default()
        )
    })?;
    Ok(s)
}

/// Parses `args` (without the command name).
fn parse_args(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        indent: Some(2),
        ..Opts::default()
    };
    let mut positional = Vec::new();
    let mut from_file = false;
    let mut it = args.iter();
    let mut next = |what: &str| {
        it.next()
            .cloned()
            .ok_or(format!("{what} takes a parameter"))
    };
    let mut rest_positional = false;
    while let Ok(arg) = next("") {
        if rest_positional || arg == "-" || !arg.starts_with('-') {
            positional.push(arg);
            continue;
        }
        let longs: Vec<String> = match arg.strip_prefix("--") {
            Some("") => {
                rest_positional = true;
                continue;
            }
            Some(l) => vec![l.to_string()],
            None => arg[1..].chars().map(|c| c.to_string()).collect(),
        };
        for l in longs {
            match l.as_str() {
                "r" | "raw-output" => o.raw = true,
                "j" | "join-output" => (o.raw, o.join) = (true, true),
                "c" | "compact-output" => o.compact = true,
                "n" | "null-input" => o.null_input = true,
                "s" | "slurp" => o.slurp = true,
                "R" | "raw-input" => o.raw_input = true,
                "e" | "exit-status" => o.exit_status = true,
                "S" | "sort-keys" => o.sort_keys = true,
                "M" | "C" | "a" | "monochrome-output" | "color-output" | "ascii-output"
                | "unbuffered" => {}
                "tab" => o.indent = None,
                "indent" => {
                    let n: usize = next("--indent")?
                        .parse()
                        .map_err(|_| "--indent takes a number")?;
                    o.indent = Some(n.min(7));
                }
                "f" | "from-file" => from_file = true,
                "arg" | "argjson" | "slurpfile" | "rawfile" => {
                    let name = next(&format!("--{l}"))?;
                    let v = next(&format!("--{l}"))?;
                    let val = match l.as_str() {
                        "arg" => Val::from(v),
                        "rawfile" => Val::from(read_file(&v)?),
                        "argjson" => parse_json(&v)
                            .ok()
                            .filter(|vs| vs.len() == 1)
                            .and_then(|mut vs| vs.pop())
                            .ok_or(format!("invalid JSON text passed to --argjson: {v}"))?,
                        _ => Val::from_iter(
                            parse_json(&read_file(&v)?).map_err(|e| format!("{v}: {e}"))?,
                        ),
                    };
                    o.vars.push((name, val));
                }
                "h" | "help" => return Err("Usage: jq [OPTIONS] FILTER [FILES...]".into()),
                _ => return Err(format!("Unknown arguments: {arg}")),
            }
        }
    }
    let mut positional = positional.into_iter();
    let first = positional
        .next()
        .ok_or("Usage: jq [OPTIONS] FILTER [FILES...]")?;
    o.filter = if from_file { read_file(&first)? } else { first };
    o.files = positional.collect();
    Ok(o)
}

/// A JSON text parser keeping object keys in order (jaq-json's own needs `hifijson`).
struct Json<'a> {
    s: &'a [u8],
    i: usize,
}

impl Json<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn err<T>(&self, what: &str) -> Result<T, String> {
        let line = self.s[..self.i.min(self.s.len())]
            .iter()
            .filter(|&&c| c == b'\n')
            .count()
            + 1;
        Err(format!(
            "{what} at line {line}, column {}",
            self.i
                - self.s[..self.i.min(self.s.len())]
                    .iter()
                    .rposition(|&c| c == b'\n')
                    .map_or(0, |p| p + 1)
                + 1
        ))
    }

    fn lit(&mut self, word: &str, v: Val) -> Result<Val, String> {
        if self.s[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            self.err("Invalid literal")
        }
    }

    fn value(&mut self, depth: usize) -> Result<Val, String> {
        self.ws();
        if depth > 10_000 {
            return self.err("Exceeds depth limit for parsing");
        }
        match self.s.get(self.i) {
            None => self.err("Unfinished JSON term"),
            Some(b'n') => self.lit("null", Val::Null),
            Some(b't') => self.lit("true", Val::Bool(true)),
            Some(b'f') => self.lit("false", Val::Bool(false)),
            Some(b'"') => self.string().map(Val::from),
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Val::from_iter(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Val::from_iter(items));
                        }
                        _ => return self.err("Expected separator between values"),
                    }
                }
            }
            Some(b'{') => {
                self.i += 1;
                let mut obj = Val::from(serde_json::Value::Object(serde_json::Map::new()));
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(obj);
                }
                loop {
                    self.ws();
                    if self.s.get(self.i) != Some(&b'"') {
                        return self.err("Object keys must be strings");
                    }
                    let key = self.string()?;
                    self.ws();
                    if self.s.get(self.i) != Some(&b':') {
                        return self.err("Objects must consist of key:value pairs");
                    }
                    self.i += 1;
                    let v = self.value(depth + 1)?;
                    if let Val::Obj(m) = &mut obj {
                        Rc::make_mut(m).insert(Rc::new(key), v);
                    }
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(obj);
                        }
                        _ => return self.err("Expected separator between values"),
                    }
                }
            }
            Some(b'-' | b'0'..=b'9') => {
                let start = self.i;
                self.i += 1;
                while self
                    .s
                    .get(self.i)
                    .is_some_and(|c| c.is_ascii_digit() || b".eE+-".contains(c))
                {
                    self.i += 1;
                }
                let text = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
                if text.parse::<f64>().is_err() {
                    return self.err("Invalid numeric literal");
                }
                Ok(text
                    .parse::<isize>()
                    .map_or_else(|_| Val::Num(Rc::new(text)), Val::Int))
            }
            Some(_) => self.err("Invalid literal"),
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let h = self
            .s
            .get(self.i..self.i + 4)
            .and_then(|h| std::str::from_utf8(h).ok());
        let n = h.and_then(|h| u32::from_str_radix(h, 16).ok());
        self.i += 4;
        n.map_or_else(|| self.err("Invalid escape"), Ok)
    }

    fn string(&mut self) -> Result<String, String> {
        self.i += 1;
        let mut out = Vec::new();
        loop {
            let Some(&c) = self.s.get(self.i) else {
                return self.err("Unfinished string");
            };
            self.i += 1;
            match c {
                b'"' => return Ok(String::from_utf8_lossy(&out).into_owned()),
                b'\\' => {
                    let e = self.s.get(self.i).copied();
                    self.i += 1;
                    let ch = match e {
                        Some(b'n') => '\n',
                        Some(b't') => '\t',
                        Some(b'r') => '\r',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'u') => {
                            let mut n = self.hex4()?;
                            if (0xD800..0xDC00).contains(&n) && self.s[self.i..].starts_with(b"\\u")
                            {
                                self.i += 2;
                                let lo = self.hex4()?;
                                n = 0x10000
                                    + ((n - 0xD800) << 10)
                                    + (lo.wrapping_sub(0xDC00) & 0x3FF);
                            }
                            char::from_u32(n).unwrap_or('\u{FFFD}')
                        }
                        Some(c @ (b'"' | b'\\' | b'/')) => char::from(c),
                        _ => return self.err("Invalid escape"),
                    };
                    out.extend(ch.to_string().bytes());
                }
                _ => out.push(c),
            }
        }
    }
}

/// The JSON values in `text`, and the error that ended them early if any.
fn parse_stream(text: &str) -> (Vec<Val>, Option<String>) {
    let mut p = Json {
        s: text.as_bytes(),
        i: 0,
    };
    let mut out = Vec::new();
    loop {
        p.ws();
        if p.i >= p.s.len() {
            return (out, None);
        }
        match p.value(0) {
            Ok(v) => out.push(v),
            Err(e) => return (out, Some(e)),
        }
    }
}

/// All JSON values in `text`.
fn parse_json(text: &str) -> Result<Vec<Val>, String> {
    match parse_stream(text) {
        (vs, None) => Ok(vs),
        (_, Some(e)) => Err(e),
    }
}

/// Writes `v` as JSON: compact when `indent` is `Some(0)`-like `compact`, else pretty.
fn write_json(out: &mut dyn Write, v: &Val, o: &Opts, level: usize) -> io::Result<()> {
    let pad = |out: &mut dyn Write, level: usize| -> io::Result<()> {
        if o.compact {
            return Ok(());
        }
        out.write_all(b"\n")?;
        match o.indent {
            None => out.write_all("\t".repeat(level).as_bytes()),
            Some(n) => out.write_all(" ".repeat(n * level).as_bytes()),
        }
    };
    match v {
        Val::Arr(a) if !a.is_empty() => {
            out.write_all(b"[")?;
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                pad(out, level + 1)?;
                write_json(out, x, o, level + 1)?;
            }
            pad(out, level)?;
            out.write_all(b"]")
        }
        Val::Obj(m) if !m.is_empty() => {
            out.write_all(b"{")?;
            let mut entries: Vec<_> = m.iter().collect();
            if o.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                pad(out, level + 1)?;
                write!(out, "{}:", Val::Str(k.clone()))?;
                if !o.compact {
                    out.write_all(b" ")?;
                }
                write_json(out, x, o, level + 1)?;
            }
            pad(out, level)?;
            out.write_all(b"}")
        }
        _ => write!(out, "{v}"),
    }
}

/// Compiles `code` with the global variables `vars` (names without `$`).
fn compile(code: &str, vars: &[String]) -> Result<Filter<Native<Val>>, String> {
    let prelude = jaq_core::load::parse("def env: $ENV;", |p| p.defs()).unwrap_or_default();
    let loader = Loader::new(jaq_std::defs().chain(jaq_json::defs()).chain(prelude));
    let arena = Arena::default();
    let offset = |part: &str| jaq_core::load::span(code, part).start;
    let modules = loader
        .load(&arena, File { code, path: () })
        .map_err(|errs| {
            let mut msgs = Vec::new();
            for (_, e) in errs {
                match e {
                    jaq_core::load::Error::Io(es) => {
                        msgs.extend(es.into_iter().map(|(p, m)| format!("{p}: {m}")))
                    }
                    jaq_core::load::Error::Lex(es) => {
                        msgs.extend(es.into_iter().map(|(exp, at)| {
                            format!(
                                "syntax error: expected {} at offset {}",
                                exp.as_str(),
                                offset(at)
                            )
                        }))
                    }
                    jaq_core::load::Error::Parse(es) => {
                        msgs.extend(es.into_iter().map(|(exp, at)| match at {
                            "" => {
                                format!("syntax error: expected {} at end of filter", exp.as_str())
                            }
                            t => format!(
                                "syntax error: expected {} but got `{t}` at offset {}",
                                exp.as_str(),
                                offset(t)
                            ),
                        }))
                    }
                }
            }
            msgs.join("\n")
        })?;
    let globals = ["$ENV".to_string(), "$ARGS".to_string()]
        .into_iter()
        .chain(vars.iter().map(|v| format!("${v}")))
        .collect::<Vec<_>>();
    let compiler = Compiler::default()
        .with_funs(jaq_std::funs().chain(jaq_json::funs()))
        .with_global_vars(globals.iter().map(String::as_str));
    compiler.compile(modules).map_err(|errs| {
        let undefined = errs
            .into_iter()
            .flat_map(|(_, es)| es)
            .map(|(name, u)| match u {
                jaq_core::compile::Undefined::Filter(arity) => {
                    format!("{name}/{arity} is not defined")
                }
                u => format!("undefined {} {name}", u.as_str()),
            });
        undefined.collect::<Vec<_>>().join("\n")
    })
}

/// Runs `o` over the inputs `texts` (name and contents); its exit status.
fn run(
    o: &Opts,
    texts: Vec<(String, String)>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> io::Result<i32> {
    let names: Vec<String> = o.vars.iter().map(|(n, _)| n.clone()).collect();
    let filter = match compile(&o.filter, &names) {
        Ok(f) => f,
        Err(e) => {
            writeln!(err, "jq: error: {e}\njq: 1 compile error")?;
            return Ok(3);
        }
    };
    let env: serde_json::Map<String, serde_json::Value> =
        std::env::vars().map(|(k, v)| (k, v.into())).collect();
    let named: serde_json::Map<String, serde_json::Value> = o
        .vars
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().into()))
        .collect();
    let args = serde_json::json!({"positional": [], "named": named});
    let globals: Vec<Val> = [Val::from(serde_json::Value::Object(env)), Val::from(args)]
        .into_iter()
        .chain(o.vars.iter().map(|(_, v)| v.clone()))
        .collect();
    // Inputs, each with where it ends for messages; parsed as they are needed.
    let mut values: Vec<Result<(Val, String), String>> = Vec::new();
    for (name, text) in &texts {
        if o.raw_input {
            let lines = text
                .lines()
                .map(|l| Ok((Val::from(l.to_string()), name.clone())));
            values.extend(if o.slurp { Vec::new() } else { lines.collect() });
            continue;
        }
        let (vs, e) = parse_stream(text);
        values.extend(vs.into_iter().map(|v| Ok((v, name.clone()))));
        if let Some(e) = e {
            values.push(Err(format!(
                "jq: error (at {name}): Cannot parse input: {e}"
            )));
        }
    }
    if o.slurp {
        let all = if o.raw_input {
            Ok(Val::from(
                texts.iter().map(|(_, t)| t.as_str()).collect::<String>(),
            ))
        } else {
            values
                .drain(..)
                .map(|r| r.map(|(v, _)| v))
                .collect::<Result<Val, String>>()
        };
        values = vec![all.map(|v| (v, "<stdin>".to_string()))];
    }
    let (mut status, mut last) = (0, None::<bool>);
    let mut pending = values.into_iter();
    let mut input_err = None;
    let mut main_inputs = Vec::new();
    if o.null_input {
        main_inputs.push((Val::Null, "<unknown>".to_string()));
    } else {
        for v in pending.by_ref() {
            match v {
                Ok(v) => main_inputs.push(v),
                Err(e) => {
                    input_err = Some(e);
                    break;
                }
            }
        }
    }
    let rest: Box<dyn Iterator<Item = Result<Val, String>>> =
        Box::new(pending.map(|r| r.map(|(v, _)| v)));
    let inputs = RcIter::new(rest);
    for (input, name) in main_inputs {
        for r in filter.run((Ctx::new(globals.clone(), &inputs), input)) {
            match r {
                Ok(v) => {
                    last = Some(!matches!(v, Val::Null | Val::Bool(false)));
                    match &v {
                        Val::Str(s) if o.raw => out.write_all(s.as_bytes())?,
                        _ => write_json(out, &v, o, 0)?,
                    }
                    if !o.join {
                        out.write_all(b"\n")?;
                    }
                }
                Err(e) => {
                    out.flush()?;
                    match e.into_val() {
                        Val::Str(s) => {
                            writeln!(err, "jq: error (at {name}): {s}")?;
                            if s.starts_with("cannot use null as iterable") {
                                writeln!(
                                    err,
                                    "jq: note: unlike jq, jaq does not index null: write `.a?` or `(.a // {{}}).b`"
                                )?;
                            }
                        }
                        v => writeln!(err, "jq: error (at {name}) (not a string): {v}")?,
                    }
                    status = 5;
                }
            }
        }
    }
    out.flush()?;
    if let Some(e) = input_err {
        writeln!(err, "{e}")?;
        return Ok(2);
    }
    Ok(match (status, o.exit_status, last) {
        (0, true, None) => 4,
        (0, true, Some(false)) => 1,
        (s, _, _) => s,
    })
}

/// Runs `jq` with `args` (the first is its name); its exit status.
pub fn main(args: Vec<OsString>) -> i32 {
    let args = crate::arguments(&args);
    let mut err = io::stderr().lock();
    let o = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            let _ = writeln!(err, "jq: {e}");
            return 2;
        }
    };
    let mut texts = Vec::new();
    let files = if o.files.is_empty() {
        vec!["-".to_string()]
    } else {
        o.files.clone()
    };
    for f in &files {
        match read_file(f) {
            Ok(t) => texts.push((
                if f == "-" {
                    "<stdin>".to_string()
                } else {
                    f.clone()
                },
                t,
            )),
            Err(e) => {
                let _ = writeln!(err, "jq: error: Could not open {e}");
                return 2;
            }
        }
    }
    match run(
        &o,
        texts,
        &mut BufWriter::new(io::stdout().lock()),
        &mut err,
    ) {
        Ok(code) => code,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => 141,
        Err(_) => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jq(args: &[&str], input: &str) -> (i32, String, String) {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let o = parse_args(&args).expect("parse");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(
            &o,
            vec![("<stdin>".into(), input.into())],
            &mut out,
            &mut err,
        )
        .expect("io");
        (
            code,
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        )
    }

    #[test]
    fn parses_json_streams_in_key_order() {
        let vs = parse_json("{\"z\":1,\"a\":[true,null,-2.5e3]} \"\\u00e9\\ud83d\\ude00\\n\" 12")
            .unwrap();
        assert_eq!(vs.len(), 3);
        assert_eq!(vs[0].to_string(), r#"{"z":1,"a":[true,null,-2.5e3]}"#);
        assert_eq!(vs[1], Val::from("é😀\n".to_string()));
        assert!(parse_json("{\"a\" 1}").unwrap_err().contains("line 1"));
        assert!(parse_json("[1,2").is_err());
    }

    #[test]
    fn formats_like_jq() {
        let input = r#"{"b":{"x":[1,{}],"y":[]},"a":"s"}"#;
        assert_eq!(
            jq(&["."], input).1,
            "{\n  \"b\": {\n    \"x\": [\n      1,\n      {}\n    ],\n    \"y\": []\n  },\n  \"a\": \"s\"\n}\n"
        );
        assert_eq!(
            jq(&["-c", "."], input).1,
            "{\"b\":{\"x\":[1,{}],\"y\":[]},\"a\":\"s\"}\n"
        );
        assert_eq!(
            jq(&["-cS", "."], input).1,
            "{\"a\":\"s\",\"b\":{\"x\":[1,{}],\"y\":[]}}\n"
        );
        assert_eq!(jq(&["--tab", ".b.x"], input).1, "[\n\t1,\n\t{}\n]\n");
        assert_eq!(jq(&["--indent", "1", ".b.x"], input).1, "[\n 1,\n {}\n]\n");
        assert_eq!(jq(&["-r", ".a"], input).1, "s\n");
        assert_eq!(jq(&[".a"], input).1, "\"s\"\n");
        assert_eq!(jq(&["-j", ".a, .a"], input).1, "ss");
    }

    #[test]
    fn filters_inputs_and_variables() {
        assert_eq!(
            jq(
                &["-c", ".[] | select(.n > 1) | .k"],
                r#"[{"n":1,"k":"a"},{"n":2,"k":"b"}]"#
            )
            .1,
            "\"b\"\n"
        );
        assert_eq!(jq(&["-s", "-c", "map(.+1)"], "1 2\n3").1, "[2,3,4]\n");
        assert_eq!(jq(&["-n", "-c", "[inputs]"], "1 2").1, "[1,2]\n");
        assert_eq!(
            jq(
                &[
                    "-n",
                    "--arg",
                    "x",
                    "hi",
                    "--argjson",
                    "y",
                    "{\"a\":1}",
                    "-c",
                    "[$x, $y.a, $ARGS.named.x]"
                ],
                ""
            )
            .1,
            "[\"hi\",1,\"hi\"]\n"
        );
        assert_eq!(jq(&["-R", "-c", "length"], "ab\nc\n").1, "2\n1\n");
        assert_eq!(jq(&["-Rs", "-c", "."], "ab\nc\n").1, "\"ab\\nc\\n\"\n");
        assert_eq!(
            jq(&["-r", "keys | join(\",\")"], r#"{"b":1,"a":2}"#).1,
            "a,b\n"
        );
        assert_eq!(
            jq(
                &["-c", "to_entries | map(\"\\(.key)=\\(.value)\") | @csv"],
                r#"{"a":1}"#
            )
            .1,
            "\"\\\"a=1\\\"\"\n"
        );
    }

    #[test]
    fn exit_statuses() {
        assert_eq!(jq(&["-e", ".a"], r#"{"a":false}"#).0, 1);
        assert_eq!(jq(&["-e", ".a"], r#"{"a":0}"#).0, 0);
        assert_eq!(jq(&["-e", "empty"], "1").0, 4);
        let (code, _, err) = jq(&[".a |"], "1");
        assert_eq!(code, 3);
        assert!(err.starts_with("jq: error: syntax error"), "{err}");
        let (code, _, err) = jq(&["foo(1)"], "1");
        assert_eq!((code, err.contains("foo/1 is not defined")), (3, true));
        let (code, out, err) = jq(&[".[0]"], "{} [7]");
        assert_eq!((code, out.as_str()), (5, "7\n"));
        assert!(
            err.starts_with("jq: error (at <stdin>): cannot index"),
            "{err}"
        );
        assert_eq!(
            jq(&["error(\"boom\")"], "1").2,
            "jq: error (at <stdin>): boom\n"
        );
        let (code, out, _) = jq(&["."], "1 [");
        assert_eq!((code, out.as_str()), (2, "1\n"));
        assert!(parse_args(&["--bogus".into()]).is_err());
        assert!(parse_args(&[]).is_err());
    }
}
