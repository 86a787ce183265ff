//! The page of `trellis serve` in a real headless Chromium, driven through its WebDriver by
//! Selenium (tests/browser/page_test.py, in a virtual environment made here): a builder
//! message streams in and its new step appears in the graph, a step started from the page
//! shows its tool calls and its end, a second is stopped, and a run's human inputs are
//! answered in the executions panel. Screenshots (desktop and
//! narrow) go to `<target>/screenshots/`.

use crate::support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::json;
use support::fake_llm::{FakeServer, completion};
use support::serve::{DEMO_QUERY, Serve, demo};
use support::workspace::write_files;

/// The pinned Selenium release.
const SELENIUM_VERSION: &str = "4.27.1";

/// Where the build puts things: the target folder.
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_trellis"))
        .parent()
        .and_then(Path::parent)
        .expect("the target folder")
        .to_path_buf()
}

/// A python with Selenium, in `<target>/browser/venv` (made here when missing); `None`
/// without python3.
fn selenium_python() -> Option<PathBuf> {
    support::venv::python_with("browser", "selenium", SELENIUM_VERSION)
}

/// The first of `names` on `PATH`.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

/// A workflow of two agent steps on the fake model: `greet` lists its folder once and
/// answers, `slow` lists its folder again and again, slowly, until it is stopped.
fn agents_workspace(dir: &Path, llm: &FakeServer) -> PathBuf {
    let ws = dir.join("agents");
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "greet", "type": "regular", "title": "Greet", "description": "Say hi."},
                    {"id": "slow", "type": "regular", "title": "Slow", "description": "Take time."}
                ]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": llm.providers()})
                .to_string(),
            ),
        ],
    );
    ws
}

/// A workflow of two `human_input` steps: a yes/no question whose yes goes on to a question
/// with a text answer; and a disabled schedule.
fn ask_workspace(dir: &Path) -> PathBuf {
    let ws = dir.join("ask");
    write_files(
        &ws,
        &[
            (
                "planning/plan.json",
                json!({"objective": "o", "steps": [
                    {"id": "approve", "type": "human_input", "title": "Approve",
                     "question": "Ship it?", "response_type": "yesno",
                     "if_yes_next_step_id": "name", "if_no_next_step_id": "end"},
                    {"id": "name", "type": "human_input", "title": "Name",
                     "question": "Release name?", "variable_name": "release"}
                ]})
                .to_string(),
            ),
            ("planning/step_config.json", r#"{"steps": []}"#.to_string()),
            (
                "workflow.json",
                json!({"schedules": [{"id": "nightly", "name": "Nightly",
                                      "cron_expression": "0 2 * * *", "enabled": false}]})
                .to_string(),
            ),
        ],
    );
    ws
}

#[test]
fn the_page_streams_the_builder_updates_the_graph_and_runs_and_stops_executions() {
    let (Some(chromium), Some(driver)) = (
        on_path(&["chromium", "chromium-browser", "google-chrome"]),
        on_path(&["chromedriver"]),
    ) else {
        support::skip(
            "Chromium and its driver are not installed (Debian: chromium chromium-driver)",
        );
        return;
    };
    let Some(python) = selenium_python() else {
        support::skip("python3 is not installed, so Selenium cannot run");
        return;
    };
    let llm = FakeServer::start(Box::new(|body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let system = messages[0]["content"].as_str().unwrap_or_default();
        let answered = messages.iter().any(|m| m["role"] == "tool");
        // Each step lists its own output folder.
        let list = |step: &str| {
            let path = format!("runs/iteration-0/execution/{step}");
            completion("", &[("workspace__list_dir", json!({ "path": path }))])
        };
        if system.contains("Take time.") {
            std::thread::sleep(std::time::Duration::from_millis(400));
            (200, list("slow"))
        } else if answered {
            (200, completion("Hi. STATUS: COMPLETED", &[]))
        } else {
            (200, list("greet"))
        }
    }));
    let dir = tempfile::tempdir().unwrap();
    let demo_ws = demo(dir.path());
    let agents_ws = agents_workspace(dir.path(), &llm);
    let demo_server = Serve::start(&demo_ws, None, &[]);
    let agents_server = Serve::start(&agents_ws, None, &["--allow-host", "127.0.0.1"]);
    let ask_server = Serve::start(&ask_workspace(dir.path()), None, &[]);
    let shots = target_dir().join("screenshots");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/page_test.py");
    let mut child = Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input = json!({
        "demo": format!("http://127.0.0.1:{}/", demo_server.port),
        "agents": format!("http://127.0.0.1:{}/", agents_server.port),
        "ask": format!("http://127.0.0.1:{}/", ask_server.port),
        "screenshots": shots,
        "query": DEMO_QUERY,
        "chromium": chromium,
        "driver": driver,
    });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the page did not do what it should:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for shot in [
        "desktop-builder.png",
        "narrow-builder.png",
        "desktop-executions.png",
        "desktop-input.png",
    ] {
        assert!(shots.join(shot).is_file(), "{shot} in {}", shots.display());
    }
}
