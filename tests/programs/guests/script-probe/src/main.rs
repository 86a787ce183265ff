//! A `wasi:cli` command for the host's script tests, run as `code/<step-id>/main.wasm`.
//!
//! It writes `probe.json` into `STEP_OUTPUT_DIR`: its environment, arguments and
//! working directory, the content of `input.txt` read by a relative path (the
//! working directory is `code/<step-id>/`), and the outcome of attempts to leave
//! its grant: files outside it, a TCP connection to `VAR_CONNECT` (an address such
//! as `127.0.0.1:8080`) and a name lookup. `VAR_EXIT_CODE` makes it exit with that
//! status; `VAR_SPIN` makes it loop forever (the host's deadline must stop it).

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
