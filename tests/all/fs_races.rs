//! The filesystem guard's check of a path and its open are two looks at the path; these tests
//! put something else there exactly between them, through the sandbox's test hook
//! (`trellis_sandbox::test_hooks::between_check_and_open`), instead of racing the two looks
//! and hoping. Each swap happens once, at that moment: a FIFO, a hard link to a file outside
//! the grant, a link pointing outside it. Each call is refused with its WASI error code, and
//! nothing outside the grant changes. The post-open check of the guard is what refuses the
//! first two: without it the FIFO reads as empty and the file outside is overwritten.

use crate::sandbox::{assert_code, call, still_serving};
use crate::support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use support::{registry_with_adversary, tree_digest};
use trellis_sandbox::Grant;
use trellis_sandbox::test_hooks::{BetweenCheckAndOpen, between_check_and_open};

/// A read-write granted folder holding a regular file, and a folder outside the grant with
/// a secret.
struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("granted")).unwrap();
        std::fs::create_dir_all(dir.path().join("outside")).unwrap();
        std::fs::write(dir.path().join("granted/target"), "regular").unwrap();
        std::fs::write(dir.path().join("outside/secret.txt"), "outside secret").unwrap();
        World { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn grant(&self) -> Grant {
        Grant::none()
            .write(self.path("granted"), "/granted")
            .unwrap()
    }

    /// Runs `swap` once, the first time the guard is between its check of `target` in the
    /// granted folder and its open; the count says how many swaps happened.
    fn swap_once(
        &self,
        swap: impl Fn(&Path) + Send + Sync + 'static,
    ) -> (BetweenCheckAndOpen, Arc<AtomicUsize>) {
        let swaps = Arc::new(AtomicUsize::new(0));
        let counted = swaps.clone();
        let target = self.path("granted/target");
        let hook = between_check_and_open(&self.path("granted"), move |path| {
            if path == "target" && counted.fetch_add(1, Ordering::SeqCst) == 0 {
                swap(&target);
            }
        })
        .unwrap();
        (hook, swaps)
    }
}

fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
}

/// A FIFO put at the path after the check: the open does not wait on it (no writer ever
/// comes) and the check through the descriptor refuses it.
#[tokio::test]
async fn a_fifo_put_at_a_checked_path_before_the_open_is_refused() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let fifo = world.path("granted/parked");
    mkfifo(&fifo);
    let (_hook, swaps) = world.swap_once(move |target| std::fs::rename(&fifo, target).unwrap());
    let before = tree_digest(&world.path("outside"));
    let result = call(
        &registry,
        "read",
        json!({"path": "/granted/target"}),
        &world.grant(),
    )
    .await;
    assert_eq!(swaps.load(Ordering::SeqCst), 1, "the swap happened once");
    assert_code(result, "read of a FIFO swapped in", "EACCES");
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(world.path("granted/target"))
            .unwrap()
            .file_type()
            .is_fifo(),
        "the FIFO is what the open found"
    );
    assert_eq!(tree_digest(&world.path("outside")), before);
    still_serving(&registry).await;
}

/// A hard link to a file outside the grant put at the path after the check of the regular
/// file there: the open refuses it before truncating, and the file outside keeps its bytes.
#[tokio::test]
async fn a_hard_link_put_at_a_checked_path_before_the_open_is_not_written() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let secret = world.path("outside/secret.txt");
    let parked = world.path("granted/parked");
    let (_hook, swaps) = world.swap_once(move |target| {
        std::fs::hard_link(&secret, &parked).unwrap();
        std::fs::rename(&parked, target).unwrap();
    });
    let before = tree_digest(&world.path("outside"));
    let result = call(
        &registry,
        "write",
        json!({"path": "/granted/target", "content": "overwritten"}),
        &world.grant(),
    )
    .await;
    assert_eq!(swaps.load(Ordering::SeqCst), 1, "the swap happened once");
    assert_code(result, "write to a hard link swapped in", "EACCES");
    assert_eq!(tree_digest(&world.path("outside")), before);
    assert_eq!(
        std::fs::read_to_string(world.path("outside/secret.txt")).unwrap(),
        "outside secret"
    );
    still_serving(&registry).await;
}

/// A link pointing outside the grant put at the path after the check of the regular file
/// there: the open resolves it within the granted folder only (cap-std refuses the way
/// out), so neither a read nor a write reaches the file outside.
#[tokio::test]
async fn a_link_out_of_the_grant_put_at_a_checked_path_before_the_open_is_refused() {
    let registry = registry_with_adversary().await;
    for tool in ["read", "write"] {
        let world = World::new();
        let secret = world.path("outside/secret.txt");
        let (_hook, swaps) = world.swap_once(move |target| {
            std::fs::remove_file(target).unwrap();
            std::os::unix::fs::symlink(&secret, target).unwrap();
        });
        let before = tree_digest(&world.path("outside"));
        let result = call(
            &registry,
            tool,
            if tool == "write" {
                json!({"path": "/granted/target", "content": "overwritten"})
            } else {
                json!({"path": "/granted/target"})
            },
            &world.grant(),
        )
        .await;
        assert_eq!(
            swaps.load(Ordering::SeqCst),
            1,
            "{tool}: the swap happened once"
        );
        assert_code(
            result,
            &format!("{tool} through a link swapped in"),
            "EPERM",
        );
        assert_eq!(tree_digest(&world.path("outside")), before, "{tool}");
        assert_eq!(
            std::fs::read_to_string(world.path("outside/secret.txt")).unwrap(),
            "outside secret"
        );
    }
    still_serving(&registry).await;
}

/// The hook sees only the opens of its own folder, and is gone once dropped: a call after
/// that opens the regular file as ever.
#[tokio::test]
async fn the_hook_sees_its_folder_only_and_ends_when_dropped() {
    let registry = registry_with_adversary().await;
    let world = World::new();
    let other = World::new();
    let (hook, swaps) = world.swap_once(|_| {});
    let read = call(
        &registry,
        "read",
        json!({"path": "/granted/target"}),
        &other.grant(),
    )
    .await
    .unwrap();
    assert_eq!(read, json!("regular"));
    assert_eq!(swaps.load(Ordering::SeqCst), 0, "another folder's open");
    drop(hook);
    let read = call(
        &registry,
        "read",
        json!({"path": "/granted/target"}),
        &world.grant(),
    )
    .await
    .unwrap();
    assert_eq!(read, json!("regular"));
    assert_eq!(swaps.load(Ordering::SeqCst), 0, "the hook was dropped");
}
