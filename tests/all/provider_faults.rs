//! Faults of an OpenAI-compatible provider, through `trellis run`: a raw TCP server on
//! 127.0.0.1 that answers each request with a scripted fault (a connection cut mid-body
//! or reset, malformed JSON, an empty `choices`, a 200 carrying an `error`, a body over
//! the provider's limit) and then, once the script is used up, with a plain answer.
//! Transport failures and a gateway's error are retried and the step completes; a fault
//! that persists, or an answer that cannot be understood, fails the step with a message
//! naming `openai` and the model. Whatever happens, every JSON file under `runs/` parses.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::support;
use crate::support::fake_llm::completion;

const MODEL: &str = "fault-model-7";

/// What one request gets.
#[derive(Debug, Clone)]
enum Fault {
    /// Headers announcing the whole answer, half of its body, then the connection closes.
    DropMidBody,
    /// The connection is reset (SO_LINGER 0) without a byte of answer.
    Reset,
    /// A 200 whose body is not JSON.
    MalformedJson,
    /// A 200 with `"choices": []`.
    EmptyChoices,
    /// A 200 with an `{"error": ...}` object, as some gateways send.
    ErrorObject,
    /// A 200 with a body over the provider's 32 MiB limit.
    Huge,
    /// Headers and the start of a body, then nothing more while the connection stays open.
    NeverEnds,
}

/// The server: faults in order, then plain answers.
struct FaultServer {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl FaultServer {
    fn start(faults: Vec<Fault>) -> FaultServer {
        FaultServer::listen(TcpListener::bind("127.0.0.1:0").unwrap(), faults)
    }

    fn listen(listener: TcpListener, faults: Vec<Fault>) -> FaultServer {
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let count = requests.clone();
        let faults = Arc::new(Mutex::new(VecDeque::from(faults)));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (count, faults) = (count.clone(), faults.clone());
                std::thread::spawn(move || serve(stream, &count, &faults));
            }
        });
        FaultServer { addr, requests }
    }

    /// The same fault for every request.
    fn always(fault: Fault) -> FaultServer {
        FaultServer::start(vec![fault; 1000])
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

/// Reads one request, then answers it with the next fault, or plainly.
fn serve(stream: TcpStream, count: &AtomicUsize, faults: &Mutex<VecDeque<Fault>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut length = 0;
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 {
            return;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    count.fetch_add(1, Ordering::SeqCst);
    let fault = faults.lock().unwrap().pop_front();
    let mut stream = stream;
    let ok = completion("recovered", &[]).to_string();
    let reply = |body: &str| {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        )
    };
    match fault {
        None => {
            let _ = stream.write_all(reply(&ok).as_bytes());
        }
        Some(Fault::DropMidBody) => {
            let whole = reply(&ok);
            let cut = whole.len() - ok.len() / 2;
            let _ = stream.write_all(&whole.as_bytes()[..cut]);
            let _ = stream.flush();
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        Some(Fault::Reset) => {
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: a valid socket and a `linger` of the size given.
            let rc = unsafe {
                libc::setsockopt(
                    stream.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&raw const linger).cast(),
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0, "SO_LINGER");
            drop(stream);
        }
        Some(Fault::MalformedJson) => {
            let _ = stream.write_all(reply("{\"choices\": [{\"message\": oops").as_bytes());
        }
        Some(Fault::EmptyChoices) => {
            let body = json!({"id": "c", "object": "chat.completion", "choices": []});
            let _ = stream.write_all(reply(&body.to_string()).as_bytes());
        }
        Some(Fault::ErrorObject) => {
            let body = json!({"error": {"message": "upstream model overloaded", "code": 502}});
            let _ = stream.write_all(reply(&body.to_string()).as_bytes());
        }
        Some(Fault::NeverEnds) => {
            let whole = reply(&ok);
            let cut = whole.len() - ok.len() / 2;
            let _ = stream.write_all(&whole.as_bytes()[..cut]);
            let _ = stream.flush();
            // Held open until the client gives up and closes its side.
            let _ = reader.read_to_end(&mut Vec::new());
        }
        Some(Fault::Huge) => {
            let filler = "x".repeat(33 << 20);
            let body = format!("{{\"choices\": [], \"pad\": \"{filler}\"}}");
            let _ = stream.write_all(reply(&body).as_bytes());
        }
    }
}

/// A one-step agent workspace whose model is `openai:MODEL` at `base_url`.
fn workspace(root: &Path, base_url: &str) {
    support::workspace::write_files(
        root,
        &[
            (
                "planning/plan.json",
                json!({"objective": "faults", "steps": [{"id": "answer", "type": "regular",
                       "title": "answer", "description": "Answer."}]})
                .to_string(),
            ),
            (
                "planning/step_config.json",
                json!({"steps": []}).to_string(),
            ),
            (
                "workflow.json",
                json!({"llm": {"provider": "openai", "model_id": MODEL},
                       "providers": {"openai": {"base_url": base_url,
                                                "api_key_env": "TRELLIS_TEST_NO_KEY"}}})
                .to_string(),
            ),
        ],
    );
}

/// `trellis run` with two quick retries, and attempts that may stall for a second; the
/// operator approves loopback, where the workspace's `base_url` is.
fn run(root: &Path) -> Output {
    support::trellis(&[
        "run",
        root.to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--llm-retries",
        "2",
        "--llm-retry-delay",
        "10",
        "--llm-timeout",
        "1",
    ])
}

use crate::support::plugin_build::text;

/// Every `.json` file under `runs/` parses, and there is at least the session.
fn assert_runs_parse(root: &Path) {
    let mut seen = 0;
    let mut stack = vec![root.join("runs")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                let bytes = std::fs::read(&path).unwrap();
                serde_json::from_slice::<Value>(&bytes)
                    .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
                seen += 1;
            }
        }
    }
    assert!(seen > 0, "no JSON file under runs/");
    assert!(
        root.join("runs/iteration-0/execution/answer/session.json")
            .is_file(),
        "no session.json"
    );
}

/// The run failed, naming the provider, the model, the attempts and `what`.
fn assert_failed(out: &Output, root: &Path, attempts: usize, what: &str) {
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "{all}");
    let tried = format!("model `{MODEL}`, {attempts} attempt");
    for needle in ["LLM provider `openai`", &tried, what] {
        assert!(all.contains(needle), "no {needle:?} in:\n{all}");
    }
    assert_runs_parse(root);
    let session =
        std::fs::read_to_string(root.join("runs/iteration-0/execution/answer/session.json"))
            .unwrap();
    assert!(session.contains(&tried), "{session}");
}

/// The fault happened once, the call was retried, and the step completed.
fn assert_recovered(fault: Fault) {
    let server = FaultServer::start(vec![fault.clone()]);
    let dir = tempfile::tempdir().unwrap();
    workspace(dir.path(), &server.base_url());
    let out = run(dir.path());
    assert!(
        out.status.success(),
        "{fault:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("step answer: completed"));
    assert_eq!(server.requests(), 2, "{fault:?}: one fault, one retry");
    assert_runs_parse(dir.path());
}

/// The fault persists: the call is tried `attempts` times, then the step fails.
fn assert_persistent(fault: Fault, attempts: usize, what: &str) {
    let server = FaultServer::always(fault.clone());
    let dir = tempfile::tempdir().unwrap();
    workspace(dir.path(), &server.base_url());
    let out = run(dir.path());
    assert_failed(&out, dir.path(), attempts, what);
    assert_eq!(server.requests(), attempts, "{fault:?}");
}

#[test]
fn a_connection_cut_mid_body_is_retried() {
    assert_recovered(Fault::DropMidBody);
    assert_persistent(
        Fault::DropMidBody,
        3,
        "broke before the answer was complete",
    );
}

#[test]
fn a_reset_connection_is_retried() {
    assert_recovered(Fault::Reset);
    assert_persistent(Fault::Reset, 3, "transport:");
}

#[test]
fn a_gateways_error_object_is_retried_like_a_server_error() {
    assert_recovered(Fault::ErrorObject);
    assert_persistent(Fault::ErrorObject, 3, "upstream model overloaded");
}

#[test]
fn a_body_that_never_ends_times_out_and_is_retried() {
    assert_recovered(Fault::NeverEnds);
    assert_persistent(Fault::NeverEnds, 3, "no answer in time");
}

#[test]
fn malformed_json_fails_the_step_at_once() {
    assert_persistent(Fault::MalformedJson, 1, "the body is not JSON");
}

#[test]
fn empty_choices_fail_the_step_at_once() {
    assert_persistent(Fault::EmptyChoices, 1, "no `choices[0]`");
}

#[test]
fn a_body_over_the_limit_fails_the_step_at_once() {
    assert_persistent(Fault::Huge, 1, "response body over");
}

#[test]
fn a_refused_connection_is_retried_then_named() {
    // A port nobody listens on: every attempt is refused.
    let held = HeldPort::new();
    let port = held.port;
    let dir = tempfile::tempdir().unwrap();
    workspace(dir.path(), &format!("http://127.0.0.1:{port}/v1"));
    let out = run(dir.path());
    let refused = format!("transport: connection to `127.0.0.1:{port}` refused");
    assert_failed(&out, dir.path(), 3, &refused);
}

/// A port of 127.0.0.1 held by a socket bound to it that does not listen: connecting to it
/// is refused, and no other test can take it meanwhile (as it could a port bound, let go
/// and bound again). [`HeldPort::listen`] makes that same socket a listener.
struct HeldPort {
    socket: std::os::fd::OwnedFd,
    port: u16,
}

impl HeldPort {
    fn new() -> HeldPort {
        use std::os::fd::FromRawFd;
        // SAFETY: a new socket, owned from here on.
        let socket = unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "{}", std::io::Error::last_os_error());
            std::os::fd::OwnedFd::from_raw_fd(fd)
        };
        let mut addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
            sin_zero: [0; 8],
        };
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `addr` is a sockaddr_in of `len` bytes, alive for both calls.
        unsafe {
            let at = (&raw mut addr).cast::<libc::sockaddr>();
            assert_eq!(libc::bind(socket.as_raw_fd(), at, len), 0);
            assert_eq!(libc::getsockname(socket.as_raw_fd(), at, &mut len), 0);
        }
        HeldPort {
            socket,
            port: u16::from_be(addr.sin_port),
        }
    }

    /// The socket, listening now on the same port.
    fn listen(self) -> TcpListener {
        // SAFETY: listen on a bound socket this value owns.
        assert_eq!(unsafe { libc::listen(self.socket.as_raw_fd(), 128) }, 0);
        TcpListener::from(self.socket)
    }
}

#[test]
fn a_connection_refused_for_a_moment_is_retried_until_the_server_is_up() {
    let held = HeldPort::new();
    let port = held.port;
    let dir = tempfile::tempdir().unwrap();
    workspace(dir.path(), &format!("http://127.0.0.1:{port}/v1"));
    let mut child = support::trellis_command(&[
        "run",
        dir.path().to_str().unwrap(),
        "--allow-host",
        "127.0.0.1",
        "--llm-retries",
        "6",
        "--llm-retry-delay",
        "200",
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // The run's log lines, as it writes them.
    let stderr = child.stderr.take().unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    // The server comes up only once an attempt was refused: the run logs each failed call.
    let mut log = Vec::new();
    let refused = loop {
        // A generous bound that only a run that never calls its model reaches.
        let line = lines
            .recv_timeout(std::time::Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("no failed call logged ({e}):\n{}", log.join("\n")));
        log.push(line.clone());
        if line.contains("LLM call failed") {
            break line;
        }
    };
    assert!(
        refused.contains(&format!(
            "transport: connection to `127.0.0.1:{port}` refused"
        )),
        "the first attempt did not fail as refused: {refused}"
    );
    let server = FaultServer::listen(held.listen(), vec![]);
    let out = child.wait_with_output().unwrap();
    reader.join().unwrap();
    log.extend(lines.try_iter());
    let all = format!("{}{}", text(&out.stdout), log.join("\n"));
    assert!(out.status.success(), "{all}");
    assert!(
        text(&out.stdout).contains("step answer: completed"),
        "{all}"
    );
    assert_eq!(
        server.requests(),
        1,
        "only the attempt after it came up reached it"
    );
    assert_runs_parse(dir.path());
}
