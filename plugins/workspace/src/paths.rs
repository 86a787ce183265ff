//! Workspace-relative paths as the agent writes them, and where they live in the
//! guest's filesystem.
//!
//! The host mounts each granted folder at its workspace-relative path with a
//! leading `/`, so `knowledgebase/notes/a.md` is `/knowledgebase/notes/a.md` here.
//! Normalizing is purely lexical and only there to give the agent stable names
//! back: the host's preopens are the security boundary, not this module.

use std::fmt;

/// A normalized workspace path: no `.` or `..` segments, no empty segments, no
/// leading or trailing `/`. The workspace root is the empty path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WsPath(String);

impl WsPath {
    /// Normalizes a path from the agent. A leading `/` is accepted; `..` above the
    /// root stays at the root, as it would for an absolute path.
    pub fn parse(input: &str) -> WsPath {
        let mut segments: Vec<&str> = Vec::new();
        for segment in input.split('/') {
            match segment {
                "" | "." => {}
                ".." => {
                    segments.pop();
                }
                other => segments.push(other),
            }
        }
        WsPath(segments.join("/"))
    }

    /// The path inside the guest's filesystem, where std resolves it against the
    /// preopened grants.
    pub fn guest(&self) -> String {
        format!("/{}", self.0)
    }

    /// The path as shown to the agent: workspace-relative, `.` for the root.
    pub fn display(&self) -> &str {
        if self.0.is_empty() { "." } else { &self.0 }
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The last segment; empty for the root.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or("")
    }

    /// The folder holding this path; the root for a top-level entry and for the
    /// root itself.
    pub fn parent(&self) -> WsPath {
        match self.0.rfind('/') {
            Some(i) => WsPath(self.0[..i].to_owned()),
            None => WsPath(String::new()),
        }
    }

    /// `self/name`, where `name` is one directory entry's name.
    pub fn join(&self, name: &str) -> WsPath {
        if self.0.is_empty() {
            WsPath(name.to_owned())
        } else {
            WsPath(format!("{}/{name}", self.0))
        }
    }
}

impl fmt::Display for WsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_relative_and_rooted_paths_alike() {
        assert_eq!(
            WsPath::parse("knowledgebase/notes/a.md").guest(),
            "/knowledgebase/notes/a.md"
        );
        assert_eq!(
            WsPath::parse("/knowledgebase/notes/a.md").display(),
            "knowledgebase/notes/a.md"
        );
    }

    #[test]
    fn drops_dots_and_empty_segments() {
        assert_eq!(WsPath::parse("./a//b/./c/").display(), "a/b/c");
    }

    #[test]
    fn resolves_parent_segments_lexically_and_never_above_root() {
        assert_eq!(WsPath::parse("a/b/../c").display(), "a/c");
        assert_eq!(WsPath::parse("../../etc/passwd").display(), "etc/passwd");
        assert_eq!(
            WsPath::parse("/granted/../../etc/passwd").guest(),
            "/etc/passwd"
        );
        assert_eq!(WsPath::parse("a/..").display(), ".");
    }

    #[test]
    fn root_has_a_readable_name() {
        for root in ["", ".", "/", "./", "a/.."] {
            let path = WsPath::parse(root);
            assert!(path.is_root(), "{root}");
            assert_eq!(path.display(), ".");
            assert_eq!(path.guest(), "/");
        }
    }

    #[test]
    fn parent_join_and_file_name() {
        let path = WsPath::parse("a/b/c.md");
        assert_eq!(path.file_name(), "c.md");
        assert_eq!(path.parent().display(), "a/b");
        assert_eq!(WsPath::parse("c.md").parent().display(), ".");
        assert_eq!(path.parent().join("d.md"), WsPath::parse("a/b/d.md"));
        assert_eq!(WsPath::parse("").join("x"), WsPath::parse("x"));
    }
}
