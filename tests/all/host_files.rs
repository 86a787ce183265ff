//! The host's own file handling, through the binary: links planted in a workspace (by its
//! author or by a guest) and FIFOs must neither lead the host outside the workspace nor hang
//! it. Every test hashes a folder outside the workspace before and after, asserts the clear
//! refusal, and runs `trellis` with a bound so a hang fails the test instead of blocking it.

use crate::support;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::fake_llm::{FakeServer, completion, tool_named};
use support::tree_digest;
use support::workspace::write_file;

const STEP: &str = "fetch";

/// Far longer than any of these commands takes; only a hang reaches it.
const BOUND: Duration = Duration::from_secs(180);

/// A workspace and a folder beside it that nothing may touch.
struct World {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
    before: BTreeMap<String, String>,
}

impl World {
    /// A workspace with one scripted regular step (`code/fetch/main.py` is `script`), and an
    /// outside folder holding `secret.json`, `agents/keep.txt` and `execution/fetch/agents/`.
    fn scripted(script: &str) -> World {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let outside = dir.path().join("outside");
        write_file(
            &ws,
            "planning/plan.json",
            json!({"objective": "t", "steps": [
                {"id": STEP, "type": "regular", "title": "Fetch", "description": "fetch"}
            ]})
            .to_string(),
        );
        write_file(
            &ws,
            "planning/step_config.json",
            json!({"steps": [
                {"id": STEP, "agent_configs": {"declared_execution_mode": "scripted"}}
            ]})
            .to_string(),
        );
        write_file(&ws, &format!("code/{STEP}/main.py"), script);
        write_file(
            &outside,
            "secret.json",
            r#"{"select_route": "outside-secret"}"#,
        );
        write_file(&outside, "agents/keep.txt", "keep");
        write_file(&outside, "execution/fetch/agents/keep.txt", "keep");
        write_file(
            &outside,
            "seed.sql",
            "CREATE TABLE outside_secret (x); INSERT INTO outside_secret VALUES ('s3cr3t');",
        );
        let before = tree_digest(&outside);
        World {
            _dir: dir,
            ws,
            outside,
            before,
        }
    }

    /// A workspace of a routing step and two human_input steps: it needs no model.
    fn switch(route_source_file: Option<&str>) -> World {
        let world = World::scripted("print('unused')\n");
        let mut pick = json!({"id": "pick", "type": "routing", "title": "Pick",
        "routes": [
            {"route_id": "a", "next_step_id": "left"},
            {"route_id": "b", "next_step_id": "right"}
        ]});
        match route_source_file {
            Some(f) => pick["route_source_file"] = json!(f),
            None => pick["default_route_id"] = json!("a"),
        }
        write_file(
            &world.ws,
            "planning/plan.json",
            json!({"objective": "t", "steps": [
                pick,
                {"id": "left", "type": "human_input", "title": "Left", "question": "Left?",
                 "variable_name": "left_answer", "response_type": "text"},
                {"id": "right", "type": "human_input", "title": "Right", "question": "Right?",
                 "variable_name": "right_answer", "response_type": "text"}
            ]})
            .to_string(),
        );
        write_file(&world.ws, "planning/step_config.json", r#"{"steps": []}"#);
        world
    }

    fn root(&self) -> &str {
        self.ws.to_str().unwrap()
    }

    /// Replaces `rel` in the workspace with a link to `target`.
    fn link(&self, rel: &str, target: impl AsRef<Path>) {
        let path = self.ws.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let _ = std::fs::remove_dir_all(&path);
        let _ = std::fs::remove_file(&path);
        symlink(target, path).unwrap();
    }

    /// Replaces `rel` in the workspace with a FIFO.
    fn fifo(&self, rel: &str) {
        let path = self.ws.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(&path);
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    }

    /// Asserts, in this order, that nothing outside the workspace changed, that no outside
    /// secret was printed, and that the command failed saying `fragment`.
    fn refused(&self, out: &Output, fragment: &str) {
        self.outside_unchanged();
        let text = both(out);
        for secret in ["outside-secret", "s3cr3t"] {
            assert!(!text.contains(secret), "an outside file was read: {text}");
        }
        refused(out, fragment);
    }

    /// Asserts that the command ended well, saying `fragment` (of a file it did not read),
    /// and that nothing outside was read or changed.
    fn said(&self, out: &Output, fragment: &str) {
        self.outside_unchanged();
        let text = both(out);
        assert!(out.status.success(), "{text}");
        assert!(
            !text.contains("outside-secret"),
            "an outside file was read: {text}"
        );
        assert!(text.contains(fragment), "expected {fragment:?} in: {text}");
    }

    /// Asserts that nothing outside the workspace changed.
    fn outside_unchanged(&self) {
        assert_eq!(
            tree_digest(&self.outside),
            self.before,
            "something outside the workspace changed"
        );
    }
}

/// Runs `trellis args`, failing the test when it has not ended within [`BOUND`].
fn bounded(args: &[&str]) -> Output {
    let mut child = support::trellis_command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the trellis binary runs");
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!("trellis {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn both(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The command failed and said `fragment`.
fn refused(out: &Output, fragment: &str) {
    let text = both(out);
    assert!(!out.status.success(), "expected a refusal: {text}");
    assert!(text.contains(fragment), "expected {fragment:?} in: {text}");
}

const LINK: &str = "is a symbolic link; Trellis does not read or write through links";
const SPECIAL: &str = "is not a regular file";

// ------------------------------------------------------------------------------- links

#[test]
fn a_partial_run_with_a_linked_run_folder_removes_nothing_outside() {
    let w = World::scripted("print('hi')\n");
    w.link("runs/iteration-0", &w.outside);
    let out = bounded(&["run", w.root(), "--allow-host", "127.0.0.1", "--step", STEP]);
    w.refused(&out, &format!("runs/iteration-0 {LINK}"));
}

#[test]
fn a_partial_run_with_a_linked_step_folder_removes_nothing_outside() {
    let w = World::scripted("print('hi')\n");
    w.link(
        &format!("runs/iteration-0/execution/{STEP}"),
        w.outside.join("execution/fetch"),
    );
    let out = bounded(&["run", w.root(), "--allow-host", "127.0.0.1", "--step", STEP]);
    w.refused(&out, &format!("runs/iteration-0/execution/{STEP} {LINK}"));
}

#[test]
fn script_writes_no_logs_through_a_linked_logs_folder() {
    let w = World::scripted("print('guest output')\n");
    std::fs::create_dir_all(w.ws.join("runs/iteration-0/execution")).unwrap();
    w.link(
        &format!("runs/iteration-0/logs/{STEP}"),
        w.outside.join("agents"),
    );
    let out = bounded(&["script", w.root(), "--step", STEP]);
    w.refused(&out, &format!("runs/iteration-0/logs/{STEP} {LINK}"));
}

#[test]
fn check_writes_no_report_through_a_linked_logs_folder() {
    let w = World::scripted("print('hi')\n");
    std::fs::create_dir_all(w.ws.join(format!("runs/iteration-0/execution/{STEP}"))).unwrap();
    w.link(
        &format!("runs/iteration-0/logs/{STEP}"),
        w.outside.join("agents"),
    );
    let out = bounded(&["check", w.root(), "--step", STEP]);
    w.refused(&out, LINK);
}

#[test]
fn check_refuses_a_run_folder_outside_the_workspace() {
    let w = World::scripted("print('hi')\n");
    let abs = w.outside.to_str().unwrap().to_string();
    for run in ["../../outside", abs.as_str(), "iteration-0/../../.."] {
        let out = bounded(&["check", w.root(), "--step", STEP, "--run", run]);
        w.refused(&out, "expected a run folder under runs/");
        let out = bounded(&["validate", w.root(), "--run", run]);
        w.refused(&out, "expected a run folder under runs/");
        let out = bounded(&["runs", "show", w.root(), STEP, "--run", run]);
        w.refused(&out, "expected a run folder under runs/");
    }
    w.outside_unchanged();
}

#[test]
fn a_dangling_db_link_is_refused_before_the_guest_runs() {
    let w = World::scripted(
        "import trellis_db\ntrellis_db.execute('CREATE TABLE planted (x)')\nprint('wrote')\n",
    );
    std::fs::create_dir_all(w.ws.join("runs/iteration-0/execution")).unwrap();
    w.link("db/db.sqlite", w.outside.join("planted.sqlite"));
    let out = bounded(&["script", w.root(), "--step", STEP]);
    assert!(
        !w.outside.join("planted.sqlite").exists(),
        "the guest created a database outside"
    );
    w.refused(&out, &format!("db/db.sqlite {LINK}"));
    let out = bounded(&["run", w.root(), "--allow-host", "127.0.0.1"]);
    w.refused(&out, &format!("db/db.sqlite {LINK}"));
}

#[test]
fn a_linked_seed_sql_is_not_loaded_or_printed() {
    let w = World::scripted("print('hi')\n");
    w.link("db/seed.sql", w.outside.join("seed.sql"));
    let out = bounded(&["run", w.root(), "--allow-host", "127.0.0.1"]);
    assert!(
        !w.ws.join("db/db.sqlite").exists(),
        "the outside seed was loaded into the workspace db"
    );
    w.refused(&out, &format!("db/seed.sql {LINK}"));
}

/// Replaces `rel` in the workspace with a hard link to `target` outside.
fn hard_link(w: &World, rel: &str, target: &Path) {
    let path = w.ws.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    std::fs::hard_link(target, path).unwrap();
}

const HARD_LINK: &str = "has other hard links; a file linked from elsewhere (perhaps outside the \
                         workspace) is never read";

/// A hard link to a file outside, where the host reads a workspace's own files, was read
/// and its text printed or sent to the model (round 13, HIGH): the seed a run loads
/// (`db/seed.sql`), the plan, the variables, and a JSON output a gate checks. Every host
/// read of a workspace file now refuses a file with other hard links, naming it, as the
/// guest's and the builder's reads did.
#[test]
fn the_host_reads_no_workspace_file_hard_linked_to_one_outside() {
    let mut w = World::scripted("print('hi')\n");
    w.before = tree_digest(&w.outside);
    hard_link(&w, "db/seed.sql", &w.outside.join("seed.sql"));
    let out = bounded(&["run", w.root(), "--allow-host", "127.0.0.1"]);
    assert!(
        !w.ws.join("db/db.sqlite").exists(),
        "the outside seed was loaded"
    );
    w.refused(&out, &format!("db/seed.sql {HARD_LINK}"));
    std::fs::remove_file(w.ws.join("db/seed.sql")).unwrap();

    for rel in ["planning/plan.json", "variables/variables.json"] {
        let kept = w.ws.join(format!("{rel}.kept"));
        if w.ws.join(rel).exists() {
            std::fs::rename(w.ws.join(rel), &kept).unwrap();
        }
        hard_link(&w, rel, &w.outside.join("secret.json"));
        let out = bounded(&["validate", w.root()]);
        w.refused(&out, &format!("{rel} {HARD_LINK}"));
        std::fs::remove_file(w.ws.join(rel)).unwrap();
        if kept.exists() {
            std::fs::rename(&kept, w.ws.join(rel)).unwrap();
        }
    }

    // A gate's JSON output.
    write_file(
        &w.ws,
        "planning/plan.json",
        json!({"objective": "t", "steps": [
            {"id": STEP, "type": "regular", "title": "Fetch", "description": "fetch",
             "context_output": ["out.json"],
             "validation_schema": {"files": [{"file_name": "out.json", "must_exist": true,
                 "json_checks": [{"path": "$.select_route", "value_type": "number"}]}]}}
        ]})
        .to_string(),
    );
    let out_json = format!("runs/iteration-0/execution/{STEP}/out.json");
    hard_link(&w, &out_json, &w.outside.join("secret.json"));
    let out = bounded(&["check", w.root(), "--step", STEP]);
    w.refused(&out, HARD_LINK);
    // The link itself holds the outside text; nothing else the check wrote may.
    for (file, _) in tree_digest(&w.ws.join("runs")) {
        if file.ends_with("out.json") {
            continue;
        }
        let text = std::fs::read_to_string(w.ws.join("runs").join(&file)).unwrap_or_default();
        assert!(
            !text.contains("outside-secret"),
            "the outside value reached {file}"
        );
    }
}

/// A legacy workspace with one message sequence holding a code item (what `migrate`
/// converts into a scripted step).
fn legacy(w: &World, script_path: &str) {
    write_file(
        &w.ws,
        "planning/plan.json",
        json!({"objective": "t", "steps": [
            {"id": "seq", "type": "message_sequence", "title": "Seq", "items": [
                {"id": "conv", "type": "code", "script_path": script_path,
                 "output_files": ["out.json"]}
            ]}
        ]})
        .to_string(),
    );
    write_file(&w.ws, "planning/step_config.json", r#"{"steps": []}"#);
    write_file(&w.ws, "scripts/conv.py", "print('inside')\n");
    write_file(&w.outside, "outside.py", "print('outside secret')\n");
}

#[test]
fn migrate_does_not_copy_a_linked_script_path_from_outside() {
    let mut w = World::scripted("print('hi')\n");
    legacy(&w, "scripts/linked.py");
    w.before = tree_digest(&w.outside);
    w.link("scripts/linked.py", w.outside.join("outside.py"));
    let out = bounded(&["migrate", w.root()]);
    assert!(
        !w.ws.join("code/conv/main.py").exists(),
        "an outside file was copied into the workspace"
    );
    w.refused(&out, &format!("scripts/linked.py {LINK}"));
    w.outside_unchanged();
}

/// `migrate` copied a hidden or secret-looking `script_path` (`.env`, `.ssh/id_rsa`) into
/// `code/<step>/main.py`, where the builder's read tools showed it (round 12, HIGH): such
/// a path is refused as the read tools refuse it, and nothing is copied.
#[test]
fn migrate_copies_no_hidden_or_secret_looking_script() {
    for (path, reason) in [
        (".env", ".env is hidden (.env)"),
        (".ssh/id_rsa", ".ssh/id_rsa is hidden (.ssh)"),
        (
            "scripts/api_secret.py",
            "scripts/api_secret.py looks like a secret (api_secret.py)",
        ),
    ] {
        let mut w = World::scripted("print('hi')\n");
        legacy(&w, path);
        w.before = tree_digest(&w.outside);
        write_file(&w.ws, path, "OPENAI_API_KEY=s3cr3t\n");
        let plan_before = std::fs::read(w.ws.join("planning/plan.json")).unwrap();
        let out = bounded(&["migrate", w.root()]);
        assert!(!w.ws.join("code/conv").exists(), "{path} was copied");
        w.refused(&out, &format!("item \"conv\": script_path: {reason}"));
        assert_eq!(
            std::fs::read(w.ws.join("planning/plan.json")).unwrap(),
            plan_before
        );
    }
}

/// `migrate` copied a `script_path` that is a hard link to a file outside into the
/// workspace, as a file of its own the model could then read (round 12, MEDIUM).
#[test]
fn migrate_copies_no_hard_linked_script() {
    let mut w = World::scripted("print('hi')\n");
    legacy(&w, "scripts/linked.py");
    w.before = tree_digest(&w.outside);
    std::fs::hard_link(w.outside.join("outside.py"), w.ws.join("scripts/linked.py")).unwrap();
    let out = bounded(&["migrate", w.root()]);
    assert!(
        !w.ws.join("code/conv").exists(),
        "the outside file was copied"
    );
    w.refused(
        &out,
        "script_path \"scripts/linked.py\" has other hard links; a file linked from elsewhere \
         (perhaps outside the workspace) is never copied",
    );
}

/// `migrate` of 900 code items worked for over a minute and wrote a 21 MB plan.json that no
/// command could read back (round 12, MEDIUM): a plan past what Trellis reads is refused
/// before it is validated or written, and the workspace is left as it was.
#[test]
fn migrate_refuses_a_plan_it_could_not_read_back() {
    let w = World::scripted("print('hi')\n");
    // Each item's long description is copied into the step made of it, and its outputs
    // into the context of every later one.
    let items: Vec<_> = (0..400)
        .map(|i| {
            json!({"id": format!("c{i}"), "type": "code", "script_path": "scripts/conv.py",
                   "description": "d".repeat(2000),
                   "output_files": [format!("out-{i}-{}.json", "o".repeat(40))]})
        })
        .collect();
    write_file(
        &w.ws,
        "planning/plan.json",
        json!({"objective": "t", "steps": [
            {"id": "seq", "type": "message_sequence", "title": "Seq", "description": "x".repeat(45_000),
             "items": items}
        ]})
        .to_string(),
    );
    write_file(&w.ws, "planning/step_config.json", r#"{"steps": []}"#);
    write_file(&w.ws, "scripts/conv.py", "print('inside')\n");
    let plan_before = std::fs::read(w.ws.join("planning/plan.json")).unwrap();
    let out = bounded(&["migrate", w.root()]);
    refused(&out, "the migrated planning/plan.json would be ");
    refused(
        &out,
        "bytes, more than the 16777216 Trellis reads of a JSON file; nothing was changed",
    );
    assert_eq!(
        std::fs::read(w.ws.join("planning/plan.json")).unwrap(),
        plan_before
    );
    assert!(!w.ws.join("code/c0").exists());
}

#[test]
fn migrate_does_not_write_through_a_linked_code_folder() {
    let mut w = World::scripted("print('hi')\n");
    legacy(&w, "scripts/conv.py");
    std::fs::remove_dir_all(w.ws.join("code")).unwrap();
    w.before = tree_digest(&w.outside);
    w.link("code", &w.outside);
    let out = bounded(&["migrate", w.root()]);
    w.refused(&out, &format!("code {LINK}"));
}

#[test]
fn migrate_does_not_write_through_a_linked_planning_folder() {
    let mut w = World::scripted("print('hi')\n");
    legacy(&w, "scripts/conv.py");
    let real = w.outside.join("planning");
    std::fs::rename(w.ws.join("planning"), &real).unwrap();
    w.before = tree_digest(&w.outside);
    w.link("planning", &real);
    let out = bounded(&["migrate", w.root()]);
    w.refused(&out, &format!("planning {LINK}"));
}

#[test]
fn a_linked_route_source_file_is_not_read() {
    let w = World::switch(Some("choice.json"));
    std::fs::create_dir_all(w.ws.join("runs/iteration-0/execution")).unwrap();
    w.link(
        "runs/iteration-0/execution/choice.json",
        w.outside.join("secret.json"),
    );
    let out = bounded(&[
        "run",
        w.root(),
        "--allow-host",
        "127.0.0.1",
        "--step",
        "pick",
        "--input",
        "left_answer=L",
        "--input",
        "right_answer=R",
    ]);
    w.refused(
        &out,
        &format!("runs/iteration-0/execution/choice.json {LINK}"),
    );
}

#[test]
fn a_linked_human_input_target_is_not_written_through() {
    let w = World::switch(None);
    std::fs::create_dir_all(w.ws.join("runs/iteration-0/execution")).unwrap();
    w.link("runs/iteration-0/execution/left", w.outside.join("agents"));
    let out = bounded(&[
        "run",
        w.root(),
        "--allow-host",
        "127.0.0.1",
        "--step",
        "left",
        "--input",
        "left_answer=L",
        "--input",
        "right_answer=R",
    ]);
    w.refused(&out, &format!("runs/iteration-0/execution/left {LINK}"));
}

#[test]
fn runs_list_and_show_do_not_follow_links() {
    let w = World::scripted("print('hi')\n");
    let session = json!({"session_id": "s", "step_id": STEP, "run_folder": "iteration-0",
        "status": "completed", "created_at": "t", "updated_at": "t",
        "conversation_history": [], "execution_turn_count": 0,
        "entries": [{"entry_id": "e", "item_id": "i", "item_type": "user_message",
            "status": "completed", "summary": "outside-secret", "started_at": "t",
            "ended_at": "t"}]});
    write_file(&w.outside, "session.json", session.to_string());
    let mut w = w;
    w.before = tree_digest(&w.outside);
    std::fs::create_dir_all(w.ws.join(format!("runs/iteration-0/execution/{STEP}"))).unwrap();
    w.link(
        &format!("runs/iteration-0/execution/{STEP}/session.json"),
        w.outside.join("session.json"),
    );
    w.link("runs/iteration-1", &w.outside);
    // The session is not read: the step says so (a step's folder is its guest's, so what
    // it holds is that step's status, not an error of the whole command).
    let out = bounded(&["runs", "show", w.root(), STEP]);
    w.said(&out, LINK);
    let out = bounded(&["runs", "list", w.root()]);
    w.said(&out, LINK);
}

// ------------------------------------------------------------------------------- FIFOs

#[test]
fn a_fifo_plan_does_not_hang_validate() {
    let w = World::scripted("print('hi')\n");
    w.fifo("planning/plan.json");
    refused(&bounded(&["validate", w.root()]), SPECIAL);
}

#[test]
fn a_fifo_workflow_json_does_not_hang_run() {
    let w = World::scripted("print('hi')\n");
    w.fifo("workflow.json");
    refused(
        &bounded(&["run", w.root(), "--allow-host", "127.0.0.1"]),
        SPECIAL,
    );
}

#[test]
fn a_fifo_step_config_does_not_hang_migrate_or_validate() {
    let w = World::scripted("print('hi')\n");
    w.fifo("planning/step_config.json");
    refused(&bounded(&["migrate", w.root()]), SPECIAL);
    refused(&bounded(&["validate", w.root()]), SPECIAL);
}

#[test]
fn a_fifo_session_does_not_hang_runs() {
    let w = World::scripted("print('hi')\n");
    w.fifo(&format!("runs/iteration-0/execution/{STEP}/session.json"));
    w.said(&bounded(&["runs", "show", w.root(), STEP]), SPECIAL);
    w.said(&bounded(&["runs", "list", w.root()]), SPECIAL);
}

#[test]
fn a_fifo_turn_log_does_not_hang_runs_show() {
    let w = World::scripted("print('hi')\n");
    std::fs::create_dir_all(w.ws.join(format!("runs/iteration-0/execution/{STEP}"))).unwrap();
    w.fifo(&format!(
        "runs/iteration-0/logs/{STEP}/execution-attempt-1-iteration-1.json"
    ));
    refused(&bounded(&["runs", "show", w.root(), STEP]), SPECIAL);
}

/// `text` (JSON) followed by spaces, `len` bytes in all: the same JSON, a larger file.
fn padded(text: &str, len: usize) -> String {
    format!("{text}{}", " ".repeat(len - text.len()))
}

#[test]
fn workspace_json_files_past_the_cap_are_refused_naming_their_size() {
    for rel in [
        "planning/plan.json",
        "planning/step_config.json",
        "workflow.json",
        "variables/variables.json",
    ] {
        let w = World::scripted("print('hi')\n");
        let text = std::fs::read_to_string(w.ws.join(rel)).unwrap_or_else(|_| "{}".into());
        write_file(&w.ws, rel, padded(&text, (16 << 20) + 1));
        let refusal =
            format!("{rel} is 16777217 bytes, more than the 16777216 Trellis reads of a JSON file");
        w.refused(&bounded(&["validate", w.root()]), &refusal);
        w.refused(&bounded(&["run", w.root()]), &refusal);
        assert!(!w.ws.join("runs").exists(), "{rel}: the run started");
    }
}

// ------------------------------------------------------------------ guest-planted links

/// A message sequence step `desk` answered by a fake server: its first turn reads
/// `big.txt` (over the offload threshold) from its own output folder, then it is done.
#[test]
fn offloading_a_large_result_does_not_write_through_a_planted_tool_results_link() {
    let server = FakeServer::start(Box::new(|body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if messages.iter().any(|m| m["role"] == "tool") {
            return (200, completion("done", &[]));
        }
        let read = body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str())
            .find(|n| n.contains("read_file"))
            .expect("a read_file tool is offered")
            .to_string();
        let args = json!({"path": "runs/iteration-0/execution/desk/big.txt"});
        (200, completion("", &[(read.as_str(), args)]))
    }));
    let w = World::scripted("print('unused')\n");
    write_file(
        &w.ws,
        "planning/plan.json",
        json!({"objective": "t", "steps": [
            {"id": "desk", "type": "message_sequence", "title": "Desk",
             "description": "You read files.",
             "items": [{"id": "work", "type": "user_message", "message": "Read big.txt."}]}
        ]})
        .to_string(),
    );
    write_file(
        &w.ws,
        "planning/step_config.json",
        json!({"steps": [{"id": "desk", "agent_configs": {"enable_context_offloading": true}}]})
            .to_string(),
    );
    write_file(
        &w.ws,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": server.providers()})
            .to_string(),
    );
    write_file(
        &w.ws,
        "runs/iteration-0/execution/desk/big.txt",
        "x".repeat(40 * 1024),
    );
    // What a guest with the output folder can plant: a relative link leading out.
    symlink(
        "../../../../../outside",
        w.ws.join("runs/iteration-0/execution/desk/tool-results"),
    )
    .unwrap();
    let out = bounded(&[
        "run",
        w.root(),
        "--allow-host",
        "127.0.0.1",
        "--step",
        "desk",
    ]);
    assert!(server.seen().len() >= 2, "the turn ran: {}", both(&out));
    w.outside_unchanged();
}

/// A guest moves a link it finds in its output folder to `<output>/agents`, then delegates:
/// the host must neither create the sub-agent's folders through it nor read the
/// `session.json` it leads to (and send its values to the model).
#[test]
fn a_guest_planted_agents_link_is_not_followed_by_a_sub_agent_call() {
    let server = FakeServer::start(Box::new(|body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let system = messages[0]["content"].as_str().unwrap_or_default();
        if system.starts_with("You decide refunds.") {
            return (200, completion("refund granted", &[]));
        }
        let tools = messages.iter().filter(|m| m["role"] == "tool").count();
        match tools {
            0 => {
                let args = json!({"from": "runs/iteration-0/execution/desk/planted",
                                  "to": "runs/iteration-0/execution/desk/agents"});
                (
                    200,
                    completion("", &[(tool_named(body, "move_file").as_str(), args)]),
                )
            }
            1 => {
                let args = json!({"route_id": "refunds", "instructions": "Refund order 1."});
                (
                    200,
                    completion("", &[(tool_named(body, "call_sub_agent").as_str(), args)]),
                )
            }
            _ => (200, completion("all handled", &[])),
        }
    }));
    let mut w = World::scripted("print('unused')\n");
    let refunds = json!({"id": "refunds", "type": "message_sequence", "title": "Refunds",
        "description": "You decide refunds.",
        "items": [{"id": "decide", "type": "user_message", "message": "Decide."}]});
    write_file(
        &w.ws,
        "planning/plan.json",
        json!({"objective": "t", "steps": [
            {"id": "desk", "type": "message_sequence", "title": "Desk",
             "description": "You coordinate the desk.",
             "items": [{"id": "work", "type": "user_message", "message": "Handle it."}],
             "predefined_routes": [{"route_id": "refunds", "route_name": "Refunds",
                 "condition": "money back", "sub_agent_step": refunds}]}
        ]})
        .to_string(),
    );
    write_file(&w.ws, "planning/step_config.json", r#"{"steps": []}"#);
    write_file(
        &w.ws,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": server.providers()})
            .to_string(),
    );
    // What the link leads to: a sub-agent home whose session holds an outside secret.
    let session = json!({"session_id": "s", "step_id": "refunds", "run_folder": "iteration-0",
        "status": "completed", "created_at": "t", "updated_at": "t",
        "conversation_history": [{"role": "user", "content": "outside-secret"}],
        "execution_turn_count": 1, "entries": []});
    write_file(&w.outside, "refunds/session.json", session.to_string());
    w.before = tree_digest(&w.outside);
    // Planted by an earlier guest of the step (a relative link, as a guest can make).
    std::fs::create_dir_all(w.ws.join("runs/iteration-0/execution/desk")).unwrap();
    symlink(
        "../../../../../outside",
        w.ws.join("runs/iteration-0/execution/desk/planted"),
    )
    .unwrap();
    let out = bounded(&[
        "run",
        w.root(),
        "--allow-host",
        "127.0.0.1",
        "--step",
        "desk",
    ]);
    assert!(server.seen().len() >= 3, "the turns ran: {}", both(&out));
    w.outside_unchanged();
    let sent = serde_json::to_string(&server.seen()).unwrap();
    assert!(
        !sent.contains("outside-secret"),
        "an outside session was sent to the model"
    );
    // A single-step run empties the step's output folder first: the planted link is
    // removed as a link (never followed), so the guest's move finds nothing to move.
    assert!(
        sent.contains("runs/iteration-0/execution/desk/planted` does not exist"),
        "the link was gone before the agent ran: {sent}"
    );
    assert!(
        std::fs::symlink_metadata(w.ws.join("runs/iteration-0/execution/desk/planted")).is_err()
    );
}

/// Links are refused inside a workspace, not above it: a workspace folder reached through a
/// link (or under a linked /tmp) runs, its database included (SQLite is given the canonical
/// path, since `SQLITE_OPEN_NOFOLLOW` refuses a link anywhere on it).
#[test]
fn a_workspace_reached_through_a_link_still_runs() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    support::workspace::copy_workspace(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ticket-digest"),
        &real,
        &["runs", "db.sqlite"],
    );
    let ws = dir.path().join("ws");
    symlink(&real, &ws).unwrap();
    let out = bounded(&["run", ws.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    assert!(out.status.success(), "{}", both(&out));
    let out = bounded(&["check", ws.to_str().unwrap(), "--step", "digest"]);
    assert!(out.status.success(), "{}", both(&out));
    assert!(real.join("db/db.sqlite").is_file());
}

#[test]
fn a_guest_reading_a_fifo_in_its_grant_is_refused_not_hung() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("data")).unwrap();
    let fifo = root.join("data/pipe");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    let plugins = support::plugin_folder(root, "adversary", "adversary", "tool");
    for (tool, args) in [
        ("adversary:read", r#"{"path": "/data/pipe"}"#),
        (
            "adversary:write",
            r#"{"path": "/data/pipe", "content": "x"}"#,
        ),
    ] {
        let out = bounded(&[
            "tool",
            "call",
            tool,
            "--root",
            root.to_str().unwrap(),
            "--write",
            "data",
            "--args",
            args,
            "--plugins",
            plugins.to_str().unwrap(),
        ]);
        // The guard's `access`, as the guest's raw code.
        let text = both(&out);
        assert!(!out.status.success(), "expected a refusal: {text}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim_end(),
            format!("error: {tool}: failed: EACCES"),
            "{text}"
        );
    }
}

// ------------------------------------------------------------------------------- depth

/// Deeper than a recursive walk or removal survives, and far deeper than any path the
/// system takes (`PATH_MAX`).
const DEEP: usize = 30_000;

/// Makes a chain of `depth` folders named `d` in the folder `top`, one `mkdirat` at a time
/// (no path to the bottom would fit in `PATH_MAX`), with a file at the bottom.
fn deep_chain(top: &Path, depth: usize) {
    chain_of(top, depth, c"d");
}

/// [`deep_chain`] of folders named `name`.
fn chain_of(top: &Path, depth: usize, name: &std::ffi::CStr) {
    use std::os::unix::ffi::OsStrExt;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    let top = std::ffi::CString::new(top.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let mut fd = unsafe { libc::open(top.as_ptr(), flags) };
    assert!(fd >= 0, "{}", std::io::Error::last_os_error());
    for _ in 0..depth {
        // SAFETY: `fd` is an open folder this loop owns, the names are NUL-terminated.
        let next = unsafe {
            assert_eq!(libc::mkdirat(fd, name.as_ptr(), 0o755), 0);
            let next = libc::openat(fd, name.as_ptr(), flags);
            libc::close(fd);
            next
        };
        assert!(next >= 0, "{}", std::io::Error::last_os_error());
        fd = next;
    }
    // SAFETY: as above.
    unsafe {
        let file = libc::openat(
            fd,
            c"bottom.txt".as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
            0o644,
        );
        assert!(file >= 0);
        libc::close(file);
        libc::close(fd);
    }
}

/// A copy of the `ticket-digest` example (no runs, no database) in `dir/ws`.
fn digest_workspace(dir: &Path) -> std::path::PathBuf {
    let ws = dir.join("ws");
    support::workspace::copy_workspace(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ticket-digest"),
        &ws,
        &["runs", "db.sqlite"],
    );
    ws
}

/// Runs `trellis args` (bounded), asserting it succeeded: what it printed.
fn ran(args: &[&str]) -> String {
    let out = bounded(args);
    let text = both(&out);
    assert!(out.status.success(), "trellis {args:?}: {text}");
    text
}

/// A chain of folders 30,000 deep put (outside the sandbox) in a run's `Downloads/` and in
/// a step's output folder: `runs show` still lists the step, a single-step run empties the
/// step's folder, and the full runs after it archive the run and then delete it, each as if
/// the chain were not there.
#[test]
fn a_chain_of_folders_deeper_than_any_stack_does_not_stop_later_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ws = digest_workspace(dir.path());
    // One archived run kept: the third full run deletes the run the chain is in.
    let manifest = ws.join("workflow.json");
    let mut workflow = support::workspace::read_json(&manifest);
    workflow["run_retention_count"] = json!(1);
    std::fs::write(&manifest, workflow.to_string()).unwrap();
    let root = ws.to_str().unwrap();

    ran(&["run", root]);
    let exec = ws.join("runs/iteration-0/execution");
    deep_chain(&exec.join("Downloads"), DEEP);
    deep_chain(&exec.join("export-open"), DEEP);

    let shown = ran(&["runs", "show", root, "export-open"]);
    assert!(shown.contains("open_tickets.json"), "{shown}");

    ran(&["run", root, "--step", "export-open"]);
    assert!(!exec.join("export-open/d").exists());
    assert!(exec.join("export-open/open_tickets.json").is_file());

    ran(&["run", root]);
    assert!(ws.join("runs/iteration-1/execution/Downloads/d").is_dir());
    let third = ran(&["run", root]);
    assert!(
        third.contains(
            "deleted 1 archived run past the 1 kept (run_retention_count): runs/iteration-1"
        ),
        "{third}"
    );
    assert!(!ws.join("runs/iteration-1").exists());
    assert!(
        ws.join("runs/iteration-2/execution/digest/digest.md")
            .is_file()
    );
}

/// A chain of 20 folders of 255-byte names in a step's output folder (a guest makes it in
/// 18 ms, far within the depth limit) passes the longest path the system takes: every later
/// run failed `removing stale temp files ...: File name too long`, and `runs show` with it
/// (round 29, MEDIUM). The walks that name entries by path do not go below such a folder.
#[test]
fn a_chain_of_long_folder_names_does_not_stop_later_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ws = digest_workspace(dir.path());
    let root = ws.to_str().unwrap();
    ran(&["run", root]);
    let long = std::ffi::CString::new("l".repeat(255)).unwrap();
    chain_of(
        &ws.join("runs/iteration-0/execution/export-open"),
        20,
        &long,
    );
    let shown = ran(&["runs", "show", root, "export-open"]);
    assert!(shown.contains("open_tickets.json"), "{shown}");
    ran(&["run", root, "--step", "digest"]);
    ran(&["run", root]);
    assert!(ws.join("runs/iteration-1/execution/export-open").is_dir());
}

/// A guest makes folders at most 256 levels below its granted folder, and cannot join two
/// chains within the limit into a deeper one by moving one into the other.
#[test]
fn a_guest_cannot_make_or_move_folders_past_the_depth_limit() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("granted/x")).unwrap();
    let plugins = support::plugin_folder(dir.path(), "adversary", "adversary", "tool");
    let call = |tool: &str, args: serde_json::Value| {
        bounded(&[
            "tool",
            "call",
            tool,
            "--root",
            root.to_str().unwrap(),
            "--write",
            "granted",
            "--args",
            &args.to_string(),
            "--plugins",
            plugins.to_str().unwrap(),
        ])
    };
    let depth_of = |top: &Path| {
        let (mut path, mut depth) = (top.to_path_buf(), 0);
        while path.join("d").is_dir() {
            path.push("d");
            depth += 1;
        }
        depth
    };
    const LIMIT: &str = "stopped: the plugin made a folder more than 256 levels below its granted folder (the depth limit)";

    let out = call(
        "adversary:deep_dirs",
        json!({"dir": "/granted", "depth": 1000}),
    );
    refused(&out, &format!("adversary:deep_dirs: {LIMIT}"));
    assert_eq!(depth_of(&root.join("granted")), 256);
    std::fs::remove_dir_all(root.join("granted/d")).unwrap();

    for top in ["/granted", "/granted/x"] {
        let out = call("adversary:deep_dirs", json!({"dir": top, "depth": 200}));
        assert!(out.status.success(), "{}", both(&out));
    }
    let before = tree_digest(&root);
    let into_the_other = format!("/granted/{}joined", "d/".repeat(200));
    let out = call(
        "adversary:rename",
        json!({"from": "/granted/x/d", "to": into_the_other}),
    );
    refused(&out, &format!("adversary:rename: {LIMIT}"));
    assert_eq!(tree_digest(&root), before);
    // A move that takes no folder past the limit is the guest's to make.
    let out = call(
        "adversary:rename",
        json!({"from": "/granted/x/d", "to": "/granted/y"}),
    );
    assert!(out.status.success(), "{}", both(&out));
    assert_eq!(depth_of(&root.join("granted/y")), 199);
}
