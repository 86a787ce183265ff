//! Prerequisite detection (spec section 3): with `enable_prerequisite_detection`, an agent
//! step whose final reply has a line `PREREQUISITE MISSING: <text>` naming one of its
//! `prerequisite_rules` sends the run back to the rule's `depends_on_step`, at most
//! [`MAX_PREREQUISITE_RETURNS`] times per step; a text that names no rule, or one more
//! return, fails the step. The step runner decides before it writes the step's final
//! summary ([`verdict`]); the workflow runner follows a [`GoBack`].

use trellis_workflow::AgentConfigs;
use trellis_workflow::step_config::PrerequisiteRule;

use crate::session::Status;

/// How often one step may send the run back to a prerequisite before it fails.
pub const MAX_PREREQUISITE_RETURNS: u32 = 2;
/// The start of the reply line reporting a missing prerequisite.
pub const PREREQUISITE_MISSING: &str = "PREREQUISITE MISSING:";

/// A step's request to run an earlier step again before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoBack {
    /// The step to go back to (the rule's `depends_on_step`).
    pub step: String,
    /// What the agent said is missing.
    pub missing: String,
    /// Which return this is (1-based, at most [`MAX_PREREQUISITE_RETURNS`]).
    pub count: u32,
}

/// What prerequisite detection makes of a step that ended with `status` and `final_text`,
/// having sent the run back `returns` times already: `Ok(Some)` to go back, `Ok(None)` to go
/// on as it is, `Err(reason)` when the step fails for it.
pub fn verdict(
    configs: &AgentConfigs,
    status: Status,
    final_text: Option<&str>,
    returns: u32,
) -> Result<Option<GoBack>, String> {
    if configs.enable_prerequisite_detection != Some(true) || status == Status::Stopped {
        return Ok(None);
    }
    let Some(missing) = final_text.and_then(prerequisite_missing) else {
        return Ok(None);
    };
    let rules = configs.prerequisite_rules.as_deref().unwrap_or_default();
    match matching_rule(rules, &missing) {
        Some(rule) if returns < MAX_PREREQUISITE_RETURNS => Ok(Some(GoBack {
            step: rule.depends_on_step.clone(),
            missing,
            count: returns + 1,
        })),
        Some(rule) => Err(format!(
            "prerequisite still missing after going back to {} {MAX_PREREQUISITE_RETURNS} times: {missing}",
            rule.depends_on_step
        )),
        None => Err(format!(
            "the agent reported {PREREQUISITE_MISSING} {missing}, which matches none of the step's \
             prerequisite_rules (depends_on_step: {})",
            if rules.is_empty() {
                "none".to_string()
            } else {
                rules
                    .iter()
                    .map(|r| r.depends_on_step.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )),
    }
}

/// The text after `PREREQUISITE MISSING:` on the first such line of a reply.
pub fn prerequisite_missing(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        line.trim()
            .strip_prefix(PREREQUISITE_MISSING)
            .map(|rest| rest.trim().to_string())
    })
}

fn normalized(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .trim_end_matches(['.', '!'])
        .to_lowercase()
}

/// The rule a `PREREQUISITE MISSING:` text names: the text is the rule's `depends_on_step`
/// (alone, or followed by `:`, ` -` or a space and a reason), or its `description`
/// (compared without case and repeated spaces).
pub fn matching_rule<'r>(
    rules: &'r [PrerequisiteRule],
    missing: &str,
) -> Option<&'r PrerequisiteRule> {
    let text = missing.trim();
    rules.iter().find(|r| {
        let id = r.depends_on_step.as_str();
        let by_id = text == id
            || text
                .strip_prefix(id)
                .is_some_and(|rest| rest.starts_with([':', ' ', ',', '.', ';']));
        let by_description = r
            .description
            .as_deref()
            .is_some_and(|d| !d.trim().is_empty() && normalized(d) == normalized(text));
        by_id || by_description
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prerequisite_lines_match_rules_by_step_id_or_description() {
        let rules = vec![
            PrerequisiteRule {
                depends_on_step: "fetch".into(),
                description: Some("The raw  data file".into()),
            },
            PrerequisiteRule {
                depends_on_step: "fetch-more".into(),
                description: None,
            },
        ];
        let text = "Cannot go on.\n  PREREQUISITE MISSING: fetch-more: no rows\nbye";
        let missing = prerequisite_missing(text).unwrap();
        assert_eq!(missing, "fetch-more: no rows");
        assert_eq!(
            matching_rule(&rules, &missing).unwrap().depends_on_step,
            "fetch-more"
        );
        let by_description = matching_rule(&rules, "the raw data file.").unwrap();
        assert_eq!(by_description.depends_on_step, "fetch");
        assert!(matching_rule(&rules, "fetcher").is_none());
        assert!(matching_rule(&rules, "something else").is_none());
        assert_eq!(prerequisite_missing("all fine"), None);
    }

    #[test]
    fn the_verdict_goes_back_until_the_cap_then_fails() {
        let configs = AgentConfigs {
            enable_prerequisite_detection: Some(true),
            prerequisite_rules: Some(vec![PrerequisiteRule {
                depends_on_step: "fetch".into(),
                description: None,
            }]),
            ..AgentConfigs::default()
        };
        let text = Some("PREREQUISITE MISSING: fetch");
        let back = verdict(&configs, Status::Completed, text, 0)
            .unwrap()
            .unwrap();
        assert_eq!((back.step.as_str(), back.count), ("fetch", 1));
        assert!(
            verdict(&configs, Status::Completed, text, 2)
                .unwrap_err()
                .contains("after going back to fetch 2 times")
        );
        assert!(
            verdict(
                &configs,
                Status::Completed,
                Some("PREREQUISITE MISSING: zzz"),
                0
            )
            .unwrap_err()
            .contains("matches none of the step's prerequisite_rules (depends_on_step: fetch)")
        );
        assert_eq!(verdict(&configs, Status::Stopped, text, 0), Ok(None));
        assert_eq!(
            verdict(&configs, Status::Completed, Some("all done"), 0),
            Ok(None)
        );
    }
}
