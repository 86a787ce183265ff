//! The `validation_schema` model (spec section 5) and its checker.
//!
//! A schema appears at the top level of a step, in a step config entry, and in a prevalidation
//! item; all three go through [`parse_schema`], so a schema mistake is reported when the plan is
//! loaded, not when the gate first runs.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::diagnostics::{Ctx, JsonPath, Obj, Parsed, quote};

/// At most this many file rules in one schema.
pub const MAX_FILES: usize = 20;
/// At most this many JSON checks in one file rule (or one db rule).
pub const MAX_CHECKS_PER_FILE: usize = 100;
/// JSON files larger than this are not parsed by the gate.
pub const MAX_JSON_BYTES: u64 = 10 * 1024 * 1024;

/// A step's deterministic acceptance contract: rules on output files and on the workflow
/// database.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ValidationSchema {
    /// Rules on files.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileRule>,
    /// Rules on `db/db.sqlite`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub db: Vec<DbRule>,
}

impl ValidationSchema {
    /// Whether the schema has no rule at all (the gate is skipped and passes).
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.db.is_empty()
    }
}

/// A rule on one file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileRule {
    /// A bare name (or a relative path) in the step output folder, or `db/...` /
    /// `knowledgebase/...` from the workspace root.
    pub file_name: String,
    /// The file must exist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub must_exist: Option<bool>,
    /// Doc-era spelling of `must_exist`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
    /// `json` (the file must parse as JSON) or the type of a custom validator plugin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation_type: Option<String>,
    /// Checks on the file's JSON content.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub json_checks: Vec<JsonCheck>,
    /// The options of a custom validator: every other key of a rule whose `validation_type`
    /// is not `json`, passed to the plugin untouched.
    #[serde(flatten)]
    pub options: Map<String, Value>,
}

impl FileRule {
    /// Whether the file must exist (`must_exist`, else the doc-era `required`).
    pub fn must_exist(&self) -> bool {
        self.must_exist.or(self.required).unwrap_or(false)
    }

    /// The custom validator type, when the rule names one other than `json`.
    pub fn custom_type(&self) -> Option<&str> {
        self.validation_type.as_deref().filter(|t| *t != "json")
    }

    /// Whether the file must be parsed as JSON.
    pub fn needs_json(&self) -> bool {
        self.validation_type.as_deref() == Some("json") || !self.json_checks.is_empty()
    }
}

/// The JSON types `value_type` can require.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueType {
    /// A JSON string.
    String,
    /// A JSON number.
    Number,
    /// `true` or `false`.
    Boolean,
    /// A JSON array.
    Array,
    /// A JSON object.
    Object,
}

impl ValueType {
    /// The name used in schemas.
    pub fn name(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Number => "number",
            Self::Boolean => "boolean",
            Self::Array => "array",
            Self::Object => "object",
        }
    }

    /// Whether `v` has this type.
    pub fn matches(self, v: &Value) -> bool {
        matches!(
            (self, v),
            (Self::String, Value::String(_))
                | (Self::Number, Value::Number(_))
                | (Self::Boolean, Value::Bool(_))
                | (Self::Array, Value::Array(_))
                | (Self::Object, Value::Object(_))
        )
    }
}

const VALUE_TYPES: &[(&str, ValueType)] = &[
    ("string", ValueType::String),
    ("number", ValueType::Number),
    ("boolean", ValueType::Boolean),
    ("array", ValueType::Array),
    ("object", ValueType::Object),
];

/// One check on the values a JSONPath selects.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JsonCheck {
    /// An RFC 9535 JSONPath, starting with `$`.
    pub path: String,
    /// At least one value must be selected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub must_exist: Option<bool>,
    /// Every selected value must have this type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_type: Option<ValueType>,
    /// Minimum length of selected strings (in characters) and arrays.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_length: Option<u64>,
    /// Maximum length of selected strings (in characters) and arrays.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u64>,
    /// Minimum of selected numbers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_value: Option<f64>,
    /// Maximum of selected numbers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_value: Option<f64>,
    /// A regular expression selected strings must match (anywhere, unless anchored).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// A comparison with the value at another path of the same document.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consistency_check: Option<ConsistencyCheck>,
}

/// How a consistency check compares two values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsistencyKind {
    /// The two values are equal (numbers compare by value: `1` equals `1.0`).
    Equals,
    /// This number is greater than the other.
    GreaterThan,
    /// This number is less than the other.
    LessThan,
    /// This array has as many elements as the other value says: the other is a number, or an
    /// array whose length is compared.
    ArrayLength,
    /// This value is an element of the other array.
    InArray,
}

impl ConsistencyKind {
    /// The name used in schemas.
    pub fn name(self) -> &'static str {
        match self {
            Self::Equals => "equals",
            Self::GreaterThan => "greater_than",
            Self::LessThan => "less_than",
            Self::ArrayLength => "array_length",
            Self::InArray => "in_array",
        }
    }
}

const CONSISTENCY_KINDS: &[(&str, ConsistencyKind)] = &[
    ("equals", ConsistencyKind::Equals),
    ("greater_than", ConsistencyKind::GreaterThan),
    ("less_than", ConsistencyKind::LessThan),
    ("array_length", ConsistencyKind::ArrayLength),
    ("in_array", ConsistencyKind::InArray),
];

/// `consistency_check`: compare the value at `path` with the value at `compare_with_path`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConsistencyCheck {
    /// The comparison.
    #[serde(rename = "type")]
    pub kind: ConsistencyKind,
    /// The JSONPath of the value compared against, in the same document.
    pub compare_with_path: String,
}

/// A rule on the workflow database.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DbRule {
    /// A label for reports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// One read-only SQL statement.
    pub sql: String,
    /// At least this many rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_rows: Option<u64>,
    /// At most this many rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_rows: Option<u64>,
    /// Checks on the first row, seen as an object keyed by column name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<JsonCheck>,
}

impl DbRule {
    /// The label used in reports: the name, else the SQL.
    pub fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.sql)
    }
}

/// Parses a schema file on its own (`trellis schema validation` users editing one by hand).
pub fn parse_schema_text(text: &str, file: &str) -> Parsed<ValidationSchema> {
    let mut diags = crate::diagnostics::Diagnostics::new();
    let value = crate::diagnostics::parse_json(text, file, &mut diags);
    let schema = value.and_then(|v| {
        let mut ctx = Ctx::new(file, &mut diags);
        parse_schema(&mut ctx, &v, JsonPath::root())
    });
    crate::diagnostics::finish(schema, diags)
}

/// Checks and reads a `validation_schema` value found at `path`. Every problem is recorded in
/// `ctx`; `None` only when the value is not an object at all.
pub fn parse_schema(ctx: &mut Ctx, value: &Value, path: JsonPath) -> Option<ValidationSchema> {
    let mut obj = Obj::new(ctx, value, path, "a validation schema")?;
    let files = obj.list(ctx, "files", parse_file_rule).unwrap_or_default();
    if files.len() > MAX_FILES {
        ctx.error(
            &obj.path().key("files"),
            format!(
                "too many file rules: {} (at most {MAX_FILES} per schema)",
                files.len()
            ),
        );
    }
    let db = obj.list(ctx, "db", parse_db_rule).unwrap_or_default();
    obj.finish(ctx);
    Some(ValidationSchema { files, db })
}

fn parse_file_rule(ctx: &mut Ctx, value: &Value, path: JsonPath) -> Option<FileRule> {
    let mut obj = Obj::new(ctx, value, path, "a file rule")?;
    let file_name = obj.req_str(ctx, "file_name", "the file to check");
    if let Some(name) = &file_name
        && let Err(why) = trellis_sandbox::store::check_relative(name)
    {
        ctx.error(&obj.path().key("file_name"), why);
    }
    let must_exist = obj.bool(ctx, "must_exist");
    let required = obj.bool(ctx, "required");
    let validation_type = obj.str(ctx, "validation_type");
    if validation_type.as_deref() == Some("") {
        ctx.error(
            &obj.path().key("validation_type"),
            "must not be empty: expected \"json\" or the type of a custom validator",
        );
    }
    let json_checks = obj
        .list(ctx, "json_checks", parse_check)
        .unwrap_or_default();
    check_count(ctx, &obj.path().key("json_checks"), json_checks.len());
    let custom = validation_type.as_deref().is_some_and(|t| t != "json");
    let mut options = Map::new();
    if custom {
        // A custom validator reads its own options; we cannot know their names.
        for (k, v) in obj.map() {
            if !matches!(
                k.as_str(),
                "file_name" | "must_exist" | "required" | "validation_type" | "json_checks"
            ) {
                options.insert(k.clone(), v.clone());
            }
        }
    } else {
        obj.finish(ctx);
    }
    Some(FileRule {
        file_name: file_name?,
        must_exist,
        required,
        validation_type,
        json_checks,
        options,
    })
}

fn check_count(ctx: &mut Ctx, path: &JsonPath, n: usize) {
    if n > MAX_CHECKS_PER_FILE {
        ctx.error(
            path,
            format!("too many checks: {n} (at most {MAX_CHECKS_PER_FILE} per rule)"),
        );
    }
}

fn parse_db_rule(ctx: &mut Ctx, value: &Value, path: JsonPath) -> Option<DbRule> {
    let mut obj = Obj::new(ctx, value, path, "a db rule")?;
    let name = obj.str(ctx, "name");
    let sql = obj.req_str(ctx, "sql", "one read-only SQL statement");
    let min_rows = obj.u64(ctx, "min_rows");
    let max_rows = obj.u64(ctx, "max_rows");
    if let (Some(lo), Some(hi)) = (min_rows, max_rows)
        && lo > hi
    {
        ctx.error(
            obj.path(),
            format!("min_rows ({lo}) is greater than max_rows ({hi})"),
        );
    }
    let checks = obj.list(ctx, "checks", parse_check).unwrap_or_default();
    check_count(ctx, &obj.path().key("checks"), checks.len());
    obj.finish(ctx);
    Some(DbRule {
        name,
        sql: sql?,
        min_rows,
        max_rows,
        checks,
    })
}

/// Checks a JSONPath expression; returns the message to report when it is not valid.
pub fn check_json_path(p: &str) -> Result<(), String> {
    if !p.starts_with('$') {
        let hint = if p.is_empty() {
            String::new()
        } else {
            format!(" (did you mean \"$.{}\"?)", p.trim_start_matches('.'))
        };
        return Err(format!(
            "expected a JSONPath starting with \"$\" (RFC 9535), found {}{hint}",
            quote(p)
        ));
    }
    parse_json_path(p).map(|_| ())
}

/// The longest JSONPath a check may have, in bytes.
pub const MAX_JSON_PATH_BYTES: usize = 4096;

/// How deep the brackets and parentheses of a JSONPath may nest (the parser recurses once
/// per level: far deeper paths overflowed the host's stack).
pub const MAX_JSON_PATH_NESTING: usize = 32;

/// Parses a check's JSONPath after bounding what its evaluation may cost: at most
/// [`MAX_JSON_PATH_BYTES`] bytes, brackets and parentheses [`MAX_JSON_PATH_NESTING`] deep, and
/// one descendant segment (`..`) at most (each more multiplies the nodes selected by the
/// document's depth).
pub fn parse_json_path(p: &str) -> Result<serde_json_path::JsonPath, String> {
    if p.len() > MAX_JSON_PATH_BYTES {
        return Err(format!(
            "a JSONPath of {} bytes: a check's path may be {MAX_JSON_PATH_BYTES} bytes at most",
            p.len()
        ));
    }
    let (mut depth, mut deepest, mut descendants) = (0usize, 0usize, 0usize);
    let mut quote_char: Option<char> = None;
    let mut escaped = false;
    let mut previous = '\0';
    let mut word = String::new();
    let mut regex_function = None;
    for c in p.chars() {
        if let Some(q) = quote_char {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                _ if c == q => quote_char = None,
                _ => {}
            }
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            if c == '(' && (word == "match" || word == "search") {
                regex_function.get_or_insert_with(|| word.clone());
            }
            word.clear();
        }
        match c {
            '\'' | '"' => quote_char = Some(c),
            '(' | '[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            ')' | ']' => depth = depth.saturating_sub(1),
            '.' if previous == '.' => {
                descendants += 1;
                // `...` counts once.
                previous = '\0';
                continue;
            }
            _ => {}
        }
        previous = c;
    }
    if deepest > MAX_JSON_PATH_NESTING {
        return Err(format!(
            "JSONPath {}: brackets and parentheses nest {deepest} deep, more than the \
             {MAX_JSON_PATH_NESTING} a check's path may",
            quote(&p.chars().take(80).collect::<String>())
        ));
    }
    if let Some(function) = regex_function {
        // The filter functions compile their pattern again for every value they test.
        return Err(format!(
            "JSONPath {}: {function}() is not run in a check's path; select the values and \
             give the check a `pattern` instead",
            quote(p)
        ));
    }
    if descendants > 1 {
        return Err(format!(
            "JSONPath {}: {descendants} descendant segments (`..`); a check's path may have one",
            quote(p)
        ));
    }
    serde_json_path::JsonPath::parse(p).map_err(|e| format!("invalid JSONPath {}: {e}", quote(p)))
}

fn parse_check(ctx: &mut Ctx, value: &Value, path: JsonPath) -> Option<JsonCheck> {
    let mut obj = Obj::new(ctx, value, path, "a JSON check")?;
    let jpath = obj.req_str(ctx, "path", "a JSONPath such as \"$.items\"");
    if let Some(p) = &jpath
        && let Err(why) = check_json_path(p)
    {
        ctx.error(&obj.path().key("path"), why);
    }
    let must_exist = obj.bool(ctx, "must_exist");
    let value_type = obj.one_of(ctx, "value_type", VALUE_TYPES);
    let min_length = obj.u64(ctx, "min_length");
    let max_length = obj.u64(ctx, "max_length");
    let min_value = obj.f64(ctx, "min_value");
    let max_value = obj.f64(ctx, "max_value");
    if let (Some(lo), Some(hi)) = (min_length, max_length)
        && lo > hi
    {
        ctx.error(
            obj.path(),
            format!("min_length ({lo}) is greater than max_length ({hi})"),
        );
    }
    if let (Some(lo), Some(hi)) = (min_value, max_value)
        && lo > hi
    {
        ctx.error(
            obj.path(),
            format!("min_value ({lo}) is greater than max_value ({hi})"),
        );
    }
    let mut pattern = obj.str(ctx, "pattern");
    if let Some(p) = &pattern
        && let Some(single) = undouble_escapes(p)
    {
        ctx.warning(
            &obj.path().key("pattern"),
            format!(
                "doubled backslashes read as single ones, as the original does: {} is used as {} \
                 (write one backslash in the regex, two in the JSON text)",
                serde_json::Value::String(p.clone()),
                serde_json::Value::String(single.clone()),
            ),
        );
        pattern = Some(single);
    }
    if let Some(p) = &pattern
        && let Err(e) = regex::Regex::new(p)
    {
        ctx.warning(
            &obj.path().key("pattern"),
            format!(
                "invalid regular expression, the pattern check will be skipped: {}",
                first_line(&e.to_string())
            ),
        );
    }
    let consistency_check = obj
        .raw("consistency_check")
        .and_then(|v| parse_consistency(ctx, v, obj.path().key("consistency_check")));
    obj.finish(ctx);
    Some(JsonCheck {
        path: jpath?,
        must_exist,
        value_type,
        min_length,
        max_length,
        min_value,
        max_value,
        pattern,
        consistency_check,
    })
}

fn parse_consistency(ctx: &mut Ctx, value: &Value, path: JsonPath) -> Option<ConsistencyCheck> {
    let mut obj = Obj::new(ctx, value, path, "a consistency check")?;
    let kind = if obj.has("type") {
        obj.one_of(ctx, "type", CONSISTENCY_KINDS)
    } else {
        obj.raw("type");
        ctx.error(
            &obj.path().key("type"),
            "missing: expected one of \"equals\", \"greater_than\", \"less_than\", \"array_length\", \"in_array\"",
        );
        None
    };
    let other = obj.req_str(ctx, "compare_with_path", "the JSONPath to compare with");
    if let Some(p) = &other
        && let Err(why) = check_json_path(p)
    {
        ctx.error(&obj.path().key("compare_with_path"), why);
    }
    obj.finish(ctx);
    Some(ConsistencyCheck {
        kind: kind?,
        compare_with_path: other?,
    })
}

/// The first line of a multi-line message (regex errors draw a caret diagram below it).
pub(crate) fn first_line(s: &str) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    // regex's messages end with "error: <what>"; that is the part a user needs.
    lines
        .iter()
        .rev()
        .find(|l| l.starts_with("error:"))
        .map(|l| l.trim_start_matches("error:").trim().to_string())
        .unwrap_or_else(|| lines.first().map(|l| l.to_string()).unwrap_or_default())
}

/// A pattern with escapes written twice (`\\d`, `\\s`, `\\.` in the regex, as
/// model-written schemas often have them) with each such escape written once; `None` when
/// it has none. A doubled backslash before anything else (a literal backslash) is kept.
pub fn undouble_escapes(pattern: &str) -> Option<String> {
    const ESCAPED: &str = "dDsSwWbB.()[]{}+*?|^$/-ntr";
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len());
    let mut changed = false;
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '\\' && i + 1 < chars.len() {
            if chars[i + 1] == '\\' && i + 2 < chars.len() && ESCAPED.contains(chars[i + 2]) {
                out.push('\\');
                out.push(chars[i + 2]);
                changed = true;
                i += 3;
                continue;
            }
            // An escape written once (`\d`, or `\\` for a literal backslash): kept whole.
            out.push(chars[i]);
            out.push(chars[i + 1]);
            i += 2;
            continue;
        }
        out.push(chars[i]);
        i += 1;
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostics::Diagnostics;

    #[test]
    fn doubled_escapes_are_undoubled() {
        assert_eq!(
            undouble_escapes(r"^\\d+\\s\\.x$").as_deref(),
            Some(r"^\d+\s\.x$")
        );
        assert_eq!(undouble_escapes(r"^\d+$"), None);
        // A doubled backslash before a plain letter stays.
        assert_eq!(undouble_escapes(r"C:\\Users"), None);
    }

    fn errors(text: &str) -> Vec<String> {
        match parse_schema_text(text, "schema.json") {
            Ok((_, w)) => w.lines(),
            Err(d) => d.lines(),
        }
    }

    #[test]
    fn spec_example_parses() {
        let text = r#"{ "files": [ { "file_name": "report.json", "must_exist": true,
               "json_checks": [ { "path": "$.items", "must_exist": true, "value_type": "array", "min_length": 1 } ] } ],
  "db": [ { "name": "rows written", "sql": "SELECT count(*) AS n FROM findings", "min_rows": 1,
            "checks": [ { "path": "$.n", "min_value": 1 } ] } ] }"#;
        let (s, w) = parse_schema_text(text, "schema.json").unwrap();
        assert!(w.is_empty());
        assert_eq!(s.files[0].json_checks[0].value_type, Some(ValueType::Array));
        assert_eq!(s.db[0].checks[0].min_value, Some(1.0));
    }

    #[test]
    fn custom_rule_keeps_its_options() {
        let text = r#"{"files":[{"file_name":"a.csv","validation_type":"csv","columns":["id"]}]}"#;
        let (s, _) = parse_schema_text(text, "schema.json").unwrap();
        assert_eq!(s.files[0].options["columns"], serde_json::json!(["id"]));
        let back = serde_json::to_value(&s).unwrap();
        assert_eq!(back, serde_json::from_str::<Value>(text).unwrap());
    }

    #[test]
    fn invalid_regex_is_a_warning() {
        let text =
            r#"{"files":[{"file_name":"a.json","json_checks":[{"path":"$.a","pattern":"("}]}]}"#;
        let (_, w) = parse_schema_text(text, "schema.json").unwrap();
        assert_eq!(
            w.lines(),
            [
                "schema.json: files[0].json_checks[0].pattern: invalid regular expression, the pattern check will be skipped: unclosed group"
            ]
        );
    }

    #[test]
    fn limits_are_errors() {
        let many: Vec<String> = (0..21)
            .map(|i| format!(r#"{{"file_name":"f{i}.json"}}"#))
            .collect();
        let text = format!(r#"{{"files":[{}]}}"#, many.join(","));
        assert_eq!(
            errors(&text),
            ["schema.json: files: too many file rules: 21 (at most 20 per schema)"]
        );
        let checks: Vec<&str> = (0..101).map(|_| r#"{"path":"$"}"#).collect();
        let text = format!(
            r#"{{"files":[{{"file_name":"a.json","json_checks":[{}]}}]}}"#,
            checks.join(",")
        );
        assert_eq!(
            errors(&text),
            ["schema.json: files[0].json_checks: too many checks: 101 (at most 100 per rule)"]
        );
    }

    #[test]
    fn all_errors_of_a_schema_are_reported() {
        let text = r#"{"files":[{"file_name":"../x.json","must_exst":true,
            "json_checks":[{"path":"items","value_type":"list"}]}],"dbs":[]}"#;
        let mut d = Diagnostics::new();
        let _ = crate::diagnostics::parse_json(text, "s", &mut d);
        assert_eq!(
            errors(text),
            [
                "schema.json: files[0].file_name: must stay inside the workspace: \"..\" is not allowed, found \"../x.json\"",
                "schema.json: files[0].json_checks[0].path: expected a JSONPath starting with \"$\" (RFC 9535), found \"items\" (did you mean \"$.items\"?)",
                "schema.json: files[0].json_checks[0].value_type: expected one of \"string\", \"number\", \"boolean\", \"array\", \"object\", found \"list\"",
                "schema.json: files[0]: unknown key \"must_exst\" (did you mean \"must_exist\"?)",
                "schema.json: unknown key \"dbs\" (did you mean \"db\"?)",
            ]
        );
    }
}
