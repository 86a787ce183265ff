//! Adversarial plugins against the sandbox: each attack must end in a clear
//! error or denial, the host must keep serving calls, and nothing outside the
//! grant may change (the whole tree is hashed before and after).

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use support::{registry_with_adversary, tree_digest};
use trellis_sandbox::capabilities::{FsLimitExceeded, FsLimits};
use trellis_sandbox::plugins::ToolErrorKind;
use trellis_sandbox::{Grant, Limits, PluginRegistry, ToolCallError};

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
pub(crate) fn limits() -> Limits {
    Limits {
        memory_bytes: 64 << 20,
        timeout: Duration::from_secs(20),
        output_bytes: 1 << 20,
        stdio_bytes: 16 << 10,
        ..Limits::default()
    }
}

/// Calls tool `tool` of the `adversary` test component under `grant` and [`limits`].
pub(crate) async fn call(
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
pub(crate) async fn still_serving(registry: &PluginRegistry) {
    let echoed = call(registry, "echo", json!({"value": "after"}), &Grant::none())
        .await
        .expect("the host serves the next call");
    assert_eq!(echoed, json!("after"));
}

/// The call failed with a tool error value (not a crash, timeout or host error).
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

/// The call was refused with the adversary's raw WASI error code `code` (`EACCES`...): the
/// code the host's filesystem or sockets gave the guest, not a library's wording of it.
pub(crate) fn assert_code(result: Result<Value, ToolCallError>, what: &str, code: &str) {
    match assert_refused(result, what) {
        ToolCallError::Tool {
            kind: ToolErrorKind::Failed,
            message,
            ..
        } => assert_eq!(message, code, "{what}"),
        other => panic!("{what}: expected the code {code}, got {other:?}"),
    }
}

#[tokio::test]
async fn reading_outside_the_grant_is_denied() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let before = tree_digest(world.dir.path());
    let grant = world.grant();

    let host_path = world.path("outside/secret.txt").display().to_string();
    // `EPERM`: a path under a preopen that leaves it (cap-std stops the `..` or the link);
    // `ENOENT`: wasi-libc finds no preopen the path is under, so the host is not asked.
    let attempts = [
        ("/granted/../secret.txt", "EPERM"),
        ("/granted/../../outside/secret.txt", "EPERM"),
        ("/granted/sub/../../../outside/secret.txt", "EPERM"),
        ("/etc/passwd", "ENOENT"),
        ("/secret.txt", "ENOENT"),
        ("../secret.txt", "ENOENT"),
        ("secret.txt", "ENOENT"),
        (host_path.as_str(), "ENOENT"),
        ("/granted/link", "EPERM"),
        ("/granted/dirlink/secret.txt", "EPERM"),
    ];
    for (path, code) in attempts {
        let result = call(&registry, "read", json!({"path": path}), &grant).await;
        let text = format!("{result:?}");
        assert_code(result, path, code);
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

    // `EPERM` for a read-only folder (wasmtime-wasi and the guard) and for a way out of a
    // preopen (cap-std); `ENOENT` for a path under no preopen (wasi-libc).
    for (path, code) in [
        ("/ro/keep.txt", "EPERM"),
        ("/ro/new.txt", "EPERM"),
        ("/granted/../escape.txt", "EPERM"),
        ("/granted/../../outside/escape.txt", "EPERM"),
        ("/granted/link", "EPERM"),
        ("/granted/dirlink/escape.txt", "EPERM"),
        ("/escape.txt", "ENOENT"),
        ("/tmp/escape.txt", "ENOENT"),
    ] {
        assert_code(
            call(
                &registry,
                "write",
                json!({"path": path, "content": "pwned"}),
                &grant,
            )
            .await,
            path,
            code,
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
    assert_code(
        call(&registry, "list", json!({"path": "/"}), &grant).await,
        "list /",
        "ENOENT",
    );
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
    assert_code(
        call(&registry, "list", json!({"path": "/granted/.."}), &grant).await,
        "list ..",
        "EPERM",
    );
}

/// A guest reading its stdin gets end of file at once, with no byte: calls have no stdin,
/// whatever the host process's own stdin holds.
#[tokio::test]
async fn a_guest_reading_stdin_gets_end_of_file_and_no_byte() {
    let registry = registry_with_adversary().await;
    let read = call(&registry, "stdin", json!({}), &Grant::none())
        .await
        .unwrap();
    assert_eq!(read, json!({"bytes": 0, "read": ""}));
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

    assert_code(
        call(&registry, "connect", json!({"addr": addr}), &Grant::none()).await,
        "connect",
        "EACCES",
    );
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
    assert_eq!(result.unwrap(), json!({"written": 8 << 20}));
    // What the host keeps of it is 16 KiB (the limit): the head, a count of the rest, and
    // the tail, which ends with the panic message written after the flood.
    let err = call(
        &registry,
        "flood_and_panic",
        json!({"bytes": 8 << 20}),
        &Grant::none(),
    )
    .await
    .unwrap_err();
    let ToolCallError::Crashed { stderr, .. } = &err else {
        panic!("expected a crash, got {err:?}");
    };
    let (head, tail) = (12 << 10, 4 << 10);
    assert_eq!(stderr[..head], "e".repeat(head));
    let note = &stderr[head..];
    let (dropped, kept_tail) = note
        .strip_prefix("\n[... ")
        .and_then(|rest| rest.split_once(" bytes dropped: output is capped at 16384 bytes ...]\n"))
        .map(|(n, rest)| (n.parse::<usize>().unwrap(), rest))
        .unwrap_or_else(|| panic!("no count of dropped bytes in {note:?}"));
    // The rest of the flood went, the panic message after it stayed.
    assert_eq!(kept_tail.len(), tail, "{kept_tail}");
    assert!(dropped > (8 << 20) - head - tail, "{note}");
    assert!(kept_tail.contains("after the flood"), "{kept_tail}");
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
    assert_eq!(
        none.unwrap_err().to_string(),
        "adversary:db_query: failed: not-granted"
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
        assert_eq!(
            refused.unwrap_err().to_string(),
            "adversary:db_execute: failed: read-only: this turn has read-only access to the workflow db",
            "{sql}"
        );
        let refused = call(&registry, "db_query", json!({"sql": sql}), &read_only).await;
        assert_eq!(
            refused.unwrap_err().to_string(),
            "adversary:db_query: failed: read-only: query runs read-only statements only; use execute to modify the database",
            "{sql}"
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

/// A limit on one filesystem resource of a call, the others left at their defaults.
fn fs_limits(fs: FsLimits) -> Limits {
    Limits { fs, ..limits() }
}

fn assert_fs_limit(result: Result<Value, ToolCallError>, expected: FsLimitExceeded) {
    match result {
        Err(ToolCallError::FsLimit { exceeded, .. }) => assert_eq!(exceeded, expected),
        other => panic!("expected {expected:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn guests_cannot_make_links_of_any_kind() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let before = world.outside_grant();
    let grant = world.grant();
    for (tool, args) in [
        (
            "symlink",
            json!({"target": "../../outside", "link": "/granted/out"}),
        ),
        (
            "symlink",
            json!({"target": "inside.txt", "link": "/granted/in"}),
        ),
        (
            "hard_link",
            json!({"from": "/ro/keep.txt", "to": "/granted/keep.txt"}),
        ),
        (
            "hard_link",
            json!({"from": "/granted/inside.txt", "to": "/granted/twin.txt"}),
        ),
    ] {
        // The guard refuses `symlink-at` and `link-at` outright: `not-permitted`.
        assert_code(
            call(&registry, tool, args.clone(), &grant).await,
            &format!("{tool} {args}"),
            "EPERM",
        );
    }
    let mut granted = std::fs::read_dir(world.path("ws/granted"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect::<Vec<_>>();
    granted.sort();
    assert_eq!(granted, ["dirlink", "inside.txt", "link", "sub"]);
    assert_eq!(world.outside_grant(), before);
    still_serving(&registry).await;
}

#[tokio::test]
async fn renames_cannot_cross_from_a_read_only_grant_or_into_one() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let before = world.outside_grant();
    let grant = world.grant();
    for (from, to) in [
        ("/ro/keep.txt", "/granted/keep.txt"),
        ("/granted/inside.txt", "/ro/inside.txt"),
        ("/granted/inside.txt", "/granted/../moved.txt"),
    ] {
        assert_code(
            call(&registry, "rename", json!({"from": from, "to": to}), &grant).await,
            &format!("{from} -> {to}"),
            "EPERM",
        );
    }
    assert_eq!(world.outside_grant(), before);
    assert_eq!(
        std::fs::read_to_string(world.path("ws/granted/inside.txt")).unwrap(),
        "inside"
    );
    // Within the read-write grant a rename works.
    call(
        &registry,
        "rename",
        json!({"from": "/granted/inside.txt", "to": "/granted/sub/moved.txt"}),
        &grant,
    )
    .await
    .unwrap();
    assert!(world.path("ws/granted/sub/moved.txt").is_file());
}

#[tokio::test]
async fn filling_the_disk_stops_at_the_write_budget() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let before = world.outside_grant();
    let limits = fs_limits(FsLimits {
        write_bytes: 4 << 20,
        ..FsLimits::DEFAULT
    });
    let result = registry
        .call_tool(
            "adversary:fill",
            &json!({"path": "/granted/big", "bytes": 64u64 << 20}),
            &world.grant(),
            &limits,
        )
        .await;
    let err = result.as_ref().unwrap_err().to_string();
    assert_eq!(
        err,
        "adversary:fill: stopped: the plugin wrote more than 4194304 bytes to its folders (the per-call limit)"
    );
    assert_fs_limit(result, FsLimitExceeded::WriteBytes(4 << 20));
    let written = std::fs::metadata(world.path("ws/granted/big"))
        .unwrap()
        .len();
    assert!(written <= 4 << 20, "{written} bytes written");
    assert_eq!(world.outside_grant(), before);
    still_serving(&registry).await;
}

#[tokio::test]
async fn a_million_files_stop_at_the_entry_budget() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let limits = fs_limits(FsLimits {
        created_entries: 100,
        ..FsLimits::DEFAULT
    });
    let result = registry
        .call_tool(
            "adversary:many_files",
            &json!({"dir": "/granted/sub", "count": 1_000_000}),
            &world.grant(),
            &limits,
        )
        .await;
    assert_fs_limit(result, FsLimitExceeded::CreatedEntries(100));
    let made = std::fs::read_dir(world.path("ws/granted/sub"))
        .unwrap()
        .count();
    assert_eq!(made, 100);
    // Folders count too.
    let result = registry
        .call_tool(
            "adversary:deep_dirs",
            &json!({"dir": "/granted", "depth": 1_000}),
            &world.grant(),
            &limits,
        )
        .await;
    assert_fs_limit(result, FsLimitExceeded::CreatedEntries(100));
    still_serving(&registry).await;
}

fn open_host_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test]
async fn holding_descriptors_stops_at_the_open_budget_and_all_are_closed() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let grant = world.grant();
    still_serving(&registry).await;
    let before = open_host_descriptors();
    let result = call(
        &registry,
        "open_many",
        json!({"path": "/granted/inside.txt", "count": 100_000}),
        &grant,
    )
    .await;
    assert_fs_limit(
        result,
        FsLimitExceeded::OpenDescriptors(FsLimits::DEFAULT.open_descriptors),
    );
    // Other tests of this binary open and close descriptors meanwhile: what matters is
    // that the call's hundreds are not left open.
    let after = open_host_descriptors();
    assert!(
        after < before + 64,
        "the call's descriptors were closed with its instance ({before} before, {after} after)"
    );
    // Under the budget the same tool succeeds.
    let opened = call(
        &registry,
        "open_many",
        json!({"path": "/granted/inside.txt", "count": 100}),
        &grant,
    )
    .await
    .unwrap();
    assert_eq!(opened, json!({"done": 100}));
}

#[tokio::test]
async fn very_long_and_very_deep_paths_fail_cleanly() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let before = world.outside_grant();
    let grant = world.grant();
    assert_code(
        call(
            &registry,
            "long_name",
            json!({"dir": "/granted", "length": 100_000}),
            &grant,
        )
        .await,
        "long name",
        "ENAMETOOLONG",
    );
    // Nesting ends at the depth limit (256 levels below the granted folder; `sub` is the
    // first), well before the system's path length limit and inside the entry budget.
    let deep = call(
        &registry,
        "deep_dirs",
        json!({"dir": "/granted/sub", "depth": 5_000}),
        &grant,
    )
    .await;
    assert_fs_limit(deep, FsLimitExceeded::FolderDepth(256));
    let mut levels = 0;
    let mut path = world.path("ws/granted/sub");
    while path.join("d").is_dir() {
        path.push("d");
        levels += 1;
    }
    assert_eq!(levels, 255);
    let removed = std::process::Command::new("rm")
        .arg("-rf")
        .arg(world.path("ws/granted/sub/d"))
        .status()
        .unwrap();
    assert!(removed.success());
    assert_eq!(world.outside_grant(), before);
    still_serving(&registry).await;
}

#[tokio::test]
async fn a_fifo_in_a_granted_folder_is_refused_not_waited_on() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let fifo = world.path("ws/granted/pipe");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    let grant = world.grant();
    for (tool, args) in [
        ("read", json!({"path": "/granted/pipe"})),
        ("write", json!({"path": "/granted/pipe", "content": "x"})),
    ] {
        // The guard's `access`, before any open.
        assert_code(call(&registry, tool, args, &grant).await, tool, "EACCES");
    }
    still_serving(&registry).await;
}

#[tokio::test]
async fn flooding_stdout_is_capped_not_fatal() {
    let registry = registry_with_adversary().await;
    let result = call(
        &registry,
        "stdout_flood",
        json!({"bytes": 8 << 20}),
        &Grant::none(),
    )
    .await
    .unwrap();
    assert_eq!(result, json!({"written": 8 << 20}));
    still_serving(&registry).await;
}

#[tokio::test]
async fn udp_and_name_lookups_are_refused() {
    let registry = registry_with_adversary().await;
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_nonblocking(true).unwrap();
    let addr = socket.local_addr().unwrap().to_string();
    assert_code(
        call(&registry, "udp", json!({"addr": addr}), &Grant::none()).await,
        "udp",
        "EACCES",
    );
    let mut buf = [0u8; 16];
    assert!(
        matches!(socket.recv(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the datagram arrived"
    );
    assert_code(
        call(
            &registry,
            "resolve",
            json!({"host": "localhost"}),
            &Grant::none(),
        )
        .await,
        "resolve",
        // std's lookup error carries no errno: `EAI_FAIL`, as WASI's resolver refuses.
        "no errno (Uncategorized: failed to lookup address information: Non-recoverable error)",
    );
    still_serving(&registry).await;
}

#[tokio::test]
async fn no_state_survives_from_one_call_to_the_next() {
    let registry = registry_with_adversary().await;
    for _ in 0..3 {
        let count = call(&registry, "counter", json!({}), &Grant::none())
            .await
            .unwrap();
        assert_eq!(count, json!(1), "a fresh instance every call");
    }
}

#[tokio::test]
async fn no_memory_written_by_one_call_is_visible_to_the_next() {
    let registry = registry_with_adversary().await;
    let scribble = async |seed: u64, bytes: u64| {
        let args = json!({"seed": seed, "bytes": bytes});
        call(&registry, "scribble", args, &Grant::none()).await
    };
    let snoop = async |seed: u64| {
        let args = json!({"seed": seed});
        call(&registry, "snoop", args, &Grant::none()).await
    };
    // Heap (up to 8 MiB), static data and stack: the pages a pooled slot may keep mapped
    // from one instance to the next must come back as the component's image or zeros.
    for (seed, bytes) in [(7, 4096), (8, 1 << 20), (9, 8 << 20)] {
        let seen = scribble(seed, bytes).await.unwrap();
        assert!(
            seen.as_u64().unwrap() > bytes / 32,
            "the scan finds what the call wrote: {seen}"
        );
        for _ in 0..3 {
            let left = snoop(seed).await.unwrap();
            assert_eq!(left, json!(0), "a call read memory an earlier call wrote");
        }
    }
    // A call that fills its memory up to the limit leaves nothing either.
    assert!(
        call(&registry, "memory_bomb", json!({}), &Grant::none())
            .await
            .is_err()
    );
    assert_eq!(snoop(9).await.unwrap(), json!(0));
    still_serving(&registry).await;
}

#[tokio::test]
async fn a_folder_swapped_for_a_link_after_the_grant_is_not_opened() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let grant = world.grant();
    std::fs::rename(world.path("ws/granted"), world.path("ws/was-granted")).unwrap();
    std::os::unix::fs::symlink(world.path("outside"), world.path("ws/granted")).unwrap();
    let before = tree_digest(world.dir.path());
    let err = call(
        &registry,
        "write",
        json!({"path": "/granted/escape.txt", "content": "pwned"}),
        &grant,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ToolCallError::Host { .. }), "{err:?}");
    assert!(
        format!("{err:#}").contains("not a symbolic link"),
        "{err:#}"
    );
    // A folder put in its place is not the granted one either.
    std::fs::remove_file(world.path("ws/granted")).unwrap();
    std::fs::create_dir(world.path("ws/granted")).unwrap();
    let err = call(
        &registry,
        "write",
        json!({"path": "/granted/escape.txt", "content": "pwned"}),
        &grant,
    )
    .await
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("the folder was replaced since it was granted"),
        "{err:#}"
    );
    let mut after = tree_digest(world.dir.path());
    after.remove("ws/granted");
    let mut before = before;
    before.remove("ws/granted");
    assert_eq!(after, before, "nothing written anywhere");
    still_serving(&registry).await;
}

/// The later calls of a turn reuse the folder its first call opened and checked: a link or
/// another folder put at the granted path in between is never what they see.
#[tokio::test]
async fn later_calls_under_a_grant_keep_the_folder_the_first_call_opened() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let grant = world.grant();
    call(
        &registry,
        "write",
        json!({"path": "/granted/first.txt", "content": "first"}),
        &grant,
    )
    .await
    .unwrap();
    std::fs::rename(world.path("ws/granted"), world.path("ws/was-granted")).unwrap();
    std::os::unix::fs::symlink(world.path("outside"), world.path("ws/granted")).unwrap();
    let before = tree_digest(world.path("outside").as_path());
    call(
        &registry,
        "write",
        json!({"path": "/granted/second.txt", "content": "second"}),
        &grant,
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(world.path("ws/was-granted/second.txt")).unwrap(),
        "second",
        "the call wrote in the folder that was granted"
    );
    assert_eq!(
        tree_digest(world.path("outside").as_path()),
        before,
        "nothing written through the link"
    );
    // A clone of the grant (a turn's tool calls run side by side) shares the opened folder.
    let read = call(
        &registry,
        "read",
        json!({"path": "/granted/first.txt"}),
        &grant.clone(),
    )
    .await
    .unwrap();
    assert!(read.to_string().contains("first"), "{read}");
    // A grant made after the swap is refused, as before.
    let fresh = Grant::none()
        .write(world.path("ws/was-granted"), "/granted")
        .unwrap();
    std::fs::rename(world.path("ws/was-granted"), world.path("ws/moved")).unwrap();
    std::fs::create_dir(world.path("ws/was-granted")).unwrap();
    let err = call(
        &registry,
        "write",
        json!({"path": "/granted/third.txt", "content": "third"}),
        &fresh,
    )
    .await
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("the folder was replaced since it was granted"),
        "{err:#}"
    );
    assert!(!world.path("ws/was-granted/third.txt").exists());
    still_serving(&registry).await;
}

// ---- Red-team findings (branch `redteam`) ----

/// A budget of 16 open descriptors, the rest as by default.
fn sixteen_open() -> Limits {
    fs_limits(FsLimits {
        open_descriptors: 16,
        ..FsLimits::DEFAULT
    })
}

#[tokio::test]
async fn dropping_a_preopen_does_not_give_back_the_open_budget() {
    // `get-directories` hands out fresh handles of the preopens; dropping them used to be
    // counted as closing a descriptor, so a guest could hold any number of files open.
    let registry = registry_with_adversary().await;
    let world = World::new();
    let before = open_host_descriptors();
    let result = registry
        .call_tool(
            "adversary:churn_preopens",
            &json!({"path": "/granted/inside.txt", "count": 200}),
            &world.grant(),
            &sixteen_open(),
        )
        .await;
    assert_fs_limit(result, FsLimitExceeded::OpenDescriptors(16));
    assert!(open_host_descriptors() < before + 64);
    still_serving(&registry).await;
}

#[tokio::test]
async fn a_stream_kept_after_its_descriptor_counts_against_the_open_budget() {
    // A read stream holds the host's file open after the guest dropped the descriptor it
    // came from; dropping the descriptor must not free its place in the budget.
    let registry = registry_with_adversary().await;
    let world = World::new();
    let result = registry
        .call_tool(
            "adversary:streams_outlive",
            &json!({"dir": "/granted", "name": "inside.txt", "count": 200}),
            &world.grant(),
            &sixteen_open(),
        )
        .await;
    assert_fs_limit(result, FsLimitExceeded::OpenDescriptors(16));
    still_serving(&registry).await;
}

#[tokio::test]
async fn a_write_far_past_the_end_is_charged_for_the_gap() {
    // One byte written at offset 1 TiB makes a file of 1 TiB: the host, an archive or a
    // backup that reads it reads a terabyte. `set-size` is charged for growth; a write past
    // the end must be too.
    let registry = registry_with_adversary().await;
    let world = World::new();
    let before = world.outside_grant();
    let limits = fs_limits(FsLimits {
        write_bytes: 4 << 20,
        ..FsLimits::DEFAULT
    });
    for how in ["seek", "write"] {
        let path = format!("/granted/sparse-{how}");
        let result = registry
            .call_tool(
                "adversary:sparse_write",
                &json!({"path": path, "offset": 1u64 << 40, "how": how}),
                &world.grant(),
                &limits,
            )
            .await;
        assert_fs_limit(result, FsLimitExceeded::WriteBytes(4 << 20));
        let len = std::fs::metadata(world.path(&format!("ws{path}")))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(len <= 4 << 20, "{how}: a file of {len} bytes was made");
    }
    // Within the budget the same write works and the gap is what it costs.
    let small = registry
        .call_tool(
            "adversary:sparse_write",
            &json!({"path": "/granted/small", "offset": 1000, "how": "write"}),
            &world.grant(),
            &limits,
        )
        .await
        .unwrap();
    assert_eq!(small, json!({"len": 1001}));
    assert_eq!(world.outside_grant(), before);
    still_serving(&registry).await;
}

#[tokio::test]
async fn the_workflow_db_cannot_grow_past_the_write_budget() {
    // Bytes a guest writes through `workflow-db` reach the disk as surely as bytes written
    // to a folder: one statement could add gigabytes to db/db.sqlite within its deadline.
    let registry = registry_with_adversary().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.sqlite");
    drop(rusqlite_setup(&db));
    let size = || std::fs::metadata(&db).unwrap().len();
    let start = size();
    let limits = fs_limits(FsLimits {
        write_bytes: 4 << 20,
        ..FsLimits::DEFAULT
    });
    let result = registry
        .call_tool(
            "adversary:db_execute",
            &json!({"sql": "INSERT INTO t SELECT randomblob(1000000) FROM \
                (WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 64) \
                 SELECT n FROM c)"}),
            &Grant::none().with_db(&db, true),
            &limits,
        )
        .await;
    let grown = size() - start;
    assert_fs_limit(result, FsLimitExceeded::WriteBytes(4 << 20));
    assert!(grown <= 5 << 20, "the db grew by {grown} bytes");
    still_serving(&registry).await;
}

#[tokio::test]
async fn fts3_tokenizer_pointers_are_neither_read_nor_set() {
    // `fts3_tokenizer(name)` returns the address of a tokenizer module (a host pointer: the
    // layout of the process) and `fts3_tokenizer(name, ptr)` stores any pointer as a module,
    // which a later `USING fts3(tokenize=name)` calls through. SQLite allows both when the
    // arguments are bound parameters, which `workflow-db` lets a guest pass.
    let registry = registry_with_adversary().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.sqlite");
    drop(rusqlite_setup(&db));
    let before = tree_digest(dir.path());
    for steps in [
        json!([{"sql": "SELECT hex(fts3_tokenizer(?)) AS p", "params": ["simple"]}]),
        json!([{"sql": "SELECT hex(fts3_tokenizer(?, ?)) AS p",
                "params": ["evil", "A\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}\u{0}"]}]),
    ] {
        let result = call(
            &registry,
            "db_steps",
            json!({ "steps": steps }),
            &Grant::none().with_db(&db, false),
        )
        .await;
        let err = assert_refused(result, "fts3_tokenizer");
        assert!(
            err.to_string()
                .starts_with("adversary:db_steps: failed: sql: not authorized"),
            "{steps}: {err}"
        );
    }
    assert_eq!(tree_digest(dir.path()), before);
    still_serving(&registry).await;
}

#[tokio::test]
async fn a_fifo_is_refused_by_every_spelling_of_its_path() {
    // Tried by the red team; holds: the pre-open check resolves the path as the open does.
    let registry = registry_with_adversary().await;
    let world = World::new();
    let fifo = world.path("ws/granted/pipe");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    std::os::unix::fs::symlink("pipe", world.path("ws/granted/pipelink")).unwrap();
    std::os::unix::fs::symlink("../pipe", world.path("ws/granted/sub/up")).unwrap();
    let limits = Limits {
        timeout: Duration::from_secs(5),
        ..limits()
    };
    for path in [
        "/granted/./pipe",
        "/granted/sub/../pipe",
        "/granted//pipe",
        "/granted/pipelink",
        "/granted/sub/up",
        "/granted/pipe/",
        "/granted/pipe/.",
    ] {
        let result = registry
            .call_tool(
                "adversary:read",
                &json!({ "path": path }),
                &world.grant(),
                &limits,
            )
            .await;
        match result {
            Err(ToolCallError::Tool { .. }) => {}
            other => panic!("{path}: expected a refusal, got {other:?}"),
        }
    }
    still_serving(&registry).await;
}

#[tokio::test]
async fn a_huge_error_message_is_cut_before_it_reaches_anyone() {
    let registry = registry_with_adversary().await;
    let err = call(
        &registry,
        "long_error",
        json!({"bytes": 8 << 20}),
        &Grant::none(),
    )
    .await
    .unwrap_err();
    let ToolCallError::Tool { message, .. } = &err else {
        panic!("expected a tool error, got {err:?}");
    };
    assert_eq!(
        message,
        &format!("{}… [cut: {} bytes, limit 4096]", "x".repeat(4096), 8 << 20)
    );
    still_serving(&registry).await;
}
