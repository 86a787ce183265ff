//! `plugin.json`: what a third-party plugin folder declares about its component.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// The file name of a plugin manifest.
pub const MANIFEST_FILE: &str = "plugin.json";

/// The most bytes of a `plugin.json` Trellis reads: a manifest is a few lines.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// Which WIT world a plugin implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum PluginKind {
    /// World `tool-plugin`: tools agents can call.
    Tool,
    /// World `validator-plugin`: custom `validation_type` checks.
    Validator,
    /// World `llm-provider`: a language model behind an API.
    LlmProvider,
}

impl PluginKind {
    /// The interface of the plugin API a component of this kind must export: `tool`.
    pub fn interface(self) -> &'static str {
        match self {
            PluginKind::Tool => "tool",
            PluginKind::Validator => "validator",
            PluginKind::LlmProvider => "llm",
        }
    }

    /// The full name of that interface at the host's plugin API version
    /// ([`super::api::PLUGIN_API_VERSION`]): `trellis:plugin/tool@0.1.0`.
    pub fn export(self) -> String {
        super::api::interface_name(self.interface())
    }

    /// The WIT world name.
    pub fn world(self) -> &'static str {
        match self {
            PluginKind::Tool => "tool-plugin",
            PluginKind::Validator => "validator-plugin",
            PluginKind::LlmProvider => "llm-provider",
        }
    }

    /// The word used in manifests and listings.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Tool => "tool",
            PluginKind::Validator => "validator",
            PluginKind::LlmProvider => "llm-provider",
        }
    }
}

impl std::fmt::Display for PluginKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A parsed and checked `plugin.json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Plugin id: the `server` part of `server:tool`.
    pub id: String,
    /// The world the component implements.
    pub kind: PluginKind,
    /// The plugin's own version.
    pub version: String,
    /// One line for `trellis plugins list`.
    pub description: String,
    /// The component file, relative to the manifest's folder.
    pub component: PathBuf,
}

impl Manifest {
    /// Parses and checks manifest text.
    pub fn parse(text: &str) -> Result<Manifest> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let manifest: Manifest = serde_path_to_error::deserialize(de).map_err(|err| {
            let path = err.path().to_string();
            let inner = err.into_inner();
            if path == "." {
                anyhow::anyhow!("{inner}")
            } else {
                anyhow::anyhow!("{path}: {inner}")
            }
        })?;
        manifest.check()?;
        Ok(manifest)
    }

    fn check(&self) -> Result<()> {
        check_id(&self.id).context("id")?;
        if self.version.trim().is_empty() {
            bail!("version: expected a version such as \"0.1.0\", found an empty string");
        }
        if self.description.trim().is_empty() {
            bail!(
                "description: expected one line saying what the plugin does, found an empty string"
            );
        }
        let component = &self.component;
        if component.is_absolute()
            || component
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            bail!(
                "component: expected a file inside the plugin folder, found {}",
                component.display()
            );
        }
        Ok(())
    }
}

/// Plugin ids are the `server` half of tool names: lowercase, digits, `_`, `-`.
pub fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !ok {
        bail!(
            "expected 1-64 characters of a-z, 0-9, `_` or `-`, starting with a letter, found {id:?}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        format!("{:#}", Manifest::parse(text).unwrap_err())
    }

    #[test]
    fn a_good_manifest_parses() {
        let m = Manifest::parse(
            r#"{"id":"echo","kind":"tool","version":"0.1.0","description":"Echo.","component":"echo.wasm"}"#,
        )
        .unwrap();
        assert_eq!(m.kind, PluginKind::Tool);
        assert_eq!(m.component, PathBuf::from("echo.wasm"));
    }

    #[test]
    fn bad_manifests_say_which_field_and_what_was_expected() {
        let base = r#""version":"0.1.0","description":"d","component":"x.wasm""#;
        assert!(
            err(&format!(r#"{{"id":"echo","kind":"tol",{base}}}"#)).starts_with(
                "kind: unknown variant `tol`, expected one of `tool`, `validator`, `llm-provider`"
            )
        );
        assert!(
            err(&format!(r#"{{"id":"Echo!","kind":"tool",{base}}}"#))
                .starts_with("id: expected 1-64")
        );
        assert!(
            err(&format!(r#"{{"id":"e","kind":"tool","extra":1,{base}}}"#))
                .contains("unknown field `extra`")
        );
        assert!(err(r#"{"id":"e","kind":"tool"}"#).contains("missing field"));
        assert!(
            err(r#"{"id":"e","kind":"tool","version":"1","description":"d","component":"../x.wasm"}"#)
                .starts_with("component: expected a file inside the plugin folder")
        );
        assert!(err("{not json").contains("line 1"));
    }
}
