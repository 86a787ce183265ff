//! Shared helpers of the integration tests: one engine per test binary, plugin
//! folders for the test components, and tree digests for "nothing changed" checks. The
//! submodules hold test workspaces on disk, turn grants, cassettes for the replay provider,
//! golden files under `tests/data/`, a fake OpenAI-compatible server, a fake Anthropic Messages API and a server that streams as a script says, the MCP fixture
//! server, `trellis mcp serve --http` started for a test, the setup of runs with external
//! MCP servers, plugin builds, and [`skip`], through which a test that cannot run here
//! says so.

#![allow(dead_code)]

pub mod fake_anthropic;
pub mod fake_llm;
pub mod fake_stream;
pub mod golden;
pub mod grants;
pub mod mcp_fixture;
pub mod mcp_serve;
pub mod mcp_servers;
pub mod measure;
pub mod plugin_build;
pub mod serve;
mod skip;
pub mod tape;
pub mod venv;
pub mod workspace;

pub use skip::skip;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use trellis_sandbox::{CacheSetting, Engine, PluginRegistry};

/// The engine shared by every test of a binary, with a cache under the target folder.
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("component-cache");
        Engine::new(CacheSetting::Dir(cache)).expect("engine")
    })
}

/// Writes a plugin folder for the test component `component` (e.g. `adversary`)
/// under `parent`, with a manifest of the given id and kind.
pub fn plugin_folder(parent: &Path, component: &str, id: &str, kind: &str) -> PathBuf {
    let folder = parent.join(id);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(
        trellis_test_programs::path(component),
        folder.join(format!("{component}.wasm")),
    )
    .unwrap();
    std::fs::write(
        folder.join("plugin.json"),
        serde_json::json!({
            "id": id, "kind": kind, "version": "0.1.0",
            "description": "test plugin", "component": format!("{component}.wasm"),
        })
        .to_string(),
    )
    .unwrap();
    folder
}

/// The bundled plugins.
pub async fn registry() -> PluginRegistry {
    PluginRegistry::with_bundled(engine()).await.unwrap()
}

/// The bundled plugins plus the `adversary` test plugin.
pub async fn registry_with_adversary() -> PluginRegistry {
    let plugins = tempfile::tempdir().unwrap();
    let folder = plugin_folder(plugins.path(), "adversary", "adversary", "tool");
    let mut registry = registry().await;
    registry.load_dir(&folder).await.unwrap();
    registry
}

/// Every file and folder under `root` (symlinks not followed) with a digest of
/// its content, so a test can show that nothing changed.
pub fn tree_digest(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
    entries.sort_by_key(|e| e.path());
    for entry in entries {
        let path = entry.path();
        let rel = path.strip_prefix(root).unwrap().display().to_string();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.file_type().is_symlink() {
            out.insert(
                rel,
                format!("link -> {}", std::fs::read_link(&path).unwrap().display()),
            );
        } else if meta.is_dir() {
            out.insert(rel.clone(), "dir".into());
            walk(root, &path, out);
        } else if meta.is_file() {
            let digest = Sha256::digest(std::fs::read(&path).unwrap());
            out.insert(rel, hex::encode(digest));
        } else {
            // A FIFO, socket or device: reading it could block or never end.
            use std::os::unix::fs::MetadataExt;
            out.insert(rel, format!("special {:o} {}", meta.mode(), meta.ino()));
        }
    }
}

/// Runs the `trellis` binary with a component cache under the target folder (through
/// `TRELLIS_CACHE_DIR`, which every command reads), no `RUST_LOG` of the caller's, and
/// none of the caller's LLM settings: no variable named `*_API_KEY` or `*_BASE_URL` (the
/// OpenAI and Anthropic defaults, and the key a workflow's provider reads by default), and
/// an empty user config folder (`XDG_CONFIG_HOME`), so a developer's `~/.config/trellis`
/// never leaks in.
pub fn trellis(args: &[&str]) -> std::process::Output {
    trellis_command(args)
        .output()
        .expect("the trellis binary runs")
}

/// [`trellis`] run in the folder `cwd`.
pub fn trellis_in(args: &[&str], cwd: &Path) -> std::process::Output {
    trellis_command(args)
        .current_dir(cwd)
        .output()
        .expect("the trellis binary runs")
}

/// The command [`trellis`] runs, for a test that spawns it (to signal it, say).
pub fn trellis_command(args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_trellis"));
    command
        .args(args)
        .env(
            "TRELLIS_CACHE_DIR",
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("component-cache"),
        )
        .env_remove("RUST_LOG")
        .env(
            "XDG_CONFIG_HOME",
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-user-config"),
        );
    for (name, _) in std::env::vars_os() {
        let text = name.to_string_lossy();
        if text.ends_with("_API_KEY") || text.ends_with("_BASE_URL") {
            command.env_remove(&name);
        }
    }
    command
}

/// The total size of the files under `dir`.
pub fn bytes_under(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}
