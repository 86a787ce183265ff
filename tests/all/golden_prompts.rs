//! The texts the runtime sends the model, compared byte for byte with golden files written
//! once and reviewed (`tests/data/golden/prompts/`): the system prompt of a step whose
//! workspace has a knowledge base, learnings, a soul and a route, the message of its
//! reflection turn, and the tools its item's turn offers (names, descriptions, argument
//! schemas). They are read from the requests a fake model received through `trellis run`,
//! not rebuilt by the functions that make them. `TRELLIS_BLESS=1` rewrites
//! the golden files after a deliberate change (review the diff).

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::golden::{assert_golden, golden_path};
use support::workspace::{copy_workspace, write_files};

/// The workspace of `tests/data/golden/prompts/workspace` at `root`, its model the fake
/// `server`.
fn workspace(root: &Path, server: &FakeServer) {
    copy_workspace(&golden_path("golden/prompts/workspace"), root, &[]);
    write_files(
        root,
        &[(
            "workflow.json",
            json!({"llm": {"provider": "openai", "model_id": "m"},
                   "providers": server.providers()})
            .to_string(),
        )],
    );
}

/// The text of the first message of `role` in the request `body`.
fn message(body: &Value, role: &str) -> String {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == role)
        .and_then(|m| m["content"].as_str())
        .unwrap_or_else(|| panic!("no {role} message in {body:#}"))
        .to_string()
}

#[test]
fn the_system_prompt_and_the_reflection_message_are_the_golden_ones() {
    // Every answer is plain text: the item's turn ends at once, then the reflection turn.
    let answers = Arc::new(AtomicUsize::new(0));
    let counted = answers.clone();
    let server = FakeServer::start(Box::new(move |_| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        (200, completion(&format!("done {n}"), &[]))
    }));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, &server);
    let out = support::trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "the item's turn and the reflection turn");
    assert_golden(
        "golden/prompts/system-prompt.txt",
        &message(&seen[0], "system"),
    );
    let reflection = seen[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .and_then(|m| m["content"].as_str())
        .expect("the reflection turn ends with its message")
        .to_string();
    assert_golden("golden/prompts/reflection-message.txt", &reflection);
    // The tools offered, whole as they went to the model: names, descriptions and argument
    // schemas.
    let tools = serde_json::to_string_pretty(&seen[0]["tools"]).unwrap() + "\n";
    assert_golden("golden/prompts/tools.json", &tools);
    assert_eq!(
        message(&seen[1], "system"),
        message(&seen[0], "system"),
        "the reflection turn keeps the step's system prompt"
    );
}
