//! Adversarial plugins against the sandbox: each attack must end in a clear
//! error or denial, the host must keep serving calls, and nothing outside the
//! grant may change (the whole tree is hashed before and after).

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use support::{registry_with_adversary, tree_digest};
use trellis_host::{Grant, Limits, PluginRegistry, ToolCallError};

/// A tree with granted folders, a file outside the grant inside the same
/// parent, a file fully outside, and symlinks that point out of the grant.
struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for folder in ["ws/granted/sub", "ws/ro", "outside"] {
            std::fs::create_dir_all(root.join(folder)).unwrap();
        }
        std::fs::write(root.join("ws/granted/inside.txt"), "inside").unwrap();
        std::fs::write(root.join("ws/ro/keep.txt"), "read-only content").unwrap();
        std::fs::write(root.join("ws/secret.txt"), "workspace secret").unwrap();
        std::fs::write(root.join("outside/secret.txt"), "outside secret").unwrap();
        std::os::unix::fs::symlink(
            root.join("outside/secret.txt"),
            root.join("ws/granted/link"),
        )
        .unwrap();
        std::os::unix::fs::symlink(root.join("outside"), root.join("ws/granted/dirlink")).unwrap();
        World { dir }
    }

    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(rel)
    }

    fn grant(&self) -> Grant {
        Grant::none()
            .write(self.path("ws/granted"), "/granted")
            .unwrap()
            .read(self.path("ws/ro"), "/ro")
            .unwrap()
    }

    /// Digest of everything except the read-write grant, which calls may change.
    fn outside_grant(&self) -> std::collections::BTreeMap<String, String> {
        let mut digest = tree_digest(self.dir.path());
        digest.retain(|k, _| {
            !k.starts_with("ws/granted/") || k == "ws/granted/link" || k == "ws/granted/dirlink"
        });
        digest
    }
}

/// Generous deadline for attacks that must end some other way (a loaded CI
/// machine must not turn a memory error into a timeout); the loop test sets its own.
fn limits() -> Limits {
    Limits {
        memory_bytes: 64 << 20,
        timeout: Duration::from_secs(20),
        output_bytes: 1 << 20,
        stdio_bytes: 16 << 10,
    }
}

async fn call(
    registry: &PluginRegistry,
    tool: &str,
    args: Value,
    grant: &Grant,
) -> Result<Value, ToolCallError> {
    registry
        .call_tool(&format!("adversary:{tool}"), &args, grant, &limits())
        .await
}

/// The host still serves a normal call after an attack.
async fn still_serving(registry: &PluginRegistry) {
    let echoed = call(registry, "echo", json!({"value": "after"}), &Grant::none())
        .await
        .expect("the host serves the next call");
    assert_eq!(echoed, json!("after"));
}

fn assert_refused(result: Result<Value, ToolCallError>, what: &str) -> ToolCallError {
    match result {
        Ok(value) => panic!("{what}: expected a denial, got {value}"),
        Err(err) => {
            assert!(
                matches!(err, ToolCallError::Tool { .. }),
                "{what}: expected a tool error value, got {err:?}"
            );
            err
        }
    }
}

#[tokio::test]
async fn reading_outside_the_grant_is_denied() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let before = tree_digest(world.dir.path());
    let grant = world.grant();

    let attempts = [
        "/granted/../secret.txt",
        "/granted/../../outside/secret.txt",
        "/granted/sub/../../../outside/secret.txt",
        "/etc/passwd",
        "/secret.txt",
        "../secret.txt",
        "secret.txt",
        &world.path("outside/secret.txt").display().to_string(),
        "/granted/link",
        "/granted/dirlink/secret.txt",
    ];
    for path in attempts {
        let err = assert_refused(
            call(&registry, "read", json!({"path": path}), &grant).await,
            path,
        );
        let text = err.to_string();
        assert!(
            !text.contains("workspace secret") && !text.contains("outside secret"),
            "{path}: leaked {text}"
        );
    }
    // The grant itself works.
    let inside = call(
        &registry,
        "read",
        json!({"path": "/granted/inside.txt"}),
        &grant,
    )
    .await
    .unwrap();
    assert_eq!(inside, json!("inside"));

    assert_eq!(tree_digest(world.dir.path()), before);
    still_serving(&registry).await;
}

#[tokio::test]
async fn writing_outside_the_grant_or_into_a_read_only_grant_is_denied() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let before = world.outside_grant();
    let grant = world.grant();

    for path in [
        "/ro/keep.txt",
        "/ro/new.txt",
        "/granted/../escape.txt",
        "/granted/../../outside/escape.txt",
        "/granted/link",
        "/granted/dirlink/escape.txt",
        "/escape.txt",
        "/tmp/escape.txt",
    ] {
        assert_refused(
            call(
                &registry,
                "write",
                json!({"path": path, "content": "pwned"}),
                &grant,
            )
            .await,
            path,
        );
    }
    assert_eq!(
        world.outside_grant(),
        before,
        "nothing outside the read-write grant changed"
    );
    assert_eq!(
        std::fs::read_to_string(world.path("outside/secret.txt")).unwrap(),
        "outside secret"
    );

    // Writing inside the read-write grant works, and lands where expected.
    call(
        &registry,
        "write",
        json!({"path": "/granted/new.txt", "content": "ok"}),
        &grant,
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(world.path("ws/granted/new.txt")).unwrap(),
        "ok"
    );
    still_serving(&registry).await;
}

#[tokio::test]
async fn listing_shows_only_granted_folders() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let grant = world.grant();
    assert_refused(
        call(&registry, "list", json!({"path": "/"}), &grant).await,
        "list /",
    )
    .to_string();
    let listed = call(&registry, "list", json!({"path": "/granted"}), &grant)
        .await
        .unwrap();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(names.contains(&"inside.txt"), "{names:?}");
    assert_refused(
        call(&registry, "list", json!({"path": "/granted/.."}), &grant).await,
        "list ..",
    );
}

#[tokio::test]
async fn no_environment_and_no_arguments_reach_the_guest() {
    // The test process has PATH, HOME and the rest: none of it may reach the guest.
    let path = std::env::var("PATH").expect("PATH is set");
    let registry = registry_with_adversary().await;
    let result = call(&registry, "env", json!({}), &Grant::none())
        .await
        .unwrap();
    assert_eq!(result["vars"], json!({}), "{result}");
    assert!(result["args"].as_array().unwrap().is_empty(), "{result}");
    assert!(!result.to_string().contains(&path));
}

#[tokio::test]
async fn sockets_cannot_be_opened() {
    let registry = registry_with_adversary().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();

    let err = assert_refused(
        call(&registry, "connect", json!({"addr": addr}), &Grant::none()).await,
        "connect",
    );
    assert!(!err.to_string().is_empty());
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the guest reached the listener"
    );
    still_serving(&registry).await;
}

#[tokio::test]
async fn an_infinite_loop_times_out() {
    let registry = registry_with_adversary().await;
    let limits = Limits {
        timeout: Duration::from_millis(500),
        ..limits()
    };
    let err = registry
        .call_tool("adversary:spin", &json!({}), &Grant::none(), &limits)
        .await
        .unwrap_err();
    assert!(matches!(err, ToolCallError::Timeout { .. }), "{err:?}");
    assert!(err.to_string().contains("timed out after 500ms"), "{err}");
    still_serving(&registry).await;
}

#[tokio::test]
async fn a_memory_bomb_hits_the_memory_limit() {
    let registry = registry_with_adversary().await;
    let err = call(&registry, "memory_bomb", json!({}), &Grant::none())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ToolCallError::MemoryLimit { limit, .. } if limit == 64 << 20),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("memory limit of 67108864 bytes exceeded"),
        "{err}"
    );
    still_serving(&registry).await;
}

#[tokio::test]
async fn deep_recursion_is_stopped() {
    let registry = registry_with_adversary().await;
    let err = call(
        &registry,
        "recurse",
        json!({"depth": 100_000_000u64}),
        &Grant::none(),
    )
    .await
    .unwrap_err();
    // Rust guests keep their stack in linear memory: overflowing it is an out-of-bounds
    // access; guests whose frames live on the wasm stack hit the engine's stack limit.
    match &err {
        ToolCallError::StackOverflow { .. } => {}
        ToolCallError::Crashed { message, .. } => {
            assert!(message.contains("out of bounds memory access"), "{message}");
            assert!(
                message.contains("stack overflow"),
                "the error names the likely cause: {message}"
            );
        }
        other => panic!("expected a stack error, got {other:?}"),
    }
    // Shallow recursion is fine: the limit is the stack, not recursion as such.
    call(&registry, "recurse", json!({"depth": 100}), &Grant::none())
        .await
        .unwrap();
    still_serving(&registry).await;
}

#[tokio::test]
async fn a_huge_result_is_refused() {
    let registry = registry_with_adversary().await;
    let err = call(
        &registry,
        "huge_output",
        json!({"bytes": 8 << 20}),
        &Grant::none(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, ToolCallError::OutputTooLarge { limit, .. } if limit == 1 << 20),
        "{err:?}"
    );
    still_serving(&registry).await;
}

#[tokio::test]
async fn a_panic_is_reported_with_its_message() {
    let registry = registry_with_adversary().await;
    let err = call(
        &registry,
        "panic",
        json!({"message": "boom from the guest"}),
        &Grant::none(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ToolCallError::Crashed { .. }), "{err:?}");
    assert!(err.to_string().contains("boom from the guest"), "{err}");
    still_serving(&registry).await;
}

#[tokio::test]
async fn flooding_stderr_is_capped_not_fatal() {
    let registry = registry_with_adversary().await;
    let result = call(
        &registry,
        "stderr_flood",
        json!({"bytes": 8 << 20}),
        &Grant::none(),
    )
    .await;
    assert!(result.is_ok(), "{result:?}");
    still_serving(&registry).await;
}

#[tokio::test]
async fn the_workflow_db_is_reached_only_through_the_grant() {
    let registry = registry_with_adversary().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.sqlite");
    drop(rusqlite_setup(&db));
    let before = tree_digest(dir.path());

    let none = call(
        &registry,
        "db_query",
        json!({"sql": "SELECT 1"}),
        &Grant::none(),
    )
    .await;
    assert!(
        format!("{none:?}").contains("not-granted") || format!("{none:?}").contains("NotGranted"),
        "{none:?}"
    );

    let read_only = Grant::none().with_db(&db, false);
    let rows = call(
        &registry,
        "db_query",
        json!({"sql": "SELECT name FROM t ORDER BY name"}),
        &read_only,
    )
    .await
    .unwrap();
    assert_eq!(rows, json!([{"name": "a"}, {"name": "b"}]));
    for sql in [
        "INSERT INTO t VALUES ('c')",
        "DELETE FROM t",
        "DROP TABLE t",
    ] {
        let refused = call(&registry, "db_execute", json!({"sql": sql}), &read_only).await;
        assert!(
            format!("{refused:?}").to_lowercase().contains("read"),
            "{sql}: {refused:?}"
        );
        let refused = call(&registry, "db_query", json!({"sql": sql}), &read_only).await;
        assert!(
            format!("{refused:?}").to_lowercase().contains("read"),
            "{sql}: {refused:?}"
        );
    }
    assert_eq!(
        tree_digest(dir.path()),
        before,
        "a read-only grant changed the db"
    );

    let writable = Grant::none().with_db(&db, true);
    let changed = call(
        &registry,
        "db_execute",
        json!({"sql": "INSERT INTO t VALUES ('c')"}),
        &writable,
    )
    .await
    .unwrap();
    assert_eq!(changed, json!({"changed": 1}));
    let rows = call(
        &registry,
        "db_query",
        json!({"sql": "SELECT count(*) AS n FROM t"}),
        &writable,
    )
    .await
    .unwrap();
    assert_eq!(rows, json!([{"n": 3}]));
}

fn rusqlite_setup(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("CREATE TABLE t (name TEXT); INSERT INTO t VALUES ('a'), ('b');")
        .unwrap();
    conn
}
