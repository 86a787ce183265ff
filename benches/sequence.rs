//! Host overhead per turn of the agent loop: a `message_sequence` step whose foreach runs
//! one turn per row, each turn one LLM call asking for a `workspace:write_file` call, the
//! tool call, and a second LLM call answering, all answered by the `replay` provider; the
//! driver writes `session.json` after every item and the turn logs of every turn.
//!
//! Baseline, measured in the same run: the bare plugin calls of the same step made
//! directly through the registry, the same requests to the `replay` provider (same
//! cassette, same conversation, same tools offered) and the same tool calls under the
//! same grant. The difference per turn is what the host adds: history and requests, tool
//! policy, logs, session files, events.
//!
//! The step is timed as a run ends: the step, then the flush of what it queued on the writer
//! thread (its session, turn logs and summary, which `trellis run` waits for before it says
//! the run is over). The per-turn cost includes that flush and the writer thread's work, so
//! none of it spills into the next measurement.
//!
//! Besides criterion's report, prints medians per turn from an interleaved sample and the
//! overhead; `BENCHMARKS.md` records these figures. Under `cargo test --benches` (quick mode)
//! the sample is a few step runs: the checks run, the figures mean nothing.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use serde_json::{Value, json};
use trellis_runner::driver::{StepRunner, step_system_prompt};
use trellis_runner::grants::{TurnContext, TurnGrant, TurnPurpose, turn_grant};
use trellis_runner::run_folder::start_full_run;
use trellis_runner::session::Status;
use trellis_sandbox::llm::{
    Cassette, Endpoint, Interaction, Message, RecordedRequest, ReplayCursor, Request, Response,
    Secret, StopReason, Target, ToolCall, ToolDefinition, Usage,
};
use trellis_sandbox::{CacheSetting, Engine, Limits, PluginRegistry};
use trellis_workflow::Workspace;
use trellis_workflow::plan::ItemBody;

const STEP: &str = "bench";
const MODEL: &str = "bench";
/// Turns per step run (foreach rows).
const TURNS: usize = 10;
const TOOL: &str = "workspace:write_file";

/// A workspace with one step: a foreach over `TURNS` rows, the write_file tool only.
fn workspace(root: &Path) {
    let plan = json!({"objective": "bench", "steps": [{
        "id": STEP, "type": "message_sequence", "title": "Bench",
        "description": "Write one note per row into your output folder.",
        "items": [{"id": "rows", "type": "foreach",
                   "source_sql": "SELECT id, name FROM rows ORDER BY id",
                   "message": "Row {{.id}}: write a note about {{.name}}."}]
    }]});
    let configs = json!({"steps": [{"id": STEP, "title": "Bench",
        "agent_configs": {"selected_tools": [TOOL]}}]});
    std::fs::create_dir_all(root.join("planning")).unwrap();
    std::fs::create_dir_all(root.join("db")).unwrap();
    std::fs::create_dir_all(root.join("cassettes")).unwrap();
    std::fs::write(root.join("planning/plan.json"), plan.to_string()).unwrap();
    std::fs::write(root.join("planning/step_config.json"), configs.to_string()).unwrap();
    let db = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
    db.execute_batch("CREATE TABLE rows (id INTEGER PRIMARY KEY, name TEXT)")
        .unwrap();
    for i in 1..=TURNS {
        db.execute(
            "INSERT INTO rows (id, name) VALUES (?1, ?2)",
            rusqlite::params![i as i64, format!("item number {i}")],
        )
        .unwrap();
    }
    start_full_run(root, &[]).unwrap();
}

fn response(text: &str, calls: Vec<ToolCall>) -> Response {
    Response {
        text: text.to_string(),
        stop_reason: if calls.is_empty() {
            StopReason::Stop
        } else {
            StopReason::ToolCalls
        },
        tool_calls: calls,
        usage: Usage {
            prompt_tokens: 300,
            completion_tokens: 40,
            total_tokens: 340,
        },
        model: None,
    }
}

/// The bare calls of one step run: each LLM request with its cassette index, and the tool
/// call (arguments) after it, if any.
struct Calls {
    requests: Vec<Request>,
    tools: Vec<Option<Value>>,
}

/// Writes the cassette of the step (as the driver will converse) and returns the bare calls.
async fn record(registry: &PluginRegistry, root: &Path, grant: &TurnGrant) -> Calls {
    let ws = Workspace::open_run(root, Some("iteration-0")).unwrap();
    let mut offered: Vec<ToolDefinition> = registry
        .plugins()
        .flat_map(|p| p.tool_listings())
        .filter(|l| l.name == TOOL)
        .map(|l| ToolDefinition {
            name: l.name.clone(),
            description: l.description.to_string(),
            parameters: l.input_schema.clone(),
        })
        .collect();
    assert_eq!(offered.len(), 1);
    // Every agent turn of a workspace with a database is offered the database tools too.
    offered.extend(trellis_runner::db_tools::definitions());
    let mut messages = vec![Message::system(step_system_prompt(&ws, STEP).unwrap())];
    let mut interactions = Vec::new();
    let mut calls = Calls {
        requests: Vec::new(),
        tools: Vec::new(),
    };
    let mut ask = |messages: &Vec<Message>, answer: Response, tool: Option<Value>| {
        let request = Request {
            model: MODEL.to_string(),
            messages: messages.clone(),
            tools: offered.clone(),
            options: Default::default(),
        };
        interactions.push(Interaction {
            request: RecordedRequest::from(&request),
            response: answer,
            chunks: Vec::new(),
        });
        calls.requests.push(request);
        calls.tools.push(tool);
    };
    for i in 1..=TURNS {
        messages.push(Message::user(format!(
            "Row {i}: write a note about item number {i}."
        )));
        let args = json!({"path": format!("runs/iteration-0/execution/{STEP}/note-{i}.md"),
                          "content": format!("# Note {i}\nAbout item number {i}.\n")});
        let call = ToolCall {
            id: format!("call-{i}"),
            name: TOOL.to_string(),
            arguments: args.to_string(),
        };
        let first = response("", vec![call.clone()]);
        ask(&messages, first.clone(), Some(args.clone()));
        messages.push(Message::assistant(&first));
        let result = registry
            .call_tool(TOOL, &args, &grant.grant, &Limits::default())
            .await
            .unwrap();
        messages.push(Message::tool_result(&call.id, result.to_string()));
        let last = response(&format!("Note {i} written."), Vec::new());
        ask(&messages, last.clone(), None);
        messages.push(Message::assistant(&last));
    }
    Cassette { interactions }
        .save(&cassette_path(root))
        .unwrap();
    calls
}

fn cassette_path(root: &Path) -> PathBuf {
    root.join("cassettes").join(format!("{MODEL}.json"))
}

struct Bench {
    registry: PluginRegistry,
    root: PathBuf,
    ws: Workspace,
    grant: TurnGrant,
    calls: Calls,
}

impl Bench {
    /// The whole step through the driver.
    async fn trellis(&self) {
        // As `trellis run` does: the target's endpoint comes from the cursor, which reads the
        // cassette once.
        let cursor = ReplayCursor::new(cassette_path(&self.root));
        let target = Target {
            provider: "replay".into(),
            model: MODEL.into(),
            endpoint: cursor.endpoint_at(0).unwrap(),
            secret: Secret::none(),
            stream: true,
        };
        // As in `trellis run`: the step's end does not wait for its logs to reach the disk;
        // the run's end does (`run_ended`).
        let runner = StepRunner::new(&self.registry, vec![target], Limits::default())
            .with_replay(cursor)
            .with_step_ends_behind();
        let outcome = runner.run_step(&self.ws, STEP).await.unwrap();
        assert_eq!(outcome.status, Status::Completed, "{:?}", outcome.error);
        assert_eq!(outcome.turns, TURNS as u64);
    }

    /// The step, then the wait the run's end adds: what the step queued on the writer
    /// thread reaching the disk. Returns the time to the step's end and the whole.
    async fn trellis_run(&self) -> (Duration, Duration) {
        let start = Instant::now();
        self.trellis().await;
        let step = start.elapsed();
        trellis_sandbox::store::write_behind::flush().unwrap();
        (step, start.elapsed())
    }

    /// The same plugin calls, directly.
    async fn bare(&self) {
        let cassette = cassette_path(&self.root);
        let limits = Limits::default();
        // The cassette is read once per step run, as the runner's replay cursor does.
        let name = cassette.display().to_string();
        let text = std::fs::read(&cassette).unwrap();
        let interactions = trellis_sandbox::llm::record::interactions(&name, &text).unwrap();
        for (i, (request, tool)) in self
            .calls
            .requests
            .iter()
            .zip(&self.calls.tools)
            .enumerate()
        {
            let endpoint = Endpoint::replay_of(&name, &interactions, i);
            let answer = self
                .registry
                .complete("replay", &endpoint, &Secret::none(), request, &limits)
                .await
                .unwrap();
            if let Some(args) = tool {
                assert_eq!(answer.tool_calls.len(), 1);
                self.registry
                    .call_tool(TOOL, args, &self.grant.grant, &limits)
                    .await
                    .unwrap();
            }
        }
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn sequence(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // TRELLIS_BENCH_DIR puts the workspace elsewhere (a tmpfs, say, to see what durable
    // writes cost); the default is the system's temp folder.
    let dir = match std::env::var_os("TRELLIS_BENCH_DIR") {
        Some(parent) => tempfile::tempdir_in(parent).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let root = dir.path().to_path_buf();
    workspace(&root);
    let engine = Engine::new(CacheSetting::Dir(support::component_cache())).unwrap();
    let registry = runtime
        .block_on(PluginRegistry::with_bundled(&engine))
        .unwrap();
    let ws = Workspace::open_run(&root, Some("iteration-0")).unwrap();
    let step = ws.plan.step(STEP).unwrap().clone();
    let configs = ws.agent_configs(STEP);
    let items = step.effective_items();
    assert!(matches!(items[0].body, ItemBody::Foreach { .. }));
    let grant = turn_grant(
        &TurnContext {
            root: &ws.root,
            run_folder: "iteration-0",
            step: &step,
            configs: &configs,
        },
        TurnPurpose::Item(&items[0]),
    )
    .unwrap();
    let calls = runtime.block_on(record(&registry, &root, &grant));
    let bench = Bench {
        registry,
        root,
        ws,
        grant,
        calls,
    };
    // Both paths work before anything is timed.
    runtime.block_on(bench.trellis_run());
    runtime.block_on(bench.bare());

    let mut group = c.benchmark_group("sequence");
    group.sample_size(20);
    group.bench_function("trellis_step_10_turns_flushed", |b| {
        b.iter(|| runtime.block_on(bench.trellis_run()))
    });
    group.bench_function("bare_plugin_calls_10_turns", |b| {
        b.iter(|| runtime.block_on(bench.bare()))
    });
    group.finish();

    // Interleaved sample: drift in machine load hits both alike.
    let samples = support::rounds(100, 2);
    for _ in 0..support::rounds(5, 1) {
        runtime.block_on(bench.trellis_run());
        runtime.block_on(bench.bare());
    }
    let per_turn = |d: Duration| d / TURNS as u32;
    let (mut t, mut w, mut d) = (Vec::new(), Vec::new(), Vec::new());
    let (mut steps, mut flushes) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let (step, trellis) = runtime.block_on(bench.trellis_run());
        let start = Instant::now();
        runtime.block_on(bench.bare());
        let bare = start.elapsed();
        t.push(per_turn(trellis));
        w.push(per_turn(bare));
        d.push(per_turn(trellis.saturating_sub(bare)));
        steps.push(per_turn(step));
        flushes.push(trellis - step);
    }
    let (t50, w50, d50) = (median(t), median(w), median(d));
    println!();
    println!(
        "sequence, {samples} interleaved step runs of {TURNS} turns each (2 LLM calls + 1 tool call per turn), workspace in {}:",
        bench.root.parent().unwrap_or(&bench.root).display()
    );
    println!("  per turn, the run-end flush and the writer thread's work included:");
    println!(
        "  trellis step          per turn p50 {:>9.1} us",
        micros(t50)
    );
    println!(
        "  bare plugin calls     per turn p50 {:>9.1} us",
        micros(w50)
    );
    println!(
        "  host overhead         per turn p50 {:>9.1} us",
        micros(d50)
    );
    println!(
        "  ratio                              {:>9.2}",
        micros(t50) / micros(w50)
    );
    println!("  of which:");
    println!(
        "  to the step's end     per turn p50 {:>9.1} us",
        micros(median(steps))
    );
    println!(
        "  run-end flush         per run  p50 {:>9.1} us",
        micros(median(flushes))
    );
}

criterion_group!(benches, sequence);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
