//! Run folders (spec section 1): `runs/iteration-0` is the active run, `runs/iteration-N`
//! are archived ones.
//!
//! A full run moves an existing `iteration-0` to the next free `iteration-N` and starts a
//! fresh `iteration-0` with `execution/Downloads/`. With groups the run unit is
//! `iteration-0/<group>` (the folder is the sanitized display name, else the group id); a
//! partial group run reuses `iteration-0` without rotating it. Everything is done through a
//! handle on the workspace ([`WorkspaceFs`]): a symbolic link on the way is refused, never followed.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use trellis_sandbox::store::WorkspaceFs;

/// The active run folder, relative to `runs/`.
pub const ACTIVE_RUN: &str = "iteration-0";

/// One run folder ready for steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFolder {
    /// Relative to `runs/`: `iteration-0` or `iteration-0/<group>`.
    pub run_folder: String,
    /// `runs/<run_folder>` on the host.
    pub dir: PathBuf,
}

/// What starting a full run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartedRun {
    /// Where the previous `iteration-0` went (`iteration-N`), if there was one.
    pub archived: Option<String>,
    /// The fresh run folders: `iteration-0`, or one per group.
    pub folders: Vec<RunFolder>,
}

pub use trellis_workflow::manifest::{
    group_folder_name, legacy_group_folder_name, legacy_sanitize_folder_name,
    sanitize_folder_name as sanitize,
};

/// The folder of a group in the active run for a run that keeps it (a partial group run, a
/// read): the original's name ([`group_folder_name`]), unless only the folder an earlier
/// Trellis made for the group exists (`runs/iteration-0/North_Region` where the name is now
/// `north-region`): then that one, so its outputs are still found. A full run makes fresh
/// folders under the new names.
pub fn existing_group_folder(
    fs: &WorkspaceFs,
    display_name: Option<&str>,
    group_id: &str,
) -> Result<String> {
    let name = group_folder_name(display_name, group_id)?;
    let active = |folder: &str| format!("runs/{ACTIVE_RUN}/{folder}");
    if fs.kind(active(&name))?.is_some() {
        return Ok(name);
    }
    match legacy_group_folder_name(display_name, group_id) {
        Some(old)
            if old != name && fs.kind(active(&old))? == Some(trellis_sandbox::store::Kind::Dir) =>
        {
            Ok(old)
        }
        _ => Ok(name),
    }
}

/// Normalizes any run selection to what the builder works in: `iteration-0` or
/// `iteration-0/<group>` (`iteration-3/Team A` -> `iteration-0/team-a`; a folder name an
/// earlier Trellis gave, `Team_A`, stays as it is).
pub fn normalize_selection(selection: &str) -> String {
    let mut parts = selection
        .split('/')
        .filter(|p| !p.is_empty() && *p != "." && *p != "runs");
    parts.next();
    let group = |g: &str| {
        if legacy_sanitize_folder_name(g) == g {
            g.to_string()
        } else {
            sanitize(g)
        }
    };
    match parts.next().map(group).filter(|g| !g.is_empty()) {
        Some(group) => format!("{ACTIVE_RUN}/{group}"),
        None => ACTIVE_RUN.to_string(),
    }
}

/// Starts a full run: archives `runs/iteration-0` to the next free `runs/iteration-N` and
/// creates a fresh `iteration-0` (or `iteration-0/<group>` for each of `groups`, given as
/// folder names) with `execution/Downloads/`.
pub fn start_full_run(root: &Path, groups: &[String]) -> Result<StartedRun> {
    let archived = rotate_active_run(root)?;
    let folders = if groups.is_empty() {
        vec![prepare(root, ACTIVE_RUN)?]
    } else {
        groups
            .iter()
            .map(|g| open_group_run(root, g))
            .collect::<Result<_>>()?
    };
    Ok(StartedRun { archived, folders })
}

/// A partial group run: reuses `iteration-0` without rotating it, and makes sure
/// `iteration-0/<group>/execution/Downloads/` exists. Earlier outputs of the group stay.
pub fn open_group_run(root: &Path, group_folder: &str) -> Result<RunFolder> {
    let sanitized = sanitize(group_folder) == group_folder
        || legacy_sanitize_folder_name(group_folder) == group_folder;
    if !sanitized || group_folder.is_empty() {
        bail!("group folder {group_folder:?} is not a sanitized name (use group_folder_name)");
    }
    prepare(root, &format!("{ACTIVE_RUN}/{group_folder}"))
}

/// Moves `runs/iteration-0` to the next free `runs/iteration-N` (one past the highest
/// existing N). Returns the new name, or `None` when there was no `iteration-0`.
pub fn rotate_active_run(root: &Path) -> Result<Option<String>> {
    let ws = WorkspaceFs::open(root)?;
    if ws.kind("runs")?.is_none() || ws.kind(format!("runs/{ACTIVE_RUN}"))?.is_none() {
        return Ok(None);
    }
    let mut highest = 0u64;
    for (name, _) in ws.list("runs").context("listing runs/")? {
        if let Some(n) = name
            .strip_prefix("iteration-")
            .and_then(|n| n.parse::<u64>().ok())
        {
            highest = highest.max(n);
        }
    }
    // Folder names are anyone's to plant: a number with no successor is refused, never
    // wrapped (to `iteration-0` itself).
    let next = highest.checked_add(1).with_context(|| {
        format!("runs/iteration-{highest} is the last run number there can be: move it away")
    })?;
    let target = format!("iteration-{next}");
    ws.rename(format!("runs/{ACTIVE_RUN}"), format!("runs/{target}"))
        .with_context(|| format!("moving runs/{ACTIVE_RUN} to runs/{target}"))?;
    Ok(Some(target))
}

/// Deletes the oldest archived runs (`runs/iteration-N`, N >= 1, lowest N first) so that at
/// most `keep` remain; returns the names deleted. Entries that are not archived runs are left
/// alone, and a link is removed as a link, never followed.
pub fn prune_archived_runs(root: &Path, keep: usize) -> Result<Vec<String>> {
    let ws = WorkspaceFs::open(root)?;
    if ws.kind("runs")?.is_none() {
        return Ok(Vec::new());
    }
    let mut archived: Vec<(u64, String)> = ws
        .list("runs")
        .context("listing runs/")?
        .into_iter()
        .filter_map(|(name, _)| {
            let n = name.strip_prefix("iteration-")?.parse::<u64>().ok()?;
            // `iteration-01` is not a name rotation makes: leave it.
            (n >= 1 && name == format!("iteration-{n}")).then_some((n, name))
        })
        .collect();
    archived.sort();
    let excess = archived.len().saturating_sub(keep);
    let mut deleted = Vec::new();
    for (_, name) in archived.into_iter().take(excess) {
        ws.remove_all(format!("runs/{name}"))
            .with_context(|| format!("deleting the archived run runs/{name}"))?;
        deleted.push(name);
    }
    Ok(deleted)
}

/// Creates `runs/<run_folder>/execution/Downloads/` inside the workspace.
fn prepare(root: &Path, run_folder: &str) -> Result<RunFolder> {
    let ws = WorkspaceFs::open(root)?;
    let rel = format!("runs/{run_folder}/execution/Downloads");
    ws.create_dir_all(&rel)
        .with_context(|| format!("creating {rel}/ in {}", root.display()))?;
    let dir = trellis_sandbox::capabilities::resolve_in_root(root, &format!("runs/{run_folder}"))?;
    Ok(RunFolder {
        run_folder: run_folder.to_string(),
        dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_last_run_number_is_refused_not_wrapped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("runs/iteration-0/step")).unwrap();
        std::fs::create_dir_all(dir.path().join("runs/iteration-18446744073709551615")).unwrap();
        let err = rotate_active_run(dir.path()).unwrap_err().to_string();
        assert_eq!(
            err,
            "runs/iteration-18446744073709551615 is the last run number there can be: move it away"
        );
        assert!(
            dir.path().join("runs/iteration-0/step").is_dir(),
            "nothing moved"
        );
    }

    #[test]
    fn group_names_are_sanitized_as_the_original_does() {
        let cases = [
            (Some("North Region"), "g1", "north-region"),
            (Some("Team A"), "g1", "team-a"),
            (Some("  EU / West!! "), "g1", "eu-west"),
            (Some("../../etc"), "g1", "etc"),
            (Some("..."), "g-2", "g-2"),
            (None, "g 3", "g-3"),
            (Some("Équipe Été"), "g", "quipe-t"),
            (Some("snake_case-Name"), "g", "snake_case-name"),
        ];
        for (display, id, want) in cases {
            assert_eq!(group_folder_name(display, id).unwrap(), want, "{display:?}");
        }
        assert!(group_folder_name(Some("//"), "..").is_err());
        assert_eq!(
            group_folder_name(Some(&"x".repeat(200)), "g")
                .unwrap()
                .len(),
            80
        );
    }

    #[test]
    fn a_group_folder_of_an_earlier_trellis_is_still_found() {
        let dir = tempfile::tempdir().unwrap();
        let fs = WorkspaceFs::open(dir.path()).unwrap();
        // Nothing yet: the new name.
        assert_eq!(
            existing_group_folder(&fs, Some("North Region"), "n").unwrap(),
            "north-region"
        );
        std::fs::create_dir_all(dir.path().join("runs/iteration-0/North_Region/execution"))
            .unwrap();
        assert_eq!(
            existing_group_folder(&fs, Some("North Region"), "n").unwrap(),
            "North_Region"
        );
        open_group_run(dir.path(), "North_Region").unwrap();
        // Once the new folder exists, it wins.
        std::fs::create_dir_all(dir.path().join("runs/iteration-0/north-region")).unwrap();
        assert_eq!(
            existing_group_folder(&fs, Some("North Region"), "n").unwrap(),
            "north-region"
        );
    }

    #[test]
    fn selections_normalize_to_the_active_run() {
        assert_eq!(normalize_selection("iteration-0"), "iteration-0");
        assert_eq!(normalize_selection("iteration-4"), "iteration-0");
        assert_eq!(
            normalize_selection("iteration-4/Team A"),
            "iteration-0/team-a"
        );
        assert_eq!(normalize_selection("runs/iteration-0/g"), "iteration-0/g");
        assert_eq!(normalize_selection(""), "iteration-0");
    }

    #[test]
    fn full_runs_rotate_to_the_next_free_iteration() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let first = start_full_run(root, &[]).unwrap();
        assert_eq!(first.archived, None);
        assert!(root.join("runs/iteration-0/execution/Downloads").is_dir());
        assert_eq!(first.folders[0].run_folder, "iteration-0");
        std::fs::write(root.join("runs/iteration-0/execution/Downloads/a"), "1").unwrap();

        let second = start_full_run(root, &[]).unwrap();
        assert_eq!(second.archived.as_deref(), Some("iteration-1"));
        assert!(
            root.join("runs/iteration-1/execution/Downloads/a")
                .is_file()
        );
        assert!(!root.join("runs/iteration-0/execution/Downloads/a").exists());

        // Gaps are not refilled: the next is one past the highest.
        std::fs::create_dir_all(root.join("runs/iteration-7")).unwrap();
        let third = start_full_run(root, &["A".into(), "B".into()]).unwrap();
        assert_eq!(third.archived.as_deref(), Some("iteration-8"));
        for g in ["A", "B"] {
            assert!(
                root.join(format!("runs/iteration-0/{g}/execution/Downloads"))
                    .is_dir()
            );
        }
        assert!(!root.join("runs/iteration-0/execution").exists());
    }

    #[test]
    fn partial_group_runs_reuse_without_rotating() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        start_full_run(root, &["A".into()]).unwrap();
        std::fs::write(root.join("runs/iteration-0/A/execution/keep"), "1").unwrap();
        let run = open_group_run(root, "B").unwrap();
        assert_eq!(run.run_folder, "iteration-0/B");
        assert!(run.dir.ends_with("runs/iteration-0/B"));
        let again = open_group_run(root, "A").unwrap();
        assert!(again.dir.join("execution/keep").is_file());
        assert!(!root.join("runs/iteration-1").exists());
        assert!(open_group_run(root, "../x").is_err());
        assert!(open_group_run(root, "").is_err());
    }

    #[test]
    fn a_runs_link_out_of_the_workspace_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("runs")).unwrap();
        assert!(start_full_run(dir.path(), &[]).is_err());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }
}
