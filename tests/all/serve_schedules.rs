//! Schedules fired by `trellis serve`, through the binary over real HTTP, the builder and the
//! steps on a fake model: a cron occurrence fires (the scheduler's clock started just before
//! it with `TRELLIS_SCHEDULER_CLOCK`) as a run-mode builder session whose execution runs the
//! step, recorded `success` in `schedule-runs.json`; a manual trigger, a second one refused
//! while it runs; disable edits workflow.json and logs it; the global pause; a server killed
//! mid-firing marks the firing `interrupted` when it starts again; each collision policy
//! meets a busy workspace; a dependency is released and one expires; whole schedules are
//! added, replaced and deleted over HTTP; and the builder's `trigger_schedule` queues a
//! firing for when its turn ends.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::serve::Serve;
use support::workspace::write_files;

/// A model for the builder and the step: the builder runs step `greet` for "run greet",
/// waits forever for "hang", and answers the rest; the step's agent completes.
pub(crate) fn model() -> FakeServer {
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
        if last["role"] == "user" && text == "trigger daily" {
            return (
                200,
                completion(
                    "",
                    &vec![("trigger_schedule", json!({"schedule_id": "daily"})); 3],
                ),
            );
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

pub(crate) fn workspace(dir: &Path, llm: &FakeServer) -> std::path::PathBuf {
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
pub(crate) fn job_until(serve: &Serve, id: &str, until: impl Fn(&Value) -> bool) -> Value {
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
/// changelog; a trigger is refused in the terminal, which fires no schedules.
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
        ("trigger_schedule", json!({"schedule_id": "slow"})),
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
    let mut results: Vec<String> = llm
        .last_tool_results()
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    assert_eq!(results.len(), 8, "{results:?}");
    // The terminal fires no schedules: the tool says which commands do.
    let refused = results.pop().unwrap();
    assert!(
        refused.contains("does not fire schedules")
            && refused.contains("trellis schedules trigger"),
        "{refused}"
    );
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

/// The workspace's `workflow.json` with `schedules` in place of the usual two.
pub(crate) fn with_schedules(ws: &Path, schedules: Value) {
    let path = ws.join("workflow.json");
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    manifest["schedules"] = schedules;
    std::fs::write(path, manifest.to_string()).unwrap();
}

/// `trellis serve` on `ws` with the scheduler's clock three seconds before 09:00 today (UTC).
fn serve_before_nine(dir: &Path, ws: &Path) -> (Serve, String) {
    let day = trellis_runner::session::now_rfc3339()[..10].to_string();
    let clock = format!("{day}T08:59:57Z");
    let config = dir.join("config");
    let serve = Serve::start_with(
        ws,
        None,
        &["--allow-host", "127.0.0.1"],
        &[
            ("TRELLIS_SCHEDULER_CLOCK", clock.as_str()),
            ("XDG_CONFIG_HOME", config.to_str().unwrap()),
        ],
    );
    (serve, day)
}

/// Schedule `id`'s job once its last run has ended.
pub(crate) fn ended(serve: &Serve, id: &str) -> Value {
    job_until(serve, id, |j| {
        j["last_run"]["status"]
            .as_str()
            .is_some_and(|s| s != "running")
    })
}

/// At 09:00 four schedules, one per collision policy, meet a workspace that a hanging manual
/// firing holds: `skip` and `coalesce` are recorded `skipped` (each saying why), `queue_latest`
/// and `retry` wait, and once the hanging firing is stopped both run, one after the other,
/// and succeed.
#[test]
fn each_collision_policy_meets_a_busy_workspace() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
    let at_nine = |id: &str, policy: &str| {
        json!({"id": id, "cron_expression": "0 9 * * *", "enabled": true,
               "collision_policy": policy, "messages": ["run greet"]})
    };
    with_schedules(
        &ws,
        json!([
            {"id": "slow", "cron_expression": "0 3 1 1 *", "messages": ["hang"]},
            at_nine("skips", "skip"),
            at_nine("queues", "queue_latest"),
            at_nine("retries", "retry"),
            at_nine("coalesces", "coalesce"),
        ]),
    );
    let (serve, day) = serve_before_nine(dir.path(), &ws);
    let (status, _) = serve.post("/api/scheduler/jobs/slow/trigger", &json!({}));
    assert_eq!(status, 202);
    job_until(&serve, "slow", |j| j["firing"] == true);

    // 09:00 passes while the workspace is held.
    let skipped = ended(&serve, "skips");
    assert_eq!(skipped["last_run"]["status"], "skipped", "{skipped}");
    assert!(
        skipped["last_run"]["error"]
            .as_str()
            .unwrap()
            .contains("collision_policy skip"),
        "{skipped}"
    );
    assert_eq!(
        skipped["last_run"]["scheduled_for"],
        format!("{day}T09:00:00Z")
    );
    let folded = ended(&serve, "coalesces");
    assert_eq!(folded["last_run"]["status"], "skipped", "{folded}");
    assert!(
        folded["last_run"]["error"]
            .as_str()
            .unwrap()
            .contains("folded into the firing that runs"),
        "{folded}"
    );
    for id in ["queues", "retries"] {
        let waiting = job_until(&serve, id, |j| j["queued"] == 1);
        assert!(waiting["last_run"].is_null(), "not fired yet: {waiting}");
    }

    let (_, stopping) = serve.post("/api/scheduler/jobs/slow/stop", &json!({}));
    assert_eq!(stopping["stopping"], true, "{stopping}");
    assert_eq!(ended(&serve, "slow")["last_run"]["status"], "stopped");
    let queued = ended(&serve, "queues");
    let retried = ended(&serve, "retries");
    for job in [&queued, &retried] {
        assert_eq!(job["last_run"]["status"], "success", "{job}");
        assert_eq!(job["last_run"]["trigger_source"], "cron");
        assert_eq!(job["last_run"]["scheduled_for"], format!("{day}T09:00:00Z"));
        assert_eq!(job["queued"], 0, "{job}");
    }
    // One after the other: the workspace is held by one firing at a time.
    let (first, second) = {
        let (a, b) = (&queued["last_run"], &retried["last_run"]);
        if a["started_at"].as_str() < b["started_at"].as_str() {
            (a, b)
        } else {
            (b, a)
        }
    };
    assert!(
        first["completed_at"].as_str().unwrap() <= second["started_at"].as_str().unwrap(),
        "{first} {second}"
    );
    // The skipped ones did not run later.
    assert_eq!(
        serve.get("/api/scheduler/jobs/skips/runs", &[]).1["runs"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// A schedule that comes after another runs once that one's occurrence of the same date has
/// ended `success` (not before); one that comes after a schedule that never fires expires at
/// its deadline, saying so.
#[test]
fn a_dependency_is_released_by_the_other_schedules_end_and_one_expires() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
    with_schedules(
        &ws,
        json!([
            {"id": "slow", "cron_expression": "0 3 1 1 *", "messages": ["hang"]},
            {"id": "first", "cron_expression": "0 9 * * *", "enabled": true,
             "messages": ["run greet"]},
            {"id": "then", "cron_expression": "0 9 * * *", "enabled": true,
             "after_schedule_id": "first", "messages": ["done?"]},
            {"id": "never", "cron_expression": "0 9 * * *", "enabled": true,
             "after_schedule_id": "slow", "dependency_deadline": "09:00",
             "messages": ["done?"]},
        ]),
    );
    let (serve, day) = serve_before_nine(dir.path(), &ws);
    let first = ended(&serve, "first");
    let then = ended(&serve, "then");
    assert_eq!(first["last_run"]["status"], "success", "{first}");
    assert_eq!(then["last_run"]["status"], "success", "{then}");
    assert_eq!(
        then["last_run"]["scheduled_for"],
        format!("{day}T09:00:00Z")
    );
    assert!(
        first["last_run"]["completed_at"].as_str().unwrap()
            <= then["last_run"]["started_at"].as_str().unwrap(),
        "released by the end of the other: {first} {then}"
    );
    let never = ended(&serve, "never");
    assert_eq!(never["last_run"]["status"], "expired", "{never}");
    assert!(
        never["last_run"]["error"]
            .as_str()
            .unwrap()
            .contains("dependency deadline"),
        "{never}"
    );
    assert!(never["last_run"]["session_id"].is_null(), "it never ran");
}

/// `POST /api/scheduler/jobs` adds a schedule (refusing a bad cron with its JSON path, and
/// an id taken), `PUT .../{id}` replaces one whole (refusing another id), `DELETE` removes
/// it; each edit is in workflow.json and the changelog.
#[test]
fn whole_schedules_are_added_replaced_and_deleted_over_http() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
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
    let manifest = || -> Value {
        serde_json::from_slice(&std::fs::read(ws.join("workflow.json")).unwrap()).unwrap()
    };
    let before = manifest();

    let (status, bad) = serve.post(
        "/api/scheduler/jobs",
        &json!({"id": "hourly", "cron_expression": "0 * * *"}),
    );
    assert_eq!(
        (status, bad["error"].as_str()),
        (422, Some("refused")),
        "{bad}"
    );
    assert!(
        bad["detail"]
            .as_str()
            .unwrap()
            .contains("schedules[2].cron_expression"),
        "{bad}"
    );
    let (status, unknown) = serve.post(
        "/api/scheduler/jobs",
        &json!({"id": "hourly", "cron_expresion": "0 * * * *"}),
    );
    assert_eq!(status, 422, "{unknown}");
    assert!(
        unknown["detail"]
            .as_str()
            .unwrap()
            .contains("cron_expression"),
        "did you mean: {unknown}"
    );
    assert_eq!(manifest(), before, "nothing written");
    let (status, taken) = serve.post(
        "/api/scheduler/jobs",
        &json!({"id": "daily", "cron_expression": "0 * * * *"}),
    );
    assert_eq!(
        (status, taken["error"].as_str()),
        (409, Some("exists")),
        "{taken}"
    );

    let (status, added) = serve.post(
        "/api/scheduler/jobs",
        &json!({"id": "hourly", "cron_expression": "0 * * * *", "enabled": true,
                "timezone": "Asia/Kolkata"}),
    );
    assert_eq!(status, 201, "{added}");
    assert_eq!(added["id"], "hourly");
    assert!(
        added["next_firing"]
            .as_str()
            .unwrap()
            .ends_with(":30:00+00:00"),
        "{added}"
    );
    assert_eq!(manifest()["schedules"][2]["timezone"], "Asia/Kolkata");

    let (status, _, text) = serve.request(
        "PUT",
        "/api/scheduler/jobs/hourly",
        &["Content-Type: application/json"],
        r#"{"id": "other", "cron_expression": "0 * * * *"}"#,
    );
    assert_eq!(status, 422, "{text}");
    let (status, _, text) = serve.request(
        "PUT",
        "/api/scheduler/jobs/hourly",
        &["Content-Type: application/json"],
        r#"{"cron_expression": "15 * * * *", "messages": ["run greet"]}"#,
    );
    assert_eq!(status, 200, "{text}");
    let replaced = &manifest()["schedules"][2];
    assert_eq!(
        replaced,
        &json!({"id": "hourly", "cron_expression": "15 * * * *", "messages": ["run greet"]}),
        "replaced whole: {replaced}"
    );

    let (status, _, text) = serve.request("DELETE", "/api/scheduler/jobs/hourly", &[], "");
    assert_eq!(status, 200, "{text}");
    assert_eq!(manifest()["schedules"], before["schedules"]);
    let (status, _, _) = serve.request("DELETE", "/api/scheduler/jobs/hourly", &[], "");
    assert_eq!(status, 404);
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
        ["add_schedule", "update_schedule", "delete_schedule"]
    );
}

/// The builder's `trigger_schedule` in `trellis serve`: the turn that calls it ends, then the
/// firing runs as a manual one and succeeds. An answer that triggers the schedule three
/// times fires it once: the calls after the first are told a firing waits already.
#[test]
fn the_builders_trigger_fires_the_schedule_once_its_turn_ends() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
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
    let (status, ack) = serve.post("/api/query", &json!({"query": "trigger daily"}));
    assert_eq!(status, 202, "{ack}");
    let job = ended(&serve, "daily");
    let run = &job["last_run"];
    assert_eq!(run["status"], "success", "{job}");
    assert_eq!(run["trigger_source"], "manual");
    assert_ne!(
        run["session_id"], ack["session_id"],
        "a session of its own: {job} {ack}"
    );
    assert!(ws.join("runs/iteration-0/execution/greet").is_dir());
    let answers: Vec<String> = llm
        .seen()
        .iter()
        .flat_map(support::fake_llm::tool_results_of)
        .map(|(_, r)| r)
        .collect();
    let queued = |how: &str| answers.iter().filter(|r| r.contains(how)).count();
    assert_eq!(
        (queued("\"queued\":true"), queued("\"queued\":false")),
        (1, 2),
        "{answers:?}"
    );
    // Nothing else waited: no second firing follows the first.
    std::thread::sleep(Duration::from_secs(3));
    let history: Value =
        serde_json::from_slice(&std::fs::read(ws.join("schedule-runs.json")).unwrap()).unwrap();
    assert_eq!(history.as_array().map(Vec::len), Some(1), "{history}");
}

/// The bundled `examples/ticket-digest` fires every minute offline: its builder answers from
/// the example's cassette, the firing runs both scripted steps and succeeds, and a second
/// firing (another execution id, the steps now completed in the builder's prompt) replays
/// from the same cassette and succeeds too.
#[test]
fn the_digest_example_fires_every_minute_offline() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("digest");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ticket-digest");
    support::workspace::copy_workspace(&example, &ws, &["runs", "db.sqlite"]);
    let (serve, _) = serve_before_nine(dir.path(), &ws);
    let job = ended(&serve, "every-minute");
    assert_eq!(job["last_run"]["status"], "success", "{job}");
    assert_eq!(job["last_run"]["trigger_source"], "cron");
    assert!(
        ws.join("runs/iteration-0/execution/digest/digest.md")
            .is_file(),
        "the run's digest"
    );
    let first = job["last_run"]["id"].clone();
    let (status, started) = serve.post("/api/scheduler/jobs/every-minute/trigger", &json!({}));
    assert_eq!(status, 202, "{started}");
    let job = job_until(&serve, "every-minute", |j| {
        j["last_run"]["id"] != first
            && j["last_run"]["status"]
                .as_str()
                .is_some_and(|s| s != "running")
    });
    assert_eq!(job["last_run"]["status"], "success", "{job}");
    let history: Value =
        serde_json::from_slice(&std::fs::read(ws.join("schedule-runs.json")).unwrap()).unwrap();
    assert_eq!(
        history
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["status"] == "success")
            .count(),
        2,
        "{history}"
    );
}

/// A `workflow.json` as the original system writes it, with every schedule field it has
/// (the legacy `mode: workflow`, `workshop_mode`, a calendar schedule whose items carry
/// their own payload and messages, a dependency with all its `after_*` fields, and the keys
/// Trellis does not act on) loads and validates unchanged: `trellis validate` passes, naming
/// the inert keys in a warning, and `trellis schedules` reads every schedule.
#[test]
fn the_originals_workflow_json_with_schedules_validates_unchanged() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
    let path = ws.join("workflow.json");
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    manifest["groups"] = json!([{"id": "emea", "name": "EMEA"}]);
    manifest["schedules"] = json!([
        {"id": "morning", "name": "Morning run", "description": "Weekday digest",
         "schedule_type": "cron", "cron_expression": "0 9 * * 1-5",
         "timezone": "Europe/Paris", "enabled": true, "trigger_payload": {"source": "cron"},
         "group_names": ["EMEA"], "group_ids": ["emea"], "route_selections": {},
         "mode": "workflow", "workshop_mode": "run",
         "messages": ["Run the full workflow using run_full_workflow tool."],
         "collision_policy": "queue_latest", "max_start_delay_minutes": 30,
         "resume_previous": false, "pulse_review_only": false, "execution_mode": "sequential",
         "direct_messages_reason": "", "query": ""},
        {"id": "launch", "name": "Launch days", "schedule_type": "calendar",
         "calendar_items": [
            {"id": "d1", "date": "2027-01-04", "time": "08:30", "description": "Day one",
             "trigger_payload": {"day": 1}, "messages": ["Run the full workflow."]},
            {"id": "d2", "date": "2027-01-05", "time": "08:30"}],
         "timezone": "Asia/Kolkata", "enabled": false, "group_names": ["emea"],
         "mode": "workshop", "collision_policy": "skip"},
        {"id": "after-morning", "cron_expression": "30 9 * * 1-5",
         "timezone": "Europe/Paris", "enabled": true, "group_names": ["EMEA"],
         "collision_policy": "retry", "after_schedule_id": "morning",
         "after_terminal_status": "any_terminal", "after_delay_minutes": 5,
         "dependency_deadline": "12:00"}
    ]);
    let text = serde_json::to_string_pretty(&manifest).unwrap();
    std::fs::write(&path, &text).unwrap();
    let root = ws.to_str().unwrap();

    let out = support::trellis(&["validate", root]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    for inert in [
        "\"resume_previous\"",
        "\"pulse_review_only\"",
        "\"execution_mode\"",
        "\"workshop_mode\"",
    ] {
        assert!(said.contains(inert), "{inert} named: {said}");
    }
    let out = support::trellis(&["schedules", "list", root]);
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{listed}");
    for id in ["morning  on", "launch  off", "after-morning  on"] {
        assert!(listed.contains(id), "{id}: {listed}");
    }
    let out = support::trellis(&["schedules", "next", root, "launch", "-n", "5"]);
    let next = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(next.contains("2027-01-04T08:30:00+05:30"), "{next}");
    assert!(next.contains("2027-01-05T08:30:00+05:30"), "{next}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "unchanged");
}

/// Fires `daily` by hand through `trellis schedules trigger`; its history entry.
fn trigger_daily(ws: &Path) -> Value {
    let out = support::trellis(&[
        "schedules",
        "trigger",
        ws.to_str().unwrap(),
        "daily",
        "--allow-host",
        "127.0.0.1",
    ]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    history(ws)[0].clone()
}

fn history(ws: &Path) -> Vec<Value> {
    let text = std::fs::read(ws.join("schedule-runs.json")).unwrap();
    serde_json::from_slice::<Vec<Value>>(&text).unwrap()
}

/// Each firing is a builder session with a conversation file: a schedule firing every minute
/// made one more file and index entry each time, for ever. A firing's conversation is kept as
/// long as its entry in `schedule-runs.json` (the 200 newest): when the entry goes, so does
/// the run-mode session it names, unless someone went on with it after the firing; an
/// operator's conversation in another mode is never removed, whatever an entry names.
#[test]
fn a_firings_conversation_goes_with_its_history_entry() {
    let llm = model();
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path(), &llm);
    let fired = trigger_daily(&ws);
    let session = fired["session_id"].as_str().unwrap().to_string();
    let conversations = ws.join("builder/conversation");
    let date = std::fs::read_dir(&conversations)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.len() == 10)
        .unwrap();
    let file_of = |id: &str| {
        conversations
            .join(&date)
            .join(format!("session-{id}-conversation.json"))
    };
    assert!(file_of(&session).is_file());
    // Two more sessions, copies of the firing's: one in builder mode (an operator's), one
    // in run mode that someone went on with after its firing ended.
    let original: Value =
        serde_json::from_slice(&std::fs::read(file_of(&session)).unwrap()).unwrap();
    for (id, mode) in [("operators-own", "builder"), ("went-on", "run")] {
        let mut copy = original.clone();
        copy["session_id"] = json!(id);
        copy["workshop_mode"] = json!(mode);
        std::fs::write(file_of(id), copy.to_string()).unwrap();
    }
    let entry = |id: String, session: Option<&str>, completed: &str| {
        json!({"id": id, "schedule_id": "daily", "trigger_source": "cron",
               "run_folder": "iteration-0", "session_id": session, "status": "success",
               "started_at": "2026-01-01T09:00:00.000Z", "completed_at": completed})
    };
    let mut entries: Vec<Value> = (0..197)
        .map(|i| entry(format!("filler-{i}"), None, "2026-01-01T09:01:00.000Z"))
        .collect();
    entries.push(entry(
        "went-on".into(),
        Some("went-on"),
        "2000-01-01T00:00:00.000Z",
    ));
    entries.push(entry(
        "operators-own".into(),
        Some("operators-own"),
        "2999-01-01T00:00:00.000Z",
    ));
    entries.push(fired.clone());
    std::fs::write(
        ws.join("schedule-runs.json"),
        Value::from(entries).to_string(),
    )
    .unwrap();

    // Each firing pushes the oldest entry out: the first firing's, then the other two.
    let newest = trigger_daily(&ws);
    let history_now = history(&ws);
    assert_eq!(history_now.len(), 200);
    assert!(history_now.iter().all(|e| e["id"] != fired["id"]));
    assert!(
        !file_of(&session).exists(),
        "the dropped firing's conversation is kept"
    );
    let index: Value =
        serde_json::from_slice(&std::fs::read(conversations.join("chat-index.json")).unwrap())
            .unwrap();
    let listed: Vec<&str> = index["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert!(!listed.contains(&session.as_str()), "{listed:?}");
    let kept = newest["session_id"].as_str().unwrap();
    assert!(listed.contains(&kept), "{listed:?}");
    assert!(file_of(kept).is_file());

    trigger_daily(&ws);
    trigger_daily(&ws);
    let history_now = history(&ws);
    assert!(
        history_now
            .iter()
            .all(|e| e["id"] != "went-on" && e["id"] != "operators-own")
    );
    assert!(
        file_of("operators-own").is_file(),
        "an operator's conversation went"
    );
    assert!(
        file_of("went-on").is_file(),
        "a conversation someone went on with went"
    );
    assert!(file_of(kept).is_file());
}
