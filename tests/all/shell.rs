//! The bundled shell, `shell:execute_shell_command`, through the binary: an agent step
//! written for the original doing its file work with shell commands against the fake
//! OpenAI-compatible server, and every way out a shell user would try, each denied or
//! bounded with nothing outside the grant changed (tree digests of the whole root).

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion, result_of};
use support::workspace::{create_db, write_files};
use support::{tree_digest, trellis};

const SHELL: &str = "shell__execute_shell_command";

use crate::support::plugin_build::text;

/// A server answering the n-th request with `replies[n]` (the last one after that).
fn scripted(replies: Vec<Value>) -> FakeServer {
    let n = Arc::new(AtomicUsize::new(0));
    FakeServer::start(Box::new(move |_| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        (200, replies[i.min(replies.len() - 1)].clone())
    }))
}

/// A completion asking for one shell command.
fn shell(id: &str, command: &str) -> Value {
    let mut c = completion("", &[("x", json!({}))]);
    c["choices"][0]["message"]["tool_calls"] = json!([{"id": id, "type": "function",
        "function": {"name": SHELL, "arguments": json!({"command": command}).to_string()}}]);
    c
}

/// The shell's JSON result of call `id` in the request that answered it.
fn shell_result(server: &FakeServer, request: usize, id: &str) -> Value {
    let results = server.tool_results(request);
    let raw = result_of(&results, id);
    serde_json::from_str(&raw).unwrap_or_else(|e| panic!("{id}: {e}: {raw}"))
}

/// Every file named `name` under `root`.
fn find(root: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if entry.file_name() == name {
                found.push(path);
            }
        }
    }
    found
}

/// A step as the original writes it (`enabled_custom_tools: ["workspace_advanced:*"]`, a
/// description telling the agent to use shell commands) runs against a model that uses
/// `execute_shell_command` for `ls`, `grep -rn`, `cat | jq`, a redirect into its output
/// folder and `python3 -c`; its report passes the step's gate.
#[test]
fn a_step_written_for_the_original_does_its_file_work_in_the_shell() {
    let server = scripted(vec![
        shell("ls", "ls /knowledgebase/notes"),
        shell("grep", "grep -rn refund /knowledgebase"),
        shell(
            "jq",
            "cat /knowledgebase/tickets.json | jq '.tickets | length'",
        ),
        shell(
            "write",
            "grep -rl refund /knowledgebase | sort | jq -R . | jq -s '{files: ., count: length}' > report.json && cat report.json",
        ),
        shell(
            "py",
            "python3 -c \"import json; r = json.load(open('report.json')); r['checked'] = len(r['files']) == r['count']; json.dump(r, open('report.json', 'w'))\"",
        ),
        completion("Report written.", &[]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let plan = json!({"objective": "refunds", "steps": [{
        "id": "survey", "type": "regular", "title": "Survey",
        "description": "Use execute_shell_command for file access: find the notes that mention refunds and write report.json.",
        "validation_schema": {"files": [{"file_name": "report.json", "must_exist": true,
            "json_checks": [
                {"path": "$.files", "value_type": "array", "min_length": 2},
                {"path": "$.count", "consistency_check": {"type": "array_length", "compare_with_path": "$.files"}},
                {"path": "$.checked", "must_exist": true}]}]}}]});
    write_files(
        root,
        &[
            ("planning/plan.json", plan.to_string()),
            (
                "planning/step_config.json",
                json!({"steps": [{"id": "survey", "agent_configs":
                    {"enabled_custom_tools": ["workspace_advanced:*"]}}]})
                .to_string(),
            ),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": server.providers()})
                .to_string(),
            ),
            (
                "knowledgebase/notes/refunds.md",
                "# Refunds\nA refund is due within 30 days.\n".to_string(),
            ),
            (
                "knowledgebase/notes/shipping.md",
                "Shipping takes 3 days.\nNo refund on shipping.\n".to_string(),
            ),
            (
                "knowledgebase/notes/other.md",
                "Nothing here.\n".to_string(),
            ),
            (
                "knowledgebase/tickets.json",
                json!({"tickets": [{"id": 1}, {"id": 2}, {"id": 3}]}).to_string(),
            ),
        ],
    );
    create_db(root, "CREATE TABLE t(x);");
    let knowledge = tree_digest(&root.join("knowledgebase"));

    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    let seen = server.seen();
    let offered: Vec<&str> = seen[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(offered.contains(&SHELL), "{offered:?}");

    let ls = shell_result(&server, 1, "ls");
    assert_eq!(ls["exit_code"], 0, "{ls}");
    assert_eq!(ls["stdout"], "other.md\nrefunds.md\nshipping.md\n", "{ls}");
    let grep = shell_result(&server, 2, "grep");
    let lines: Vec<&str> = grep["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(
        lines,
        [
            "/knowledgebase/notes/refunds.md:2:A refund is due within 30 days.",
            "/knowledgebase/notes/shipping.md:2:No refund on shipping.",
        ],
        "{grep}"
    );
    let jq = shell_result(&server, 3, "jq");
    assert_eq!(jq["stdout"], "3\n", "{jq}");
    let write = shell_result(&server, 4, "write");
    assert_eq!(write["exit_code"], 0, "{write}");
    let py = shell_result(&server, 5, "py");
    assert_eq!(py["exit_code"], 0, "{py}");
    assert!(
        py["working_dir"]
            .as_str()
            .unwrap()
            .ends_with("/execution/survey"),
        "{py}"
    );

    let reports = find(&root.join("runs"), "report.json");
    assert_eq!(reports.len(), 1, "{reports:?}");
    let report: Value = serde_json::from_slice(&std::fs::read(&reports[0]).unwrap()).unwrap();
    assert_eq!(
        report,
        json!({"files": ["/knowledgebase/notes/refunds.md", "/knowledgebase/notes/shipping.md"],
               "count": 2, "checked": true})
    );
    assert_eq!(tree_digest(&root.join("knowledgebase")), knowledge);
}

/// `trellis tool call` with the issue's own command: the read is denied and `ls /` shows
/// the grant's root, nothing else.
#[test]
fn tool_call_shows_the_denial_and_the_grants_root_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_files(root, &[("notes/a.md", "a"), ("private/key.txt", "secret")]);
    let out = trellis(&[
        "tool",
        "call",
        "shell:execute_shell_command",
        "--args",
        r#"{"command":"cat ../../etc/passwd; ls /"}"#,
        "--root",
        root.to_str().unwrap(),
        "--read",
        "notes",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["stdout"], "notes\n", "{result}");
    let stderr = result["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("cat: ../../etc/passwd: Operation not permitted"),
        "{stderr}"
    );
    assert!(!result.to_string().contains("root:"), "{result}");
    assert_eq!(result["working_dir"], "/notes");
}

/// Runs `command` in the shell under `--read notes --write out --db db/db.sqlite
/// --db-write` of `root`, within `timeout` seconds; the result.
fn call(root: &Path, command: &str, timeout: &str) -> Value {
    let out = trellis(&[
        "tool",
        "call",
        "shell:execute_shell_command",
        "--args",
        &json!({"command": command}).to_string(),
        "--root",
        root.to_str().unwrap(),
        "--read",
        "notes",
        "--write",
        "out",
        "--db",
        "db/db.sqlite",
        "--timeout",
        timeout,
    ]);
    assert!(out.status.success(), "{command}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A workspace with a read-only `notes/`, a writable `out/`, a database, and files beside
/// them the grant leaves out; and a folder outside the workspace.
fn attack_ground() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    let outside = dir.path().join("outside");
    write_files(
        &root,
        &[
            ("notes/a.md", "alpha\n"),
            ("private/key.txt", "secret-value\n"),
            ("out/.keep", ""),
        ],
    );
    write_files(&outside, &[("target.txt", "outside\n")]);
    create_db(&root, "CREATE TABLE t(x); INSERT INTO t VALUES (1);");
    (dir, root, outside)
}

/// Every way out a shell user would try: each is denied, and nothing outside `out/`
/// changed (the workspace's other folders, the database's folder, a folder outside).
#[test]
fn every_way_out_of_the_shell_is_denied_and_nothing_outside_the_grant_changes() {
    let (dir, root, outside) = attack_ground();
    let target = outside.join("target.txt");
    let tries = [
        // Leaving the root: `..` stays at `/`, which holds the grant's folders only.
        ("cd ..; cd ../..; pwd; ls", "/\nnotes\nout\n"),
        (
            "ls /proc /etc /tmp /root 2>&1 | grep -c 'No such file'",
            "4\n",
        ),
        (
            "cat /private/key.txt ../private/key.txt 2>/dev/null; echo $?",
            "1\n",
        ),
        // Links: none can be made, to the outside or inside.
        (
            &format!(
                "ln -s {} /out/l; ln /notes/a.md /out/h; ls /out",
                target.display()
            ),
            "",
        ),
        // What the guest has no command for.
        (
            "mkfifo /out/f; chmod 777 /out; chown 0 /out; mount; nc 127.0.0.1 1; echo $?",
            "127\n",
        ),
        // Writes outside the read-write folder.
        (
            "echo x > /notes/a.md; rm /notes/a.md; mv /notes/a.md /out/; touch /n; mkdir /new; cat /notes/a.md",
            "alpha\n",
        ),
        // Python and SQLite reach no more than the shell.
        (
            &format!(
                "python3 -c \"import os; os.symlink('{}', '/out/p')\" 2>&1 | tail -1",
                target.display()
            ),
            &format!(
                "PermissionError: [Errno 63] Operation not permitted: '{}' -> '/out/p'\n",
                target.display()
            ),
        ),
        (
            &format!(
                "python3 -c \"print(open('{}').read())\" 2>&1 | tail -1",
                target.display()
            ),
            &format!(
                "FileNotFoundError: [Errno 44] No such file or directory: '{}'\n",
                target.display()
            ),
        ),
        (
            &format!(
                "sqlite3 /db/db.sqlite \"ATTACH DATABASE '{}/x.db' AS x\"; sqlite3 /db/db.sqlite 'SELECT x FROM t'",
                outside.display()
            ),
            "1\n",
        ),
        (
            &format!(
                "sqlite3 {}/x.db 'CREATE TABLE y(a)'; echo $?",
                outside.display()
            ),
            "1\n",
        ),
    ];
    let before = tree_digest(dir.path());
    for (command, stdout) in tries {
        let result = call(&root, command, "30");
        assert_eq!(result["stdout"], stdout, "{command}: {result}");
    }
    let mut after = tree_digest(dir.path());
    // `out/` is the grant's to change; nothing was written even there.
    after.retain(|path, _| !path.starts_with("ws/out/") || path == "ws/out/.keep");
    assert_eq!(after, before);
    assert!(!outside.join("x.db").exists());
}

/// Scripts that would run without end, nest without end or print without end are each
/// stopped by a bound, and the call answers well within its deadline.
#[test]
fn endless_scripts_are_bounded() {
    let (_dir, root, _outside) = attack_ground();
    let cases = [
        ("while true; do :; done".to_string(), "steps"),
        ("f() { f; }; f".to_string(), "nested 64 deep"),
        // Nesting chained through function bodies and eval, each text within its own bound,
        // together past the stack (round 18): stopped, not crashed.
        (
            format!("f() {{ {}f; {}}}; f", "{ ".repeat(150), "}; ".repeat(150)),
            "together",
        ),
        (
            format!(
                "a='{}e; {}'; e() {{ eval \"$a\"; }}; e",
                "{ ".repeat(190),
                "}; ".repeat(190)
            ),
            "together",
        ),
        ("f() { f | f; }; f".to_string(), "nested 64 deep"),
        ("yes | head -2 > /out/y; cat /out/y".to_string(), "y\ny\n"),
        (
            "seq 1 100000000 | tail -1".to_string(),
            "cut at the 16777216 bytes",
        ),
        ("sleep 100".to_string(), "stopped at the call's deadline"),
    ];
    for (command, expected) in cases {
        let command = command.as_str();
        let started = std::time::Instant::now();
        let result = call(&root, command, "8");
        let all = format!(
            "{}{}",
            result["stdout"].as_str().unwrap(),
            result["stderr"].as_str().unwrap()
        );
        assert!(all.contains(expected), "{command}: {result}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{command}: {:?}",
            started.elapsed()
        );
    }
    // Output past the tool result's cap (1 MiB) is cut, and said.
    let result = call(&root, "seq 1 1000000", "30");
    assert_eq!(result["stdout"].as_str().unwrap().len(), 1 << 20);
    let stderr = result["stderr"].as_str().unwrap();
    assert!(stderr.contains("cut at the 1048576 bytes"), "{stderr}");
}

/// The commands of one call write from the call's one filesystem budget: two commands of
/// 6,000 files each, each under the 10,000 entries one call may make, together are over it,
/// and the call fails naming the limit.
#[test]
fn the_commands_of_a_call_share_its_write_budget() {
    let (_dir, root, _outside) = attack_ground();
    let out = trellis(&[
        "tool",
        "call",
        "shell:execute_shell_command",
        "--args",
        &json!({"command": "seq 1 6000 | split -l 1 -a 4 - /out/a; seq 1 6000 | split -l 1 -a 4 - /out/b"})
            .to_string(),
        "--root",
        root.to_str().unwrap(),
        "--write",
        "out",
    ]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("10000"), "{stderr}");
    let made = std::fs::read_dir(root.join("out")).unwrap().count();
    assert!((6000..=10_001).contains(&made), "{made}");
}

/// `trellis:shell/commands` is the bundled shell's alone: the same component loaded as a
/// third-party plugin does not load, and says which import it lacks.
#[test]
fn a_third_party_plugin_cannot_import_the_shells_commands() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("myshell");
    let shell = trellis_sandbox::bundled::PLUGINS
        .iter()
        .find(|p| p.id == "shell")
        .unwrap();
    write_files(
        &folder,
        &[
            ("shell.wasm", shell.component.to_vec()),
            (
                "plugin.json",
                json!({"id": "myshell", "kind": "tool", "version": "0.1.0",
                       "description": "a copy of the shell", "component": "shell.wasm"})
                .to_string()
                .into_bytes(),
            ),
        ],
    );
    let out = trellis(&[
        "tool",
        "call",
        "myshell:execute_shell_command",
        "--plugins",
        folder.to_str().unwrap(),
        "--args",
        r#"{"command":"ls"}"#,
    ]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("needs an import a tool plugin is not given")
            && stderr.contains("trellis:shell/commands"),
        "{stderr}"
    );
}

/// The builder's `execute_shell_command`, in a mode that writes files: the mode's folders
/// read-write, the workspace's content folders read-only, the database read-only, nothing
/// at the workspace's root (its hidden files) and no mode without file tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builders_shell_works_under_the_modes_grant() {
    use trellis_builder::{BuilderObserver, Mode, ToolContext, files};
    use trellis_sandbox::capabilities::DbWriteBudget;
    use trellis_sandbox::{Limits, PluginRegistry};

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    write_files(
        &root,
        &[
            (
                "planning/plan.json",
                r#"{"objective": "the objective", "steps": []}"#,
            ),
            ("knowledgebase/notes/a.md", "alpha\n"),
            (".env", "OPENAI_API_KEY=sk-secret\n"),
        ],
    );
    create_db(&root, "CREATE TABLE t(x); INSERT INTO t VALUES (1), (2);");
    let registry = PluginRegistry::with_bundled(support::engine())
        .await
        .unwrap();
    let limits = Limits::default();
    let observer = BuilderObserver::none();
    let writes = DbWriteBudget::new(limits.fs);
    let work = trellis_builder::call_work();
    let ctx = ToolContext {
        root: &root,
        mode: Mode::Builder,
        registry: &registry,
        limits: &limits,
        turn_writes: &writes,
        session_id: "test",
        observer: &observer,
        work: &work,
    };
    let script = "pwd; ls /; jq -r .objective /planning/plan.json; echo made > /code/new.txt; \
                  echo no > /planning/z; cat /.env; sqlite3 /db/db.sqlite 'SELECT count(*) FROM t'; \
                  sqlite3 /db/db.sqlite 'DELETE FROM t'";
    let result = files::shell(&ctx, &json!({"command": script}))
        .await
        .unwrap();
    let stdout = result["stdout"].as_str().unwrap();
    assert_eq!(
        stdout, "/code\ncode\nknowledgebase\nlearnings\nplanning\nthe objective\n2\n",
        "{result}"
    );
    let stderr = result["stderr"].as_str().unwrap();
    assert!(stderr.contains("/planning/z"), "{stderr}");
    assert!(stderr.contains("cat: /.env: No such file"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(root.join("code/new.txt")).unwrap(),
        "made\n"
    );
    assert!(!root.join("planning/z").exists());
    let conn = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 2, "the database is read-only to the builder's shell");
    for mode in [Mode::Run, Mode::Debugger] {
        assert!(!mode.allows("execute_shell_command"), "{mode}");
    }
    assert!(Mode::Output.allows("execute_shell_command"));
}

/// Round 15 of the red team (the shell's own): a command writing to `/dev/null` failed and
/// lost its status; `python3`'s output was cut to 8 KiB without a word; output that grew
/// past 4 MiB when escaped as JSON failed the whole call; a loop of short commands that
/// reached the deadline lost everything it printed. Each now answers as it should.
#[test]
fn output_to_dev_null_big_python_output_escaped_floods_and_the_deadline_keep_the_result() {
    let (_dir, root, _outside) = attack_ground();
    let result = call(
        &root,
        "if grep -q alpha /notes/a.md > /dev/null; then echo found; fi; \
         grep alpha /notes/a.md > /dev/null 2>&1; echo $?; \
         python3 -c 'print(\"a\" * 100000)' | wc -c; \
         python3 -c 'print(\"x\" * 9000)' > /out/py.txt; wc -c < /out/py.txt",
        "30",
    );
    assert_eq!(result["stdout"], "found\n0\n100001\n9001\n", "{result}");

    let result = call(
        &root,
        "python3 -c 'import sys; sys.stdout.write(chr(1) * 1000000); sys.stderr.write(chr(2) * 1000000)'",
        "30",
    );
    assert_eq!(result["exit_code"], 0, "{result}");
    let dropped = result["stdout_bytes_dropped"].as_u64().unwrap();
    assert_eq!(
        result["stdout"].as_str().unwrap().len() as u64 + dropped,
        1_000_000
    );

    let result = call(
        &root,
        "echo started; while true; do cat /notes/a.md > /dev/null; done",
        "4",
    );
    assert_eq!(result["stdout"], "started\n", "{result}");
    assert_eq!(result["exit_code"], 2, "{result}");
    let stderr = result["stderr"].as_str().unwrap();
    assert!(stderr.contains("ran past its timeout"), "{stderr}");
}

/// One call's endless database statement held up every other call of its turn: the calls of
/// a turn run together in one task, and the statement ran on its thread (round 15, LOW). A
/// statement runs on the blocking pool now: the other call ends while it still runs.
#[test]
fn a_long_database_statement_holds_up_its_own_call_only() {
    const ENDLESS: &str =
        "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) SELECT count(*) FROM c";
    let slow =
        format!("date +%s%N > a_start; sqlite3 /db/db.sqlite '{ENDLESS}'; date +%s%N > a_end");
    // `b` ends once `a` has started (however late a loaded machine starts it), and a second
    // on.
    const WAIT_FOR_A: &str = "n=0; while [ ! -e a_start ] && [ $n -lt 100 ]; do sleep 0.1; \
         n=$((n + 1)); done; sleep 1; date +%s%N > b";
    let mut both = completion("", &[("x", json!({}))]);
    both["choices"][0]["message"]["tool_calls"] = json!([
        {"id": "a", "type": "function", "function": {"name": SHELL,
            "arguments": json!({"command": slow}).to_string()}},
        {"id": "b", "type": "function", "function": {"name": SHELL,
            "arguments": json!({"command": WAIT_FOR_A}).to_string()}}
    ]);
    let server = scripted(vec![both, completion("done", &[])]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "w", "type": "regular", "title": "W", "description": "d"}]})
                .to_string(),
            ),
            (
                "planning/step_config.json",
                json!({"steps": [{"id": "w", "agent_configs":
                    {"selected_tools": ["shell:execute_shell_command"]}}]})
                .to_string(),
            ),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": server.providers()})
                .to_string(),
            ),
        ],
    );
    create_db(root, "CREATE TABLE t(x);");
    let out = trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--max-concurrent-calls",
        "2",
        "--max-turn-call-seconds",
        "16",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let read = |name: &str| -> u128 {
        let path = find(&root.join("runs"), name);
        assert_eq!(path.len(), 1, "{name}: {path:?}");
        std::fs::read_to_string(&path[0])
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // Order, not durations: `b` ended while `a`'s statement still ran.
    assert!(read("a_start") < read("b"));
    assert!(read("b") < read("a_end"));
}
