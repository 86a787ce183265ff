//! The operator's MCP server file: `{"mcpServers": {KEY: {command, args, env, url, headers,
//! protocol, description, pool_config, oauth}}}`, read from `--mcp-config FILE`, else from
//! `mcp_servers.json` in the user config folder with `mcp_servers_user.json` beside it
//! winning key by key. Never from a workspace.
//!
//! The transport of an entry: an explicit `protocol` wins, else a `url` means streamable
//! HTTP, else stdio. `sse` is refused. Keys Trellis does not use (`pool_config`, `oauth`, and
//! any unknown one) are warned about, never silently dropped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use trellis_sandbox::plugins::normalize_tool_name;
use trellis_sandbox::store::{NotOwnerOnly, check_owner_only};

/// The file of the user config folder.
pub const SERVERS_FILE: &str = "mcp_servers.json";
/// The overlay beside it: its entries replace those of the same key.
pub const USER_SERVERS_FILE: &str = "mcp_servers_user.json";
/// The largest server file read.
const FILE_CAP: u64 = 1 << 20;

/// How Trellis talks to a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A process started by Trellis, spoken to over its stdin and stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Its whole environment (nothing of Trellis's own is passed on).
        env: BTreeMap<String, String>,
    },
    /// A server already listening, spoken to over streamable HTTP.
    Http {
        /// The endpoint.
        url: String,
        /// Sent with every request.
        headers: BTreeMap<String, String>,
    },
}

impl Transport {
    /// `stdio` or `streamable_http`.
    pub fn name(&self) -> &'static str {
        match self {
            Transport::Stdio { .. } => "stdio",
            Transport::Http { .. } => "streamable_http",
        }
    }
}

/// One configured server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The key as written in the file.
    pub key: String,
    /// How to reach it.
    pub transport: Transport,
    /// `description`, shown by `plugins list`.
    pub description: String,
    /// The file it came from.
    pub file: PathBuf,
}

/// The servers the operator configured, by normalized key, and what the files had that
/// Trellis does not use.
#[derive(Debug, Clone, Default)]
pub struct McpConfig {
    servers: BTreeMap<String, ServerConfig>,
    /// Keys and values warned about (unsupported or unknown), each naming its file.
    pub warnings: Vec<String>,
}

impl McpConfig {
    /// No server.
    pub fn empty() -> Self {
        McpConfig::default()
    }

    /// The user config folder: `$XDG_CONFIG_HOME/trellis`, else `~/.config/trellis`.
    pub fn user_dir() -> Option<PathBuf> {
        trellis_sandbox::llm::user_config_dir()
    }

    /// The servers of `explicit` (`--mcp-config`, which must exist), else those of the user
    /// config folder's two files (either may be missing).
    pub fn load(explicit: Option<&Path>) -> Result<Self> {
        let mut config = McpConfig::empty();
        match explicit {
            Some(file) => {
                let text = read_operator_file(file)?
                    .with_context(|| format!("{}: no such file", file.display()))?;
                config.add_file(file, &text)?;
            }
            None => {
                if let Some(dir) = McpConfig::user_dir() {
                    for name in [SERVERS_FILE, USER_SERVERS_FILE] {
                        let file = dir.join(name);
                        if let Some(text) = read_operator_file(&file)? {
                            config.add_file(&file, &text)?;
                        }
                    }
                }
            }
        }
        Ok(config)
    }

    /// Adds the servers of one file's `text`; an entry replaces one of the same key.
    pub fn add_file(&mut self, file: &Path, text: &str) -> Result<()> {
        let shown = file.display();
        let value: Value =
            serde_json::from_str(text).with_context(|| format!("{shown}: not valid JSON"))?;
        let Value::Object(top) = value else {
            bail!("{shown}: expected an object with \"mcpServers\"");
        };
        for key in top.keys().filter(|k| *k != "mcpServers") {
            self.warnings
                .push(format!("{shown}: unknown key {key:?} ignored"));
        }
        let servers = match top.get("mcpServers") {
            None | Some(Value::Null) => return Ok(()),
            Some(Value::Object(servers)) => servers,
            Some(_) => bail!("{shown}: mcpServers: expected an object of servers by key"),
        };
        for (key, entry) in servers {
            let server = self.parse_server(file, key, entry)?;
            self.servers.insert(normalize_tool_name(key.trim()), server);
        }
        Ok(())
    }

    fn parse_server(&mut self, file: &Path, key: &str, entry: &Value) -> Result<ServerConfig> {
        let at = format!("{}: mcpServers.{key}", file.display());
        if key.trim().is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            bail!(
                "{at}: a server key is letters, digits, `_` and `-` (it names the server's tools as KEY:TOOL)"
            );
        }
        let Value::Object(entry) = entry else {
            bail!("{at}: expected an object");
        };
        let text = |name: &str| -> Result<Option<String>> {
            match entry.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => bail!("{at}.{name}: expected a string"),
            }
        };
        let map = |name: &str| -> Result<BTreeMap<String, String>> {
            match entry.get(name) {
                None | Some(Value::Null) => Ok(BTreeMap::new()),
                Some(Value::Object(m)) => m
                    .iter()
                    .map(|(k, v)| match v {
                        Value::String(s) => Ok((k.clone(), s.clone())),
                        _ => bail!("{at}.{name}.{k}: expected a string"),
                    })
                    .collect(),
                Some(_) => bail!("{at}.{name}: expected an object of strings"),
            }
        };
        let command = text("command")?;
        let url = text("url")?;
        let args = match entry.get("args") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => bail!("{at}.args: expected strings"),
                })
                .collect::<Result<_>>()?,
            Some(_) => bail!("{at}.args: expected an array of strings"),
        };
        let env = map("env")?;
        let headers = map("headers")?;
        let protocol = text("protocol")?.map(|p| p.trim().to_ascii_lowercase().replace('-', "_"));
        let http = match protocol.as_deref() {
            Some("stdio") => false,
            Some("streamable_http" | "http" | "streamablehttp") => true,
            Some("sse") => bail!(
                "{at}.protocol: \"sse\" (the old HTTP+SSE transport) is not supported: use a streamable HTTP endpoint (\"protocol\": \"streamable_http\") or stdio"
            ),
            Some(other) => bail!(
                "{at}.protocol: unknown protocol {other:?}: expected \"stdio\" or \"streamable_http\""
            ),
            None => url.is_some(),
        };
        let transport = if http {
            let Some(url) = url else {
                bail!("{at}: a streamable HTTP server needs a \"url\"");
            };
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                bail!("{at}.url: expected an http:// or https:// URL, found {url:?}");
            }
            for name in headers.keys() {
                if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    bail!("{at}.headers: {name:?} is not a header name");
                }
            }
            for (field, unused) in [("command", command.is_some()), ("args", !args.is_empty())]
                .into_iter()
                .chain([("env", !env.is_empty())])
            {
                if unused {
                    self.warnings
                        .push(format!("{at}.{field}: ignored by a streamable HTTP server"));
                }
            }
            Transport::Http { url, headers }
        } else {
            let Some(command) = command.filter(|c| !c.trim().is_empty()) else {
                bail!(
                    "{at}: a stdio server needs a \"command\" (or a \"url\" for streamable HTTP)"
                );
            };
            for (field, unused) in [("url", url.is_some()), ("headers", !headers.is_empty())] {
                if unused {
                    self.warnings
                        .push(format!("{at}.{field}: ignored by a stdio server"));
                }
            }
            Transport::Stdio { command, args, env }
        };
        for name in entry.keys() {
            match name.as_str() {
                "command" | "args" | "env" | "url" | "headers" | "protocol" | "description" => {}
                "pool_config" | "oauth" => self
                    .warnings
                    .push(format!("{at}.{name}: not supported by Trellis, ignored")),
                other => self
                    .warnings
                    .push(format!("{at}: unknown key {other:?} ignored")),
            }
        }
        Ok(ServerConfig {
            key: key.to_string(),
            transport,
            description: text("description")?.unwrap_or_default(),
            file: file.to_path_buf(),
        })
    }

    /// The server of `key` (compared normalized).
    pub fn get(&self, key: &str) -> Option<&ServerConfig> {
        self.servers.get(&normalize_tool_name(key.trim()))
    }

    /// Every server, by normalized key.
    pub fn servers(&self) -> impl Iterator<Item = (&str, &ServerConfig)> {
        self.servers.iter().map(|(k, s)| (k.as_str(), s))
    }

    /// Whether no server is configured.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// An error naming every server key that is also a plugin id of `plugin_ids` or a
    /// category of host tools: a workspace's `selected_servers` could not tell them apart.
    pub fn check_collisions<'a>(
        &self,
        plugin_ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<()> {
        let reserved = [
            crate::db_tools::WORKFLOW_DB_CATEGORY,
            crate::filters::DELEGATION_CATEGORY,
        ];
        let ids: Vec<String> = plugin_ids
            .into_iter()
            .map(|id| normalize_tool_name(id.trim()))
            .chain(reserved.iter().map(|r| r.to_string()))
            .collect();
        let clashes: Vec<String> = self
            .servers
            .iter()
            .filter(|(key, _)| ids.contains(key))
            .map(|(_, s)| {
                format!(
                    "{}: MCP server {:?} has the id of a plugin or tool category",
                    s.file.display(),
                    s.key
                )
            })
            .collect();
        if clashes.is_empty() {
            Ok(())
        } else {
            bail!("{}; rename the server key", clashes.join("\n"))
        }
    }
}

/// The text of an operator file, `None` when it does not exist. Whoever can write it decides
/// which program Trellis starts, so it must be a regular file owned by this user and
/// writable by nobody else.
fn read_operator_file(path: &Path) -> Result<Option<String>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let shown = path.display();
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("{shown}: cannot read")),
    };
    let meta = file
        .metadata()
        .with_context(|| format!("{shown}: cannot read"))?;
    if !meta.is_file() {
        bail!("{shown}: refusing the MCP servers: it is not a regular file");
    }
    match check_owner_only(&meta) {
        Ok(()) => {}
        Err(NotOwnerOnly::Foreign { .. }) => {
            bail!("{shown}: refusing the MCP servers: the file is not owned by you")
        }
        Err(NotOwnerOnly::Writable { .. }) => {
            bail!("{shown}: refusing the MCP servers: others can write it (chmod go-w)")
        }
    }
    if meta.len() > FILE_CAP {
        bail!("{shown}: larger than {FILE_CAP} bytes");
    }
    let mut text = String::new();
    file.take(FILE_CAP)
        .read_to_string(&mut text)
        .with_context(|| format!("{shown}: cannot read"))?;
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<McpConfig> {
        let mut config = McpConfig::empty();
        config.add_file(Path::new("servers.json"), text)?;
        Ok(config)
    }

    #[test]
    fn transport_follows_protocol_then_url() {
        let config = parse(
            r#"{"mcpServers": {
                "local": {"command": "srv", "args": ["-v"], "env": {"A": "1"}},
                "remote": {"url": "https://mcp.example/mcp", "headers": {"X-Team": "a"}},
                "forced": {"protocol": "stdio", "command": "srv", "url": "http://x"}
            }}"#,
        )
        .unwrap();
        assert_eq!(config.get("local").unwrap().transport.name(), "stdio");
        assert_eq!(
            config.get("remote").unwrap().transport,
            Transport::Http {
                url: "https://mcp.example/mcp".into(),
                headers: [("X-Team".to_string(), "a".to_string())].into()
            }
        );
        assert_eq!(config.get("forced").unwrap().transport.name(), "stdio");
        assert_eq!(
            config.warnings,
            vec!["servers.json: mcpServers.forced.url: ignored by a stdio server"]
        );
    }

    #[test]
    fn sse_is_refused_and_unsupported_keys_warned() {
        let err = parse(r#"{"mcpServers": {"s": {"url": "http://h/sse", "protocol": "sse"}}}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"sse\"") && err.contains("not supported"),
            "{err}"
        );
        let config = parse(
            r#"{"mcpServers": {"s": {"command": "x", "oauth": {}, "pool_config": {}, "colour": 1}}, "extra": 1}"#,
        )
        .unwrap();
        let all = config.warnings.join("\n");
        for needle in [
            "\"extra\"",
            "s.oauth: not supported",
            "s.pool_config: not supported",
            "\"colour\"",
        ] {
            assert!(all.contains(needle), "{needle} in {all}");
        }
    }

    #[test]
    fn overlay_wins_and_collisions_are_errors() {
        let mut config = McpConfig::empty();
        config
            .add_file(
                Path::new("a.json"),
                r#"{"mcpServers": {"s": {"command": "one"}}}"#,
            )
            .unwrap();
        config
            .add_file(
                Path::new("b.json"),
                r#"{"mcpServers": {"S": {"command": "two"}}}"#,
            )
            .unwrap();
        match &config.get("s").unwrap().transport {
            Transport::Stdio { command, .. } => assert_eq!(command, "two"),
            other => panic!("{other:?}"),
        }
        let err = config.check_collisions(["workspace", "s"]).unwrap_err();
        assert!(err.to_string().contains("\"S\""), "{err}");
        assert!(config.check_collisions(["workspace"]).is_ok());
        assert!(parse(r#"{"mcpServers": {"a:b": {"command": "x"}}}"#).is_err());
        assert!(parse(r#"{"mcpServers": {"s": {"args": []}}}"#).is_err());
    }
}
