//! `trellis mcp serve --http` started for a test: a server with or without a bearer token,
//! ready once it says where it listens, its log kept, killed when dropped; and the raw HTTP
//! requests of the checks an SDK client cannot make (Host, Origin, Authorization, bodies).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running `trellis mcp serve --http`, killed on drop.
pub struct HttpServe {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl HttpServe {
    /// Starts `trellis -v mcp serve --http ADDR ARGS...` with `TRELLIS_TOKEN` set to `token`
    /// (unset without one), and returns once it prints the address it serves at.
    pub fn start(addr: &str, token: Option<&str>, args: &[&str]) -> HttpServe {
        let mut all = vec!["-v", "mcp", "serve", "--http", addr];
        all.extend_from_slice(args);
        let mut command = super::trellis_command(&all);
        command.env_remove("TRELLIS_TOKEN");
        if let Some(token) = token {
            command.env("TRELLIS_TOKEN", token);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let port = loop {
            line.clear();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "the server ended before listening"
            );
            if let Some(url) = line.trim().strip_prefix("trellis: serving MCP at http://") {
                break url
                    .trim_end_matches("/mcp")
                    .rsplit(':')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
            }
        };
        // The rest of its log goes to a thread, kept for the test to read.
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        HttpServe { child, port, log }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The endpoint, on loopback whatever address it was started on.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Its log lines after the one saying where it serves.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for HttpServe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The body of an `initialize` request.
pub const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

/// Sends one HTTP request (`head` lines without the final blank line) with `body`, and
/// returns the status, the headers and the body of the answer.
pub fn raw(port: u16, head: &str, body: &[u8]) -> (u16, String, String) {
    raw_at_version(port, head, body, "2025-06-18")
}

/// The protocol version a request names itself, which rmcp serves without a session.
pub const SESSIONLESS_VERSION: &str = "2026-07-28";

/// Sends request `id` of `method` with `params` to `/mcp` of `port`, naming its protocol
/// version itself ([`SESSIONLESS_VERSION`], with the `Mcp-Method` and `Mcp-Name` headers
/// it asks for), which rmcp serves without a session: the status and body of the answer.
pub fn sessionless_post(
    port: u16,
    id: u64,
    method: &str,
    params: serde_json::Value,
) -> (u16, String) {
    let mut params = params;
    params["_meta"] = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": SESSIONLESS_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    });
    let mut head = format!("POST /mcp HTTP/1.1\r\nHost: localhost:{port}\r\nMcp-Method: {method}");
    if let Some(name) = params["name"].as_str() {
        head.push_str(&format!("\r\nMcp-Name: {name}"));
    }
    let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let (status, _, body) = raw_at_version(
        port,
        &head,
        body.to_string().as_bytes(),
        SESSIONLESS_VERSION,
    );
    (status, body)
}

/// [`raw`] with `MCP-Protocol-Version: VERSION`.
pub fn raw_at_version(port: u16, head: &str, body: &[u8], version: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let request = format!(
        "{head}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: {version}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut writer = stream.try_clone().unwrap();
    let body = body.to_vec();
    // A server that answers before the body is in may close early: write errors are fine.
    let sender = std::thread::spawn(move || {
        let _ = writer.write_all(request.as_bytes());
        let _ = writer.write_all(&body);
    });
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let _ = sender.join();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (headers, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (status, headers.to_ascii_lowercase(), body.to_string())
}

/// The status of a POST to `/mcp` with the header lines `extra` (each after a `\r\n`).
pub fn post(port: u16, extra: &str, body: &str) -> u16 {
    let head = format!("POST /mcp HTTP/1.1{extra}");
    raw(port, &head, body.as_bytes()).0
}

/// One answer read from `stream` (kept open): its status and body (`Content-Length` or
/// chunked).
pub fn read_answer(stream: &mut TcpStream) -> (u16, String) {
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status = status_line
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (mut length, mut chunked) = (None, false);
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let lower = line.trim().to_ascii_lowercase();
        if lower.is_empty() {
            break;
        }
        if let Some(n) = lower.strip_prefix("content-length:") {
            length = n.trim().parse::<usize>().ok();
        }
        chunked |= lower == "transfer-encoding: chunked";
    }
    let mut body = Vec::new();
    if let Some(n) = length {
        body.resize(n, 0);
        reader.read_exact(&mut body).unwrap();
    } else if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            reader.read_exact(&mut chunk).unwrap();
            body.extend_from_slice(&chunk[..n]);
            if n == 0 {
                break;
            }
        }
    }
    (status, String::from_utf8_lossy(&body).into_owned())
}
