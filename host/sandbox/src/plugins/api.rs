//! The versions of the plugin API (`trellis:plugin`, in `wit/trellis-plugin@<version>/`)
//! this host supports, in one place, and the check of what a component exports and imports
//! against them.
//!
//! The host is built from one version of the WIT ([`PLUGIN_API_VERSION`]) and accepts any
//! component targeting a version in [`SUPPORTED_PLUGIN_API`]: within it, wasmtime matches
//! export and import names semver-compatibly (`trellis:plugin/tool@0.1.3` is found where the
//! host looks for `trellis:plugin/tool@0.1.0`).

use std::sync::LazyLock;

use anyhow::{Result, bail};
use semver::{Version, VersionReq};

use super::manifest::PluginKind;

/// The WIT package of the plugin API.
pub const PLUGIN_API_PACKAGE: &str = "trellis:plugin";

/// The version of the plugin API WIT the host is built from (`wit/trellis-plugin@0.1.0/`).
pub const PLUGIN_API_VERSION: &str = "0.1.0";

/// The version of the step script world (`wit/trellis-plugin@0.2.0/script.wit`: the 0.1.0
/// world plus `wasi:http` and `workflow-db.run`), which the bundled Python runner targets.
/// Plugins stay on [`SUPPORTED_PLUGIN_API`]; the host serves `workflow-db` at both.
pub const SCRIPT_API_VERSION: &str = "0.2.0";

/// The plugin API versions a component may target (a semver requirement).
pub const SUPPORTED_PLUGIN_API: &str = ">=0.1.0, <0.2.0";

/// The version of the provider world that streams replies (`wit/trellis-plugin@0.3.0/`:
/// the 0.1.0 `llm-provider` world plus the `reply` import). The bundled providers target it.
pub const PROVIDER_API_VERSION: &str = "0.3.0";

/// The further plugin API versions an LLM provider may target, beside
/// [`SUPPORTED_PLUGIN_API`].
pub const SUPPORTED_PROVIDER_API: &str = ">=0.3.0, <0.4.0";

static SUPPORTED: LazyLock<VersionReq> = LazyLock::new(|| {
    VersionReq::parse(SUPPORTED_PLUGIN_API).expect("SUPPORTED_PLUGIN_API is a valid requirement")
});

static SUPPORTED_PROVIDER: LazyLock<VersionReq> = LazyLock::new(|| {
    VersionReq::parse(SUPPORTED_PROVIDER_API)
        .expect("SUPPORTED_PROVIDER_API is a valid requirement")
});

/// Whether a component targeting plugin API `version` can be loaded.
pub fn is_supported(version: &Version) -> bool {
    SUPPORTED.matches(version)
}

/// Whether a plugin of `kind` targeting plugin API `version` can be loaded: every kind at
/// [`SUPPORTED_PLUGIN_API`], a provider at [`SUPPORTED_PROVIDER_API`] too.
pub fn is_supported_for(kind: PluginKind, version: &Version) -> bool {
    is_supported(version)
        || (kind == PluginKind::LlmProvider && SUPPORTED_PROVIDER.matches(version))
}

/// The versions a plugin of `kind` may target, as the refusal of another one says them.
fn supported_text(kind: PluginKind) -> String {
    match kind {
        PluginKind::LlmProvider => {
            format!("{SUPPORTED_PLUGIN_API} (or {SUPPORTED_PROVIDER_API} for an LLM provider)")
        }
        _ => SUPPORTED_PLUGIN_API.to_string(),
    }
}

/// Whether a provider component targets the streaming provider world
/// ([`PROVIDER_API_VERSION`]): it exports `trellis:plugin/llm` at a version of
/// [`SUPPORTED_PROVIDER_API`].
pub fn exports_streaming_provider(exports: &[String]) -> bool {
    exports.iter().any(|name| {
        split_name(name).is_some_and(|(interface, version)| {
            interface == PluginKind::LlmProvider.interface()
                && Version::parse(version).is_ok_and(|v| SUPPORTED_PROVIDER.matches(&v))
        })
    })
}

/// The full name of `interface` of the plugin API, at the version the host is built from:
/// `trellis:plugin/tool@0.1.0`.
pub fn interface_name(interface: &str) -> String {
    format!("{PLUGIN_API_PACKAGE}/{interface}@{PLUGIN_API_VERSION}")
}

/// Splits an import or export name of the plugin API, `trellis:plugin/<interface>@<version>`,
/// into the interface and the version text; `None` for names of other packages.
fn split_name(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix(PLUGIN_API_PACKAGE)?.strip_prefix('/')?;
    Some(rest.split_once('@').unwrap_or((rest, "")))
}

/// The error for a plugin API name whose version a plugin of `kind` may not target
/// ([`is_supported_for`]), or `None` when it is supported (or not a plugin API name).
fn unsupported(name: &str, what: &str, kind: PluginKind) -> Option<String> {
    let (_, version) = split_name(name)?;
    match Version::parse(version) {
        Ok(v) if is_supported_for(kind, &v) => None,
        _ => {
            let targets = if version.is_empty() {
                "an unversioned trellis:plugin".to_string()
            } else {
                format!("{PLUGIN_API_PACKAGE}@{version}")
            };
            Some(format!(
                "unsupported plugin API version: the component {what} `{name}`, so it targets {targets}, \
                 but this host supports {PLUGIN_API_PACKAGE} {}: build it against a \
                 supported version of the WIT",
                supported_text(kind)
            ))
        }
    }
}

/// Checks that a component with these export and import names implements the world of
/// `kind` at a supported plugin API version, with a message saying what it exports instead
/// or which version it targets.
pub fn check_world(exports: &[String], imports: &[String], kind: PluginKind) -> Result<()> {
    let interface = kind.interface();
    let mut exported = false;
    for name in exports {
        if split_name(name).is_some_and(|(i, _)| i == interface) {
            if let Some(err) = unsupported(name, "exports", kind) {
                bail!("{err}");
            }
            exported = true;
        }
    }
    if !exported {
        let found = if exports.is_empty() {
            "nothing".to_string()
        } else {
            exports.join(", ")
        };
        bail!(
            "wrong world: the manifest says kind `{kind}`, so the component must implement world `{}` (export `{}`), but it exports {found}",
            kind.world(),
            interface_name(interface)
        );
    }
    for name in imports {
        if let Some(err) = unsupported(name, "imports", kind) {
            bail!("{err}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_host_version_is_supported_and_names_derive_from_it() {
        assert!(is_supported(&Version::parse(PLUGIN_API_VERSION).unwrap()));
        assert_eq!(interface_name("tool"), "trellis:plugin/tool@0.1.0");
        assert_eq!(
            PluginKind::Validator.export(),
            "trellis:plugin/validator@0.1.0"
        );
    }

    #[test]
    fn any_version_in_the_range_is_accepted() {
        for v in ["0.1.0", "0.1.7"] {
            let exports = names(&[&format!("trellis:plugin/tool@{v}")]);
            let imports = names(&[
                &format!("trellis:plugin/host@{v}"),
                "wasi:io/streams@0.2.12",
            ]);
            check_world(&exports, &imports, PluginKind::Tool).unwrap();
        }
    }

    #[test]
    fn another_version_is_refused_naming_the_supported_range() {
        for v in ["0.2.0", "1.0.0", "0.0.9", "0.1.1-rc.1"] {
            let exports = names(&[&format!("trellis:plugin/validator@{v}")]);
            let err = check_world(&exports, &[], PluginKind::Validator)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!(
                    "exports `trellis:plugin/validator@{v}`, so it targets trellis:plugin@{v}"
                )) && err.contains("this host supports trellis:plugin >=0.1.0, <0.2.0"),
                "{err}"
            );
        }
        let err = check_world(
            &names(&["trellis:plugin/tool@0.1.0"]),
            &names(&["trellis:plugin/host@0.3.0"]),
            PluginKind::Tool,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("imports `trellis:plugin/host@0.3.0`"), "{err}");
    }

    #[test]
    fn a_wrong_world_names_what_it_exports() {
        let err = check_world(
            &names(&["trellis:plugin/validator@0.1.0"]),
            &[],
            PluginKind::Tool,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "wrong world: the manifest says kind `tool`, so the component must implement world \
             `tool-plugin` (export `trellis:plugin/tool@0.1.0`), but it exports \
             trellis:plugin/validator@0.1.0"
        );
        let err = check_world(&[], &[], PluginKind::LlmProvider)
            .unwrap_err()
            .to_string();
        assert!(err.ends_with("but it exports nothing"), "{err}");
    }
}
