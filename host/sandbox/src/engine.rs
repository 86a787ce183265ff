//! The one wasmtime [`Engine`](wasmtime::Engine) of a Trellis process.
//!
//! Every plugin call runs in a fresh `Store`, so instantiation has to be cheap:
//! the engine uses the pooling allocator with copy-on-write memory images, and
//! compiled components are cached on disk so a process start does not pay for
//! Cranelift again. Epoch interruption, driven by a ticker thread, gives every
//! call a deadline that even a guest spinning in a tight loop cannot escape.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::store::write_behind;

/// How often the epoch advances; a deadline is rounded up to a whole number of ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// The largest linear memory any instance may grow to, whatever its limits say.
/// Per-call limits ([`crate::capabilities::Limits`]) are enforced below this.
const MAX_MEMORY_CEILING: usize = 4 << 30;

/// Linear memories, tables and core instances one component may contain: a component
/// over these is refused when it is compiled. The memory limit of a call covers all of
/// an instance's memories and tables together ([`crate::capabilities::Limits`]).
pub const MAX_MEMORIES_PER_COMPONENT: u32 = 8;
/// See [`MAX_MEMORIES_PER_COMPONENT`].
pub const MAX_TABLES_PER_COMPONENT: u32 = 32;
/// See [`MAX_MEMORIES_PER_COMPONENT`].
pub const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 64;

/// How much of each pooled linear memory and table may stay mapped between two instances
/// of a slot when the kernel can tell which pages an instance wrote (`PAGEMAP_SCAN`).
pub const KEEP_RESIDENT_BYTES: usize = 16 << 20;

/// Guest stack: deep recursion traps cleanly long before the host stack is at risk.
const MAX_WASM_STACK: usize = 1 << 20;

/// Where compiled components are cached, and whether to cache at all.
#[derive(Debug, Clone)]
pub enum CacheSetting {
    /// Cache in this folder (created on demand).
    Dir(PathBuf),
    /// Compile every component on load.
    Disabled,
}

impl CacheSetting {
    /// `$TRELLIS_CACHE_DIR` if set, else the user's cache folder (`~/.cache/trellis/components`
    /// on Linux), else no cache.
    pub fn from_env() -> Self {
        if let Some(dir) = std::env::var_os("TRELLIS_CACHE_DIR") {
            return CacheSetting::Dir(PathBuf::from(dir));
        }
        match directories::ProjectDirs::from("", "", "trellis") {
            Some(dirs) => CacheSetting::Dir(dirs.cache_dir().join("components")),
            None => CacheSetting::Disabled,
        }
    }
}

/// The engine shared by every plugin: cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    wasmtime: wasmtime::Engine,
    cache: Option<ComponentCache>,
    ticker: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// The writer of the logs written behind the agent loop: what is queued is on disk once
    /// the last engine of the process is dropped.
    _writer: Arc<write_behind::Writer>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("cache", &self.inner.cache.as_ref().map(|c| &c.dir))
            .finish_non_exhaustive()
    }
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(ticker) = self.ticker.take() {
            let _ = ticker.join();
        }
    }
}

impl Engine {
    /// Builds the engine and starts its epoch ticker, and the writer of
    /// [`write_behind`](crate::store::write_behind) if no other engine holds it.
    pub fn new(cache: CacheSetting) -> Result<Self> {
        let wasmtime = wasmtime::Engine::new(&config())
            .map_err(anyhow::Error::from)
            .context("configuring wasmtime")?;
        let cache = match cache {
            CacheSetting::Dir(dir) => Some(ComponentCache::new(dir, &wasmtime)),
            CacheSetting::Disabled => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = {
            // The thread holds only a weak handle in spirit: it exits as soon as
            // `stop` is set by the last `Engine` clone going away.
            let engine = wasmtime.weak();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("trellis-epoch".into())
                .spawn(move || {
                    // The epochs follow the clock, not the ticker's wake-ups: on a busy
                    // machine a sleep of one tick can take many, and a guest's deadline
                    // counted in wake-ups would run that much past its time.
                    let started = std::time::Instant::now();
                    let mut given = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        let Some(engine) = engine.upgrade() else {
                            break;
                        };
                        let due = ticks_due(started.elapsed());
                        while given < due {
                            engine.increment_epoch();
                            given += 1;
                        }
                    }
                })
                .context("starting the epoch ticker thread")?
        };
        Ok(Engine {
            inner: Arc::new(EngineInner {
                wasmtime,
                cache,
                ticker: Some(ticker),
                stop,
                _writer: write_behind::Writer::start().context("starting the writer thread")?,
            }),
        })
    }

    /// The wasmtime engine, for linkers and stores.
    pub fn wasmtime(&self) -> &wasmtime::Engine {
        &self.inner.wasmtime
    }

    /// Compiles `bytes` into a component, through the on-disk cache when there is one,
    /// and caches it: for components the caller trusts (bundled ones).
    ///
    /// `origin` names the component in errors (a file path or `bundled:<id>`).
    pub fn load_component(&self, bytes: &[u8], origin: &str) -> Result<Component> {
        let loaded = self.open_component(bytes, origin, None)?;
        self.keep(&loaded);
        Ok(loaded.component)
    }

    /// Compiles `bytes` (or reads them compiled from the cache) without writing the
    /// cache: call [`Engine::keep`] once the component passed the caller's checks, so
    /// a rejected component never lands in the cache. A compile that would take longer
    /// than `compile_deadline` fails.
    pub fn open_component(
        &self,
        bytes: &[u8],
        origin: &str,
        compile_deadline: Option<Duration>,
    ) -> Result<LoadedComponent> {
        self.open_keyed(bytes, origin, |engine| {
            compile(engine, bytes, origin, compile_deadline)
        })
    }

    /// [`Engine::load_component`] for a zstd-compressed component the caller trusts (the
    /// bundled Python runner): the cache is keyed by the compressed bytes, so a process
    /// that finds the component compiled in the cache never decompresses it.
    pub fn load_compressed_component(&self, zstd: &[u8], origin: &str) -> Result<Component> {
        let loaded = self.open_keyed(zstd, origin, |engine| {
            let bytes = decompress(zstd)
                .with_context(|| format!("{origin}: decompressing the component"))?;
            compile(engine, &bytes, origin, None)
        })?;
        self.keep(&loaded);
        Ok(loaded.component)
    }

    /// The cache entry keyed by `key` (a component's bytes, or their compressed form), or
    /// `compile`'s component and the entry to write for it.
    fn open_keyed(
        &self,
        key: &[u8],
        origin: &str,
        compile: impl FnOnce(&wasmtime::Engine) -> Result<Component>,
    ) -> Result<LoadedComponent> {
        let engine = &self.inner.wasmtime;
        let unsaved = match &self.inner.cache {
            Some(cache) => match cache.lookup(engine, key, origin) {
                Lookup::Hit(component) => {
                    return Ok(LoadedComponent {
                        component,
                        unsaved: None,
                    });
                }
                Lookup::Miss(path) => Some(path),
                Lookup::Refused => None,
            },
            None => None,
        };
        let component = compile(engine)?;
        Ok(LoadedComponent { component, unsaved })
    }

    /// Writes the cache entry of a freshly compiled component; a no-op for one read
    /// from the cache or when caching is off or refused.
    pub fn keep(&self, loaded: &LoadedComponent) {
        let (Some(cache), Some(path)) = (&self.inner.cache, &loaded.unsaved) else {
            return;
        };
        if let Err(err) = cache.store(path, &loaded.component) {
            // A read-only or full disk only costs the next start a compile.
            tracing::warn!(cache_file = %path.display(), "not caching a component: {err:#}");
        }
    }

    /// Number of epoch ticks that covers `timeout` (at least one).
    ///
    /// The ticker gives one a tick of the clock ([`ticks_due`]), however late it wakes.
    pub fn ticks_for(timeout: Duration) -> u64 {
        let tick = EPOCH_TICK.as_micros().max(1);
        (timeout.as_micros().div_ceil(tick) as u64).max(1)
    }
}

/// The epoch ticks due `elapsed` after the ticker started: one a [`EPOCH_TICK`] of the clock.
fn ticks_due(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros() / EPOCH_TICK.as_micros().max(1)).unwrap_or(u64::MAX)
}

fn config() -> Config {
    let mut pooling = PoolingAllocationConfig::default();
    pooling
        .total_component_instances(256)
        .total_core_instances(1024)
        .total_memories(256)
        .total_tables(1024)
        .total_stacks(256)
        .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
        .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
        .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
        .max_memory_size(MAX_MEMORY_CEILING)
        .max_component_instance_size(1 << 20)
        .max_core_instance_size(1 << 20)
        .table_elements(100_000);
    if PoolingAllocationConfig::is_pagemap_scan_available() {
        // A fresh instance per call: without this, every page a call touches is given back
        // to the kernel when its store drops, and the next call in the slot faults it in
        // again. With PAGEMAP_SCAN (Linux 6.7+) the pool finds the pages a call wrote and
        // copies them back from the image (or zeroes them), leaving them mapped: only the
        // pages a call dirtied cost anything, and nothing faults on the next call. Without
        // the ioctl, keeping memory resident would mean a `memset` of the whole region on
        // every release, so it stays off.
        pooling
            .pagemap_scan(wasmtime::Enabled::Yes)
            .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
            .table_keep_resident(KEEP_RESIDENT_BYTES);
    }

    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .max_wasm_stack(MAX_WASM_STACK)
        // Host calls made from a guest run on the fiber stack: leave ample room above
        // the guest's own stack so a deep guest never overflows host code.
        .async_stack_size(MAX_WASM_STACK + (2 << 20))
        .memory_init_cow(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
    config
}

/// The content of a zstd frame.
fn decompress(zstd: &[u8]) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut decoder = ruzstd::decoding::StreamingDecoder::new(zstd)?;
    let mut bytes = Vec::new();
    decoder.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Compiles `bytes`, giving up after `deadline` when there is one.
///
/// Cranelift cannot be interrupted: past the deadline the compile thread is abandoned
/// (it finishes in the background and its result is dropped) and the caller gets an
/// error at once. The component file size cap bounds how long such a thread runs.
fn compile(
    engine: &wasmtime::Engine,
    bytes: &[u8],
    origin: &str,
    deadline: Option<Duration>,
) -> Result<Component> {
    let invalid = |err: wasmtime::Error| {
        let err = anyhow::Error::from(err);
        // A component over one of the engine's per-component limits is valid, just refused.
        let what = if format!("{err:#}").contains("exceeds the configured maximum") {
            "over a limit of this host"
        } else {
            "not a valid WebAssembly component"
        };
        err.context(format!("{origin}: {what}"))
    };
    let Some(deadline) = deadline else {
        return Component::new(engine, bytes).map_err(invalid);
    };
    let (send, receive) = std::sync::mpsc::channel();
    let (thread_engine, thread_bytes) = (engine.clone(), bytes.to_vec());
    std::thread::Builder::new()
        .name("trellis-compile".into())
        .spawn(move || {
            let _ = send.send(Component::new(&thread_engine, &thread_bytes));
        })
        .context("starting a compile thread")?;
    match receive.recv_timeout(deadline) {
        Ok(result) => result.map_err(invalid),
        Err(_) => anyhow::bail!(
            "{origin}: compiling took longer than the limit of {} s; gave up (the \
             component is too large or too complex to load)",
            deadline.as_secs_f64()
        ),
    }
}

/// A compiled component, and the cache entry to write once the caller accepts it.
pub struct LoadedComponent {
    component: Component,
    unsaved: Option<PathBuf>,
}

impl std::fmt::Debug for LoadedComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedComponent")
            .field("unsaved", &self.unsaved)
            .finish_non_exhaustive()
    }
}

impl LoadedComponent {
    /// The component.
    pub fn component(&self) -> &Component {
        &self.component
    }
}

/// The default cap on the total size of the cache folder's entries.
pub const DEFAULT_CACHE_BYTES: u64 = 1 << 30;

/// File name of the cache's MAC key, inside the cache folder.
const KEY_FILE: &str = "key";

/// Compiled components on disk, one file per (component content, engine configuration).
///
/// Deserializing an entry runs its machine code, so an entry is used only when this
/// user alone could have written it:
/// - the folder is created `0700` and must be owned by this user and not writable by
///   group or others; the entries (`0600`) likewise; anything else is refused with a
///   warning and the component is compiled in memory, the cache left untouched;
/// - an entry starts with HMAC-SHA256 (key: 32 random bytes in `key`, `0600`, created
///   once with `O_EXCL`) over the engine key, the entry name and the payload; one
///   whose MAC does not match is compiled again and replaced.
///
/// Entries are written only after the caller accepted the component ([`Engine::keep`]),
/// and the folder is kept under [`DEFAULT_CACHE_BYTES`] by removing the least recently
/// used entries (by modification time, which a hit refreshes) after each write.
struct ComponentCache {
    dir: PathBuf,
    engine_key: String,
    max_bytes: u64,
    /// A refused folder or key is reported once per engine, not once per component.
    refusal_reported: AtomicBool,
}

/// What the cache has for a component.
enum Lookup {
    Hit(Component),
    /// No usable entry: compile, and write the entry at this path once accepted.
    Miss(PathBuf),
    /// The cache may not be used: compile in memory, write nothing.
    Refused,
}

impl ComponentCache {
    fn new(dir: PathBuf, engine: &wasmtime::Engine) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = format!("{}-{:016x}", env!("CARGO_PKG_VERSION"), hasher.finish());
        ComponentCache {
            dir,
            engine_key,
            max_bytes: DEFAULT_CACHE_BYTES,
            refusal_reported: AtomicBool::new(false),
        }
    }

    fn path_for(&self, bytes: &[u8]) -> PathBuf {
        let mut digest = Sha256::new();
        digest.update(self.engine_key.as_bytes());
        digest.update([0]);
        digest.update(bytes);
        self.dir
            .join(format!("{}.cwasm", hex::encode(digest.finalize())))
    }

    fn lookup(&self, engine: &wasmtime::Engine, bytes: &[u8], origin: &str) -> Lookup {
        let key = match self.open() {
            Ok(key) => key,
            Err(refusal) => {
                if !self.refusal_reported.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "{refusal:#}; compiling components in memory, the cache left untouched"
                    );
                } else {
                    tracing::debug!("{refusal:#}; compiling {origin} in memory");
                }
                return Lookup::Refused;
            }
        };
        let path = self.path_for(bytes);
        match self.read_entry(engine, &key, &path) {
            Ok(Some(component)) => Lookup::Hit(component),
            Ok(None) => Lookup::Miss(path),
            Err(EntryError::Refused(refusal)) => {
                tracing::warn!("{refusal}; compiling {origin} in memory");
                Lookup::Refused
            }
            Err(EntryError::Unusable(err)) => {
                tracing::warn!(
                    cache_file = %path.display(),
                    "rebuilding compiled component for {origin}: {err:#}"
                );
                Lookup::Miss(path)
            }
        }
    }

    /// Creates the folder (`0700`) and the key when missing, and checks both are this
    /// user's alone; returns the key.
    fn open(&self) -> Result<[u8; 32]> {
        use std::os::unix::fs::DirBuilderExt;
        if let Some(parent) = self.dir.parent() {
            fs::create_dir_all(parent)
                .with_context(|| format!("component cache: creating {}", parent.display()))?;
        }
        match fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(err) => {
                return Err(err)
                    .with_context(|| format!("component cache: creating {}", self.dir.display()));
            }
        }
        let meta = fs::metadata(&self.dir)
            .with_context(|| format!("component cache: reading {}", self.dir.display()))?;
        if let Some(refusal) = not_owner_only(&meta, "folder", &self.dir) {
            anyhow::bail!("{refusal}");
        }
        self.read_or_create_key()
    }

    fn read_or_create_key(&self) -> Result<[u8; 32]> {
        let path = self.dir.join(KEY_FILE);
        if !path.exists() {
            let mut key = [0u8; 32];
            fs::File::open("/dev/urandom")
                .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut key))
                .context("component cache: reading /dev/urandom for the key")?;
            // Written whole to a 0600 temporary file, then linked in place only if no
            // key exists yet: a concurrent process's key wins and both use it.
            let mut file = tempfile::NamedTempFile::new_in(&self.dir)?;
            file.write_all(&key)?;
            file.as_file().sync_all()?;
            if let Err(err) = file.persist_noclobber(&path)
                && err.error.kind() != std::io::ErrorKind::AlreadyExists
            {
                return Err(err.error)
                    .with_context(|| format!("component cache: creating {}", path.display()));
            }
        }
        let (file, meta) = open_no_follow(&path)
            .with_context(|| format!("component cache: reading {}", path.display()))?;
        if !meta.is_file() {
            anyhow::bail!(
                "component cache: refusing key file {}: it is not a regular file",
                path.display()
            );
        }
        if let Some(refusal) = not_owner_only(&meta, "key file", &path) {
            anyhow::bail!("{refusal}");
        }
        let mut key = [0u8; 32];
        let mut file = file;
        if meta.len() != 32 || std::io::Read::read_exact(&mut file, &mut key).is_err() {
            anyhow::bail!(
                "component cache: refusing key file {}: it is not 32 bytes long",
                path.display()
            );
        }
        Ok(key)
    }

    fn mac(&self, key: &[u8; 32], path: &Path, payload: &[u8]) -> [u8; 32] {
        let name = path
            .file_name()
            .map(|n| n.as_encoded_bytes())
            .unwrap_or(b"");
        hmac_sha256(
            key,
            &[self.engine_key.as_bytes(), &[0], name, &[0], payload],
        )
    }

    /// Reads an entry: `Ok(None)` when there is none.
    fn read_entry(
        &self,
        engine: &wasmtime::Engine,
        key: &[u8; 32],
        path: &Path,
    ) -> Result<Option<Component>, EntryError> {
        let (mut file, meta) = match open_no_follow(path) {
            Ok(opened) => opened,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(EntryError::Unusable(err.into())),
        };
        if !meta.is_file() {
            return Err(EntryError::Refused(format!(
                "component cache: refusing entry {}: it is not a regular file",
                path.display()
            )));
        }
        if let Some(refusal) = not_owner_only(&meta, "entry", path) {
            return Err(EntryError::Refused(refusal));
        }
        if meta.len() > self.max_bytes {
            return Err(EntryError::Unusable(anyhow::anyhow!(
                "cache file is {} bytes, over the cache's {} bytes",
                meta.len(),
                self.max_bytes
            )));
        }
        let mut data = Vec::with_capacity(meta.len() as usize);
        std::io::Read::read_to_end(
            &mut std::io::Read::take(&mut file, self.max_bytes + 1),
            &mut data,
        )
        .map_err(|e| EntryError::Unusable(e.into()))?;
        let Some((mac, payload)) = data.split_at_checked(32) else {
            return Err(EntryError::Unusable(anyhow::anyhow!(
                "cache file is truncated"
            )));
        };
        if !constant_time_eq(&self.mac(key, path, payload), mac) {
            return Err(EntryError::Unusable(anyhow::anyhow!(
                "cache file is corrupt or not written by this user (MAC mismatch)"
            )));
        }
        // SAFETY: the MAC proves that this user's process wrote exactly this payload
        // from `Component::serialize` for this engine configuration and this entry
        // name (only this user can read the key), and wasmtime still checks its header.
        let component = unsafe { Component::deserialize(engine, payload) }
            .map_err(|e| EntryError::Unusable(e.into()))?;
        // A hit counts as a use for eviction.
        let _ = file.set_modified(std::time::SystemTime::now());
        Ok(Some(component))
    }

    fn store(&self, path: &Path, component: &Component) -> Result<()> {
        let key = self.open()?;
        let payload = component.serialize()?;
        // `NamedTempFile` creates the file 0600.
        let mut file = tempfile::NamedTempFile::new_in(&self.dir)?;
        file.write_all(&self.mac(&key, path, &payload))?;
        file.write_all(&payload)?;
        file.as_file().sync_all()?;
        file.persist(path)?;
        self.evict(path);
        Ok(())
    }

    /// Removes the least recently used entries until the cache fits in `max_bytes`,
    /// never `keep`, the entry just written.
    fn evict(&self, keep: &Path) {
        let Ok(read) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = read
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if path != keep && fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

enum EntryError {
    /// Someone else could have written it: never read, never replaced.
    Refused(String),
    /// Ours but not usable (truncated, bad MAC, stale): compiled again and replaced.
    Unusable(anyhow::Error),
}

/// Opens `path` without following a symlink and without blocking (a FIFO opens at once; its
/// type is for the caller to refuse), with its metadata.
fn open_no_follow(path: &Path) -> std::io::Result<(fs::File, fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    Ok((file, meta))
}

/// Why `meta` is not "owned by this user and writable by nobody else", if it is not.
fn not_owner_only(meta: &fs::Metadata, what: &str, path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let mode = meta.mode() & 0o777;
    let problem = if let Err(problem) = crate::store::check_owner_only(meta) {
        format!("it is {problem}")
    } else if what != "folder" && mode & 0o077 != 0 {
        format!("it is readable by group or others (mode {mode:o})")
    } else {
        return None;
    };
    Some(format!(
        "component cache: refusing {what} {}: {problem}",
        path.display()
    ))
}

fn hmac_sha256(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    for part in parts {
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    let mut mac = [0u8; 32];
    mac.copy_from_slice(&outer.finalize());
    mac
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    use super::*;

    #[test]
    fn the_ticks_due_follow_the_clock_however_late_the_ticker_wakes() {
        // A ticker that slept 30 s in one wake-up (a starved thread) gives the 6,000 ticks
        // of those 30 s at once: a 30 s deadline is past, not 5 ms further away.
        assert_eq!(ticks_due(Duration::from_secs(30)), 6_000);
        assert_eq!(
            ticks_due(Duration::from_secs(30)),
            Engine::ticks_for(Duration::from_secs(30))
        );
        assert_eq!(ticks_due(Duration::from_millis(4)), 0);
        assert_eq!(ticks_due(Duration::MAX), u64::MAX);
    }

    fn cached_engine(dir: &Path) -> Engine {
        Engine::new(CacheSetting::Dir(dir.to_path_buf())).unwrap()
    }

    fn cache(engine: &Engine) -> &ComponentCache {
        engine.inner.cache.as_ref().unwrap()
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().mode() & 0o777
    }

    fn is_hit(engine: &Engine, bytes: &[u8]) -> bool {
        matches!(
            cache(engine).lookup(engine.wasmtime(), bytes, "test"),
            Lookup::Hit(_)
        )
    }

    fn entries(dir: &Path) -> Vec<PathBuf> {
        let mut found: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
            .collect();
        found.sort();
        found
    }

    #[test]
    fn the_folder_key_and_entries_are_owner_only() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("components");
        let engine = cached_engine(&dir);
        engine.load_component(&wat_component(), "test").unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(KEY_FILE)), 0o600);
        assert_eq!(fs::metadata(dir.join(KEY_FILE)).unwrap().len(), 32);
        let path = cache(&engine).path_for(&wat_component());
        assert_eq!(mode(&path), 0o600);
        assert!(is_hit(&engine, &wat_component()));
    }

    #[test]
    fn corrupt_cache_entries_are_rebuilt_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let engine = cached_engine(dir.path());
        let bytes = wat_component();
        engine.load_component(&bytes, "test").unwrap();
        let path = cache(&engine).path_for(&bytes);
        let good = fs::read(&path).unwrap();

        // Flip one payload byte: the MAC no longer matches.
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        fs::write(&path, &bad).unwrap();
        assert!(!is_hit(&engine, &bytes));
        engine.load_component(&bytes, "test").unwrap();
        assert!(
            fs::read(&path).unwrap() == good,
            "entry not rewritten from a fresh compile"
        );

        // A truncated file is rejected as well.
        fs::write(&path, &good[..10]).unwrap();
        assert!(!is_hit(&engine, &bytes));
        engine.load_component(&bytes, "test").unwrap();
        assert!(fs::read(&path).unwrap() == good);
    }

    /// The attack of the issue: someone who can write the folder puts another
    /// component's compiled code under the victim's entry name, with a checksum that
    /// matches (the old format: SHA-256 of the payload). Without the key it cannot
    /// produce the MAC, so the entry is never deserialized.
    #[test]
    fn an_entry_without_this_users_mac_is_never_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let engine = cached_engine(dir.path());
        let victim = wat_component();
        let attacker = with_custom_section(&victim, "attacker");
        let payload = engine
            .load_component(&attacker, "attacker")
            .unwrap()
            .serialize()
            .unwrap();
        let path = cache(&engine).path_for(&victim);
        let mut forged = Sha256::digest(&payload).to_vec();
        forged.extend_from_slice(&payload);
        fs::write(&path, &forged).unwrap();
        // Owner-only, as if the checks on the owner and mode had been passed.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();

        assert!(!is_hit(&engine, &victim), "the forged entry was used");
        engine.load_component(&victim, "victim").unwrap();
        assert!(
            fs::read(&path).unwrap() != forged,
            "not replaced by a fresh compile"
        );
        assert!(is_hit(&engine, &victim));
    }

    #[test]
    fn a_folder_others_can_write_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let engine = cached_engine(dir.path());
        let bytes = wat_component();
        engine.load_component(&bytes, "test").unwrap();
        let path = cache(&engine).path_for(&bytes);
        let entry = fs::read(&path).unwrap();
        for bad_mode in [0o777, 0o770, 0o702] {
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(bad_mode)).unwrap();
            let refusal = format!("{:#}", cache(&engine).open().unwrap_err());
            assert_eq!(
                refusal,
                format!(
                    "component cache: refusing folder {}: it is writable by group or others (mode {bad_mode:o})",
                    dir.path().display()
                )
            );
            assert!(!is_hit(&engine, &bytes), "mode {bad_mode:o}: entry used");
            // The component still loads, compiled in memory, and nothing is written.
            let other = with_custom_section(&bytes, "other");
            engine.load_component(&other, "test").unwrap();
            engine.load_component(&bytes, "test").unwrap();
            assert_eq!(entries(dir.path()), std::slice::from_ref(&path));
            assert!(fs::read(&path).unwrap() == entry);
        }
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        assert!(is_hit(&engine, &bytes));
    }

    #[test]
    fn an_entry_others_could_write_is_refused_even_with_a_valid_mac() {
        let dir = tempfile::tempdir().unwrap();
        let engine = cached_engine(dir.path());
        let bytes = wat_component();
        engine.load_component(&bytes, "test").unwrap();
        let path = cache(&engine).path_for(&bytes);
        let entry = fs::read(&path).unwrap();
        let key = cache(&engine).open().unwrap();

        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        let Err(EntryError::Refused(refusal)) =
            cache(&engine).read_entry(engine.wasmtime(), &key, &path)
        else {
            panic!("a world-writable entry was not refused");
        };
        assert_eq!(
            refusal,
            format!(
                "component cache: refusing entry {}: it is writable by group or others (mode 666)",
                path.display()
            )
        );
        engine.load_component(&bytes, "test").unwrap();
        assert!(
            fs::read(&path).unwrap() == entry,
            "a refused entry was replaced"
        );
        assert_eq!(mode(&path), 0o666);

        // Another user's entry (root can give one away; a skip for other users).
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        if std::os::unix::fs::chown(&path, Some(65534), Some(65534)).is_err() {
            crate::test_skip::skip("not root: no entry of another user can be made");
            return;
        }
        let Err(EntryError::Refused(refusal)) =
            cache(&engine).read_entry(engine.wasmtime(), &key, &path)
        else {
            panic!("another user's entry was not refused");
        };
        // SAFETY: no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(
            refusal,
            format!(
                "component cache: refusing entry {}: it is owned by uid 65534, not by this user (uid {me})",
                path.display()
            )
        );
        assert!(!is_hit(&engine, &bytes));
        engine.load_component(&bytes, "test").unwrap();
        assert!(fs::read(&path).unwrap() == entry);
        assert_eq!(fs::metadata(&path).unwrap().uid(), 65534);
    }

    #[test]
    fn a_folder_or_key_of_another_user_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let engine = cached_engine(dir.path());
        engine.load_component(&wat_component(), "test").unwrap();
        let key = dir.path().join(KEY_FILE);
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            format!("{:#}", cache(&engine).open().unwrap_err()),
            format!(
                "component cache: refusing key file {}: it is readable by group or others (mode 644)",
                key.display()
            )
        );
        assert!(!is_hit(&engine, &wat_component()));
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(is_hit(&engine, &wat_component()));

        if std::os::unix::fs::chown(dir.path(), Some(65534), None).is_err() {
            crate::test_skip::skip("not root: no folder of another user can be made");
            return;
        }
        let refusal = format!("{:#}", cache(&engine).open().unwrap_err());
        assert!(
            refusal.starts_with(&format!(
                "component cache: refusing folder {}: it is owned by uid 65534, not by this user",
                dir.path().display()
            )),
            "{refusal}"
        );
        assert!(!is_hit(&engine, &wat_component()));
        engine.load_component(&wat_component(), "test").unwrap();
    }

    #[test]
    fn rejected_components_are_not_cached() {
        let dir = tempfile::tempdir().unwrap();
        let engine = cached_engine(dir.path());
        let bytes = wat_component();
        let loaded = engine.open_component(&bytes, "test", None).unwrap();
        assert!(
            entries(dir.path()).is_empty(),
            "written before it was accepted"
        );
        engine.keep(&loaded);
        assert_eq!(entries(dir.path()).len(), 1);
    }

    #[test]
    fn the_least_recently_used_entries_are_evicted_over_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::new(CacheSetting::Disabled).unwrap();
        let mut cache = ComponentCache::new(dir.path().to_path_buf(), engine.wasmtime());
        let components: Vec<Vec<u8>> = ["a", "b", "c"]
            .iter()
            .map(|name| with_custom_section(&wat_component(), name))
            .collect();
        let store = |cache: &ComponentCache, bytes: &[u8]| {
            let component = engine.load_component(bytes, "test").unwrap();
            cache.store(&cache.path_for(bytes), &component).unwrap();
        };
        store(&cache, &components[0]);
        let size = fs::metadata(cache.path_for(&components[0])).unwrap().len();
        cache.max_bytes = size * 2;
        store(&cache, &components[1]);
        // `a` is used again, so `b` is now the least recently used.
        let past = std::time::SystemTime::now() - Duration::from_secs(100);
        fs::File::options()
            .write(true)
            .open(cache.path_for(&components[1]))
            .unwrap()
            .set_modified(past)
            .unwrap();
        store(&cache, &components[2]);
        let left: Vec<_> = entries(dir.path());
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(!cache.path_for(&components[1]).exists());
        assert!(cache.path_for(&components[0]).exists());
        assert!(cache.path_for(&components[2]).exists());
    }

    #[test]
    fn hmac_matches_a_reference_value() {
        // HMAC-SHA256 of "" under a 32-byte zero key, computed independently.
        let mac = hmac_sha256(&[0; 32], &[b""]);
        assert_eq!(
            hex::encode(mac),
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad"
        );
    }

    #[test]
    fn entries_are_keyed_by_content() {
        let dir = tempfile::tempdir().unwrap();
        let engine = cached_engine(dir.path());
        let cache = cache(&engine);
        assert_ne!(cache.path_for(b"a"), cache.path_for(b"b"));
        assert_eq!(cache.path_for(b"a"), cache.path_for(b"a"));
    }

    #[test]
    fn a_compressed_component_is_cached_under_its_compressed_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let engine = cached_engine(dir.path());
        let packed = ruzstd::encoding::compress_to_vec(
            &with_custom_section(&wat_component(), "z")[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        engine.load_compressed_component(&packed, "test").unwrap();
        assert!(is_hit(&engine, &packed));
        assert_eq!(entries(dir.path()), [cache(&engine).path_for(&packed)]);
        // A hit compiles nothing: the entry's modification time is refreshed, no entry added.
        engine.load_compressed_component(&packed, "test").unwrap();
        assert_eq!(entries(dir.path()).len(), 1);
    }

    #[test]
    fn a_corrupt_compressed_component_names_its_origin() {
        let engine = Engine::new(CacheSetting::Disabled).unwrap();
        let err = engine
            .load_compressed_component(b"not zstd", "bundled:x")
            .unwrap_err();
        assert!(format!("{err:#}").contains("bundled:x: decompressing the component"));
        let packed = ruzstd::encoding::compress_to_vec(
            &b"not wasm"[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        let err = engine
            .load_compressed_component(&packed, "bundled:x")
            .unwrap_err();
        assert!(format!("{err:#}").contains("bundled:x: not a valid WebAssembly component"));
    }

    #[test]
    fn invalid_bytes_name_their_origin() {
        let engine = Engine::new(CacheSetting::Disabled).unwrap();
        let err = engine
            .load_component(b"not wasm", "plugins/x/x.wasm")
            .unwrap_err();
        assert!(format!("{err:#}").contains("plugins/x/x.wasm: not a valid WebAssembly component"));
        let err = engine
            .open_component(
                b"not wasm",
                "plugins/x/x.wasm",
                Some(Duration::from_secs(60)),
            )
            .unwrap_err();
        assert!(format!("{err:#}").contains("plugins/x/x.wasm: not a valid WebAssembly component"));
    }

    #[test]
    fn a_compile_past_its_deadline_gives_up() {
        let engine = Engine::new(CacheSetting::Disabled).unwrap();
        // A real plugin (the bundled workspace tools, ~1 MB) takes far longer than
        // no time at all to compile.
        let bytes = crate::bundled::PLUGINS[0].component;
        let err = engine
            .open_component(bytes, "big.wasm", Some(Duration::ZERO))
            .unwrap_err();
        assert_eq!(
            format!("{err:#}"),
            "big.wasm: compiling took longer than the limit of 0 s; gave up (the component is too large or too complex to load)"
        );
    }

    /// The binary encoding of `(component)`: the preamble of a component, nothing else.
    fn wat_component() -> Vec<u8> {
        vec![0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00]
    }

    /// `bytes` with a custom section named `name` appended: another valid component.
    fn with_custom_section(bytes: &[u8], name: &str) -> Vec<u8> {
        let mut out = bytes.to_vec();
        out.push(0);
        out.push(u8::try_from(name.len() + 1).unwrap());
        out.push(u8::try_from(name.len()).unwrap());
        out.extend_from_slice(name.as_bytes());
        out
    }

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    /// Runs `f` on a thread; `None` when it is still blocked after 10 s.
    fn within_10s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10)).ok()
    }

    #[test]
    fn a_fifo_entry_or_key_never_blocks_the_cache() {
        // An owner-only FIFO passes the owner and mode checks; opening it to read blocked
        // until a writer came, so a FIFO at an entry or the key hung every `trellis` start.
        let dir = tempfile::tempdir().unwrap();
        let engine = cached_engine(dir.path());
        let bytes = wat_component();
        cache(&engine).open().unwrap();
        let path = cache(&engine).path_for(&bytes);
        mkfifo(&path);
        let (e, b) = (engine.clone(), bytes.clone());
        let refused = within_10s(move || {
            matches!(cache(&e).lookup(e.wasmtime(), &b, "test"), Lookup::Refused)
        })
        .expect("a FIFO cache entry blocked the lookup");
        assert!(refused, "a FIFO entry was not refused");
        assert!(fs::symlink_metadata(&path).unwrap().file_type().is_fifo());

        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        mkfifo(&dir.path().join(KEY_FILE));
        let engine = cached_engine(dir.path());
        let e = engine.clone();
        let refusal = within_10s(move || format!("{:#}", cache(&e).open().unwrap_err()))
            .expect("a FIFO key file blocked the cache");
        assert_eq!(
            refusal,
            format!(
                "component cache: refusing key file {}: it is not a regular file",
                dir.path().join(KEY_FILE).display()
            )
        );
    }
}
