//! The keys of `workflow.json` the original writes beside Trellis's own: its bookkeeping
//! (`schema_version`, `id`, `label`, dates, `schedules`, oversight and publishing settings),
//! kept verbatim, and the parts Trellis acts on: the models of
//! `capabilities.llm_config` and the builder mode of `execution_defaults.workshop_mode`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::diagnostics::{Ctx, JsonPath, did_you_mean, kind_of, quote};
use crate::step_config::LlmRef;

/// Top-level keys the original writes, kept verbatim on save. Of these Trellis reads
/// `schedules`, `capabilities.llm_config` and `execution_defaults.workshop_mode`
/// ([`OriginalSettings`]); the rest have no effect here and are named in one warning.
pub const KEPT_KEYS: &[&str] = &[
    "schema_version",
    "id",
    "label",
    "created_at",
    "updated_at",
    "capabilities",
    "execution_defaults",
    "schedules",
    "oversight_mode",
    "pace_on_low_quota",
    "pace_threshold_percent",
    "pulse",
    "backup",
    "publish",
    "ownership",
    "objective",
    "success_criteria",
    "decision_log_mutability",
];

/// Keys of `capabilities` and `execution_defaults` Trellis acts on (the others are kept and
/// named in the warning).
const ACTED_ON: &[&str] = &[
    "capabilities.llm_config",
    "execution_defaults.workshop_mode",
];

/// What Trellis takes from the original's keys; derived on every read, never written back
/// (the keys it comes from are kept as they were).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OriginalSettings {
    /// `tiered_config.tier_1..3` as the tiers `high`, `medium`, `low`.
    pub tiers: BTreeMap<String, LlmRef>,
    /// `llm_config.builder_llm`.
    pub builder_llm: Option<LlmRef>,
    /// `execution_defaults.workshop_mode` as written (`workshop`, `run`, ...).
    pub workshop_mode: Option<String>,
    /// `schedules`, read and checked ([`super::schedules`]).
    pub schedules: Vec<super::schedules::Schedule>,
    /// `execution_defaults.enabled_custom_tools` as written (checked for the original's
    /// categories Trellis does not have; no effect otherwise).
    pub enabled_custom_tools: Vec<String>,
}

/// The names `execution_defaults.workshop_mode` may hold: the original's `workshop` and
/// `run`, and the builder modes of Trellis with their aliases.
const BUILDER_MODES: &[&str] = &[
    "workshop",
    "run",
    "builder",
    "optimizer",
    "debugger",
    "eval",
    "output",
    "runner",
    "ask",
];

/// The tier of Trellis each `tiered_config` entry is (the original's execution tier
/// `high` is its `tier_1`).
pub const TIER_KEYS: &[(&str, &str)] =
    &[("tier_1", "high"), ("tier_2", "medium"), ("tier_3", "low")];

/// Reads the original's keys out of `kept`: the settings Trellis acts on, errors for
/// values of the wrong type there, and one warning naming the keys kept with no effect.
pub(super) fn read_original(ctx: &mut Ctx, kept: &BTreeMap<String, Value>) -> OriginalSettings {
    let mut out = OriginalSettings::default();
    let mut inert: Vec<String> = Vec::new();
    for (key, value) in kept {
        match (key.as_str(), value) {
            ("capabilities" | "execution_defaults", Value::Object(m)) => {
                for (sub, v) in m {
                    let name = format!("{key}.{sub}");
                    if !ACTED_ON.contains(&name.as_str()) && !is_unset(v) {
                        inert.push(name);
                    }
                }
            }
            ("capabilities" | "execution_defaults", Value::Null) => {}
            // Read and checked with the groups (`super::schedules`).
            ("schedules", _) => {}
            ("capabilities" | "execution_defaults", other) => ctx.error(
                &JsonPath::root().key(key),
                format!("expected an object, found {}", kind_of(other)),
            ),
            (_, v) if is_unset(v) => {}
            _ => inert.push(key.clone()),
        }
    }
    if let Some(Value::Object(llm)) = kept.get("capabilities").and_then(|c| c.get("llm_config")) {
        let path = JsonPath::root().key("capabilities").key("llm_config");
        out.builder_llm = model(ctx, llm, "builder_llm", &path);
        if let Some(Value::Object(tiers)) = llm.get("tiered_config") {
            let tpath = path.key("tiered_config");
            for (key, tier) in TIER_KEYS {
                if let Some(m) = model(ctx, tiers, key, &tpath) {
                    out.tiers.insert((*tier).to_string(), m);
                }
            }
        }
    }
    if let Some(Value::Object(defaults)) = kept.get("execution_defaults") {
        let path = JsonPath::root().key("execution_defaults");
        match defaults.get("workshop_mode") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.trim().is_empty() => {}
            Some(Value::String(s)) => {
                let mode = s.trim().to_ascii_lowercase();
                if BUILDER_MODES.contains(&mode.as_str()) {
                    out.workshop_mode = Some(mode);
                } else {
                    let hint = did_you_mean(&mode, BUILDER_MODES.iter().copied())
                        .map(|c| format!(" (did you mean \"{c}\"?)"))
                        .unwrap_or_default();
                    ctx.error(
                        &path.key("workshop_mode"),
                        format!(
                            "unknown builder mode {}: expected \"workshop\" or \"run\" (or a \
                             Trellis mode: builder, optimizer, debugger, eval, output){hint}",
                            quote(s)
                        ),
                    );
                }
            }
            Some(other) => ctx.error(
                &path.key("workshop_mode"),
                format!("expected a string, found {}", kind_of(other)),
            ),
        }
        match defaults.get("enabled_custom_tools") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) => {
                for (i, v) in list.iter().enumerate() {
                    match v {
                        Value::String(s) => out.enabled_custom_tools.push(s.clone()),
                        other => ctx.error(
                            &path.key("enabled_custom_tools").index(i),
                            format!("expected a string, found {}", kind_of(other)),
                        ),
                    }
                }
                crate::step_config::original_tool_categories(
                    ctx,
                    &path.key("enabled_custom_tools"),
                    &out.enabled_custom_tools,
                );
            }
            Some(other) => ctx.error(
                &path.key("enabled_custom_tools"),
                format!("expected an array of strings, found {}", kind_of(other)),
            ),
        }
    }
    if !inert.is_empty() {
        let names: Vec<String> = inert.iter().map(|k| quote(k)).collect();
        ctx.warning(
            &JsonPath::root(),
            format!(
                "kept as written for the original, with no effect in Trellis: {}",
                names.join(", ")
            ),
        );
    }
    out
}

/// Whether a value is the original's "not set": null, `false`, `0`, `""`, `[]` or `{}`.
fn is_unset(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// One model entry of `llm_config` (`{provider, model_id, options?, published_llm_id?,
/// fallbacks?}`): `None` when absent or left empty (the original's unset entry), an error
/// for a value of the wrong type. Fallbacks are the original's; Trellis's tiers have none.
fn model(ctx: &mut Ctx, parent: &Map<String, Value>, key: &str, path: &JsonPath) -> Option<LlmRef> {
    let path = path.key(key);
    let entry = match parent.get(key)? {
        Value::Null => return None,
        Value::Object(m) => m,
        other => {
            ctx.error(
                &path,
                format!(
                    "expected a model choice (an object), found {}",
                    kind_of(other)
                ),
            );
            return None;
        }
    };
    let mut text = |field: &str| match entry.get(field) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.trim().to_string()).filter(|s| !s.is_empty()),
        Some(other) => {
            ctx.error(
                &path.key(field),
                format!("expected a string, found {}", kind_of(other)),
            );
            None
        }
    };
    let provider = text("provider");
    let model_id = text("model_id");
    let published_llm_id = text("published_llm_id");
    let options = match entry.get("options") {
        Some(Value::Object(o)) => Some(o.clone()),
        _ => None,
    };
    Some(LlmRef {
        provider: provider?,
        model_id: model_id?,
        options,
        published_llm_id,
    })
}
