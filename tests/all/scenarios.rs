//! Run scenarios as folders (`tests/scenarios/<name>/`, see its README): each is a workspace,
//! the model's replies and the expected outcome, run through the `trellis` binary against an
//! OpenAI-compatible server on 127.0.0.1. Every scenario runs; the test fails naming each one
//! that did not hold and why. `tests/scenarios/original/` holds workspaces as the original
//! system writes them: each must also pass `trellis validate`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

use crate::support;
use support::fake_llm::{FakeServer, completion};
use support::workspace::copy_workspace;

fn scenarios_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios")
}

fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// A server answering with `replies` in order; past the end, an HTTP 500 that says so.
fn serve(replies: Vec<Value>) -> FakeServer {
    let next = Arc::new(AtomicUsize::new(0));
    FakeServer::start(Box::new(move |_| {
        let i = next.fetch_add(1, Ordering::SeqCst);
        match replies.get(i) {
            Some(reply) => {
                let calls: Vec<(&str, Value)> = reply["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        (
                            c["name"].as_str().unwrap_or_default(),
                            c["arguments"].clone(),
                        )
                    })
                    .collect();
                (
                    200,
                    completion(reply["text"].as_str().unwrap_or_default(), &calls),
                )
            }
            None => (
                500,
                json!({"error": {"message": format!("the scenario has no reply {}", i + 1)}}),
            ),
        }
    }))
}

/// Points the copied workspace's `workflow.json` at `server` (a model of its own when the
/// workspace names none, in Trellis's `llm` or the original's `tiered_config.tier_1`).
fn use_server(ws: &Path, server: &FakeServer) -> Result<(), String> {
    let path = ws.join("workflow.json");
    let mut manifest = if path.exists() {
        read_json(&path)?
    } else {
        json!({})
    };
    if manifest.get("llm").is_none()
        && manifest
            .pointer("/capabilities/llm_config/tiered_config/tier_1")
            .is_none_or(Value::is_null)
    {
        manifest["llm"] = json!({"provider": "openai", "model_id": "scenario-model"});
    }
    manifest["providers"] = server.providers();
    std::fs::write(&path, manifest.to_string()).map_err(|e| e.to_string())
}

/// Runs the scenario in `dir`; the problems found, empty when it held. With `validate`, the
/// workspace must first pass `trellis validate` (warnings allowed).
fn run_scenario(dir: &Path, validate: bool) -> Result<Vec<String>, String> {
    let spec = read_json(&dir.join("scenario.json"))?;
    let source = match spec["workspace"].as_str() {
        Some(rel) => dir.join(rel),
        None => dir.join("workspace"),
    };
    let replies = match dir.join("replies.json") {
        path if path.exists() => read_json(&path)?
            .as_array()
            .cloned()
            .ok_or("replies.json: expected an array")?,
        _ => Vec::new(),
    };
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let ws = tmp.path().join("ws");
    copy_workspace(&source, &ws, &["runs", "db.sqlite"]);
    let server = serve(replies);
    use_server(&ws, &server)?;
    if validate {
        let ws_arg = ws.display().to_string();
        let out = support::trellis(&["validate", &ws_arg]);
        if !out.status.success() {
            return Ok(vec![format!(
                "trellis validate refused it:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )]);
        }
    }

    let mut args = vec![
        "run".to_string(),
        ws.display().to_string(),
        "--allow-host".to_string(),
        server.allow_host(),
    ];
    args.extend(
        spec["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(String::from)),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = support::trellis(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);

    let expect = &spec["expect"];
    let mut problems = Vec::new();
    if let Some(success) = expect["success"].as_bool()
        && out.status.success() != success
    {
        problems.push(format!(
            "expected the run to {}, it exited with {}",
            if success { "succeed" } else { "fail" },
            out.status
        ));
    }
    if let Some(n) = expect["requests"].as_u64()
        && server.seen().len() as u64 != n
    {
        problems.push(format!(
            "expected {n} LLM requests, the server saw {}",
            server.seen().len()
        ));
    }
    for (stream, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        for want in expect[stream].as_array().into_iter().flatten() {
            let want = want.as_str().unwrap_or_default();
            if !text.contains(want) {
                problems.push(format!("{stream} does not contain {want:?}"));
            }
        }
    }
    if let Some(files) = expect["files"].as_object() {
        for (rel, want) in files {
            let path = ws.join(rel);
            let Ok(content) = std::fs::read_to_string(&path) else {
                problems.push(format!("{rel} was not written"));
                continue;
            };
            match want {
                Value::String(text) if !content.contains(text.as_str()) => {
                    problems.push(format!("{rel} does not contain {text:?}"));
                }
                Value::Object(o) if o.contains_key("json") => {
                    let Ok(doc) = serde_json::from_str::<Value>(&content) else {
                        problems.push(format!("{rel} is not JSON"));
                        continue;
                    };
                    for (pointer, value) in o["json"].as_object().into_iter().flatten() {
                        if doc.pointer(pointer) != Some(value) {
                            problems.push(format!(
                                "{rel}: {pointer} is {}, expected {value}",
                                doc.pointer(pointer).unwrap_or(&Value::Null)
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    for rel in expect["absent"].as_array().into_iter().flatten() {
        let rel = rel.as_str().unwrap_or_default();
        if ws.join(rel).exists() {
            problems.push(format!("{rel} exists"));
        }
    }
    if !problems.is_empty() {
        problems.push(format!("stdout:\n{stdout}\nstderr:\n{stderr}"));
    }
    Ok(problems)
}

/// Runs every scenario folder of `root`; the failures, each naming its scenario.
fn run_all(root: &Path, validate: bool) -> (usize, Vec<String>) {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("scenario.json").is_file())
        .collect();
    dirs.sort();
    let mut failed = Vec::new();
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        match run_scenario(dir, validate) {
            Ok(problems) if problems.is_empty() => {}
            Ok(problems) => failed.push(format!("{name}:\n  {}", problems.join("\n  "))),
            Err(e) => failed.push(format!("{name}: cannot run: {e}")),
        }
    }
    (dirs.len(), failed)
}

#[test]
fn every_scenario_holds() {
    let (count, failed) = run_all(&scenarios_dir(), false);
    assert!(count >= 4, "scenarios found: {count}");
    assert!(
        failed.is_empty(),
        "{} of {count} scenarios did not hold:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// The original's documented manifest, todo_task plan and grouped workflow, and a plan as
/// its Go structs marshal it: each validates, runs against the fake model and holds.
#[test]
fn every_original_workspace_validates_and_runs() {
    let (count, failed) = run_all(&scenarios_dir().join("original"), true);
    assert!(count >= 4, "original workspaces found: {count}");
    assert!(
        failed.is_empty(),
        "{} of {count} original workspaces did not hold:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
