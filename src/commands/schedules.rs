//! `trellis schedules`: the schedules of a workspace's `workflow.json`, their next firings,
//! and a firing by hand (what `trellis serve` does at their time).

// What is printed here was written by workspaces and models: escaped.
use crate::terminal::println_shown as println;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Subcommand;

use trellis_builder::executions::Executions;
use trellis_builder::schedules::{ScheduleRun, migration_needed, read_runs, record};
use trellis_builder::{BuilderSession, Mode, SessionOptions};
use trellis_sandbox::Engine;
use trellis_sandbox::store::WorkspaceFs;
use trellis_workflow::manifest::schedules::{Schedule, When};

use super::builder::{Approvals, BuilderSetup, builder_setup};
use super::{CacheArgs, PluginDirs};

/// Subcommands of `trellis schedules`.
#[derive(Subcommand, Debug)]
pub enum SchedulesCommand {
    /// One line per schedule: id, on or off, when it fires, its next firing and its last run.
    List {
        /// The workspace folder.
        workspace: PathBuf,
    },
    /// The next firings of the schedules (or of one), in each schedule's time zone.
    Next {
        /// The workspace folder.
        workspace: PathBuf,
        /// Only this schedule.
        schedule: Option<String>,
        /// How many firings of each.
        #[arg(short = 'n', long, default_value_t = 5,
              value_parser = clap::value_parser!(u32).range(1..=1000))]
        count: u32,
    },
    /// Fire a schedule now, enabled or not, as `trellis serve` does at its time: a builder
    /// session in run mode sends its messages one by one; the firing is recorded in
    /// schedule-runs.json. Exit status 1 when it did not end `success`.
    Trigger {
        /// The workspace folder.
        workspace: PathBuf,
        /// The schedule id.
        schedule: String,
        /// Let the key in environment variable VAR go to ORIGIN (repeatable), as for
        /// `trellis run`.
        #[arg(long = "allow-key", value_name = "VAR=ORIGIN")]
        allow_keys: Vec<String>,
        /// Let LLM providers at workflow.json's base_url, and step scripts, reach HOST
        /// although it is loopback or private (repeatable), as for `trellis run`.
        #[arg(long = "allow-host", value_name = "HOST")]
        allow_hosts: Vec<String>,
        /// The builder's model, `provider:model`; else workflow.json's.
        #[arg(long, value_name = "PROVIDER:MODEL")]
        llm: Option<String>,
        #[command(flatten)]
        plugins: PluginDirs,
        #[command(flatten)]
        mcp: super::McpConfigArg,
        #[command(flatten)]
        writes: super::WriteBudgetArgs,
        #[command(flatten)]
        cache: CacheArgs,
    },
}

impl SchedulesCommand {
    /// The workspace folder.
    pub fn workspace(&self) -> &Path {
        match self {
            SchedulesCommand::List { workspace }
            | SchedulesCommand::Next { workspace, .. }
            | SchedulesCommand::Trigger { workspace, .. } => workspace,
        }
    }

    /// The compile-cache options (of `trigger`, which runs plugins).
    pub fn cache(&self) -> Option<&CacheArgs> {
        match self {
            SchedulesCommand::Trigger { cache, .. } => Some(cache),
            _ => None,
        }
    }
}

/// The workspace's schedules; an error naming every problem of workflow.json.
fn schedules(root: &Path) -> Result<Vec<Schedule>> {
    let ws = trellis_workflow::Workspace::open(root).map_err(|diags| {
        anyhow::anyhow!(
            "the workspace does not load:\n{}",
            diags
                .errors()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        )
    })?;
    Ok(ws.manifest.original.schedules)
}

fn when(s: &Schedule) -> String {
    match &s.when {
        When::Cron { cron_expression } => format!("cron {cron_expression:?}"),
        When::Calendar { calendar_items } => format!("calendar, {} items", calendar_items.len()),
    }
}

/// Runs a `trellis schedules` subcommand.
pub async fn run(
    engine: impl FnOnce() -> Result<Engine>,
    command: SchedulesCommand,
) -> Result<ExitCode> {
    match command {
        SchedulesCommand::List { workspace } => {
            let all = schedules(&workspace)?;
            if all.is_empty() {
                println!(
                    "no schedules in {}",
                    workspace.join("workflow.json").display()
                );
            }
            let history = read_runs(&WorkspaceFs::open(&workspace)?);
            let now = chrono::Utc::now();
            for s in &all {
                let next = s
                    .enabled
                    .then(|| s.next_after(now))
                    .flatten()
                    .map(|t| t.with_timezone(&s.tz()).to_rfc3339())
                    .unwrap_or_else(|| "-".into());
                let last = history
                    .iter()
                    .find(|r| r.schedule_id == s.id)
                    .map(|r| format!("{} {}", r.status, r.started_at))
                    .unwrap_or_else(|| "never".into());
                println!(
                    "{}  {}  {} in {}  next {next}  last {last}",
                    s.id,
                    if s.enabled { "on " } else { "off" },
                    when(s),
                    s.timezone
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        SchedulesCommand::Next {
            workspace,
            schedule,
            count,
        } => {
            let all = schedules(&workspace)?;
            let chosen: Vec<&Schedule> = all
                .iter()
                .filter(|s| schedule.as_deref().is_none_or(|id| s.id == id))
                .collect();
            if let Some(id) = &schedule
                && chosen.is_empty()
            {
                bail!("no schedule {id:?} in workflow.json");
            }
            let now = chrono::Utc::now();
            for s in chosen {
                println!("{} ({}, {}):", s.id, when(s), s.timezone);
                let mut at = now;
                for _ in 0..count {
                    let Some(next) = s.next_after(at) else { break };
                    println!("  {}", next.with_timezone(&s.tz()).to_rfc3339());
                    at = next;
                }
                if !s.enabled {
                    println!("  (disabled: it fires only when triggered)");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        SchedulesCommand::Trigger {
            workspace,
            schedule,
            allow_keys,
            allow_hosts,
            llm,
            plugins,
            mcp,
            writes,
            cache: _,
        } => {
            let all = schedules(&workspace)?;
            let ids: Vec<&str> = all.iter().map(|s| s.id.as_str()).collect();
            let s = all.iter().find(|s| s.id == schedule).with_context(|| {
                format!(
                    "no schedule {schedule:?} in workflow.json (its schedules: {})",
                    ids.join(", ")
                )
            })?;
            let fs = WorkspaceFs::open(&workspace)?;
            let mut run = ScheduleRun::start(s, "manual", None);
            record(&fs, &run)?;
            let (status, error) = match migration_needed(&workspace) {
                Some(why) => ("error".to_string(), Some(why)),
                None => {
                    let engine = engine()?;
                    let BuilderSetup {
                        runtime,
                        own,
                        mut template,
                        retry,
                    } = builder_setup(
                        &engine,
                        &plugins,
                        &mcp,
                        Approvals {
                            keys: &allow_keys,
                            hosts: &allow_hosts,
                        },
                        llm.as_deref(),
                        None,
                        false,
                    )
                    .await?;
                    writes.apply(&mut template.turn_budgets);
                    let executions = Executions::new(runtime.clone(), template);
                    // A session that does not open (a workspace at its quota, say) ends the
                    // firing as an error naming why, not as one left running.
                    let opened = BuilderSession::open(
                        &runtime,
                        executions,
                        SessionOptions {
                            root: workspace.clone(),
                            session_id: None,
                            mode: Some(Mode::Run),
                            llm: own,
                            limits: Default::default(),
                            retry,
                            max_rounds: trellis_builder::agent::DEFAULT_MAX_ROUNDS,
                            max_turn_result_bytes: trellis_builder::DEFAULT_TURN_RESULT_BYTES,
                            max_turn_write_bytes: writes.turn_bytes(),
                            max_run_write_bytes: writes.run_bytes(),
                            max_workspace_bytes: writes.workspace_bytes(),
                            max_model_calls: trellis_runner::driver::DEFAULT_RUN_MODEL_CALLS,
                            observer: super::builder::printer(false),
                        },
                    );
                    match opened {
                        Err(e) => ("error".to_string(), Some(format!("{e:#}"))),
                        Ok(mut session) => {
                            run.session_id = Some(session.id().to_string());
                            record(&fs, &run)?;
                            eprintln!("schedule {}: builder session {}", s.id, session.id());
                            trellis_builder::schedules::fire(&mut session, &s.firing_messages())
                                .await
                        }
                    }
                }
            };
            run.end(&status, error.clone());
            record(&fs, &run)?;
            println!(
                "schedule {}: {status}{}",
                s.id,
                error.map(|e| format!(" ({e})")).unwrap_or_default()
            );
            Ok(if status == "success" {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}
