//! Loading third-party plugins: good folders load, and every kind of bad one
//! gets an error naming the file and what is wrong. Hostile plugins (`hostile`
//! built from `tests/programs/guests/hostile`, some given extra memories or padding here)
//! attack each loading limit and end quickly in an error naming the plugin and the
//! limit, while the other plugins of the folder load and work.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::{engine, plugin_folder};
use trellis_sandbox::{Grant, Limits, PluginRegistry, ToolCallError};

async fn load_error(folder: &std::path::Path) -> String {
    let mut registry = PluginRegistry::with_bundled(engine()).await.unwrap();
    let err = registry.load_dir(folder).await.unwrap_err();
    format!("{err:#}")
}

#[tokio::test]
async fn a_plugin_folder_loads_and_lists_its_tools() {
    let dir = tempfile::tempdir().unwrap();
    plugin_folder(dir.path(), "adversary", "adversary", "tool");
    let mut registry = PluginRegistry::with_bundled(engine()).await.unwrap();
    let ids = registry.load_dir(dir.path()).await.unwrap();
    assert_eq!(ids, ["adversary"]);
    let plugin = registry.get("adversary").unwrap();
    let names: Vec<_> = plugin.tools().iter().map(|t| t.name.as_str()).collect();
    for expected in ["read", "write", "spin", "echo"] {
        assert!(names.contains(&expected), "{names:?}");
    }
    let bundled = registry.get("workspace").unwrap();
    assert_eq!(bundled.source().to_string(), "bundled");
}

#[tokio::test]
async fn a_component_of_the_wrong_world_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let folder = plugin_folder(dir.path(), "wrong_world", "notatool", "tool");
    let err = load_error(&folder).await;
    assert!(err.contains("wrong_world.wasm"), "{err}");
    assert!(
        err.contains("wrong world: the manifest says kind `tool`, so the component must implement world `tool-plugin` (export `trellis:plugin/tool@0.1.0`), but it exports trellis:plugin/validator@0.1.0"),
        "{err}"
    );
}

#[tokio::test]
async fn the_same_component_loads_under_its_real_world() {
    let dir = tempfile::tempdir().unwrap();
    let folder = plugin_folder(dir.path(), "wrong_world", "csvish", "validator");
    let mut registry = PluginRegistry::with_bundled(engine()).await.unwrap();
    registry.load_dir(&folder).await.unwrap();
    assert!(registry.get("csvish").unwrap().tools().is_empty());
}

#[tokio::test]
async fn bytes_that_are_not_a_component_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let folder = plugin_folder(dir.path(), "adversary", "broken", "tool");
    std::fs::write(folder.join("adversary.wasm"), b"\0asm garbage").unwrap();
    let err = load_error(&folder).await;
    assert!(
        err.contains("adversary.wasm: not a valid WebAssembly component"),
        "{err}"
    );
}

#[tokio::test]
async fn manifest_errors_name_the_file_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let folder = plugin_folder(dir.path(), "adversary", "adversary", "tool");
    let manifest = folder.join("plugin.json");
    let cases = [
        (
            r#"{"id":"x","kind":"tool","version":"1","description":"d","component":"missing.wasm"}"#,
            "component: cannot read",
        ),
        (
            r#"{"id":"x","kind":"tools","version":"1","description":"d","component":"adversary.wasm"}"#,
            "kind: unknown variant `tools`, expected one of `tool`, `validator`, `llm-provider`",
        ),
        (
            r#"{"id":"X Y","kind":"tool","version":"1","description":"d","component":"adversary.wasm"}"#,
            "id: expected 1-64 characters",
        ),
        (
            r#"{"id":"x","kind":"tool","version":"1","description":"d","component":"adversary.wasm","extra":true}"#,
            "unknown field `extra`",
        ),
        (r#"{"id": "x", "#, "EOF while parsing"),
    ];
    for (text, expected) in cases {
        std::fs::write(&manifest, text).unwrap();
        let err = load_error(&folder).await;
        assert!(
            err.contains(&manifest.display().to_string()),
            "{text}: {err}"
        );
        assert!(
            err.contains(expected),
            "{text}: expected {expected:?} in {err}"
        );
    }
}

#[tokio::test]
async fn ids_must_be_unique() {
    let dir = tempfile::tempdir().unwrap();
    let folder = plugin_folder(dir.path(), "adversary", "workspace", "tool");
    let err = load_error(&folder).await;
    assert!(
        err.contains("plugin id `workspace` is already taken by bundled"),
        "{err}"
    );
}

#[tokio::test]
async fn an_empty_folder_says_what_it_expected() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_error(dir.path()).await;
    assert!(
        err.contains("no plugin.json here or in its subfolders"),
        "{err}"
    );
}

// Hostile plugins: each attack on loading ends quickly in an error naming the plugin
// and the limit, and the other plugins of the same folder load and work.

/// The `hostile` test component with its mode marker set to `mode` (see its source).
fn hostile_component(mode: &str) -> Vec<u8> {
    let mut bytes = std::fs::read(trellis_test_programs::path("hostile")).unwrap();
    let marker = b"HOSTILE_MODE=ok                 ";
    let found: Vec<usize> = bytes
        .windows(marker.len())
        .enumerate()
        .filter(|(_, w)| w == marker)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "the mode marker appears once in the component"
    );
    let mut patched = format!("HOSTILE_MODE={mode}").into_bytes();
    assert!(patched.len() <= marker.len());
    patched.resize(marker.len(), b' ');
    bytes[found[0]..found[0] + marker.len()].copy_from_slice(&patched);
    bytes
}

/// A plugin folder `parent/id` holding `component` as a tool plugin.
fn tool_folder(parent: &Path, id: &str, component: &[u8]) -> PathBuf {
    let folder = parent.join(id);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("plugin.wasm"), component).unwrap();
    std::fs::write(
        folder.join("plugin.json"),
        serde_json::json!({
            "id": id, "kind": "tool", "version": "0.1.0",
            "description": "hostile test plugin", "component": "plugin.wasm",
        })
        .to_string(),
    )
    .unwrap();
    folder
}

/// Loads a folder holding the `adversary` plugin and a hostile plugin `id`; returns
/// the hostile one's error, after checking the adversary loaded and answers.
async fn hostile_load_error(id: &str, component: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    plugin_folder(dir.path(), "adversary", "adversary", "tool");
    tool_folder(dir.path(), id, component);
    let mut registry = PluginRegistry::with_bundled(engine()).await.unwrap();
    let outcomes = registry.load_dir_each(dir.path()).await.unwrap();
    assert_eq!(outcomes.len(), 2);
    let mut error = None;
    for outcome in outcomes {
        match outcome.result {
            Ok(loaded) => assert_eq!(loaded, "adversary"),
            Err(err) => error = Some(format!("{err:#}")),
        }
    }
    let error = error.expect("the hostile plugin was refused");
    assert!(registry.get(id).is_none());
    let echoed = registry
        .call_tool(
            "adversary:echo",
            &serde_json::json!({"value": 7}),
            &Grant::none(),
            &Limits::default(),
        )
        .await
        .unwrap();
    assert_eq!(echoed, 7);
    // `load_dir` loads the good one too and fails naming the bad one.
    let mut registry = PluginRegistry::with_bundled(engine()).await.unwrap();
    let err = format!("{:#}", registry.load_dir(dir.path()).await.unwrap_err());
    assert!(err.contains(&format!("loading plugin `{id}`")), "{err}");
    assert!(registry.get("adversary").is_some());
    error
}

#[tokio::test]
async fn a_nested_ref_schema_is_refused_at_load() {
    let err = hostile_load_error("refbomb", &hostile_component("ref_bomb")).await;
    assert!(err.contains("loading plugin `refbomb`"), "{err}");
    assert!(
        err.contains(
            "list-tools: tool `lookup`: input-schema expands to more than 10000 schemas when its `$ref`s are followed"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_deep_argument_check_ends_without_listing_every_failed_branch() {
    let dir = tempfile::tempdir().unwrap();
    tool_folder(dir.path(), "recursive", &hostile_component("recursive"));
    let mut registry = PluginRegistry::with_bundled(engine()).await.unwrap();
    registry.load_dir(dir.path()).await.unwrap();
    // Both branches fail at the bottom: the check explores 2^depth paths.
    let mut tree = serde_json::json!("leaf");
    for _ in 0..28 {
        tree = serde_json::json!([tree]);
    }
    let limits = Limits {
        timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let started = Instant::now();
    let err = registry
        .call_tool(
            "recursive:tree",
            &serde_json::json!({"tree": tree}),
            &Grant::none(),
            &limits,
        )
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(20));
    // The yes/no check is quick; listing the problems of arguments this deep would build
    // every failed branch (gigabytes, still growing after the deadline), so it is not done.
    assert_eq!(
        err.to_string(),
        "recursive:tree: invalid arguments: they do not match the tool's schema (they nest 30 levels deep; the problems are listed only for arguments up to 12 levels)"
    );
    // Shallow arguments are checked as usual.
    let err = registry
        .call_tool(
            "recursive:tree",
            &serde_json::json!({"tree": "leaf"}),
            &Grant::none(),
            &limits,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, ToolCallError::InvalidArguments { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn an_argument_check_past_the_deadline_is_given_up() {
    let dir = tempfile::tempdir().unwrap();
    tool_folder(dir.path(), "wide", &hostile_component("wide_schema"));
    let mut registry = PluginRegistry::with_bundled(engine()).await.unwrap();
    registry.load_dir(dir.path()).await.unwrap();
    // Valid rows, each matching only the last of the 3,000 branches: the check tries every
    // branch for every row (300 million tries, 1.6 s on a core of a CI machine, thirty times
    // the deadline), and it would answer `Ok` if it were waited for.
    let rows = serde_json::json!({"rows": vec![2_999; 100_000]});
    let limits = Limits {
        timeout: Duration::from_millis(50),
        ..Limits::default()
    };
    // A bound that only tells a hang (a check waited for) from an answer.
    let err = tokio::time::timeout(
        Duration::from_secs(120),
        registry.call_tool("wide:pick", &rows, &Grant::none(), &limits),
    )
    .await
    .expect("the call came back")
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "wide:pick: invalid arguments: checking them against the tool's schema did not finish \
         within the call's deadline of 50ms"
    );
    // The abandoned check keeps its thread; the next check gets another one (2,000 rows go
    // to a checker thread too) and the call reaches the plugin.
    let called = registry
        .call_tool(
            "wide:pick",
            &serde_json::json!({"rows": vec![0; 2_000]}),
            &Grant::none(),
            &Limits::default(),
        )
        .await
        .unwrap();
    assert_eq!(called, serde_json::json!({"called": "pick"}));
}

#[tokio::test]
async fn a_plugin_with_too_many_tools_is_refused() {
    let err = hostile_load_error("manytools", &hostile_component("many_tools")).await;
    assert!(err.contains("loading plugin `manytools`"), "{err}");
    assert!(
        err.contains("list-tools: 80000 tools, over the limit of 256 per plugin"),
        "{err}"
    );
}

#[tokio::test]
async fn a_huge_list_tools_answer_is_refused() {
    let err = hostile_load_error("hugelist", &hostile_component("huge_description")).await;
    assert!(err.contains("loading plugin `hugelist`"), "{err}");
    assert!(
        err.contains("list-tools: the answer is 8388628 bytes, over the limit of 1048576"),
        "{err}"
    );
}

#[tokio::test]
async fn an_oversized_component_is_refused_before_it_is_read() {
    // A valid component made 65 MiB by a custom section.
    let mut component = hostile_component("ok");
    let padding = (65 << 20) - component.len();
    component.push(0);
    let name = b"padding";
    let mut size = padding + name.len() + 1;
    loop {
        let byte = (size & 0x7f) as u8;
        size >>= 7;
        if size == 0 {
            component.push(byte);
            break;
        }
        component.push(byte | 0x80);
    }
    component.push(name.len() as u8);
    component.extend_from_slice(name);
    component.resize(component.len() + padding, 0);
    let err = hostile_load_error("oversized", &component).await;
    assert!(err.contains("loading plugin `oversized`"), "{err}");
    assert!(
        err.contains(&format!(
            "the component is {} bytes, over the limit of 67108864 bytes (64 MiB)",
            component.len()
        )),
        "{err}"
    );
}

/// Appends to a component a core module with one memory of `pages` 64 KiB pages,
/// instantiated `copies` times: that many more linear memories in one instance.
fn with_memories(component: &[u8], copies: usize, pages: u32) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    // Top-level core modules so far: the new one gets the next index.
    let mut modules = 0;
    let mut at = 8;
    while at < component.len() {
        let id = component[at];
        let (mut size, mut shift, mut i) = (0usize, 0, at + 1);
        loop {
            let byte = component[i];
            size |= usize::from(byte & 0x7f) << shift;
            shift += 7;
            i += 1;
            if byte & 0x80 == 0 {
                break;
            }
        }
        if id == 1 {
            modules += 1;
        }
        at = i + size;
    }
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    let mut memory = vec![1, 0];
    leb(pages as usize, &mut memory);
    module.push(5);
    leb(memory.len(), &mut module);
    module.extend_from_slice(&memory);

    let mut out = component.to_vec();
    out.push(1);
    leb(module.len(), &mut out);
    out.extend_from_slice(&module);
    let mut instances = Vec::new();
    leb(copies, &mut instances);
    for _ in 0..copies {
        instances.push(0);
        leb(modules, &mut instances);
        instances.push(0);
    }
    out.push(2);
    leb(instances.len(), &mut out);
    out.extend_from_slice(&instances);
    out
}

#[tokio::test]
async fn a_component_with_many_memories_is_refused() {
    let component = with_memories(&hostile_component("ok"), 20, 1);
    let err = hostile_load_error("memories", &component).await;
    assert!(err.contains("loading plugin `memories`"), "{err}");
    assert!(
        err.contains(": over a limit of this host")
            && err.contains("Wasm linear memories, which exceeds the configured maximum of 8"),
        "{err}"
    );
    // A hundred instances of it: over the cap on core instances first.
    let component = with_memories(&hostile_component("ok"), 100, 1);
    let err = hostile_load_error("instances", &component).await;
    assert!(err.contains("loading plugin `instances`"), "{err}");
    assert!(
        err.contains("core module instances, which exceeds the configured maximum of 64"),
        "{err}"
    );
}

#[tokio::test]
async fn the_memory_limit_covers_all_memories_of_an_instance() {
    // Four memories of 62.5 MiB: each under the 64 MiB load limit, together far over.
    let component = with_memories(&hostile_component("ok"), 4, 1000);
    let err = hostile_load_error("memhog", &component).await;
    assert!(err.contains("loading plugin `memhog`"), "{err}");
    assert!(
        err.contains("list-tools: stopped: memory limit of 67108864 bytes exceeded"),
        "{err}"
    );
    // The same component with small memories loads and works.
    let dir = tempfile::tempdir().unwrap();
    tool_folder(
        dir.path(),
        "memok",
        &with_memories(&hostile_component("ok"), 4, 1),
    );
    let mut registry = PluginRegistry::with_bundled(engine()).await.unwrap();
    registry.load_dir(dir.path()).await.unwrap();
    let pong = registry
        .call_tool(
            "memok:ping",
            &serde_json::json!({}),
            &Grant::none(),
            &Limits::default(),
        )
        .await
        .unwrap();
    assert_eq!(pong, "pong");
}

#[test]
fn plugins_list_shows_a_bad_plugin_with_its_error_and_the_others() {
    let dir = tempfile::tempdir().unwrap();
    plugin_folder(dir.path(), "adversary", "adversary", "tool");
    tool_folder(dir.path(), "manytools", &hostile_component("many_tools"));
    let folder = dir.path().to_str().unwrap();
    let output = support::trellis(&["plugins", "list", "--plugins", folder]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(stdout.contains("\nadversary "), "{stdout}");
    assert!(stdout.contains("\nworkspace "), "{stdout}");
    let manifest = dir.path().join("manytools/plugin.json");
    assert!(
        stdout.contains(&format!(
            "{}  error: loading plugin `manytools` from",
            manifest.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("80000 tools, over the limit of 256"),
        "{stdout}"
    );

    // A command that uses the plugins fails naming the bad one.
    let output = support::trellis(&[
        "tool",
        "call",
        "adversary:echo",
        "--args",
        r#"{"value": 1}"#,
        "--plugins",
        folder,
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("loading plugin `manytools`"), "{stderr}");
}

/// A plugin folder's files were read by following links and without bounds (round 12):
/// a FIFO as the component hung every command that loaded the folder (HIGH), a 2 GiB
/// `plugin.json` was read whole (2.1 GB of memory), and a `plugin.json` or component linked
/// to a file outside was read and its text printed. Each is refused now, naming the file,
/// and the folder's other plugins load.
#[test]
fn a_plugin_folders_files_are_read_without_links_fifos_or_unbounded_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    plugin_folder(&plugins, "adversary", "adversary", "tool");
    let good = std::fs::read(trellis_test_programs::path("adversary")).unwrap();

    let fifo = tool_folder(&plugins, "fifo", &good);
    std::fs::remove_file(fifo.join("plugin.wasm")).unwrap();
    let c = std::ffi::CString::new(fifo.join("plugin.wasm").to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");

    let big = tool_folder(&plugins, "big", &good);
    let manifest = std::fs::OpenOptions::new()
        .append(true)
        .open(big.join("plugin.json"))
        .unwrap();
    manifest.set_len(2 << 30).unwrap();

    let linked = tool_folder(&plugins, "linked", &good);
    std::fs::write(
        outside.join("other.json"),
        r#"{"id": "sk-OUTSIDE-SECRET-0123456789"}"#,
    )
    .unwrap();
    std::fs::remove_file(linked.join("plugin.json")).unwrap();
    std::os::unix::fs::symlink(outside.join("other.json"), linked.join("plugin.json")).unwrap();

    let hard = tool_folder(&plugins, "hard", &good);
    std::fs::write(outside.join("component.wasm"), &good).unwrap();
    std::fs::remove_file(hard.join("plugin.wasm")).unwrap();
    std::fs::hard_link(outside.join("component.wasm"), hard.join("plugin.wasm")).unwrap();
    // A plugin's own folder linked to one elsewhere (round 13, LOW).
    let elsewhere = tool_folder(&outside, "elsewhere", &good);
    std::os::unix::fs::symlink(&elsewhere, plugins.join("away")).unwrap();
    let before = support::tree_digest(&outside);

    let mut child =
        support::trellis_command(&["plugins", "list", "--plugins", plugins.to_str().unwrap()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(120) {
            let _ = child.kill();
            panic!("plugins list hangs on the plugin folder");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{said}");
    assert!(said.contains("\nadversary "), "{said}");
    for refusal in [
        "plugin.wasm is not a regular file",
        "plugin.json is 2147483648 bytes, more than the 1048576 Trellis reads",
        "plugin.json is a symbolic link; Trellis does not read or write through links",
        "plugin.wasm has other hard links",
    ] {
        assert!(said.contains(refusal), "{refusal:?} in {said}");
    }
    let away = format!(
        "{} is a symbolic link; Trellis does not read or write through links",
        plugins.join("away").display()
    );
    assert!(said.contains(&away), "{away:?} in {said}");
    assert!(
        !said.contains("\nelsewhere "),
        "the linked folder's plugin loaded: {said}"
    );
    assert!(!said.contains("sk-OUTSIDE-SECRET"), "{said}");
    assert_eq!(support::tree_digest(&outside), before);
}
