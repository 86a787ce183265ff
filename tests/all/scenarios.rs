//! Run scenarios as folders (`tests/scenarios/<name>/`, see its README): each is a workspace,
//! the model's replies and the expected outcome, run through the `trellis` binary against an
//! OpenAI-compatible server on 127.0.0.1. Every scenario runs; the test fails naming each one
//! that did not hold and why.

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
/// workspace names none).
fn use_server(ws: &Path, server: &FakeServer) -> Result<(), String> {
    let path = ws.join("workflow.json");
    let mut manifest = if path.exists() {
        read_json(&path)?
    } else {
        json!({})
    };
    if manifest.get("llm").is_none() {
        manifest["llm"] = json!({"provider": "openai", "model_id": "scenario-model"});
    }
    manifest["providers"] = server.providers();
    std::fs::write(&path, manifest.to_string()).map_err(|e| e.to_string())
}

/// Runs the scenario in `dir`; the problems found, empty when it held.
fn run_scenario(dir: &Path) -> Result<Vec<String>, String> {
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

#[test]
fn every_scenario_holds() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(scenarios_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("scenario.json").is_file())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 4, "scenarios found: {dirs:?}");
    let mut failed = Vec::new();
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        match run_scenario(dir) {
            Ok(problems) if problems.is_empty() => {}
            Ok(problems) => failed.push(format!("{name}:\n  {}", problems.join("\n  "))),
            Err(e) => failed.push(format!("{name}: cannot run: {e}")),
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} scenarios did not hold:\n{}",
        failed.len(),
        dirs.len(),
        failed.join("\n")
    );
}
