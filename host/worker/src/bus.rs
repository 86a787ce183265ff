//! What dispatchers and workers share on the NATS server: the connection's options, the
//! work-queue stream of step tasks, the key-value bucket of step states, the object store
//! of bundles, and the messages exchanged.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use async_nats::jetstream::{self, kv, object_store, stream};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The stream of step tasks: subjects `trellis.tasks.<pool>`, each message kept until a
/// worker acks it.
pub const STREAM: &str = "TRELLIS_TASKS";
/// The bucket of step states, by [`Task::key`].
pub const STATES: &str = "trellis_steps";
/// The object store of input and output bundles.
pub const ARTIFACTS: &str = "trellis_artifacts";
/// How long a delivered task stays leased without word from its worker.
pub const LEASE: Duration = Duration::from_secs(15);
/// How often a worker running a task renews its lease.
pub const HEARTBEAT: Duration = Duration::from_secs(3);
/// How often a task is delivered at most (a worker dying with it, a worker refusing it).
pub const DEFAULT_MAX_DELIVER: i64 = 4;
/// The window in which a task published twice is stored once.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(600);

/// How to reach the NATS server, and as whom.
#[derive(Debug, Clone, Default)]
pub struct NatsOptions {
    /// `nats://host:port` (`tls://` for TLS).
    pub url: String,
    /// A credentials file (JWT and NKey seed).
    pub creds: Option<PathBuf>,
    /// An NKey seed file.
    pub nkey: Option<PathBuf>,
    /// A token.
    pub token: Option<String>,
    /// A user and password.
    pub user: Option<(String, String)>,
    /// CA certificates to trust (PEM), which also requires TLS.
    pub tls_ca: Option<PathBuf>,
    /// Requires TLS.
    pub tls: bool,
}

impl NatsOptions {
    /// Connects, with the options' credentials and TLS. A server that refuses this side
    /// (its certificate not trusted, TLS not spoken, the credentials refused) is an error at
    /// once, naming why; a server not up yet is waited for (tasks wait in JetStream: a
    /// dispatcher or worker losing the server waits for it).
    pub async fn connect(&self) -> Result<async_nats::Client> {
        self.connect_buffering(None).await
    }

    /// [`Self::connect`], each subscription of the connection buffering at most `messages`
    /// (past it, the server's messages to it are dropped): for what anyone may publish.
    pub async fn connect_buffering(&self, messages: Option<usize>) -> Result<async_nats::Client> {
        check_url(&self.url)?;
        let options = |retry| async move {
            let options = self.options(retry).await?;
            Ok::<_, anyhow::Error>(match messages {
                Some(n) => options.subscription_capacity(n),
                None => options,
            })
        };
        let failed = || format!("connecting to the NATS server {}", self.url);
        match options(false).await?.connect(&self.url).await {
            Ok(client) => return Ok(client),
            Err(e) if may_come_up(&e) => {
                tracing::warn!("{}: {e}; trying again until it answers", failed());
            }
            Err(e) => return Err(anyhow::Error::new(e).context(failed())),
        }
        options(true)
            .await?
            .connect(&self.url)
            .await
            .with_context(failed)
    }

    /// The connection options; `retry` keeps trying to reach the server.
    async fn options(&self, retry: bool) -> Result<async_nats::ConnectOptions> {
        let mut options = async_nats::ConnectOptions::new()
            .name("trellis")
            .connection_timeout(Duration::from_secs(5));
        if retry {
            options = options.retry_on_initial_connect();
        }
        if let Some(path) = &self.creds {
            check_small_file(path, "--nats-creds")?;
            options = options
                .credentials_file(path)
                .await
                .with_context(|| format!("reading the credentials file {}", path.display()))?;
        }
        if let Some(path) = &self.nkey {
            check_small_file(path, "--nats-nkey")?;
            let seed = std::fs::read_to_string(path)
                .with_context(|| format!("reading the NKey seed file {}", path.display()))?;
            options = options.nkey(seed.trim().to_string());
        }
        if let Some(token) = &self.token {
            options = options.token(token.clone());
        }
        if let Some((user, password)) = &self.user {
            options = options.user_and_password(user.clone(), password.clone());
        }
        if let Some(ca) = &self.tls_ca {
            check_small_file(ca, "--nats-ca")?;
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        } else if self.tls {
            options = options.require_tls(true);
        }
        Ok(options)
    }
}

/// Refuses a server URL holding credentials (`nats://user:password@host`): they would be
/// shown wherever the URL is (messages, process lists). The URL is not repeated.
fn check_url(url: &str) -> Result<()> {
    let authority = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    if authority.contains('@') {
        anyhow::bail!(
            "the NATS server URL holds credentials (`user:password@`): give the user with \
             --nats-user and the password in TRELLIS_NATS_PASSWORD, or use --nats-creds, \
             --nats-nkey or --nats-token-env"
        );
    }
    Ok(())
}

/// The most a credentials, key or certificate file may be (they are a few KiB).
const MAX_KEY_FILE: u64 = 1 << 20;

/// Refuses `path` (given with `flag`) unless it is a regular file of 1 to [`MAX_KEY_FILE`]
/// bytes: it is read whole.
fn check_small_file(path: &std::path::Path, flag: &str) -> Result<()> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("{flag} {}: cannot read it", path.display()))?;
    if !meta.is_file() {
        anyhow::bail!("{flag} {}: not a regular file", path.display());
    }
    // A file of the kernel's (`/proc`, `/sys`) says 0 bytes, whatever reading it gives.
    if meta.len() == 0 {
        anyhow::bail!("{flag} {}: an empty file", path.display());
    }
    if meta.len() > MAX_KEY_FILE {
        anyhow::bail!(
            "{flag} {}: {} bytes, more than the {MAX_KEY_FILE} such a file may be",
            path.display(),
            meta.len()
        );
    }
    Ok(())
}

/// Whether a first connection that failed with `e` may be the server not being up yet
/// (worth waiting for), rather than a server that refuses this side: a TLS handshake that
/// fails (a certificate not trusted) surfaces as an I/O error of kind `InvalidData`, and is
/// not waited for.
fn may_come_up(e: &async_nats::ConnectError) -> bool {
    use async_nats::ConnectErrorKind as Kind;
    use std::io::ErrorKind as Io;
    match e.kind() {
        Kind::Dns | Kind::TimedOut => true,
        Kind::Io => {
            let mut source = std::error::Error::source(e);
            while let Some(inner) = source {
                if let Some(io) = inner.downcast_ref::<std::io::Error>() {
                    return matches!(
                        io.kind(),
                        Io::ConnectionRefused
                            | Io::ConnectionReset
                            | Io::ConnectionAborted
                            | Io::NotConnected
                            | Io::AddrNotAvailable
                            | Io::TimedOut
                            | Io::HostUnreachable
                            | Io::NetworkUnreachable
                    );
                }
                source = inner.source();
            }
            false
        }
        _ => false,
    }
}

/// The stream, buckets and store, made when missing.
#[derive(Clone)]
pub struct Bus {
    /// The connection.
    pub client: async_nats::Client,
    /// JetStream on it.
    pub js: jetstream::Context,
    /// The step states.
    pub states: kv::Store,
    /// The bundles.
    pub artifacts: std::sync::Arc<dyn crate::artifacts::ArtifactStore>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus").finish_non_exhaustive()
    }
}

impl Bus {
    /// Connects and makes (or finds) the stream, the bucket and the store.
    pub async fn open(options: &NatsOptions) -> Result<Bus> {
        let client = options.connect().await?;
        let js = jetstream::new(client.clone());
        js.get_or_create_stream(stream::Config {
            name: STREAM.to_string(),
            subjects: vec!["trellis.tasks.>".to_string()],
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: DUPLICATE_WINDOW,
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("making the JetStream stream {STREAM}: {e}"))?;
        let states = match js.get_key_value(STATES).await {
            Ok(kv) => kv,
            Err(_) => js
                .create_key_value(kv::Config {
                    bucket: STATES.to_string(),
                    history: 5,
                    ..Default::default()
                })
                .await
                .map_err(|e| anyhow::anyhow!("making the key-value bucket {STATES}: {e}"))?,
        };
        let artifacts = match js.get_object_store(ARTIFACTS).await {
            Ok(store) => store,
            Err(_) => js
                .create_object_store(object_store::Config {
                    bucket: ARTIFACTS.to_string(),
                    ..Default::default()
                })
                .await
                .map_err(|e| anyhow::anyhow!("making the object store {ARTIFACTS}: {e}"))?,
        };
        Ok(Bus {
            client,
            js,
            states,
            artifacts: std::sync::Arc::new(crate::artifacts::ObjectStoreArtifacts(artifacts)),
        })
    }

    /// Bundles kept in `store` instead of the NATS object store (a folder both sides
    /// reach: `--artifacts DIR`).
    pub fn with_artifacts(
        mut self,
        store: std::sync::Arc<dyn crate::artifacts::ArtifactStore>,
    ) -> Self {
        self.artifacts = store;
        self
    }

    /// Stores `bytes` as bundle `name`.
    pub async fn put(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        self.artifacts.put(name, bytes).await
    }

    /// The bytes of bundle `name`, at most `limit` ([`crate::artifacts::ArtifactStore::get`]).
    pub async fn get(&self, name: &str, limit: u64) -> Result<Vec<u8>> {
        self.artifacts.get(name, limit).await
    }
}

/// The subject of the events of task `id`: the only one a worker publishes them on.
pub fn events_subject(id: &str) -> String {
    format!("trellis.events.{}", key_of("step", id).replace('.', "-"))
}

/// The durable consumer of pool `pool`'s workers.
pub fn consumer_name(pool: &str) -> String {
    format!("pool-{pool}")
}

/// The subject of the tasks of pool `pool`.
pub fn task_subject(pool: &str) -> String {
    format!("trellis.tasks.{pool}")
}

/// One step of a run for a worker.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// `<workspace-id>/<run>/<step>/<attempt>`: the message id (a task published twice is
    /// stored once).
    pub id: String,
    /// The run folder under `runs/`.
    pub run_folder: String,
    /// The step.
    pub step_id: String,
    /// The group of the run unit.
    pub group: Option<String>,
    /// The `human_input` answers of the run.
    pub inputs: BTreeMap<String, String>,
    /// The object holding what the step may read.
    pub input: String,
    /// The folders the step may write, workspace-relative: what comes back.
    pub writable: Vec<String>,
    /// The key of the run's cancellation in the states bucket.
    pub cancel_key: String,
    /// The subject the step's events are published on as they happen.
    pub events: String,
    /// The third-party plugins the step names, `id@version`: a worker without one of them
    /// refuses the task.
    #[serde(default)]
    pub plugins: Vec<String>,
    /// How often the step already sent its run back to a prerequisite.
    #[serde(default)]
    pub prerequisite_returns: u32,
    /// High-priority context from the operator for the step's agent.
    #[serde(default)]
    pub context: Option<String>,
}

impl Task {
    /// The key of the task's state in the states bucket (a digest: keys take few
    /// characters, ids any).
    pub fn key(&self) -> String {
        key_of("task", &self.id)
    }
}

/// A bucket key or object name for `id` under `kind`.
pub fn key_of(kind: &str, id: &str) -> String {
    format!(
        "{kind}.{}",
        &hex::encode(Sha256::digest(id.as_bytes()))[..32]
    )
}

/// Where a task is: its entry in the states bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum State {
    /// Published, not yet taken.
    Queued,
    /// A worker runs it, its lease renewed until `lease_until` (Unix ms).
    Running {
        /// The worker.
        worker: String,
        /// When the lease ends unless renewed.
        lease_until: u64,
        /// Workers that tried it before.
        tried: Vec<String>,
    },
    /// A worker refused it (a plugin, a key approval it lacks): `why`.
    Refused {
        /// Workers that refused it, with why.
        tried: Vec<String>,
        /// The last refusal.
        why: String,
    },
    /// Committed: the step ran; its writable folders are object `output`.
    Done {
        /// The worker that ran it.
        worker: String,
        /// How the step ended.
        outcome: trellis_runner::dispatch::RemoteOutcome,
        /// The object of its writable folders.
        output: String,
    },
    /// It cannot be run: `why`.
    Failed {
        /// Why, naming the workers that tried.
        why: String,
    },
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
