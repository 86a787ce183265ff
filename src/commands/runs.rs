//! `trellis runs`: lists past runs and inspects their steps.

// What is printed here was written by models, guests or workspaces: escaped, each line kept
// one line whatever a model or guest wrote in it (a newline is shown as `\x0a`).
use crate::terminal::println_line as println;
use crate::terminal::shown_name;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;
use trellis_runner::run_folder::ACTIVE_RUN;
use trellis_runner::runs;

/// Subcommands of `trellis runs`.
#[derive(Subcommand, Debug)]
pub enum RunsCommand {
    /// One line per run folder under `runs/`, with each step's status.
    ///
    /// `iteration-0` first, then `iteration-N` newest first; group folders follow
    /// their iteration. A step's status is its `execution-final-summary.json`'s, else
    /// its `session.json`'s, else `no summary`.
    List {
        /// The workspace folder.
        workspace: PathBuf,
    },
    /// Show one step of a run: status, concerns, session entries and turn logs.
    ///
    /// Read from `runs/<run>/execution/<step>/` and `runs/<run>/logs/<step>/`.
    /// Exit status 1 when the run folder or the step does not exist.
    Show {
        /// The workspace folder.
        workspace: PathBuf,
        /// The step id.
        step: String,
        /// Run folder under `runs/` [default: iteration-0].
        #[arg(long, value_name = "FOLDER")]
        run: Option<String>,
    },
}

impl RunsCommand {
    /// The workspace folder it reads.
    pub fn workspace(&self) -> &Path {
        match self {
            RunsCommand::List { workspace } | RunsCommand::Show { workspace, .. } => workspace,
        }
    }
}

/// Runs a `trellis runs` subcommand; it reads files only, no plugin runs.
pub fn run(command: &RunsCommand) -> Result<ExitCode> {
    match command {
        RunsCommand::List { workspace } => list_runs(workspace)?,
        RunsCommand::Show {
            workspace,
            step,
            run,
        } => show_run_step(workspace, step, run.as_deref())?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `trellis runs list`: one line per run folder, then its steps.
fn list_runs(root: &Path) -> Result<()> {
    anyhow::ensure!(
        root.join(super::PLAN_FILE).is_file(),
        "{}: not a workspace (no {})",
        root.display(),
        super::PLAN_FILE
    );
    let runs = runs::list_runs(root)?;
    if runs.is_empty() {
        println!("no runs in {}", root.join("runs").display());
    }
    for run in runs {
        if run.steps.is_empty() {
            println!("{}: no steps", run.run_folder);
            continue;
        }
        let steps: Vec<String> = run
            .steps
            .iter()
            .map(|s| match &s.completed_at {
                Some(at) => format!("{} {} {at}", s.step_id, s.status),
                None => format!("{} {}", s.step_id, s.status),
            })
            .collect();
        println!("{}: {}", run.run_folder, steps.join(", "));
    }
    Ok(())
}

/// One gate's result in a line: passed, or how many of its checks failed.
fn gate_line(g: &runs::GateResult) -> String {
    if g.passed {
        format!("gate passed ({} checks, attempt {})", g.checks, g.attempt)
    } else {
        format!(
            "gate failed: {} of {} checks failed (attempt {})",
            g.failed.len(),
            g.checks,
            g.attempt
        )
    }
}

/// `trellis runs show`: one step of one run.
fn show_run_step(root: &Path, step: &str, run: Option<&str>) -> Result<()> {
    let report = runs::show_step(root, run.unwrap_or(ACTIVE_RUN), step)?;
    println!("step: {} (run {})", report.step_id, report.run_folder);
    match &report.completed_at {
        Some(at) => println!("status: {} at {at}", report.status),
        None => println!("status: {}", report.status),
    }
    if report.concerns.is_empty() {
        println!("concerns: none");
    } else {
        println!("concerns:");
        for concern in &report.concerns {
            println!("  - {concern}");
        }
    }
    let turns = if report.sub_agent_turns > 0 {
        format!(
            "{} (and {} of its sub-agents: {} in all)",
            report.turns.len(),
            report.sub_agent_turns,
            report.turns.len() + report.sub_agent_turns
        )
    } else {
        report.turns.len().to_string()
    };
    println!("turns: {turns}");
    if let Some(remote) = &report.remote {
        remote_lines(remote);
    }
    println!("entries:");
    match &report.session_unreadable {
        Some(why) => println!("  (session.json unreadable: {why})"),
        None if report.entries.is_empty() => println!("  (no session.json)"),
        None => {}
    }
    for e in &report.entries {
        // A gate's entry tells the gate's result, not the agent's last reply.
        let gate = (e.item_type == "prevalidation")
            .then(|| report.gates.iter().find(|g| g.label == e.item_id))
            .flatten();
        let summary = match gate {
            Some(g) => gate_line(g),
            None => runs::first_line(e.summary.as_deref()).to_string(),
        };
        let summary = if summary.is_empty() {
            String::new()
        } else {
            format!(": {summary}")
        };
        println!("  {} [{}] {}{summary}", e.item_id, e.item_type, e.status);
    }
    if !report.gates.is_empty() {
        println!("gates:");
    }
    for g in &report.gates {
        println!("  {}: {}", g.label, gate_line(g));
        for c in &g.failed {
            let at = if c.path.is_empty() {
                c.file.clone()
            } else {
                format!("{} {}", c.file, c.path)
            };
            println!("    - {at}: {}", c.message);
            println!("      expected: {}", c.expected);
            println!("      actual:   {}", c.actual);
        }
    }
    if !report.sub_agent_calls.is_empty() {
        println!("sub-agent calls:");
    }
    for call in &report.sub_agent_calls {
        let error = call
            .error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        println!(
            "  {} route {}: {}{error}",
            call.call_id, call.route_id, call.status
        );
        for file in &call.files {
            println!("    {}", shown_name(file));
        }
    }
    if !report.outputs.is_empty() {
        println!("output files:");
    }
    for path in &report.outputs {
        println!("  {}", shown_name(&path.display().to_string()));
    }
    if !report.script_logs.is_empty() {
        println!("script logs:");
    }
    for path in &report.script_logs {
        println!("  {}", shown_name(&path.display().to_string()));
    }
    if !report.turns.is_empty() {
        println!("turn logs:");
    }
    let item_type = |id: &str| {
        report
            .entries
            .iter()
            .find(|e| e.item_id == id)
            .map(|e| e.item_type.as_str())
    };
    for t in &report.turns {
        let several = report
            .turns
            .iter()
            .filter(|o| o.item_id == t.item_id)
            .count()
            > 1;
        let label = match item_type(&t.item_id) {
            Some("foreach") => format!("{} row {}", t.item_id, t.iteration),
            _ if several => format!("{} iteration {}", t.item_id, t.iteration),
            _ => t.item_id.clone(),
        };
        println!(
            "  turn {} ({label}): {} {}, LLM calls {}, tool calls {}{}, tokens {} prompt / {} completion, {} ms",
            t.attempt,
            t.model,
            t.status,
            t.llm_calls,
            t.tool_calls,
            tool_list(&t.tool_names),
            t.prompt_tokens,
            t.completion_tokens,
            t.duration_ms
        );
        if t.tool_errors > 0 {
            println!("    {} tool calls failed", t.tool_errors);
        }
        if let Some(why) = &t.conversation_unread {
            println!("    conversation log not read: {why}");
        }
    }
    Ok(())
}

/// The tool names of a turn as `runs show` lists them: the first 20, then how many more.
/// What a step running on a worker did so far (its files come back when it ends).
fn remote_lines(remote: &runs::RemoteProgress) {
    let worker = remote
        .worker
        .as_deref()
        .unwrap_or("(none has taken it yet)");
    println!("on worker: {}", shown_name(worker));
    let item = remote
        .item
        .as_deref()
        .map(|item| format!(" (last item {})", shown_name(item)))
        .unwrap_or_default();
    let model = remote
        .model
        .as_deref()
        .map(|model| format!(", last model {}", shown_name(model)))
        .unwrap_or_default();
    let recent: Vec<String> = remote
        .recent_tools
        .iter()
        .map(|name| shown_name(name).into_owned())
        .collect();
    println!(
        "  so far: {} turn(s){item}, LLM calls {} ({} failed){model}, tokens {} prompt / {} \
         completion, tool calls {} ({} failed){}, gates {} ({} passed)",
        remote.turns,
        remote.llm_calls,
        remote.llm_errors,
        remote.prompt_tokens,
        remote.completion_tokens,
        remote.tool_calls,
        remote.tool_errors,
        tool_list(&recent),
        remote.gates,
        remote.gates_passed
    );
}

fn tool_list(names: &[String]) -> String {
    const SHOWN: usize = 20;
    match names.len() {
        0 => String::new(),
        n if n <= SHOWN => format!(" ({})", names.join(", ")),
        n => format!(" ({}, and {} more)", names[..SHOWN].join(", "), n - SHOWN),
    }
}
