//! Foreach messages: Go `text/template` with the row bound to `.` (spec section 4).
//!
//! Rendering uses the `gtmpl` crate (Go's template language for Rust: actions, pipelines,
//! `if`/`range`/`with`, the builtin functions). Go prints a missing key of a map as
//! `<no value>`; the spec wants zero values, so the fields a template names are filled with
//! empty strings before rendering, and a SQL `NULL` renders empty too. Both are falsy in
//! `{{if}}`, as they would be in Go.

use std::collections::HashMap;

use anyhow::{Result, anyhow};
use gtmpl::{Context, Template, Value as TValue};
use serde_json::{Map, Value};
use trellis_workflow::go_template;
use trellis_workflow::template_fields::field_chains;

/// What Go (and gtmpl) print for a missing map key.
const NO_VALUE: &str = "<no value>";

/// A parsed foreach message.
pub struct MessageTemplate {
    item_id: String,
    source: String,
    template: Template,
    /// Field chains the template names (`.a.b` -> `["a", "b"]`), filled when missing.
    fields: Vec<Vec<String>>,
}

impl MessageTemplate {
    /// Parses the `message` of foreach item `item_id`. A syntax error names the item.
    pub fn parse(item_id: &str, source: &str) -> Result<Self> {
        let template = go_template::parse(source).map_err(|e| {
            anyhow!("foreach item {item_id:?}: the message is not a valid Go template: {e}")
        })?;
        Ok(MessageTemplate {
            item_id: item_id.to_string(),
            source: source.to_string(),
            template,
            fields: field_chains(source),
        })
    }

    /// Renders the message for one row. Missing keys and `NULL`s render empty; an error
    /// names the item and the row number (1-based).
    pub fn render(&self, row_number: usize, row: &Map<String, Value>) -> Result<String> {
        let mut row = row.clone();
        for chain in &self.fields {
            fill_missing(&mut row, chain);
        }
        let data = to_tvalue(&Value::Object(row.clone()));
        let text = go_template::render(&self.template, &Context::from(data)).map_err(|e| {
            anyhow!(
                "foreach item {:?}, row {row_number}: the message cannot be rendered: {e}",
                self.item_id
            )
        })?;
        // A key the scan above could not see (inside `with`/`range`, or through a variable)
        // still prints Go's `<no value>`; drop it unless the template or the row has that text.
        if text.contains(NO_VALUE)
            && !self.source.contains(NO_VALUE)
            && !Value::Object(row).to_string().contains(NO_VALUE)
        {
            return Ok(text.replace(NO_VALUE, ""));
        }
        Ok(text)
    }
}

impl std::fmt::Debug for MessageTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageTemplate")
            .field("item_id", &self.item_id)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// Parses and renders in one go.
pub fn render_message(item_id: &str, source: &str, row: &Map<String, Value>) -> Result<String> {
    MessageTemplate::parse(item_id, source)?.render(1, row)
}

fn fill_missing(row: &mut Map<String, Value>, chain: &[String]) {
    let Some((first, rest)) = chain.split_first() else {
        return;
    };
    match row.get_mut(first) {
        None if rest.is_empty() => {
            row.insert(first.clone(), Value::String(String::new()));
        }
        None => {
            let mut inner = Map::new();
            fill_missing(&mut inner, rest);
            row.insert(first.clone(), Value::Object(inner));
        }
        Some(Value::Object(inner)) => fill_missing(inner, rest),
        Some(_) => {}
    }
}

fn to_tvalue(v: &Value) -> TValue {
    match v {
        Value::Null => TValue::String(String::new()),
        Value::Bool(b) => TValue::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                TValue::from(i)
            } else if let Some(u) = n.as_u64() {
                TValue::from(u)
            } else {
                TValue::from(n.as_f64().unwrap_or(0.0))
            }
        }
        Value::String(s) => TValue::String(s.clone()),
        Value::Array(a) => TValue::Array(a.iter().map(to_tvalue).collect()),
        Value::Object(o) => TValue::Map(
            o.iter()
                .map(|(k, v)| (k.clone(), to_tvalue(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn rows_render_with_go_syntax() {
        let r = row(
            json!({"id": 7, "title": "Printer on fire", "score": 0.5, "urgent": true,
                            "meta": {"queue": "ops"}, "tags": ["a", "b"]}),
        );
        let cases = [
            ("Ticket {{.id}}: {{.title}}", "Ticket 7: Printer on fire"),
            ("{{ .id }}/{{.score}}", "7/0.5"),
            (
                "{{if .urgent}}URGENT {{end}}{{.title}}",
                "URGENT Printer on fire",
            ),
            ("{{.meta.queue}}", "ops"),
            ("{{range .tags}}[{{.}}]{{end}}", "[a][b]"),
            ("{{with .meta}}{{.queue}}{{end}}", "ops"),
            ("{{printf \"%d-%s\" .id .title}}", "7-Printer on fire"),
            ("{{len .tags}} tags", "2 tags"),
            ("{{if eq .id 7}}seven{{else}}other{{end}}", "seven"),
            ("{{\"{{.nope}}\"}}", "{{.nope}}"),
        ];
        for (source, want) in cases {
            assert_eq!(render_message("t", source, &r).unwrap(), want, "{source}");
        }
    }

    #[test]
    fn missing_keys_and_nulls_render_empty() {
        let r = row(json!({"id": 1, "note": null, "meta": {"other": 1}}));
        let cases = [
            ("[{{.missing}}]", "[]"),
            ("[{{.note}}]", "[]"),
            ("[{{.deep.er.path}}]", "[]"),
            ("[{{.meta.queue}}]", "[]"),
            ("{{if .missing}}yes{{else}}no{{end}}", "no"),
            ("{{if .note}}yes{{else}}no{{end}}", "no"),
            ("{{with .meta}}[{{.queue}}]{{end}}", "[]"),
            ("{{.id}}{{.missing}}", "1"),
        ];
        for (source, want) in cases {
            assert_eq!(render_message("t", source, &r).unwrap(), want, "{source}");
        }
        // Text that really says `<no value>` is kept.
        let r = row(json!({"x": "<no value>"}));
        assert_eq!(render_message("t", "{{.x}}", &r).unwrap(), "<no value>");
    }

    #[test]
    fn errors_name_the_item() {
        let err = MessageTemplate::parse("tickets", "{{.id").unwrap_err();
        assert!(
            err.to_string().contains("foreach item \"tickets\""),
            "{err}"
        );
        let err = MessageTemplate::parse("tickets", "{{nosuchfunc .id}}").unwrap_err();
        assert!(err.to_string().contains("\"tickets\""), "{err}");
        let t = MessageTemplate::parse("tickets", "{{.id.sub}}").unwrap();
        let err = t.render(3, &row(json!({"id": 5}))).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("foreach item \"tickets\", row 3"), "{text}");
    }
}
