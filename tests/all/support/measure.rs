//! The peak memory of a process a test runs, read from that process's own accounting
//! (`VmHWM` in `/proc/PID/status`, which counts only what the program touched after its
//! exec: a child's rusage would also count the test process it was forked from).

use std::net::TcpStream;
use std::os::fd::FromRawFd;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The peak resident memory of process `pid` so far, in bytes; `None` once it has exited.
pub fn high_water(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Runs `command` to its end (killed after 10 minutes), its output to `out_file`, and
/// returns its exit code (-1 when killed by a signal), the peak resident memory of that
/// process in bytes (read every 5 ms while it runs), and what it printed.
pub fn peak_memory(mut command: Command, out_file: &Path) -> (i32, u64, String) {
    let log = std::fs::File::create(out_file).unwrap();
    let mut child = command
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let poller = {
        let (done, peak) = (done.clone(), peak.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            while !done.load(Ordering::SeqCst) {
                if let Some(bytes) = high_water(pid) {
                    peak.fetch_max(bytes, Ordering::SeqCst);
                }
                if started.elapsed() > Duration::from_secs(600) {
                    // SAFETY: kill(2) on the child, which is not reaped until `wait` returns.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let status = child.wait().unwrap();
    done.store(true, Ordering::SeqCst);
    poller.join().unwrap();
    let text = std::fs::read_to_string(out_file).unwrap_or_default();
    (
        status.code().unwrap_or(-1),
        peak.load(Ordering::SeqCst),
        text,
    )
}

/// A connection to 127.0.0.1:`port` whose receive buffer is 2 KiB: a client that does not
/// read holds the server's answer in the server.
pub fn small_window(port: u16) -> TcpStream {
    // SAFETY: a socket made, configured and connected here, then owned by the stream.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let size: libc::c_int = 2048;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        let address = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
            },
            sin_zero: [0; 8],
        };
        let connected = libc::connect(
            fd,
            (&address as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(connected, 0);
        TcpStream::from_raw_fd(fd)
    }
}

/// The resident memory of process `pid`, in bytes.
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib * 1024
}
