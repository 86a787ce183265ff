//! A `trellis serve` child process for the tests, and the builder-demo workspace it serves.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::workspace::copy_workspace;

/// A running `trellis serve`, killed on drop.
pub struct Serve {
    child: Child,
    /// The port it listens on.
    pub port: u16,
}

impl Serve {
    /// Starts `trellis serve WS --addr 127.0.0.1:0 ARGS...` with `TRELLIS_TOKEN` set to
    /// `token` (unset without one) and returns once it says where it listens.
    pub fn start(ws: &Path, token: Option<&str>, args: &[&str]) -> Serve {
        Self::start_with(ws, token, args, &[])
    }

    /// [`Serve::start`] with the environment variables `envs` set too.
    pub fn start_with(
        ws: &Path,
        token: Option<&str>,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Serve {
        let mut all = vec!["serve", ws.to_str().unwrap(), "--addr", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let mut command = super::trellis_command(&all);
        command.envs(envs.iter().copied());
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
            if let Some((_, url)) = line.trim().split_once(" on http://127.0.0.1:") {
                break url.split('/').next().unwrap().parse().unwrap();
            }
        };
        std::thread::spawn(move || for _ in stderr.lines() {});
        Serve { child, port }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `METHOD PATH` with the header lines `headers` and `body`: the status, the headers
    /// (lower case) and the body.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[&str],
        body: &str,
    ) -> (u16, String, String) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n",
            self.port
        );
        for h in headers {
            head.push_str(h);
            head.push_str("\r\n");
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        ));
        let mut writer = stream.try_clone().unwrap();
        let body = body.as_bytes().to_vec();
        // A server that answers before the body is in may close early: write errors are fine.
        let sender = std::thread::spawn(move || {
            let _ = writer.write_all(head.as_bytes());
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

    /// `GET path` as JSON, with `headers`.
    pub fn get(&self, path: &str, headers: &[&str]) -> (u16, Value) {
        let (status, _, body) = self.request("GET", path, headers, "");
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    /// `POST path` with a JSON body.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, _, text) = self.request(
            "POST",
            path,
            &["Content-Type: application/json"],
            &body.to_string(),
        );
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Reads the event stream of `session` (after `Last-Event-ID: last` when given) until an
    /// event of type `until`: the events in order.
    pub fn stream_until(&self, session: &str, last: Option<u64>, until: &str) -> Vec<Value> {
        self.stream_at_until(
            &format!("/api/sessions/{session}/events/stream"),
            last,
            until,
        )
    }

    /// Reads the event stream at `path` (after `Last-Event-ID: last` when given) until an
    /// event of type `until`: the events in order.
    pub fn stream_at_until(&self, path: &str, last: Option<u64>, until: &str) -> Vec<Value> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        let resume = last.map_or(String::new(), |n| format!("Last-Event-ID: {n}\r\n"));
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{resume}\r\n",
            self.port
        )
        .unwrap();
        let mut reader = BufReader::new(stream);
        let mut events = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                reader.read_line(&mut line).unwrap() > 0,
                "the stream ended before {until}: {events:?}"
            );
            // Chunked framing lines and `id:`/`event:` lines aside, each `data:` is an event.
            if let Some(data) = line.trim().strip_prefix("data: ") {
                let event: Value = serde_json::from_str(data).unwrap();
                let done = event["type"] == until;
                events.push(event);
                if done {
                    return events;
                }
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The builder-demo example in `dir/ws`.
pub fn demo(dir: &Path) -> std::path::PathBuf {
    let ws = dir.join("ws");
    copy_workspace(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/builder-demo"),
        &ws,
        &["runs", "builder", "costs"],
    );
    ws
}

pub const DEMO_QUERY: &str = "Add a scripted step count-words that counts the words of each note in \
    knowledgebase/notes into counts.json, run it, and fix it if it fails.";
