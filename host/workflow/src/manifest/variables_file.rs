//! `variables/variables.json`, where the original keeps variables and groups beside
//! `workflow.json`'s.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{
    Group, Variable, WORKFLOW_FILE, WorkflowManifest, shown_variable_name, valid_variable_name,
};
use crate::diagnostics::{Ctx, Diagnostics, JsonPath, Obj, kind_of, parse_json, quote};

/// Where the original keeps variables and groups, beside `workflow.json`'s.
pub const VARIABLES_FILE: &str = "variables/variables.json";

/// Reads `variables/variables.json` (the original's `{variables: [{name, value,
/// description}], groups: [{name, values, enabled}], extraction_date}`) into `manifest`: its variables join the declared ones and its
/// enabled groups join the groups (id and folder from the name; `values` an object of name ->
/// value, or a list of `{name, value}`); a group with `enabled: false` is left out. On a name
/// both files declare, `variables/variables.json` wins (it is where the original keeps them and
/// where its builder writes), with a warning naming the name.
pub fn merge_variables_file(
    text: &str,
    file: &str,
    manifest: &mut WorkflowManifest,
) -> Diagnostics {
    let mut diags = Diagnostics::new();
    if let Some(value) = parse_json(text, file, &mut diags) {
        let mut ctx = Ctx::new(file, &mut diags);
        merge_variables_value(&mut ctx, &value, manifest);
    }
    diags
}

fn merge_variables_value(ctx: &mut Ctx, value: &Value, manifest: &mut WorkflowManifest) {
    let Some(mut obj) = Obj::new(ctx, value, JsonPath::root(), "variables and groups") else {
        return;
    };
    let vars = obj.list(ctx, "variables", |ctx, v, p| {
        let mut o = Obj::new(ctx, v, p, "a variable")?;
        let name = o.req_str(ctx, "name", "the variable name");
        let value = match o.raw("value") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other @ (Value::Number(_) | Value::Bool(_))) => Some(other.to_string()),
            Some(other) => {
                ctx.error(
                    &o.path().key("value"),
                    format!("expected a string, found {}", kind_of(other)),
                );
                None
            }
        };
        let description = o.str(ctx, "description");
        if let Some(n) = &name
            && !valid_variable_name(n)
        {
            ctx.error(
                &o.path().key("name"),
                format!(
                    "invalid variable name {}: use 1 to 128 letters, digits and _",
                    shown_variable_name(n)
                ),
            );
        }
        o.finish(ctx);
        Some((name?, Variable::Declared { value, description }))
    });
    let groups = obj.list(ctx, "groups", |ctx, v, p| {
        let mut o = Obj::new(ctx, v, p, "a group")?;
        let name = o.req_str(ctx, "name", "the group name");
        let enabled = o.bool(ctx, "enabled").unwrap_or(true);
        let mut values = BTreeMap::new();
        match o.raw("values") {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    match v {
                        Value::String(s) => {
                            values.insert(k.clone(), s.clone());
                        }
                        Value::Number(_) | Value::Bool(_) => {
                            values.insert(k.clone(), v.to_string());
                        }
                        other => ctx.error(
                            &o.path().key("values").key(k),
                            format!("expected a string, found {}", kind_of(other)),
                        ),
                    }
                }
            }
            Some(Value::Array(list)) => {
                for (i, entry) in list.iter().enumerate() {
                    let n = entry.get("name").and_then(Value::as_str);
                    let v = entry.get("value").and_then(|v| match v {
                        Value::String(s) => Some(s.clone()),
                        Value::Number(_) | Value::Bool(_) => Some(v.to_string()),
                        _ => None,
                    });
                    match (n, v) {
                        (Some(n), Some(v)) => {
                            values.insert(n.to_string(), v);
                        }
                        _ => ctx.error(
                            &o.path().key("values").index(i),
                            "expected {\"name\": \"...\", \"value\": \"...\"}",
                        ),
                    }
                }
            }
            Some(other) => ctx.error(
                &o.path().key("values"),
                format!(
                    "expected an object of name -> value, found {}",
                    kind_of(other)
                ),
            ),
        }
        o.finish(ctx);
        Some((name?, enabled, values))
    });
    // When the original's extraction wrote the file; kept, with no effect here.
    obj.str(ctx, "extraction_date");
    obj.finish(ctx);
    for (i, (name, var)) in vars.into_iter().flatten().enumerate() {
        if manifest.variables.insert(name.clone(), var).is_some() {
            ctx.warning(
                &JsonPath::root().key("variables").index(i),
                format!(
                    "{} is also declared in {WORKFLOW_FILE}: the value here wins",
                    quote(&name)
                ),
            );
        }
    }
    if let Some(list) = &groups
        && list.len() + manifest.groups.len() > super::MAX_GROUPS
    {
        ctx.error(
            &JsonPath::root().key("groups"),
            format!(
                "{} groups with workflow.json's, more than the {} a workflow may have (each \
                 runs the whole plan)",
                list.len() + manifest.groups.len(),
                super::MAX_GROUPS
            ),
        );
        return;
    }
    for (i, (name, enabled, values)) in groups.into_iter().flatten().enumerate() {
        let existing = manifest.groups.iter().position(|g| g.id == name);
        if let Some(at) = existing {
            manifest.groups.remove(at);
            ctx.warning(
                &JsonPath::root().key("groups").index(i),
                format!(
                    "group {} is also declared in {WORKFLOW_FILE}: the one here wins",
                    quote(&name)
                ),
            );
        }
        if enabled {
            manifest.groups.push(Group {
                id: name,
                name: None,
                variables: values,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse_manifest;

    #[test]
    fn variables_json_joins_the_manifest_and_names_its_mistakes() {
        let mut m = parse_manifest(r#"{"variables": {"A": "from-workflow"}}"#, "workflow.json")
            .unwrap()
            .0;
        let text = r#"{"variables": [{"name": "A", "value": "from-variables-json"},
                                      {"name": "B", "value": 7, "description": "d"}],
                       "groups": [{"name": "g1", "values": {"B": "8"}},
                                  {"name": "g2", "values": [{"name": "B", "value": "9"}], "enabled": true},
                                  {"name": "off", "enabled": false}]}"#;
        let diags = merge_variables_file(text, VARIABLES_FILE, &mut m);
        assert_eq!(
            diags.lines(),
            [
                "variables/variables.json: variables[0]: \"A\" is also declared in workflow.json: the value here wins"
            ]
        );
        assert_eq!(m.resolved_variables(None)["A"], "from-variables-json");
        assert_eq!(m.resolved_variables(None)["B"], "7");
        assert_eq!(m.resolved_variables(Some("g2"))["B"], "9");
        let ids: Vec<&str> = m.groups.iter().map(|g| g.id.as_str()).collect();
        assert_eq!(ids, ["g1", "g2"]);

        let mut m = WorkflowManifest::default();
        let diags = merge_variables_file(
            r#"{"variables": [{"value": "x"}], "groups": [{"name": "g", "values": 3}], "extra": 1}"#,
            VARIABLES_FILE,
            &mut m,
        );
        assert_eq!(
            diags.lines(),
            [
                "variables/variables.json: variables[0].name: missing: expected a string (the variable name)",
                "variables/variables.json: groups[0].values: expected an object of name -> value, found a number",
                "variables/variables.json: unknown key \"extra\" (did you mean \"extraction_date\"?)",
            ]
        );
    }
}
