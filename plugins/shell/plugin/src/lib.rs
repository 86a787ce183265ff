//! The bundled `shell` tool plugin: `execute_shell_command` runs a bash-compatible script.
//!
//! The script is interpreted here, inside the sandbox, by `trellis-shell`. Its builtins
//! (`cd`, `echo`, `printf`, `test`, `read`, variables, functions, loops, redirections,
//! globs) run in this instance; every other command goes to the host through
//! `trellis:shell/commands`, which runs it as a fresh instance of the bundled utilities
//! with this call's folders. The filesystem either sees is the turn's grant: each granted
//! folder at its workspace path (`/knowledgebase`, `/runs/<run>/execution/<step>`), nothing
//! else. This plugin checks no path itself: the host's preopens are the boundary.

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use trellis_plugin_sdk::export_tools;
use trellis_plugin_sdk::tool::{Hints, ToolError, TypedTool};
use trellis_shell::{Command, Limits, Output, Shell, System};

mod bindings {
    // Only `commands` is used here: the tool world's interfaces are the SDK's.
    wit_bindgen::generate!({
        path: "../../../wit/trellis-shell@0.1.0",
        world: "shell-tool",
        with: {
            "trellis:plugin/host@0.1.0": trellis_plugin_sdk::bindings::trellis::plugin::host,
            "trellis:plugin/types@0.1.0": trellis_plugin_sdk::bindings::trellis::plugin::types,
            "trellis:plugin/workflow-db@0.1.0": trellis_plugin_sdk::bindings::trellis::plugin::workflow_db,
            "trellis:plugin/tool@0.1.0": trellis_plugin_sdk::bindings::exports::trellis::plugin::tool,
        },
    });
}

use bindings::trellis::shell::commands;

/// The longest time a command may ask for, in seconds: the call's own deadline stops it
/// sooner when that comes first.
const MAX_TIMEOUT_S: u64 = 600;

/// The arguments of `execute_shell_command`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The bash script to run: one command or many (`;`, `&&`, `|`, here-documents, loops).
    command: String,
    /// The folder to start in, workspace-relative (`knowledgebase/notes`) or absolute
    /// (`/knowledgebase/notes`). Default: this step's output folder.
    #[serde(default)]
    working_dir: Option<String>,
    /// Stop the script after this many seconds (between commands); the tool call's own
    /// deadline stops it in any case.
    #[serde(default)]
    #[schemars(with = "u64", range(min = 1, max = 600))]
    timeout_s: Option<u64>,
}

struct ExecuteShellCommand;

impl TypedTool for ExecuteShellCommand {
    const NAME: &str = "execute_shell_command";
    const DESCRIPTION: &str = "Run a bash script in a sandboxed shell and get its exit_code, stdout and stderr. \
         Pipes, redirects, &&/||, quoting, globs, variables, $(...), here-documents, loops and \
         functions work as in bash. Commands: coreutils (ls, cat, head, tail, wc, sort, uniq, \
         cut, tr, cp, mv, rm, mkdir, touch, seq, tee, date, sha256sum, base64, ...), sed, grep, \
         find, jq, diff, python3, sqlite3 /db/db.sqlite. The filesystem is the folders granted to this step, each at its workspace \
         path (e.g. /knowledgebase); the script starts in this step's output folder. No \
         network, no processes outside the sandbox.";
    const HINTS: Hints = Hints::NONE.destructive();
    type Args = Args;

    fn run(args: Args) -> Result<Value, ToolError> {
        execute(args)
    }
}

export_tools!(ExecuteShellCommand);

fn execute(args: Args) -> Result<Value, ToolError> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/".into());
    // A workspace-relative folder and an absolute one name the same place.
    let cwd = match args.working_dir.as_deref().map(str::trim) {
        None | Some("") => home.clone(),
        Some(dir) => trellis_shell::normalize("/", dir),
    };
    if !std::fs::metadata(&cwd).is_ok_and(|m| m.is_dir()) {
        return Err(ToolError::NotFound(format!(
            "working_dir {cwd}: not a folder granted to this step"
        )));
    }
    let mut limits = Limits::default();
    // The script stops, and says so, before the call's own deadline would end the call and
    // lose what it printed: the host gives the call's time as `TRELLIS_CALL_MS`.
    let call = std::env::var("TRELLIS_CALL_MS")
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok())
        .map(std::time::Duration::from_millis)
        .map(|call| call.saturating_sub((call / 8).min(REPORT_RESERVE)));
    let asked = args
        .timeout_s
        .map(|s| std::time::Duration::from_secs(s.clamp(1, MAX_TIMEOUT_S)));
    limits.time = match (asked, call) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    };
    let env = [("HOME".to_string(), home)];
    let mut shell = Shell::new(Sandbox::default(), limits, &cwd, &env);
    let finished = shell.run(&args.command);
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let mut result = json!({
        "exit_code": finished.status,
        "stdout": text(&finished.stdout),
        "stderr": text(&finished.stderr),
        "working_dir": shell.cwd(),
    });
    if finished.stdout_dropped > 0 {
        result["stdout_bytes_dropped"] = json!(finished.stdout_dropped);
    }
    if finished.stderr_dropped > 0 {
        result["stderr_bytes_dropped"] = json!(finished.stderr_dropped);
    }
    fit(&mut result);
    Ok(result)
}

/// The part of the call's time the script leaves for reporting, at most: less than the host
/// leaves a command (a quarter, at most 2 s), so a command stopped at its deadline is
/// followed by the rest of the script, not by the script's own stop.
const REPORT_RESERVE: std::time::Duration = std::time::Duration::from_secs(1);

/// The most bytes of JSON a result is made to fit: under the host's 4 MiB result limit,
/// whatever the escaping of what the script printed (a control byte is six in JSON).
const RESULT_BYTES: usize = 3 << 20;

/// Cuts `stdout` and `stderr` of `result` until its JSON fits [`RESULT_BYTES`], the longer
/// one first, each cut added to its `*_bytes_dropped`.
fn fit(result: &mut Value) {
    while result.to_string().len() > RESULT_BYTES {
        let longer = if result["stdout"].as_str().map_or(0, str::len)
            >= result["stderr"].as_str().map_or(0, str::len)
        {
            "stdout"
        } else {
            "stderr"
        };
        let text = result[longer].as_str().unwrap_or_default().to_string();
        let mut keep = text.len() / 2;
        while !text.is_char_boundary(keep) {
            keep -= 1;
        }
        let dropped = (text.len() - keep) as u64;
        let key = format!("{longer}_bytes_dropped");
        let before = result[&key].as_u64().unwrap_or(0);
        result[&key] = json!(before + dropped);
        result[longer] = Value::String(text[..keep].to_string());
    }
}

/// The commands the shell does not run itself: to the host.
#[derive(Default)]
struct Sandbox {
    /// The host's commands, asked for on the first command.
    names: Option<BTreeSet<String>>,
}

impl Sandbox {
    fn names(&mut self) -> &BTreeSet<String> {
        self.names
            .get_or_insert_with(|| commands::names().into_iter().collect())
    }
}

impl System for Sandbox {
    fn run(&mut self, command: Command<'_>) -> Output {
        let name = command.argv.first().cloned().unwrap_or_default();
        if !self.names().contains(&name) {
            let mut available: Vec<&str> = trellis_shell::builtin_names().to_vec();
            available.extend(self.names().iter().map(String::as_str));
            available.sort_unstable();
            available.dedup();
            return Output {
                status: 127,
                stdout: Vec::new(),
                stderr: format!(
                    "command not found: {name} (Trellis's shell runs inside the sandbox; available: {})\n",
                    available.join(" ")
                )
                .into_bytes(),
            };
        }
        let output = commands::run(&commands::Command {
            argv: command.argv.to_vec(),
            cwd: command.cwd.to_string(),
            env: command.env,
            stdin: command.stdin,
            output_bytes: command.output_bytes as u64,
        });
        Output {
            status: output.status,
            stdout: output.stdout,
            stderr: output.stderr,
        }
    }
}
