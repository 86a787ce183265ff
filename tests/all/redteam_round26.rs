//! Red team round 26 (the workspace's quota, database files, plugin builds, servers): each
//! a test that failed before its fix.

use crate::support;

use support::fake_llm::{FakeServer, completion};
use support::trellis;
use support::workspace::{create_db, regular_steps};

use crate::support::plugin_build::text;

/// A `session.json` that is there but does not read (a status no run writes) was shown as
/// `(no session.json)`, its entries quietly gone (LOW): `runs show` says it is unreadable
/// and why, escaped.
#[test]
fn runs_show_says_a_session_that_does_not_read_is_unreadable() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let llm = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    regular_steps(root, llm.providers(), &["s"]);
    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let session = root.join("runs/iteration-0/execution/s/session.json");
    let mut value: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&session).unwrap()).unwrap();
    value["status"] = "completed\u{1b}]0;forged\u{7}".into();
    std::fs::write(&session, value.to_string()).unwrap();
    let out = trellis(&["runs", "show", root.to_str().unwrap(), "s"]);
    let shown = text(&out.stdout);
    assert!(shown.contains("(session.json unreadable: "), "{shown}");
    assert!(!shown.contains("(no session.json)"), "{shown}");
    assert!(!shown.contains('\u{1b}'), "{shown}");
}

/// A database file with holes (1 TiB long, 8 KiB on disk) grew to 1.15 GB on disk under a
/// 16 MiB budget: SQLite fills holes without growing the file, which is what the growth
/// ceiling counts (MEDIUM). Such a file is not opened to write, the message naming it.
#[test]
fn a_sparse_database_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let llm = support::fake_llm::db_growing_model(4194304);
    regular_steps(root, llm.providers(), &["s"]);
    create_db(root, "CREATE TABLE t(b BLOB);");
    let db = root.join("db/db.sqlite");
    std::fs::File::options()
        .write(true)
        .open(&db)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let out = trellis(&["run", root.to_str().unwrap(), "--allow-host", "127.0.0.1"]);
    let said = text(&out.stdout) + &text(&out.stderr);
    use std::os::unix::fs::MetadataExt;
    let on_disk = std::fs::metadata(&db).unwrap().blocks() * 512;
    assert!(on_disk < 1 << 20, "{on_disk} bytes on disk: {said}");
    let results: Vec<String> = llm
        .seen()
        .iter()
        .flat_map(support::fake_llm::tool_results_of)
        .map(|(_, result)| result)
        .collect();
    assert!(
        results
            .iter()
            .any(|r| r.contains("db/db.sqlite is a sparse file")),
        "{results:?}"
    );
}

/// What the host writes for a run (logs, sessions, offloaded results; a builder's
/// conversation) is not charged as it is written, so runs went on writing them into a
/// workspace far past its quota: 140 MB a run with an 8 MiB quota (MEDIUM). A workspace at
/// its quota begins no run, builder session or script, saying why; nothing is written.
#[test]
fn a_workspace_at_its_quota_begins_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let llm = FakeServer::start(Box::new(|_| (200, completion("done", &[]))));
    regular_steps(root, llm.providers(), &["s"]);
    std::fs::create_dir_all(root.join("knowledge")).unwrap();
    std::fs::write(root.join("knowledge/data.bin"), vec![7u8; 5 << 20]).unwrap();
    std::fs::create_dir_all(root.join("code/s")).unwrap();
    std::fs::write(root.join("code/s/main.py"), "print('hi')\n").unwrap();
    let ws = root.to_str().unwrap();
    let quota = ["--max-workspace-mib", "4"];
    for args in [
        vec!["run", ws, "--allow-host", "127.0.0.1"],
        vec!["builder", ws, "--allow-host", "127.0.0.1", "-m", "hello"],
        vec!["script", ws, "--step", "s"],
    ] {
        let out = trellis(&[args.as_slice(), &quota].concat());
        let said = text(&out.stdout) + &text(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {said}");
        assert!(
            said.contains("its quota of 4194304 or more (--max-workspace-mib)"),
            "{args:?}: {said}"
        );
    }
    assert!(!root.join("runs").exists());
    assert!(!root.join("builder/conversation").exists());
    assert!(llm.seen().is_empty());
}

/// `trellis mcp serve --http` answered a request without the token and kept its connection
/// open: a client pipelining wrong-token requests it never read kept its places, and with
/// many such connections reconnecting, evicted most fresh connections of the client with
/// the token (MEDIUM/LOW). A refused request ends its connection, as `trellis serve` does.
#[test]
fn mcp_serve_ends_the_connection_of_a_refused_request() {
    use std::io::{Read, Write};
    const TOKEN: &str = "tok-0123456789abcdefXYZ";
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("shared")).unwrap();
    let serve = support::mcp_serve::HttpServe::start(
        "127.0.0.1:0",
        Some(TOKEN),
        &["--root", dir.path().to_str().unwrap(), "--read", "shared"],
    );
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", serve.port())).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let request = format!(
        "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer wrong\r\n\r\n",
        serve.port()
    );
    stream.write_all(request.repeat(3).as_bytes()).unwrap();
    let mut answers = String::new();
    stream.read_to_string(&mut answers).unwrap();
    assert_eq!(answers.matches("HTTP/1.1 401").count(), 1, "{answers}");
    assert!(
        answers.to_ascii_lowercase().contains("connection: close"),
        "{answers}"
    );
}
