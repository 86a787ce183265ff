//! Loading third-party plugins: good folders load, and every kind of bad one
//! gets an error naming the file and what is wrong.

mod support;

use support::{engine, plugin_folder};
use trellis_host::PluginRegistry;

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
