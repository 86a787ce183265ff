//! Evaluates `json_checks` (and db `checks`) against a JSON document.
//!
//! A check whose path selects several values applies to each of them. A check with value
//! constraints (`value_type`, lengths, bounds, `pattern`, `consistency_check`) on a path that
//! selects nothing fails, unless `must_exist` is explicitly `false`: a schema that asks for an
//! array at `$.items` does not mean "or nothing".

use serde_json::Value;

use super::report::CheckResult;
use super::schema::{ConsistencyKind, JsonCheck, first_line, parse_json_path};

/// The values one check's path may select (each gets a record in the report).
pub const MAX_SELECTED_NODES: usize = 10_000;
use crate::diagnostics::{describe, kind_of};

/// Where results go while one document is checked.
#[derive(Debug)]
pub(crate) struct Sink<'a> {
    pub file: &'a str,
    pub checks: &'a mut super::report::Kept,
    pub warnings: &'a mut Vec<String>,
}

impl Sink<'_> {
    pub fn record(
        &mut self,
        path: &str,
        kind: &str,
        passed: bool,
        expected: String,
        actual: String,
        message: String,
    ) {
        self.checks.push(CheckResult {
            file: self.file.to_string(),
            path: path.to_string(),
            kind: kind.to_string(),
            passed,
            expected,
            actual,
            message,
        });
    }
}

/// Describes a value briefly for the `actual` field.
pub(crate) fn brief(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("an array of {} item(s)", a.len()),
        Value::Object(o) => format!("an object with {} key(s)", o.len()),
        Value::String(s) if s.chars().count() > 40 => {
            let head: String = s.chars().take(40).collect();
            format!("\"{head}...\" ({} characters)", s.chars().count())
        }
        Value::Null => "null".into(),
        other => describe(other),
    }
}

fn as_f64(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// Runs one check on `doc`. `Err` is a schema error (an unparsable JSONPath): the gate cannot
/// run.
pub(crate) fn run_check(sink: &mut Sink, doc: &Value, check: &JsonCheck) -> Result<(), String> {
    sink.checks.past_deadline()?;
    let path = parse_json_path(&check.path)?;
    let compare_path = match &check.consistency_check {
        Some(c) => Some((c, parse_json_path(&c.compare_with_path)?)),
        None => None,
    };
    // The value compared with is the same for every node: looked up once.
    let compare = compare_path
        .as_ref()
        .map(|(c, other_path)| (*c, other_path.query(doc).first()));
    // Counted first without their locations (a location is as long as the node is deep).
    let selected = path.query(doc).len();
    if selected > MAX_SELECTED_NODES {
        return Err(format!(
            "JSONPath {:?} selects {selected} values of {}, more than the {MAX_SELECTED_NODES} \
             a check examines; narrow the path",
            check.path, sink.file
        ));
    }
    let located = path.query_located(doc).all();
    let has_value_checks = check.value_type.is_some()
        || check.min_length.is_some()
        || check.max_length.is_some()
        || check.min_value.is_some()
        || check.max_value.is_some()
        || check.pattern.is_some()
        || check.consistency_check.is_some();
    let required = check.must_exist.unwrap_or(has_value_checks);
    let f = sink.file;
    if located.is_empty() {
        if required {
            sink.record(
                &check.path,
                "must_exist",
                false,
                "a value at this path".into(),
                "nothing".into(),
                format!("{f}: {} is missing: add it", check.path),
            );
        }
        return Ok(());
    }
    if check.must_exist == Some(true) {
        sink.record(
            &check.path,
            "must_exist",
            true,
            "a value at this path".into(),
            format!("{} value(s)", located.len()),
            format!("{f}: {} exists", check.path),
        );
    }
    let many = located.len() > 1;
    let regex = match &check.pattern {
        Some(p) => match regex::Regex::new(p) {
            Ok(r) => Some(r),
            Err(e) => {
                sink.warnings.push(format!(
                    "{f}: {}: invalid regular expression {p:?}, pattern check skipped: {}",
                    check.path,
                    first_line(&e.to_string())
                ));
                None
            }
        },
        None => None,
    };
    for node in located {
        sink.checks.past_deadline()?;
        let at = if many {
            node.location().to_string()
        } else {
            check.path.clone()
        };
        let v = node.node();
        if let Some(t) = check.value_type {
            let ok = t.matches(v);
            sink.record(
                &at,
                "value_type",
                ok,
                t.name().into(),
                kind_of(v).into(),
                if ok {
                    format!("{f}: {at} is {}", kind_of(v))
                } else {
                    format!(
                        "{f}: {at} must be of type {}, found {}",
                        t.name(),
                        kind_of(v)
                    )
                },
            );
        }
        let len = match v {
            Value::String(s) => Some(s.chars().count() as u64),
            Value::Array(a) => Some(a.len() as u64),
            _ => None,
        };
        for (kind, bound, is_min) in [
            ("min_length", check.min_length, true),
            ("max_length", check.max_length, false),
        ] {
            let Some(bound) = bound else { continue };
            let (ok, actual) = match len {
                Some(n) => (
                    if is_min { n >= bound } else { n <= bound },
                    format!("length {n}"),
                ),
                None => (
                    false,
                    format!("{} (length applies to strings and arrays)", kind_of(v)),
                ),
            };
            let op = if is_min { ">=" } else { "<=" };
            sink.record(
                &at,
                kind,
                ok,
                format!("length {op} {bound}"),
                actual.clone(),
                if ok {
                    format!("{f}: {at} has {actual}")
                } else {
                    format!("{f}: {at} must have length {op} {bound}, found {actual}")
                },
            );
        }
        for (kind, bound, is_min) in [
            ("min_value", check.min_value, true),
            ("max_value", check.max_value, false),
        ] {
            let Some(bound) = bound else { continue };
            let (ok, actual) = match as_f64(v) {
                Some(n) => (if is_min { n >= bound } else { n <= bound }, format!("{v}")),
                None => (false, format!("{} (not a number)", brief(v))),
            };
            let op = if is_min { ">=" } else { "<=" };
            sink.record(
                &at,
                kind,
                ok,
                format!("a number {op} {bound}"),
                actual.clone(),
                if ok {
                    format!("{f}: {at} is {actual}")
                } else {
                    format!("{f}: {at} must be a number {op} {bound}, found {actual}")
                },
            );
        }
        if let (Some(re), Some(p)) = (&regex, &check.pattern) {
            let (ok, actual) = match v {
                Value::String(s) => (re.is_match(s), brief(v)),
                other => (
                    false,
                    format!("{} (pattern applies to strings)", kind_of(other)),
                ),
            };
            sink.record(
                &at,
                "pattern",
                ok,
                format!("a string matching /{p}/"),
                actual.clone(),
                if ok {
                    format!("{f}: {at} matches /{p}/")
                } else {
                    format!("{f}: {at} must match /{p}/, found {actual}")
                },
            );
        }
        if let Some((c, other)) = compare {
            let kind = c.kind.name();
            let Some(other) = other else {
                sink.record(
                    &at,
                    kind,
                    false,
                    format!("a value at {} to compare with", c.compare_with_path),
                    "nothing".into(),
                    format!(
                        "{f}: {at} is compared with {}, which is missing",
                        c.compare_with_path
                    ),
                );
                continue;
            };
            let (ok, expected) = match c.kind {
                ConsistencyKind::Equals => (same(v, other), format!("equal to {}", brief(other))),
                ConsistencyKind::GreaterThan => (
                    matches!((as_f64(v), as_f64(other)), (Some(a), Some(b)) if a > b),
                    format!("a number greater than {}", brief(other)),
                ),
                ConsistencyKind::LessThan => (
                    matches!((as_f64(v), as_f64(other)), (Some(a), Some(b)) if a < b),
                    format!("a number less than {}", brief(other)),
                ),
                // `path` names a count and `compare_with_path` an array (the original's
                // reading); the swapped form is accepted. Two arrays or two numbers say so.
                ConsistencyKind::ArrayLength => match (v, other) {
                    (Value::Array(_), Value::Array(_)) | (Value::Number(_), Value::Number(_)) => (
                        false,
                        format!(
                            "a count and an array (array_length needs one of each: a number at \
                             path and an array at compare_with_path, or the other way round; \
                             found two {}s)",
                            if v.is_array() { "array" } else { "number" }
                        ),
                    ),
                    (Value::Number(n), Value::Array(a)) | (Value::Array(a), Value::Number(n)) => {
                        let len = a.len() as f64;
                        (
                            n.as_f64() == Some(len),
                            if v.is_number() {
                                format!(
                                    "the length of the array at {} ({})",
                                    c.compare_with_path,
                                    a.len()
                                )
                            } else {
                                format!("an array of {} item(s)", brief(other))
                            },
                        )
                    }
                    _ => (
                        false,
                        format!(
                            "a count and an array (array_length compares a number with an \
                             array's length; {} is {})",
                            c.compare_with_path,
                            brief(other)
                        ),
                    ),
                },
                ConsistencyKind::InArray => (
                    other
                        .as_array()
                        .is_some_and(|a| a.iter().any(|x| same(x, v))),
                    format!("an element of {}", c.compare_with_path),
                ),
            };
            sink.record(
                &at,
                kind,
                ok,
                expected.clone(),
                brief(v),
                if ok {
                    format!("{f}: {at} is {expected}")
                } else {
                    format!(
                        "{f}: {at} must be {expected} ({} at {}), found {}",
                        kind,
                        c.compare_with_path,
                        brief(v)
                    )
                },
            );
        }
    }
    Ok(())
}
