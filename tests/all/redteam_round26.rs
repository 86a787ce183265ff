//! Red team round 26 (the workspace's quota, database files, plugin builds, servers): each
//! a test that failed before its fix.

use crate::support;

use support::fake_llm::{FakeServer, completion};
use support::trellis;
use support::workspace::regular_steps;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

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
