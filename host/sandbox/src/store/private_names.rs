//! Names the host never shows a model nor copies for one, whatever a workspace or a model
//! asks: hidden files and folders (`.env`, `.git/`, `.ssh/`), files that look like secrets
//! (keys, credentials, passwords), and files with other hard links (a file linked from
//! outside the workspace reads as a plain file there). The builder's read tools and
//! `migrate`'s script copies refuse them alike.

use std::path::{Component, Path};

use super::WorkspaceFs;

/// Why the read tools never show `rel`: it, or a folder on its way, is hidden (`.env`,
/// `.git/`) or looks like a secret (keys, credentials, passwords). `None`: it may be shown.
pub fn refusal_for(rel: &Path) -> Option<String> {
    for part in rel.components() {
        let Component::Normal(name) = part else {
            continue;
        };
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            return Some(format!(
                "{} is hidden ({name}): hidden files and folders (.env, .git, .ssh) are never \
                 read",
                rel.display()
            ));
        }
        if looks_secret(&name) {
            return Some(format!(
                "{} looks like a secret ({name}): key, credential and password files are never \
                 read",
                rel.display()
            ));
        }
    }
    None
}

/// Names of keys, certificates with private parts, credentials and env files.
fn looks_secret(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    const EXTENSIONS: &[&str] = &[
        "env", "pem", "key", "p12", "pfx", "jks", "keystore", "kdbx", "ppk", "gpg", "asc",
    ];
    const PREFIXES: &[&str] = &["id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "env."];
    const PARTS: &[&str] = &[
        "secret",
        "credential",
        "password",
        "passwd",
        "apikey",
        "api_key",
        "api-key",
        "private_key",
        "private-key",
        "access_token",
        "auth_token",
        "refresh_token",
    ];
    const NAMES: &[&str] = &["env", "netrc", "_netrc", "htpasswd", "shadow"];
    let ext = lower.rsplit_once('.').map(|(_, e)| e);
    NAMES.contains(&lower.as_str())
        || ext.is_some_and(|e| EXTENSIONS.contains(&e))
        || PREFIXES.iter().any(|p| lower.starts_with(p))
        || PARTS.iter().any(|p| lower.contains(p))
}

/// Whether the regular file `rel` has more than one name: a hard link made to a file outside
/// the workspace reads as a plain file, and the grant of its folder cannot tell.
pub fn has_other_links(fs: &WorkspaceFs, rel: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(fs.host_path(rel)).is_ok_and(|m| m.nlink() > 1)
    }
    #[cfg(not(unix))]
    {
        let _ = (fs, rel);
        false
    }
}
