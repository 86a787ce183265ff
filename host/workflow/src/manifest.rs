//! `workflow.json`: workflow-level settings.
//!
//! The shape Trellis reads and writes:
//!
//! ```json
//! {
//!   "contract_version": "1.0.11",
//!   "variables": {
//!     "REGION": "eu-west-1",
//!     "TICKER": {"value": "ACME", "description": "the company followed"}
//!   },
//!   "groups": [
//!     {"id": "us", "name": "US market", "variables": {"REGION": "us-east-1"}}
//!   ],
//!   "llm": {"provider": "openai", "model_id": "gpt-4o", "options": {"temperature": 0}},
//!   "tiers": {"high": {"provider": "openai", "model_id": "gpt-4o"},
//!             "low": {"provider": "openai", "model_id": "gpt-4o-mini"}},
//!   "providers": {"openai": {"base_url": "https://api.example.invalid/v1",
//!                            "api_key_env": "OPENAI_API_KEY"}}
//! }
//! ```
//!
//! - `contract_version`: the workflow contract the files follow (spec section 9); stamped by
//!   migrations. Absent means a workflow older than the versioned contracts.
//! - `variables`: name -> value, or name -> `{value?, description?}`. Names are valid
//!   environment suffixes (scripts see `VAR_<NAME>`).
//! - `groups`: run units of the same plan; each overrides declared variables. A group's run
//!   folder is `runs/iteration-0/<folder>` with the folder from [`Group::folder_name`].
//! - `llm`: the default model of every step that pins none; `tiers`: the models behind
//!   `execution_tier` values `high` / `medium` / `low`.
//! - `providers`: per LLM provider plugin, the endpoint and the *name* of the environment
//!   variable holding its key (never the key itself).

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::diagnostics::{
    Ctx, Diagnostic, Diagnostics, JsonPath, Obj, Parsed, Severity, did_you_mean, finish, kind_of,
    parse_json, quote,
};
use super::step_config::{LlmRef, parse_llm_ref};

/// Where the manifest lives in a workspace.
pub const WORKFLOW_FILE: &str = "workflow.json";

/// A contract version `MAJOR.MINOR.PATCH`, ordered numerically (`1.0.10` > `1.0.9`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContractVersion(pub u32, pub u32, pub u32);

impl ContractVersion {
    /// Removes legacy `code` items from message sequences.
    pub const V1_0_10: Self = Self(1, 0, 10);
    /// Pulse history schema 2; no runtime effect here beyond the stamp.
    pub const V1_0_11: Self = Self(1, 0, 11);
    /// The newest contract this runtime implements.
    pub const CURRENT: Self = Self::V1_0_11;

    /// Parses `1.0.11`.
    pub fn parse(s: &str) -> Option<Self> {
        let mut parts = s.trim().split('.').map(|p| p.parse::<u32>().ok());
        let v = Self(parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some(v)
    }
}

impl fmt::Display for ContractVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// A declared workflow variable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Variable {
    /// The short form: just the value.
    Value(String),
    /// The long form.
    Declared {
        /// The default value.
        #[serde(skip_serializing_if = "Option::is_none")]
        value: Option<String>,
        /// What it is for.
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<String>,
    },
}

impl Variable {
    /// The default value, if any.
    pub fn value(&self) -> Option<&str> {
        match self {
            Self::Value(v) => Some(v),
            Self::Declared { value, .. } => value.as_deref(),
        }
    }
}

/// A group: a run unit with its own variable values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Group {
    /// Unique among the groups.
    pub id: String,
    /// The display name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Values overriding the declared variables.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub variables: BTreeMap<String, String>,
}

impl Group {
    /// The folder of the group's runs, `runs/iteration-0/<folder>`: the display name
    /// sanitized as the original does, else the id sanitized (see [`group_folder_name`]);
    /// an error when neither leaves a usable name.
    pub fn folder_name(&self) -> anyhow::Result<String> {
        group_folder_name(self.name.as_deref(), &self.id)
    }
}

/// The folder name of a group, as the original names it: its display name sanitized, else
/// its id sanitized ([`sanitize_folder_name`]: `North Region` -> `north-region`); an error
/// when neither leaves a usable name.
pub fn group_folder_name(display_name: Option<&str>, group_id: &str) -> anyhow::Result<String> {
    let name = display_name
        .map(sanitize_folder_name)
        .filter(|s| !s.is_empty())
        .or_else(|| Some(sanitize_folder_name(group_id)).filter(|s| !s.is_empty()));
    anyhow::Context::with_context(name, || {
        let named = display_name.map_or(String::new(), |n| format!(" nor its name {n:?}"));
        format!(
            "group {group_id:?} has no usable folder name: neither its id{named} has a letter, \
             digit, `_` or `-`"
        )
    })
}

/// The folder name earlier versions of Trellis gave a group (letters, digits, `-`, `_`, `.`
/// kept, case kept, other runs one `_`: `North Region` -> `North_Region`), so that a run
/// folder made then is still found; `None` when it leaves nothing.
pub fn legacy_group_folder_name(display_name: Option<&str>, group_id: &str) -> Option<String> {
    display_name
        .map(legacy_sanitize_folder_name)
        .filter(|s| !s.is_empty())
        .or_else(|| Some(legacy_sanitize_folder_name(group_id)).filter(|s| !s.is_empty()))
}

/// A name as a folder name, with the original's rule: trimmed, every character outside
/// `[A-Za-z0-9_-]` a `-`, runs of `-` one `-`, leading and trailing `-` trimmed, lowercased;
/// at most 80 characters.
pub fn sanitize_folder_name(name: &str) -> String {
    let mut out = String::new();
    for c in name.trim().chars() {
        let c = if c.is_ascii_alphanumeric() || c == '_' {
            c.to_ascii_lowercase()
        } else {
            '-'
        };
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
    }
    out.trim_matches('-')
        .chars()
        .take(80)
        .collect::<String>()
        .trim_end_matches('-')
        .to_string()
}

/// The folder-name rule of earlier versions of Trellis (see [`legacy_group_folder_name`]).
pub fn legacy_sanitize_folder_name(name: &str) -> String {
    let mut out = String::new();
    let mut gap = false;
    for c in name.chars() {
        if c.is_alphanumeric() || matches!(c, '-' | '_' | '.') {
            if gap && !out.is_empty() {
                out.push('_');
            }
            gap = false;
            out.push(c);
        } else {
            gap = true;
        }
    }
    out.trim_matches(['_', '.'])
        .chars()
        .take(80)
        .collect::<String>()
        .trim_end_matches(['_', '.'])
        .to_string()
}

/// Connection settings of an LLM provider plugin.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProviderSettings {
    /// The API endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The name of the environment variable that holds the key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Whether replies stream (absent: they do); `false` for a server that cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
}

/// What a model costs, in USD per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Pricing {
    /// Per million input (prompt) tokens.
    pub input: f64,
    /// Per million output (completion) tokens.
    pub output: f64,
}

/// The whole `workflow.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WorkflowManifest {
    /// The contract the workspace follows, as written: the original's `version` key (read
    /// from Trellis's earlier `contract_version` too), always written as `version`.
    #[serde(rename = "version", skip_serializing_if = "Option::is_none")]
    pub contract_version: Option<String>,
    /// Declared variables.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub variables: BTreeMap<String, Variable>,
    /// Groups.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<Group>,
    /// The default model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm: Option<LlmRef>,
    /// The interactive builder's model (the default model when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub builder_llm: Option<LlmRef>,
    /// Models behind `execution_tier`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tiers: BTreeMap<String, LlmRef>,
    /// Prices per model id, in USD per million tokens; costs are counted in tokens only
    /// for a model without one.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub pricing: BTreeMap<String, Pricing>,
    /// Provider connection settings.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub providers: BTreeMap<String, ProviderSettings>,
    /// `run_retention_count` as written: how many archived runs a full run keeps (see
    /// [`WorkflowManifest::run_retention`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_retention_count: Option<Value>,
    /// The keys the original writes ([`KEPT_KEYS`]), kept verbatim.
    #[serde(flatten)]
    pub kept: BTreeMap<String, Value>,
    /// What Trellis takes from the kept keys (models, builder mode); never written.
    #[serde(skip)]
    pub original: OriginalSettings,
}

/// Archived runs kept when `run_retention_count` is absent or invalid.
pub const DEFAULT_RUN_RETENTION: usize = 5;
/// The most archived runs `run_retention_count` may keep.
pub const MAX_RUN_RETENTION: usize = 50;
mod original;
pub mod schedules;
mod variables_file;

pub use original::{KEPT_KEYS, OriginalSettings, TIER_KEYS};
pub use variables_file::{VARIABLES_FILE, merge_variables_file};

/// The retention a `run_retention_count` value means: 1 to [`MAX_RUN_RETENTION`], else
/// `None` (invalid).
fn retention_of(value: &Value) -> Option<usize> {
    value
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=MAX_RUN_RETENTION).contains(n))
}

impl WorkflowManifest {
    /// The default model of a step that pins none: `llm`, else the original's
    /// `capabilities.llm_config.tiered_config.tier_1` (its execution default).
    pub fn default_llm(&self) -> Option<&LlmRef> {
        self.llm
            .as_ref()
            .or_else(|| self.original.tiers.get("high"))
    }

    /// The model behind `execution_tier` `name` (`high`, `medium`, `low`): `tiers`, else
    /// the original's `tiered_config` (`tier_1`, `tier_2`, `tier_3`).
    pub fn tier(&self, name: &str) -> Option<&LlmRef> {
        self.tiers
            .get(name)
            .or_else(|| self.original.tiers.get(name))
    }

    /// The names of the tiers defined, in either form.
    pub fn tier_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .tiers
            .keys()
            .chain(self.original.tiers.keys())
            .map(String::as_str)
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The builder's model: `builder_llm`, else the original's `llm_config.builder_llm`.
    pub fn builder_model(&self) -> Option<&LlmRef> {
        self.builder_llm
            .as_ref()
            .or(self.original.builder_llm.as_ref())
    }

    /// The parsed contract version; `None` when absent (a workflow older than versioning).
    pub fn contract(&self) -> Option<ContractVersion> {
        self.contract_version
            .as_deref()
            .and_then(ContractVersion::parse)
    }

    /// The variables a step sees in `group` (or with no group): declared defaults, then the
    /// group's overrides.
    pub fn resolved_variables(&self, group: Option<&str>) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> = self
            .variables
            .iter()
            .filter_map(|(k, v)| v.value().map(|v| (k.clone(), v.to_string())))
            .collect();
        if let Some(g) = group.and_then(|id| self.groups.iter().find(|g| g.id == id)) {
            out.extend(g.variables.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        out
    }

    /// An error when there are more groups than [`MAX_GROUPS`] (those of
    /// `variables/variables.json` included): each is a run unit of the whole plan.
    pub fn check_group_count(&self) -> Diagnostics {
        let mut diags = Diagnostics::new();
        if self.groups.len() > MAX_GROUPS {
            diags.push(Diagnostic {
                file: WORKFLOW_FILE.into(),
                json_path: "groups".into(),
                step_id: None,
                message: format!(
                    "{} groups, more than the {MAX_GROUPS} a workflow may have (each runs the \
                     whole plan)",
                    self.groups.len()
                ),
                severity: Severity::Error,
            });
        }
        diags
    }

    /// An error for each group whose run folder cannot be named
    /// ([`group_folder_name`]), or is another group's.
    pub fn check_group_folders(&self) -> Diagnostics {
        let mut diags = Diagnostics::new();
        let mut seen: BTreeMap<String, &str> = BTreeMap::new();
        for (i, g) in self.groups.iter().enumerate() {
            let message = match group_folder_name(g.name.as_deref(), &g.id) {
                Err(e) => format!("{e}"),
                Ok(folder) => match seen.get(folder.as_str()) {
                    Some(other) => format!(
                        "group {:?} runs in the folder {folder:?} of group {other:?}: give one \
                         of them another name",
                        g.id
                    ),
                    None => {
                        seen.insert(folder, &g.id);
                        continue;
                    }
                },
            };
            diags.push(Diagnostic {
                file: WORKFLOW_FILE.into(),
                json_path: format!("groups[{i}]"),
                step_id: None,
                message,
                severity: Severity::Error,
            });
        }
        diags
    }

    /// The variables whose value holds a NUL character, which no environment variable
    /// (`VAR_<NAME>` of a step script) can hold: each an error naming where it is set.
    pub fn check_variable_values(&self) -> Diagnostics {
        let mut diags = Diagnostics::new();
        let mut refuse = |json_path: JsonPath| {
            diags.push(Diagnostic {
                file: WORKFLOW_FILE.into(),
                json_path: json_path.to_string(),
                step_id: None,
                message: "the value holds a NUL character (\\u0000), which a step script's \
                          environment variable cannot hold"
                    .into(),
                severity: Severity::Error,
            })
        };
        for (name, variable) in &self.variables {
            if variable.value().is_some_and(|v| v.contains('\0')) {
                refuse(JsonPath::root().key("variables").key(name));
            }
        }
        for (i, group) in self.groups.iter().enumerate() {
            for (name, value) in &group.variables {
                if value.contains('\0') {
                    refuse(
                        JsonPath::root()
                            .key("groups")
                            .index(i)
                            .key("variables")
                            .key(name),
                    );
                }
            }
        }
        diags
    }

    /// How many archived runs (`runs/iteration-N`, N >= 1) a full run keeps:
    /// `run_retention_count` when it is 1 to [`MAX_RUN_RETENTION`], else
    /// [`DEFAULT_RUN_RETENTION`].
    pub fn run_retention(&self) -> usize {
        self.run_retention_count
            .as_ref()
            .and_then(retention_of)
            .unwrap_or(DEFAULT_RUN_RETENTION)
    }

    /// Writes the manifest atomically, 2-space indent.
    pub fn write(&self, fs: &trellis_sandbox::store::WorkspaceFs, path: &Path) -> io::Result<()> {
        fs.write_json_atomic(path, self)
    }
}

/// The environment variable suggested for the key of provider `provider`
/// (`OPENAI_API_KEY` for `openai`).
fn suggested_key_env(provider: &str) -> String {
    let name: String = provider
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{name}_API_KEY")
}

/// Reads `workflow.json` from its text.
pub fn parse_manifest(text: &str, file: &str) -> Parsed<WorkflowManifest> {
    let mut diags = Diagnostics::new();
    let parsed = parse_json(text, file, &mut diags).and_then(|v| {
        let mut ctx = Ctx::new(file, &mut diags);
        manifest_from_value(&mut ctx, &v)
    });
    finish(parsed, diags)
}

/// The most groups a workflow may have.
pub const MAX_GROUPS: usize = 1_000;

/// The longest variable name, in bytes (the substitution of `{{NAME}}` looks this far for
/// the closing braces).
pub const MAX_VARIABLE_NAME: usize = 128;

fn valid_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= MAX_VARIABLE_NAME
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A name as an error shows it: quoted, its start only when it is long.
fn shown_variable_name(name: &str) -> String {
    match name.char_indices().nth(MAX_VARIABLE_NAME) {
        Some((end, _)) => format!("{}... ({} bytes)", quote(&name[..end]), name.len()),
        None => quote(name),
    }
}

fn manifest_from_value(ctx: &mut Ctx, value: &Value) -> Option<WorkflowManifest> {
    let mut obj = Obj::new(ctx, value, JsonPath::root(), "workflow settings")?;
    let version = obj.str(ctx, "version");
    let earlier = obj.str(ctx, "contract_version");
    let key = if version.is_some() || earlier.is_none() {
        "version"
    } else {
        "contract_version"
    };
    if let Some(old) = &earlier {
        let note = match &version {
            Some(v) if v != old => format!(
                "Trellis's earlier name of \"version\", which says {}: \"version\" wins; \
                 dropped when the file is saved",
                quote(v)
            ),
            Some(_) => {
                "Trellis's earlier name of \"version\": dropped when the file is saved".into()
            }
            None => "Trellis's earlier name of \"version\": read as the version and written as \
                     \"version\" when the file is saved (`trellis migrate` rewrites it)"
                .into(),
        };
        ctx.warning(&JsonPath::root().key("contract_version"), note);
    }
    let contract_version = version.or(earlier);
    if let Some(v) = &contract_version {
        match ContractVersion::parse(v) {
            None => ctx.error(
                &JsonPath::root().key(key),
                format!("expected a version such as \"1.0.11\", found {}", quote(v)),
            ),
            Some(cv) if cv > ContractVersion::CURRENT => ctx.warning(
                &JsonPath::root().key(key),
                format!(
                    "contract {cv} is newer than the {} this Trellis implements",
                    ContractVersion::CURRENT
                ),
            ),
            Some(_) => {}
        }
    }
    let mut variables = BTreeMap::new();
    if let Some(v) = obj.raw("variables") {
        let path = JsonPath::root().key("variables");
        match v {
            Value::Object(m) => {
                for (name, def) in m {
                    let p = path.key(name);
                    if !valid_variable_name(name) {
                        ctx.error(
                            &p,
                            format!(
                                "invalid variable name {}: use 1 to 128 letters, digits and _ (scripts see it as VAR_<NAME>)",
                                shown_variable_name(name)
                            ),
                        );
                    }
                    let var = match def {
                        Value::String(s) => Some(Variable::Value(s.clone())),
                        Value::Object(_) => {
                            let mut d = Obj::new(ctx, def, p, "a variable")?;
                            let value = d.str(ctx, "value");
                            let description = d.str(ctx, "description");
                            d.finish(ctx);
                            Some(Variable::Declared { value, description })
                        }
                        other => {
                            ctx.error(
                                &p,
                                format!(
                                    "expected a value (a string) or {{\"value\", \"description\"}}, found {}",
                                    kind_of(other)
                                ),
                            );
                            None
                        }
                    };
                    if let Some(var) = var {
                        variables.insert(name.clone(), var);
                    }
                }
            }
            other => ctx.error(
                &path,
                format!("expected an object of variables, found {}", kind_of(other)),
            ),
        }
    }
    let groups = obj
        .list(ctx, "groups", |ctx, v, p| {
            let mut g = Obj::new(ctx, v, p, "a group")?;
            let id = g.req_str(ctx, "id", "the group id");
            let name = g.str(ctx, "name");
            let mut vars = BTreeMap::new();
            if let Some(raw) = g.object(ctx, "variables") {
                for (k, val) in raw {
                    let vp = g.path().key("variables").key(&k);
                    if !variables.contains_key(&k) {
                        let hint = did_you_mean(&k, variables.keys().map(String::as_str))
                            .map(|c| format!(" (did you mean \"{c}\"?)"))
                            .unwrap_or_default();
                        ctx.error(
                            &vp,
                            format!(
                                "sets {} which is not declared in \"variables\"{hint}",
                                quote(&k)
                            ),
                        );
                    }
                    match val {
                        Value::String(s) => {
                            vars.insert(k, s);
                        }
                        other => {
                            ctx.error(&vp, format!("expected a string, found {}", kind_of(&other)))
                        }
                    }
                }
            }
            g.finish(ctx);
            Some(Group {
                id: id?,
                name,
                variables: vars,
            })
        })
        .unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    for (i, g) in groups.iter().enumerate() {
        if !seen.insert(g.id.as_str()) {
            ctx.error(
                &JsonPath::root().key("groups").index(i).key("id"),
                format!("duplicate group id {}", quote(&g.id)),
            );
        }
    }
    let llm = obj
        .raw("llm")
        .and_then(|v| parse_llm_ref(ctx, v, JsonPath::root().key("llm")));
    let builder_llm = obj
        .raw("builder_llm")
        .and_then(|v| parse_llm_ref(ctx, v, JsonPath::root().key("builder_llm")));
    let mut pricing = BTreeMap::new();
    if let Some(m) = obj.object(ctx, "pricing") {
        for (model, v) in &m {
            let Some(mut p) = Obj::new(
                ctx,
                v,
                JsonPath::root().key("pricing").key(model),
                "a price ({\"input\": USD per million tokens, \"output\": ...})",
            ) else {
                continue;
            };
            let input = p.number(ctx, "input");
            let output = p.number(ctx, "output");
            p.finish(ctx);
            pricing.insert(
                model.clone(),
                Pricing {
                    input: input.unwrap_or(0.0),
                    output: output.unwrap_or(0.0),
                },
            );
        }
    }
    let mut tiers = BTreeMap::new();
    if let Some(m) = obj.object(ctx, "tiers") {
        for (k, v) in &m {
            let p = JsonPath::root().key("tiers").key(k);
            if !matches!(k.as_str(), "high" | "medium" | "low") {
                let hint = did_you_mean(k, ["high", "medium", "low"])
                    .map(|c| format!(" (did you mean \"{c}\"?)"))
                    .unwrap_or_default();
                ctx.error(
                    &p,
                    format!(
                        "unknown tier {}: expected \"high\", \"medium\" or \"low\"{hint}",
                        quote(k)
                    ),
                );
            }
            if let Some(r) = parse_llm_ref(ctx, v, p) {
                tiers.insert(k.clone(), r);
            }
        }
    }
    let mut providers = BTreeMap::new();
    if let Some(m) = obj.object(ctx, "providers") {
        for (k, v) in &m {
            let mut p = match Obj::new(
                ctx,
                v,
                JsonPath::root().key("providers").key(k),
                "provider settings",
            ) {
                Some(p) => p,
                None => continue,
            };
            let settings = ProviderSettings {
                base_url: p.str(ctx, "base_url"),
                api_key_env: p.str(ctx, "api_key_env"),
                stream: p.bool(ctx, "stream"),
            };
            if p.has("api_key") {
                p.accept(&["api_key"]);
                let var = settings
                    .api_key_env
                    .clone()
                    .unwrap_or_else(|| suggested_key_env(k));
                ctx.error(
                    &p.path().key("api_key"),
                    format!(
                        "keys are never stored in workflow.json: remove it, put the key in the \
                         environment variable {var} and name it here: \"api_key_env\": \"{var}\""
                    ),
                );
            }
            p.finish(ctx);
            providers.insert(k.clone(), settings);
        }
    }
    if obj.has("api_key") {
        obj.accept(&["api_key"]);
        ctx.error(
            &JsonPath::root().key("api_key"),
            "keys are never stored in workflow.json: remove it, put the key in the environment \
             variable OPENAI_API_KEY (or another, named in \"providers\": {\"openai\": \
             {\"api_key_env\": \"NAME\"}})",
        );
    }
    let run_retention_count = obj.raw("run_retention_count").cloned();
    if let Some(v) = &run_retention_count
        && retention_of(v).is_none()
    {
        ctx.warning(
            &JsonPath::root().key("run_retention_count"),
            format!(
                "expected a whole number from 1 to {MAX_RUN_RETENTION}, found {v}: \
                 {DEFAULT_RUN_RETENTION} archived runs are kept"
            ),
        );
    }
    let mut kept = BTreeMap::new();
    for key in KEPT_KEYS {
        if let Some(v) = obj.raw(key) {
            kept.insert((*key).to_string(), v.clone());
        }
    }
    let mut original = original::read_original(ctx, &kept);
    if let Some(list) = kept.get("schedules").filter(|v| !v.is_null()) {
        original.schedules = schedules::read_schedules(ctx, list);
    }
    obj.finish(ctx);
    Some(WorkflowManifest {
        contract_version,
        variables,
        groups,
        llm,
        builder_llm,
        tiers,
        pricing,
        providers,
        run_retention_count,
        kept,
        original,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_numerically() {
        assert!(
            ContractVersion::parse("1.0.10").unwrap() > ContractVersion::parse("1.0.9").unwrap()
        );
        assert_eq!(ContractVersion::parse("1.0"), None);
        assert_eq!(ContractVersion::parse("1.0.11.1"), None);
        assert_eq!(ContractVersion::CURRENT.to_string(), "1.0.11");
    }

    #[test]
    fn the_originals_keys_are_kept_and_its_models_read() {
        let text = r#"{"schema_version": 1, "version": "1.0.29", "id": "wf", "label": "L",
          "capabilities": {"selected_servers": [], "llm_config": {"schema_version": 2,
            "mode": "explicit", "builder_llm": {"provider": "openai", "model_id": "b"},
            "tiered_config": {"tier_1": {"provider": "openai", "model_id": "one"},
                              "tier_2": null,
                              "tier_3": {"provider": "", "model_id": ""}}}},
          "execution_defaults": {"workshop_mode": "Run"},
          "schedules": [], "ownership": {}}"#;
        let (m, warnings) = parse_manifest(text, WORKFLOW_FILE).unwrap();
        assert_eq!(
            warnings.lines(),
            [
                "workflow.json: version: contract 1.0.29 is newer than the 1.0.11 this Trellis implements",
                "workflow.json: kept as written for the original, with no effect in Trellis: \"id\", \"label\", \"schema_version\"",
            ]
        );
        // Saved: everything as it was, the derived models not added.
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
        assert_eq!(m.default_llm().unwrap().model_id, "one");
        assert_eq!(m.tier("high").unwrap().model_id, "one");
        assert!(m.tier("medium").is_none() && m.tier("low").is_none());
        assert_eq!(m.builder_model().unwrap().model_id, "b");
        assert_eq!(m.original.workshop_mode.as_deref(), Some("run"));

        // Trellis's own keys win over the original's.
        let own = r#"{"llm": {"provider": "openai", "model_id": "own"},
          "tiers": {"high": {"provider": "openai", "model_id": "own-high"}},
          "capabilities": {"llm_config": {"tiered_config": {"tier_1": {"provider": "openai", "model_id": "one"}}}}}"#;
        let (m, _) = parse_manifest(own, WORKFLOW_FILE).unwrap();
        assert_eq!(m.default_llm().unwrap().model_id, "own");
        assert_eq!(m.tier("high").unwrap().model_id, "own-high");

        // Trellis's earlier key is read and written as the original's.
        let (m, warnings) =
            parse_manifest(r#"{"contract_version": "1.0.11"}"#, WORKFLOW_FILE).unwrap();
        assert_eq!(m.contract(), Some(ContractVersion::V1_0_11));
        assert_eq!(warnings.len(), 1);
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::json!({"version": "1.0.11"})
        );

        let err = parse_manifest(
            r#"{"execution_defaults": {"workshop_mode": "workshp"}}"#,
            WORKFLOW_FILE,
        )
        .unwrap_err();
        assert_eq!(
            err.lines(),
            [
                "workflow.json: execution_defaults.workshop_mode: unknown builder mode \"workshp\": expected \"workshop\" or \"run\" (or a Trellis mode: builder, optimizer, debugger, eval, output) (did you mean \"workshop\"?)"
            ]
        );
    }

    #[test]
    fn manifest_round_trips_and_resolves_group_variables() {
        let text = r#"{"version":"1.0.11",
          "variables":{"REGION":"eu","TICKER":{"value":"ACME","description":"d"}},
          "groups":[{"id":"us","name":"US market!","variables":{"REGION":"us"}}],
          "llm":{"provider":"openai","model_id":"gpt-4o","options":{"temperature":0}},
          "tiers":{"low":{"provider":"openai","model_id":"mini"}},
          "providers":{"openai":{"base_url":"http://127.0.0.1:1","api_key_env":"K"}}}"#;
        let (m, w) = parse_manifest(text, WORKFLOW_FILE).unwrap();
        assert!(w.is_empty());
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
        assert_eq!(m.groups[0].folder_name().unwrap(), "us-market");
        let vars = m.resolved_variables(Some("us"));
        assert_eq!(vars["REGION"], "us");
        assert_eq!(vars["TICKER"], "ACME");
        assert_eq!(m.contract(), Some(ContractVersion::V1_0_11));
    }

    /// `validate` found nothing wrong with groups that `run` then refused: a group whose
    /// name and id leave no folder name, two groups in one folder (round 30).
    #[test]
    fn groups_without_a_folder_of_their_own_are_errors() {
        let text = r#"{"groups":[{"id":".."},{"id":"emea","name":"EMEA"},
                                 {"id":"e2","name":"emea"},{"id":"us"}]}"#;
        let (m, _) = parse_manifest(text, WORKFLOW_FILE).unwrap();
        assert_eq!(
            m.check_group_folders().lines(),
            [
                "workflow.json: groups[0]: group \"..\" has no usable folder name: neither its id has a letter, digit, `_` or `-`",
                "workflow.json: groups[2]: group \"e2\" runs in the folder \"emea\" of group \"emea\": give one of them another name",
            ]
        );
    }
}
