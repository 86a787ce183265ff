//! Every ```json block of `docs/*.md` and `README.md` is loaded by the loader it claims to be
//! an example of, so the user documentation cannot drift from what Trellis accepts.
//!
//! A block is tagged by an HTML comment on the line right before its opening fence:
//!
//! - `<!-- example: plan -->`, `step-config`, `workflow`: a whole file. It is written into a
//!   fresh workspace and loaded with [`Workspace::open`], the loader of `trellis validate`.
//!   A step config gets a plan with one `regular` step per id it names (and a script for
//!   each), a `workflow.json` a one-step plan.
//! - `<!-- example: validation-schema -->`: a whole schema, loaded as the `validation_schema`
//!   of a step of a plan (the same parser reads it wherever it appears).
//! - `<!-- example: plugin-manifest -->`: a `plugin.json`, read by [`Manifest::read`], what
//!   `--plugins DIR` uses.
//! - `<!-- example: mcp-servers -->`: an operator's MCP server file, read by
//!   [`McpConfig::add_file`], what `--mcp-config FILE` uses.
//! - `<!-- example: fragment PLACE -->`: a part of a file, wrapped into a whole one before
//!   loading; `PLACE` is one of [`FRAGMENTS`]. Step ids a wrapped fragment refers to (next
//!   steps, routes, answers) are added as stub `regular` steps.
//! - `<!-- example: invalid KIND -->` (`KIND` any of the above, fragments included): must
//!   FAIL to load. When the block is followed (after blank lines) by a ```text block, every
//!   line of that block must appear in the error text.
//! - `<!-- example: warns KIND -->`: loads, with at least one warning; a following ```text
//!   block is checked against the warnings the same way.
//! - `<!-- example: other -->`: JSON that is none of these formats (an excerpt of
//!   `session.json`, say): it only has to parse.
//!
//! A ```json block without a tag fails the test with its file and line.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use trellis_runner::mcp_servers::McpConfig;
use trellis_sandbox::plugins::Manifest;
use trellis_workflow::Workspace;

/// The places a fragment can come from, with how it is wrapped.
const FRAGMENTS: &[&str] = &[
    "plan.steps[]",
    "plan.steps[].items[]",
    "plan.steps[].predefined_routes[]",
    "step-config.steps[]",
    "step-config.steps[].agent_configs",
    "validation-schema.files[]",
    "validation-schema.files[].json_checks[]",
    "validation-schema.db[]",
];

/// The id of the step a wrapped fragment lives in.
const HOST_STEP: &str = "example-step";

#[derive(Debug)]
struct Example {
    file: PathBuf,
    line: usize,
    tag: String,
    json: String,
    /// The lines of a ```text block right after the json block.
    expected: Vec<String>,
}

impl Example {
    fn at(&self) -> String {
        format!("{}:{}", self.file.display(), self.line)
    }
}

/// What a document example should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Loads,
    Warns,
    Fails,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `docs/*.md` and the README, sorted.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.push(repo().join("README.md"));
    docs
}

fn fence(line: &str) -> Option<&str> {
    line.trim_start().strip_prefix("```").map(str::trim)
}

fn tag_of(line: &str) -> Option<String> {
    let rest = line
        .trim()
        .strip_prefix("<!--")?
        .strip_suffix("-->")?
        .trim();
    Some(rest.strip_prefix("example:")?.trim().to_string())
}

/// Every json block of one document, or the untagged ones as errors.
fn examples_of(path: &Path, text: &str, untagged: &mut Vec<String>) -> Vec<Example> {
    let rel = path.strip_prefix(repo()).unwrap_or(path).to_path_buf();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(lang) = fence(lines[i]) else {
            i += 1;
            continue;
        };
        let start = i;
        let mut end = i + 1;
        while end < lines.len() && fence(lines[end]) != Some("") {
            end += 1;
        }
        if lang == "json" {
            let body = lines[start + 1..end.min(lines.len())].join("\n");
            let tag = start.checked_sub(1).and_then(|p| tag_of(lines[p]));
            match tag {
                None => untagged.push(format!(
                    "{}:{}: a json block without an `<!-- example: KIND -->` line before it",
                    rel.display(),
                    start + 1
                )),
                Some(tag) => {
                    // A ```text block right after it holds the expected diagnostics.
                    let mut next = end + 1;
                    while next < lines.len() && lines[next].trim().is_empty() {
                        next += 1;
                    }
                    let mut expected = Vec::new();
                    if next < lines.len() && fence(lines[next]) == Some("text") {
                        let mut j = next + 1;
                        while j < lines.len() && fence(lines[j]) != Some("") {
                            if !lines[j].trim().is_empty() {
                                expected.push(lines[j].trim().to_string());
                            }
                            j += 1;
                        }
                    }
                    out.push(Example {
                        file: rel.clone(),
                        line: start + 1,
                        tag,
                        json: body,
                        expected,
                    });
                }
            }
        }
        i = end + 1;
    }
    out
}

fn all_examples() -> (Vec<Example>, Vec<String>) {
    let mut untagged = Vec::new();
    let mut examples = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        examples.extend(examples_of(&doc, &text, &mut untagged));
    }
    (examples, untagged)
}

/// Wraps a fragment into the whole file it belongs to; returns the file kind and its JSON.
fn wrap(place: &str, v: Value) -> Result<(&'static str, Value), String> {
    let sequence = |items: Value, routes: Option<Value>| {
        let mut step = json!({
            "id": HOST_STEP, "type": "message_sequence", "title": "Example",
            "description": "The step this example belongs to.", "items": items,
        });
        if let Some(r) = routes {
            step["predefined_routes"] = r;
        }
        json!({ "steps": [step] })
    };
    Ok(match place {
        "plan.steps[]" => ("plan", json!({ "steps": [v] })),
        "plan.steps[].items[]" => ("plan", sequence(json!([v]), None)),
        "plan.steps[].predefined_routes[]" => (
            "plan",
            sequence(
                json!([{"id": "work", "type": "user_message", "message": "Do the work."}]),
                Some(json!([v])),
            ),
        ),
        "step-config.steps[]" => ("step-config", json!({ "steps": [v] })),
        "step-config.steps[].agent_configs" => (
            "step-config",
            json!({ "steps": [{ "id": HOST_STEP, "agent_configs": v }] }),
        ),
        "validation-schema.files[]" => ("validation-schema", json!({ "files": [v] })),
        "validation-schema.files[].json_checks[]" => (
            "validation-schema",
            json!({ "files": [{ "file_name": "report.json", "json_checks": [v] }] }),
        ),
        "validation-schema.db[]" => ("validation-schema", json!({ "db": [v] })),
        other => {
            return Err(format!(
                "unknown fragment place {other:?}; known: {}",
                FRAGMENTS.join(", ")
            ));
        }
    })
}

/// Step ids a plan refers to, which a wrapped fragment may not define itself.
fn referenced_steps(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, val) in m {
                match (k.as_str(), val) {
                    (
                        "next_step_id"
                        | "if_yes_next_step_id"
                        | "if_no_next_step_id"
                        | "depends_on_step",
                        Value::String(s),
                    ) => out.push(s.clone()),
                    ("option_routes", Value::Object(routes)) => {
                        out.extend(routes.values().filter_map(Value::as_str).map(String::from))
                    }
                    _ => referenced_steps(val, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| referenced_steps(x, out)),
        _ => {}
    }
}

fn stub(id: &str) -> Value {
    json!({"id": id, "type": "regular", "title": id, "description": "A stub the example refers to."})
}

/// Adds a stub step for every step id `plan` refers to but does not define.
fn add_stubs(plan: &mut Value) {
    let mut refs = Vec::new();
    referenced_steps(plan, &mut refs);
    let defined: Vec<String> = ["steps", "orphan_steps"]
        .iter()
        .filter_map(|l| plan.get(*l).and_then(Value::as_array))
        .flatten()
        .filter_map(|s| s.get("id").and_then(Value::as_str).map(String::from))
        .collect();
    let steps = plan["steps"].as_array_mut().unwrap();
    for id in refs {
        if id != "end" && !defined.contains(&id) && !steps.iter().any(|s| s["id"] == id.as_str()) {
            steps.push(stub(&id));
        }
    }
}

/// A plan with one regular step per id of a step config (and the steps its prerequisite
/// rules name), each with a script so a scripted setting is complete.
fn plan_for_config(config: &Value, root: &Path) -> Value {
    let entries = match config {
        Value::Array(a) => a.clone(),
        other => other
            .get("steps")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    };
    let mut ids: Vec<String> = entries
        .iter()
        .filter_map(|e| e.get("id").and_then(Value::as_str).map(String::from))
        .filter(|id| !id.trim().is_empty())
        .collect();
    referenced_steps(config, &mut ids);
    ids.dedup();
    let mut steps: Vec<Value> = Vec::new();
    for id in ids {
        if steps.iter().any(|s| s["id"] == id.as_str()) {
            continue;
        }
        let code = root.join("code").join(&id);
        if std::fs::create_dir_all(&code).is_ok() {
            std::fs::write(code.join("main.py"), "print('ok')\n").unwrap();
        }
        steps.push(stub(&id));
    }
    json!({ "steps": steps })
}

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Loads one example the way Trellis loads its kind. `Ok(warnings)` or `Err(errors)`, each
/// as the lines `trellis validate` (or plugin loading) prints.
fn load(
    kind: &str,
    text: &str,
    value: Option<Value>,
    fragment: bool,
) -> Result<Vec<String>, Vec<String>> {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap();
    match kind {
        "mcp-servers" => {
            let mut config = McpConfig::empty();
            return config
                .add_file(Path::new("mcp_servers.json"), text)
                .map(|()| config.warnings)
                .map_err(|e| vec![format!("{e:#}")]);
        }
        "plugin-manifest" => {
            return Manifest::parse(text)
                .map(|_| Vec::new())
                .map_err(|e| vec![format!("{e:#}")]);
        }
        "plan" => {
            // A whole plan is written exactly as shown, so errors name its real paths.
            match (fragment, value) {
                (true, Some(mut v)) => {
                    add_stubs(&mut v);
                    write(root, "planning/plan.json", &pretty(&v));
                }
                _ => write(root, "planning/plan.json", text),
            }
        }
        "step-config" => {
            let v = value.unwrap_or(Value::Null);
            write(
                root,
                "planning/plan.json",
                &pretty(&plan_for_config(&v, root)),
            );
            if fragment {
                write(root, "planning/step_config.json", &pretty(&v));
            } else {
                write(root, "planning/step_config.json", text);
            }
        }
        "workflow" => {
            write(
                root,
                "planning/plan.json",
                &pretty(&json!({"steps": [stub(HOST_STEP)]})),
            );
            write(root, "workflow.json", text);
        }
        "validation-schema" => {
            let schema = value.unwrap_or(Value::Null);
            let mut step = stub(HOST_STEP);
            step["validation_schema"] = schema;
            write(
                root,
                "planning/plan.json",
                &pretty(&json!({"steps": [step]})),
            );
        }
        other => return Err(vec![format!("unknown example kind {other:?}")]),
    }
    match Workspace::open(root) {
        Ok(ws) => Ok(ws.warnings.lines()),
        Err(diags) => {
            if diags.has_errors() {
                Err(diags.lines())
            } else {
                Ok(diags.lines())
            }
        }
    }
}

/// Checks one example; `Err` says what is wrong, naming its place in the docs.
fn check(ex: &Example) -> Result<(), String> {
    let words: Vec<&str> = ex.tag.split_whitespace().collect();
    let (expect, rest) = match words.first() {
        Some(&"invalid") => (Expect::Fails, &words[1..]),
        Some(&"warns") => (Expect::Warns, &words[1..]),
        _ => (Expect::Loads, &words[..]),
    };
    let fail = |why: String| Err(format!("{} ({}): {why}", ex.at(), ex.tag));
    let parsed: Result<Value, _> = serde_json::from_str(&ex.json);
    let (kind, value, fragment) = match rest {
        ["other"] => {
            return match (parsed, expect) {
                (Ok(_), Expect::Loads) => Ok(()),
                (Ok(_), _) => fail("`other` examples only parse; they cannot fail or warn".into()),
                (Err(e), _) => fail(format!("not valid JSON: {e}")),
            };
        }
        ["fragment", place] => {
            let v = match parsed {
                Ok(v) => v,
                Err(e) => return fail(format!("not valid JSON: {e}")),
            };
            match wrap(place, v) {
                Ok((kind, whole)) => (kind, Some(whole), true),
                Err(e) => return fail(e),
            }
        }
        [
            kind @ ("plan" | "step-config" | "workflow" | "validation-schema" | "plugin-manifest"
            | "mcp-servers"),
        ] => (*kind, parsed.ok(), false),
        _ => {
            return fail(
                "unknown tag; expected `[invalid|warns] plan|step-config|workflow|validation-schema|plugin-manifest|mcp-servers`, `[invalid|warns] fragment PLACE` or `other`"
                    .into(),
            );
        }
    };
    if value.is_none() && expect != Expect::Fails {
        let e = serde_json::from_str::<Value>(&ex.json).unwrap_err();
        return fail(format!("not valid JSON: {e}"));
    }
    let text = match &value {
        Some(v) if fragment => serde_json::to_string_pretty(v).unwrap(),
        _ => ex.json.clone(),
    };
    let outcome = load(kind, &text, value, fragment);
    let shown = match (&outcome, expect) {
        (Ok(w), Expect::Loads) if w.is_empty() => return Ok(()),
        (Ok(w), Expect::Loads) => {
            return fail(format!(
                "loads, but with warnings (tag it `warns {}` if that is the point):\n  {}",
                rest.join(" "),
                w.join("\n  ")
            ));
        }
        (Ok(w), Expect::Warns) if !w.is_empty() => w,
        (Ok(_), Expect::Warns) => return fail("loads without any warning".into()),
        (Ok(_), Expect::Fails) => return fail("is tagged invalid but loads".into()),
        (Err(e), Expect::Fails) => e,
        (Err(e), _) => return fail(format!("does not load:\n  {}", e.join("\n  "))),
    };
    let all = shown.join("\n");
    for line in &ex.expected {
        if !all.contains(line.as_str()) {
            return fail(format!(
                "the text shown after it is not what loading says.\n  shown: {line}\n  said:  {}",
                shown.join("\n         ")
            ));
        }
    }
    Ok(())
}

#[test]
fn every_json_example_in_the_docs_loads_as_tagged() {
    let (examples, untagged) = all_examples();
    let mut problems = untagged;
    for ex in &examples {
        if let Err(e) = check(ex) {
            problems.push(e);
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {} doc examples are wrong:\n\n{}",
        problems.len(),
        examples.len(),
        problems.join("\n\n")
    );
    // The scan itself must find the examples: a parser bug that finds nothing passes nothing.
    let kinds = |k: &str| examples.iter().filter(|e| e.tag.contains(k)).count();
    for kind in [
        "plan",
        "step-config",
        "workflow",
        "validation-schema",
        "plugin-manifest",
        "mcp-servers",
        "invalid",
    ] {
        assert!(kinds(kind) > 0, "no `{kind}` example found in the docs");
    }
    eprintln!("{} doc examples loaded", examples.len());
}

#[test]
fn the_scanner_flags_untagged_blocks_and_reads_expected_text() {
    let doc = "intro\n\n```json\n{}\n```\n\n<!-- example: invalid plan -->\n```json\n{\"steps\": 1}\n```\n\n```text\nplanning/plan.json: steps: x\n```\n";
    let mut untagged = Vec::new();
    let found = examples_of(Path::new("docs/x.md"), doc, &mut untagged);
    assert_eq!(
        untagged,
        ["docs/x.md:3: a json block without an `<!-- example: KIND -->` line before it"]
    );
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].line, 8);
    assert_eq!(found[0].tag, "invalid plan");
    assert_eq!(found[0].expected, ["planning/plan.json: steps: x"]);
}

#[test]
fn a_broken_example_is_caught() {
    // What a doc example that stopped loading looks like to the test: a typo in a key.
    let ex = Example {
        file: "docs/x.md".into(),
        line: 1,
        tag: "plan".into(),
        json: r#"{"steps": [{"id": "a", "type": "regular", "titel": "A"}]}"#.into(),
        expected: Vec::new(),
    };
    let err = check(&ex).unwrap_err();
    assert!(
        err.contains(r#"unknown key "titel" (did you mean "title"?)"#),
        "{err}"
    );
    // And an invalid example whose shown error is not what Trellis says.
    let ex = Example {
        tag: "invalid plan".into(),
        expected: vec!["something else".into()],
        ..ex
    };
    assert!(check(&ex).unwrap_err().contains("not what loading says"));
}
