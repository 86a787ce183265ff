//! Per-call latency of `workspace__read_file` through `trellis mcp serve` over stdio, against
//! the same call made in process (`PluginRegistry::call_tool`) in the same run.
//!
//! The client is a small harness: it starts the `trellis` binary of this build, does the
//! MCP handshake, then writes one `tools/call` line and waits for its answer, 2,000 times,
//! interleaved with the in-process calls (so load drifts hit both alike). Prints p50/p99 of
//! each and their ratio; `BENCHMARKS.md` records these figures. Under `cargo test --benches`
//! (quick mode) it makes a few calls of each: the check that both answer the same runs, the
//! figures mean nothing.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use trellis_sandbox::{Access, CacheSetting, Engine, Grant, Limits, PluginRegistry};

struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Server {
    fn start(root: &std::path::Path, cache: &std::path::Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_trellis"))
            .args([
                "mcp",
                "serve",
                "--tool",
                "workspace:read_file",
                "--read",
                "notes",
            ])
            .arg("--root")
            .arg(root)
            .env("TRELLIS_CACHE_DIR", cache)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("trellis starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut server = Server {
            child,
            stdin,
            stdout,
            next_id: 0,
        };
        server.request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "bench", "version": "1"},
            }),
        );
        server.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        server
    }

    fn send(&mut self, message: &Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends a request and returns its result, skipping notifications.
    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "server closed"
            );
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == id {
                assert!(message.get("error").is_none(), "{message}");
                return message["result"].clone();
            }
        }
    }

    fn read_file(&mut self) -> Value {
        let result = self.request(
            "tools/call",
            json!({"name": "workspace__read_file", "arguments": {"path": "notes/a.md"}}),
        );
        assert_ne!(result["isError"], true, "{result}");
        result
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn report(name: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let (p50, p99) = (
        support::percentile(&samples, 0.50),
        support::percentile(&samples, 0.99),
    );
    println!(
        "{name:<12} p50 {p50:>10.1?}  p99 {p99:>10.1?}  ({} calls)",
        samples.len()
    );
    (p50, p99)
}

fn main() {
    let calls = support::rounds(2_000, 10);
    let warm_up = support::rounds(100, 1);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("notes")).unwrap();
    std::fs::write(root.join("notes/a.md"), "# Notes\nA small file.\n").unwrap();
    let cache = support::component_cache();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let engine = Engine::new(CacheSetting::Dir(cache.clone())).unwrap();
    let registry = runtime
        .block_on(PluginRegistry::with_bundled(&engine))
        .unwrap();
    let grant = Grant::none()
        .folder(root.join("notes"), "notes", Access::ReadOnly)
        .unwrap();
    let limits = Limits::default();
    let args = json!({"path": "notes/a.md"});
    let in_process = || {
        runtime
            .block_on(registry.call_tool("workspace:read_file", &args, &grant, &limits))
            .unwrap()
    };

    let mut server = Server::start(&root, &cache);
    // Both answer the same file.
    let over_mcp = server.read_file();
    assert_eq!(over_mcp["structuredContent"], in_process());

    for _ in 0..warm_up {
        server.read_file();
        in_process();
    }
    let mut mcp = Vec::with_capacity(calls);
    let mut direct = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        server.read_file();
        mcp.push(start.elapsed());
        let start = Instant::now();
        in_process();
        direct.push(start.elapsed());
    }
    let (mcp50, mcp99) = report("MCP stdio", mcp);
    let (direct50, direct99) = report("in process", direct);
    println!(
        "ratio        p50 {:.2}  p99 {:.2}",
        mcp50.as_secs_f64() / direct50.as_secs_f64(),
        mcp99.as_secs_f64() / direct99.as_secs_f64()
    );
}
