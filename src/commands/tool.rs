//! `trellis tool`: calls tools directly, outside a workflow.

// What is printed here was written by models, guests or workspaces: escaped.
use crate::terminal::eprintln_shown as eprintln;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Subcommand;
use trellis_sandbox::capabilities::resolve_in_root;
use trellis_sandbox::{Access, Engine, Grant, Limits};

use super::{CacheArgs, PluginDirs, registry};

/// Subcommands of `trellis tool`.
#[derive(Subcommand, Debug)]
pub enum ToolCommand {
    /// Call one tool in a fresh sandbox and print its JSON result.
    ///
    /// The plugin sees ROOT as `/`, but only the folders given with --read and
    /// --write exist in it; everything else is invisible. With no grant at all
    /// the plugin sees no files. Exit status: 0 with the result on stdout,
    /// 1 with the error on stderr.
    ///
    /// Example:
    ///   trellis tool call workspace:read_file --root examples/ticket-triage \
    ///     --read knowledgebase --args '{"path": "knowledgebase/notes/escalation.md"}'
    #[command(verbatim_doc_comment)]
    Call {
        /// Full tool name, `server:tool`, e.g. `workspace:read_file`.
        name: String,
        /// Arguments: a JSON object, or @FILE to read it from a file.
        #[arg(long, default_value = "{}", value_name = "JSON")]
        args: String,
        /// Folder the plugin sees as `/`; --read and --write are relative to it.
        #[arg(long, default_value = ".", value_name = "ROOT")]
        root: PathBuf,
        /// Grant a folder read-only (repeatable).
        #[arg(long = "read", value_name = "DIR")]
        read: Vec<String>,
        /// Grant a folder read-write (repeatable).
        #[arg(long = "write", value_name = "DIR")]
        write: Vec<String>,
        /// Give the plugin this SQLite file through the `workflow-db` interface, relative to
        /// ROOT (read-only unless --db-write).
        #[arg(long, value_name = "FILE")]
        db: Option<String>,
        /// Let the plugin's `execute` modify the --db file.
        #[arg(long, requires = "db")]
        db_write: bool,
        /// Stop the call after this many seconds.
        #[arg(long, default_value_t = 30.0, value_name = "SECS")]
        timeout: f64,
        /// Memory limit of the plugin instance (all its memories and tables together), in MiB.
        #[arg(long, default_value_t = 256, value_name = "MIB")]
        memory: usize,
        #[command(flatten)]
        plugins: PluginDirs,
        #[command(flatten)]
        cache: CacheArgs,
    },
}

impl ToolCommand {
    /// Its compile-cache options.
    pub fn cache(&self) -> &CacheArgs {
        match self {
            ToolCommand::Call { cache, .. } => cache,
        }
    }
}

/// Runs a `trellis tool` subcommand.
pub async fn run(engine: &Engine, command: ToolCommand) -> Result<ExitCode> {
    match command {
        ToolCommand::Call {
            name,
            args,
            root,
            read,
            write,
            db,
            db_write,
            timeout,
            memory,
            plugins,
            ..
        } => {
            let args = parse_args(&args)?;
            check_root(&root)?;
            let mut grant = grant(&root, &read, &write)?;
            if let Some(db) = db {
                grant = grant.with_db(db_file(&root, &db)?, db_write);
            }
            let limits = limits(timeout, memory)?;
            let registry = registry(engine, &plugins).await?;
            match registry.call_tool(&name, &args, &grant, &limits).await {
                Ok(result) => {
                    println!("{}", serde_json::to_string_pretty(&result)?);
                    Ok(ExitCode::SUCCESS)
                }
                Err(err) => {
                    eprintln!("error: {err}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}

/// The `--db` file of `tool call`: an existing regular file inside ROOT, not a link.
fn db_file(root: &Path, rel: &str) -> Result<PathBuf> {
    let (folder, name) = match rel.rsplit_once('/') {
        Some((folder, name)) => (folder, name),
        None => ("", rel),
    };
    let folder = resolve_in_root(root, folder).with_context(|| format!("--db {rel:?}"))?;
    let path = folder.join(name);
    let meta = std::fs::symlink_metadata(&path).with_context(|| format!("--db {rel:?}"))?;
    anyhow::ensure!(
        meta.is_file(),
        "--db {rel:?}: expected an SQLite file, not a link, folder or special file"
    );
    Ok(path)
}

fn parse_args(text: &str) -> Result<serde_json::Value> {
    let (source, text) = match text.strip_prefix('@') {
        Some(path) => (
            path.to_string(),
            std::fs::read_to_string(path).with_context(|| format!("--args: cannot read {path}"))?,
        ),
        None => ("--args".to_string(), text.to_string()),
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{source}: expected a JSON object"))?;
    anyhow::ensure!(
        value.is_object(),
        "{source}: expected a JSON object, found {}",
        json_kind(&value)
    );
    Ok(value)
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Refuses a --root that is not a folder.
pub(super) fn check_root(root: &Path) -> Result<()> {
    match std::fs::metadata(root) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => anyhow::bail!("--root {}: expected a folder, got a file", root.display()),
        Err(_) => anyhow::bail!("--root {}: the folder does not exist", root.display()),
    }
}

/// The limits of one call from --timeout (seconds) and --memory (MiB).
pub(super) fn limits(timeout: f64, memory: usize) -> Result<Limits> {
    anyhow::ensure!(
        timeout.is_finite() && timeout > 0.0,
        "--timeout: expected a positive number of seconds, found {timeout}"
    );
    Ok(Limits {
        memory_bytes: memory
            .checked_mul(1 << 20)
            .context("--memory is too large")?,
        timeout: Duration::from_secs_f64(timeout),
        ..Limits::default()
    })
}

/// The grant of --read and --write folders under ROOT (each resolved inside it).
pub(super) fn grant(root: &Path, read: &[String], write: &[String]) -> Result<Grant> {
    let mut grant = Grant::none();
    for (dirs, access, flag) in [
        (read, Access::ReadOnly, "--read"),
        (write, Access::ReadWrite, "--write"),
    ] {
        for dir in dirs {
            let host = resolve_in_root(root, dir).with_context(|| format!("{flag} {dir}"))?;
            grant = grant.folder(host, dir, access)?;
        }
    }
    Ok(grant)
}
