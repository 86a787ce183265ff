//! Crash safety: `trellis run` is SIGKILLed at 20 moments of a run, and what it leaves must
//! still be readable. The run is a message_sequence step (user turns and a foreach over db
//! rows, each asking for a `workspace:write_file` call) against a fake OpenAI-compatible
//! server answering after small random delays. After each kill every file under `runs/` is
//! whole (JSON parses, JSON lines parse line by line, each note has all its lines, nothing
//! of an unknown kind), `trellis runs list` and `runs show` work and call a step left
//! `running` `interrupted`; the next run starts over the leftovers (removing the temp files
//! of the writes the kill cut short), and a last one completes and leaves no temp file under
//! `runs/`, nor one of its own elsewhere. At least half the kills must land while a run is
//! going, and at least one must leave the step running: a loop whose kills all came too
//! late would prove nothing.
//!
//! Delays and kill moments come from one seeded generator. The loop runs for a fixed list
//! of seeds and one random seed, printed; `TRELLIS_KILL_LOOP_SEED=N` runs seed N alone (the
//! kills land at the same offsets; where they land in the run still depends on the
//! machine's speed).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_llm::{FakeServer, completion};
use support::workspace::{create_db, write_files};

const STEP: &str = "work";
const KILLS: usize = 20;
/// How long one run may take before the test fails instead of hanging.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

/// SplitMix64: a tiny seeded generator, so a failing seed replays without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
}

/// Seeds every run of the test goes through.
const SEEDS: [u64; 2] = [7, 1_000_003];

/// The seeds of this run: `TRELLIS_KILL_LOOP_SEED` alone, or [`SEEDS`] and a random one.
fn seeds() -> Vec<u64> {
    match std::env::var("TRELLIS_KILL_LOOP_SEED") {
        Ok(s) => vec![s.parse().expect("TRELLIS_KILL_LOOP_SEED is a number")],
        Err(_) => {
            let random = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            eprintln!(
                "kill loop random seed {random} (TRELLIS_KILL_LOOP_SEED={random} replays it)"
            );
            SEEDS.iter().copied().chain([random]).collect()
        }
    }
}

/// A server that answers a user turn with a `write_file` call (a file per turn, a few KB, so
/// writes take a while) and a tool result with text, each after 2 to 50 ms.
fn server(rng: Arc<Mutex<Rng>>) -> FakeServer {
    FakeServer::start(Box::new(move |body| {
        let delay = rng.lock().unwrap().range(2, 50);
        std::thread::sleep(Duration::from_millis(delay));
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let turn = messages.iter().filter(|m| m["role"] == "user").count();
        match messages.last() {
            Some(m) if m["role"] == "user" => {
                let args = json!({
                    "path": format!("runs/iteration-0/execution/{STEP}/note-{turn}.md"),
                    "content": format!("turn {turn}\n").repeat(400),
                });
                (200, completion("", &[("workspace__write_file", args)]))
            }
            _ => (200, completion(&format!("done {turn}"), &[])),
        }
    }))
}

/// One step of three user turns and a foreach over four rows.
fn workspace(root: &Path, server: &FakeServer) {
    let items = json!([
        {"id": "a", "type": "user_message", "message": "Write the first note."},
        {"id": "b", "type": "user_message", "message": "Write the second note."},
        {"id": "each", "type": "foreach", "source_sql": "SELECT x FROM t ORDER BY x",
         "message": "Write a note on row {{.x}}."},
        {"id": "c", "type": "user_message", "message": "Write the last note."},
    ]);
    let plan = json!({"objective": "crash safety", "steps": [
        {"id": STEP, "type": "message_sequence", "title": "Work",
         "description": "You write notes.", "items": items}]});
    write_files(
        root,
        &[
            ("planning/plan.json", plan.to_string()),
            (
                "planning/step_config.json",
                json!({"steps": [{"id": STEP, "agent_configs":
                    {"selected_tools": ["workspace:write_file"]}}]})
                .to_string(),
            ),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": server.providers()})
                .to_string(),
            ),
        ],
    );
    create_db(
        root,
        "CREATE TABLE t(x); INSERT INTO t VALUES (1), (2), (3), (4);",
    );
}

use crate::support::plugin_build::text;

fn spawn_run(root: &Path) -> Child {
    // The operator approves loopback, where the workspace's fake LLM is.
    support::trellis_command(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the trellis binary runs")
}

/// Waits for `child`, killing it and failing the test past [`RUN_DEADLINE`].
fn wait_bounded(mut child: Child, seed: u64) -> Output {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > RUN_DEADLINE {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "seed {seed}: a run took more than {RUN_DEADLINE:?}\n{}\n{}",
                text(&out.stdout),
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().unwrap()
}

/// Every file under `dir` whose name ends with `suffix` (no links followed).
fn files_ending(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let kind = entry.file_type().unwrap();
        let path = entry.path();
        if kind.is_dir() {
            files_ending(&path, suffix, out);
        } else if path.to_string_lossy().ends_with(suffix) {
            out.push(path);
        }
    }
}

/// Panics unless the file `path` (under `runs/`, not a temp file) is whole: JSON that parses,
/// JSON lines that each parse, a note with every line the model asked for.
fn check_whole(path: &Path, context: &str) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    assert!(
        meta.is_file(),
        "{context}: {} is not a regular file",
        path.display()
    );
    let bytes = std::fs::read(path).unwrap();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let broken = |why: String| -> ! {
        panic!(
            "{context}: {} is not whole ({why}): {} bytes",
            path.display(),
            bytes.len()
        )
    };
    if name.ends_with(".json") {
        if let Err(e) = serde_json::from_slice::<Value>(&bytes) {
            broken(e.to_string());
        }
    } else if name.ends_with(".jsonl") {
        if !bytes.is_empty() && !bytes.ends_with(b"\n") {
            broken("the last line is cut".into());
        }
        for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
            if !line.is_empty()
                && let Err(e) = serde_json::from_slice::<Value>(line)
            {
                broken(format!("line {}: {e}", i + 1));
            }
        }
    } else if let Some(turn) = name
        .strip_prefix("note-")
        .and_then(|rest| rest.strip_suffix(".md"))
    {
        if bytes != format!("turn {turn}\n").repeat(400).as_bytes() {
            broken("not the 400 lines written".into());
        }
    } else {
        panic!(
            "{context}: {} is of no kind this test knows how to check",
            path.display()
        );
    }
}

/// Whether `path` is the temp file of a write cut short: the store's `.trellis-*.tmp`, or
/// the `.<name>.<random>.trellis-tmp` of a tool's write.
fn is_temp(path: &Path) -> bool {
    let name = path.to_string_lossy();
    name.ends_with(".tmp") || name.ends_with(".trellis-tmp")
}

/// Every file under `dir`, temp files aside.
fn every_file(dir: &Path, out: &mut Vec<PathBuf>) {
    files_ending(dir, "", out);
    out.retain(|p| !is_temp(p));
}

/// The temp files under `dir`.
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    files_ending(dir, "", &mut out);
    out.retain(|p| is_temp(p));
    out
}

fn status_of(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    let value: Value = serde_json::from_slice(&bytes).ok()?;
    value["status"].as_str().map(str::to_string)
}

/// What one kill left; panics on anything unreadable.
struct Leftovers {
    /// Names of the temp files of cut-short writes ([`is_temp`]) in the workspace.
    temp_files: Vec<String>,
    interrupted: bool,
}

fn check_after_kill(root: &Path, seed: u64, kill: usize) -> Leftovers {
    let context = format!("seed {seed}, kill {kill}");
    let mut files = Vec::new();
    every_file(&root.join("runs"), &mut files);
    for path in &files {
        check_whole(path, &context);
    }
    let temp_files = temp_files(root);

    let ws = root.to_str().unwrap();
    let listed = support::trellis(&["runs", "list", ws]);
    let stdout = text(&listed.stdout);
    assert!(
        listed.status.success(),
        "{context}: runs list failed\n{stdout}\n{}",
        text(&listed.stderr)
    );
    let step_dir = root.join(format!("runs/iteration-0/execution/{STEP}"));
    let running = status_of(&step_dir.join("session.json")).as_deref() == Some("running")
        && !step_dir.join("execution-final-summary.json").exists();
    if running {
        let line = stdout
            .lines()
            .find(|l| l.starts_with("iteration-0:"))
            .unwrap_or_else(|| panic!("{context}: no iteration-0 line\n{stdout}"));
        assert!(
            line.contains(&format!("{STEP} interrupted")),
            "{context}: a step left running is not shown interrupted\n{stdout}"
        );
    }
    if step_dir.is_dir() {
        let shown = support::trellis(&["runs", "show", ws, STEP]);
        let out = text(&shown.stdout);
        assert!(
            shown.status.success(),
            "{context}: runs show failed\n{out}\n{}",
            text(&shown.stderr)
        );
        if running {
            assert!(out.contains("status: interrupted"), "{context}: {out}");
        }
    }
    Leftovers {
        temp_files: temp_files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect(),
        interrupted: running,
    }
}

#[test]
fn killed_runs_leave_readable_files_and_the_next_run_completes() {
    for seed in seeds() {
        kill_loop(seed);
    }
}

fn kill_loop(seed: u64) {
    let rng = Arc::new(Mutex::new(Rng(seed)));
    let server = server(rng.clone());
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    workspace(root, &server);
    let started = Instant::now();

    // Two whole runs first: both must complete, and the shorter spreads the kills over a run
    // (the first can be slow for reasons of its own, a cold compile cache or a busy machine,
    // and kills spread over a run longer than the later ones would land after them).
    let mut whole = Duration::MAX;
    for _ in 0..2 {
        let t0 = Instant::now();
        let out = wait_bounded(spawn_run(root), seed);
        whole = whole.min(t0.elapsed());
        assert!(
            out.status.success(),
            "seed {seed}: a whole run failed\n{}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    assert!(
        server.seen().len() >= 28,
        "seed {seed}: two runs of 7 turns of 2 calls"
    );

    let (mut mid_write, mut interrupted, mut landed) = (0, 0, 0);
    let mut temp_names = std::collections::HashSet::new();
    for kill in 0..KILLS {
        // Over the first two thirds of the shorter run: the fake model's delays are random,
        // so a later run can be much shorter than both whole ones (CI saw 9 of 20 kills land
        // with kills spread over all of a 1.1 s run).
        let span = (whole.as_micros() as u64).saturating_mul(2) / 3;
        let at = Duration::from_micros(rng.lock().unwrap().range(0, span.max(1)));
        let mut child = spawn_run(root);
        let spawned = Instant::now();
        while spawned.elapsed() < at && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_micros(500));
        }
        // SIGKILL (a no-op when the run already ended).
        let _ = child.kill();
        let out = wait_bounded(child, seed);
        if out.status.code().is_none() {
            landed += 1;
        }
        let left = check_after_kill(root, seed, kill);
        // Temp files are named by process id and counter: new names are this kill's.
        let fresh: Vec<String> = left
            .temp_files
            .into_iter()
            .filter(|name| temp_names.insert(name.clone()))
            .collect();
        mid_write += usize::from(!fresh.is_empty());
        interrupted += usize::from(left.interrupted);
    }
    eprintln!(
        "kill loop seed {seed}: {landed} of {KILLS} kills landed in a run ({interrupted} left \
         the step running, {mid_write} cut a write short); a whole run {whole:?}"
    );
    assert!(
        landed * 2 >= KILLS,
        "seed {seed}: only {landed} of {KILLS} kills landed while a run was going"
    );
    assert!(
        interrupted > 0,
        "seed {seed}: no kill left the step running, so none tested an interrupted step"
    );

    let out = wait_bounded(spawn_run(root), seed);
    assert!(
        out.status.success(),
        "seed {seed}: the run after the kills failed\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let summary = root.join(format!(
        "runs/iteration-0/execution/{STEP}/execution-final-summary.json"
    ));
    assert_eq!(status_of(&summary).as_deref(), Some("completed"));
    let mut files = Vec::new();
    every_file(&root.join("runs"), &mut files);
    for path in &files {
        check_whole(path, &format!("seed {seed}, after the last run"));
    }
    // Each run removes the temp files the killed one before it left in the run folder
    // before archiving it, and the last run, which completed, leaves none of its own: no
    // temp file is left under runs/.
    assert_eq!(
        temp_files(&root.join("runs")),
        Vec::<PathBuf>::new(),
        "seed {seed}: temp files are left under runs/ after the last run"
    );
    // Elsewhere in the workspace, the last run leaves none of its own either.
    let left: Vec<PathBuf> = temp_files(root)
        .into_iter()
        .filter(|p| !temp_names.contains(&p.file_name().unwrap().to_string_lossy().into_owned()))
        .collect();
    assert_eq!(
        left,
        Vec::<PathBuf>::new(),
        "seed {seed}: the last run left temp files"
    );
    eprintln!("kill loop seed {seed}: the test {:?}", started.elapsed());
}
