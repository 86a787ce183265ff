//! A `wasi:cli` command for the host's script tests, run as `code/<step-id>/main.wasm`.
//!
//! It writes `probe.json` into `STEP_OUTPUT_DIR`: its environment, arguments and
//! working directory, the content of `input.txt` read by a relative path (the
//! working directory is `code/<step-id>/`), and the outcome of attempts to leave
//! its grant: files outside it, a TCP connection to `VAR_CONNECT` (an address such
//! as `127.0.0.1:8080`) and a name lookup. `VAR_HTTP_GET` (`http://host:port/path`)
//! makes it GET that URL through `wasi:http` and report the status and body, or the
//! error. `VAR_EXIT_CODE` makes it exit with that status; `VAR_SPIN` makes it loop
//! forever (the host's deadline must stop it).

use std::io::Write;

use serde_json::{Value, json};

fn main() {
    let env: serde_json::Map<String, Value> = std::env::vars()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    if std::env::var_os("VAR_SPIN").is_some() {
        spin();
    }
    let outcome = |r: std::io::Result<String>| match r {
        Ok(text) => json!({ "ok": text }),
        Err(err) => json!({ "err": err.to_string() }),
    };
    let report = json!({
        "env": env,
        "args": std::env::args().collect::<Vec<_>>(),
        "cwd": std::env::current_dir().map(|p| p.display().to_string()).ok(),
        "input": outcome(std::fs::read_to_string("input.txt")),
        "read_etc_passwd": outcome(std::fs::read_to_string("/etc/passwd")),
        "read_plan": outcome(std::fs::read_to_string("/planning/plan.json")),
        "write_code": outcome(std::fs::write("written.txt", "x").map(|()| String::new())),
        "connect": std::env::var("VAR_CONNECT").ok().map(|addr| outcome(connect(&addr))),
        "lookup": outcome(lookup("localhost:80")),
        "http_get": std::env::var("VAR_HTTP_GET").ok().map(|url| http_get(&url)),
    });
    let out = std::env::var("STEP_OUTPUT_DIR").expect("STEP_OUTPUT_DIR is set");
    let path = format!("{out}/probe.json");
    std::fs::write(&path, report.to_string()).expect("writing probe.json");

    let mut stdout = std::io::stdout();
    writeln!(stdout, "probe: wrote {path}").expect("stdout");
    writeln!(std::io::stderr(), "probe: a line on stderr").expect("stderr");
    if let Some(code) = std::env::var("VAR_EXIT_CODE")
        .ok()
        .and_then(|c| c.parse().ok())
    {
        exit(code);
    }
}

fn connect(addr: &str) -> std::io::Result<String> {
    let stream = std::net::TcpStream::connect(addr)?;
    Ok(format!("connected from {:?}", stream.local_addr()))
}

fn lookup(name: &str) -> std::io::Result<String> {
    use std::net::ToSocketAddrs;
    Ok(format!("{:?}", name.to_socket_addrs()?.collect::<Vec<_>>()))
}

/// GETs a plain `http://` URL through `wasi:http/outgoing-handler`.
#[cfg(target_arch = "wasm32")]
fn http_get(url: &str) -> Value {
    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
    use wasip2::io::streams::StreamError;
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (authority, path) = match rest.split_once('/') {
        Some((a, p)) => (a, format!("/{p}")),
        None => (rest, "/".to_string()),
    };
    let request = OutgoingRequest::new(Fields::new());
    let _ = request.set_method(&Method::Get);
    let _ = request.set_scheme(Some(&Scheme::Http));
    let _ = request.set_authority(Some(authority));
    let _ = request.set_path_with_query(Some(&path));
    let body = request.body().expect("the body of a new request");
    let future = match outgoing_handler::handle(request, None) {
        Ok(future) => future,
        Err(err) => return json!({ "err": format!("{err:?}") }),
    };
    let _ = OutgoingBody::finish(body, None);
    let response = loop {
        if let Some(result) = future.get() {
            break result;
        }
        future.subscribe().block();
    };
    let response = match response {
        Ok(Ok(response)) => response,
        Ok(Err(err)) => return json!({ "err": format!("{err:?}") }),
        Err(()) => return json!({ "err": "the response was taken" }),
    };
    let status = response.status();
    let incoming = response.consume().expect("the body of a response");
    let mut bytes = Vec::new();
    {
        let stream = incoming.stream().expect("the stream of a body");
        loop {
            match stream.blocking_read(65536) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(err) => return json!({ "err": format!("{err:?}") }),
            }
        }
    }
    json!({ "status": status, "body": String::from_utf8_lossy(&bytes) })
}

#[cfg(not(target_arch = "wasm32"))]
fn http_get(_url: &str) -> Value {
    json!({ "err": "wasi:http only" })
}

#[cfg(target_arch = "wasm32")]
fn exit(code: u8) -> ! {
    wasip2::cli::exit::exit_with_code(code);
    unreachable!("exit-with-code returned")
}

#[cfg(not(target_arch = "wasm32"))]
fn exit(code: u8) -> ! {
    std::process::exit(code.into())
}

fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}
