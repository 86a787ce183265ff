//! Test workspaces on disk: files written under a root, a SQLite database, a copy of an
//! example workspace, and JSON read back from what a run wrote.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The example workspace the CLI and route tests run offline from its committed cassette.
pub const EXAMPLE: &str = "examples/ticket-triage";

/// Where [`EXAMPLE`] is in the checkout.
pub fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(EXAMPLE)
}

/// Writes `text` to `rel` under `root`, creating the folders on the way.
pub fn write_file(root: &Path, rel: &str, text: impl AsRef<[u8]>) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Writes every `(rel, text)` under `root` (see [`write_file`]).
pub fn write_files<T: AsRef<[u8]>>(root: &Path, files: &[(&str, T)]) {
    for (rel, text) in files {
        write_file(root, rel, text);
    }
}

/// Creates `db/db.sqlite` under `root` and runs `sql` in it (tables and rows).
pub fn create_db(root: &Path, sql: &str) {
    std::fs::create_dir_all(root.join("db")).unwrap();
    let conn = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
    conn.execute_batch(sql).unwrap();
}

/// Copies a workspace, leaving out the entries named in `leave_out` at any depth (outputs
/// such as `runs`, `db.sqlite` or `learnings`).
pub fn copy_workspace(from: &Path, to: &Path, leave_out: &[&str]) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if leave_out.iter().any(|l| name == *l) {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type().unwrap().is_dir() {
            copy_workspace(&entry.path(), &target, leave_out);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The JSON file at `path`.
pub fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// A workspace of one `regular` agent step per id of `ids`, on the model `providers` name
/// (`FakeServer::providers`).
pub fn regular_steps(root: &Path, providers: Value, ids: &[&str]) {
    let steps: Vec<Value> = ids
        .iter()
        .map(
            |id| serde_json::json!({"id": id, "type": "regular", "title": "S", "description": "d"}),
        )
        .collect();
    write_files(
        root,
        &[
            (
                "planning/plan.json",
                serde_json::json!({"objective": "o", "steps": steps}).to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                serde_json::json!({"llm": {"provider": "openai", "model_id": "m"},
                                   "providers": providers})
                .to_string(),
            ),
        ],
    );
}

/// A workspace of one message_sequence step `desk` (one item, "Work.") whose route
/// `counter` calls the orphan step `count-rows` ("Counts rows."), on the model at
/// `providers`.
pub fn counter_route(root: &Path, providers: Value) {
    regular_steps(root, providers, &[]);
    write_file(
        root,
        "planning/plan.json",
        serde_json::json!({"objective": "count", "steps": [
            {"id": "desk", "type": "message_sequence", "title": "Desk", "description": "d",
             "items": [{"id": "work", "type": "user_message", "message": "Work."}],
             "predefined_routes": [{"route_id": "counter", "orphan_step_ref": "count-rows"}]}
        ], "orphan_steps": [{"id": "count-rows", "type": "regular", "title": "Count",
            "description": "Counts rows."}]})
        .to_string(),
    );
}

/// Gives the workspace's `workflow.json` `n` groups (`g0`, `g1`, ...): the run goes through
/// its steps once per group.
pub fn with_groups(root: &Path, n: usize) {
    let mut manifest = read_json(&root.join("workflow.json"));
    manifest["groups"] = (0..n)
        .map(|i| serde_json::json!({"id": format!("g{i}"), "name": format!("g{i}")}))
        .collect();
    write_file(root, "workflow.json", manifest.to_string());
}

/// The bytes of the files under `dir`, all the way down.
pub fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() {
            tree_bytes(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}
