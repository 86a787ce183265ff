//! Host time of a builder session of ten turns: each turn one LLM call asking for
//! `read_plan`, the tool call, and a second LLM call answering, against an
//! OpenAI-compatible server on 127.0.0.1 (the bundled `openai` provider). The session
//! re-reads the workspace and makes its system prompt at every turn, checks the mode, and
//! writes the conversation file, the index and the costs after every turn.
//!
//! Baseline, measured in the same run: the same LLM calls made directly through the
//! registry (same server, same tools offered, a system prompt of the same text, the same
//! growing history) and the same `read_plan` calls. The difference is what the session adds.
//!
//! Besides criterion's report, prints medians per turn from an interleaved sample and the
//! overhead; `BENCHMARKS.md` records these figures. Under `cargo test --benches` (quick mode)
//! the sample is a few sessions: the checks run, the figures mean nothing.

mod support;

#[path = "../tests/all/support/fake_llm.rs"]
#[allow(dead_code)]
mod fake_llm;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use serde_json::json;

use fake_llm::{FakeServer, completion};
use trellis_builder::agent::specs_of;
use trellis_builder::executions::Executions;
use trellis_builder::prompt::system_prompt;
use trellis_builder::{BuilderObserver, BuilderSession, Mode, SessionOptions, ToolContext, reads};
use trellis_runner::llm_choice::{LlmSetup, parse_llm_spec};
use trellis_runner::runtime::{Runtime, StartOptions};
use trellis_runner::workflow_run::RunOptions;
use trellis_sandbox::capabilities::DbWriteBudget;
use trellis_sandbox::llm::{
    Endpoint, KeyApprovals, Message, Request, RetryPolicy, Secret, Target, Usage,
    complete_with_options,
};
use trellis_sandbox::{CacheSetting, Engine, Limits, PluginRegistry};

const TURNS: usize = 10;

fn workspace(root: &Path, server: &FakeServer) {
    std::fs::create_dir_all(root.join("planning")).unwrap();
    std::fs::write(
        root.join("planning/plan.json"),
        json!({"objective": "bench", "steps": [
            {"id": "a", "type": "regular", "title": "A", "description": "Do a."}
        ]})
        .to_string(),
    )
    .unwrap();
    std::fs::write(root.join("planning/step_config.json"), r#"{"steps": []}"#).unwrap();
    std::fs::write(
        root.join("workflow.json"),
        json!({"providers": server.providers()}).to_string(),
    )
    .unwrap();
}

struct Bench {
    root: std::path::PathBuf,
    runtime: Runtime,
    registry: Arc<PluginRegistry>,
    server: FakeServer,
}

impl Bench {
    /// Ten turns of one session.
    async fn session(&self) {
        // The server is on this machine: approved by the operator, as `--allow-host
        // 127.0.0.1` does.
        let mut approvals = KeyApprovals::defaults();
        approvals.allow_host("127.0.0.1").unwrap();
        let llm =
            LlmSetup::new(Some(parse_llm_spec("openai:bench").unwrap())).with_approvals(approvals);
        let executions = Executions::new(
            self.runtime.clone(),
            StartOptions::new(RunOptions::default(), LlmSetup::new(None)),
        );
        let mut session = BuilderSession::open(
            &self.runtime,
            executions,
            SessionOptions {
                root: self.root.clone(),
                session_id: None,
                mode: Some(Mode::Builder),
                llm,
                limits: Limits::default(),
                retry: RetryPolicy::default(),
                max_rounds: 10,
                max_turn_result_bytes: trellis_builder::DEFAULT_TURN_RESULT_BYTES,
                max_turn_write_bytes: trellis_builder::DEFAULT_TURN_WRITE_BYTES,
                max_run_write_bytes: trellis_runner::driver::DEFAULT_RUN_WRITE_BYTES,
                max_workspace_bytes: trellis_runner::driver::DEFAULT_WORKSPACE_BYTES,
                max_model_calls: trellis_runner::driver::DEFAULT_RUN_MODEL_CALLS,
                observer: BuilderObserver::none(),
            },
        )
        .unwrap();
        for i in 0..TURNS {
            let report = session.turn(&format!("turn {i}")).await.unwrap();
            assert!(report.ended_normally, "{report:?}");
        }
    }

    /// The same LLM and tool calls, made directly.
    async fn direct(&self, system: &str) {
        let target = Target {
            provider: "openai".into(),
            model: "bench".into(),
            endpoint: Endpoint::new(self.server.base_url()),
            secret: Secret::none(),
            stream: true,
        };
        let tools: Vec<_> = specs_of(Mode::Builder)
            .iter()
            .map(|s| s.definition())
            .collect();
        let observer = BuilderObserver::none();
        let limits = Limits::default();
        let writes = DbWriteBudget::new(limits.fs);
        let ctx = ToolContext {
            root: &self.root,
            mode: Mode::Builder,
            registry: &self.registry,
            limits: &limits,
            turn_writes: &writes,
            session_id: "bench",
            observer: &observer,
            work: &trellis_builder::call_work(),
        };
        let mut history = vec![Message::system(system)];
        let mut usage = Usage::default();
        for i in 0..TURNS {
            history.push(Message::user(format!("turn {i}")));
            loop {
                let request = Request {
                    model: "bench".into(),
                    messages: history.clone(),
                    tools: tools.clone(),
                    options: Default::default(),
                };
                let completion = complete_with_options(
                    &self.registry,
                    std::slice::from_ref(&target),
                    &[None],
                    &request,
                    &RetryPolicy::default(),
                    &limits,
                )
                .await;
                let response = completion.result.unwrap();
                usage += response.usage;
                history.push(Message::assistant(&response));
                if response.tool_calls.is_empty() {
                    break;
                }
                for call in &response.tool_calls {
                    let answer = reads::call(&ctx, &call.name, &json!({})).await.unwrap();
                    history.push(Message::tool_result(call.id.clone(), answer.to_string()));
                }
            }
        }
        std::hint::black_box(usage);
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn builder(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    // A tool call when the last message is the user's, an answer after the tool result.
    let server = FakeServer::start(Box::new(|body| {
        let last = body["messages"].as_array().and_then(|m| m.last()).cloned();
        let after_tool = last.is_some_and(|m| m["role"] == "tool");
        let reply = if after_tool {
            completion("The plan has one step.", &[])
        } else {
            completion("", &[("read_plan", json!({}))])
        };
        (200, reply)
    }));
    workspace(&root, &server);
    let engine = Engine::new(CacheSetting::Dir(support::component_cache())).unwrap();
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let registry = Arc::new(
        tokio
            .block_on(PluginRegistry::with_bundled(&engine))
            .unwrap(),
    );
    let bench = Bench {
        root: root.clone(),
        runtime: Runtime::new(registry.clone()),
        registry,
        server,
    };
    let system = system_prompt(&root, Mode::Builder);
    tokio.block_on(bench.session());
    tokio.block_on(bench.direct(&system));

    let mut group = c.benchmark_group("builder");
    group.sample_size(10);
    group.bench_function("session_10_turns", |b| {
        b.iter(|| tokio.block_on(bench.session()))
    });
    group.bench_function("direct_calls_10_turns", |b| {
        b.iter(|| tokio.block_on(bench.direct(&system)))
    });
    group.finish();

    // Interleaved sample: drift in machine load hits both alike.
    let samples = support::rounds(30, 2);
    let (mut s, mut d, mut o) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..samples {
        // Each sample starts from no session on disk, as the first one did.
        let _ = std::fs::remove_dir_all(root.join("builder"));
        let _ = std::fs::remove_dir_all(root.join("costs"));
        let start = Instant::now();
        tokio.block_on(bench.session());
        let session = start.elapsed();
        let start = Instant::now();
        tokio.block_on(bench.direct(&system));
        let direct = start.elapsed();
        s.push(session);
        d.push(direct);
        o.push(session.saturating_sub(direct));
    }
    let (s50, d50, o50) = (median(s), median(d), median(o));
    println!();
    println!(
        "builder, {samples} interleaved sessions of {TURNS} turns (2 LLM calls + 1 read_plan call per turn):"
    );
    println!(
        "  session of 10 turns     p50 {:>9.1} ms",
        micros(s50) / 1e3
    );
    println!(
        "  direct calls, 10 turns  p50 {:>9.1} ms",
        micros(d50) / 1e3
    );
    println!(
        "  host overhead           p50 {:>9.1} ms per session, {:.1} us per turn",
        micros(o50) / 1e3,
        micros(o50) / TURNS as f64
    );
    println!(
        "  ratio                       {:>9.2}",
        micros(s50) / micros(d50)
    );
}

criterion_group!(benches, builder);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
