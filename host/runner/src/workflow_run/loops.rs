//! Loops: a jump back to a step that already ran archives the outputs it would overwrite.

use super::*;

/// The step ids of the main path from `first` on, in plan order (`first` alone when it is
/// an orphan step).
pub(super) fn steps_from(ws: &Workspace, first: &str) -> Vec<String> {
    match ws.plan.steps.iter().position(|s| s.id == first) {
        Some(i) => ws.plan.steps[i..].iter().map(|s| s.id.clone()).collect(),
        None => vec![first.to_string()],
    }
}

/// Moves the output folders of `target` and every later step (plan order) that exist to
/// `execution/archived/run-<n>/`. Returns how many were moved.
pub(super) fn archive_from(ws: &Workspace, target: &str, n: u32) -> Result<usize> {
    let archive = archive_dir(ws, n);
    let mut moved = 0;
    for id in steps_from(ws, target) {
        let dir = ws.step_output_dir(&id);
        if !present(&ws.fs, &dir) && !ws.fs.is_dir(&dir) {
            continue;
        }
        ws.fs
            .create_dir_all(&archive)
            .with_context(|| format!("creating {}", archive.display()))?;
        ws.fs.rename(&dir, archive.join(&id)).with_context(|| {
            format!("archiving {} before the loop runs it again", dir.display())
        })?;
        moved += 1;
    }
    Ok(moved)
}

/// `execution/archived/run-<n>/` of the run folder.
pub(super) fn archive_dir(ws: &Workspace, n: u32) -> PathBuf {
    ws.run_dir()
        .join("execution")
        .join(ARCHIVED_DIR)
        .join(format!("run-{n}"))
}

/// `2nd`, `3rd`, `4th`...
pub(super) fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, 11) | (2, 12) | (3, 13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}
