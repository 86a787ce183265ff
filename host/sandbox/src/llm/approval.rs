//! Which origins may receive the key held in which environment variable.
//!
//! Keys belong to the operator, so their destinations do too: a workspace names a
//! variable (`api_key_env`) and a `base_url`, and the run goes ahead only when the
//! operator approved that origin for that variable. Approvals come from the defaults
//! (`OPENAI_API_KEY` to the public OpenAI API and to `$OPENAI_BASE_URL`'s origin when
//! set, `ANTHROPIC_API_KEY` to Anthropic's and to `$ANTHROPIC_BASE_URL`'s), the user
//! config file (`$XDG_CONFIG_HOME/trellis/config.toml`, else
//! `~/.config/trellis/config.toml`, used only when this user alone can write it) and
//! `--allow-key VAR=ORIGIN`; never from the workspace. Plain `http://` to a host other
//! than this machine needs the same approval, with or without a key, since anything on
//! the path can read or answer it.
//!
//! The operator also approves the hosts a step script may reach although they are (or
//! resolve to) loopback or private addresses (`--allow-host HOST`, `allow_host` in the
//! config file): a workspace's `allowed_hosts` alone cannot reach local services. The
//! secrets a script uses (`SECRET_<NAME>`) are approved like keys, `--allow-key
//! SECRET_<NAME>=ORIGIN`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::ProviderDefaults;
use super::http::Origin;

/// The operator's approvals: variable name to the origins its key may go to.
#[derive(Debug, Clone, Default)]
pub struct KeyApprovals {
    approved: BTreeMap<String, Vec<Origin>>,
    /// Hosts scripts may reach at loopback or private addresses: a host on any port, or
    /// on the one port given with it.
    hosts: Vec<super::http::HostRule>,
    config_file: Option<PathBuf>,
    max_tool_rounds: Option<usize>,
}

/// The most tool rounds of a turn an operator may allow.
pub const MAX_TOOL_ROUNDS_CEILING: usize = 100_000;

/// The user config file, `config.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    allow_key: Vec<AllowKey>,
    #[serde(default)]
    allow_host: Vec<String>,
    /// Tool rounds a turn may take before it must answer (the runtime limit).
    max_tool_rounds: Option<i64>,
}

/// One `[[allow_key]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AllowKey {
    var: String,
    origin: String,
}

impl KeyApprovals {
    /// No approvals at all.
    pub fn none() -> Self {
        KeyApprovals::default()
    }

    /// The defaults of each provider that has its own ([`ProviderDefaults::ALL`]): its key
    /// variable to its public API, and to the origin of its base URL variable when the
    /// operator sets it (`OPENAI_API_KEY` to `https://api.openai.com` and
    /// `$OPENAI_BASE_URL`, `ANTHROPIC_API_KEY` to `https://api.anthropic.com` and
    /// `$ANTHROPIC_BASE_URL`).
    pub fn defaults() -> Self {
        let mut approvals = KeyApprovals::none();
        for (_, defaults) in ProviderDefaults::ALL {
            if let Ok(origin) = Origin::parse(defaults.base_url) {
                approvals.push(defaults.key_env, origin);
            }
            if let Ok(url) = std::env::var(defaults.base_url_env)
                && let Ok(origin) = Origin::parse(&url)
            {
                approvals.push(defaults.key_env, origin);
            }
        }
        approvals
    }

    fn push(&mut self, var: &str, origin: Origin) {
        let origins = self.approved.entry(var.to_string()).or_default();
        if !origins.contains(&origin) {
            origins.push(origin);
        }
    }

    /// Approves `origin` (`scheme://host[:port]`, no path) for the key in `var`.
    pub fn allow(&mut self, var: &str, origin: &str) -> Result<()> {
        let var = var.trim();
        if var.is_empty() || !var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            bail!("`{var}` is not an environment variable name (letters, digits and _)");
        }
        let origin = origin.trim();
        let parsed = Origin::parse(origin).map_err(anyhow::Error::msg)?;
        let rest = origin.split_once("://").map_or("", |(_, r)| r);
        if rest.trim_end_matches('/').contains(['/', '?', '#']) {
            bail!("`{origin}` is not an origin: give scheme://host[:port] without a path");
        }
        self.push(var, parsed);
        Ok(())
    }

    /// Lets step scripts reach `host` (a host name or IP address, with a port or any port,
    /// as in `allowed_hosts`) although it is, or resolves to, a loopback or private address
    /// (`--allow-host`).
    pub fn allow_host(&mut self, host: &str) -> Result<()> {
        let rule = super::http::HostRule::parse(host)
            .map_err(|e| anyhow::anyhow!("--allow-host {host:?}: {e}"))?;
        if !self.hosts.contains(&rule) {
            self.hosts.push(rule);
        }
        Ok(())
    }

    /// Whether scripts may reach `target`'s host and port at a loopback or private address.
    pub(crate) fn is_host_approved(&self, target: &Origin) -> bool {
        self.hosts.iter().any(|rule| rule.matches(target))
    }

    /// Adds an approval given as `VAR=ORIGIN` (the `--allow-key` form).
    pub fn allow_spec(&mut self, spec: &str) -> Result<()> {
        let (var, origin) = spec
            .split_once('=')
            .with_context(|| format!("--allow-key {spec:?}: expected VAR=ORIGIN"))?;
        self.allow(var, origin)
            .with_context(|| format!("--allow-key {spec:?}"))
    }

    /// Where the user config file is looked for: `$XDG_CONFIG_HOME/trellis/config.toml`,
    /// else `~/.config/trellis/config.toml`.
    pub fn user_config_path() -> Option<PathBuf> {
        Some(user_config_dir()?.join("config.toml"))
    }

    /// Adds the approvals of the config file at `path`; a missing file adds none. The
    /// file is remembered for messages either way.
    pub fn load_config(&mut self, path: &Path) -> Result<()> {
        self.config_file = Some(path.to_path_buf());
        let text = match read_owner_only(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && e.get_ref().is_some() => {
                bail!("{}: refusing the key approvals: {e}", path.display())
            }
            Err(e) => return Err(e).with_context(|| format!("{}: cannot read", path.display())),
        };
        let config: ConfigFile =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        if let Some(n) = config.max_tool_rounds {
            match usize::try_from(n) {
                Ok(n) if (1..=MAX_TOOL_ROUNDS_CEILING).contains(&n) => {
                    self.max_tool_rounds = Some(n)
                }
                _ => bail!(
                    "{}: max_tool_rounds: expected 1 to {MAX_TOOL_ROUNDS_CEILING}, found {n}",
                    path.display()
                ),
            }
        }
        for (i, entry) in config.allow_key.iter().enumerate() {
            self.allow(&entry.var, &entry.origin)
                .with_context(|| format!("{}: allow_key[{i}]", path.display()))?;
        }
        for (i, host) in config.allow_host.iter().enumerate() {
            self.allow_host(host)
                .with_context(|| format!("{}: allow_host[{i}]", path.display()))?;
        }
        Ok(())
    }

    /// The `max_tool_rounds` of the user config file, when it sets one (the file holds the
    /// operator's settings as well as the key approvals).
    pub fn max_tool_rounds(&self) -> Option<usize> {
        self.max_tool_rounds
    }

    /// Whether the key in `var` may go to `origin`.
    pub(crate) fn is_approved(&self, var: &str, origin: &Origin) -> bool {
        self.approved
            .get(var)
            .is_some_and(|origins| origins.contains(origin))
    }

    /// Whether a provider call may reach `base_url` with the key in `var` (`key_set`:
    /// whether that variable holds a key). The error says what is not approved and how to
    /// approve it.
    pub fn check(&self, var: &str, key_set: bool, base_url: &str) -> Result<(), String> {
        let origin = Origin::parse(base_url)?;
        let plain = origin.is_plain_http() && !origin.is_loopback();
        if (!key_set && !plain) || self.is_approved(var, &origin) {
            return Ok(());
        }
        let what = if plain {
            format!(
                "plain http to {origin} (readable on the way) is not approved for the key in {var}"
            )
        } else {
            format!("the key in {var} is not approved for {origin}")
        };
        Err(format!(
            "{what}; approve it with --allow-key {var}={origin} or in {}",
            self.config_file_shown()
        ))
    }

    /// Whether a provider may reach `base_url`, a base URL the workspace chose (its
    /// `providers.<id>.base_url`), with the key in `var` or none. A host that is plainly
    /// off the public internet (`localhost`, or an address in a special-purpose range)
    /// needs the operator's approval, key or not: `--allow-host` (or `allow_host` in the
    /// config file) for that host, or that origin approved for `var`'s key (`--allow-key`,
    /// `$OPENAI_BASE_URL`). A name is left to [`KeyApprovals::check`] and the key rule:
    /// plain `http://` to it, or any key, needs its origin approved, and `https://`
    /// without a key goes nowhere but a loopback address. The error names the URL, what
    /// its host is and the flag that approves it.
    pub fn check_workspace_host(&self, var: &str, base_url: &str) -> Result<(), String> {
        let origin = Origin::parse(base_url)?;
        if self.is_host_approved(&origin) || self.is_approved(var, &origin) {
            return Ok(());
        }
        match origin.local_host() {
            Some(what) => Err(format!(
                "{base_url} is {what}, off the public internet, which a workspace cannot \
                 choose alone; the operator approves it with --allow-host {} (or allow_host \
                 in {})",
                origin.host_port(),
                self.config_file_shown()
            )),
            None => Ok(()),
        }
    }

    fn config_file_shown(&self) -> String {
        let path = self
            .config_file
            .clone()
            .or_else(KeyApprovals::user_config_path);
        match path {
            Some(path) => {
                let home = std::env::var_os("HOME").map(PathBuf::from);
                match home.as_deref().and_then(|h| path.strip_prefix(h).ok()) {
                    Some(rest) => format!("~/{}", rest.display()),
                    None => path.display().to_string(),
                }
            }
            None => "~/.config/trellis/config.toml".to_string(),
        }
    }
}

/// The user config folder: `$XDG_CONFIG_HOME/trellis`, else `~/.config/trellis`.
pub fn user_config_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".config"))
        })?;
    Some(base.join("trellis"))
}

/// The largest config file read.
const CONFIG_CAP: u64 = 1 << 20;

/// Reads the config at `path` when only this user could have written it: a regular file
/// (a FIFO is refused without blocking) owned by this user and writable by nobody else.
/// Whoever can write it decides which servers receive the keys. A refusal is a
/// `PermissionDenied` error carrying its reason.
fn read_owner_only(path: &Path) -> std::io::Result<String> {
    use crate::store::NotOwnerOnly;
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let denied = |why: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(denied("it is not a regular file".into()));
    }
    match crate::store::check_owner_only(&meta) {
        Ok(()) => {}
        Err(problem @ NotOwnerOnly::Foreign { .. }) => {
            return Err(denied(format!(
                "the file is {problem}; make it yours alone"
            )));
        }
        Err(problem @ NotOwnerOnly::Writable { .. }) => {
            return Err(denied(format!(
                "the file is {problem}; make it yours alone (chmod go-w)"
            )));
        }
    }
    let mut text = String::new();
    file.take(CONFIG_CAP).read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_providers_default_key_goes_to_its_own_api_only() {
        let approvals = KeyApprovals::defaults();
        let ok = |var: &str, url: &str| approvals.check(var, true, url).is_ok();
        assert!(ok("OPENAI_API_KEY", "https://api.openai.com/v1"));
        assert!(ok("ANTHROPIC_API_KEY", "https://api.anthropic.com"));
        assert!(ok("ANTHROPIC_API_KEY", "https://api.anthropic.com/v1"));
        assert!(!ok("ANTHROPIC_API_KEY", "https://api.openai.com/v1"));
        assert!(!ok("OPENAI_API_KEY", "https://api.anthropic.com"));
        assert!(!ok("ANTHROPIC_API_KEY", "http://api.anthropic.com"));
    }

    #[test]
    fn a_key_goes_only_where_the_operator_approved_it() {
        let mut approvals = KeyApprovals::none();
        approvals
            .allow_spec("MY_KEY=https://llm.internal:8443")
            .unwrap();
        assert!(
            approvals
                .check("MY_KEY", true, "https://llm.internal:8443/v1")
                .is_ok()
        );
        let err = approvals
            .check("MY_KEY", true, "https://evil.example/v1")
            .unwrap_err();
        assert!(
            err.contains("the key in MY_KEY is not approved for https://evil.example:443"),
            "{err}"
        );
        assert!(
            err.contains("--allow-key MY_KEY=https://evil.example:443"),
            "{err}"
        );
        // No key: nothing secret goes out, but plain http off this machine still needs a yes.
        assert!(
            approvals
                .check("UNSET", false, "https://anywhere.example")
                .is_ok()
        );
        assert!(
            approvals
                .check("UNSET", false, "http://127.0.0.1:9/v1")
                .is_ok()
        );
        let err = approvals
            .check("UNSET", false, "http://llm.lan:8080/v1")
            .unwrap_err();
        assert!(err.contains("plain http to http://llm.lan:8080"), "{err}");
        assert!(
            approvals
                .check("MY_KEY", true, "http://localhost:1")
                .is_err()
        );
        assert!(approvals.allow_spec("MY_KEY").is_err());
        assert!(approvals.allow_spec("MY_KEY=https://h/v1").is_err());
        assert!(approvals.allow_spec("BAD VAR=https://h").is_err());
        assert!(approvals.allow_spec("K=https://u@h").is_err());
    }

    #[test]
    fn the_config_file_adds_approvals_and_rejects_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(
            &path,
            "allow_host = [\"Metrics.LAN\", \"127.0.0.1:8080\"]\n\
             [[allow_key]]\nvar = \"MY_KEY\"\norigin = \"https://llm.internal:8443\"\n",
        )
        .unwrap();
        let mut approvals = KeyApprovals::none();
        approvals.load_config(&path).unwrap();
        let approved = |url: &str| approvals.is_host_approved(&Origin::parse(url).unwrap());
        assert!(approved("https://metrics.lan"));
        assert!(approved("http://metrics.lan:9090"));
        // A port given with the host approves that port only.
        assert!(approved("http://127.0.0.1:8080"));
        assert!(!approved("http://127.0.0.1:6379"));
        assert!(!approved("http://10.0.0.1"));
        assert!(approvals.allow_host("https://h/x").is_err());
        assert!(
            approvals
                .check("MY_KEY", true, "https://llm.internal:8443")
                .is_ok()
        );
        std::fs::write(
            &path,
            "[[allow_key]]\nvar = \"K\"\norigins = \"https://h\"\n",
        )
        .unwrap();
        let err = KeyApprovals::none().load_config(&path).unwrap_err();
        let err = format!("{err:#}");
        assert!(err.contains("config.toml"), "{err}");
        assert!(err.contains("origins"), "{err}");
        let missing = dir.path().join("none.toml");
        KeyApprovals::none().load_config(&missing).unwrap();
    }

    #[test]
    fn a_config_others_can_write_or_a_fifo_approves_nothing() {
        // Whoever can write config.toml decides where keys go: a file writable by group or
        // others (or not owned by this user) is refused, like the compile cache's files; a
        // FIFO at the path is refused without blocking.
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(
            &path,
            "[[allow_key]]\nvar = \"MY_KEY\"\norigin = \"https://evil.example\"\n",
        )
        .unwrap();
        for mode in [0o666, 0o620, 0o602] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let mut approvals = KeyApprovals::none();
            let err = format!("{:#}", approvals.load_config(&path).unwrap_err());
            assert_eq!(
                err,
                format!(
                    "{}: refusing the key approvals: the file is writable by group or others \
                     (mode {mode:o}); make it yours alone (chmod go-w)",
                    path.display()
                )
            );
            assert!(
                approvals
                    .check("MY_KEY", true, "https://evil.example")
                    .is_err()
            );
        }
        let fifo = dir.path().join("fifo.toml");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = format!("{:#}", KeyApprovals::none().load_config(&fifo).unwrap_err());
        assert_eq!(
            err,
            format!(
                "{}: refusing the key approvals: it is not a regular file",
                fifo.display()
            )
        );
    }
}
