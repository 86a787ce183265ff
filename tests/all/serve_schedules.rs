//! Schedules fired by `trellis serve`, through the binary over real HTTP, the builder and the
//! steps on a fake model: a cron occurrence fires (the scheduler's clock started just before
//! it with `TRELLIS_SCHEDULER_CLOCK`) as a run-mode builder session whose execution runs the
//! step, recorded `success` in `schedule-runs.json`; a manual trigger, a second one refused
//! while it runs; disable edits workflow.json and logs it; the global pause; and a server
//! killed mid-firing marks the firing `interrupted` when it starts again.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::serve::Serve;
use support::workspace::write_files;

/// A model for the builder and the step: the builder runs step `greet` for "run greet",
/// waits forever for "hang", and answers the rest; the step's agent completes.
fn model() -> FakeServer {
    FakeServer::start(Box::new(|body| {
        let builder = body["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["function"]["name"] == "execute_step"));
        if !builder {
            return (200, completion("Hi. STATUS: COMPLETED", &[]));
        }
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or(Value::Null);
        let text = last["content"].as_str().unwrap_or_default();
        if last["role"] == "user" && text == "hang" {
            std::thread::sleep(Duration::from_secs(600));
        }
        if last["role"] == "user" && text == "run greet" {
            return (
                200,
                completion("", &[("execute_step", json!({"step_id": "greet"}))]),
            );
        }
        (200, completion("done", &[]))
    }))
}

fn workspace(dir: &Path, llm: &FakeServer) -> std::path::PathBuf {
    let ws = dir.join("ws");
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "greet", "type": "regular", "title": "Greet", "description": "Say hi."}
                ]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                "providers": llm.providers(),
                "schedules": [
                    {"id": "daily", "name": "Daily", "cron_expression": "0 9 * * *",
                     "timezone": "UTC", "enabled": true, "messages": ["run greet"]},
                    {"id": "slow", "cron_expression": "0 3 1 1 *", "enabled": false,
                     "messages": ["hang"]}
                ]})
                .to_string(),
            ),
        ],
    );
    ws
}

/// Polls `GET /api/scheduler/jobs` until schedule `id`'s job satisfies `until`; the job.
fn job_until(serve: &Serve, id: &str, until: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (status, jobs) = serve.get("/api/scheduler/jobs", &[]);
        assert_eq!(status, 200, "{jobs}");
        let job = jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == id)
            .cloned()
            .unwrap_or(Value::Null);
        if until(&job) {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "schedule {id} never got there: {job}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_schedule_fires_in_serve_and_its_history_says_how_it_went() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
    let config = dir.path().join("config");
    // The scheduler's clock starts three seconds before the schedule's 09:00.
    let day = trellis_runner::session::now_rfc3339()[..10].to_string();
    let clock = format!("{day}T08:59:57Z");
    let envs = [
        ("TRELLIS_SCHEDULER_CLOCK", clock.as_str()),
        ("XDG_CONFIG_HOME", config.to_str().unwrap()),
    ];
    let serve = Serve::start_with(&ws, None, &["--allow-host", "127.0.0.1"], &envs);
    let (_, jobs) = serve.get("/api/scheduler/jobs", &[]);
    assert_eq!(
        jobs["jobs"][0]["next_firing"],
        format!("{day}T09:00:00+00:00"),
        "{jobs}"
    );
    assert_eq!(
        jobs["jobs"][1]["next_firing"],
        Value::Null,
        "disabled: {jobs}"
    );

    let job = job_until(&serve, "daily", |j| {
        j["last_run"]["status"]
            .as_str()
            .is_some_and(|s| s != "running")
    });
    let run = &job["last_run"];
    assert_eq!(run["status"], "success", "{job}");
    assert_eq!(run["trigger_source"], "cron");
    assert_eq!(run["scheduled_for"], format!("{day}T09:00:00Z"));
    let session = run["session_id"].as_str().unwrap();
    let conversations = std::fs::read_dir(ws.join("builder/conversation"))
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|d| d.is_dir())
        .flat_map(|d| std::fs::read_dir(d).unwrap())
        .map(|f| f.unwrap().file_name().to_string_lossy().to_string())
        .collect::<Vec<_>>();
    assert!(
        conversations.contains(&format!("session-{session}-conversation.json")),
        "{conversations:?}"
    );
    let (_, runs) = serve.get("/api/workflow/runs", &[]);
    assert!(
        runs["runs"][0]["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["step_id"] == "greet" && s["status"] == "completed"),
        "{runs}"
    );
    let history: Value =
        serde_json::from_slice(&std::fs::read(ws.join("schedule-runs.json")).unwrap()).unwrap();
    assert_eq!(history[0]["schedule_id"], "daily", "{history}");
    assert_eq!(history[0]["status"], "success");

    // A manual trigger fires a disabled schedule; a second is refused while it runs.
    let (status, started) = serve.post("/api/scheduler/jobs/slow/trigger", &json!({}));
    assert_eq!(status, 202, "{started}");
    let (status, busy) = serve.post("/api/scheduler/jobs/daily/trigger", &json!({}));
    assert_eq!(
        (status, busy["error"].as_str()),
        (409, Some("workflow_busy")),
        "{busy}"
    );
    let (status, query) = serve.post("/api/query", &json!({"query": "hello"}));
    assert_eq!(status, 409, "a builder turn waits for the firing: {query}");
    job_until(&serve, "slow", |j| j["firing"] == true);
    // The server dies mid-firing; started again, it marks the firing interrupted.
    drop(serve);
    let serve = Serve::start_with(&ws, None, &["--allow-host", "127.0.0.1"], &envs);
    let job = job_until(&serve, "slow", |j| !j["last_run"].is_null());
    assert_eq!(job["last_run"]["status"], "interrupted", "{job}");
    assert_eq!(job["last_run"]["trigger_source"], "manual");

    // Disabling edits workflow.json, validated and logged.
    let (status, disabled) = serve.post("/api/scheduler/jobs/daily/disable", &json!({}));
    assert_eq!(status, 200, "{disabled}");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(ws.join("workflow.json")).unwrap()).unwrap();
    assert_eq!(manifest["schedules"][0]["enabled"], false, "{manifest}");
    assert!(
        std::fs::read_dir(ws.join("planning/changelog"))
            .unwrap()
            .count()
            > 0,
        "the edit is in the changelog"
    );
    let job = job_until(&serve, "daily", |j| j["enabled"] == false);
    assert_eq!(job["next_firing"], Value::Null, "{job}");
    assert_eq!(
        serve.post("/api/scheduler/jobs/nope/trigger", &json!({})).0,
        404
    );

    // The global pause is the user config folder's scheduler.json.
    let (status, _, paused) = serve.request(
        "PUT",
        "/api/scheduler/config",
        &["Content-Type: application/json"],
        r#"{"globally_paused": true}"#,
    );
    assert_eq!(status, 200, "{paused}");
    let (_, answer) = serve.get("/api/scheduler/config", &[]);
    assert_eq!(answer["globally_paused"], true, "{answer}");
    assert_eq!(answer["paused"], true);
    assert!(answer["paused_at"].is_string(), "{answer}");
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(config.join("trellis/scheduler.json")).unwrap())
            .unwrap();
    assert_eq!(on_disk["globally_paused"], true);
}

/// `trellis schedules` in the terminal: the list, the next firings in the schedule's zone,
/// and a trigger that fires the schedule as the server does and records it.
#[test]
fn the_terminal_lists_schedules_prints_their_next_firings_and_fires_one() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
    let root = ws.to_str().unwrap();
    let out = support::trellis(&["schedules", "list", root]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("daily  on   cron \"0 9 * * *\" in UTC  next "),
        "{text}"
    );
    assert!(text.contains("slow  off"), "{text}");
    let out = support::trellis(&["schedules", "next", root, "daily", "-n", "3"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        text.lines()
            .filter(|l| l.ends_with("T09:00:00+00:00"))
            .count(),
        3,
        "{text}"
    );
    let out = support::trellis(&["schedules", "next", root, "nope"]);
    assert_eq!(out.status.code(), Some(1));

    let out = support::trellis(&[
        "schedules",
        "trigger",
        root,
        "daily",
        "--allow-host",
        "127.0.0.1",
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("schedule daily: success"), "{text}");
    let history: Value =
        serde_json::from_slice(&std::fs::read(ws.join("schedule-runs.json")).unwrap()).unwrap();
    assert_eq!(history[0]["status"], "success", "{history}");
    assert_eq!(history[0]["trigger_source"], "manual");
    assert!(ws.join("runs/iteration-0/execution/greet").is_dir());
}

/// The builder's schedule tools, from a model's calls through `trellis builder`: an add with
/// a bad cron, and one with an unknown group, are refused naming them; a good one,
/// an update, turning it off, the list and a delete each land in workflow.json and the
/// changelog.
#[test]
fn the_builders_schedule_tools_edit_workflow_json_validated_and_logged() {
    let calls: Vec<(&'static str, Value)> = vec![
        (
            "add_schedule",
            json!({"reason": "r", "schedule": {"id": "nightly", "cron_expression": "0 25 * * *"}}),
        ),
        (
            "add_schedule",
            json!({"reason": "r", "schedule": {"id": "nightly", "cron_expression": "0 2 * * *",
                                                "group_names": ["nope"]}}),
        ),
        (
            "add_schedule",
            json!({"reason": "r", "schedule": {"id": "nightly", "cron_expression": "0 2 * * *",
                                                "timezone": "Europe/Paris", "enabled": true}}),
        ),
        (
            "update_schedule",
            json!({"reason": "r", "schedule_id": "nightly",
                   "set": {"messages": ["run greet"], "collision_policy": "retry"}}),
        ),
        (
            "set_schedule_enabled",
            json!({"reason": "r", "schedule_id": "nightly", "enabled": false}),
        ),
        ("list_schedules", json!({})),
        (
            "delete_schedule",
            json!({"reason": "r", "schedule_id": "daily"}),
        ),
    ];
    let llm = support::mcp_servers::asking_for(calls);
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
    let out = support::trellis(&[
        "builder",
        ws.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "-m",
        "schedule it",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<String> = llm
        .last_tool_results()
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    assert_eq!(results.len(), 7, "{results:?}");
    assert!(
        results[0].contains("refused") && results[0].contains("schedules[2].cron_expression"),
        "{}",
        results[0]
    );
    assert!(
        results[1].contains("refused") && results[1].contains("schedules[2].group_names[0]"),
        "{}",
        results[1]
    );
    for r in &results[2..] {
        assert!(
            r.contains("\"ok\":true") || r.contains("\"schedules\""),
            "{r}"
        );
    }
    assert!(results[5].contains("\"id\":\"nightly\""), "{}", results[5]);
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(ws.join("workflow.json")).unwrap()).unwrap();
    let ids: Vec<&str> = manifest["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["slow", "nightly"], "{manifest}");
    let nightly = &manifest["schedules"][1];
    assert_eq!(nightly["enabled"], false);
    assert_eq!(nightly["collision_policy"], "retry");
    assert_eq!(nightly["messages"], json!(["run greet"]));
    let logged: Vec<String> = std::fs::read_dir(ws.join("planning/changelog"))
        .unwrap()
        .flat_map(|f| {
            let v: Value =
                serde_json::from_slice(&std::fs::read(f.unwrap().path()).unwrap()).unwrap();
            v.as_array()
                .unwrap()
                .iter()
                .map(|e| e["tool"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        logged,
        [
            "add_schedule",
            "update_schedule",
            "disable_schedule",
            "delete_schedule"
        ]
    );
}

/// Stopping a firing stopped only its turn: the firing sent its next message, and the next,
/// holding the workspace (round 9). A stop now ends the firing: `stopped`, its later
/// messages not sent, the workspace free.
#[test]
fn stopping_a_firing_ends_it() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
    let mut manifest: Value =
        serde_json::from_slice(&std::fs::read(ws.join("workflow.json")).unwrap()).unwrap();
    manifest["schedules"][1]["messages"] = json!(["hang", "run greet"]);
    std::fs::write(ws.join("workflow.json"), manifest.to_string()).unwrap();
    let config = dir.path().join("config");
    let serve = Serve::start_with(
        &ws,
        None,
        &["--allow-host", "127.0.0.1"],
        &[
            ("XDG_CONFIG_HOME", config.to_str().unwrap()),
            ("TRELLIS_SCHEDULER", "off"),
        ],
    );
    let (status, _) = serve.post("/api/scheduler/jobs/slow/trigger", &json!({}));
    assert_eq!(status, 202);
    job_until(&serve, "slow", |j| j["firing"] == true);
    let (_, stopping) = serve.post("/api/scheduler/jobs/slow/stop", &json!({}));
    assert_eq!(stopping["stopping"], true, "{stopping}");
    let job = job_until(&serve, "slow", |j| {
        j["last_run"]["status"]
            .as_str()
            .is_some_and(|s| s != "running")
    });
    assert_eq!(job["last_run"]["status"], "stopped", "{job}");
    assert!(
        !ws.join("runs/iteration-0/execution/greet").exists(),
        "the next message was not sent"
    );
    let (status, ack) = serve.post("/api/query", &json!({"query": "and now?"}));
    assert_eq!(status, 202, "the workspace is free: {ack}");
}
