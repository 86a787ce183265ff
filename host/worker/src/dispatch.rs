//! The dispatcher's side: a run's agent step published as a task, its state watched until a
//! worker commits it, its writable folders brought back.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};
use trellis_runner::dispatch::{RemoteOutcome, RemoteStep, StepDispatch, step_folders};
use trellis_runner::events::RunEvent;
use trellis_sandbox::capabilities::Access;
use trellis_sandbox::store::WorkspaceFs;
use trellis_workflow::Workspace;

use crate::bundle::{Bundle, MAX_ENCODED_BYTES, Received, is_under};
use crate::bus::{
    Bus, NatsOptions, STATES, STREAM, State, Task, events_subject, key_of, task_subject,
};
use async_nats::jetstream::stream::LastRawMessageErrorKind;

/// Files every worker needs besides the step's folders: the workflow's own.
const WORKFLOW_FILES: &[&str] = &[
    "planning/plan.json",
    "planning/step_config.json",
    "workflow.json",
    "variables/variables.json",
];

/// Runs a run's agent steps on `trellis worker`s of one pool.
#[derive(Debug)]
pub struct NatsDispatch {
    bus: Bus,
    /// The connection the steps' events come on.
    events: async_nats::Client,
    pool: String,
    /// This dispatcher: unique, so that a second run of a workspace is not taken for a
    /// duplicate of the first.
    run_id: String,
    /// Tasks published per step, for the attempt number of the next.
    attempts: Mutex<BTreeMap<String, u32>>,
    /// The third-party plugins loaded here, `(id, version)`.
    plugins: Vec<(String, String)>,
}

impl NatsDispatch {
    /// Connects to the server and readies the stream, bucket and store; steps go to the
    /// workers of `pool`.
    pub async fn connect(options: &NatsOptions, pool: &str) -> Result<NatsDispatch> {
        check_pool(pool)?;
        let bus = Bus::open(options).await?;
        // Steps' events come from anyone allowed to publish on their subjects: on a
        // connection of their own, each subscription buffering few, so a flood is dropped
        // rather than held.
        let events = options.connect_buffering(Some(EVENTS_BUFFERED)).await?;
        let run_id = format!(
            "{}-{}",
            trellis_sandbox::store::now_rfc3339()
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .collect::<String>(),
            std::process::id()
        );
        Ok(NatsDispatch {
            bus,
            events,
            pool: pool.to_string(),
            run_id,
            attempts: Mutex::default(),
            plugins: Vec::new(),
        })
    }

    /// Bundles kept in `store` instead of the NATS object store.
    pub fn with_artifacts(mut self, store: std::sync::Arc<dyn crate::ArtifactStore>) -> Self {
        self.bus = self.bus.with_artifacts(store);
        self
    }

    /// The third-party plugins loaded here, `(id, version)`: a step that names one goes
    /// only to a worker that has it.
    pub fn with_plugins(mut self, plugins: Vec<(String, String)>) -> Self {
        self.plugins = plugins;
        self
    }

    /// The plugins of `self.plugins` that `step` names (its plan entry or its step config
    /// holds the id as a string, or `id:` at the start of one), `id@version`.
    fn plugins_named(&self, ws: &Workspace, step: &trellis_workflow::Step) -> Vec<String> {
        let text = format!(
            "{}{}",
            serde_json::to_string(step).unwrap_or_default(),
            serde_json::to_string(&ws.agent_configs(&step.id)).unwrap_or_default()
        );
        self.plugins
            .iter()
            .filter(|(id, _)| {
                let quoted = serde_json::Value::String(id.clone()).to_string();
                let prefix = format!("\"{}:", id.replace('"', "\\\""));
                text.contains(&quoted) || text.contains(&prefix)
            })
            .map(|(id, version)| format!("{id}@{version}"))
            .collect()
    }

    /// Publishes `task` (its id the message id: a second publish of it is dropped); whether
    /// the server took it as a duplicate.
    pub async fn publish(&self, task: &Task) -> Result<bool> {
        Ok(self.publish_at(task).await?.duplicate)
    }

    /// [`Self::publish`], with where the stream keeps the task.
    async fn publish_at(&self, task: &Task) -> Result<async_nats::jetstream::publish::PublishAck> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", task.id.as_str());
        let ack = self
            .bus
            .js
            .publish_with_headers(
                task_subject(&self.pool),
                headers,
                serde_json::to_vec(task)?.into(),
            )
            .await
            .map_err(|e| anyhow::anyhow!("publishing step {}: {e}", task.step_id))?
            .await
            .map_err(|e| anyhow::anyhow!("publishing step {}: {e}", task.step_id))?;
        Ok(ack)
    }

    async fn run(&self, step: RemoteStep) -> Result<RemoteOutcome> {
        let ws = Workspace::open_run(&step.workspace, Some(&step.run_folder))
            .map_err(|d| anyhow::anyhow!("the workspace has errors:\n{d}"))?;
        let plan_step = ws
            .plan
            .find_step(&step.step_id)
            .with_context(|| format!("no step {:?} in the plan", step.step_id))?
            .clone();
        let folders = step_folders(&ws, &step.run_folder, &plan_step)?;
        // What comes back: the folders the step may write, and its logs (which the host
        // writes for it).
        let mut writable: Vec<String> = folders
            .iter()
            .filter(|f| f.access == Access::ReadWrite)
            .map(|f| f.path.clone())
            .collect();
        writable.push(format!("runs/{}/logs/{}", step.run_folder, step.step_id));

        let mut bundle = Bundle::new();
        // The database's consistent copy first: a path is sent once, the first time it is
        // added, and a folder of the grant may hold the database file as it is on disk.
        if let Some(snapshot) = database_snapshot(&ws.fs)? {
            bundle.add_bytes("db/db.sqlite", &snapshot)?;
        }
        for file in WORKFLOW_FILES {
            bundle.add_file(&ws.fs, file)?;
        }
        let run_config = format!("runs/{}/planning/step_config.json", step.run_folder);
        bundle.add_file(&ws.fs, &run_config)?;
        bundle.add_folder(&ws.fs, &format!("code/{}", step.step_id))?;
        for folder in &folders {
            bundle.add_folder(&ws.fs, &folder.path)?;
        }

        let canonical = step
            .workspace
            .canonicalize()
            .unwrap_or_else(|_| step.workspace.clone());
        let workspace_id =
            hex::encode(Sha256::digest(canonical.to_string_lossy().as_bytes()))[..16].to_string();
        let attempt = {
            let mut attempts = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
            let n = attempts
                .entry(format!(
                    "{workspace_id}/{}/{}",
                    step.run_folder, step.step_id
                ))
                .or_insert(0);
            *n += 1;
            *n
        };
        let id = format!(
            "{workspace_id}/{}/{}/{}/{attempt}",
            self.run_id, step.run_folder, step.step_id
        );
        let plugins = self.plugins_named(&ws, &plan_step);
        let task = Task {
            plugins,
            input: key_of("input", &id),
            cancel_key: key_of("cancel", &id),
            events: events_subject(&id),
            id,
            run_folder: step.run_folder.clone(),
            step_id: step.step_id.clone(),
            group: step.group.clone(),
            inputs: step.inputs.clone(),
            writable: writable.clone(),
            prerequisite_returns: step.prerequisite_returns,
            context: step.context.clone(),
        };
        self.bus.put(&task.input, bundle.encode()).await?;
        let key = task.key();
        self.bus
            .states
            .put(&key, serde_json::to_vec(&State::Queued)?.into())
            .await
            .map_err(|e| anyhow::anyhow!("recording step {}: {e}", step.step_id))?;
        // The step's events, as they happen where it runs: seen here as if it ran here (but
        // its start and end, which this run says itself).
        let mut events = self
            .events
            .subscribe(task.events.clone())
            .await
            .map_err(|e| anyhow::anyhow!("following step {}: {e}", step.step_id))?;
        // Read as fast as they come (a message held pins the connection's buffer), shown
        // by a thread of their own (a slow terminal holds up nothing); past what waits to be
        // shown, events are dropped.
        let (shown, mut to_show) = tokio::sync::mpsc::channel::<RunEvent>(EVENTS_BUFFERED);
        let reader = {
            let step_id = step.step_id.clone();
            tokio::spawn(async move {
                while let Some(message) = events.next().await {
                    if message.payload.is_empty() {
                        break;
                    }
                    // Anyone who may publish on the subject can send events: a big one is
                    // dropped unread, and only what happens inside this step is shown.
                    if message.payload.len() > MAX_EVENT_BYTES {
                        continue;
                    }
                    if let Ok(event) = serde_json::from_slice::<RunEvent>(&message.payload)
                        && inside_step(&event, &step_id)
                    {
                        let _ = shown.try_send(event);
                    }
                }
            })
        };
        let mut forward = {
            let observer = step.observer.clone();
            tokio::task::spawn_blocking(move || {
                while let Some(event) = to_show.blocking_recv() {
                    observer.emit(event);
                }
            })
        };
        // JetStream says when a task was delivered its last time without an ack.
        let advisories = self
            .bus
            .client
            .subscribe(format!(
                "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{STREAM}.{}",
                crate::bus::consumer_name(&self.pool)
            ))
            .await
            .map_err(|e| anyhow::anyhow!("following step {}: {e}", step.step_id))?;
        let sequence = self.publish_at(&task).await?.sequence;

        let waited = self.wait(&task, &key, sequence, advisories, &step).await;
        // The input was read, or will never be.
        let _ = self.bus.artifacts.delete(&task.input).await;
        // The worker sent its last events before it committed: they are shown before the
        // step's end, unless they were lost on the way.
        if tokio::time::timeout(Duration::from_secs(2), &mut forward)
            .await
            .is_err()
        {
            // The reader's end ends the thread showing them.
            reader.abort();
        }
        let (worker, mut outcome, output) = waited?;
        outcome.worker = Some(worker.clone());
        let fetched = self.bus.get(&output, MAX_ENCODED_BYTES).await;
        let _ = self.bus.artifacts.delete(&output).await;
        let received = fetched
            .and_then(Received::decode)
            .with_context(|| format!("the outputs of step {} from {worker}", step.step_id))?;
        if let Some(outside) = received
            .entries()
            .find(|e| !writable.iter().any(|w| is_under(&e.path, w)))
        {
            bail!(
                "worker {worker} sent {:?} for step {}, outside the folders it may write",
                outside.path,
                step.step_id
            );
        }
        bring_back(&ws.fs, &writable, &received)?;
        Ok(outcome)
    }

    /// Waits for the task's state to be committed (or failed); sets the task's cancellation
    /// key when the run is stopped. A watch the server drops (a restart) is made again; the
    /// server gone for longer than [`SERVER_GONE`] fails the step.
    async fn wait(
        &self,
        task: &Task,
        key: &str,
        sequence: u64,
        mut advisories: async_nats::Subscriber,
        step: &RemoteStep,
    ) -> Result<(String, RemoteOutcome, String)> {
        let (cancel, observer) = (&step.cancel, &step.observer);
        let mut cancelled = false;
        let mut taken_by: Option<String> = None;
        let mut gone_since: Option<std::time::Instant> = None;
        let mut looked = std::time::Instant::now();
        let published = std::time::Instant::now();
        let mut queued = true;
        loop {
            if gone_since.is_some_and(|since| since.elapsed() > SERVER_GONE) {
                bail!(
                    "step {}: the NATS server was out of reach for {} s while the step ran",
                    task.step_id,
                    SERVER_GONE.as_secs()
                );
            }
            let mut watch = match self.bus.states.watch_with_history(key).await {
                Ok(watch) => watch,
                Err(e) => {
                    tracing::warn!("watching step {}: {e}", task.step_id);
                    gone_since.get_or_insert_with(std::time::Instant::now);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            loop {
                if !cancelled && cancel.load(Ordering::SeqCst) {
                    cancelled = self
                        .bus
                        .states
                        .put(&task.cancel_key, "stop".into())
                        .await
                        .is_ok();
                }
                // Looked at on a clock, not only when the watch is quiet: a watch the server
                // keeps ending and making again must not keep the look from happening.
                if looked.elapsed() >= TASK_LOOK {
                    looked = std::time::Instant::now();
                    self.check_queued(task, key, sequence).await?;
                }
                let next = tokio::time::timeout(Duration::from_millis(200), watch.next()).await;
                let entry = match next {
                    Err(_) => {
                        if queued && published.elapsed() > CLAIM_WAIT {
                            bail!(
                                "step {}: no worker of pool {} took it within {} s (are \
                                 workers running, on this pool?)",
                                task.step_id,
                                self.pool,
                                CLAIM_WAIT.as_secs()
                            );
                        }
                        while let Ok(Some(advisory)) =
                            tokio::time::timeout(Duration::ZERO, advisories.next()).await
                        {
                            self.check_last_delivery(task, key, sequence, &advisory.payload)
                                .await?;
                        }
                        continue;
                    }
                    Ok(Some(Ok(entry))) => entry,
                    Ok(None) | Ok(Some(Err(_))) => break,
                };
                gone_since = None;
                let state = read_state(task, &entry.value)?;
                queued = matches!(state, State::Queued | State::Refused { .. });
                match state {
                    State::Done {
                        worker,
                        outcome,
                        output,
                    } => return Ok((worker, outcome, output)),
                    State::Failed { why } => bail!("step {}: {why}", task.step_id),
                    State::Running { worker, .. } if taken_by.as_ref() != Some(&worker) => {
                        observer.emit(RunEvent::StepOnWorker {
                            step_id: task.step_id.clone(),
                            worker: worker.clone(),
                        });
                        taken_by = Some(worker);
                    }
                    State::Queued | State::Running { .. } | State::Refused { .. } => {}
                }
            }
            gone_since.get_or_insert_with(std::time::Instant::now);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl NatsDispatch {
    /// Fails when the task left the queue without being committed (a client acked or
    /// deleted it: no worker will ever take it again). A task the stream still holds, or one
    /// committed meanwhile, is fine; a server out of reach says nothing.
    async fn check_queued(&self, task: &Task, key: &str, sequence: u64) -> Result<()> {
        let Ok(stream) = self.bus.js.get_stream(STREAM).await else {
            return Ok(());
        };
        match stream.get_raw_message(sequence).await {
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
                // Committed and then acked, the usual end: the state says so.
                if let Ok(Some(entry)) = self.bus.states.entry(key).await
                    && matches!(
                        read_state(task, &entry.value)?,
                        State::Done { .. } | State::Failed { .. }
                    )
                {
                    return Ok(());
                }
                bail!(
                    "step {}: its task left the queue without a worker committing it (taken \
                     off by a client that is not a worker?)",
                    task.step_id
                )
            }
            _ => Ok(()),
        }
    }
}

impl NatsDispatch {
    /// Fails when `advisory` says the task was delivered its last time and no worker
    /// committed it (the last worker died with it), naming the workers that tried.
    async fn check_last_delivery(
        &self,
        task: &Task,
        key: &str,
        sequence: u64,
        advisory: &[u8],
    ) -> Result<()> {
        let advisory: serde_json::Value = serde_json::from_slice(advisory).unwrap_or_default();
        if advisory["stream_seq"].as_u64() != Some(sequence) {
            return Ok(());
        }
        // Give a commit on its way the time of a lease.
        let deadline = std::time::Instant::now() + crate::bus::LEASE;
        let mut tried = Vec::new();
        while std::time::Instant::now() < deadline {
            if let Ok(Some(entry)) = self.bus.states.entry(key).await {
                match read_state(task, &entry.value)? {
                    State::Done { .. } | State::Failed { .. } => return Ok(()),
                    State::Running {
                        worker, tried: t, ..
                    } => {
                        tried = t;
                        tried.push(worker);
                    }
                    State::Refused { tried: t, .. } => tried = t,
                    State::Queued => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        bail!(
            "step {}: delivered {} times and no worker committed it (workers that tried: {})",
            task.step_id,
            crate::bus::DEFAULT_MAX_DELIVER,
            if tried.is_empty() {
                "none named".to_string()
            } else {
                tried.join(", ")
            }
        )
    }
}

/// How long a task may wait for a worker to take it: past it the step fails (no worker of
/// the pool runs, or a client held the task back).
const CLAIM_WAIT: Duration = Duration::from_secs(600);

/// How often a dispatcher looks that a task it waits on is still queued.
const TASK_LOOK: Duration = Duration::from_secs(5);

/// A task's state as its entry holds it; one that does not read as a state fails the step
/// (something other than a worker wrote it).
fn read_state(task: &Task, value: &[u8]) -> Result<State> {
    serde_json::from_slice::<State>(value).map_err(|e| {
        anyhow::anyhow!(
            "step {}: its state in the bucket {STATES} does not read as a step state ({e}); \
             something other than a worker wrote it",
            task.step_id
        )
    })
}

/// How long a dispatcher waits for a NATS server it lost while a step runs.
const SERVER_GONE: Duration = Duration::from_secs(60);

impl StepDispatch for NatsDispatch {
    fn run_step(&self, step: RemoteStep) -> BoxFuture<'_, Result<RemoteOutcome>> {
        Box::pin(self.run(step))
    }
}

/// A pool name: letters, digits, `-` and `_` (it is a subject token).
pub fn check_pool(pool: &str) -> Result<()> {
    if pool.is_empty()
        || pool.len() > 64
        || !pool
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        bail!("pool {pool:?}: use 1 to 64 letters, digits, '-' and '_'");
    }
    Ok(())
}

/// A consistent copy of the workspace database, when there is one: what a step that reads
/// it sees. Read through the fenced read-only connection (every file SQLite opens checked
/// for links), copied with SQLite's backup into a private temporary file.
fn database_snapshot(fs: &WorkspaceFs) -> Result<Option<Vec<u8>>> {
    if !fs.is_file("db/db.sqlite") {
        return Ok(None);
    }
    let host = fs.check_file_path("db/db.sqlite")?;
    let source = trellis_sandbox::capabilities::sql::open(
        &host,
        trellis_sandbox::capabilities::sql::SqlAccess::ReadOnly,
        Duration::from_secs(60),
    )
    .map_err(|e| anyhow::anyhow!("opening db/db.sqlite to send a copy: {e}"))?;
    let dir = tempfile::tempdir()?;
    let copy = dir.path().join("snapshot.sqlite");
    let mut target = rusqlite::Connection::open(&copy)?;
    rusqlite::backup::Backup::new(source.conn(), &mut target)?
        .run_to_completion(256, Duration::ZERO, None)
        .context("copying db/db.sqlite")?;
    drop(target);
    Ok(Some(std::fs::read(&copy)?))
}

/// Events of a step waiting, at most: on the dispatcher's connection (NATS's messages are
/// at most 1 MiB by default), and read, to be shown. Past it they are dropped.
const EVENTS_BUFFERED: usize = 64;

/// The largest event of a step shown (a turn's, a call's: small; a model's streamed piece
/// of a reply the largest).
const MAX_EVENT_BYTES: usize = 64 << 10;

/// Whether `event` is one a worker sends for step `step_id`: what happens inside the step
/// (or a sub-agent of it), never the run's own events, which the dispatcher says itself.
fn inside_step(event: &RunEvent, step_id: &str) -> bool {
    let of_step = |s: &str| {
        s == step_id
            || s.strip_prefix(step_id)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    match event {
        RunEvent::ItemStarted { step_id: s, .. }
        | RunEvent::ItemEnded { step_id: s, .. }
        | RunEvent::TurnStarted { step_id: s, .. }
        | RunEvent::LlmCall { step_id: s, .. }
        | RunEvent::Reply { step_id: s, .. }
        | RunEvent::ToolCall { step_id: s, .. }
        | RunEvent::ToolCallsRefused { step_id: s, .. }
        | RunEvent::Gate { step_id: s, .. }
        | RunEvent::SubAgentStarted { step_id: s, .. }
        | RunEvent::SubAgentEnded { step_id: s, .. } => of_step(s),
        RunEvent::Warning { .. } => true,
        _ => false,
    }
}

/// Replaces each writable folder's content with what the worker sent for it.
fn bring_back(fs: &WorkspaceFs, writable: &[String], received: &Received) -> Result<()> {
    for folder in writable {
        fs.remove_all(folder)
            .with_context(|| format!("emptying {folder} for the step's outputs"))?;
        fs.create_dir_all(folder)?;
    }
    received.write_into(fs, Some(writable))
}
