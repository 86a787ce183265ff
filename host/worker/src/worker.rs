//! The worker's side: tasks pulled from a pool, each run in a private scratch workspace made
//! of what the step may read, its writable folders sent back, its state committed once.
//!
//! Delivery is at least once; the commit is once: a task's state moves by compare-and-set on
//! its revision in the states bucket, so of two workers holding one task (a lease that ran
//! out, a duplicate delivery) only one commits, and a task committed already is acked and
//! dropped. A running task's lease is renewed (an in-progress ack, and the state's
//! `lease_until`) every few seconds; a worker that dies stops renewing, and JetStream
//! delivers the task to another once the lease is over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use async_nats::jetstream::{self, AckKind, consumer::pull};
use futures::StreamExt;
use futures::future::BoxFuture;
use trellis_runner::dispatch::RemoteOutcome;
use trellis_runner::events::{Observer, RunEvent};
use trellis_runner::workflow_run::RunOptions;
use trellis_sandbox::store::WorkspaceFs;

use crate::bundle::{Bundle, MAX_ENCODED_BYTES, Received};
use crate::bus::{
    Bus, DEFAULT_MAX_DELIVER, HEARTBEAT, LEASE, STREAM, State, Task, consumer_name, events_subject,
    key_of, now_ms, task_subject,
};
use crate::dispatch::check_pool;

/// Runs one step in a scratch workspace: the run options (the step, its group, inputs), a
/// flag set to stop it, and the observer of its events. `Err` is a refusal (the worker
/// cannot run it: a plugin or a key approval it lacks), said to the dispatcher; the step's
/// own failure is an `Ok` outcome.
pub type StepRunner = Arc<
    dyn Fn(
            std::path::PathBuf,
            RunOptions,
            Arc<AtomicBool>,
            Observer,
        ) -> BoxFuture<'static, Result<RemoteOutcome>>
        + Send
        + Sync,
>;

/// Events of a step waiting to be published, at most: past it, events are dropped (what
/// the dispatcher shows is a view; the step's files and outcome come whole).
const EVENTS_QUEUED: usize = 1024;

/// How a commit ended.
enum Commit {
    /// Written.
    Done,
    /// Another worker's commit or claim stands (this one's lease ran out).
    Lost,
    /// The server could not be reached.
    Unreachable,
}

/// A worker of one pool.
pub struct Worker {
    bus: Bus,
    pool: String,
    name: String,
    concurrency: usize,
    runner: StepRunner,
    /// The third-party plugins this worker has, `id@version`.
    plugins: Vec<String>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("pool", &self.pool)
            .field("name", &self.name)
            .field("concurrency", &self.concurrency)
            .finish()
    }
}

impl Worker {
    /// A worker named `name` taking tasks of `pool`, `concurrency` at once, running each
    /// with `runner`.
    pub fn new(
        bus: Bus,
        pool: &str,
        name: &str,
        concurrency: usize,
        runner: StepRunner,
    ) -> Result<Worker> {
        check_pool(pool)?;
        Ok(Worker {
            bus,
            pool: pool.to_string(),
            name: name.to_string(),
            concurrency: concurrency.max(1),
            runner,
            plugins: Vec::new(),
        })
    }

    /// The third-party plugins this worker has, `(id, version)`: a task naming another is
    /// refused, naming it.
    pub fn with_plugins(mut self, plugins: Vec<(String, String)>) -> Self {
        self.plugins = plugins
            .into_iter()
            .map(|(id, version)| format!("{id}@{version}"))
            .collect();
        self
    }

    /// Takes tasks until `stop` is set.
    pub async fn run(self, stop: Arc<AtomicBool>) -> Result<()> {
        let stream = self
            .bus
            .js
            .get_stream(STREAM)
            .await
            .map_err(|e| anyhow::anyhow!("finding the stream {STREAM}: {e}"))?;
        let consumer: jetstream::consumer::Consumer<pull::Config> = stream
            .get_or_create_consumer(
                &consumer_name(&self.pool),
                pull::Config {
                    durable_name: Some(consumer_name(&self.pool)),
                    filter_subject: task_subject(&self.pool),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: LEASE,
                    max_deliver: DEFAULT_MAX_DELIVER,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("joining pool {}: {e}", self.pool))?;
        let slots = Arc::new(tokio::sync::Semaphore::new(self.concurrency));
        let me = Arc::new(self);
        tracing::info!(worker = %me.name, pool = %me.pool, "taking tasks");
        while !stop.load(Ordering::SeqCst) {
            // A free slot, looked for again and again so that a stop is heard while every
            // slot is busy.
            let Ok(permit) =
                tokio::time::timeout(Duration::from_millis(500), slots.clone().acquire_owned())
                    .await
            else {
                continue;
            };
            let permit = permit?;
            let mut batch = match consumer
                .fetch()
                .max_messages(1)
                .expires(Duration::from_secs(1))
                .messages()
                .await
            {
                Ok(batch) => batch,
                Err(e) => {
                    // The server restarting: tasks wait in its stream meanwhile.
                    tracing::warn!("fetching a task: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            let Some(message) = batch.next().await else {
                continue;
            };
            let message = match message {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!("fetching a task: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            let me = me.clone();
            tokio::spawn(async move {
                if let Err(e) = me.take(message).await {
                    tracing::warn!(worker = %me.name, "{e:#}");
                }
                drop(permit);
            });
        }
        Ok(())
    }

    /// One delivered task: claimed, run, committed, acked; or dropped when committed already.
    async fn take(&self, message: jetstream::Message) -> Result<()> {
        let task: Task = match serde_json::from_slice::<Task>(&message.payload) {
            Ok(task) if task.events == events_subject(&task.id) => task,
            Ok(task) => {
                // Its events would go to a subject of its choosing (JetStream's API, say).
                let _ = message.ack_with(AckKind::Term).await;
                anyhow::bail!(
                    "task {:?} names {:?} for its events, not its own subject",
                    task.id,
                    task.events
                );
            }
            Err(e) => {
                // Not a task of ours: nothing will ever read it.
                let _ = message.ack_with(AckKind::Term).await;
                anyhow::bail!("a message that is not a task: {e}");
            }
        };
        let delivered = message.info().map(|i| i.delivered).unwrap_or(1);
        let key = task.key();
        let entry = self
            .bus
            .states
            .entry(&key)
            .await
            .map_err(|e| anyhow::anyhow!("reading the state of {}: {e}", task.id))?;
        let (revision, state) = match entry {
            Some(e) => (
                e.revision,
                serde_json::from_slice::<State>(&e.value).unwrap_or(State::Queued),
            ),
            None => (0, State::Queued),
        };
        let tried = match state {
            State::Done { .. } | State::Failed { .. } => {
                // Committed already: a duplicate delivery.
                let _ = message.ack().await;
                return Ok(());
            }
            State::Running {
                worker,
                lease_until,
                tried,
            } => {
                let now = now_ms();
                if lease_until > now && worker != self.name {
                    // Another worker holds it: this delivery is a duplicate while it lives;
                    // looked at again once its lease would be over.
                    let left = Duration::from_millis(lease_until - now + 500);
                    let _ = message.ack_with(AckKind::Nak(Some(left))).await;
                    return Ok(());
                }
                let mut tried = tried;
                tried.push(worker);
                tried
            }
            State::Refused { tried, .. } => tried,
            State::Queued => Vec::new(),
        };
        let claim = State::Running {
            worker: self.name.clone(),
            lease_until: now_ms() + LEASE.as_millis() as u64,
            tried: tried.clone(),
        };
        let Ok(mut revision) = self
            .bus
            .states
            .update(&key, serde_json::to_vec(&claim)?.into(), revision)
            .await
        else {
            // Another worker claimed it between the read and now.
            let _ = message.ack_with(AckKind::Nak(Some(LEASE))).await;
            return Ok(());
        };
        tracing::info!(worker = %self.name, step = %task.step_id, task = %task.id, "running");

        // Renew the lease while the step runs; stop the step when the run is cancelled.
        let cancel = Arc::new(AtomicBool::new(false));
        let (done, mut ended) = tokio::sync::oneshot::channel::<()>();
        let message = Arc::new(message);
        let heartbeat = {
            let (bus, key, name, tried) = (
                self.bus.clone(),
                key.clone(),
                self.name.clone(),
                tried.clone(),
            );
            let (message, cancel, cancel_key) =
                (message.clone(), cancel.clone(), task.cancel_key.clone());
            tokio::spawn(async move {
                let mut stops = bus.states.watch_with_history(&cancel_key).await.ok();
                let mut beat = tokio::time::interval(HEARTBEAT);
                beat.tick().await;
                loop {
                    let stop = async {
                        match &mut stops {
                            Some(watch) => watch.next().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = &mut ended => break,
                        entry = stop => match entry {
                            Some(Ok(_)) => cancel.store(true, Ordering::SeqCst),
                            // The watch ended (the server restarting): made again.
                            _ => {
                                tokio::time::sleep(Duration::from_millis(500)).await;
                                stops = bus.states.watch_with_history(&cancel_key).await.ok();
                            }
                        },
                        _ = beat.tick() => {
                            let _ = message.ack_with(AckKind::Progress).await;
                            let lease = State::Running {
                                worker: name.clone(),
                                lease_until: now_ms() + LEASE.as_millis() as u64,
                                tried: tried.clone(),
                            };
                            if let Ok(bytes) = serde_json::to_vec(&lease)
                                && let Ok(r) = bus.states.update(&key, bytes.into(), revision).await
                            {
                                revision = r;
                            }
                        }
                    }
                }
                revision
            })
        };
        let ran = self.run_task(&task, cancel).await;
        let _ = done.send(());
        let revision = heartbeat.await.unwrap_or(0);

        let commit = match ran {
            Ok((outcome, output)) => State::Done {
                worker: self.name.clone(),
                outcome,
                output,
            },
            Err(why) if why.downcast_ref::<NotSendable>().is_some() => State::Failed {
                why: format!("the step ran on worker {}, and {why:#}", self.name),
            },
            Err(why) => {
                let mut tried = tried;
                tried.push(self.name.clone());
                let why = format!("{why:#}");
                if delivered >= DEFAULT_MAX_DELIVER {
                    State::Failed {
                        why: format!(
                            "no worker could run it after {delivered} deliveries (workers \
                             that tried: {}); the last said: {why}",
                            tried.join(", ")
                        ),
                    }
                } else {
                    State::Refused { tried, why }
                }
            }
        };
        let refused = matches!(commit, State::Refused { .. });
        match self.commit(&key, &commit, revision).await {
            Commit::Done if refused => {
                tracing::warn!(worker = %self.name, step = %task.step_id, "refused the task");
                // Another worker of the pool may have what this one lacks.
                let _ = message
                    .ack_with(AckKind::Nak(Some(Duration::from_millis(200))))
                    .await;
            }
            Commit::Done | Commit::Lost => {
                let _ = message.ack().await;
            }
            Commit::Unreachable => {
                // Left unacked: delivered again once the lease is over, and run again.
                tracing::warn!(worker = %self.name, step = %task.step_id, "not committed: the NATS server is out of reach");
            }
        }
        Ok(())
    }

    /// Writes `state` over the claim this worker holds at `revision`, trying again while the
    /// server is out of reach (a restart), for up to a minute.
    async fn commit(&self, key: &str, state: &State, mut revision: u64) -> Commit {
        let Ok(bytes) = serde_json::to_vec(state) else {
            return Commit::Unreachable;
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if self
                .bus
                .states
                .update(key, bytes.clone().into(), revision)
                .await
                .is_ok()
            {
                return Commit::Done;
            }
            // Why it failed: another worker's commit or claim (this one's lease ran out),
            // or no server to answer.
            match self.bus.states.entry(key).await {
                Ok(Some(entry)) => match serde_json::from_slice::<State>(&entry.value) {
                    Ok(State::Running { worker, .. }) if worker == self.name => {
                        revision = entry.revision;
                    }
                    _ => return Commit::Lost,
                },
                Ok(None) => return Commit::Lost,
                Err(_) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(_) => return Commit::Unreachable,
            }
        }
    }

    /// Runs the task in a scratch workspace; its outcome and the object of its writable
    /// folders.
    async fn run_task(
        &self,
        task: &Task,
        cancel: Arc<AtomicBool>,
    ) -> Result<(RemoteOutcome, String)> {
        let missing: Vec<&str> = task
            .plugins
            .iter()
            .filter(|p| !self.plugins.contains(p))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            anyhow::bail!(
                "worker {} does not have the plugin(s) the step names: {} (load them with \
                 `trellis worker --plugins DIR`)",
                self.name,
                missing.join(", ")
            );
        }
        let input = Received::decode(self.bus.get(&task.input, MAX_ENCODED_BYTES).await?)
            .context("the step's inputs")?;
        let scratch = tempfile::Builder::new()
            .prefix("trellis-worker-")
            .tempdir()
            .context("making a scratch workspace")?;
        let fs = WorkspaceFs::open(scratch.path())?;
        input.write_into(&fs, None)?;
        for folder in &task.writable {
            fs.create_dir_all(folder)?;
        }
        let options = RunOptions {
            step: Some(task.step_id.clone()),
            group: task.group.clone(),
            inputs: task.inputs.clone(),
            step_context: task
                .context
                .iter()
                .map(|text| (task.step_id.clone(), text.clone()))
                .collect(),
            prerequisite_returns: [(task.step_id.clone(), task.prerequisite_returns)].into(),
            step_alone: true,
            ..RunOptions::default()
        };
        let (events, mut queued) = tokio::sync::mpsc::channel::<Vec<u8>>(EVENTS_QUEUED);
        let publisher = {
            let (client, subject) = (self.bus.client.clone(), task.events.clone());
            tokio::spawn(async move {
                while let Some(event) = queued.recv().await {
                    let _ = client.publish(subject.clone(), event.into()).await;
                }
                // The end of the events: an empty message.
                let _ = client.publish(subject, bytes::Bytes::new()).await;
                let _ = client.flush().await;
            })
        };
        // The scratch workspace holds the code of this step only: what loading it says of
        // the other steps (a script missing) is not so, and the dispatcher said its own.
        let own = format!("(step {:?})", task.step_id);
        let observer = Observer::new(move |event: &RunEvent| {
            if let RunEvent::Warning { message } = event
                && message.contains("(step \"")
                && !message.contains(&own)
            {
                return;
            }
            if let Ok(bytes) = serde_json::to_vec(event) {
                let _ = events.try_send(bytes);
            }
        });
        let ran = (self.runner)(scratch.path().to_path_buf(), options, cancel, observer).await;
        // The observer is gone with the run: the publisher ends once the queue is empty.
        let _ = tokio::time::timeout(Duration::from_secs(5), publisher).await;
        let outcome = ran?;
        let output =
            pack_writable(&fs, &task.writable).map_err(|e| NotSendable(format!("{e:#}")))?;
        let name = key_of("output", &task.id);
        self.bus.put(&name, output).await?;
        Ok((outcome, name))
    }
}

/// What a step that ran wrote cannot be sent back (a file past what a bundle carries): the
/// task fails at once, since another delivery would run the step again to the same end
/// (four runs of a step writing a 600 MiB file, each with its model calls).
#[derive(Debug)]
struct NotSendable(String);

impl std::fmt::Display for NotSendable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "what the step wrote cannot be sent back: {}", self.0)
    }
}

impl std::error::Error for NotSendable {}

/// The writable folders of a step, as a bundle.
fn pack_writable(fs: &WorkspaceFs, writable: &[String]) -> Result<Vec<u8>> {
    let mut bundle = Bundle::new();
    for folder in writable {
        bundle.add_folder(fs, folder)?;
    }
    Ok(bundle.encode())
}

/// The name a worker goes by when none is given: the host's name and the process id.
pub fn default_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "worker".into()
    } else {
        host
    };
    format!("{host}-{}", std::process::id())
}
