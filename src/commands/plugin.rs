//! `trellis plugin`: authoring third-party plugins. `new` starts a plugin project (Rust for
//! every kind, Python for tools) outside this repository; `build` turns one into a loadable
//! plugin folder (`dist/`: the component and its `plugin.json`) and loads it to prove it.
//!
//! A project may come from anyone: its files are read through a handle on its folder that
//! refuses links (a link to a file elsewhere is never read into the plugin), the build's
//! staging folder is a private one with an unpredictable name, and `dist/` is written
//! through the same handle, atomically: a link planted at a file of `dist/` is refused and
//! a hard link replaced, neither written through. A Rust project is built by cargo, which runs its
//! build scripts: building one is running its code.
//!
//! The installed plugins are listed by `trellis plugins`, not here.

mod python_build;
mod rust_build;
mod scaffold;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use trellis_sandbox::plugins::manifest::MANIFEST_FILE;
use trellis_sandbox::plugins::{Manifest, PluginKind};
use trellis_sandbox::store::workspace_fs::link_error;
use trellis_sandbox::store::{Kind as EntryKind, WorkspaceFs};
use trellis_sandbox::{Engine, PluginRegistry};

use super::CacheArgs;
use crate::terminal::println_shown;

/// Subcommands of `trellis plugin`.
#[derive(Subcommand, Debug)]
pub enum PluginCommand {
    /// Create a plugin project in a new folder: sources, a test, a plugin.json.
    ///
    /// The folder's name is the plugin id. Build it with `trellis plugin build DIR`, test it
    /// with `cargo test` (Rust) or `python3 -m unittest` (Python). A Rust plugin depends on
    /// the plugin SDK of this Trellis checkout by path unless --sdk-path or --sdk-git says
    /// otherwise. Python is offered for tool plugins only.
    ///
    /// Examples:
    ///   trellis plugin new ../word-tools --kind tool
    ///   trellis plugin new ../word-tools-py --kind tool --lang python
    ///   trellis plugin new ../min-lines --kind validator --sdk-git https://example.com/trellis
    #[command(verbatim_doc_comment)]
    New(NewArgs),
    /// Build a plugin project into DIR/dist: its component and plugin.json, then load it.
    ///
    /// A folder with a Cargo.toml is built with `cargo build --release --target
    /// wasm32-wasip2`; one with a plugin.py (a Python tool plugin) with componentize-py
    /// (see docs/plugins.md for where it comes from). The result is loaded as `--plugins
    /// DIR/dist` would load it; a component that does not load is an error.
    Build(BuildArgs),
}

/// The arguments of `trellis plugin new`.
#[derive(Args, Debug)]
pub struct NewArgs {
    /// The folder to create; its name is the plugin id (a-z, 0-9, `_`, `-`).
    pub dir: PathBuf,
    /// What the plugin is.
    #[arg(long, value_enum)]
    pub kind: Kind,
    /// The language of the project.
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    pub lang: Lang,
    /// Depend on the plugin SDK at this folder (Rust) [default: this checkout's plugins/sdk].
    #[arg(long, value_name = "DIR", conflicts_with = "sdk_git")]
    pub sdk_path: Option<PathBuf>,
    /// Depend on the plugin SDK in this git repository of Trellis (Rust).
    #[arg(long, value_name = "URL")]
    pub sdk_git: Option<String>,
}

/// The arguments of `trellis plugin build`.
#[derive(Args, Debug)]
pub struct BuildArgs {
    /// The plugin project: a folder with plugin.json and Cargo.toml or plugin.py.
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    /// Where to put the component and plugin.json [default: DIR/dist].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// How long a Python plugin's build may take, in seconds: its plugin.py is imported at
    /// build time, so its top-level code runs then (within 2 GiB of memory too)
    /// [default: 300].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: Option<u64>,
    #[command(flatten)]
    pub cache: CacheArgs,
}

/// The kinds of plugin `new` creates.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Tools agents call (world `tool-plugin`).
    Tool,
    /// Checks of output files for a custom `validation_type` (world `validator-plugin`).
    Validator,
    /// A language model behind an API (world `llm-provider`).
    LlmProvider,
}

impl Kind {
    fn plugin_kind(self) -> PluginKind {
        match self {
            Kind::Tool => PluginKind::Tool,
            Kind::Validator => PluginKind::Validator,
            Kind::LlmProvider => PluginKind::LlmProvider,
        }
    }
}

/// The languages `new` writes.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    /// A Rust crate using the plugin SDK (plugins/sdk).
    Rust,
    /// Python with the `trellis_plugin` module, built with componentize-py (tools only).
    Python,
}

impl PluginCommand {
    /// Its compile-cache options: `build` loads what it built.
    pub fn cache(&self) -> Option<&CacheArgs> {
        match self {
            PluginCommand::New(_) => None,
            PluginCommand::Build(args) => Some(&args.cache),
        }
    }
}

/// Runs a `trellis plugin` subcommand; `engine` is started only by `build`.
pub async fn run(
    engine: impl FnOnce() -> Result<Engine>,
    command: PluginCommand,
) -> Result<ExitCode> {
    match command {
        PluginCommand::New(args) => {
            scaffold::create(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Build(args) => {
            build(&engine()?, &args).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Whether the project has the regular file `name`; a link there is an error naming it.
fn has_file(project: &WorkspaceFs, name: &str) -> Result<bool> {
    match project.kind(name)? {
        Some(EntryKind::Link) => bail!("{}", link_error(Path::new(name))),
        kind => Ok(kind == Some(EntryKind::File)),
    }
}

/// The language of the project, from the file that marks it.
fn project_lang(project: &WorkspaceFs, dir: &Path) -> Result<Lang> {
    if has_file(project, "Cargo.toml")? {
        Ok(Lang::Rust)
    } else if has_file(project, python_build::ENTRY_FILE)? {
        Ok(Lang::Python)
    } else {
        bail!(
            "{}: not a plugin project: expected a Cargo.toml (Rust) or a {} (Python) beside its {MANIFEST_FILE}",
            dir.display(),
            python_build::ENTRY_FILE
        )
    }
}

/// Where a build puts the plugin: a folder under a handle, `rel` in it.
struct Dist {
    fs: WorkspaceFs,
    rel: PathBuf,
    /// Under the project's handle.
    in_project: bool,
}

impl Dist {
    /// `DIR/dist` (or `--out` inside the project) under the project's handle; `--out`
    /// elsewhere under a handle on that folder, which is created.
    fn new(project: &WorkspaceFs, dir: &Path, out: Option<&Path>) -> Result<Dist> {
        let Some(out) = out else {
            return Ok(Dist {
                fs: project.clone(),
                rel: PathBuf::from("dist"),
                in_project: true,
            });
        };
        if let Ok(rel) = out.strip_prefix(dir) {
            return Ok(Dist {
                fs: project.clone(),
                rel: project.relative(rel)?,
                in_project: true,
            });
        }
        // A folder the operator named outside the project: it may be reached through links.
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
        Ok(Dist {
            fs: WorkspaceFs::open(out)?,
            rel: PathBuf::new(),
            in_project: false,
        })
    }

    /// The folder on the host.
    fn dir(&self) -> PathBuf {
        self.fs.host_path(&self.rel)
    }

    /// The host path of `name` in it.
    fn path(&self, name: impl AsRef<Path>) -> PathBuf {
        self.fs.host_path(&self.rel.join(name))
    }

    /// Writes `bytes` to `name` in it atomically: a link there is refused, a hard link
    /// replaced, neither written through.
    fn write(&self, name: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
        let name = name.as_ref();
        self.fs
            .write_atomic(self.rel.join(name), bytes)
            .with_context(|| format!("cannot write {}", self.path(name).display()))
    }
}

async fn build(engine: &Engine, args: &BuildArgs) -> Result<()> {
    let dir = &args.dir;
    let manifest_path = dir.join(MANIFEST_FILE);
    let no_manifest = || {
        anyhow::anyhow!(
            "{}: no {MANIFEST_FILE} (is this a plugin project? `trellis plugin new` starts one)",
            dir.display()
        )
    };
    if !dir.is_dir() {
        return Err(no_manifest());
    }
    // Every file of the project is read through this handle: links are refused.
    let project = WorkspaceFs::open(dir)?;
    if !has_file(&project, MANIFEST_FILE)? {
        return Err(no_manifest());
    }
    let manifest_text = project
        .read_to_string(MANIFEST_FILE)
        .with_context(|| format!("{}: cannot read", manifest_path.display()))?;
    let manifest =
        Manifest::parse(&manifest_text).with_context(|| format!("{}", manifest_path.display()))?;
    let lang = project_lang(&project, dir)?;
    let dist = Dist::new(&project, dir, args.out.as_deref())?;
    let component = dist.path(&manifest.component);
    let bytes = match lang {
        Lang::Rust => rust_build::build(dir)?,
        Lang::Python => {
            anyhow::ensure!(
                manifest.kind == PluginKind::Tool,
                "{}: kind {:?}: Python plugins can only be tools (write validators and LLM providers in Rust)",
                manifest_path.display(),
                manifest.kind.as_str()
            );
            let deadline = args
                .timeout
                .map_or(python_build::BUILD_DEADLINE, std::time::Duration::from_secs);
            python_build::build(&project, dir, deadline)?
        }
    };
    // Refused before it is written: a component no plugin folder loads is not put in one.
    anyhow::ensure!(
        bytes.len() as u64 <= trellis_sandbox::plugins::MAX_COMPONENT_BYTES,
        "the built component is {} bytes, over the limit of {} bytes (64 MiB) a plugin \
         folder's component may be: nothing was written to {}",
        bytes.len(),
        trellis_sandbox::plugins::MAX_COMPONENT_BYTES,
        dist.dir().display()
    );
    dist.write(&manifest.component, &bytes)?;
    let out = dist.dir();
    let out_manifest = dist.path(MANIFEST_FILE);
    // `--out DIR` builds in place: the manifest is already there.
    if !(dist.in_project && dist.rel.as_os_str().is_empty()) {
        dist.write(MANIFEST_FILE, manifest_text.as_bytes())?;
    }

    // Load it as `--plugins OUT` would: a component that does not load is no build.
    let mut registry = PluginRegistry::with_bundled(engine).await?;
    let id = registry
        .load_manifest(&out_manifest)
        .await
        .with_context(|| format!("the built plugin in {} does not load", out.display()))?;
    let plugin = registry.get(&id).context("the plugin just loaded")?;
    let size = bytes.len();
    // The manifest's fields and the tools' names are the project's text: escaped.
    println_shown!(
        "built {} ({:.1} MB): {} plugin `{id}` {}",
        component.display(),
        size as f64 / 1e6,
        manifest.kind,
        manifest.version
    );
    if manifest.kind == PluginKind::Tool {
        let names: Vec<_> = plugin.tools().iter().map(|t| t.name.as_str()).collect();
        println_shown!("tools: {}", names.join(", "));
    }
    println_shown!("load it with --plugins {}", out.display());
    Ok(())
}
