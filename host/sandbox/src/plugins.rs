//! Plugin loading and calling.
//!
//! A [`PluginRegistry`] holds every loaded plugin: the bundled ones compiled
//! into the binary and third-party ones read from plugin folders (a
//! `plugin.json` manifest beside a component). Loading compiles the component
//! once (through the engine's cache), checks that it implements the world its
//! manifest claims, links it into an `InstancePre`, and for tool plugins asks
//! it for its tools. Every call then gets a fresh `Store` with the grant of
//! that call, so nothing carries over from one call to the next.

pub mod api;
pub mod manifest;
pub mod schema;
pub mod tools;

pub(crate) mod bindings;
mod call_tool;
mod complete;
mod validate;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use wasmtime::component::{Component, Linker};

use crate::bundled;
use crate::capabilities::{FsLimits, Grant, Limits};
use crate::engine::Engine;
use crate::llm::{self, LlmCallError, LlmError};
use crate::slices::commands::CommandHost;
use crate::state::CallState;
use crate::{CallFailure, CallFuture, call, slices};
pub use manifest::{Manifest, PluginKind};
pub use tools::{ToolCallError, ToolErrorKind, ToolListing, ToolSpec, normalize_tool_name};
pub use validate::{CheckResult, CustomOutcome, ValidatorError};
#[cfg(test)]
use validate::{MAX_VALIDATOR_FIELD_BYTES, MAX_VALIDATOR_WARNINGS, capped_outcome};

/// Where a plugin came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSource {
    /// Compiled into the `trellis` binary.
    Bundled,
    /// Loaded from this component file.
    File(PathBuf),
}

impl std::fmt::Display for PluginSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginSource::Bundled => f.write_str("bundled"),
            PluginSource::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// Whether the plugin of one manifest loaded ([`PluginRegistry::load_dir_each`]).
#[derive(Debug)]
pub struct LoadOutcome {
    /// The manifest file.
    pub manifest: PathBuf,
    /// The plugin's id, or why it did not load (the error names the plugin and file).
    pub result: Result<String>,
}

/// A loaded plugin.
pub struct Plugin {
    manifest: Manifest,
    source: PluginSource,
    pre: wasmtime::component::InstancePre<CallState>,
    /// The tool world's exports looked up once in `pre` (a tool plugin's only).
    tool_pre: Option<bindings::tool::ToolPluginPre<CallState>>,
    tools: Vec<ToolSpec>,
    /// A provider of the 0.3.0 world, which may stream its replies.
    streams: bool,
    /// The commands its calls may run: the bundled shell's only.
    commands: Option<Arc<CommandHost>>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("id", &self.manifest.id)
            .field("kind", &self.manifest.kind)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    /// The tool world's bindings of a tool plugin.
    fn tool_pre(&self) -> wasmtime::Result<bindings::tool::ToolPluginPre<CallState>> {
        self.tool_pre.clone().ok_or_else(|| {
            wasmtime::Error::msg(format!("`{}` is not a tool plugin", self.manifest.id))
        })
    }

    /// The plugin's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Where it was loaded from.
    pub fn source(&self) -> &PluginSource {
        &self.source
    }

    /// Whether it is a provider that may stream its replies (built against
    /// `trellis:plugin@0.3.0`); one built against 0.1.0 returns whole answers only.
    pub fn streams(&self) -> bool {
        self.streams
    }

    /// Its tools (empty for other kinds).
    pub fn tools(&self) -> &[ToolSpec] {
        &self.tools
    }

    /// The tools as listed to users, with full `server:tool` names.
    pub fn tool_listings(&self) -> Vec<ToolListing<'_>> {
        self.tools
            .iter()
            .map(|t| ToolListing {
                name: format!("{}:{}", self.manifest.id, t.name),
                description: &t.description,
                input_schema: &t.input_schema,
                read_only: t.read_only,
                destructive: t.destructive,
                idempotent: t.idempotent,
            })
            .collect()
    }

    fn find_tool(&self, name: &str) -> Option<&ToolSpec> {
        let wanted = normalize_tool_name(name);
        self.tools
            .iter()
            .find(|t| normalize_tool_name(&t.name) == wanted)
    }
}

/// Every loaded plugin, by id.
pub struct PluginRegistry {
    engine: Engine,
    tool_linker: Linker<CallState>,
    validator_linker: Linker<CallState>,
    llm_linker: Linker<CallState>,
    /// The tool linker plus `trellis:shell/commands`, for the bundled shell alone.
    shell_linker: Linker<CallState>,
    plugins: BTreeMap<String, Plugin>,
}

impl std::fmt::Debug for PluginRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginRegistry")
            .field("plugins", &self.plugins.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Largest component file of a third-party plugin, checked before it is read.
pub const MAX_COMPONENT_BYTES: u64 = 64 << 20;
/// How long compiling a third-party plugin may take (bundled ones are not bounded).
pub const COMPILE_DEADLINE: Duration = Duration::from_secs(60);
/// Most tools one plugin may list.
pub const MAX_TOOLS: usize = 256;
/// Largest list-tools answer: names, descriptions and schemas of all tools, in bytes.
pub const MAX_LIST_TOOLS_BYTES: usize = 1 << 20;
/// Longest tool description, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 4 << 10;

/// Limits used while a plugin lists its tools at load time.
const LOAD_LIMITS: Limits = Limits {
    memory_bytes: 64 << 20,
    timeout: Duration::from_secs(10),
    output_bytes: 1 << 20,
    stdio_bytes: 16 << 10,
    fs: FsLimits::DEFAULT,
};

impl PluginRegistry {
    /// A registry with the bundled plugins loaded.
    pub async fn with_bundled(engine: &Engine) -> Result<Self> {
        let mut registry = PluginRegistry::empty(engine)?;
        for plugin in bundled::PLUGINS {
            let manifest = Manifest {
                id: plugin.id.to_string(),
                kind: plugin.kind,
                version: env!("CARGO_PKG_VERSION").to_string(),
                description: plugin.description.to_string(),
                component: PathBuf::from(format!("{}.wasm", plugin.id)),
            };
            registry
                .add(manifest, PluginSource::Bundled, plugin.component)
                .await
                .with_context(|| format!("loading bundled plugin `{}`", plugin.id))?;
        }
        Ok(registry)
    }

    /// A registry with nothing loaded.
    pub fn empty(engine: &Engine) -> Result<Self> {
        let tool_linker = slices::linker(engine, slices::TOOL)?;
        let validator_linker = slices::linker(engine, slices::VALIDATOR)?;
        // An LLM provider gets WASI, `wasi:http` (gated per call by the host's policy) and
        // the host interface; not the workflow db.
        let llm_linker = slices::linker(engine, slices::PROVIDER)?;
        let shell_linker = slices::linker(engine, slices::SHELL)?;
        Ok(PluginRegistry {
            engine: engine.clone(),
            tool_linker,
            validator_linker,
            llm_linker,
            shell_linker,
            plugins: BTreeMap::new(),
        })
    }

    /// Loads every plugin in `dir`: either `dir/plugin.json` itself, or each
    /// `dir/<name>/plugin.json`. Returns the ids loaded; when any plugin fails, the
    /// others are loaded all the same and the error names every one that failed.
    pub async fn load_dir(&mut self, dir: &Path) -> Result<Vec<String>> {
        let mut ids = Vec::new();
        let mut failures = Vec::new();
        for outcome in self.load_dir_each(dir).await? {
            match outcome.result {
                Ok(id) => ids.push(id),
                Err(err) => failures.push(format!("{err:#}")),
            }
        }
        match failures.len() {
            0 => Ok(ids),
            1 => bail!("{}", failures[0]),
            n => bail!("{n} plugins failed to load:\n{}", failures.join("\n")),
        }
    }

    /// Loads every plugin in `dir` like [`PluginRegistry::load_dir`], and says for each
    /// manifest whether it loaded: one bad plugin does not keep the others out.
    pub async fn load_dir_each(&mut self, dir: &Path) -> Result<Vec<LoadOutcome>> {
        let mut outcomes = Vec::new();
        for manifest in find_manifests(dir)? {
            // A plugin's own folder inside `dir` is never a link (`dir` itself is the
            // operator's word and may be one).
            let folder = manifest.parent().unwrap_or(dir);
            let linked = folder != dir
                && std::fs::symlink_metadata(folder).is_ok_and(|m| m.file_type().is_symlink());
            let result = if linked {
                Err(anyhow::anyhow!(
                    "{}",
                    crate::store::workspace_fs::link_error(folder)
                ))
            } else {
                self.load_manifest(&manifest).await
            };
            outcomes.push(LoadOutcome { manifest, result });
        }
        Ok(outcomes)
    }

    /// Loads the plugin described by the manifest at `path`.
    pub async fn load_manifest(&mut self, path: &Path) -> Result<String> {
        // The plugin's files are read through its folder's handle: a link (symbolic or hard),
        // a FIFO or a device at either is refused, never followed or waited on.
        let folder = path.parent().unwrap_or(Path::new("."));
        let files = crate::store::WorkspaceFs::open(folder)
            .with_context(|| format!("reading plugin folder {}", folder.display()))?;
        let text = files
            .read_capped(manifest::MANIFEST_FILE, manifest::MAX_MANIFEST_BYTES)
            .with_context(|| format!("{}: cannot read", path.display()))?;
        let text = String::from_utf8(text)
            .map_err(|_| anyhow::anyhow!("{}: not UTF-8 text", path.display()))?;
        let manifest = Manifest::parse(&text).with_context(|| path.display().to_string())?;
        let component_path = folder.join(&manifest.component);
        let id = manifest.id.clone();
        let context = || format!("loading plugin `{id}` from {}", component_path.display());
        let cannot_read = |err: std::io::Error| {
            anyhow::anyhow!(
                "{}: component: cannot read {}: {err}",
                path.display(),
                component_path.display()
            )
        };
        let too_large = |size: u64| -> Result<String> {
            Err(anyhow::anyhow!(
                "the component is {size} bytes, over the limit of {MAX_COMPONENT_BYTES} bytes (64 MiB)"
            ))
            .with_context(context)
        };
        if let Some(size) = files.metadata_len(&manifest.component)
            && size > MAX_COMPONENT_BYTES
        {
            return too_large(size);
        }
        let bytes = files
            .read_capped(&manifest.component, MAX_COMPONENT_BYTES)
            .map_err(cannot_read)?;
        self.add(manifest, PluginSource::File(component_path.clone()), &bytes)
            .await
            .with_context(context)?;
        Ok(id)
    }

    async fn add(&mut self, manifest: Manifest, source: PluginSource, bytes: &[u8]) -> Result<()> {
        if let Some(existing) = self.plugins.get(&manifest.id) {
            bail!(
                "plugin id `{}` is already taken by {}",
                manifest.id,
                existing.source
            );
        }
        let origin = match &source {
            PluginSource::Bundled => format!("bundled:{}", manifest.id),
            PluginSource::File(path) => path.display().to_string(),
        };
        // Bundled components are ours; a third-party one gets a compile deadline.
        let deadline = match source {
            PluginSource::Bundled => None,
            PluginSource::File(_) => Some(COMPILE_DEADLINE),
        };
        let loaded = self.engine.open_component(bytes, &origin, deadline)?;
        let component = loaded.component();
        let streams = check_world(component, &self.engine, manifest.kind)?;
        // The shell's commands are the host's to run for Trellis's own shell only.
        let shell = source == PluginSource::Bundled && manifest.id == bundled::SHELL_ID;
        let linker = match manifest.kind {
            PluginKind::Tool if shell => &self.shell_linker,
            PluginKind::Tool => &self.tool_linker,
            PluginKind::Validator => &self.validator_linker,
            PluginKind::LlmProvider => &self.llm_linker,
        };
        let pre = linker.instantiate_pre(component).map_err(|err| {
            anyhow::anyhow!(
                "the component needs an import a {} plugin is not given: {err}",
                manifest.kind
            )
        })?;
        let tool_pre = match manifest.kind {
            PluginKind::Tool => Some(bindings::tool::ToolPluginPre::new(pre.clone())?),
            _ => None,
        };
        let mut plugin = Plugin {
            manifest,
            source,
            pre,
            tool_pre,
            tools: Vec::new(),
            streams,
            commands: shell.then(|| CommandHost::new(&self.engine)),
        };
        if plugin.manifest.kind == PluginKind::Tool {
            plugin.tools = list_tools(&plugin, &self.engine).await?;
        }
        // Only a component that loaded is cached.
        self.engine.keep(&loaded);
        self.plugins.insert(plugin.manifest.id.clone(), plugin);
        Ok(())
    }

    /// The engine the plugins run on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Loaded plugins, sorted by id.
    pub fn plugins(&self) -> impl Iterator<Item = &Plugin> {
        self.plugins.values()
    }

    /// Ids of the loaded LLM provider plugins.
    pub fn llm_provider_ids(&self) -> Vec<String> {
        self.plugins
            .values()
            .filter(|p| p.manifest.kind == PluginKind::LlmProvider)
            .map(|p| p.manifest.id.clone())
            .collect()
    }

    /// Ids of the loaded plugins of `kind`, comma-separated, for error messages.
    fn ids_of(&self, kind: PluginKind) -> String {
        self.plugins
            .values()
            .filter(|p| p.manifest.kind == kind)
            .map(|p| p.manifest.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The plugin with this id.
    pub fn get(&self, id: &str) -> Option<&Plugin> {
        self.plugins.get(id)
    }

    /// Resolves `server:tool` to its plugin and tool.
    pub fn resolve_tool(&self, full_name: &str) -> Result<(&Plugin, &ToolSpec), ToolCallError> {
        let Some((server, tool)) = full_name.split_once(':') else {
            return Err(ToolCallError::BadName(full_name.to_string()));
        };
        let plugin = self
            .plugins
            .get(server)
            .filter(|p| p.manifest.kind == PluginKind::Tool)
            .ok_or_else(|| ToolCallError::UnknownServer {
                server: server.to_string(),
                loaded: self.ids_of(PluginKind::Tool),
            })?;
        let spec = plugin
            .find_tool(tool)
            .ok_or_else(|| ToolCallError::UnknownTool {
                server: server.to_string(),
                tool: tool.to_string(),
                available: plugin
                    .tools
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        Ok((plugin, spec))
    }
}

/// A failed call as the error of tool `tool` (or of list-tools, a validator, a provider).
fn call_error(failure: CallFailure, tool: String) -> ToolCallError {
    match failure {
        CallFailure::Timeout(after) => ToolCallError::Timeout { tool, after },
        CallFailure::Memory { limit } => ToolCallError::MemoryLimit { tool, limit },
        CallFailure::StackOverflow => ToolCallError::StackOverflow { tool },
        CallFailure::FsLimit(exceeded) => ToolCallError::FsLimit { tool, exceeded },
        CallFailure::Exit {
            message, stderr, ..
        }
        | CallFailure::Trap { message, stderr } => ToolCallError::Crashed {
            tool,
            message,
            stderr,
        },
        CallFailure::Host(error) => ToolCallError::Host { tool, error },
        CallFailure::Cancelled => ToolCallError::Cancelled { tool },
    }
}

/// Runs one call of `plugin` through the sandbox's one call path.
async fn run_call<T, F>(
    engine: &Engine,
    plugin: &Plugin,
    grant: &Grant,
    limits: &Limits,
    f: F,
) -> Result<T, CallFailure>
where
    F: for<'a> FnOnce(
        &'a wasmtime::component::InstancePre<CallState>,
        &'a mut wasmtime::Store<CallState>,
    ) -> CallFuture<'a, T>,
{
    run_call_with_http(engine, plugin, grant, limits, None, None, f).await
}

/// [`run_call`] for a call that may send HTTP requests as `http` allows, and that `cancel`
/// may stop.
async fn run_call_with_http<T, F>(
    engine: &Engine,
    plugin: &Plugin,
    grant: &Grant,
    limits: &Limits,
    http: Option<llm::http::HttpPolicy>,
    cancel: Option<&tokio_util::sync::CancellationToken>,
    f: F,
) -> Result<T, CallFailure>
where
    F: for<'a> FnOnce(
        &'a wasmtime::component::InstancePre<CallState>,
        &'a mut wasmtime::Store<CallState>,
    ) -> CallFuture<'a, T>,
{
    let call = call::Call {
        label: &plugin.manifest.id,
        grant,
        limits,
        http,
        cancel,
        commands: plugin.commands.clone(),
        within: None,
    };
    // The shell's working folder; no other plugin gets an environment.
    let wasi = |builder: &mut wasmtime_wasi::WasiCtxBuilder| {
        if plugin.commands.is_some() {
            builder
                .env("HOME", grant.home())
                .env("TRELLIS_CALL_MS", limits.timeout.as_millis().to_string());
        }
        Ok(())
    };
    call::run(engine, &plugin.pre, call, wasi, f).await.result
}

async fn list_tools(plugin: &Plugin, engine: &Engine) -> Result<Vec<ToolSpec>> {
    let listed = run_call(engine, plugin, &Grant::none(), &LOAD_LIMITS, |_, store| {
        let tool_pre = plugin.tool_pre();
        Box::pin(async move {
            let bindings = tool_pre?.instantiate_async(&mut *store).await?;
            bindings.trellis_plugin_tool().call_list_tools(store).await
        })
    })
    .await
    .map_err(|failure| anyhow::anyhow!("{}", call_error(failure, "list-tools".into())))?;

    if listed.len() > MAX_TOOLS {
        bail!(
            "list-tools: {} tools, over the limit of {MAX_TOOLS} per plugin",
            listed.len()
        );
    }
    let size: usize = listed
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.input_schema.len())
        .sum();
    if size > MAX_LIST_TOOLS_BYTES {
        bail!("list-tools: the answer is {size} bytes, over the limit of {MAX_LIST_TOOLS_BYTES}");
    }
    let mut tools: Vec<ToolSpec> = Vec::with_capacity(listed.len());
    let mut names = HashSet::with_capacity(listed.len());
    for info in listed {
        let name = info.name;
        let normalized = normalize_tool_name(&name);
        manifest::check_id(&normalized)
            .with_context(|| format!("list-tools: tool name {name:?}"))?;
        if !names.insert(normalized) {
            bail!("list-tools: tool `{name}` is listed twice");
        }
        if info.description.len() > MAX_DESCRIPTION_BYTES {
            bail!(
                "list-tools: tool `{name}`: the description is {} bytes, over the limit of {MAX_DESCRIPTION_BYTES}",
                info.description.len()
            );
        }
        let mut tool = ToolSpec::new(name, info.description, &info.input_schema)
            .map_err(|e| anyhow::anyhow!("list-tools: {e}"))?;
        tool.read_only = info.hints.read_only;
        tool.destructive = info.hints.destructive;
        tool.idempotent = info.hints.idempotent;
        tools.push(tool);
    }
    Ok(tools)
}

/// Checks that `component` exports the interface of `kind` at a supported plugin API
/// version ([`api::check_world`]), with a message saying what it exports instead; `true`
/// for a provider of the streaming world ([`api::PROVIDER_API_VERSION`]).
fn check_world(component: &Component, engine: &Engine, kind: PluginKind) -> Result<bool> {
    let ty = component.component_type();
    let exports: Vec<String> = ty
        .exports(engine.wasmtime())
        .map(|(name, _)| name.to_string())
        .collect();
    let imports: Vec<String> = ty
        .imports(engine.wasmtime())
        .map(|(name, _)| name.to_string())
        .collect();
    api::check_world(&exports, &imports, kind)?;
    Ok(kind == PluginKind::LlmProvider && api::exports_streaming_provider(&exports))
}

fn find_manifests(dir: &Path) -> Result<Vec<PathBuf>> {
    let direct = dir.join(manifest::MANIFEST_FILE);
    if direct.is_file() {
        return Ok(vec![direct]);
    }
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("reading plugin folder {}", dir.display()))?;
    let mut found = Vec::new();
    for entry in entries {
        let path = entry?.path().join(manifest::MANIFEST_FILE);
        if path.is_file() {
            found.push(path);
        }
    }
    if found.is_empty() {
        bail!(
            "{}: no {} here or in its subfolders",
            dir.display(),
            manifest::MANIFEST_FILE
        );
    }
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindings::validator::exports::trellis::plugin::validator::{Check, Report};

    #[test]
    fn validator_reports_are_capped_and_cuts_marked() {
        let huge = "x".repeat(100 << 10);
        let report = Report {
            checks: vec![Check {
                file: "a.csv".into(),
                path: String::new(),
                kind: "row".into(),
                passed: false,
                expected: huge.clone(),
                actual: "é".repeat(3000),
                message: "short".into(),
            }],
            warnings: vec![huge.clone(); 150],
        };
        let outcome = capped_outcome(report);
        let check = &outcome.checks[0];
        assert!(check.expected.len() < MAX_VALIDATOR_FIELD_BYTES + 100);
        assert!(
            check
                .expected
                .ends_with("… [cut: 102400 bytes, limit 4096]"),
            "{}",
            &check.expected[4000..]
        );
        assert!(check.actual.ends_with("[cut: 6000 bytes, limit 4096]"));
        assert_eq!(check.message, "short");
        assert_eq!(outcome.warnings.len(), MAX_VALIDATOR_WARNINGS + 1);
        assert_eq!(
            outcome.warnings.last().unwrap(),
            "[50 more warnings dropped: limit 100]"
        );
        let total: usize = outcome.warnings.iter().map(String::len).sum();
        assert!(total < 500 << 10, "{total}");
    }
}
