//! The MCP fixture server of the external-server tests (`mcp_fixture_server.py`, on the
//! `mcp` package from PyPI at a pinned version), in a virtual environment made once under
//! the target folder, and run over stdio by Trellis or over streamable HTTP by a test.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The `mcp` package the fixture runs on.
pub const MCP_PACKAGE: &str = "mcp==2.3.0";

/// The fixture server's script.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/all/support/mcp_fixture_server.py")
}

/// The Python of the fixture's virtual environment, made (with `mcp` installed) on first use.
pub fn python() -> PathBuf {
    static MADE: Mutex<bool> = Mutex::new(false);
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mcp-fixture-venv");
    let python = venv.join("bin/python");
    let stamp = venv.join(format!("{MCP_PACKAGE}.installed"));
    if *made || stamp.is_file() {
        *made = true;
        return python;
    }
    let ok = |c: &mut Command| c.status().map(|s| s.success()).unwrap_or(false);
    assert!(
        ok(Command::new("python3").args(["-m", "venv"]).arg(&venv)),
        "python3 -m venv {} failed: the MCP tests need Python 3.10+ with venv",
        venv.display()
    );
    assert!(
        ok(Command::new(venv.join("bin/pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            MCP_PACKAGE
        ])),
        "pip install {MCP_PACKAGE} failed (PyPI must be reachable)"
    );
    std::fs::write(&stamp, "").unwrap();
    *made = true;
    python
}

/// The fixture serving streamable HTTP on 127.0.0.1; killed when dropped.
pub struct HttpFixture {
    child: Child,
    port: u16,
}

impl HttpFixture {
    /// Starts the fixture and waits until it accepts connections.
    pub fn start() -> HttpFixture {
        let python = python();
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let child = Command::new(python)
            .arg(script())
            .args(["--http", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let fixture = HttpFixture { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the HTTP fixture never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        fixture
    }

    /// Its endpoint.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet), waiting a bounded while
/// for it to go.
pub fn process_gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command name in parentheses.
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
        if stat.is_empty() || state == Some(Some('Z')) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
