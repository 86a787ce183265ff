//! The grant of one turn of a message sequence (spec section 6).
//!
//! The table of section 6 is not checked in tool code: it becomes a [`Grant`], the folders a
//! turn's plugins are given as preopened directories, so a tool cannot name anything else.
//! [`TurnAccess`] is the decision (what may be read and written, from the step config, the
//! defaults of section 3 and the item's `write_access` and `kind`, which only narrow);
//! [`turn_grant`] turns it into folders, creating the ones the turn may write, and describes
//! the result for the system prompt.

use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};

use trellis_sandbox::capabilities::{Access, Grant, resolve_in};
use trellis_workflow::plan::{Item, ItemKind, Step, WriteAccess};
use trellis_workflow::step_config::{AgentConfigs, KnowledgebaseAccess, LearningsAccess};

/// The workflow database, relative to the workspace.
pub const DB_FILE: &str = "db/db.sqlite";
/// The workflow's charter (`soul/soul.md`: objective, success criteria, constraints), read-only
/// to every turn.
pub const SOUL_DIR: &str = "soul";
/// The folder of files that belong with the database, writable whenever the database is.
pub const DB_ASSETS: &str = "db/assets";

/// Folders no turn ever sees, whatever its dependencies say.
const NEVER_GRANTED: &[&str] = &["planning", "code", "builder"];

/// What one turn may read and write, before it is turned into folders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnAccess {
    /// The step output folder and `Downloads/` are writable (false only for the reflection
    /// turn, which runs after the final gate and must not change what the gate accepted).
    pub output_write: bool,
    /// `knowledgebase/` is readable.
    pub knowledgebase_read: bool,
    /// `knowledgebase/notes/` is writable.
    pub knowledgebase_write: bool,
    /// `learnings/_global/` and `learnings/<step-id>/` are readable.
    pub learnings_read: bool,
    /// `learnings/_global/` is writable.
    pub learnings_write: bool,
    /// The database accepts mutations.
    pub db_write: bool,
}

/// Which stores the closing reflection turn writes (spec section 4, point 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReflectionDue {
    /// Learnings are due: the step is `read-write` with a non-empty `learning_objective`.
    pub learnings: bool,
    /// A knowledgebase contribution is due: a non-empty `knowledgebase_contribution` and a
    /// step that may write the knowledgebase.
    pub knowledgebase: bool,
}

/// Whether the step closes with a reflection turn, and for which stores. `None`: no
/// reflection turn.
pub fn reflection_due(configs: &AgentConfigs) -> Option<ReflectionDue> {
    let learnings = configs.effective_learnings_access() == LearningsAccess::ReadWrite
        && non_empty(configs.learning_objective.as_deref());
    let knowledgebase = step_writes_knowledgebase(configs)
        && non_empty(configs.knowledgebase_contribution.as_deref());
    (learnings || knowledgebase).then_some(ReflectionDue {
        learnings,
        knowledgebase,
    })
}

fn non_empty(s: Option<&str>) -> bool {
    s.is_some_and(|s| !s.trim().is_empty())
}

fn step_writes_knowledgebase(configs: &AgentConfigs) -> bool {
    matches!(
        configs.effective_knowledgebase_access(),
        KnowledgebaseAccess::Write | KnowledgebaseAccess::ReadWrite
    )
}

impl TurnAccess {
    /// What the step itself allows, before any item narrows it. Database mutations are
    /// allowed at step level: there is no step setting for them, only items narrow them.
    pub fn for_step(configs: &AgentConfigs) -> Self {
        let kb = configs.effective_knowledgebase_access();
        let learnings = configs.effective_learnings_access();
        TurnAccess {
            output_write: true,
            knowledgebase_read: kb != KnowledgebaseAccess::None,
            knowledgebase_write: step_writes_knowledgebase(configs),
            learnings_read: learnings != LearningsAccess::None,
            learnings_write: learnings == LearningsAccess::ReadWrite,
            db_write: true,
        }
    }

    /// The access of a turn of `item`: the step's, narrowed by the item's `write_access`
    /// (a `false` removes a write, a `true` adds nothing) and by its `kind` (a `learning`,
    /// `knowledgebase` or `db` item writes only that store; `execution` narrows nothing).
    pub fn for_item(configs: &AgentConfigs, item: &Item) -> Self {
        Self::for_step(configs).narrowed(item.body.write_access(), item.kind)
    }

    /// The step's access narrowed by an item's `write_access` and `kind`. A non-empty
    /// `write_access` narrows the turn to exactly the stores it sets `true` (a key left out
    /// is `false`); an empty or absent one leaves the step's access as it is.
    pub fn narrowed(self, write_access: Option<&WriteAccess>, kind: Option<ItemKind>) -> Self {
        let wa = write_access.copied().unwrap_or_default();
        let exact = wa != WriteAccess::default();
        let allows = |flag: Option<bool>| {
            if exact {
                flag == Some(true)
            } else {
                flag != Some(false)
            }
        };
        let (kb_kind, learn_kind, db_kind) = match kind {
            None | Some(ItemKind::Execution) => (true, true, true),
            Some(ItemKind::Learning) => (false, true, false),
            Some(ItemKind::Knowledgebase) => (true, false, false),
            Some(ItemKind::Db) => (false, false, true),
        };
        TurnAccess {
            knowledgebase_write: self.knowledgebase_write && allows(wa.knowledgebase) && kb_kind,
            learnings_write: self.learnings_write && allows(wa.learnings) && learn_kind,
            db_write: self.db_write && allows(wa.db) && db_kind,
            ..self
        }
    }

    /// The access of the closing reflection turn: reads as the step, writes only the stores
    /// that are due; the output folder and the database become read-only.
    pub fn for_reflection(configs: &AgentConfigs) -> Self {
        let due = reflection_due(configs).unwrap_or(ReflectionDue {
            learnings: false,
            knowledgebase: false,
        });
        let step = Self::for_step(configs);
        TurnAccess {
            output_write: false,
            knowledgebase_write: step.knowledgebase_write && due.knowledgebase,
            learnings_write: step.learnings_write && due.learnings,
            db_write: false,
            ..step
        }
    }
}

/// What a turn is for.
#[derive(Debug, Clone, Copy)]
pub enum TurnPurpose<'a> {
    /// A turn of an item (a user message, a foreach row, a repair turn of a gate).
    Item(&'a Item),
    /// The closing reflection turn.
    Reflection,
}

/// Where a turn runs.
#[derive(Debug, Clone, Copy)]
pub struct TurnContext<'a> {
    /// The workspace folder.
    pub root: &'a Path,
    /// The run folder, relative to `runs/`: `iteration-0` or `iteration-0/<group>`.
    pub run_folder: &'a str,
    /// The step the turn belongs to.
    pub step: &'a Step,
    /// The step's agent settings.
    pub configs: &'a AgentConfigs,
}

/// The folders an agent writes its work to: its output folder (`STEP_OUTPUT_DIR`) and, when
/// routes are involved, the folder a step and its sub-agents share. Both are
/// workspace-relative and inside `runs/<run>/execution/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentFolders {
    /// The output folder: `runs/<run>/execution/<step-id>` for a step, a call folder
    /// `<step output>/agents/<route-id>/calls/<call-id>` for a sub-agent.
    pub output: String,
    /// `<step output>/shared`, read-write for the step and all its sub-agents; `None` for a
    /// step without routes.
    pub shared: Option<String>,
    /// Whether the agent is a sub-agent (it changes how the folders are described).
    pub sub_agent: bool,
}

impl AgentFolders {
    /// The folders of a step's own agent: its output folder, and `shared/` in it when the
    /// step has routes.
    pub fn for_step(run_folder: &str, step: &Step) -> Self {
        let output = step_output_rel(run_folder, &step.id);
        let shared = (!step.predefined_routes().is_empty()).then(|| format!("{output}/shared"));
        AgentFolders {
            output,
            shared,
            sub_agent: false,
        }
    }
}

/// `runs/<run>/execution/<step-id>`, the output folder of a step, workspace-relative.
pub fn step_output_rel(run_folder: &str, step_id: &str) -> String {
    format!("runs/{}/execution/{step_id}", run_folder.trim_matches('/'))
}

/// One folder of a turn grant, as the agent is told about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantedFolder {
    /// Workspace-relative path, as tools name it (`knowledgebase/notes`).
    pub path: String,
    /// Read-only or read-write.
    pub access: Access,
    /// What the folder is for, one short phrase.
    pub role: String,
}

/// The grant of one turn and what it is made of.
#[derive(Debug, Clone)]
pub struct TurnGrant {
    /// The grant to call plugins with.
    pub grant: Grant,
    /// The decision the grant was built from.
    pub access: TurnAccess,
    /// The step output folder on the host (`STEP_OUTPUT_DIR`).
    pub output_dir: PathBuf,
    /// The granted folders, in the order they were granted.
    pub folders: Vec<GrantedFolder>,
    /// The database, when the workspace has a `db/` folder: whether it accepts mutations.
    pub db_writable: Option<bool>,
    /// `context_dependencies` / `additional_read_paths` entries left out because they do
    /// not exist (yet): `(field, path)`.
    pub missing: Vec<(&'static str, String)>,
}

impl TurnGrant {
    /// A description of the grant for the system prompt: every folder with its access, the
    /// database, and that nothing else exists.
    pub fn describe(&self) -> String {
        let mut text = String::from("Folders your tools can see (workspace-relative paths):\n");
        for f in &self.folders {
            let access = match f.access {
                Access::ReadOnly => "read-only",
                Access::ReadWrite => "read-write",
            };
            let _ = writeln!(text, "- {}/ ({access}): {}", f.path, f.role);
        }
        match self.db_writable {
            Some(true) => text.push_str(&format!(
                "- database {DB_FILE}: query and modify through the db tools \
                 (query_workflow_db, mutate_workflow_db)\n"
            )),
            Some(false) => text.push_str(&format!(
                "- database {DB_FILE}: query only, through query_workflow_db; statements \
                 that modify it are refused\n"
            )),
            None => {}
        }
        for (field, path) in &self.missing {
            let _ = writeln!(
                text,
                "- {path} (declared in {field}) does not exist in this run, so it is not \
                 available"
            );
        }
        text.push_str("Nothing else exists for your tools.\n");
        text
    }
}

/// Computes the grant of one turn per the table of spec section 6, creating the folders the
/// turn may write (output folder, `Downloads/`, `knowledgebase/notes/`, `learnings/_global/`)
/// when missing. Read-only folders that do not exist are left out. Everything is created and
/// resolved through a handle on the workspace, so nothing outside it is created or granted.
pub fn turn_grant(ctx: &TurnContext<'_>, purpose: TurnPurpose<'_>) -> Result<TurnGrant> {
    turn_grant_in(
        ctx,
        purpose,
        &AgentFolders::for_step(ctx.run_folder, ctx.step),
    )
}

/// [`turn_grant`] for an agent writing to `folders` (a sub-agent's call folder, say) rather
/// than to the step's own output folder.
pub fn turn_grant_in(
    ctx: &TurnContext<'_>,
    purpose: TurnPurpose<'_>,
    folders: &AgentFolders,
) -> Result<TurnGrant> {
    let step_id = &ctx.step.id;
    let access = match purpose {
        TurnPurpose::Item(item) => TurnAccess::for_item(ctx.configs, item),
        TurnPurpose::Reflection => TurnAccess::for_reflection(ctx.configs),
    };
    build(ctx, access, folders).with_context(|| match purpose {
        TurnPurpose::Item(item) => {
            format!("granting folders to step {step_id:?}, item {:?}", item.id)
        }
        TurnPurpose::Reflection => {
            format!("granting folders to the reflection turn of step {step_id:?}")
        }
    })
}

/// Computes the grant of a turn from an access decision made elsewhere (a repair turn of a
/// gate, say, which keeps its item's access).
pub fn grant_for_access(ctx: &TurnContext<'_>, access: TurnAccess) -> Result<TurnGrant> {
    grant_for_access_in(
        ctx,
        access,
        &AgentFolders::for_step(ctx.run_folder, ctx.step),
    )
}

/// [`grant_for_access`] for an agent writing to `folders`.
pub fn grant_for_access_in(
    ctx: &TurnContext<'_>,
    access: TurnAccess,
    folders: &AgentFolders,
) -> Result<TurnGrant> {
    build(ctx, access, folders)
        .with_context(|| format!("granting folders to step {:?}", ctx.step.id))
}

struct Builder<'a> {
    root: &'a Path,
    fs: trellis_sandbox::store::WorkspaceFs,
    grant: Grant,
    folders: Vec<GrantedFolder>,
}

impl Builder<'_> {
    fn exists(&self, rel: &str) -> bool {
        self.fs.is_dir(rel)
    }

    fn create(&self, rel: &str) -> Result<()> {
        self.fs
            .create_dir_all(rel)
            .with_context(|| format!("creating {rel}/ in {}", self.root.display()))
    }

    fn add(&mut self, rel: &str, access: Access, role: &str) -> Result<()> {
        let host = resolve_in(&self.fs, rel)?;
        check_not_hidden(self.root, rel, &host)?;
        self.grant = std::mem::take(&mut self.grant).folder(host, rel, access)?;
        self.folders.retain(|f| f.path != rel);
        self.folders.push(GrantedFolder {
            path: rel.to_string(),
            access,
            role: role.to_string(),
        });
        Ok(())
    }
}

fn build(ctx: &TurnContext<'_>, access: TurnAccess, folders: &AgentFolders) -> Result<TurnGrant> {
    let step_id = ctx.step.id.as_str();
    single_component("step id", step_id)?;
    trellis_sandbox::store::check_relative(ctx.run_folder)
        .map_err(|e| anyhow::anyhow!("run folder {:?}: {e}", ctx.run_folder))?;
    let run = ctx.run_folder.trim_matches('/');
    let execution = format!("runs/{run}/execution");
    let downloads = format!("{execution}/Downloads");
    let output = inside_execution(&execution, "output folder", &folders.output)?;
    let shared = folders
        .shared
        .as_deref()
        .map(|s| inside_execution(&execution, "shared folder", s))
        .transpose()?;

    let fs = trellis_sandbox::store::WorkspaceFs::open(ctx.root)
        .with_context(|| format!("opening the workspace {}", ctx.root.display()))?;
    let mut b = Builder {
        root: ctx.root,
        fs,
        grant: Grant::none(),
        folders: Vec::new(),
    };

    // Dependencies first: a store folder or the output folder granted later under the same
    // path replaces them with the access the table gives.
    let configs = ctx.configs;
    let deps = ctx.step.context_dependencies.iter().flatten();
    let extra = configs.additional_read_paths.iter().flatten();
    let mut missing = Vec::new();
    for (field, path) in deps
        .map(|p| ("context_dependencies", p))
        .chain(extra.map(|p| ("additional_read_paths", p)))
    {
        // Context, as the original reads it: an entry that does not exist (the output of a
        // routing branch that did not run, a step run before its upstream steps) is left
        // out, and said so; one that names what no turn may see is still refused.
        let rel = match dependency_folder(&b, &access, path) {
            Err(e) if e.is::<Missing>() => {
                missing.push((field, path.clone()));
                continue;
            }
            other => other.with_context(|| {
                format!("step {step_id:?}: {field} entry {path:?} cannot be granted")
            })?,
        };
        b.add(&rel, Access::ReadOnly, &format!("declared in {field}"))
            .with_context(|| format!("step {step_id:?}: {field} entry {path:?}"))?;
    }

    // Skills: a name is the folder `skills/<name>/`, else `learnings/<name>/` (a path with
    // a `/` is taken as written); read-only, like a dependency.
    for name in configs.enabled_skills.iter().flatten() {
        let name = name.trim();
        if name.is_empty() {
            continue;
        }
        let candidates: Vec<String> = if name.contains('/') {
            vec![name.to_string()]
        } else {
            vec![format!("skills/{name}"), format!("learnings/{name}")]
        };
        let mut found = false;
        for candidate in &candidates {
            match dependency_folder(&b, &access, candidate) {
                Err(e) if e.is::<Missing>() => continue,
                other => {
                    let rel = other.with_context(|| {
                        format!("step {step_id:?}: enabled_skills entry {name:?} cannot be granted")
                    })?;
                    b.add(
                        &rel,
                        Access::ReadOnly,
                        &format!("the skill {name:?}: read its SKILL.md before you start"),
                    )?;
                    found = true;
                    break;
                }
            }
        }
        if !found {
            missing.push(("enabled_skills", name.to_string()));
        }
    }

    for rel in [&output, &downloads].into_iter().chain(shared.as_ref()) {
        b.create(rel)?;
    }
    b.add(
        &execution,
        Access::ReadOnly,
        "outputs of the steps of this run",
    )?;
    let rw = |on: bool| {
        if on {
            Access::ReadWrite
        } else {
            Access::ReadOnly
        }
    };
    b.add(
        &downloads,
        rw(access.output_write),
        "downloads shared by the steps of this run",
    )?;
    let (output_role, shared_role) = if folders.sub_agent {
        (
            "your output folder for this call (STEP_OUTPUT_DIR)",
            "files shared with the agent that called you and its other sub-agents",
        )
    } else {
        (
            "this step's output folder (STEP_OUTPUT_DIR)",
            "files shared with your sub-agents",
        )
    };
    b.add(&output, rw(access.output_write), output_role)?;
    if let Some(shared) = &shared {
        b.add(shared, rw(access.output_write), shared_role)?;
    }

    if b.exists(SOUL_DIR) {
        b.add(
            SOUL_DIR,
            Access::ReadOnly,
            "the workflow's objective, success criteria and constraints (soul.md)",
        )?;
    }

    if access.knowledgebase_read {
        if access.knowledgebase_write {
            b.create("knowledgebase/notes")?;
        }
        if b.exists("knowledgebase") {
            b.add("knowledgebase", Access::ReadOnly, "domain knowledge")?;
        }
        if access.knowledgebase_write {
            b.add(
                "knowledgebase/notes",
                Access::ReadWrite,
                "domain notes you may add to and edit",
            )?;
        }
    }

    if access.learnings_read {
        if access.learnings_write {
            b.create("learnings/_global")?;
        }
        if b.exists("learnings/_global") {
            let role = if access.learnings_write {
                "shared learnings you may add to"
            } else {
                "shared learnings"
            };
            b.add("learnings/_global", rw(access.learnings_write), role)?;
        }
        let own = format!("learnings/{step_id}");
        if b.exists(&own) {
            b.add(&own, Access::ReadOnly, "learnings of this step")?;
        }
    }

    let mut db_writable = None;
    if b.exists("db") {
        b.add(
            "db",
            Access::ReadOnly,
            "database files (query through the db tools)",
        )?;
        if access.db_write {
            b.create(DB_ASSETS)?;
            b.add(
                DB_ASSETS,
                Access::ReadWrite,
                "files that belong with the database (images, exports) you may add to",
            )?;
        }
        let db_host = resolve_in(&b.fs, "db")?.join("db.sqlite");
        // SQLite opens by path and follows links: the database must be a regular file, or
        // nothing yet (SQLite then creates a regular file, refusing a link planted since:
        // SQLITE_OPEN_NOFOLLOW).
        match b.fs.kind(DB_FILE)? {
            None | Some(trellis_sandbox::store::Kind::File) => {}
            Some(trellis_sandbox::store::Kind::Link) => {
                bail!(
                    "{}",
                    trellis_sandbox::store::workspace_fs::link_error(Path::new(DB_FILE))
                )
            }
            Some(_) => bail!("{DB_FILE} is not a regular file"),
        }
        b.grant = std::mem::take(&mut b.grant).with_db(db_host, access.db_write);
        db_writable = Some(access.db_write);
    }

    Ok(TurnGrant {
        // The shell's commands start in the output folder.
        grant: b.grant.with_home(&output)?,
        access,
        output_dir: resolve_in(&b.fs, &output)?,
        folders: b.folders,
        db_writable,
        missing,
    })
}

/// A dependency that does not exist in the workspace.
#[derive(Debug)]
struct Missing;

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("it does not exist in the workspace")
    }
}

impl std::error::Error for Missing {}

/// Checks that `rel` is a folder strictly inside `execution` (`runs/<run>/execution`) and
/// returns it normalized.
fn inside_execution(execution: &str, what: &str, rel: &str) -> Result<String> {
    trellis_sandbox::store::check_relative(rel)
        .map_err(|e| anyhow::anyhow!("{what} {rel:?}: {e}"))?;
    let rel = normalized(rel);
    match rel.strip_prefix(execution) {
        Some(rest) if rest.starts_with('/') && rest.len() > 1 => Ok(rel),
        _ => bail!("{what} {rel:?} is not inside {execution}/"),
    }
}

/// The workspace-relative folder a `context_dependencies` / `additional_read_paths` entry
/// grants: the folder itself, or for a file the folder holding it.
fn dependency_folder(b: &Builder<'_>, access: &TurnAccess, path: &str) -> Result<String> {
    trellis_sandbox::store::check_relative(path).map_err(anyhow::Error::msg)?;
    let rel = normalized(path);
    check_dependency_path(&rel, access)?;
    match b.fs.kind(&rel) {
        Ok(Some(trellis_sandbox::store::Kind::Dir)) => Ok(rel),
        Ok(Some(trellis_sandbox::store::Kind::Link)) => {
            bail!(
                "{}",
                trellis_sandbox::store::workspace_fs::link_error(Path::new(&rel))
            )
        }
        Ok(None) => Err(Missing.into()),
        Ok(Some(_)) => match rel.rsplit_once('/') {
            Some((parent, _)) => {
                check_dependency_path(parent, access)?;
                Ok(parent.to_string())
            }
            None => bail!(
                "a file at the workspace root cannot be granted (its folder is the whole workspace)"
            ),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Missing.into()),
        Err(e) => bail!("it cannot be read ({e})"),
    }
}

/// Refuses dependency folders the table never grants, or that would expose such folders.
fn check_dependency_path(rel: &str, access: &TurnAccess) -> Result<()> {
    let parts: Vec<&str> = rel.split('/').collect();
    match parts[0] {
        "" => bail!("the workspace root would expose planning/, code/ and builder/"),
        first if NEVER_GRANTED.contains(&first) => {
            bail!("{first}/ is never visible to a turn")
        }
        // `runs/<run>/execution/...` or `runs/<run>/<group>/execution/...`: the component
        // after the run (or its group) folder, not any `execution` further down (a folder of
        // that name inside `logs/` or `planning/` is still theirs).
        "runs" if !is_execution_path(&parts) => {
            bail!("only the execution/ folders of runs can be granted (not run planning or logs)")
        }
        "knowledgebase" if !access.knowledgebase_read => {
            bail!("the step's knowledgebase_access is \"none\"")
        }
        "learnings" if !access.learnings_read => bail!("the step's learnings_access is \"none\""),
        _ => Ok(()),
    }
}

/// `runs/<run>/execution[/...]`, or `runs/<run>/<group>/execution[/...]` for a group folder
/// that is not one of a run's own (`logs`, `planning`).
fn is_execution_path(parts: &[&str]) -> bool {
    match parts.get(2..) {
        Some(["execution", ..]) => true,
        Some([group, "execution", ..]) => !matches!(*group, "logs" | "planning" | "execution"),
        _ => false,
    }
}

/// Refuses a folder whose real location (after symbolic links inside the workspace) is one no
/// turn may see.
fn check_not_hidden(root: &Path, rel: &str, host: &Path) -> Result<()> {
    let root = root.canonicalize()?;
    let real = host.strip_prefix(&root).unwrap_or(host);
    let first = real
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .unwrap_or("");
    if real.as_os_str().is_empty() || NEVER_GRANTED.contains(&first) {
        bail!(
            "{rel:?} is the workspace root or inside {first}/ once symbolic links are followed: never visible to a turn"
        );
    }
    Ok(())
}

fn normalized(path: &str) -> String {
    Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => p.to_str(),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn single_component(what: &str, name: &str) -> Result<()> {
    let mut parts = Path::new(name).components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(_)), None) if !name.contains(['/', '\\']) => Ok(()),
        _ => bail!("{what} {name:?} cannot name a folder: it must be a single path component"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trellis_workflow::plan::ItemBody;
    use trellis_workflow::plan::StepKind;

    fn step(deps: &[&str]) -> Step {
        Step {
            id: "step-1".into(),
            title: None,
            description: None,
            context_dependencies: (!deps.is_empty())
                .then(|| deps.iter().map(|s| s.to_string()).collect()),
            context_output: None,
            validation_schema: None,
            next_step_id: None,
            compat: Default::default(),
            kind: StepKind::Regular,
        }
    }

    fn item(write_access: Option<WriteAccess>, kind: Option<ItemKind>) -> Item {
        Item {
            id: "i".into(),
            title: None,
            kind,
            body: ItemBody::UserMessage {
                message: "go".into(),
                write_access,
            },
        }
    }

    fn wa(db: Option<bool>, kb: Option<bool>, learnings: Option<bool>) -> Option<WriteAccess> {
        Some(WriteAccess {
            db,
            knowledgebase: kb,
            learnings,
        })
    }

    fn configs(f: impl FnOnce(&mut AgentConfigs)) -> AgentConfigs {
        let mut c = AgentConfigs::default();
        f(&mut c);
        c
    }

    /// (kb read, kb write, learnings read, learnings write, db write)
    type Flags = (bool, bool, bool, bool, bool);

    fn flags(a: TurnAccess) -> Flags {
        (
            a.knowledgebase_read,
            a.knowledgebase_write,
            a.learnings_read,
            a.learnings_write,
            a.db_write,
        )
    }

    #[test]
    fn step_defaults_follow_section_3() {
        let cases: Vec<(&str, AgentConfigs, Flags)> = vec![
            (
                "defaults",
                configs(|_| {}),
                (true, false, true, false, true),
            ),
            (
                "objective makes learnings read-write",
                configs(|c| c.learning_objective = Some("what broke".into())),
                (true, false, true, true, true),
            ),
            (
                "blank objective does not",
                configs(|c| c.learning_objective = Some("  ".into())),
                (true, false, true, false, true),
            ),
            (
                "explicit read wins over an objective",
                configs(|c| {
                    c.learning_objective = Some("x".into());
                    c.learnings_access = Some(LearningsAccess::Read);
                }),
                (true, false, true, false, true),
            ),
            (
                "lock_learnings freezes",
                configs(|c| {
                    c.learnings_access = Some(LearningsAccess::ReadWrite);
                    c.lock_learnings = Some(true);
                }),
                (true, false, true, false, true),
            ),
            (
                "disable_learning freezes",
                configs(|c| {
                    c.learning_objective = Some("x".into());
                    c.disable_learning = Some(true);
                }),
                (true, false, true, false, true),
            ),
            (
                "learnings none",
                configs(|c| c.learnings_access = Some(LearningsAccess::None)),
                (true, false, false, false, true),
            ),
            (
                "contribution makes the knowledgebase read-write",
                configs(|c| c.knowledgebase_contribution = Some("notes".into())),
                (true, true, true, false, true),
            ),
            (
                "knowledgebase write still reads",
                configs(|c| c.knowledgebase_access = Some(KnowledgebaseAccess::Write)),
                (true, true, true, false, true),
            ),
            (
                "knowledgebase none",
                configs(|c| {
                    c.knowledgebase_access = Some(KnowledgebaseAccess::None);
                    c.knowledgebase_contribution = Some("x".into());
                }),
                (false, false, true, false, true),
            ),
        ];
        for (name, c, want) in cases {
            assert_eq!(flags(TurnAccess::for_step(&c)), want, "{name}");
        }
    }

    #[test]
    fn items_only_narrow() {
        let all = configs(|c| {
            c.knowledgebase_access = Some(KnowledgebaseAccess::ReadWrite);
            c.learnings_access = Some(LearningsAccess::ReadWrite);
        });
        let none = configs(|c| {
            c.knowledgebase_access = Some(KnowledgebaseAccess::Read);
            c.learnings_access = Some(LearningsAccess::Read);
        });
        let t = Some(true);
        let f = Some(false);
        // (configs, write_access, kind, kb write, learnings write, db write)
        let cases = [
            (&all, None, None, true, true, true),
            // A non-empty write_access grants exactly the stores it sets true.
            (&all, wa(f, None, None), None, false, false, false),
            (&all, wa(None, f, None), None, false, false, false),
            (&all, wa(t, None, None), None, false, false, true),
            (&all, wa(None, t, None), None, true, false, false),
            (&all, wa(f, t, t), None, true, true, false),
            (&all, wa(f, f, f), None, false, false, false),
            (&all, wa(None, None, None), None, true, true, true),
            (&all, None, Some(ItemKind::Execution), true, true, true),
            (&all, None, Some(ItemKind::Learning), false, true, false),
            (
                &all,
                None,
                Some(ItemKind::Knowledgebase),
                true,
                false,
                false,
            ),
            (&all, None, Some(ItemKind::Db), false, false, true),
            (
                &all,
                wa(None, f, None),
                Some(ItemKind::Knowledgebase),
                false,
                false,
                false,
            ),
            // `true` never widens what the step does not allow.
            (&none, wa(t, t, t), None, false, false, true),
            (
                &none,
                wa(t, t, t),
                Some(ItemKind::Learning),
                false,
                false,
                false,
            ),
        ];
        for (i, (c, w, kind, kb, learn, db)) in cases.into_iter().enumerate() {
            let a = TurnAccess::for_item(c, &item(w, kind));
            assert_eq!(
                (a.knowledgebase_write, a.learnings_write, a.db_write),
                (kb, learn, db),
                "case {i}"
            );
            assert!(a.output_write && a.knowledgebase_read && a.learnings_read);
        }
    }

    #[test]
    fn reflection_writes_only_the_stores_due() {
        assert_eq!(reflection_due(&configs(|_| {})), None);
        let learn = configs(|c| c.learning_objective = Some("x".into()));
        assert_eq!(
            reflection_due(&learn),
            Some(ReflectionDue {
                learnings: true,
                knowledgebase: false
            })
        );
        let a = TurnAccess::for_reflection(&learn);
        assert_eq!(flags(a), (true, false, true, true, false));
        assert!(!a.output_write);

        let kb = configs(|c| c.knowledgebase_contribution = Some("x".into()));
        let a = TurnAccess::for_reflection(&kb);
        assert_eq!(flags(a), (true, true, true, false, false));

        // Read-write without an objective: nothing due, nothing written.
        let rw = configs(|c| c.learnings_access = Some(LearningsAccess::ReadWrite));
        assert_eq!(reflection_due(&rw), None);
        assert_eq!(
            flags(TurnAccess::for_reflection(&rw)),
            (true, false, true, false, false)
        );
        // A contribution the step may not write is not due.
        let ro = configs(|c| {
            c.knowledgebase_contribution = Some("x".into());
            c.knowledgebase_access = Some(KnowledgebaseAccess::Read);
        });
        assert_eq!(reflection_due(&ro), None);
    }

    fn workspace() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for d in [
            "knowledgebase",
            "learnings/step-1",
            "planning",
            "code/step-1",
            "db",
            "runs/iteration-0/execution/step-0",
            "runs/iteration-0/planning",
        ] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        std::fs::write(
            dir.path()
                .join("runs/iteration-0/execution/step-0/out.json"),
            "{}",
        )
        .unwrap();
        std::fs::write(dir.path().join("workflow.json"), "{}").unwrap();
        dir
    }

    fn folders(g: &TurnGrant) -> Vec<(String, Access)> {
        g.folders
            .iter()
            .map(|f| (f.path.clone(), f.access))
            .collect()
    }

    #[test]
    fn the_grant_follows_the_table_and_creates_writable_folders() {
        let ws = workspace();
        let c = configs(|c| {
            c.knowledgebase_contribution = Some("x".into());
            c.learning_objective = Some("y".into());
        });
        let s = step(&[]);
        let ctx = TurnContext {
            root: ws.path(),
            run_folder: "iteration-0",
            step: &s,
            configs: &c,
        };
        let it = item(wa(Some(false), Some(true), Some(true)), None);
        let g = turn_grant(&ctx, TurnPurpose::Item(&it)).unwrap();
        use Access::*;
        assert_eq!(
            folders(&g),
            [
                ("runs/iteration-0/execution".to_string(), ReadOnly),
                (
                    "runs/iteration-0/execution/Downloads".to_string(),
                    ReadWrite
                ),
                ("runs/iteration-0/execution/step-1".to_string(), ReadWrite),
                ("knowledgebase".to_string(), ReadOnly),
                ("knowledgebase/notes".to_string(), ReadWrite),
                ("learnings/_global".to_string(), ReadWrite),
                ("learnings/step-1".to_string(), ReadOnly),
                ("db".to_string(), ReadOnly),
            ]
        );
        for d in [
            "runs/iteration-0/execution/step-1",
            "runs/iteration-0/execution/Downloads",
            "knowledgebase/notes",
            "learnings/_global",
        ] {
            assert!(ws.path().join(d).is_dir(), "{d} not created");
        }
        let db = g.grant.db().unwrap();
        assert!(!db.writable);
        assert!(db.path.ends_with("db/db.sqlite"));
        assert_eq!(g.db_writable, Some(false));
        let guests: Vec<&str> = g.grant.folders().iter().map(|f| f.guest.as_str()).collect();
        assert!(guests.contains(&"/knowledgebase/notes"), "{guests:?}");
        let text = g.describe();
        assert!(
            text.contains("- knowledgebase/notes/ (read-write)"),
            "{text}"
        );
        assert!(
            text.contains("- runs/iteration-0/execution/ (read-only)"),
            "{text}"
        );
        assert!(text.contains("query only"), "{text}");
        assert!(
            !text.contains("planning") && !text.contains("code/"),
            "{text}"
        );

        let refl = turn_grant(&ctx, TurnPurpose::Reflection).unwrap();
        assert_eq!(
            folders(&refl)[..3],
            [
                ("runs/iteration-0/execution".to_string(), ReadOnly),
                ("runs/iteration-0/execution/Downloads".to_string(), ReadOnly),
                ("runs/iteration-0/execution/step-1".to_string(), ReadOnly),
            ]
        );
    }

    #[test]
    fn a_sub_agent_writes_its_call_folder_and_the_shared_folder_only() {
        let ws = workspace();
        let c = configs(|_| {});
        let s = step(&[]);
        let ctx = TurnContext {
            root: ws.path(),
            run_folder: "iteration-0",
            step: &s,
            configs: &c,
        };
        let parent = "runs/iteration-0/execution/parent";
        let call = format!("{parent}/agents/step-1/calls/call-0001");
        let agent = AgentFolders {
            output: call.clone(),
            shared: Some(format!("{parent}/shared")),
            sub_agent: true,
        };
        let g = turn_grant_in(&ctx, TurnPurpose::Item(&item(None, None)), &agent).unwrap();
        use Access::*;
        assert_eq!(
            folders(&g)[..4],
            [
                ("runs/iteration-0/execution".to_string(), ReadOnly),
                (
                    "runs/iteration-0/execution/Downloads".to_string(),
                    ReadWrite
                ),
                (call.clone(), ReadWrite),
                (format!("{parent}/shared"), ReadWrite),
            ]
        );
        assert!(
            !folders(&g).iter().any(|(p, _)| p == parent),
            "the parent's own output folder is not granted"
        );
        assert!(ws.path().join(&call).is_dir() && ws.path().join(parent).join("shared").is_dir());
        assert_eq!(g.output_dir, ws.path().join(&call));
        assert!(g.describe().contains("your output folder for this call"));

        for bad in [
            "runs/iteration-0/execution",
            "knowledgebase/x",
            "runs/iteration-0/logs/x",
        ] {
            let agent = AgentFolders {
                output: bad.to_string(),
                shared: None,
                sub_agent: true,
            };
            let err = turn_grant_in(&ctx, TurnPurpose::Reflection, &agent).unwrap_err();
            assert!(
                format!("{err:#}").contains("is not inside"),
                "{bad}: {err:#}"
            );
        }
    }

    #[test]
    fn read_only_stores_are_not_created_and_none_hides_them() {
        let dir = tempfile::tempdir().unwrap();
        let c = configs(|c| {
            c.knowledgebase_access = Some(KnowledgebaseAccess::None);
            c.learnings_access = Some(LearningsAccess::None);
        });
        let s = step(&[]);
        let ctx = TurnContext {
            root: dir.path(),
            run_folder: "iteration-0/Group_A",
            step: &s,
            configs: &c,
        };
        let g = turn_grant(&ctx, TurnPurpose::Item(&item(None, None))).unwrap();
        let paths: Vec<String> = g.folders.iter().map(|f| f.path.clone()).collect();
        assert_eq!(
            paths,
            [
                "runs/iteration-0/Group_A/execution",
                "runs/iteration-0/Group_A/execution/Downloads",
                "runs/iteration-0/Group_A/execution/step-1"
            ]
        );
        assert!(!dir.path().join("knowledgebase").exists());
        assert!(!dir.path().join("learnings").exists());
        assert!(g.grant.db().is_none());
        assert!(!g.describe().contains("database"));
    }

    #[test]
    fn dependencies_are_read_only_and_refused_where_the_table_says_no() {
        let ws = workspace();
        let c = configs(|c| {
            c.additional_read_paths = Some(vec!["knowledgebase".into()]);
        });
        let s = step(&["runs/iteration-0/execution/step-0/out.json"]);
        let ctx = TurnContext {
            root: ws.path(),
            run_folder: "iteration-0",
            step: &s,
            configs: &c,
        };
        let g = turn_grant(&ctx, TurnPurpose::Item(&item(None, None))).unwrap();
        assert!(
            folders(&g).contains(&(
                "runs/iteration-0/execution/step-0".to_string(),
                Access::ReadOnly
            )),
            "{:?}",
            folders(&g)
        );

        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("escape")).unwrap();
        // A relative link stays inside the workspace but leads to planning/.
        std::os::unix::fs::symlink("planning", ws.path().join("alias")).unwrap();
        for (bad, why) in [
            ("planning", "never visible"),
            ("code/step-1", "never visible"),
            ("builder", "never visible"),
            ("workflow.json", "workspace root"),
            (".", "workspace root"),
            ("../x", "inside the workspace"),
            ("/etc", "absolute"),
            ("runs/iteration-0", "execution/"),
            ("runs/iteration-0/planning", "execution/"),
            ("runs/iteration-0/logs/execution", "execution/"),
            ("runs/iteration-0/planning/execution/x", "execution/"),
            ("runs/iteration-0/logs/step/execution", "execution/"),
            ("escape", ""),
            ("alias", "symbolic link"),
        ] {
            let s = step(&[bad]);
            let ctx = TurnContext { step: &s, ..ctx };
            let err = turn_grant(&ctx, TurnPurpose::Item(&item(None, None))).unwrap_err();
            let text = format!("{err:#}");
            assert!(text.contains("step \"step-1\""), "{bad}: {text}");
            assert!(text.contains(&format!("{bad:?}")), "{bad}: {text}");
            assert!(text.contains(why), "{bad}: {text}");
        }

        // A missing entry is left out and named, the others are granted.
        let s = step(&[
            "missing/folder",
            "runs/iteration-0/execution/other/out.json",
            "runs/iteration-0/execution/step-0/out.json",
        ]);
        let ctx2 = TurnContext { step: &s, ..ctx };
        let g = turn_grant(&ctx2, TurnPurpose::Item(&item(None, None))).unwrap();
        assert_eq!(
            g.missing,
            [
                ("context_dependencies", "missing/folder".to_string()),
                (
                    "context_dependencies",
                    "runs/iteration-0/execution/other/out.json".to_string()
                )
            ]
        );
        assert!(folders(&g).contains(&(
            "runs/iteration-0/execution/step-0".to_string(),
            Access::ReadOnly
        )));
        assert!(
            g.describe()
                .contains("- missing/folder (declared in context_dependencies) does not exist"),
            "{}",
            g.describe()
        );

        let none = configs(|c| {
            c.knowledgebase_access = Some(KnowledgebaseAccess::None);
            c.additional_read_paths = Some(vec!["knowledgebase".into()]);
        });
        let s = step(&[]);
        let ctx = TurnContext {
            step: &s,
            configs: &none,
            ..ctx
        };
        let err = turn_grant(&ctx, TurnPurpose::Item(&item(None, None))).unwrap_err();
        assert!(
            format!("{err:#}").contains("additional_read_paths"),
            "{err:#}"
        );
    }

    #[test]
    fn nothing_is_created_outside_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("knowledgebase")).unwrap();
        let c = configs(|c| c.knowledgebase_contribution = Some("x".into()));
        let s = step(&[]);
        let ctx = TurnContext {
            root: ws.path(),
            run_folder: "iteration-0",
            step: &s,
            configs: &c,
        };
        assert!(turn_grant(&ctx, TurnPurpose::Item(&item(None, None))).is_err());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);

        let bad_step = Step {
            id: "../x".into(),
            ..step(&[])
        };
        let ctx = TurnContext {
            step: &bad_step,
            ..ctx
        };
        assert!(turn_grant(&ctx, TurnPurpose::Item(&item(None, None))).is_err());
        for bad_run in ["../x", "/tmp"] {
            let s = step(&[]);
            let ctx = TurnContext {
                run_folder: bad_run,
                step: &s,
                ..ctx
            };
            assert!(
                turn_grant(&ctx, TurnPurpose::Reflection).is_err(),
                "{bad_run}"
            );
        }
    }
}
