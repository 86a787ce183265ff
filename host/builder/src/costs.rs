//! What builder sessions cost (spec section 11): `costs/phase/token_usage.json` with totals
//! by phase and model, by model, and each session's cumulative figure; and
//! `costs/phase/daily/<UTC date>.json` with the day's totals.
//!
//! A turn adds only the delta between the session's cumulative usage and the cumulative
//! figure recorded for it last time, so counting a session again (a second turn, a rewrite
//! after a restart) never adds what was already counted.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use trellis_sandbox::llm::Usage;
use trellis_sandbox::store::WorkspaceFs;
use trellis_workflow::manifest::Pricing;

/// The totals file, relative to the workspace.
pub const TOKEN_USAGE_FILE: &str = "costs/phase/token_usage.json";
/// The folder of daily files, relative to the workspace.
pub const DAILY_DIR: &str = "costs/phase/daily";

/// Tokens, and their price when the model has one.
///
/// Read from Trellis's names (`prompt_tokens`, `completion_tokens`, `total_tokens`,
/// `cost_usd`) or the original system's (`input_tokens`, `output_tokens`,
/// `total_cost_usd`), a number that is not a count read as 0; written with both sets (and
/// the original's `*_tokens_m` figures) so either reads it. Every other key of an entry
/// (`provider`, `cache_tokens`, `llm_call_count`, ...) is written back as it was.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Their sum.
    pub total_tokens: u64,
    /// USD, when `workflow.json` prices the model.
    pub cost_usd: Option<f64>,
    /// The entry's other keys.
    pub other: Map<String, Value>,
}

/// The keys [`Tally`] reads and writes itself.
const TALLY_KEYS: [&str; 10] = [
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cost_usd",
    "input_tokens",
    "output_tokens",
    "input_tokens_m",
    "output_tokens_m",
    "total_cost_usd",
    "phase_id",
];

/// A count from a file anyone may have written: a non-negative integer, else 0.
fn count(v: Option<&Value>) -> Option<u64> {
    let v = v?;
    Some(v.as_u64().unwrap_or(0))
}

fn millions(n: u64) -> String {
    format!("{:.3}M", n as f64 / 1_000_000.0)
}

impl<'de> Deserialize<'de> for Tally {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // The original writes a missing entry as null: it counts nothing.
        let Value::Object(map) = Value::deserialize(d)? else {
            return Ok(Tally::default());
        };
        let prompt = count(map.get("prompt_tokens"))
            .or_else(|| count(map.get("input_tokens")))
            .unwrap_or(0);
        let completion = count(map.get("completion_tokens"))
            .or_else(|| count(map.get("output_tokens")))
            .unwrap_or(0);
        let total = count(map.get("total_tokens")).unwrap_or(prompt.saturating_add(completion));
        let cost = map
            .get("cost_usd")
            .or_else(|| map.get("total_cost_usd"))
            .and_then(Value::as_f64)
            .filter(|c| c.is_finite() && *c >= 0.0);
        Ok(Tally {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: total,
            cost_usd: cost,
            other: map
                .into_iter()
                .filter(|(k, _)| !TALLY_KEYS.contains(&k.as_str()) && k != "model")
                .collect(),
        })
    }
}

impl Serialize for Tally {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = self.other.clone();
        map.insert("prompt_tokens".into(), self.prompt_tokens.into());
        map.insert("completion_tokens".into(), self.completion_tokens.into());
        map.insert("total_tokens".into(), self.total_tokens.into());
        map.insert("input_tokens".into(), self.prompt_tokens.into());
        map.insert("output_tokens".into(), self.completion_tokens.into());
        map.insert("input_tokens_m".into(), millions(self.prompt_tokens).into());
        map.insert(
            "output_tokens_m".into(),
            millions(self.completion_tokens).into(),
        );
        if let Some(c) = self.cost_usd {
            map.insert("cost_usd".into(), c.into());
            map.insert("total_cost_usd".into(), c.into());
        }
        map.serialize(s)
    }
}

impl Tally {
    fn of(usage: Usage, pricing: Option<&Pricing>) -> Tally {
        let prompt = u64::from(usage.prompt_tokens);
        let completion = u64::from(usage.completion_tokens);
        Tally {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            cost_usd: pricing
                .map(|p| (prompt as f64 * p.input + completion as f64 * p.output) / 1_000_000.0),
            other: Map::new(),
        }
    }

    /// `self - earlier`, never below zero.
    fn since(&self, earlier: &Tally) -> Tally {
        Tally {
            prompt_tokens: self.prompt_tokens.saturating_sub(earlier.prompt_tokens),
            completion_tokens: self
                .completion_tokens
                .saturating_sub(earlier.completion_tokens),
            total_tokens: self.total_tokens.saturating_sub(earlier.total_tokens),
            cost_usd: self
                .cost_usd
                .map(|c| (c - earlier.cost_usd.unwrap_or(0.0)).max(0.0)),
            other: Map::new(),
        }
    }

    /// Adds `delta`, saturating: the totals are read from a file anyone may have written.
    fn add(&mut self, delta: &Tally) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(delta.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(delta.completion_tokens);
        self.total_tokens = self.total_tokens.saturating_add(delta.total_tokens);
        if let Some(c) = delta.cost_usd {
            self.cost_usd = Some(self.cost_usd.unwrap_or(0.0) + c);
        }
    }

    fn is_zero(&self) -> bool {
        self.total_tokens == 0 && self.cost_usd.unwrap_or(0.0) == 0.0
    }
}

/// A session's cumulative figure (the original's entries have no phase or model).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionTally {
    /// The phase.
    #[serde(default)]
    pub phase_id: String,
    /// The model.
    #[serde(default)]
    pub model: String,
    /// Everything so far.
    #[serde(flatten)]
    pub tally: Tally,
}

/// `token_usage.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Phase -> model -> totals.
    #[serde(default)]
    pub by_phase_and_model: BTreeMap<String, BTreeMap<String, Tally>>,
    /// Model -> totals.
    #[serde(default)]
    pub by_model: BTreeMap<String, Tally>,
    /// Session -> its cumulative figure when last counted.
    #[serde(default)]
    pub session_cumulative: BTreeMap<String, SessionTally>,
    /// Other keys (the original's `created_at`, `updated_at`), written back; `updated_at`
    /// is set at each write.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// A daily file: Trellis's `{date, by_phase_and_model, by_model}`, or the original's
/// `{date, updated_at, token_usage: {by_phase_and_model, by_model, ...}}`, whose totals are
/// then the ones extended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DailyUsage {
    /// The day, `YYYY-MM-DD` (UTC).
    #[serde(default)]
    pub date: String,
    /// Phase -> model -> the day's totals.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_phase_and_model: BTreeMap<String, BTreeMap<String, Tally>>,
    /// Model -> the day's totals.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_model: BTreeMap<String, Tally>,
    /// The original's totals of the day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_usage: Option<TokenUsage>,
    /// Other keys, written back.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// Reads `token_usage.json`; empty when there is none.
pub fn read(fs: &WorkspaceFs) -> Result<TokenUsage> {
    read_or_default(fs, TOKEN_USAGE_FILE)
}

fn read_or_default<T: Default + for<'de> Deserialize<'de>>(
    fs: &WorkspaceFs,
    rel: &str,
) -> Result<T> {
    if !fs.is_file(rel) {
        return Ok(T::default());
    }
    let text = fs
        .read_json_text(rel)
        .with_context(|| format!("reading {rel}"))?;
    serde_json::from_str(&text).with_context(|| format!("{rel}: not a token usage file"))
}

/// Counts session `session_id` of `phase_id` on `model` at `cumulative` usage: adds the
/// delta since its last recorded figure to the totals and to the daily file of `date`
/// (`YYYY-MM-DD`, UTC). Returns the delta added.
pub fn record(
    fs: &WorkspaceFs,
    phase_id: &str,
    session_id: &str,
    model: &str,
    cumulative: Usage,
    pricing: Option<&Pricing>,
    date: &str,
) -> Result<Tally> {
    let mut usage = read(fs)?;
    let now = Tally::of(cumulative, pricing);
    let before = usage
        .session_cumulative
        .get(session_id)
        .map(|s| s.tally.clone())
        .unwrap_or_default();
    let delta = now.since(&before);
    if delta.is_zero() {
        return Ok(delta);
    }
    add(
        &mut usage.by_phase_and_model,
        &mut usage.by_model,
        phase_id,
        model,
        &delta,
    );
    usage.session_cumulative.insert(
        session_id.to_string(),
        SessionTally {
            phase_id: phase_id.to_string(),
            model: model.to_string(),
            tally: now,
        },
    );
    let stamp = trellis_sandbox::store::now_rfc3339();
    usage
        .other
        .entry("created_at")
        .or_insert_with(|| Value::String(stamp.clone()));
    usage
        .other
        .insert("updated_at".into(), Value::String(stamp.clone()));
    let daily_rel = format!("{DAILY_DIR}/{date}.json");
    let mut daily: DailyUsage = read_or_default(fs, &daily_rel)?;
    daily.date = date.to_string();
    match &mut daily.token_usage {
        Some(original) => {
            add(
                &mut original.by_phase_and_model,
                &mut original.by_model,
                phase_id,
                model,
                &delta,
            );
            daily
                .other
                .insert("updated_at".into(), Value::String(stamp));
        }
        None => add(
            &mut daily.by_phase_and_model,
            &mut daily.by_model,
            phase_id,
            model,
            &delta,
        ),
    }
    fs.write_json_atomic(&daily_rel, &daily)
        .with_context(|| format!("writing {daily_rel}"))?;
    fs.write_json_atomic(TOKEN_USAGE_FILE, &usage)
        .with_context(|| format!("writing {TOKEN_USAGE_FILE}"))?;
    Ok(delta)
}

fn add(
    by_phase: &mut BTreeMap<String, BTreeMap<String, Tally>>,
    by_model: &mut BTreeMap<String, Tally>,
    phase_id: &str,
    model: &str,
    delta: &Tally,
) {
    by_phase
        .entry(phase_id.to_string())
        .or_default()
        .entry(model.to_string())
        .or_default()
        .add(delta);
    by_model.entry(model.to_string()).or_default().add(delta);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(prompt: u32, completion: u32) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        }
    }

    #[test]
    fn totals_read_from_a_file_saturate_instead_of_wrapping() {
        let mut total = Tally {
            prompt_tokens: u64::MAX - 1,
            completion_tokens: u64::MAX,
            total_tokens: u64::MAX,
            cost_usd: None,
            other: Map::new(),
        };
        total.add(&Tally::of(usage(5, 7), None));
        assert_eq!(
            (
                total.prompt_tokens,
                total.completion_tokens,
                total.total_tokens
            ),
            (u64::MAX, u64::MAX, u64::MAX)
        );
    }

    #[test]
    fn a_second_turn_adds_only_its_delta() {
        let dir = tempfile::tempdir().unwrap();
        let fs = WorkspaceFs::open(dir.path()).unwrap();
        let price = Pricing {
            input: 1.0,
            output: 2.0,
        };
        let first = record(
            &fs,
            "p",
            "s1",
            "m",
            usage(100, 10),
            Some(&price),
            "2026-01-01",
        )
        .unwrap();
        assert_eq!(first.total_tokens, 110);
        let second = record(
            &fs,
            "p",
            "s1",
            "m",
            usage(250, 30),
            Some(&price),
            "2026-01-01",
        )
        .unwrap();
        assert_eq!(second.prompt_tokens, 150);
        assert_eq!(second.completion_tokens, 20);
        // Counting the same figure again adds nothing.
        let again = record(
            &fs,
            "p",
            "s1",
            "m",
            usage(250, 30),
            Some(&price),
            "2026-01-02",
        )
        .unwrap();
        assert_eq!(again.total_tokens, 0);
        let totals = read(&fs).unwrap();
        assert_eq!(totals.by_model["m"].total_tokens, 280);
        assert_eq!(totals.by_phase_and_model["p"]["m"].prompt_tokens, 250);
        let cost = totals.by_model["m"].cost_usd.unwrap();
        assert!((cost - (250.0 + 60.0) / 1e6).abs() < 1e-12, "{cost}");
        assert!(!fs.is_file("costs/phase/daily/2026-01-02.json"));
    }
}
