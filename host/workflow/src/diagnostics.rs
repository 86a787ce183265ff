//! Diagnostics for workflow files, and the small JSON checker that produces them.
//!
//! Workflow files are parsed in two stages: first to a `serde_json::Value`, then walked by
//! the checker in this module, which records every problem it meets (file, JSON path, what
//! was expected, a "did you mean" for unknown keys) and keeps going. serde's derive would stop
//! at the first error and say little about where it was; a user fixing a plan by hand needs
//! all of them at once.

use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};
use trellis_sandbox::json_values::{MAX_FILE_VALUES, json_values};

/// How bad a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The file cannot be used as it is.
    Error,
    /// The file is usable, but something in it is probably not what the author meant.
    Warning,
}

/// One problem found in a workflow file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// The file, relative to the workspace (`planning/plan.json`).
    pub file: String,
    /// Where in the file, as a JSON path such as `steps[3].items[1].source_sql`; empty for the
    /// whole file.
    pub json_path: String,
    /// The id of the step the problem belongs to, when known.
    pub step_id: Option<String>,
    /// What is wrong and what was expected.
    pub message: String,
    /// Error or warning.
    pub severity: Severity,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        match (self.json_path.is_empty(), &self.step_id) {
            (true, None) => {}
            (true, Some(id)) => write!(f, ": step \"{id}\"")?,
            (false, None) => write!(f, ": {}", self.json_path)?,
            (false, Some(id)) => write!(f, ": {} (step \"{id}\")", self.json_path)?,
        }
        write!(f, ": {}", self.message)
    }
}

/// Every problem found in one or more files, errors and warnings together, in the order found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one diagnostic.
    pub fn push(&mut self, diagnostic: Diagnostic) {
        self.0.push(diagnostic);
    }

    /// Adds every diagnostic of `other`.
    pub fn extend(&mut self, other: Diagnostics) {
        self.0.extend(other.0);
    }

    /// Whether at least one diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        self.0.iter().any(|d| d.severity == Severity::Error)
    }

    /// The errors only.
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter().filter(|d| d.severity == Severity::Error)
    }

    /// The warnings only.
    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter().filter(|d| d.severity == Severity::Warning)
    }

    /// Whether there is nothing to report.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many diagnostics there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// All diagnostics in order.
    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter()
    }

    /// One line per diagnostic, without the severity prefix: what tests compare against.
    pub fn lines(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            let label = match d.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            write!(f, "{label}: {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// The result of parsing one file: the model and its warnings, or every diagnostic (at least
/// one of them an error).
pub type Parsed<T> = Result<(T, Diagnostics), Diagnostics>;

/// Turns a checker run into a [`Parsed`] result.
pub(crate) fn finish<T>(value: Option<T>, diagnostics: Diagnostics) -> Parsed<T> {
    match value {
        Some(v) if !diagnostics.has_errors() => Ok((v, diagnostics)),
        _ => {
            let mut diagnostics = diagnostics;
            if !diagnostics.has_errors() {
                // The checker built no value without saying why: never hand back an empty
                // error list, a caller would print nothing and still fail.
                diagnostics.push(Diagnostic {
                    file: String::new(),
                    json_path: String::new(),
                    step_id: None,
                    message: "could not be read".into(),
                    severity: Severity::Error,
                });
            }
            Err(diagnostics)
        }
    }
}

/// Parses JSON text, reporting a syntax error with its line and column; a text of more than
/// [`MAX_FILE_VALUES`] JSON values is refused unparsed.
pub(crate) fn parse_json(text: &str, file: &str, diags: &mut Diagnostics) -> Option<Value> {
    // Counted before it is parsed: a file of many small values costs far more parsed.
    let values = json_values(text.as_bytes());
    if values > MAX_FILE_VALUES {
        diags.push(Diagnostic {
            file: file.to_string(),
            json_path: String::new(),
            step_id: None,
            message: format!(
                "holds about {values} JSON values, more than the {MAX_FILE_VALUES} Trellis \
                 parses of one file"
            ),
            severity: Severity::Error,
        });
        return None;
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v) => Some(v),
        Err(e) => {
            // serde_json appends " at line L column C" to its message; say it our way instead.
            let full = e.to_string();
            let msg = full
                .rfind(" at line ")
                .map(|i| full[..i].to_string())
                .unwrap_or(full);
            diags.push(Diagnostic {
                file: file.to_string(),
                json_path: String::new(),
                step_id: None,
                message: format!(
                    "invalid JSON at line {}, column {}: {msg}",
                    e.line(),
                    e.column()
                ),
                severity: Severity::Error,
            });
            None
        }
    }
}

/// A JSON path in the dotted form users read: `steps[3].items[1].source_sql`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JsonPath(String);

impl JsonPath {
    /// The whole document.
    pub fn root() -> Self {
        Self(String::new())
    }

    /// A path given as text, e.g. when a caller nests a schema inside another file.
    pub fn from_text(text: &str) -> Self {
        Self(text.to_string())
    }

    /// The path of a key of this object.
    pub fn key(&self, key: &str) -> Self {
        let plain = !key.is_empty()
            && key.len() <= MAX_PATH_KEY
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        let seg = if plain {
            key.to_string()
        } else if let Some((end, _)) = key.char_indices().nth(MAX_PATH_KEY) {
            // A key as long as a file allows would make every message that long.
            format!(
                "[{}...({} bytes)]",
                Value::String(key[..end].to_string()),
                key.len()
            )
        } else {
            format!("[{}]", Value::String(key.to_string()))
        };
        if self.0.is_empty() || !plain {
            Self(format!("{}{seg}", self.0))
        } else {
            Self(format!("{}.{seg}", self.0))
        }
    }

    /// The path of an element of this array.
    pub fn index(&self, i: usize) -> Self {
        Self(format!("{}[{i}]", self.0))
    }

    /// The path as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The longest key a JSON path shows whole; a longer one is cut, its length said.
const MAX_PATH_KEY: usize = 128;

/// Names a JSON value's kind the way a message should: "a string", "an array".
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The longest word or candidate [`did_you_mean`] compares.
pub const MAX_SUGGESTED_LEN: usize = 128;

/// Diagnostics of one kind that each get a search for a near name (and a line of their
/// own, where they are warnings): the rest are counted in one.
pub const MAX_HINTS: usize = 20;

/// The closest of `candidates` to `word`, when one is close enough to be a likely typo.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    // A suggestion is for a typo of a name: the distance of long texts costs the product of
    // their lengths, and is not worked out for them.
    if word.len() > MAX_SUGGESTED_LEN {
        return candidates
            .into_iter()
            .find(|c| c.eq_ignore_ascii_case(word));
    }
    let lower = word.to_ascii_lowercase();
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        if c.eq_ignore_ascii_case(word) {
            return Some(c);
        }
        if c.len() > MAX_SUGGESTED_LEN {
            continue;
        }
        let cl = c.to_ascii_lowercase();
        // A word that is a clear prefix of a key ("contract" for "contract_version") is a
        // likely abbreviation even though the edit distance is large.
        let d = if lower.len() >= 4 && cl.starts_with(&lower) {
            1
        } else if cl.len().abs_diff(lower.len()) > 3 {
            // Further than any limit below.
            continue;
        } else {
            strsim::damerau_levenshtein(&lower, &cl)
        };
        let limit = (c.len().max(word.len()) / 3).clamp(1, 3);
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

/// Where diagnostics go while one file is walked: the file name, the step being walked (so
/// every message can name it) and the list being filled.
#[derive(Debug)]
pub struct Ctx<'d> {
    file: String,
    step_id: Option<String>,
    diags: &'d mut Diagnostics,
    /// Step ids whose gate the step config holds (a plan's prevalidation item may use it).
    gated: std::collections::BTreeSet<String>,
}

impl<'d> Ctx<'d> {
    /// A context for `file` that appends to `diags`.
    pub fn new(file: &str, diags: &'d mut Diagnostics) -> Self {
        Self {
            file: file.to_string(),
            step_id: None,
            diags,
            gated: Default::default(),
        }
    }

    /// Tells the walk which steps have a `validation_schema` in the step config.
    pub fn with_gated(mut self, gated: std::collections::BTreeSet<String>) -> Self {
        self.gated = gated;
        self
    }

    /// Whether the step config holds a `validation_schema` for step `id`.
    pub fn gated(&self, id: &str) -> bool {
        self.gated.contains(id)
    }

    /// The file being walked.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// Sets the step the next diagnostics belong to; returns the previous one so nested steps
    /// (a route's sub-agent step) can restore it.
    pub fn set_step(&mut self, id: Option<String>) -> Option<String> {
        std::mem::replace(&mut self.step_id, id)
    }

    /// Records an error at `path`.
    pub fn error(&mut self, path: &JsonPath, message: impl Into<String>) {
        self.push(path, message.into(), Severity::Error);
    }

    /// Records a warning at `path`.
    pub fn warning(&mut self, path: &JsonPath, message: impl Into<String>) {
        self.push(path, message.into(), Severity::Warning);
    }

    fn push(&mut self, path: &JsonPath, message: String, severity: Severity) {
        self.diags.push(Diagnostic {
            file: self.file.clone(),
            json_path: path.as_str().to_string(),
            step_id: self.step_id.clone(),
            message,
            severity,
        });
    }

    /// Whether any error has been recorded so far (in this file or before it).
    pub fn error_count(&self) -> usize {
        self.diags.errors().count()
    }
}

/// Reads one JSON object key by key, remembering which keys were asked for so that
/// [`Obj::finish`] can report every other key as unknown, with the closest known key.
#[derive(Debug)]
pub struct Obj<'v> {
    map: &'v Map<String, Value>,
    path: JsonPath,
    known: Vec<&'static str>,
}

impl<'v> Obj<'v> {
    /// Starts reading `value` as an object; records an error and returns `None` when it is not
    /// one. `what` names the thing expected ("a step", "an item").
    pub fn new(ctx: &mut Ctx, value: &'v Value, path: JsonPath, what: &str) -> Option<Self> {
        match value {
            Value::Object(map) => Some(Self {
                map,
                path,
                known: Vec::new(),
            }),
            other => {
                ctx.error(
                    &path,
                    format!("expected {what} (an object), found {}", kind_of(other)),
                );
                None
            }
        }
    }

    /// The path of this object.
    pub fn path(&self) -> &JsonPath {
        &self.path
    }

    /// The underlying map (for keeping a value verbatim).
    pub fn map(&self) -> &'v Map<String, Value> {
        self.map
    }

    /// The raw value of `key`; `null` counts as absent (the original wrote `null` for unset
    /// optional fields).
    pub fn raw(&mut self, key: &'static str) -> Option<&'v Value> {
        if !self.known.contains(&key) {
            self.known.push(key);
        }
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// Whether `key` is present and not null, without marking it as known.
    pub fn has(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(|v| !v.is_null())
    }

    /// Whether `key` has been asked for or accepted already.
    pub fn known(&self, key: &str) -> bool {
        self.known.contains(&key)
    }

    /// Marks keys as known without reading them (accepted and ignored).
    pub fn accept(&mut self, keys: &[&'static str]) {
        for k in keys {
            if !self.known.contains(k) {
                self.known.push(k);
            }
        }
    }

    /// An optional string.
    pub fn str(&mut self, ctx: &mut Ctx, key: &'static str) -> Option<String> {
        let v = self.raw(key)?;
        match v {
            Value::String(s) => Some(s.clone()),
            other => {
                ctx.error(
                    &self.path.key(key),
                    format!("expected a string, found {}", kind_of(other)),
                );
                None
            }
        }
    }

    /// An optional number, at least 0.
    pub fn number(&mut self, ctx: &mut Ctx, key: &'static str) -> Option<f64> {
        let v = self.raw(key)?;
        match v.as_f64() {
            Some(n) if n >= 0.0 => Some(n),
            _ => {
                ctx.error(
                    &self.path.key(key),
                    format!("expected a number of 0 or more, found {}", kind_of(v)),
                );
                None
            }
        }
    }

    /// A required, non-empty string; `what` says what it is for the message.
    pub fn req_str(&mut self, ctx: &mut Ctx, key: &'static str, what: &str) -> Option<String> {
        if !self.has(key) {
            self.raw(key);
            ctx.error(
                &self.path.key(key),
                format!("missing: expected a string ({what})"),
            );
            return None;
        }
        let s = self.str(ctx, key)?;
        if s.trim().is_empty() {
            ctx.error(
                &self.path.key(key),
                format!("must not be empty: expected {what}"),
            );
            return None;
        }
        Some(s)
    }

    /// An optional boolean.
    pub fn bool(&mut self, ctx: &mut Ctx, key: &'static str) -> Option<bool> {
        match self.raw(key)? {
            Value::Bool(b) => Some(*b),
            other => {
                ctx.error(
                    &self.path.key(key),
                    format!("expected a boolean, found {}", kind_of(other)),
                );
                None
            }
        }
    }

    /// An optional non-negative integer.
    pub fn u64(&mut self, ctx: &mut Ctx, key: &'static str) -> Option<u64> {
        let v = self.raw(key)?;
        match v.as_u64() {
            Some(n) => Some(n),
            None => {
                ctx.error(
                    &self.path.key(key),
                    format!("expected a non-negative integer, found {}", describe(v)),
                );
                None
            }
        }
    }

    /// An optional number.
    pub fn f64(&mut self, ctx: &mut Ctx, key: &'static str) -> Option<f64> {
        let v = self.raw(key)?;
        match v.as_f64() {
            Some(n) => Some(n),
            None => {
                ctx.error(
                    &self.path.key(key),
                    format!("expected a number, found {}", kind_of(v)),
                );
                None
            }
        }
    }

    /// An optional list of strings; each wrong element is reported at its own index.
    pub fn str_list(&mut self, ctx: &mut Ctx, key: &'static str) -> Option<Vec<String>> {
        let v = self.raw(key)?;
        let path = self.path.key(key);
        let Value::Array(items) = v else {
            ctx.error(
                &path,
                format!("expected an array of strings, found {}", kind_of(v)),
            );
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) => out.push(s.clone()),
                other => ctx.error(
                    &path.index(i),
                    format!("expected a string, found {}", kind_of(other)),
                ),
            }
        }
        Some(out)
    }

    /// An optional array, each element handed to `each` with its path.
    pub fn list<T>(
        &mut self,
        ctx: &mut Ctx,
        key: &'static str,
        mut each: impl FnMut(&mut Ctx, &'v Value, JsonPath) -> Option<T>,
    ) -> Option<Vec<T>> {
        let v = self.raw(key)?;
        let path = self.path.key(key);
        let Value::Array(items) = v else {
            ctx.error(&path, format!("expected an array, found {}", kind_of(v)));
            return None;
        };
        Some(
            items
                .iter()
                .enumerate()
                .filter_map(|(i, item)| each(ctx, item, path.index(i)))
                .collect(),
        )
    }

    /// An optional object kept verbatim (options passed through to a provider, say).
    pub fn object(&mut self, ctx: &mut Ctx, key: &'static str) -> Option<Map<String, Value>> {
        match self.raw(key)? {
            Value::Object(m) => Some(m.clone()),
            other => {
                ctx.error(
                    &self.path.key(key),
                    format!("expected an object, found {}", kind_of(other)),
                );
                None
            }
        }
    }

    /// An optional string that must be one of `allowed`.
    pub fn one_of<T: Copy>(
        &mut self,
        ctx: &mut Ctx,
        key: &'static str,
        allowed: &[(&'static str, T)],
    ) -> Option<T> {
        let s = self.str(ctx, key)?;
        let path = self.path.key(key);
        enum_value(ctx, &path, &s, allowed)
    }

    /// Reports every key not asked for as unknown (with the closest known key), then drops
    /// the reader.
    pub fn finish(self, ctx: &mut Ctx) {
        for key in self.map.keys() {
            if self.known.contains(&key.as_str()) {
                continue;
            }
            let msg = match did_you_mean(key, self.known.iter().copied()) {
                Some(close) => {
                    format!("unknown key {} (did you mean \"{close}\"?)", quote(key))
                }
                None => format!("unknown key {}", quote(key)),
            };
            ctx.error(&self.path, msg);
        }
    }
}

/// Matches `s` against a closed set of values, reporting the choices (and the closest one).
pub fn enum_value<T: Copy>(
    ctx: &mut Ctx,
    path: &JsonPath,
    s: &str,
    allowed: &[(&'static str, T)],
) -> Option<T> {
    if let Some((_, t)) = allowed.iter().find(|(name, _)| *name == s) {
        return Some(*t);
    }
    let names: Vec<String> = allowed.iter().map(|(n, _)| format!("\"{n}\"")).collect();
    let mut msg = format!("expected one of {}, found {}", names.join(", "), quote(s));
    if let Some(close) = did_you_mean(s, allowed.iter().map(|(n, _)| *n)) {
        msg.push_str(&format!(" (did you mean \"{close}\"?)"));
    }
    ctx.error(path, msg);
    None
}

/// How many names a message lists before it says how many more there are.
pub const LISTED: usize = 20;

/// `names` joined with `sep`, the first [`LISTED`] of them and then how many more: a message
/// about a plan of thousands of steps stays a message.
pub fn listed<S: AsRef<str>>(names: &[S], sep: &str) -> String {
    let shown: Vec<&str> = names.iter().take(LISTED).map(AsRef::as_ref).collect();
    match names.len() {
        n if n <= LISTED => shown.join(sep),
        n => format!("{}{sep}and {} more", shown.join(sep), n - LISTED),
    }
}

/// A string quoted as JSON, so odd characters stay visible in a message.
pub fn quote(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// Describes a value for a message: its kind, and the value itself when it is short.
pub fn describe(v: &Value) -> String {
    match v {
        Value::Number(n) => format!("{n}"),
        Value::String(s) if s.chars().count() <= 40 => quote(s),
        Value::Bool(b) => b.to_string(),
        other => kind_of(other).to_string(),
    }
}

/// Reports `id` (a step, item or route id, which names folders and files) unless it is one
/// plain path component: not empty, not `.` or `..`, and without `/`, `\\` or control
/// characters.
pub fn check_plain_id(ctx: &mut Ctx, path: &JsonPath, what: &str, id: &str) {
    if id.len() > MAX_ID_BYTES {
        ctx.error(
            path,
            format!(
                "{what} is {} bytes long: at most {MAX_ID_BYTES} (it names files and folders, \
                 and is written into every record about it)",
                id.len()
            ),
        );
        return;
    }
    let plain = !id.is_empty()
        && id != "."
        && id != ".."
        && !id.chars().any(|c| c == '/' || c == '\\' || c.is_control());
    if !plain {
        ctx.error(
            path,
            format!(
                "{what} {} is not a plain name: it names folders and files, so it must be one \
                 path component (no /, \\, \"..\" or control characters)",
                quote(id)
            ),
        );
    }
}

/// The longest id that names files and folders (a step, a schedule, an item).
pub const MAX_ID_BYTES: usize = 128;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn did_you_mean_finds_typos_and_ignores_far_words() {
        let keys = ["source_sql", "message", "max_iterations"];
        assert_eq!(did_you_mean("source_sq", keys), Some("source_sql"));
        assert_eq!(did_you_mean("mesage", keys), Some("message"));
        assert_eq!(did_you_mean("MESSAGE", keys), Some("message"));
        assert_eq!(did_you_mean("zebra", keys), None);
        assert_eq!(
            did_you_mean("contract", ["contract_version"]),
            Some("contract_version")
        );
        // Long texts are not compared (their distance costs the product of their lengths);
        // the same text is still found.
        let (a, b) = ("a".repeat(40_000), format!("{}b", "a".repeat(39_999)));
        assert_eq!(did_you_mean(&a, [b.as_str()]), None);
        assert_eq!(did_you_mean(&a, [a.as_str()]), Some(a.as_str()));
        let near = format!("{}x", "a".repeat(MAX_SUGGESTED_LEN - 1));
        let long = "a".repeat(MAX_SUGGESTED_LEN);
        assert_eq!(did_you_mean(&near, [long.as_str()]), Some(long.as_str()));
    }

    #[test]
    fn paths_read_like_the_spec() {
        let p = JsonPath::root().key("steps").index(3).key("items").index(1);
        assert_eq!(p.key("source_sql").as_str(), "steps[3].items[1].source_sql");
        assert_eq!(JsonPath::root().key("a b").as_str(), "[\"a b\"]");
    }

    #[test]
    fn invalid_json_reports_line_and_column() {
        let mut d = Diagnostics::new();
        assert!(parse_json("{\n  \"a\": 1,\n}", "planning/plan.json", &mut d).is_none());
        assert_eq!(
            d.lines(),
            ["planning/plan.json: invalid JSON at line 3, column 1: trailing comma"]
        );
    }
}
