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

/// How often the epoch advances; a deadline is rounded up to a whole number of ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// The largest linear memory any instance may grow to, whatever its limits say.
/// Per-call limits ([`crate::capabilities::Limits`]) are enforced below this.
const MAX_MEMORY_CEILING: usize = 4 << 30;

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
    /// Builds the engine and starts its epoch ticker.
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
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        match engine.upgrade() {
                            Some(engine) => engine.increment_epoch(),
                            None => break,
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
            }),
        })
    }

    /// The wasmtime engine, for linkers and stores.
    pub fn wasmtime(&self) -> &wasmtime::Engine {
        &self.inner.wasmtime
    }

    /// Compiles `bytes` into a component, through the on-disk cache when there is one.
    ///
    /// `origin` names the component in errors (a file path or `bundled:<id>`).
    pub fn load_component(&self, bytes: &[u8], origin: &str) -> Result<Component> {
        match &self.inner.cache {
            Some(cache) => cache.load(&self.inner.wasmtime, bytes, origin),
            None => compile(&self.inner.wasmtime, bytes, origin),
        }
    }

    /// Number of epoch ticks that covers `timeout` (at least one).
    pub fn ticks_for(timeout: Duration) -> u64 {
        let tick = EPOCH_TICK.as_micros().max(1);
        (timeout.as_micros().div_ceil(tick) as u64).max(1)
    }
}

fn config() -> Config {
    let mut pooling = PoolingAllocationConfig::default();
    pooling
        .total_component_instances(256)
        .total_core_instances(1024)
        .total_memories(256)
        .total_tables(1024)
        .total_stacks(256)
        .max_memory_size(MAX_MEMORY_CEILING)
        .max_component_instance_size(1 << 20)
        .max_core_instance_size(1 << 20)
        .table_elements(100_000);

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

fn compile(engine: &wasmtime::Engine, bytes: &[u8], origin: &str) -> Result<Component> {
    Component::new(engine, bytes)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("{origin}: not a valid WebAssembly component"))
}

/// Compiled components on disk, one file per (component content, engine configuration).
///
/// A file holds the SHA-256 of its payload followed by the payload that
/// `Component::serialize` produced. A file whose digest does not match, or that
/// wasmtime refuses, is never used: the component is compiled again and the
/// file replaced atomically.
struct ComponentCache {
    dir: PathBuf,
    engine_key: String,
}

impl ComponentCache {
    fn new(dir: PathBuf, engine: &wasmtime::Engine) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = format!("{}-{:016x}", env!("CARGO_PKG_VERSION"), hasher.finish());
        ComponentCache { dir, engine_key }
    }

    fn path_for(&self, bytes: &[u8]) -> PathBuf {
        let mut digest = Sha256::new();
        digest.update(self.engine_key.as_bytes());
        digest.update([0]);
        digest.update(bytes);
        self.dir
            .join(format!("{}.cwasm", hex::encode(digest.finalize())))
    }

    fn load(&self, engine: &wasmtime::Engine, bytes: &[u8], origin: &str) -> Result<Component> {
        let path = self.path_for(bytes);
        match read_entry(engine, &path) {
            Ok(Some(component)) => return Ok(component),
            Ok(None) => {}
            Err(err) => tracing::warn!(
                cache_file = %path.display(),
                "rebuilding compiled component for {origin}: {err:#}"
            ),
        }
        let component = compile(engine, bytes, origin)?;
        if let Err(err) = self.store(&path, &component) {
            // A read-only or full disk only costs the next start a compile.
            tracing::warn!(cache_file = %path.display(), "not caching {origin}: {err:#}");
        }
        Ok(component)
    }

    fn store(&self, path: &Path, component: &Component) -> Result<()> {
        fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let payload = component.serialize()?;
        let mut file = tempfile::NamedTempFile::new_in(&self.dir)?;
        file.write_all(&Sha256::digest(&payload))?;
        file.write_all(&payload)?;
        file.as_file().sync_all()?;
        file.persist(path)?;
        Ok(())
    }
}

/// Reads a cache entry: `Ok(None)` when there is none, an error when it exists but is unusable.
fn read_entry(engine: &wasmtime::Engine, path: &Path) -> Result<Option<Component>> {
    let data = match fs::read(path) {
        Ok(data) => data,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err.into()),
    };
    let Some((digest, payload)) = data.split_at_checked(32) else {
        anyhow::bail!("cache file is truncated");
    };
    if Sha256::digest(payload).as_slice() != digest {
        anyhow::bail!("cache file is corrupt (checksum mismatch)");
    }
    // SAFETY: the payload is byte-for-byte what `Component::serialize` wrote for
    // this engine configuration (the checksum above proves it was not altered on
    // disk), and wasmtime still checks its header against this engine.
    let component = unsafe { Component::deserialize(engine, payload) }?;
    Ok(Some(component))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_cache_entries_are_rebuilt_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::new(CacheSetting::Dir(dir.path().to_path_buf())).unwrap();
        let bytes = wat_component();
        engine.load_component(&bytes, "test").unwrap();

        let cache = engine.inner.cache.as_ref().unwrap();
        let path = cache.path_for(&bytes);
        let good = fs::read(&path).unwrap();

        // Flip one payload byte: the checksum no longer matches.
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        fs::write(&path, &bad).unwrap();
        assert!(read_entry(engine.wasmtime(), &path).is_err());
        engine.load_component(&bytes, "test").unwrap();
        assert_eq!(
            fs::read(&path).unwrap(),
            good,
            "entry rewritten from a fresh compile"
        );

        // A truncated file is rejected as well.
        fs::write(&path, &good[..10]).unwrap();
        assert!(read_entry(engine.wasmtime(), &path).is_err());
        engine.load_component(&bytes, "test").unwrap();
        assert_eq!(fs::read(&path).unwrap(), good);
    }

    #[test]
    fn entries_are_keyed_by_content() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::new(CacheSetting::Dir(dir.path().to_path_buf())).unwrap();
        let cache = engine.inner.cache.as_ref().unwrap();
        assert_ne!(cache.path_for(b"a"), cache.path_for(b"b"));
        assert_eq!(cache.path_for(b"a"), cache.path_for(b"a"));
    }

    #[test]
    fn invalid_bytes_name_their_origin() {
        let engine = Engine::new(CacheSetting::Disabled).unwrap();
        let err = engine
            .load_component(b"not wasm", "plugins/x/x.wasm")
            .unwrap_err();
        assert!(format!("{err:#}").contains("plugins/x/x.wasm: not a valid WebAssembly component"));
    }

    /// The binary encoding of `(component)`: the preamble of a component, nothing else.
    fn wat_component() -> Vec<u8> {
        vec![0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00]
    }
}
