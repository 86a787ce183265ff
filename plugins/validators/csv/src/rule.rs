//! The options of a `csv` file rule, parsed and checked before the file is read.
//!
//! A malformed rule is the schema author's mistake, not the agent's, so every
//! problem here is an `Err` naming the option instead of a failed check.

use regex::{Regex, RegexBuilder};
use serde_json::{Map, Value};

/// Keys the host owns; the plugin ignores them.
const HOST_KEYS: &[&str] = &["file_name", "must_exist", "required", "validation_type"];

/// Keys this plugin reads.
const OPTIONS: &[&str] = &[
    "columns",
    "exact_columns",
    "min_rows",
    "max_rows",
    "delimiter",
    "column_patterns",
    "unique_columns",
    "non_empty_columns",
];

/// A compiled pattern is capped so a pathological rule cannot exhaust the
/// guest's memory; real column patterns are far smaller.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// The options of one `csv` file rule.
#[derive(Debug, Default)]
pub struct Rule {
    /// Header names that must be present.
    pub columns: Vec<String>,
    /// The header must be exactly `columns`, in order.
    pub exact_columns: bool,
    /// Fewest data rows (header excluded).
    pub min_rows: Option<u64>,
    /// Most data rows (header excluded).
    pub max_rows: Option<u64>,
    /// Field separator, one ASCII byte.
    pub delimiter: u8,
    /// Column name and the pattern every value of it must match, sorted by column.
    pub column_patterns: Vec<(String, Regex)>,
    /// Columns whose non-empty values must be unique.
    pub unique_columns: Vec<String>,
    /// Columns that must have no empty values.
    pub non_empty_columns: Vec<String>,
}

impl Rule {
    /// Reads the options from the whole file rule.
    pub fn parse(rule: &Value) -> Result<Rule, String> {
        let Value::Object(map) = rule else {
            return Err(format!(
                "the csv rule must be a JSON object, got {}",
                kind_of(rule)
            ));
        };
        for key in map.keys() {
            if !HOST_KEYS.contains(&key.as_str()) && !OPTIONS.contains(&key.as_str()) {
                return Err(unknown_key(key));
            }
        }
        let columns = names(map, "columns")?.unwrap_or_default();
        if let Some(dup) = first_duplicate(&columns) {
            return Err(format!("`columns` lists `{dup}` twice"));
        }
        let exact_columns = match map.get("exact_columns") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(format!(
                    "`exact_columns` must be true or false, got {}",
                    kind_of(other)
                ));
            }
        };
        if exact_columns && !map.contains_key("columns") {
            return Err(
                "`exact_columns` is true but `columns` is missing: list the header names in order"
                    .to_string(),
            );
        }
        let min_rows = count(map, "min_rows")?;
        let max_rows = count(map, "max_rows")?;
        if let (Some(min), Some(max)) = (min_rows, max_rows)
            && min > max
        {
            return Err(format!(
                "`min_rows` ({min}) is larger than `max_rows` ({max})"
            ));
        }
        Ok(Rule {
            columns,
            exact_columns,
            min_rows,
            max_rows,
            delimiter: delimiter(map)?,
            column_patterns: patterns(map)?,
            unique_columns: names(map, "unique_columns")?.unwrap_or_default(),
            non_empty_columns: names(map, "non_empty_columns")?.unwrap_or_default(),
        })
    }
}

/// A list of column names, or `None` when the option is absent.
fn names(map: &Map<String, Value>, key: &str) -> Result<Option<Vec<String>>, String> {
    let Some(value) = map.get(key) else {
        return Ok(None);
    };
    let Value::Array(items) = value else {
        return Err(format!(
            "`{key}` must be a list of column names, got {}",
            kind_of(value)
        ));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::String(s) if !s.is_empty() => out.push(s.clone()),
            Value::String(_) => return Err(format!("`{key}[{i}]` is an empty column name")),
            other => {
                return Err(format!(
                    "`{key}[{i}]` must be a column name (a string), got {}",
                    kind_of(other)
                ));
            }
        }
    }
    Ok(Some(out))
}

fn count(map: &Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
    match map.get(key) {
        None => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or_else(|| {
            format!(
                "`{key}` must be a whole number of rows, 0 or more, got {}",
                kind_of(value)
            )
        }),
    }
}

fn delimiter(map: &Map<String, Value>) -> Result<u8, String> {
    let Some(value) = map.get("delimiter") else {
        return Ok(b',');
    };
    let help = "`delimiter` must be one ASCII character such as \",\", \";\" or \"\\t\"";
    let Value::String(s) = value else {
        return Err(format!("{help}, got {}", kind_of(value)));
    };
    match s.as_bytes() {
        [b'"' | b'\n' | b'\r'] => Err(format!("{help}; {s:?} cannot separate fields")),
        [b] if b.is_ascii() => Ok(*b),
        _ => Err(format!("{help}, got {s:?}")),
    }
}

fn patterns(map: &Map<String, Value>) -> Result<Vec<(String, Regex)>, String> {
    let Some(value) = map.get("column_patterns") else {
        return Ok(Vec::new());
    };
    let Value::Object(entries) = value else {
        return Err(format!(
            "`column_patterns` must be an object of column name to regex, \
             e.g. {{\"id\": \"^T-[0-9]+$\"}}, got {}",
            kind_of(value)
        ));
    };
    let mut out = Vec::with_capacity(entries.len());
    for (column, pattern) in entries {
        if column.is_empty() {
            return Err("`column_patterns` has an empty column name".to_string());
        }
        let Value::String(pattern) = pattern else {
            return Err(format!(
                "`column_patterns.{column}` must be a regex (a string), got {}",
                kind_of(pattern)
            ));
        };
        let regex = RegexBuilder::new(pattern)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| format!("`column_patterns.{column}` is not a valid regex: {e}"))?;
        out.push((column.clone(), regex));
    }
    Ok(out)
}

fn unknown_key(key: &str) -> String {
    let best = OPTIONS
        .iter()
        .chain(HOST_KEYS)
        .map(|known| (edit_distance(key, known), *known))
        .min();
    let hint = match best {
        Some((distance, known)) if distance <= 3.max(key.len() / 3) => {
            format!("; did you mean `{known}`?")
        }
        _ => String::new(),
    };
    format!(
        "unknown csv option `{key}`{hint} (known options: {})",
        OPTIONS.join(", ")
    )
}

/// Levenshtein distance, case-insensitive, so `Min_Rows` still finds `min_rows`.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.to_lowercase().chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

fn first_duplicate(names: &[String]) -> Option<&str> {
    names
        .iter()
        .enumerate()
        .find(|(i, name)| names[..*i].contains(name))
        .map(|(_, name)| name.as_str())
}

fn kind_of(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "a list".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(rule: Value) -> String {
        Rule::parse(&rule).expect_err("rule should be rejected")
    }

    #[test]
    fn defaults_and_host_keys() {
        let rule = Rule::parse(&json!({
            "file_name": "t.csv", "must_exist": true, "required": true, "validation_type": "csv"
        }))
        .unwrap();
        assert_eq!(rule.delimiter, b',');
        assert!(!rule.exact_columns);
        assert!(rule.columns.is_empty() && rule.column_patterns.is_empty());
        assert_eq!((rule.min_rows, rule.max_rows), (None, None));
    }

    #[test]
    fn reads_every_option() {
        let rule = Rule::parse(&json!({
            "columns": ["id", "title"], "exact_columns": true, "min_rows": 1, "max_rows": 9,
            "delimiter": "\t", "column_patterns": {"id": "^T-[0-9]+$"},
            "unique_columns": ["id"], "non_empty_columns": ["title"]
        }))
        .unwrap();
        assert_eq!(rule.columns, ["id", "title"]);
        assert!(rule.exact_columns);
        assert_eq!((rule.min_rows, rule.max_rows), (Some(1), Some(9)));
        assert_eq!(rule.delimiter, b'\t');
        assert_eq!(rule.column_patterns[0].0, "id");
        assert!(rule.column_patterns[0].1.is_match("T-12"));
        assert_eq!(rule.unique_columns, ["id"]);
        assert_eq!(rule.non_empty_columns, ["title"]);
    }

    #[test]
    fn unknown_key_suggests_the_closest_option() {
        let e = err(json!({"min_row": 1}));
        assert!(
            e.contains("`min_row`") && e.contains("did you mean `min_rows`?"),
            "{e}"
        );
        let e = err(json!({"uniqe_columns": ["id"]}));
        assert!(e.contains("did you mean `unique_columns`?"), "{e}");
        let e = err(json!({"colour": "red"}));
        assert!(
            e.contains("unknown csv option `colour`") && !e.contains("did you mean"),
            "{e}"
        );
    }

    #[test]
    fn wrong_types_name_the_option() {
        assert!(err(json!({"columns": "id"})).starts_with("`columns` must be a list"));
        assert!(err(json!({"columns": ["id", 3]})).starts_with("`columns[1]`"));
        assert!(err(json!({"columns": ["id", "id"]})).contains("`id` twice"));
        assert!(err(json!({"exact_columns": "yes"})).starts_with("`exact_columns`"));
        assert!(err(json!({"exact_columns": true})).contains("`columns` is missing"));
        assert!(err(json!({"min_rows": -1})).starts_with("`min_rows`"));
        assert!(err(json!({"max_rows": 2.5})).starts_with("`max_rows`"));
        assert!(err(json!({"min_rows": 5, "max_rows": 2})).contains("larger than `max_rows`"));
        assert!(err(json!({"unique_columns": [""]})).starts_with("`unique_columns[0]`"));
        assert!(err(json!({"non_empty_columns": {}})).starts_with("`non_empty_columns`"));
        assert!(err(json!({"column_patterns": ["id"]})).starts_with("`column_patterns`"));
        assert!(err(json!({"column_patterns": {"id": 1}})).starts_with("`column_patterns.id`"));
        assert!(err(json!([1])).contains("JSON object"));
    }

    #[test]
    fn invalid_regex_names_the_column() {
        let e = err(json!({"column_patterns": {"id": "^T-[0-9+$"}}));
        assert!(
            e.starts_with("`column_patterns.id` is not a valid regex"),
            "{e}"
        );
    }

    #[test]
    fn delimiter_must_be_one_ascii_character() {
        for bad in [
            json!(";;"),
            json!(""),
            json!("é"),
            json!("\""),
            json!("\n"),
            json!(44),
        ] {
            let e = err(json!({ "delimiter": bad }));
            assert!(
                e.starts_with("`delimiter` must be one ASCII character"),
                "{e}"
            );
        }
        assert_eq!(
            Rule::parse(&json!({"delimiter": ";"})).unwrap().delimiter,
            b';'
        );
    }
}
