//! Load: 200 step executions started at once through the runtime facade, in one process,
//! over 20 workspaces (10 steps each, sharing their workspace's lock), against an
//! OpenAI-compatible server on 127.0.0.1 that answers after a seeded random 1-20 ms. Each
//! step is a `message_sequence` of two turns; each turn asks for a real sandboxed
//! `workspace:write_file` into the step's output folder, then answers.
//!
//! Every execution must end `Done` within [`DEADLINE`] (the deadlock detector: on expiry the
//! test fails naming the executions still running), with its files written and its
//! `session.json` and turn logs whole. The test prints, never asserts, the figures that
//! BENCHMARKS.md reports: wall time, host overhead per turn (p50/p99, from the turn logs),
//! peak RSS, threads and descriptors.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::workspace::write_file;
use trellis_runner::runtime::{ExecutionId, ExecutionStatus, Runtime, StartOptions};
use trellis_runner::session::{Session, Status, TurnConversation, TurnSummary};
use trellis_runner::workflow_run::RunOptions;

const WORKSPACES: usize = 20;
const STEPS_PER_WORKSPACE: usize = 10;
/// Turns per step: one `user_message` item each.
const TURNS: usize = 2;
/// All executions end by then, or the test fails naming those still running.
const DEADLINE: Duration = Duration::from_secs(300);
/// The server's delays come from this seed, so a failing run can be replayed.
const SEED: u64 = 0x7e11_5eed;

/// The output folder of `step`, relative to the workspace.
fn output_dir(step: &str) -> String {
    format!("runs/iteration-0/execution/{step}")
}

/// splitmix64: a well-spread number from `x`, for the server's delays.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The server: after 1-20 ms, a turn's user message (which names a file between backticks)
/// gets a `workspace:write_file` call writing the file's own path into it; a tool result
/// gets the final answer.
fn server() -> FakeServer {
    let n = Arc::new(AtomicU64::new(0));
    FakeServer::start(Box::new(move |body| {
        let delay = 1 + mix(SEED ^ n.fetch_add(1, Ordering::Relaxed)) % 20;
        std::thread::sleep(Duration::from_millis(delay));
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or(Value::Null);
        let asked = last["content"]
            .as_str()
            .and_then(|c| c.split('`').nth(1))
            .filter(|path| path.starts_with("runs/"));
        match (last["role"].as_str(), asked) {
            (Some("user"), Some(path)) => (
                200,
                completion(
                    "",
                    &[(
                        "workspace__write_file",
                        json!({"path": path, "content": path}),
                    )],
                ),
            ),
            _ => (200, completion("Done.", &[])),
        }
    }))
}

/// A workspace of [`STEPS_PER_WORKSPACE`] two-turn steps (`s0`, `s1`, ...) on `server`.
fn workspace(root: &Path, server: &FakeServer) {
    let steps: Vec<Value> = (0..STEPS_PER_WORKSPACE)
        .map(|s| {
            let id = format!("s{s}");
            let items: Vec<Value> = (1..=TURNS)
                .map(|t| {
                    json!({"id": format!("part-{t}"), "type": "user_message",
                           "message": format!("Write `{}/part-{t}.txt`.", output_dir(&id))})
                })
                .collect();
            json!({"id": id, "type": "message_sequence", "title": id,
                   "description": "You write small files.", "items": items})
        })
        .collect();
    write_file(
        root,
        "planning/plan.json",
        json!({"objective": "load", "steps": steps}).to_string(),
    );
    let configs: Vec<Value> = (0..STEPS_PER_WORKSPACE)
        .map(|s| json!({"id": format!("s{s}"), "agent_configs": {"selected_servers": ["workspace"]}}))
        .collect();
    write_file(
        root,
        "planning/step_config.json",
        json!({ "steps": configs }).to_string(),
    );
    write_file(
        root,
        "workflow.json",
        json!({"llm": {"provider": "openai", "model_id": "m"}, "providers": server.providers()})
            .to_string(),
    );
}

/// A field of `/proc/self/status` in kB (`VmHWM`, `VmRSS`) or as a count (`Threads`).
fn proc_status(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// The `p`th percentile (nearest rank) of sorted `values`.
fn percentile(values: &[i64], p: usize) -> i64 {
    let rank = (values.len() * p).div_ceil(100).max(1);
    values[rank - 1]
}

/// "p50 X ms, p99 Y ms, max Z ms" of `values`.
fn spread(mut values: Vec<i64>) -> String {
    values.sort_unstable();
    format!(
        "p50 {} ms, p99 {} ms, max {} ms (n = {})",
        percentile(&values, 50),
        percentile(&values, 99),
        values.last().copied().unwrap_or_default(),
        values.len()
    )
}

/// One turn as its logs tell it.
struct Turn {
    duration_ms: i64,
    llm_ms: i64,
    tool_ms: i64,
    llm_calls: Vec<i64>,
}

/// The turns of `step` in `root`, from its two log files per turn, checked to be whole and
/// to agree with each other.
fn turns_of(root: &Path, step: &str) -> Vec<Turn> {
    let logs = root
        .join("runs/iteration-0/logs")
        .join(step)
        .join("execution");
    let mut turns = Vec::new();
    for entry in std::fs::read_dir(&logs).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !name.starts_with("execution-attempt-") || name.ends_with("-conversation.json") {
            continue;
        }
        let summary: TurnSummary =
            serde_json::from_slice(&std::fs::read(logs.join(&name)).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", logs.join(&name).display()));
        let conversation_file = logs.join(name.replace(".json", "-conversation.json"));
        let conversation: TurnConversation =
            serde_json::from_slice(&std::fs::read(&conversation_file).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", conversation_file.display()));
        assert_eq!(summary.status, Status::Completed, "{step} {name}");
        // Each turn: the call asking for the write, the write, the answer.
        assert_eq!(conversation.llm_calls.len(), 2, "{step} {name}");
        assert_eq!(conversation.tool_calls.len(), 1, "{step} {name}");
        let tool = &conversation.tool_calls[0];
        assert_eq!(tool.tool_name, "workspace:write_file", "{step} {name}");
        assert_eq!(tool.error, None, "{step} {name}");
        let llm_calls: Vec<i64> = conversation
            .llm_calls
            .iter()
            .map(|c| c.duration_ms as i64)
            .collect();
        assert_eq!(
            llm_calls.iter().sum::<i64>(),
            summary.llm_duration_ms as i64
        );
        turns.push(Turn {
            duration_ms: summary.duration_ms as i64,
            llm_ms: summary.llm_duration_ms as i64,
            tool_ms: tool.duration_ms as i64,
            llm_calls,
        });
    }
    turns
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_executions_over_twenty_workspaces_all_complete() {
    let server = server();
    let dirs: Vec<tempfile::TempDir> = (0..WORKSPACES)
        .map(|_| {
            let dir = tempfile::tempdir().unwrap();
            workspace(dir.path(), &server);
            dir
        })
        .collect();
    let runtime = Runtime::new(Arc::new(support::registry().await));
    // The peak from here on (Linux resets VmHWM to the current RSS on "5").
    let peak_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let rss_before = proc_status("VmRSS");

    let started = Instant::now();
    let mut executions: Vec<(ExecutionId, usize, String)> = Vec::new();
    for (w, dir) in dirs.iter().enumerate() {
        for s in 0..STEPS_PER_WORKSPACE {
            let step = format!("s{s}");
            let options =
                StartOptions::new(RunOptions::default(), support::fake_llm::loopback_llm(None));
            let id = runtime.start_step(dir.path(), &step, options);
            executions.push((id, w, step));
        }
    }
    let mut distinct: Vec<&ExecutionId> = executions.iter().map(|(id, ..)| id).collect();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), WORKSPACES * STEPS_PER_WORKSPACE);

    // Wait for every end, watching threads and descriptors on the way.
    let (mut max_threads, mut max_fds) = (0, 0);
    loop {
        max_threads = max_threads.max(proc_status("Threads").unwrap_or(0));
        max_fds = max_fds.max(open_descriptors());
        let running: Vec<String> = runtime
            .list()
            .into_iter()
            .filter(|e| e.status == ExecutionStatus::Running)
            .map(|e| format!("{} ({}, {:?})", e.id, e.workspace.display(), e.kind))
            .collect();
        if running.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{} executions still running after {DEADLINE:?} (a deadlock?): {}",
            running.len(),
            running.join(", ")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let wall = started.elapsed();
    let peak_rss = proc_status("VmHWM");

    // Every execution Done, its step's files and records whole.
    let mut failures = Vec::new();
    for (id, w, step) in &executions {
        let status = runtime.status(id).unwrap();
        if status != ExecutionStatus::Done {
            let why = match runtime.wait(id).await.unwrap() {
                Err(e) => e,
                Ok(_) => std::fs::read_to_string(
                    dirs[*w]
                        .path()
                        .join(output_dir(step))
                        .join("execution-final-summary.json"),
                )
                .unwrap_or_else(|e| format!("no final summary: {e}")),
            };
            failures.push(format!("{id} (workspace {w}, {step}): {status}: {why}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} executions did not end done:\n{}",
        failures.len(),
        executions.len(),
        failures.join("\n")
    );
    let mut turns = Vec::new();
    for (_, w, step) in &executions {
        let root = dirs[*w].path();
        let out = root.join(output_dir(step));
        for t in 1..=TURNS {
            let file = format!("{}/part-{t}.txt", output_dir(step));
            assert_eq!(
                std::fs::read_to_string(root.join(&file))
                    .unwrap_or_else(|e| panic!("workspace {w}: {file}: {e}")),
                file
            );
        }
        let session: Session =
            serde_json::from_slice(&std::fs::read(out.join("session.json")).unwrap())
                .unwrap_or_else(|e| panic!("workspace {w}: {step}/session.json: {e}"));
        assert_eq!(session.status, Status::Completed, "workspace {w}: {step}");
        assert_eq!(session.execution_turn_count, TURNS as u64);
        let step_turns = turns_of(root, step);
        assert_eq!(step_turns.len(), TURNS, "workspace {w}: {step}");
        turns.extend(step_turns);
    }
    let llm_calls = WORKSPACES * STEPS_PER_WORKSPACE * TURNS * 2;
    assert_eq!(server.seen().len(), llm_calls);

    // The figures (printed, never asserted: timings vary with the machine's load).
    let with_tools: Vec<i64> = turns.iter().map(|t| t.duration_ms - t.llm_ms).collect();
    let without_tools: Vec<i64> = turns
        .iter()
        .map(|t| t.duration_ms - t.llm_ms - t.tool_ms)
        .collect();
    let mut by_kind = BTreeMap::new();
    by_kind.insert(
        "turn",
        spread(turns.iter().map(|t| t.duration_ms).collect()),
    );
    by_kind.insert(
        "llm call",
        spread(turns.iter().flat_map(|t| t.llm_calls.clone()).collect()),
    );
    by_kind.insert(
        "tool call",
        spread(turns.iter().map(|t| t.tool_ms).collect()),
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load: {} executions over {WORKSPACES} workspaces, {} turns, {llm_calls} LLM calls, {} tool calls",
        executions.len(),
        turns.len(),
        turns.len()
    );
    println!("load: wall time {:.1} s", wall.as_secs_f64());
    println!(
        "load: host overhead per turn (turn - its LLM calls): {}",
        spread(with_tools)
    );
    println!(
        "load: host overhead per turn, tool call left out too: {}",
        spread(without_tools)
    );
    for (kind, figures) in by_kind {
        println!("load: {kind}: {figures}");
    }
    println!(
        "load: peak RSS {} MiB (VmHWM{}), RSS before the starts {} MiB",
        peak_rss.unwrap_or(0) / 1024,
        if peak_reset {
            ", reset before the starts"
        } else {
            " of the whole process"
        },
        rss_before.unwrap_or(0) / 1024
    );
    println!("load: at most {max_threads} threads, {max_fds} open descriptors");
    println!(
        "load: nproc {}, loadavg {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.trim()
    );
}
