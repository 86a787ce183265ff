//! How one legacy sequence converts: which of its code items become scripted steps (and what
//! blocks that), the new steps built from them, and the references rewritten to point at them.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde_json::{Map, Value, json};

use super::super::plan::CODE_ITEM_MIGRATION;
use super::{RUN, arr, humanize, is_code, item_schema, s};
use trellis_sandbox::store::{Kind, WorkspaceFs};

/// A code item that can be converted, with its paired gate.
#[derive(Debug)]
pub(super) struct Unit<'a> {
    pub(super) item: &'a Value,
    pub(super) id: String,
    pub(super) gate: Option<&'a Value>,
}

/// Collects code items nested in routes (never convertible).
pub(super) fn nested_code(step: &Value, trail: &str, reasons: &mut Vec<String>) {
    for route in arr(step, "predefined_routes") {
        let rid = s(route, "route_id").unwrap_or("?");
        let Some(sub) = route.get("sub_agent_step") else {
            continue;
        };
        let here = format!("{trail} route \"{rid}\"");
        for item in arr(sub, "items").iter().chain(arr(sub, "messages")) {
            if is_code(item) {
                reasons.push(format!(
                    "{here} item \"{}\": code nested inside a route's sub-agent step cannot be converted: split the script out into a standalone regular step with declared_execution_mode \"scripted\" before the sequence, and let the route read its output",
                    s(item, "id").unwrap_or("?")
                ));
            }
        }
        nested_code(sub, &here, reasons);
    }
}

/// Plans the units of one top-level step holding code items; records blockers.
pub(super) fn plan_sequence<'a>(
    fs: &WorkspaceFs,
    step: &'a Value,
    existing_ids: &HashSet<String>,
    new_ids: &mut HashSet<String>,
    reasons: &mut Vec<String>,
) -> Vec<Unit<'a>> {
    let sid = s(step, "id").unwrap_or("?");
    let here = format!("step \"{sid}\"");
    if s(step, "type") != Some("message_sequence") {
        reasons.push(format!(
            "{here}: code items in a {} step cannot be converted: rewrite the step as a message_sequence without code, and the script as a standalone scripted regular step",
            s(step, "type").unwrap_or("untyped")
        ));
        return Vec::new();
    }
    if step.get("next_step_id").is_some_and(|v| !v.is_null()) {
        reasons.push(format!(
            "{here}: a sequence with code items and a next_step_id cannot be converted: remove next_step_id (or move the jump to a routing step after it) so the new steps run in plan order"
        ));
    }
    let items = arr(step, "items");
    let mut units: Vec<Unit> = Vec::new();
    let mut i = 0;
    while i < items.len() {
        let item = &items[i];
        let iid = s(item, "id").unwrap_or("?");
        match s(item, "type") {
            Some("code") => {
                let at = format!("{here} item \"{iid}\"");
                let id = s(item, "id").filter(|x| !x.trim().is_empty());
                if id.is_none() {
                    reasons.push(format!(
                        "{here} item {}: a code item without an id cannot be converted: give it an id (it becomes the new step's id)",
                        i
                    ));
                }
                match s(item, "script_path") {
                    None => reasons.push(format!(
                        "{at}: no script_path: add the workspace-relative path of its .py script"
                    )),
                    Some(p) => {
                        if let Err(why) = trellis_sandbox::store::check_relative(p) {
                            reasons.push(format!("{at}: script_path {why}"));
                        } else {
                            match fs.kind(p) {
                                Ok(Some(Kind::File)) => {
                                    use trellis_sandbox::store::private_names;
                                    if let Some(why) = private_names::refusal_for(Path::new(p)) {
                                        reasons.push(format!(
                                            "{at}: script_path: {why}, nor copied: a script \
                                             belongs in a visible file such as scripts/<name>.py"
                                        ));
                                    } else if private_names::has_other_links(fs, Path::new(p)) {
                                        reasons.push(format!(
                                            "{at}: script_path \"{p}\" has other hard links; a \
                                             file linked from elsewhere (perhaps outside the \
                                             workspace) is never copied"
                                        ));
                                    }
                                }
                                Ok(None) => reasons.push(format!(
                                    "{at}: script_path \"{p}\" does not exist in the workspace"
                                )),
                                Ok(Some(Kind::Link)) => reasons.push(format!(
                                    "{at}: script_path {}",
                                    trellis_sandbox::store::workspace_fs::link_error(Path::new(p))
                                )),
                                Ok(Some(_)) => reasons.push(format!(
                                    "{at}: script_path \"{p}\" is not a regular file"
                                )),
                                Err(e) => reasons.push(format!("{at}: script_path: {e}")),
                            }
                        }
                    }
                }
                if let Some(rt) = s(item, "runtime")
                    && !matches!(rt, "python" | "python3")
                {
                    reasons.push(format!(
                        "{at}: runtime \"{rt}\" is not python: scripted steps run code/<step-id>/main.py; port the script to Python or split it into its own workflow"
                    ));
                }
                if item.get("input_json").is_some() {
                    reasons.push(format!(
                        "{at}: input_json cannot be converted: write that JSON to a file produced by an earlier step and list it in input_files"
                    ));
                }
                if let Some(wa) = item.get("write_access") {
                    for key in ["knowledgebase", "learnings"] {
                        if wa.get(key) == Some(&Value::Bool(true)) {
                            reasons.push(format!(
                                "{at}: {key} write access is unusual write ownership for a script: move the {key} writes to a message sequence step (or its closing turn) and drop {key} from the item's write_access"
                            ));
                        }
                    }
                    for key in ["path", "paths", "file", "files"] {
                        if wa.get(key).is_some() {
                            reasons.push(format!(
                                "{at}: per-file write access ({key}) is not supported: write access is per folder; remove \"{key}\""
                            ));
                        }
                    }
                }
                if let Some(k) = s(item, "kind")
                    && matches!(k, "learning" | "knowledgebase")
                {
                    reasons.push(format!(
                        "{at}: kind \"{k}\" is unusual write ownership for a script: move that work to a message sequence step"
                    ));
                }
                let outputs = arr(item, "output_files");
                if outputs.is_empty() || !outputs.iter().all(Value::is_string) {
                    reasons.push(format!(
                        "{at}: no output_files: declare the files the script writes so later steps can depend on them"
                    ));
                }
                for f in arr(item, "input_files") {
                    match f.as_str().map(trellis_sandbox::store::check_relative) {
                        Some(Ok(())) => {}
                        _ => reasons.push(format!(
                            "{at}: input_files entries must be workspace-relative paths, found {f}"
                        )),
                    }
                }
                if let Some(id) = id {
                    if existing_ids.contains(id) {
                        reasons.push(format!(
                            "{at}: the id collides with an existing step id \"{id}\": rename the code item before migrating"
                        ));
                    } else if !new_ids.insert(id.to_string()) {
                        reasons.push(format!(
                            "{at}: the id is used by another code item too: rename one of them"
                        ));
                    }
                    if let Some(p) = s(item, "script_path") {
                        let target = Path::new("code").join(id).join("main.py");
                        if fs.exists(&target) && fs.read(&target).ok() != fs.read(p).ok() {
                            reasons.push(format!(
                                "{at}: code/{id}/main.py already exists with other content: rename the item or remove that file"
                            ));
                        }
                    }
                }
                let gate = items
                    .get(i + 1)
                    .filter(|n| s(n, "type") == Some("prevalidation"));
                if let Some(g) = gate
                    && item_schema(g).is_none()
                {
                    reasons.push(format!(
                        "{here} item \"{}\": the prevalidation after code item \"{iid}\" has no schema: add its validation_schema",
                        s(g, "id").unwrap_or("?")
                    ));
                }
                units.push(Unit {
                    item,
                    id: id.unwrap_or_default().to_string(),
                    gate,
                });
                i += if gate.is_some() { 2 } else { 1 };
            }
            Some("prevalidation") => {
                reasons.push(format!(
                    "{here} item \"{iid}\": a prevalidation not immediately after exactly one code item cannot be paired: move it right after the code item it checks, or split the sequence"
                ));
                i += 1;
            }
            _ => {
                reasons.push(format!(
                    "{here} item \"{iid}\": code mixed with conversational items cannot be converted: split the {} item(s) into their own message sequence and keep only code items (each optionally followed by one prevalidation) in this one",
                    s(item, "type").unwrap_or("untyped")
                ));
                i += 1;
            }
        }
    }
    units
}

pub(super) fn merge_schemas(a: Option<&Value>, b: Option<&Value>) -> Option<Value> {
    let mut out = Map::new();
    for key in ["files", "db"] {
        let mut list: Vec<Value> = Vec::new();
        for src in [a, b].into_iter().flatten() {
            for r in arr(src, key) {
                if !list.contains(r) {
                    list.push(r.clone());
                }
            }
        }
        if !list.is_empty() {
            out.insert(key.into(), Value::Array(list));
        }
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

/// The path of an output of step `id` in the run folder (output names with a `/` are already
/// workspace-relative and stay as they are).
pub(super) fn output_path(id: &str, file: &str) -> String {
    if file.contains('/') {
        file.to_string()
    } else {
        format!("{RUN}/{id}/{file}")
    }
}

/// The steps a converted sequence becomes; `Err` with the bytes reached once their
/// descriptions and contexts (each step's context holds every earlier step's outputs, so
/// they grow with the square of the items) pass `budget`, before more is built.
pub(super) fn build_steps(seq: &Value, units: &[Unit], budget: usize) -> Result<Vec<Value>, usize> {
    let sid = s(seq, "id").unwrap_or_default();
    let seq_deps: Vec<Value> = arr(seq, "context_dependencies").to_vec();
    let seq_desc = s(seq, "description").unwrap_or_default();
    let mut earlier_outputs: Vec<Value> = Vec::new();
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for (n, u) in units.iter().enumerate() {
        let mut deps: Vec<Value> = Vec::new();
        let mut seen = HashSet::new();
        let inputs = arr(u.item, "input_files");
        for d in seq_deps.iter().chain(&earlier_outputs).chain(inputs) {
            if seen.insert(d.to_string()) {
                deps.push(d.clone());
            }
        }
        let outputs: Vec<Value> = arr(u.item, "output_files").to_vec();
        let title = s(u.item, "title")
            .map(str::to_string)
            .unwrap_or_else(|| humanize(&u.id));
        let mut description = format!(
            "Runs code/{}/main.py. Migrated by {CODE_ITEM_MIGRATION} (contract v1.0.10) from code item \"{}\" of message sequence \"{sid}\".",
            u.id, u.id
        );
        if !seq_desc.trim().is_empty() {
            description.push_str(&format!("\n\nSequence contract: {seq_desc}"));
        }
        let gate = u.gate.and_then(item_schema);
        let schema = if n + 1 == units.len() {
            merge_schemas(gate, seq.get("validation_schema"))
        } else {
            gate.cloned()
        };
        bytes = bytes.saturating_add(
            description.len()
                + deps
                    .iter()
                    .map(|d| d.as_str().map_or(0, str::len) + 8)
                    .sum::<usize>(),
        );
        if bytes > budget {
            return Err(bytes);
        }
        let mut step = Map::new();
        step.insert("id".into(), json!(u.id));
        step.insert("type".into(), json!("regular"));
        step.insert("title".into(), json!(title));
        step.insert("description".into(), json!(description));
        if !deps.is_empty() {
            step.insert("context_dependencies".into(), Value::Array(deps));
        }
        step.insert("context_output".into(), Value::Array(outputs.clone()));
        if let Some(schema) = schema {
            step.insert("validation_schema".into(), schema);
        }
        out.push(Value::Object(step));
        earlier_outputs.extend(
            outputs
                .iter()
                .filter_map(Value::as_str)
                .map(|f| json!(output_path(&u.id, f))),
        );
    }
    Ok(out)
}

/// Rewrites references to converted sequences: jumps go to the first new step, dependency
/// paths into a sequence's output folder go to the step that now writes that file.
pub(super) fn rewrite_refs(
    step: &mut Value,
    first: &BTreeMap<String, String>,
    producer: &BTreeMap<(String, String), String>,
) {
    let retarget = |v: &mut Value| {
        if let Some(t) = v.as_str()
            && let Some(n) = first.get(t)
        {
            *v = json!(n);
        }
    };
    let Some(obj) = step.as_object_mut() else {
        return;
    };
    for key in ["next_step_id", "if_yes_next_step_id", "if_no_next_step_id"] {
        if let Some(v) = obj.get_mut(key) {
            retarget(v);
        }
    }
    if let Some(Value::Array(routes)) = obj.get_mut("routes") {
        for r in routes {
            if let Some(v) = r.get_mut("next_step_id") {
                retarget(v);
            }
        }
    }
    if let Some(Value::Object(m)) = obj.get_mut("option_routes") {
        for v in m.values_mut() {
            retarget(v);
        }
    }
    if let Some(Value::Array(deps)) = obj.get_mut("context_dependencies") {
        for d in deps {
            let Some(text) = d.as_str() else { continue };
            for ((seq, file), id) in producer {
                let needle = format!("/execution/{seq}/{file}");
                if text.ends_with(&needle) {
                    let prefix = &text[..text.len() - needle.len()];
                    *d = json!(format!("{prefix}/execution/{id}/{file}"));
                    break;
                }
            }
        }
    }
}
