//! Round 10 of the red team, on `trellis serve`'s scheduler: each finding, through the binary
//! over real HTTP, with the fake model of `serve_schedules`.

use crate::serve_schedules::{ended, job_until, model, with_schedules, workspace};
use crate::support;

use serde_json::{Value, json};
use support::serve::Serve;

/// Triggers schedule `id` and waits for that firing to end; its job.
fn fire(serve: &Serve, id: &str) -> Value {
    let (status, started) = serve.post(&format!("/api/scheduler/jobs/{id}/trigger"), &json!({}));
    assert_eq!(status, 202, "{started}");
    let run = started["run_id"].clone();
    job_until(serve, id, |j| {
        j["last_run"]["id"] == run && j["last_run"]["status"] != "running"
    })
}

fn serve(dir: &std::path::Path, ws: &std::path::Path) -> Serve {
    let config = dir.join("config");
    Serve::start_with(
        ws,
        None,
        &["--allow-host", "127.0.0.1"],
        &[
            ("XDG_CONFIG_HOME", config.to_str().unwrap()),
            ("TRELLIS_SCHEDULER", "off"),
        ],
    )
}

/// A cron that can never match (`0 9 31 2 *`) was accepted, and each evaluation searched for
/// its next firing up to the year 5000: 45 ms a schedule, 100 of them made every listing take
/// 4.6 s and held the server's threads (finding 1, HIGH). It is refused with its JSON path.
#[test]
fn a_cron_that_never_fires_is_refused() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
    let serve = serve(dir.path(), &ws);
    let (status, refused) = serve.post(
        "/api/scheduler/jobs",
        &json!({"id": "never", "cron_expression": "0 9 31 2 *", "enabled": true}),
    );
    assert_eq!(status, 422, "{refused}");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains("schedules[2].cron_expression") && detail.contains("never fires"),
        "{refused}"
    );
    let out = support::trellis(&["validate", ws.to_str().unwrap()]);
    assert!(out.status.success(), "nothing was written");
}

/// A workflow.json that did not load made the scheduler answer `200 {"jobs": []}` and
/// `404 no schedule` for a schedule it has (finding 2, MEDIUM): it answers `422
/// workspace_errors` naming the file's problem with its JSON path, and says none fires.
#[test]
fn a_workflow_json_that_does_not_load_is_named_not_taken_for_no_schedules() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
    let serve = serve(dir.path(), &ws);
    assert_eq!(serve.get("/api/scheduler/jobs", &[]).0, 200);
    with_schedules(
        &ws,
        json!([{"id": "daily", "cron_expression": "0 9 * * *", "timezone": "Nowhere/X"}]),
    );
    for (status, answer) in [
        serve.get("/api/scheduler/jobs", &[]),
        serve.post("/api/scheduler/jobs/daily/trigger", &json!({})),
    ] {
        assert_eq!(
            (status, answer["error"].as_str()),
            (422, Some("workspace_errors")),
            "{answer}"
        );
        let detail = answer["detail"].as_str().unwrap();
        assert!(
            detail.contains("schedules[0].timezone") && detail.contains("none fires"),
            "{answer}"
        );
    }
}

/// The history's entries were answered whole: 200 entries of a 330,000-byte `error` made a
/// 66 MB answer, and 12 clients took 1.2 GB (finding 3, MEDIUM); a file that did not read was
/// replaced at the next firing with no copy, and an entry that did not read was dropped
/// (finding 4, LOW). An entry's `error` is cut to 4 KiB; a file over 4 MiB, or one that does
/// not parse, is named in `history_error` and set aside whole when the next entry is written;
/// an entry that does not read stays in the file.
#[test]
fn the_history_is_bounded_and_an_unreadable_one_is_kept_aside() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
    let history = ws.join("schedule-runs.json");
    let entry = |id: &str, error: &str| {
        json!({"id": id, "schedule_id": "daily", "trigger_source": "cron",
               "run_folder": "iteration-0", "status": "error", "error": error,
               "started_at": "2026-12-01T09:00:00Z"})
    };
    let odd = json!({"id": "odd", "status": "weird"});
    std::fs::write(
        &history,
        json!([entry("big", &"E".repeat(330_000)), odd.clone()]).to_string(),
    )
    .unwrap();
    let serve = serve(dir.path(), &ws);
    let (status, job) = serve.get("/api/scheduler/jobs/daily", &[]);
    assert_eq!(status, 200, "{job}");
    let error = job["last_run"]["error"].as_str().unwrap();
    assert!(error.len() <= 4200, "cut: {} bytes", error.len());
    assert_eq!(job["history_error"], Value::Null);

    // A run recorded keeps the entry that does not read as a run.
    fire(&serve, "daily");
    let kept: Value = serde_json::from_slice(&std::fs::read(&history).unwrap()).unwrap();
    assert!(kept.as_array().unwrap().contains(&odd), "{kept}");

    // Over 4 MiB: named, then set aside whole when the next entry is written.
    let many: Vec<Value> = (0..1300)
        .map(|i| entry(&format!("e{i}"), &"x".repeat(4000)))
        .collect();
    let huge = serde_json::to_vec(&many).unwrap();
    assert!(huge.len() > 4 << 20);
    std::fs::write(&history, &huge).unwrap();
    let (_, jobs) = serve.get("/api/scheduler/jobs", &[]);
    assert!(
        jobs["history_error"]
            .as_str()
            .is_some_and(|e| e.contains("more than")),
        "{jobs}"
    );
    let job = fire(&serve, "daily");
    assert_eq!(job["history_error"], Value::Null, "{job}");
    let aside: Vec<std::path::PathBuf> = std::fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("schedule-runs.unreadable-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), huge, "kept whole");

    // One that does not parse: set aside too.
    std::fs::write(&history, br#"[{"id": "keep-me", "status": "success""#).unwrap();
    let (_, jobs) = serve.get("/api/scheduler/jobs", &[]);
    assert!(jobs["history_error"].is_string(), "{jobs}");
    fire(&serve, "daily");
    let set_aside = std::fs::read_dir(&ws)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("schedule-runs.unreadable-")
        })
        .count();
    assert_eq!(set_aside, 2);
}

/// A schedule deleted while it fired went on firing, with nothing left to stop it by
/// (finding 5, LOW): a delete is refused while it fires, naming the stop.
#[test]
fn a_firing_schedule_is_not_deleted_under_its_firing() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
    let serve = serve(dir.path(), &ws);
    let (status, _) = serve.post("/api/scheduler/jobs/slow/trigger", &json!({}));
    assert_eq!(status, 202);
    job_until(&serve, "slow", |j| j["firing"] == true);
    let (status, _, text) = serve.request("DELETE", "/api/scheduler/jobs/slow", &[], "");
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("/stop"), "{text}");
    serve.post("/api/scheduler/jobs/slow/stop", &json!({}));
    assert_eq!(ended(&serve, "slow")["last_run"]["status"], "stopped");
    let (status, _, text) = serve.request("DELETE", "/api/scheduler/jobs/slow", &[], "");
    assert_eq!(status, 200, "{text}");
}

/// A second Ctrl-C promised to interrupt guest code, but a step script ran on to its 120 s
/// deadline (host finding 1, MEDIUM): the script is now one of the calls it cancels, and the
/// step ends `stopped`, not timed out.
#[test]
fn a_second_ctrl_c_interrupts_a_running_step_script() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ticket-digest");
    support::workspace::copy_workspace(&example, &ws, &["runs", "db.sqlite"]);
    std::fs::write(
        ws.join("code/export-open/main.py"),
        "print('looping', flush=True)\nwhile True:\n    pass\n",
    )
    .unwrap();
    let child = support::trellis_command(&["run", ws.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The script runs once its step's session says so.
    let session = ws.join("runs/iteration-0/execution/export-open/session.json");
    let waited = std::time::Instant::now();
    while !session.is_file() {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(120),
            "the step never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    for _ in 0..2 {
        // SAFETY: kill(2) on the child's pid, ours and running (its script loops).
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("cancelling the tool calls running"), "{said}");
    assert!(
        !said.contains("did not finish within"),
        "not timed out: {said}"
    );
    let summary: Value = serde_json::from_slice(
        &std::fs::read(
            ws.join("runs/iteration-0/execution/export-open/execution-final-summary.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(summary["status"], "stopped", "{summary}\n{said}");
}

/// The second Ctrl-C did not cancel a call to an external MCP server either: the run waited
/// for the server's 300 s answer timeout (host finding 2, MEDIUM). The call ends cancelled,
/// and the run ends stopped.
#[test]
fn a_second_ctrl_c_cancels_a_call_to_an_external_mcp_server() {
    use support::mcp_servers::{asking_for, fixture_entry, server_file, with_servers};
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = server_file(
        &dir.path().join("servers.json"),
        json!({"fx": fixture_entry(&started)}),
    );
    let llm = asking_for(vec![("fx__hang", json!({"seconds": 600}))]);
    let ws = dir.path().join("ws");
    support::mcp_servers::workspace(&ws, json!({"selected_tools": ["fx:hang"]}), &llm);
    let child = with_servers(&["run", ws.to_str().unwrap()], &config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let waited = std::time::Instant::now();
    while llm.seen().is_empty() {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(120),
            "the run never reached the model"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The call is under way once the model asked for it.
    std::thread::sleep(std::time::Duration::from_secs(3));
    for _ in 0..2 {
        // SAFETY: kill(2) on the child's pid, ours and running (its tool call hangs).
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!said.contains("no answer within"), "not timed out: {said}");
    let session: Value = serde_json::from_slice(
        &std::fs::read(ws.join("runs/iteration-0/execution/work/session.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(session["status"], "stopped", "{session}\n{said}");
    assert!(
        session.to_string().contains("the call was cancelled"),
        "{session}"
    );
}

/// A second server started on the workspace marked the first one's live firing
/// `interrupted` (server finding 6, LOW): an entry names the process running it, and one
/// whose process is alive is left running.
#[test]
fn a_second_server_leaves_a_live_firing_running() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
    let first = serve(dir.path(), &ws);
    let (status, _) = first.post("/api/scheduler/jobs/slow/trigger", &json!({}));
    assert_eq!(status, 202);
    job_until(&first, "slow", |j| j["firing"] == true);
    let second = serve(dir.path(), &ws);
    let (_, job) = second.get("/api/scheduler/jobs/slow", &[]);
    assert_eq!(job["last_run"]["status"], "running", "{job}");
    assert!(job["last_run"]["pid"].is_u64(), "{job}");
    first.post("/api/scheduler/jobs/slow/stop", &json!({}));
    let job = ended(&first, "slow");
    assert_eq!(job["last_run"]["status"], "stopped", "{job}");
    assert!(
        job["last_run"]["pid"].is_null(),
        "an ended entry names no process: {job}"
    );
}
