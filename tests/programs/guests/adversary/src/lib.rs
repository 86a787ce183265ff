//! A tool plugin that tries, one tool per attack, to do what a Trellis plugin must
//! not: leave its folder grants (links, renames), write to a read-only grant, read the
//! host's environment, open sockets (TCP, UDP, name lookup), burn CPU, memory, disk or
//! file descriptors, overflow its stack, flood its outputs, keep state between calls,
//! read its stdin, or panic. Host tests call these tools and assert that the sandbox
//! stops each one and that the host keeps serving calls afterwards (`echo`). A refused
//! operation fails with the raw WASI error code (`EACCES`, `EPERM`...) and nothing else, so
//! the tests assert which refusal it was, not how a library words it.
//!
//! Everything goes through plain `std` with the path exactly as given: no
//! normalization, so `../` and absolute paths reach WASI untouched and the
//! host's preopens are the only thing in the way.

use std::hint::black_box;
use std::io::Write;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use serde_json::{Map, Value, json};
use trellis_plugin_sdk::db;
use trellis_plugin_sdk::export_tool_plugin;
use trellis_plugin_sdk::tool::{Tool, ToolError, ToolPlugin};

struct Adversary;

/// A tool's name, description and parameters as (name, JSON type); every
/// parameter is required, and an empty type accepts any JSON value.
type Spec = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

const TOOLS: &[Spec] = &[
    (
        "read",
        "Reads a file and returns its content as a string.",
        &[("path", "string")],
    ),
    (
        "write",
        "Writes `content` to a file, creating or truncating it.",
        &[("path", "string"), ("content", "string")],
    ),
    (
        "list",
        "Lists a folder's entry names.",
        &[("path", "string")],
    ),
    (
        "env",
        "Returns the environment variables and the command-line arguments.",
        &[],
    ),
    (
        "connect",
        "Opens a TCP connection to `addr` (host:port).",
        &[("addr", "string")],
    ),
    ("spin", "Loops forever.", &[]),
    (
        "spin_marked",
        "Writes the file `marker` (saying it started), then loops forever.",
        &[("marker", "string")],
    ),
    (
        "memory_bomb",
        "Allocates 1 MiB chunks forever, touching and keeping each one.",
        &[],
    ),
    (
        "recurse",
        "Recurses `depth` levels with 1 KiB of stack per level.",
        &[("depth", "integer")],
    ),
    (
        "huge_output",
        "Returns a string of `bytes` bytes.",
        &[("bytes", "integer")],
    ),
    ("panic", "Panics with `message`.", &[("message", "string")]),
    (
        "stderr_flood",
        "Writes `bytes` bytes to stderr, then returns.",
        &[("bytes", "integer")],
    ),
    ("echo", "Returns `value` unchanged.", &[("value", "")]),
    (
        "overlap",
        "Marks itself running with a file `running-*` in folder `dir`, waits until `peers` \
         calls are marked there or `ms` milliseconds pass, and returns the most it saw at once.",
        &[("dir", "string"), ("peers", "integer"), ("ms", "integer")],
    ),
    (
        "db_query",
        "Runs `sql` as a query on the workflow database.",
        &[("sql", "string")],
    ),
    (
        "db_execute",
        "Runs `sql` as a statement on the workflow database.",
        &[("sql", "string")],
    ),
    (
        "symlink",
        "Creates a symbolic link at `link` pointing to `target`.",
        &[("target", "string"), ("link", "string")],
    ),
    (
        "hard_link",
        "Creates a hard link at `to` for the file `from`.",
        &[("from", "string"), ("to", "string")],
    ),
    (
        "rename",
        "Renames `from` to `to`.",
        &[("from", "string"), ("to", "string")],
    ),
    (
        "fill",
        "Writes `bytes` bytes to the file `path` in 1 MiB chunks.",
        &[("path", "string"), ("bytes", "integer")],
    ),
    (
        "many_files",
        "Creates `count` empty files in the folder `dir`; says how many it made.",
        &[("dir", "string"), ("count", "integer")],
    ),
    (
        "open_many",
        "Opens the file `path` `count` times, keeping every handle; says how many it opened.",
        &[("path", "string"), ("count", "integer")],
    ),
    (
        "deep_dirs",
        "Creates folders nested `depth` deep under `dir`; says how deep it got.",
        &[("dir", "string"), ("depth", "integer")],
    ),
    (
        "long_name",
        "Creates a file in `dir` whose name is `length` characters long.",
        &[("dir", "string"), ("length", "integer")],
    ),
    (
        "udp",
        "Sends a UDP datagram to `addr` (host:port).",
        &[("addr", "string")],
    ),
    (
        "resolve",
        "Looks up the addresses of `host`.",
        &[("host", "string")],
    ),
    (
        "stdout_flood",
        "Writes `bytes` bytes to stdout, then returns.",
        &[("bytes", "integer")],
    ),
    (
        "flood_and_panic",
        "Writes `bytes` bytes to stderr, then panics.",
        &[("bytes", "integer")],
    ),
    (
        "db_steps",
        "Runs `steps` in order on one workflow-db connection, each {sql, params (strings), write}; stops at the first failure.",
        &[("steps", "array")],
    ),
    (
        "churn_preopens",
        "Opens the file `path` `count` times, keeping every handle, and between two opens takes the preopened folders again and drops them; says how many it opened.",
        &[("path", "string"), ("count", "integer")],
    ),
    (
        "streams_outlive",
        "Opens `name` in the preopened folder `dir` `count` times, keeping a read stream of each and dropping the descriptor; says how many it kept.",
        &[("dir", "string"), ("name", "string"), ("count", "integer")],
    ),
    (
        "sparse_write",
        "Writes one byte at `offset` of the file `path` (created), through `how`: `seek` (std) or `write` (descriptor write at an offset); returns the file's length.",
        &[("path", "string"), ("offset", "integer"), ("how", "string")],
    ),
    (
        "long_error",
        "Fails with an error message of `bytes` bytes.",
        &[("bytes", "integer")],
    ),
    (
        "scribble",
        "Writes a 32-byte pattern made from `seed` over `bytes` bytes of heap, into a static and on its stack; returns how many copies of it its memory then holds (see `snoop`).",
        &[("seed", "integer"), ("bytes", "integer")],
    ),
    (
        "snoop",
        "Grows its memory by 8 MiB, then scans all of it for the 32-byte pattern `scribble` writes for `seed`; returns how many copies it found.",
        &[("seed", "integer")],
    ),
    (
        "counter",
        "Adds one to a counter kept in the instance's memory and returns it.",
        &[],
    ),
    (
        "stdin",
        "Reads its stdin to the end; returns the bytes it got (at most 64 KiB are kept) and how many.",
        &[],
    ),
];

/// State an instance would carry from one call to the next, if instances were reused.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Where `scribble` leaves a copy of its pattern in the module's static data.
static STASH: [AtomicU8; 32] = [const { AtomicU8::new(0) }; 32];

/// 32 bytes derived from `seed` (a linear congruential generator). What `scribble` writes is
/// their complement, which `snoop` never holds: a copy it finds was written by someone else.
fn pattern(seed: u64) -> [u8; 32] {
    let mut x = seed | 1;
    std::array::from_fn(|_| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 56) as u8
    })
}

/// Leaves the complement of the pattern of `seed` in the heap (`bytes` of it), the static
/// data and the stack, then counts the copies its memory holds (so a test knows the scan
/// sees them).
fn scribble(seed: u64, bytes: u64) -> u64 {
    let written = pattern(seed).map(|b| !b);
    let heap: Vec<u8> = written
        .iter()
        .copied()
        .cycle()
        .take(usize::try_from(bytes).unwrap_or(usize::MAX))
        .collect();
    for (slot, byte) in STASH.iter().zip(written) {
        slot.store(byte, Ordering::Relaxed);
    }
    let on_stack = black_box(written);
    let found = copies_in_memory(&pattern(seed));
    black_box((&heap, &on_stack));
    found
}

/// Grows the memory by 8 MiB (fresh pages must be zeros too), then counts the places in
/// the whole linear memory that hold the complement of `needle`.
fn copies_in_memory(needle: &[u8; 32]) -> u64 {
    #[cfg(target_arch = "wasm32")]
    let end = {
        core::arch::wasm32::memory_grow(0, 128);
        core::arch::wasm32::memory_size(0) * 65536
    };
    #[cfg(not(target_arch = "wasm32"))]
    let end = 0;
    let mut found = 0;
    // Address 0 is the null pointer: start past it.
    for addr in 8..end.saturating_sub(needle.len()) {
        // SAFETY: every address below the memory's size is mapped in a wasm32 instance.
        let here = unsafe { std::slice::from_raw_parts(addr as *const u8, needle.len()) };
        if here.iter().zip(needle).all(|(m, n)| *m == !*n) {
            found += 1;
        }
    }
    found
}

impl ToolPlugin for Adversary {
    fn tools() -> Vec<Tool> {
        TOOLS
            .iter()
            .map(|(name, description, params)| {
                let properties: Map<String, Value> = params
                    .iter()
                    .map(|(param, ty)| {
                        let schema = if ty.is_empty() {
                            json!({})
                        } else {
                            json!({ "type": ty })
                        };
                        ((*param).to_owned(), schema)
                    })
                    .collect();
                let required: Vec<&str> = params.iter().map(|(param, _)| *param).collect();
                Tool::new(
                    *name,
                    *description,
                    json!({
                        "$schema": "https://json-schema.org/draft/2020-12/schema",
                        "type": "object",
                        "properties": properties,
                        "required": required,
                        "additionalProperties": false,
                    }),
                )
            })
            .collect()
    }

    fn has_tool(name: &str) -> bool {
        TOOLS.iter().any(|(tool, _, _)| *tool == name)
    }

    fn call(name: &str, args: Value) -> Result<Value, ToolError> {
        match name {
            "read" => {
                let path = string(&args, "path")?;
                std::fs::read_to_string(path)
                    .map(Value::String)
                    .map_err(failed)
            }
            "write" => {
                let path = string(&args, "path")?;
                std::fs::write(path, string(&args, "content")?)
                    .map(|()| json!({ "written": true }))
                    .map_err(failed)
            }
            "list" => {
                let path = string(&args, "path")?;
                let names = std::fs::read_dir(path)
                    .and_then(|entries| {
                        entries
                            .map(|entry| {
                                entry.map(|e| e.file_name().to_string_lossy().into_owned())
                            })
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .map_err(failed)?;
                Ok(json!(names))
            }
            "env" => {
                let vars: Map<String, Value> = std::env::vars()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect();
                let args: Vec<String> = std::env::args().collect();
                Ok(json!({ "vars": vars, "args": args }))
            }
            "connect" => {
                let addr = string(&args, "addr")?;
                match std::net::TcpStream::connect(addr) {
                    Ok(stream) => Ok(
                        json!({ "connected": true, "peer": format!("{:?}", stream.peer_addr()) }),
                    ),
                    Err(e) => Err(failed(e)),
                }
            }
            "spin" => spin(),
            "spin_marked" => {
                let marker = string(&args, "marker")?;
                std::fs::write(marker, b"started").map_err(failed)?;
                spin()
            }
            "memory_bomb" => memory_bomb(),
            "recurse" => Ok(json!(recurse(number(&args, "depth")?))),
            "huge_output" => Ok(Value::String(
                "x".repeat(usize::try_from(number(&args, "bytes")?).unwrap_or(usize::MAX)),
            )),
            "panic" => panic!("{}", string(&args, "message")?),
            "stderr_flood" => stderr_flood(number(&args, "bytes")?),
            "echo" => Ok(args.get("value").cloned().unwrap_or(Value::Null)),
            "overlap" => overlap(
                string(&args, "dir")?,
                number(&args, "peers")?,
                number(&args, "ms")?,
            ),
            "db_query" => db::query(string(&args, "sql")?, &[])
                .map(Value::Array)
                .map_err(db_failure),
            "db_execute" => db::execute(string(&args, "sql")?, &[])
                .map(|changed| json!({ "changed": changed }))
                .map_err(db_failure),
            "symlink" => symlink(string(&args, "target")?, string(&args, "link")?)
                .map(|()| json!({ "linked": true }))
                .map_err(failed),
            "hard_link" => std::fs::hard_link(string(&args, "from")?, string(&args, "to")?)
                .map(|()| json!({ "linked": true }))
                .map_err(failed),
            "rename" => std::fs::rename(string(&args, "from")?, string(&args, "to")?)
                .map(|()| json!({ "renamed": true }))
                .map_err(failed),
            "fill" => fill(string(&args, "path")?, number(&args, "bytes")?),
            "many_files" => {
                let dir = string(&args, "dir")?;
                repeat(number(&args, "count")?, |i| {
                    std::fs::write(format!("{dir}/f{i}"), b"").map(drop)
                })
            }
            "open_many" => {
                let path = string(&args, "path")?;
                let mut handles = Vec::new();
                repeat(number(&args, "count")?, |_| {
                    handles.push(std::fs::File::open(path)?);
                    Ok(())
                })
            }
            "deep_dirs" => {
                let mut path = string(&args, "dir")?.to_owned();
                repeat(number(&args, "depth")?, |_| {
                    path.push_str("/d");
                    std::fs::create_dir(&path)
                })
            }
            "long_name" => {
                let length = usize::try_from(number(&args, "length")?).unwrap_or(usize::MAX);
                let path = format!("{}/{}", string(&args, "dir")?, "n".repeat(length));
                std::fs::write(&path, b"x")
                    .map(|()| json!({ "written": length }))
                    .map_err(failed)
            }
            "udp" => {
                let addr = string(&args, "addr")?;
                std::net::UdpSocket::bind("0.0.0.0:0")
                    .and_then(|socket| socket.send_to(b"ping", addr))
                    .map(|sent| json!({ "sent": sent }))
                    .map_err(failed)
            }
            "resolve" => {
                use std::net::ToSocketAddrs;
                (string(&args, "host")?, 80)
                    .to_socket_addrs()
                    .map(|addrs| json!(addrs.map(|a| a.to_string()).collect::<Vec<_>>()))
                    .map_err(failed)
            }
            "stdout_flood" => {
                let chunk = [b'o'; 64 * 1024];
                let mut stdout = std::io::stdout().lock();
                let bytes = number(&args, "bytes")?;
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    stdout.write_all(&chunk[..n]).map_err(failed)?;
                    left -= n as u64;
                }
                Ok(json!({ "written": bytes }))
            }
            "db_steps" => db_steps(&args["steps"]),
            "churn_preopens" => {
                let path = string(&args, "path")?;
                let mut handles = Vec::new();
                repeat(number(&args, "count")?, |_| {
                    // Dropping a preopen must not give back a descriptor that is still held.
                    drop(wasip2::filesystem::preopens::get_directories());
                    handles.push(std::fs::File::open(path)?);
                    Ok(())
                })
            }
            "streams_outlive" => streams_outlive(
                string(&args, "dir")?,
                string(&args, "name")?,
                number(&args, "count")?,
            ),
            "sparse_write" => sparse_write(
                string(&args, "path")?,
                number(&args, "offset")?,
                string(&args, "how")?,
            ),
            "counter" => Ok(json!(CALLS.fetch_add(1, Ordering::Relaxed) + 1)),
            "stdin" => read_stdin(),
            "scribble" => Ok(json!(scribble(
                number(&args, "seed")?,
                number(&args, "bytes")?
            ))),
            "snoop" => Ok(json!(copies_in_memory(&pattern(number(&args, "seed")?)))),
            "long_error" => Err(ToolError::Failed(
                "x".repeat(usize::try_from(number(&args, "bytes")?).unwrap_or(usize::MAX)),
            )),
            "flood_and_panic" => {
                stderr_flood(number(&args, "bytes")?)?;
                panic!("after the flood")
            }
            other => Err(ToolError::UnknownTool(other.to_owned())),
        }
    }
}

fn string<'a>(args: &'a Value, key: &str) -> Result<&'a str, ToolError> {
    args[key]
        .as_str()
        .ok_or_else(|| ToolError::InvalidArguments(format!("`{key}` must be a string")))
}

fn number(args: &Value, key: &str) -> Result<u64, ToolError> {
    args[key].as_u64().ok_or_else(|| {
        ToolError::InvalidArguments(format!("`{key}` must be a non-negative integer"))
    })
}

/// The WIT case name first, so host tests can match on the kind of refusal.
fn db_failure(err: db::DbError) -> ToolError {
    ToolError::Failed(match err {
        db::DbError::NotGranted => "not-granted".to_owned(),
        db::DbError::ReadOnly(message) => format!("read-only: {message}"),
        db::DbError::Sql(message) => format!("sql: {message}"),
        db::DbError::TooLarge(message) => format!("too-large: {message}"),
    })
}

/// An io error as the tool's failure: the raw WASI error code and nothing else, so host
/// tests assert which refusal it was, not how some library words it.
fn failed(err: std::io::Error) -> ToolError {
    ToolError::Failed(code(&err))
}

/// wasi-libc's `errno` names, by value (`libc/src/wasi/mod.rs`): `errno` is WASI's own
/// error code of the call that failed, numbered as in WASI preview 1.
const ERRNO: [&str; 77] = [
    "ESUCCESS",
    "E2BIG",
    "EACCES",
    "EADDRINUSE",
    "EADDRNOTAVAIL",
    "EAFNOSUPPORT",
    "EAGAIN",
    "EALREADY",
    "EBADF",
    "EBADMSG",
    "EBUSY",
    "ECANCELED",
    "ECHILD",
    "ECONNABORTED",
    "ECONNREFUSED",
    "ECONNRESET",
    "EDEADLK",
    "EDESTADDRREQ",
    "EDOM",
    "EDQUOT",
    "EEXIST",
    "EFAULT",
    "EFBIG",
    "EHOSTUNREACH",
    "EIDRM",
    "EILSEQ",
    "EINPROGRESS",
    "EINTR",
    "EINVAL",
    "EIO",
    "EISCONN",
    "EISDIR",
    "ELOOP",
    "EMFILE",
    "EMLINK",
    "EMSGSIZE",
    "EMULTIHOP",
    "ENAMETOOLONG",
    "ENETDOWN",
    "ENETRESET",
    "ENETUNREACH",
    "ENFILE",
    "ENOBUFS",
    "ENODEV",
    "ENOENT",
    "ENOEXEC",
    "ENOLCK",
    "ENOLINK",
    "ENOMEM",
    "ENOMSG",
    "ENOPROTOOPT",
    "ENOSPC",
    "ENOSYS",
    "ENOTCONN",
    "ENOTDIR",
    "ENOTEMPTY",
    "ENOTRECOVERABLE",
    "ENOTSOCK",
    "ENOTSUP",
    "ENOTTY",
    "ENXIO",
    "EOVERFLOW",
    "EOWNERDEAD",
    "EPERM",
    "EPIPE",
    "EPROTO",
    "EPROTONOSUPPORT",
    "EPROTOTYPE",
    "ERANGE",
    "EROFS",
    "ESPIPE",
    "ESRCH",
    "ESTALE",
    "ETIMEDOUT",
    "ETXTBSY",
    "EXDEV",
    "ENOTCAPABLE",
];

/// The `errno` name of `err` (`EACCES`), or what std made of an error without one.
fn code(err: &std::io::Error) -> String {
    match err.raw_os_error() {
        Some(errno) => usize::try_from(errno)
            .ok()
            .and_then(|i| ERRNO.get(i))
            .map_or_else(|| format!("errno {errno}"), |name| (*name).to_owned()),
        None => format!("no errno ({:?}: {err})", err.kind()),
    }
}

/// Runs `step` `count` times or until it fails; says how many succeeded and the error.
fn repeat(
    count: u64,
    mut step: impl FnMut(u64) -> std::io::Result<()>,
) -> Result<Value, ToolError> {
    for i in 0..count {
        if let Err(err) = step(i) {
            return Ok(json!({ "done": i, "error": code(&err) }));
        }
    }
    Ok(json!({ "done": count }))
}

/// `symlink(2)` of wasi-libc, which std does not expose on stable for WASI targets.
fn symlink(target: &str, link: &str) -> std::io::Result<()> {
    use std::ffi::{CString, c_char, c_int};
    unsafe extern "C" {
        fn symlink(target: *const c_char, link: *const c_char) -> c_int;
    }
    let target = CString::new(target).map_err(std::io::Error::other)?;
    let link = CString::new(link).map_err(std::io::Error::other)?;
    // SAFETY: both are valid NUL-terminated strings that outlive the call.
    match unsafe { symlink(target.as_ptr(), link.as_ptr()) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn fill(path: &str, bytes: u64) -> Result<Value, ToolError> {
    let chunk = vec![b'f'; 1 << 20];
    let mut file = std::fs::File::create(path).map_err(failed)?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..n]).map_err(failed)?;
        left -= n as u64;
    }
    Ok(json!({ "written": bytes }))
}

fn db_steps(steps: &Value) -> Result<Value, ToolError> {
    let mut results = Vec::new();
    for step in steps.as_array().into_iter().flatten() {
        let sql = string(step, "sql")?;
        let params: Vec<db::SqlValue> = step["params"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| db::SqlValue::from(p.as_str().unwrap_or_default()))
            .collect();
        let result = if step["write"].as_bool().unwrap_or(false) {
            db::execute(sql, &params).map(|changed| json!({ "changed": changed }))
        } else {
            db::query(sql, &params).map(Value::Array)
        };
        results.push(result.map_err(db_failure)?);
    }
    Ok(Value::Array(results))
}

/// Keeps the read stream of a file after dropping its descriptor: the stream holds the host's
/// file open all the same.
fn streams_outlive(dir: &str, name: &str, count: u64) -> Result<Value, ToolError> {
    use wasip2::filesystem::types::{DescriptorFlags, OpenFlags, PathFlags};
    let (folder, _) = wasip2::filesystem::preopens::get_directories()
        .into_iter()
        .find(|(_, guest)| guest == dir)
        .ok_or_else(|| ToolError::Failed(format!("no preopen {dir}")))?;
    let mut streams = Vec::new();
    for i in 0..count {
        let file = match folder.open_at(
            PathFlags::empty(),
            name,
            OpenFlags::empty(),
            DescriptorFlags::READ,
        ) {
            Ok(file) => file,
            Err(e) => return Ok(json!({ "done": i, "error": format!("{e:?}") })),
        };
        match file.read_via_stream(0) {
            Ok(stream) => streams.push(stream),
            Err(e) => return Ok(json!({ "done": i, "error": format!("{e:?}") })),
        }
        drop(file);
    }
    Ok(json!({ "done": count }))
}

fn sparse_write(path: &str, offset: u64, how: &str) -> Result<Value, ToolError> {
    use std::io::{Seek, SeekFrom};
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(failed)?;
    match how {
        "seek" => {
            file.seek(SeekFrom::Start(offset)).map_err(failed)?;
            file.write_all(b"x").map_err(failed)?;
        }
        _ => {
            drop(file);
            let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
            let (folder, _) = wasip2::filesystem::preopens::get_directories()
                .into_iter()
                .find(|(_, guest)| guest == dir)
                .ok_or_else(|| ToolError::Failed(format!("no preopen {dir}")))?;
            let file = folder
                .open_at(
                    wasip2::filesystem::types::PathFlags::empty(),
                    name,
                    wasip2::filesystem::types::OpenFlags::empty(),
                    wasip2::filesystem::types::DescriptorFlags::WRITE,
                )
                .map_err(|e| ToolError::Failed(format!("{e:?}")))?;
            file.write(b"x", offset)
                .map_err(|e| ToolError::Failed(format!("{e:?}")))?;
        }
    }
    let len = std::fs::metadata(path).map_err(failed)?.len();
    Ok(json!({ "len": len }))
}

/// How many calls run at once, seen from inside: each marks itself with a file of its
/// own in `dir`, counts the marks while it waits (a sleep yields to the host, so calls
/// the host runs at once overlap here), and removes its mark.
fn overlap(dir: &str, peers: u64, ms: u64) -> Result<Value, ToolError> {
    use std::hash::{BuildHasher, Hasher};
    let unique = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let mark = format!("{dir}/running-{unique:016x}");
    std::fs::write(&mark, b"").map_err(|e| ToolError::from_io_write(&mark, &e))?;
    let start = std::time::Instant::now();
    let mut most = 0;
    loop {
        let now = std::fs::read_dir(dir)
            .map_err(|e| ToolError::from_io(dir, &e))?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("running-"))
            .count();
        most = most.max(now);
        if most as u64 >= peers || start.elapsed().as_millis() >= u128::from(ms) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Seen long enough for the others to count it too.
    std::thread::sleep(std::time::Duration::from_millis(50));
    std::fs::remove_file(&mark).map_err(|e| ToolError::from_io_write(&mark, &e))?;
    Ok(json!(most))
}

/// Reads stdin until end of file (or an error, reported by its code).
fn read_stdin() -> Result<Value, ToolError> {
    use std::io::Read;
    let mut kept = Vec::new();
    let mut total = 0u64;
    let mut buf = [0u8; 4096];
    let mut stdin = std::io::stdin().lock();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                total += n as u64;
                let room = (64usize << 10).saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(err) => return Err(failed(err)),
        }
    }
    Ok(json!({ "bytes": total, "read": String::from_utf8_lossy(&kept) }))
}

fn spin() -> ! {
    let mut counter = 0u64;
    loop {
        counter = black_box(counter.wrapping_add(1));
    }
}

fn memory_bomb() -> ! {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut chunk = vec![0u8; 1024 * 1024];
        // Touch every page so the memory is really used, even on a host that
        // commits lazily.
        for page in chunk.chunks_mut(4096) {
            page[0] = 1;
        }
        chunks.push(black_box(chunk));
    }
}

/// Not a tail call: the frame's array is read after the recursive call returns,
/// and `black_box` stops the compiler from shrinking or removing it.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    let frame = black_box([depth as u8; 1024]);
    if depth == 0 {
        return u64::from(frame[0]);
    }
    recurse(depth - 1).wrapping_add(u64::from(black_box(&frame)[1023]))
}

fn stderr_flood(bytes: u64) -> Result<Value, ToolError> {
    let chunk = [b'e'; 64 * 1024];
    let mut stderr = std::io::stderr().lock();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        stderr
            .write_all(&chunk[..n])
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        left -= n as u64;
    }
    Ok(json!({ "written": bytes }))
}

export_tool_plugin!(Adversary);
