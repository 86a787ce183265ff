//! Bare dependency names, as the original reads them: a `context_dependencies` entry without
//! a `/` (`data.json`) names the output of an earlier step of the main path, the first whose
//! `context_output` lists it (the first one whose file exists, when several do). It becomes
//! that file's workspace path (`runs/<run>/execution/<step>/data.json`) just before the step
//! runs, so the grant, the prompt and a script all see the file. An entry no earlier step
//! produces stays as written (`db`, a folder of the workspace).

use super::*;

/// Rewrites the bare `context_dependencies` entries of step `id` (and of the sub-agent steps
/// of its routes) into the output files of the earlier steps that produce them.
pub(super) fn resolve_bare_dependencies(ws: &mut Workspace, id: &str) {
    let Some(pos) = ws.plan.steps.iter().position(|s| s.id == id) else {
        return;
    };
    let producers: Vec<(String, Vec<String>)> = ws.plan.steps[..pos]
        .iter()
        .map(|s| (s.id.clone(), s.outputs()))
        .collect();
    let run = ws
        .run_folder
        .clone()
        .unwrap_or_else(|| ACTIVE_RUN.to_string());
    let fs = ws.fs.clone();
    let resolve = |dep: &str| -> Option<String> {
        if dep.contains('/') || dep.trim().is_empty() {
            return None;
        }
        let candidates: Vec<String> = producers
            .iter()
            .filter(|(_, outputs)| outputs.iter().any(|o| o == dep))
            .map(|(step, _)| format!("runs/{run}/execution/{step}/{dep}"))
            .collect();
        candidates
            .iter()
            .find(|c| matches!(fs.kind(c.as_str()), Ok(Some(_))))
            .or(candidates.first())
            .cloned()
    };
    fn rewrite(step: &mut Step, resolve: &dyn Fn(&str) -> Option<String>, depth: usize) {
        for dep in step.context_dependencies.iter_mut().flatten() {
            if let Some(path) = resolve(dep) {
                *dep = path;
            }
        }
        if depth >= 8 {
            return;
        }
        let routes = match &mut step.kind {
            StepKind::MessageSequence(m) => &mut m.predefined_routes,
            StepKind::TodoTask(t) => &mut t.predefined_routes,
            _ => return,
        };
        for r in routes {
            rewrite(&mut r.sub_agent_step, resolve, depth + 1);
        }
    }
    rewrite(&mut ws.plan.steps[pos], &resolve, 0);
}
