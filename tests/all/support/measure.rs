//! The peak memory of a process a test runs, read from the kernel's accounting of that one
//! child (wait4), not from the test process's other children.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Runs `command` to its end (killed after 10 minutes), its output to `out_file`, and
/// returns its wait status, the peak resident memory of that process in bytes, and what it
/// printed.
pub fn peak_memory(mut command: Command, out_file: &Path) -> (i32, u64, String) {
    let log = std::fs::File::create(out_file).unwrap();
    let child = command
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let done = done.clone();
        std::thread::spawn(move || {
            for _ in 0..600 {
                std::thread::sleep(Duration::from_secs(1));
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
            }
            // SAFETY: kill(2) on the child, which is not reaped until wait4 below returns.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        })
    };
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct wait4 fills.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4(2) on our own child, with valid pointers; it reaps the child, so the
    // `Child` is dropped without being waited for again.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    watchdog.join().unwrap();
    drop(child);
    assert_eq!(reaped, pid);
    let text = std::fs::read_to_string(out_file).unwrap_or_default();
    (status, usage.ru_maxrss as u64 * 1024, text)
}
