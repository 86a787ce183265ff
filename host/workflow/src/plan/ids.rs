//! Validation of step ids across the whole plan: step ids are unique, and every step id a
//! step refers to (next steps, routes, option routes) exists.

use super::*;

/// How many references to missing steps get a "did you mean".
const MAX_HINTS: usize = 20;

/// Checks what can only be seen with the whole plan: unique step ids and step references.
pub(super) fn check_references(ctx: &mut Ctx, value: &Value, plan: &Plan) {
    let mut ids: Vec<&str> = Vec::new();
    let mut known: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let lists = [("steps", &plan.steps), ("orphan_steps", &plan.orphan_steps)];
    for (list, steps) in lists {
        for s in steps.iter() {
            if !known.insert(s.id.as_str()) {
                let i = index_of(value, list, &s.id).unwrap_or(0);
                let outer = ctx.set_step(Some(s.id.clone()));
                ctx.error(
                    &JsonPath::root().key(list).index(i).key("id"),
                    format!("duplicate step id {}", quote(&s.id)),
                );
                ctx.set_step(outer);
            }
            ids.push(&s.id);
        }
    }
    let raw_ids: std::collections::HashSet<&str> = ["steps", "orphan_steps"]
        .iter()
        .filter_map(|list| value.get(*list).and_then(Value::as_array))
        .flatten()
        .filter_map(|step| step.get("id").and_then(Value::as_str))
        .collect();
    let mut hints = 0;
    for (list, steps) in lists {
        for (i, s) in steps.iter().enumerate() {
            let path = JsonPath::root().key(list).index(i);
            let outer = ctx.set_step(Some(s.id.clone()));
            let mut refs: Vec<(JsonPath, &str)> = Vec::new();
            if let Some(n) = &s.next_step_id {
                refs.push((path.key("next_step_id"), n));
            }
            match &s.kind {
                StepKind::Routing(r) => {
                    for (j, route) in r.routes.iter().enumerate() {
                        refs.push((
                            path.key("routes").index(j).key("next_step_id"),
                            &route.next_step_id,
                        ));
                    }
                }
                StepKind::HumanInput(h) => {
                    if let Some(n) = &h.if_yes_next_step_id {
                        refs.push((path.key("if_yes_next_step_id"), n));
                    }
                    if let Some(n) = &h.if_no_next_step_id {
                        refs.push((path.key("if_no_next_step_id"), n));
                    }
                    for (k, n) in h.option_routes.iter().flatten() {
                        refs.push((path.key("option_routes").key(k), n));
                    }
                }
                _ => {}
            }
            for (p, target) in refs {
                // A step that failed to parse still exists: its own errors are reported,
                // references to it are not errors on top of them.
                if target != END
                    && !target.is_empty()
                    && !known.contains(target)
                    && !raw_ids.contains(target)
                {
                    // Each suggestion looks at every step id: the first few get one.
                    let hint = if hints < MAX_HINTS {
                        hints += 1;
                        did_you_mean(target, ids.iter().copied())
                            .map(|c| format!(" (did you mean \"{c}\"?)"))
                            .unwrap_or_default()
                    } else {
                        String::new()
                    };
                    ctx.error(
                        &p,
                        format!(
                            "names no step of the plan: {}{hint}; use a step id or \"end\"",
                            quote(target)
                        ),
                    );
                }
            }
            ctx.set_step(outer);
        }
    }
}

/// Each orphan step's `shared_with.orchestrator_ids` names a `todo_task` step of the plan (at
/// any depth), as the original requires.
pub(super) fn check_sharing(ctx: &mut Ctx, plan: &Plan) {
    fn todo_ids<'p>(step: &'p Step, out: &mut Vec<&'p str>, depth: usize) {
        if let StepKind::TodoTask(t) = &step.kind {
            out.push(&step.id);
            if depth < 8 {
                for r in &t.predefined_routes {
                    todo_ids(&r.sub_agent_step, out, depth + 1);
                }
            }
        }
    }
    let mut todo = Vec::new();
    for s in plan.all_steps() {
        todo_ids(s, &mut todo, 0);
    }
    for (i, s) in plan.orphan_steps.iter().enumerate() {
        let Some(shared) = &s.compat.shared_with else {
            continue;
        };
        let outer = ctx.set_step(Some(s.id.clone()));
        for (j, id) in shared.orchestrator_ids.iter().enumerate() {
            if !todo.contains(&id.as_str()) {
                let hint = did_you_mean(id, todo.iter().copied())
                    .map(|c| format!(" (did you mean \"{c}\"?)"))
                    .unwrap_or_default();
                ctx.error(
                    &JsonPath::root()
                        .key("orphan_steps")
                        .index(i)
                        .key("shared_with")
                        .key("orchestrator_ids")
                        .index(j),
                    format!("names no todo_task step of the plan: {}{hint}", quote(id)),
                );
            }
        }
        ctx.set_step(outer);
    }
}

/// The index of the last step with `id` in `value[list]` (the duplicate is the later one).
pub(super) fn index_of(value: &Value, list: &str, id: &str) -> Option<usize> {
    value
        .get(list)?
        .as_array()?
        .iter()
        .rposition(|s| s.get("id").and_then(Value::as_str) == Some(id))
}
