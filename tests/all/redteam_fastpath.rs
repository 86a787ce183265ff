//! Attacks on the per-call fast paths of tool calls: a grant's folders opened once and
//! reused by its later calls and its clones, the filesystem guard's single look at a path
//! that does not end in a link, and `workspace:read_file` opening before it looks. Each
//! attack ends in a denial or a safe outcome, and nothing outside the grant changes.

use crate::sandbox::{assert_code, call, limits, still_serving};
use crate::support;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::{registry_with_adversary, tree_digest};
use trellis_sandbox::plugins::ToolErrorKind;
use trellis_sandbox::{Grant, Limits, PluginRegistry, ToolCallError};

/// A workspace with one read-write and one read-only granted folder, a file beside them and
/// a folder fully outside, whose secret a hostile workspace links to.
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
        std::fs::write(root.join("outside/secret.txt"), "outside secret").unwrap();
        World { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn grant(&self) -> Grant {
        Grant::none()
            .write(self.path("ws/granted"), "/granted")
            .unwrap()
            .read(self.path("ws/ro"), "/ro")
            .unwrap()
    }

    /// Digest of everything but the read-write folder, which calls may change.
    fn outside_grant(&self) -> BTreeMap<String, String> {
        let mut digest = tree_digest(self.dir.path());
        digest.retain(|k, _| !k.starts_with("ws/granted/"));
        digest
    }

    /// How many of this process's descriptors name something under this world.
    fn descriptors_into(&self) -> usize {
        self.descriptors().len()
    }

    /// This process's descriptors that name something under this world.
    fn descriptors(&self) -> Vec<i32> {
        let root = std::fs::canonicalize(self.dir.path()).unwrap();
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|entry| {
                std::fs::read_link(entry.path()).is_ok_and(|target| target.starts_with(&root))
            })
            .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
            .collect()
    }
}

fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
}

/// The call ended in a tool error of kind `kind` (not a crash, timeout or host error).
fn tool_error(result: Result<Value, ToolCallError>, what: &str) -> (ToolErrorKind, String) {
    match result {
        Ok(value) => panic!("{what}: expected a refusal, got {value}"),
        Err(ToolCallError::Tool { kind, message, .. }) => (kind, message),
        Err(other) => panic!("{what}: expected a tool error, got {other:?}"),
    }
}

/// A granted folder deleted and made again at its path while a grant that already used it
/// is alive (`trellis mcp serve` keeps one for its lifetime): the next calls are refused
/// with a message naming what happened, and nothing is written in either folder.
#[tokio::test]
async fn a_folder_deleted_and_made_again_under_a_live_grant_is_refused_clearly() {
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
    std::fs::remove_dir_all(world.path("ws/granted")).unwrap();
    std::fs::create_dir(world.path("ws/granted")).unwrap();
    let before = tree_digest(world.dir.path());
    for (tool, args) in [
        (
            "write",
            json!({"path": "/granted/second.txt", "content": "x"}),
        ),
        ("read", json!({"path": "/ro/keep.txt"})),
        ("list", json!({"path": "/granted"})),
    ] {
        let err = call(&registry, tool, args, &grant.clone())
            .await
            .expect_err(tool);
        let text = format!("{err:#}");
        assert!(
            text.contains("was deleted since it was granted"),
            "{tool}: {text}"
        );
        assert!(
            text.contains(&world.path("ws/granted").display().to_string()),
            "{tool}: the message names the folder: {text}"
        );
    }
    assert_eq!(tree_digest(world.dir.path()), before, "nothing written");
    // A grant made now is of the new folder and works.
    call(
        &registry,
        "write",
        json!({"path": "/granted/third.txt", "content": "third"}),
        &world.grant(),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(world.path("ws/granted/third.txt")).unwrap(),
        "third"
    );
    still_serving(&registry).await;
}

/// Clones of one grant used side by side while the granted folder is swapped, again and
/// again, for a link to a folder outside and back: every call either writes in the folder
/// that was granted or is refused; nothing is ever written through the link.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clones_of_a_grant_used_side_by_side_during_folder_swaps_stay_in_the_grant() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let grant = world.grant();
    let before = world.outside_grant();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let granted = world.path("ws/granted");
        let parked = world.path("ws/parked");
        let outside = world.path("outside");
        std::thread::spawn(move || {
            let mut swaps = 0usize;
            while !stop.load(Ordering::Relaxed) {
                std::fs::rename(&granted, &parked).unwrap();
                symlink(&outside, &granted).unwrap();
                std::thread::yield_now();
                std::fs::remove_file(&granted).unwrap();
                std::fs::rename(&parked, &granted).unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    let registry = Arc::new(registry);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..24 {
        let grant = grant.clone();
        let registry = registry.clone();
        calls.spawn(async move {
            call(
                &registry,
                "write",
                json!({"path": format!("/granted/w{i}.txt"), "content": "w"}),
                &grant,
            )
            .await
        });
    }
    let results = calls.join_all().await;
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    eprintln!("folder swaps: {swaps} during {} calls", results.len());
    assert!(swaps > 0, "the folder was never swapped");
    for result in &results {
        if let Err(err) = result {
            // The first call opens the folder (a link or nothing at its path is refused);
            // the others use what it opened.
            let text = format!("{err:#}");
            assert!(
                text.contains("it must be an existing directory, not a symbolic link or a file"),
                "{text}"
            );
        }
    }
    assert_eq!(world.outside_grant(), before, "nothing written outside");
    let written = std::fs::read_dir(world.path("ws/granted"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('w'))
        .count();
    assert_eq!(
        written,
        results.iter().filter(|r| r.is_ok()).count(),
        "every call that succeeded wrote in the granted folder"
    );
    still_serving(&registry).await;
}

/// FIFOs, sockets and files with other hard links reached through a final link, a link on
/// the way, `.`/`..` and trailing slashes: refused for reading (special files) and for
/// writing (special files and hard-linked files); a link to a FIFO outside the grant is
/// outside it.
#[tokio::test]
async fn special_and_hard_linked_files_reached_by_any_spelling_are_refused() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    mkfifo(&world.path("ws/granted/sub/pipe"));
    mkfifo(&world.path("outside/pipe"));
    let _socket = std::os::unix::net::UnixListener::bind(world.path("ws/granted/sub/sock"))
        .expect("a socket in the grant");
    std::fs::hard_link(
        world.path("outside/secret.txt"),
        world.path("ws/granted/sub/hard"),
    )
    .unwrap();
    symlink("sub", world.path("ws/granted/subl")).unwrap();
    symlink("sub/pipe", world.path("ws/granted/pipelink")).unwrap();
    symlink("pipelink", world.path("ws/granted/pipelink2")).unwrap();
    symlink("sub/sock", world.path("ws/granted/socklink")).unwrap();
    symlink("sub/hard", world.path("ws/granted/hardlink")).unwrap();
    symlink("../sub/hard", world.path("ws/granted/sub/uphard")).unwrap();
    symlink(world.path("outside/pipe"), world.path("ws/granted/outpipe")).unwrap();
    symlink("../../outside/pipe", world.path("ws/granted/outpipe_rel")).unwrap();
    let before = world.outside_grant();
    let grant = world.grant();
    let limits = Limits {
        timeout: Duration::from_secs(5),
        ..limits()
    };
    // The guard's `access` for a special file or a hard-linked one, however it is reached;
    // a trailing slash after a file is refused before anything is opened (a read with
    // `not-directory`, a write, which would create, with `is-directory`), and so is `/.`
    // (`not-directory` for both); a link out of the grant is cap-std's `not-permitted`.
    let special = [
        ("/granted/sub/pipe", "EACCES", "EACCES"),
        ("/granted/subl/pipe", "EACCES", "EACCES"),
        ("/granted/pipelink", "EACCES", "EACCES"),
        ("/granted/pipelink2", "EACCES", "EACCES"),
        ("/granted/./subl/./pipe", "EACCES", "EACCES"),
        ("/granted/sub/../subl/pipe", "EACCES", "EACCES"),
        ("/granted/subl/pipe/", "ENOTDIR", "EISDIR"),
        ("/granted/pipelink/", "ENOTDIR", "EISDIR"),
        ("/granted/pipelink/.", "ENOTDIR", "ENOTDIR"),
        ("/granted/sub/sock", "EACCES", "EACCES"),
        ("/granted/subl/sock", "EACCES", "EACCES"),
        ("/granted/socklink", "EACCES", "EACCES"),
        ("/granted/outpipe", "EPERM", "EPERM"),
        ("/granted/outpipe_rel", "EPERM", "EPERM"),
    ];
    let hard = [
        ("/granted/sub/hard", "EACCES"),
        ("/granted/subl/hard", "EACCES"),
        ("/granted/hardlink", "EACCES"),
        ("/granted/subl/../subl/hard", "EACCES"),
        ("/granted/sub/uphard", "EACCES"),
        ("/granted/hardlink/", "EISDIR"),
    ];
    for (path, read_code, write_code) in special {
        for (tool, args, code) in [
            ("read", json!({ "path": path }), read_code),
            ("write", json!({ "path": path, "content": "x" }), write_code),
        ] {
            let result = registry
                .call_tool(&format!("adversary:{tool}"), &args, &grant, &limits)
                .await;
            assert_code(result, &format!("{tool} {path}"), code);
        }
    }
    for (path, code) in hard {
        let result = registry
            .call_tool(
                "adversary:write",
                &json!({ "path": path, "content": "overwritten" }),
                &grant,
                &limits,
            )
            .await;
        assert_code(result, &format!("write {path}"), code);
    }
    assert_eq!(
        std::fs::read_to_string(world.path("outside/secret.txt")).unwrap(),
        "outside secret"
    );
    assert_eq!(world.outside_grant(), before);
    still_serving(&registry).await;
}

/// A grant holds one descriptor per folder whatever the number of its calls and clones,
/// gives it back when the last clone goes, and none of them reaches a child process.
#[tokio::test]
async fn a_grant_holds_one_descriptor_per_folder_and_children_inherit_none() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    assert_eq!(world.descriptors_into(), 0);
    let grant = world.grant();
    for i in 0..10 {
        call(
            &registry,
            "read",
            json!({"path": "/ro/keep.txt"}),
            &grant.clone(),
        )
        .await
        .unwrap();
        call(
            &registry,
            "write",
            json!({"path": format!("/granted/{i}.txt"), "content": "x"}),
            &grant,
        )
        .await
        .unwrap();
    }
    assert_eq!(world.descriptors_into(), 2, "one per granted folder");

    // Many grants alive at once: one descriptor per folder each, all given back.
    let many: Vec<Grant> = (0..50).map(|_| world.grant()).collect();
    for grant in &many {
        call(&registry, "list", json!({"path": "/ro"}), grant)
            .await
            .unwrap();
    }
    assert_eq!(world.descriptors_into(), 2 + 2 * many.len());

    // A child started now (an external MCP server, a script's process) sees none of them:
    // every one is closed on exec.
    for fd in world.descriptors() {
        // SAFETY: F_GETFD on a descriptor number reads its flags and changes nothing.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert!(
            flags >= 0 && flags & libc::FD_CLOEXEC != 0,
            "descriptor {fd} is not closed on exec"
        );
    }
    let root = std::fs::canonicalize(world.dir.path()).unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("for f in /proc/$$/fd/*; do readlink \"$f\"; done; true")
        .output()
        .unwrap();
    assert!(out.status.success());
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(
        !seen.contains(&root.display().to_string()),
        "a child inherited a granted folder: {seen}"
    );

    drop(many);
    drop(grant);
    assert_eq!(world.descriptors_into(), 0, "every descriptor given back");
    still_serving(&registry).await;
}

/// Swaps the files at `a` and `b` in one step (`renameat2` with `RENAME_EXCHANGE`): each
/// path always names one of the two, never nothing.
fn exchange(a: &Path, b: &Path) {
    let a = std::ffi::CString::new(a.to_str().unwrap()).unwrap();
    let b = std::ffi::CString::new(b.to_str().unwrap()).unwrap();
    // SAFETY: valid NUL-terminated paths.
    let done = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(done, 0, "{}", std::io::Error::last_os_error());
}

/// Swaps `path` with `other` again and again until `stop`; says how many times.
fn keep_swapping(
    path: PathBuf,
    other: PathBuf,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut swaps = 0;
        while !stop.load(Ordering::Relaxed) {
            exchange(&path, &other);
            swaps += 1;
        }
        swaps
    })
}

/// A regular file swapped with a FIFO, again and again, while calls read it: the check and
/// the open are two looks at the path, so a call may pass the check on the file and open
/// the FIFO. No call waits on it (the watchdog here plays the writer a waiting call would
/// need, and counts the calls it had to free: a reader on the FIFO while the call has run
/// for 40 ms, since a call's own non-blocking open is a reader for a moment too); each call
/// reads the file or is refused as the FIFO. (`fs_races` puts the FIFO there at exactly that
/// moment, once.)
#[tokio::test]
async fn a_file_swapped_for_a_fifo_between_the_check_and_the_open_never_blocks_a_call() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    std::fs::write(world.path("ws/granted/x"), "regular").unwrap();
    mkfifo(&world.path("ws/granted/fifo"));
    let before = world.outside_grant();
    let stop = Arc::new(AtomicBool::new(false));
    let freed = Arc::new(AtomicUsize::new(0));
    let swapper = keep_swapping(
        world.path("ws/granted/x"),
        world.path("ws/granted/fifo"),
        stop.clone(),
    );
    // The number of the call under way (0 between calls), for the watchdog.
    let current = Arc::new(AtomicUsize::new(0));
    let watchdog = {
        let stop = stop.clone();
        let freed = freed.clone();
        let current = current.clone();
        let names = ["x", "fifo"].map(|n| world.path("ws/granted").join(n));
        std::thread::spawn(move || {
            use std::os::unix::fs::OpenOptionsExt;
            let mut seen = 0;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(40));
                // The same call under way as 40 ms ago: it may be waiting.
                let now = current.load(Ordering::Relaxed);
                let long = now != 0 && now == seen;
                seen = now;
                for name in &names {
                    // Succeeds only on a FIFO with a reader: a blocked call, when long.
                    if long
                        && std::fs::OpenOptions::new()
                            .write(true)
                            .custom_flags(libc::O_NONBLOCK)
                            .open(name)
                            .is_ok_and(|f| f.metadata().is_ok_and(|m| !m.is_file()))
                    {
                        freed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    let grant = world.grant();
    let mut outcomes = [0usize; 2];
    for n in 1..=2000 {
        current.store(n, Ordering::Relaxed);
        let result = call(&registry, "read", json!({"path": "/granted/x"}), &grant).await;
        current.store(0, Ordering::Relaxed);
        match result {
            Ok(content) => {
                assert_eq!(content, json!("regular"));
                outcomes[0] += 1;
            }
            Err(err) => {
                assert_code(Err(err), "read /granted/x", "EACCES");
                outcomes[1] += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    watchdog.join().unwrap();
    eprintln!(
        "swapped file: {swaps} swaps; {} read, {} refused",
        outcomes[0], outcomes[1]
    );
    assert!(
        swaps >= 2000,
        "the file was swapped only {swaps} times in 2000 calls: the race was hardly run"
    );
    assert_eq!(
        freed.load(Ordering::Relaxed),
        0,
        "a call opened the FIFO and waited for a writer"
    );
    assert_eq!(world.outside_grant(), before);
    still_serving(&registry).await;
}

/// A regular file swapped, again and again, with a hard link to a file outside the grant
/// while calls overwrite it: a call that got past the check on the regular file must not
/// truncate or write the file outside when the link is what it opens. Each call writes the
/// regular file or is refused as the hard link. (`fs_races` puts the link there at exactly
/// that moment, once.)
#[tokio::test]
async fn a_file_swapped_for_a_hard_link_between_the_check_and_the_open_is_not_written() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    std::fs::write(world.path("ws/granted/y"), "regular").unwrap();
    std::fs::hard_link(
        world.path("outside/secret.txt"),
        world.path("ws/granted/hard"),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = keep_swapping(
        world.path("ws/granted/y"),
        world.path("ws/granted/hard"),
        stop.clone(),
    );
    let grant = world.grant();
    let mut outcomes = [0usize; 2];
    for _ in 0..2000 {
        let result = call(
            &registry,
            "write",
            json!({"path": "/granted/y", "content": "overwritten"}),
            &grant,
        )
        .await;
        match result {
            Ok(_) => outcomes[0] += 1,
            Err(err) => {
                assert_code(Err(err), "write /granted/y", "EACCES");
                outcomes[1] += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    eprintln!(
        "swapped hard link: {swaps} swaps; {} written, {} refused",
        outcomes[0], outcomes[1]
    );
    assert!(
        swaps >= 2000,
        "the file was swapped only {swaps} times in 2000 calls: the race was hardly run"
    );
    assert_eq!(
        std::fs::read_to_string(world.path("outside/secret.txt")).unwrap(),
        "outside secret"
    );
    still_serving(&registry).await;
}

// ---- The bundled `workspace:read_file`, which opens before it looks ----

async fn read_file(
    registry: &PluginRegistry,
    grant: &Grant,
    path: &str,
) -> Result<Value, ToolCallError> {
    registry
        .call_tool(
            "workspace:read_file",
            &json!({ "path": path }),
            grant,
            &Limits {
                timeout: Duration::from_secs(10),
                ..Limits::default()
            },
        )
        .await
}

/// `read_file` of a FIFO, a socket, a folder, a link to a FIFO outside the grant, and a
/// hard link to a file outside it: all refused, the hard link with a message saying why
/// (and `write_file` to it replaces the link, never the file outside).
#[tokio::test]
async fn read_file_on_special_files_folders_and_hard_links() {
    let registry = support::registry().await;
    let world = World::new();
    mkfifo(&world.path("ws/granted/pipe"));
    mkfifo(&world.path("outside/pipe"));
    let _socket =
        std::os::unix::net::UnixListener::bind(world.path("ws/granted/sock")).expect("a socket");
    symlink(world.path("outside/pipe"), world.path("ws/granted/outpipe")).unwrap();
    symlink("pipe", world.path("ws/granted/pipelink")).unwrap();
    std::fs::hard_link(
        world.path("outside/secret.txt"),
        world.path("ws/granted/hard"),
    )
    .unwrap();
    let before = world.outside_grant();
    let grant = Grant::none()
        .write(world.path("ws/granted"), "granted")
        .unwrap();
    for path in [
        "granted/pipe",
        "granted/pipelink",
        "granted/sock",
        "granted/outpipe",
    ] {
        let (kind, message) = tool_error(read_file(&registry, &grant, path).await, path);
        assert_eq!(kind, ToolErrorKind::Denied, "{path}: {message}");
    }
    let (kind, message) = tool_error(read_file(&registry, &grant, "granted/sub").await, "folder");
    assert_eq!(kind, ToolErrorKind::InvalidArguments, "{message}");
    assert!(message.contains("is a folder; use list_dir"), "{message}");

    let (kind, message) = tool_error(
        read_file(&registry, &grant, "granted/hard").await,
        "hard link",
    );
    assert_eq!(kind, ToolErrorKind::Denied, "{message}");
    assert!(
        message.contains(
            "`granted/hard` has other hard links, so it is not read (another link may be a \
             file outside the grants)"
        ),
        "{message}"
    );
    assert!(!message.contains("outside secret"), "{message}");
    let written = registry
        .call_tool(
            "workspace:write_file",
            &json!({"path": "granted/hard", "content": "overwritten"}),
            &grant,
            &Limits::default(),
        )
        .await;
    if written.is_ok() {
        assert_eq!(
            std::fs::read_to_string(world.path("ws/granted/hard")).unwrap(),
            "overwritten"
        );
    }
    assert_eq!(
        std::fs::read_to_string(world.path("outside/secret.txt")).unwrap(),
        "outside secret"
    );
    assert_eq!(world.outside_grant(), before);
}

/// A file that grows while `read_file` reads it (a log being written): the call ends with
/// at most the 1 MiB it returns at once, whole lines only, or a clear refusal.
#[tokio::test]
async fn read_file_of_a_growing_file_ends_with_a_bounded_answer() {
    let registry = support::registry().await;
    let world = World::new();
    let log = world.path("ws/granted/log.txt");
    std::fs::write(&log, format!("{}\n", "l".repeat(99)).repeat(4)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let log = log.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
            let line = format!("{}\n", "l".repeat(99));
            let mut written = 0usize;
            // At most 16 MiB: the disk is not the thing under test.
            while !stop.load(Ordering::Relaxed) && written < 16 << 20 {
                file.write_all(line.as_bytes()).unwrap();
                written += line.len();
            }
        })
    };
    let grant = Grant::none()
        .write(world.path("ws/granted"), "granted")
        .unwrap();
    for _ in 0..5 {
        match read_file(&registry, &grant, "granted/log.txt").await {
            Ok(read) => {
                let content = read["content"].as_str().unwrap();
                assert!(content.len() <= 1 << 20);
                // The writer may be mid-line at the moment the file's end is read: the last
                // line may be cut there, every other one is whole.
                let lines: Vec<&str> = content.lines().collect();
                if let Some((last, whole)) = lines.split_last() {
                    assert!(whole.iter().all(|l| l.len() == 99), "whole lines only");
                    assert!(last.len() <= 99 && last.chars().all(|c| c == 'l'));
                }
            }
            Err(ToolCallError::Tool { kind, message, .. }) => {
                assert_eq!(kind, ToolErrorKind::InvalidArguments, "{message}");
                assert!(
                    message.contains("pass offset_line and max_lines"),
                    "{message}"
                );
            }
            Err(other) => panic!("expected an answer or a refusal, got {other:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let window = registry
        .call_tool(
            "workspace:read_file",
            &json!({"path": "granted/log.txt", "offset_line": 3, "max_lines": 2}),
            &grant,
            &Limits::default(),
        )
        .await
        .unwrap();
    assert_eq!(window["content"], format!("{0}\n{0}\n", "l".repeat(99)));
}

/// Out of descriptors (many folders granted, a low limit): the user is told so, not that
/// the folder must be an existing directory.
#[test]
fn running_out_of_descriptors_is_reported_as_such() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![
        "tool".to_string(),
        "call".to_string(),
        "workspace:read_file".to_string(),
        "--args".to_string(),
        json!({"path": "d0/f.txt"}).to_string(),
        "--root".to_string(),
        dir.path().display().to_string(),
    ];
    for i in 0..120 {
        std::fs::create_dir(dir.path().join(format!("d{i}"))).unwrap();
        args.extend(["--read".to_string(), format!("d{i}")]);
    }
    std::fs::write(dir.path().join("d0/f.txt"), "text\n").unwrap();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let before = tree_digest(dir.path());
    let mut command = support::trellis_command(&args);
    // SAFETY: only setrlimit, which is async-signal-safe, runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("Too many open files"), "{stderr}");
    assert!(
        !stderr.contains("must be an existing directory"),
        "the folder is not to blame: {stderr}"
    );
    assert_eq!(tree_digest(dir.path()), before);
}
