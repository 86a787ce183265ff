//! Which LLM a step talks to, and how to reach it.
//!
//! The models of a step (spec section 3, workflow.json): `--llm provider:model` when given
//! (it overrides everything, fallbacks included); else the step's `execution_llm`, its
//! `fallbacks` tried in order when the primary fails; else its `execution_tier` resolved
//! through workflow.json `tiers`; else workflow.json's `llm`. A step with none of these has
//! no model, which is an error only if it needs one ([`check_models`], before anything runs).
//! A route's sub-agent step (spec section 4, `predefined_routes`) has models of its own when
//! its step config entry sets `execution_llm` or `execution_tier` and no `--llm` is given
//! ([`LlmSetup::own_step_llm`]); otherwise it talks to its parent's.
//!
//! How a model is reached: `replay` answers from `<workspace>/cassettes/<model_id>.json`
//! (the model id one plain name, the file inside the workspace; one shared position per
//! cassette across the steps of a run); any other provider gets the `base_url` of its
//! workflow.json `providers` entry (else its base URL variable, else its public API) and the
//! key from the variable named by `api_key_env` (else its key variable), provided the
//! operator approved that origin for that variable ([`KeyApprovals`]); a workspace's
//! `base_url` at `localhost` or an address off the public internet needs the operator's
//! approval too, key or not ([`KeyApprovals::check_workspace_host`]). Those defaults are
//! `ANTHROPIC_BASE_URL`, `https://api.anthropic.com` and `ANTHROPIC_API_KEY` for
//! `anthropic`, OpenAI's for every other provider ([`ProviderDefaults`]). The `options` of a
//! model (`temperature`, `max_tokens`, anything else merged into the request body but the
//! fields the host writes, [`RESERVED_OPTIONS`]) go with it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value};

use trellis_sandbox::llm::record::check_replay_model_id;
use trellis_sandbox::llm::{
    Endpoint, KeyApprovals, MAX_REPLAY_VALUES, Options, ProviderDefaults, Recorder, ReplayCursor,
    ReplyStream, Secret, Target, is_loopback_base_url,
};
use trellis_workflow::step_config::{ExecutionTier, LlmRef};
use trellis_workflow::{Step, StepKind, Workspace};

/// The provider answering from cassettes.
pub const REPLAY_PROVIDER: &str = "replay";
pub use trellis_sandbox::llm::record::CASSETTES_DIR;

/// Where the models of a step came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelSource {
    /// `--llm` on the command line.
    Override,
    /// The step's `execution_llm`.
    ExecutionLlm,
    /// The step's `execution_tier`, through workflow.json `tiers`.
    Tier(ExecutionTier),
    /// workflow.json `llm`.
    WorkflowDefault,
    /// workflow.json `builder_llm` (the interactive builder's model).
    BuilderDefault,
}

impl std::fmt::Display for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelSource::Override => f.write_str("--llm"),
            ModelSource::BuilderDefault => f.write_str("workflow.json builder_llm"),
            ModelSource::ExecutionLlm => f.write_str("execution_llm"),
            ModelSource::Tier(t) => write!(f, "execution_tier {}", tier_name(*t)),
            ModelSource::WorkflowDefault => f.write_str("workflow.json llm"),
        }
    }
}

fn tier_name(tier: ExecutionTier) -> &'static str {
    match tier {
        ExecutionTier::High => "high",
        ExecutionTier::Medium => "medium",
        ExecutionTier::Low => "low",
    }
}

/// The models of one step: the primary first, then the fallbacks in order.
#[derive(Debug, Clone, PartialEq)]
pub struct StepModels {
    /// Where they came from.
    pub source: ModelSource,
    /// Primary, then fallbacks.
    pub models: Vec<LlmRef>,
}

/// Parses `provider:model` (the `--llm` form).
pub fn parse_llm_spec(spec: &str) -> Result<LlmRef> {
    match spec.split_once(':') {
        Some((provider, model)) if provider == REPLAY_PROVIDER => {
            check_replay_model_id(model).map_err(|e| anyhow::anyhow!("--llm {spec:?}: {e}"))?;
            Ok(LlmRef {
                provider: provider.to_string(),
                model_id: model.to_string(),
                options: None,
                published_llm_id: None,
            })
        }
        Some((provider, model)) if !provider.is_empty() && !model.is_empty() => Ok(LlmRef {
            provider: provider.to_string(),
            model_id: model.to_string(),
            options: None,
            published_llm_id: None,
        }),
        _ => bail!("--llm {spec:?}: expected PROVIDER:MODEL (e.g. openai:gpt-4o, replay:demo)"),
    }
}

/// The models of step `step_id` of `ws` (see the module docs for the order); `None` when
/// nothing names one. Errors name the step and the setting at fault.
pub fn step_models(
    ws: &Workspace,
    step_id: &str,
    override_llm: Option<&LlmRef>,
) -> Result<Option<StepModels>> {
    if let Some(llm) = override_llm {
        return Ok(Some(StepModels {
            source: ModelSource::Override,
            models: vec![llm.clone()],
        }));
    }
    let configs = ws.agent_configs(step_id);
    let file = ws.step_config_file.display();
    if let Some(llm) = &configs.execution_llm {
        let (Some(provider), Some(model_id)) = (&llm.provider, &llm.model_id) else {
            bail!(
                "step {step_id:?}: {file}: agent_configs.execution_llm names the preset {:?} \
                 (published_llm_id) without provider and model_id; presets are not resolved \
                 here: set \"provider\" and \"model_id\"",
                llm.published_llm_id.as_deref().unwrap_or_default()
            );
        };
        let mut models = vec![LlmRef {
            provider: provider.clone(),
            model_id: model_id.clone(),
            options: llm.options.clone(),
            published_llm_id: None,
        }];
        models.extend(llm.fallbacks.iter().cloned());
        return Ok(Some(StepModels {
            source: ModelSource::ExecutionLlm,
            models,
        }));
    }
    if let Some(tier) = configs.execution_tier {
        let name = tier_name(tier);
        let model = ws.manifest.tier(name).with_context(|| {
            let known = ws.manifest.tier_names();
            format!(
                "step {step_id:?}: {file}: agent_configs.execution_tier is {name:?} but \
                 workflow.json has no tiers.{name} nor capabilities.llm_config.tiered_config.{} \
                 (tiers defined: {})",
                trellis_workflow::manifest::TIER_KEYS
                    .iter()
                    .find(|(_, t)| *t == name)
                    .map_or("tier_1", |(k, _)| *k),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )
        })?;
        return Ok(Some(StepModels {
            source: ModelSource::Tier(tier),
            models: vec![model.clone()],
        }));
    }
    Ok(ws.manifest.default_llm().map(|llm| StepModels {
        source: ModelSource::WorkflowDefault,
        models: vec![llm.clone()],
    }))
}

/// Whether a step runs the agent loop before anything else (and so needs a model). A
/// scripted `regular` step calls an LLM only to repair a failing script, or to write the
/// script it does not have yet.
pub fn needs_model(ws: &Workspace, step: &Step) -> bool {
    match &step.kind {
        StepKind::MessageSequence(_) | StepKind::TodoTask(_) => true,
        StepKind::Regular => {
            !ws.agent_configs(&step.id).is_scripted()
                || !trellis_sandbox::script::has_script(&ws.fs, &step.id)
        }
        _ => false,
    }
}

/// The fields of a request body that the host writes and `options` may not: the model,
/// the conversation (`messages`, and `system`, where Anthropic's API puts the system
/// prompt), the tools, and `stream_options` (what a streamed answer reports, its usage
/// among it). `stream` is not sent as it is either: it is the switch of [`stream_option`].
pub const RESERVED_OPTIONS: [&str; 5] = ["model", "messages", "system", "tools", "stream_options"];

/// `stream` of a model's `options` object: `false` turns streaming off for that model (a
/// server that cannot stream); absent leaves it to workflow.json's provider settings. The
/// provider writes `stream` in the request body itself.
pub fn stream_option(options: Option<&Map<String, Value>>, at: &str) -> Result<Option<bool>> {
    match options.and_then(|o| o.get("stream")) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => bail!(
            "{at}.stream: expected true or false (whether the model's replies stream), \
             found {other}"
        ),
    }
}

/// The request options of a model's `options` object: `temperature` (a number) and
/// `max_tokens` (a whole number) by name, `stream` taken out ([`stream_option`]),
/// everything else merged into the request body but the fields the host writes
/// ([`RESERVED_OPTIONS`]), which are refused.
pub fn request_options(options: Option<&Map<String, Value>>, at: &str) -> Result<Option<Options>> {
    let Some(options) = options else {
        return Ok(None);
    };
    stream_option(Some(options), at)?;
    let mut out = Options::default();
    let mut extra = Map::new();
    for (key, value) in options {
        if key == "stream" {
            continue;
        }
        if RESERVED_OPTIONS.contains(&key.as_str()) {
            bail!(
                "{at}.{key}: the host writes {key:?} in the request body, options cannot \
                 replace it; remove it"
            );
        }
        match key.as_str() {
            "temperature" => {
                let t = value.as_f64().with_context(|| {
                    format!("{at}.temperature: expected a number, found {value}")
                })?;
                out.temperature = Some(t as f32);
            }
            "max_tokens" => {
                let n = value
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .with_context(|| {
                        format!("{at}.max_tokens: expected a whole number, found {value}")
                    })?;
                out.max_tokens = Some(n);
            }
            _ => {
                extra.insert(key.clone(), value.clone());
            }
        }
    }
    if !extra.is_empty() {
        out.extra = Some(Value::Object(extra));
    }
    Ok(Some(out))
}

/// What the runner of one step needs to reach its models.
#[derive(Debug, Clone)]
pub struct StepLlm {
    /// Where the models came from.
    pub source: ModelSource,
    /// Primary, then fallbacks.
    pub targets: Vec<Target>,
    /// The request options of each target, by position.
    pub options: Vec<Option<Options>>,
    /// The cassette position, when the primary is `replay`.
    pub replay: Option<ReplayCursor>,
}

/// How the steps of one run reach their models: the `--llm` override, the cassette
/// positions shared across steps, the recorder of `--record` and the operator's key
/// approvals. Clones share the cassette positions (a sub-agent's resolver holds one).
#[derive(Debug, Clone)]
pub struct LlmSetup {
    override_llm: Option<LlmRef>,
    recorder: Option<Arc<Recorder>>,
    cursors: Arc<Mutex<BTreeMap<PathBuf, ReplayCursor>>>,
    approvals: Arc<KeyApprovals>,
    providers: Option<Arc<Vec<String>>>,
    no_stream: bool,
}

impl Default for LlmSetup {
    fn default() -> Self {
        LlmSetup::new(None)
    }
}

impl LlmSetup {
    /// Models from the workspace's settings, or `override_llm` for every step; keys go
    /// where [`KeyApprovals::defaults`] allow.
    pub fn new(override_llm: Option<LlmRef>) -> Self {
        LlmSetup {
            override_llm,
            recorder: None,
            cursors: Arc::default(),
            approvals: Arc::new(KeyApprovals::defaults()),
            providers: None,
            no_stream: false,
        }
    }

    /// No reply streams, whatever the workflow says (`--no-stream`).
    pub fn without_streaming(mut self) -> Self {
        self.no_stream = true;
        self
    }

    /// Models name only these LLM providers (the ids of the loaded provider plugins, and
    /// `replay`); another is an error naming the step, before anything runs.
    pub fn with_providers(mut self, ids: Vec<String>) -> Self {
        self.providers = Some(Arc::new(ids));
        self
    }

    /// Keys go only where `approvals` allow.
    pub fn with_approvals(mut self, approvals: KeyApprovals) -> Self {
        self.approvals = Arc::new(approvals);
        self
    }

    /// The operator's approvals (keys, secrets and hosts).
    pub fn approvals(&self) -> Arc<KeyApprovals> {
        self.approvals.clone()
    }

    /// Every step talks to `llm`, unless an override is set already (the operator's
    /// `--llm` wins): a builder's `execute_step` with a `tier`.
    pub fn with_tier_override(mut self, llm: LlmRef) -> Self {
        if self.override_llm.is_none() {
            self.override_llm = Some(llm);
        }
        self
    }

    /// The same setup with cassette positions of its own, at the start of each cassette:
    /// what a new conversation (a server's builder session, a schedule's firing) replays.
    pub fn with_own_replay(&self) -> Self {
        LlmSetup {
            cursors: Arc::default(),
            ..self.clone()
        }
    }

    /// Records every answered call into `recorder`.
    pub fn with_recorder(mut self, recorder: Arc<Recorder>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// The `--llm` override.
    pub fn override_llm(&self) -> Option<&LlmRef> {
        self.override_llm.as_ref()
    }

    /// The recorder, when recording.
    pub fn recorder(&self) -> Option<&Arc<Recorder>> {
        self.recorder.as_ref()
    }

    /// The targets of step `step_id`; `None` when it has no model.
    pub fn step_llm(&self, ws: &Workspace, step_id: &str) -> Result<Option<StepLlm>> {
        let Some(models) = step_models(ws, step_id, self.override_llm.as_ref())? else {
            return Ok(None);
        };
        self.reach(ws, models, &format!("step {step_id:?}"))
            .map(Some)
    }

    /// The model of the interactive builder: `--llm`, else workflow.json `builder_llm`,
    /// else its `llm`; an error saying how to name one when none does.
    pub fn builder_llm(&self, ws: &Workspace) -> Result<StepLlm> {
        let models = if let Some(llm) = &self.override_llm {
            StepModels {
                source: ModelSource::Override,
                models: vec![llm.clone()],
            }
        } else if let Some(llm) = ws.manifest.builder_model() {
            StepModels {
                source: ModelSource::BuilderDefault,
                models: vec![llm.clone()],
            }
        } else if let Some(llm) = ws.manifest.default_llm() {
            StepModels {
                source: ModelSource::WorkflowDefault,
                models: vec![llm.clone()],
            }
        } else {
            bail!(
                "the builder has no model: give --llm PROVIDER:MODEL, or set \"builder_llm\" \
                 (or \"llm\") in {}/workflow.json",
                ws.root.display()
            );
        };
        self.reach(ws, models, "the builder")
    }

    /// How `models` are reached; errors start with `label`.
    fn reach(&self, ws: &Workspace, models: StepModels, label: &str) -> Result<StepLlm> {
        let mut targets = Vec::new();
        let mut options = Vec::new();
        let mut replay = None;
        for (i, model) in models.models.iter().enumerate() {
            self.check_provider(model, models.source)
                .with_context(|| label.to_string())?;
            let at = match (models.source, i) {
                (ModelSource::ExecutionLlm, 0) => "execution_llm.options".to_string(),
                (ModelSource::ExecutionLlm, n) => {
                    format!("execution_llm.fallbacks[{}].options", n - 1)
                }
                (ModelSource::BuilderDefault, _) => "workflow.json builder_llm.options".to_string(),
                (ModelSource::Tier(t), _) => {
                    format!("workflow.json tiers.{}.options", tier_name(t))
                }
                _ => "workflow.json llm.options".to_string(),
            };
            options.push(
                request_options(model.options.as_ref(), &at).with_context(|| label.to_string())?,
            );
            // The model's own switch, else its provider's in workflow.json, else on.
            let stream = !self.no_stream
                && stream_option(model.options.as_ref(), &at)?
                    .or_else(|| {
                        ws.manifest
                            .providers
                            .get(&model.provider)
                            .and_then(|p| p.stream)
                    })
                    .unwrap_or(true);
            if model.provider == REPLAY_PROVIDER {
                if i > 0 {
                    bail!(
                        "{label}: {}: replay can only be a step's primary model, not a fallback",
                        models.source
                    );
                }
                let cursor = self.cursor(&ws.root, &model.model_id).with_context(|| {
                    format!(
                        "{label}: model replay:{} ({})",
                        model.model_id, models.source
                    )
                })?;
                targets.push(Target {
                    provider: model.provider.clone(),
                    model: model.model_id.clone(),
                    endpoint: cursor.endpoint_at(0)?,
                    secret: Secret::none(),
                    stream,
                });
                replay = Some(cursor);
            } else {
                let target = remote_target(ws, model, &self.approvals).with_context(|| {
                    format!(
                        "{label}: model {}:{} ({})",
                        model.provider, model.model_id, models.source
                    )
                })?;
                targets.push(Target { stream, ..target });
            }
        }
        Ok(StepLlm {
            source: models.source,
            targets,
            options,
            replay,
        })
    }

    /// The models of sub-agent step `step_id` when they are its own: its step config sets
    /// `execution_llm` or `execution_tier` and no `--llm` is given. `None` means it talks to
    /// its parent's models (under `--llm` those are the override already).
    pub fn own_step_llm(&self, ws: &Workspace, step_id: &str) -> Result<Option<StepLlm>> {
        if self.override_llm.is_some() {
            return Ok(None);
        }
        let configs = ws.agent_configs(step_id);
        if configs.execution_llm.is_none() && configs.execution_tier.is_none() {
            return Ok(None);
        }
        self.step_llm(ws, step_id)
    }

    /// Refuses a provider no plugin answers for, suggesting the loaded one that differs
    /// only in case.
    fn check_provider(&self, model: &LlmRef, source: ModelSource) -> Result<()> {
        let Some(loaded) = &self.providers else {
            return Ok(());
        };
        let provider = model.provider.as_str();
        if provider == REPLAY_PROVIDER || loaded.iter().any(|p| p == provider) {
            return Ok(());
        }
        let mut known: Vec<&str> = loaded.iter().map(String::as_str).collect();
        if !known.contains(&REPLAY_PROVIDER) {
            known.push(REPLAY_PROVIDER);
        }
        let hint = match known.iter().find(|k| k.eq_ignore_ascii_case(provider)) {
            Some(k) => format!("provider ids are lower case: write {k:?}"),
            None => format!(
                "give one of the loaded providers ({}), or load the plugin with --plugins DIR",
                known.join(", ")
            ),
        };
        bail!(
            "model {provider}:{} ({source}): no LLM provider {provider:?}; {hint}",
            model.model_id
        )
    }

    fn cursor(&self, root: &Path, model_id: &str) -> Result<ReplayCursor> {
        let mut cursors = self.cursors.lock().unwrap_or_else(|e| e.into_inner());
        let key = cassette_path(root, model_id);
        if let Some(cursor) = cursors.get(&key) {
            return Ok(cursor.clone());
        }
        let cursor = ReplayCursor::in_workspace(root, model_id)?;
        // Each cassette stays parsed for the whole run: their values count together.
        let held = cursors
            .values()
            .map(ReplayCursor::values)
            .fold(cursor.values(), usize::saturating_add);
        if held > MAX_REPLAY_VALUES {
            bail!(
                "cassette {}: the run's cassettes would hold about {held} JSON values together, \
                 more than the {MAX_REPLAY_VALUES} one run replays; record fewer calls or use \
                 fewer models",
                cursor.cassette().display()
            );
        }
        cursors.insert(key, cursor.clone());
        Ok(cursor)
    }
}

/// One LLM call to `targets` (primary, then fallbacks, each with its `options`): under
/// replay, the primary at the cassette's next position. The reply's pieces go to `reply` as
/// they arrive. An answered call goes to `recorder`, with the pieces it came in.
#[allow(clippy::too_many_arguments)]
pub async fn complete(
    registry: &trellis_sandbox::PluginRegistry,
    targets: &[Target],
    options: &[Option<Options>],
    replay: Option<&ReplayCursor>,
    recorder: Option<&Recorder>,
    request: &trellis_sandbox::llm::Request,
    retry: &trellis_sandbox::llm::RetryPolicy,
    limits: &trellis_sandbox::Limits,
    reply: Option<&ReplyStream>,
) -> trellis_sandbox::llm::Completion {
    let targets = match replay {
        Some(cursor) => match (targets.first(), cursor.next_endpoint()) {
            (Some(first), Ok(endpoint)) => vec![Target {
                endpoint,
                ..first.clone()
            }],
            _ => targets.to_vec(),
        },
        None => targets.to_vec(),
    };
    // A recording keeps where the pieces fell even when nobody watches them.
    let unwatched;
    let reply = match (reply, recorder) {
        (None, Some(_)) => {
            unwatched = ReplyStream::unwatched(true);
            Some(&unwatched)
        }
        (reply, _) => reply,
    };
    let completion = trellis_sandbox::llm::complete_with_reply(
        registry, &targets, options, request, retry, limits, reply,
    )
    .await;
    if let (Some(recorder), Ok(response)) = (recorder, &completion.result) {
        let chunks = reply.map(|r| r.chunks_of(response)).unwrap_or_default();
        if let Err(e) = recorder.record_streamed(request, response, chunks) {
            tracing::error!("{e:#}");
        }
    }
    completion
}

/// `<root>/cassettes/<model_id>.json`.
pub fn cassette_path(root: &Path, model_id: &str) -> PathBuf {
    root.join(CASSETTES_DIR).join(format!("{model_id}.json"))
}

/// The endpoint and key of a provider other than `replay`, refused (naming the setting and
/// how to approve it) when the key would go to an origin the operator did not approve.
fn remote_target(ws: &Workspace, model: &LlmRef, approvals: &KeyApprovals) -> Result<Target> {
    let settings = ws.manifest.providers.get(&model.provider);
    let defaults = ProviderDefaults::of(&model.provider);
    let base_url = settings.and_then(|s| s.base_url.clone());
    let endpoint = match &base_url {
        Some(url) => Endpoint::new(url.clone()),
        None => defaults.endpoint_from_env(),
    };
    let named_key = settings.and_then(|s| s.api_key_env.as_deref());
    let key_env = named_key.unwrap_or(defaults.key_env);
    let secret = Secret::from_env(key_env);
    if let Err(problem) = approvals.check(key_env, secret.is_set(), &endpoint.base_url) {
        let setting = match (named_key, &base_url) {
            (Some(_), _) => "api_key_env",
            (None, Some(_)) => "base_url",
            (None, None) => bail!("{problem}"),
        };
        bail!(
            "workflow.json: providers.{}.{setting}: {problem}",
            model.provider
        );
    }
    if let Some(url) = &base_url
        && let Err(problem) = approvals.check_workspace_host(key_env, url)
    {
        bail!(
            "workflow.json: providers.{}.base_url: {problem}",
            model.provider
        );
    }
    if !secret.is_set() && !is_loopback_base_url(&endpoint.base_url) {
        let named = match named_key {
            Some(_) => format!(
                " (named by workflow.json providers.{}.api_key_env)",
                model.provider
            ),
            None => String::new(),
        };
        bail!(
            "the key variable {key_env}{named} is not set: set {key_env} to the key for {}; no \
             request goes out without it",
            endpoint.base_url
        );
    }
    Ok(Target {
        provider: model.provider.clone(),
        model: model.model_id.clone(),
        endpoint,
        secret,
        stream: true,
    })
}

/// Checks, before anything runs, that every one of `steps` that needs a model has one and
/// that it can be reached (known tier, existing cassette, usable options), and so can the
/// own models of their routes' sub-agent steps ([`LlmSetup::own_step_llm`]). Every problem
/// is reported at once, each naming its step (and route).
pub fn check_models<'w>(
    ws: &Workspace,
    steps: impl IntoIterator<Item = &'w Step>,
    llm: &LlmSetup,
) -> Result<()> {
    let mut problems: Vec<String> = Vec::new();
    for step in steps {
        check_route_models(ws, step, llm, &mut problems);
        if !needs_model(ws, step) {
            // A scripted step calls a model only to repair its script: the model it would
            // use must resolve (its key approved for its origin) before anything runs too.
            if matches!(step.kind, StepKind::Regular)
                && let Err(e) = llm.step_llm(ws, &step.id)
            {
                problems.push(format!("{e:#}"));
            }
            continue;
        }
        match llm.step_llm(ws, &step.id) {
            Ok(Some(_)) => {}
            Ok(None) => problems.push(format!(
                "step {:?} ({}) needs an LLM and has none{}: give --llm PROVIDER:MODEL, set \
                 agent_configs.execution_llm (or execution_tier with workflow.json tiers) in \
                 its step config, or set \"llm\" in workflow.json{}",
                step.id,
                step.type_name(),
                if ws.agent_configs(&step.id).is_scripted() {
                    " (it is scripted but has no script yet: an agent turn writes it)"
                } else {
                    ""
                },
                script_hint(ws, step)
            )),
            Err(e) => problems.push(format!("{e:#}")),
        }
    }
    // Steps sharing a provider share its problem: say it once.
    let mut seen = std::collections::BTreeSet::new();
    problems.retain(|p| seen.insert(p.clone()));
    match problems.len() {
        0 => Ok(()),
        1 => bail!("{}", problems[0]),
        _ => bail!("{}", problems.join("\n")),
    }
}

/// For a `regular` step with a script in `code/<id>/`: the setting that runs it instead of
/// an agent.
fn script_hint(ws: &Workspace, step: &Step) -> String {
    if !matches!(step.kind, StepKind::Regular) {
        return String::new();
    }
    ["main.py", "main.wasm"]
        .iter()
        .map(|name| format!("code/{}/{name}", step.id))
        .find(|path| ws.fs.kind(path).is_ok_and(|k| k.is_some()))
        .map(|path| {
            format!(
                "; or, since {path} exists, run it as the step: set \
                 \"declared_execution_mode\": \"scripted\" in its step config"
            )
        })
        .unwrap_or_default()
}

/// The own models of the sub-agent steps of `step`'s routes, nested routes included.
fn check_route_models(ws: &Workspace, step: &Step, llm: &LlmSetup, problems: &mut Vec<String>) {
    for route in step.predefined_routes() {
        // The sub-agent step's own id: an orphan step a route names keeps its config.
        if let Err(e) = llm.own_step_llm(ws, &route.sub_agent_step.id) {
            problems.push(format!(
                "route {:?} of step {:?} (its sub-agent step): {e:#}",
                route.route_id, step.id
            ));
        }
        check_route_models(ws, &route.sub_agent_step, llm, problems);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn workspace(root: &Path, configs: Value, manifest: Value) -> Workspace {
        let plan = json!({"objective": "t", "steps": [
            {"id": "a", "type": "regular", "title": "A", "description": "do a"},
            {"id": "b", "type": "regular", "title": "B", "description": "do b"},
            {"id": "c", "type": "regular", "title": "C", "description": "do c"}
        ]});
        std::fs::create_dir_all(root.join("planning")).unwrap();
        std::fs::write(root.join("planning/plan.json"), plan.to_string()).unwrap();
        std::fs::write(
            root.join("planning/step_config.json"),
            json!({"steps": configs}).to_string(),
        )
        .unwrap();
        std::fs::write(root.join("workflow.json"), manifest.to_string()).unwrap();
        Workspace::open(root).unwrap()
    }

    /// The models of a run whose operator approved this machine (`--allow-host 127.0.0.1`).
    fn local(override_llm: Option<LlmRef>) -> LlmSetup {
        let mut approvals = KeyApprovals::defaults();
        approvals.allow_host("127.0.0.1").unwrap();
        LlmSetup::new(override_llm).with_approvals(approvals)
    }

    /// A provider on this machine whose key variable is unset: reachable without a key once
    /// the operator approves the machine ([`local`]).
    static LOCAL_KEYLESS: std::sync::LazyLock<Value> = std::sync::LazyLock::new(
        || json!({"base_url": "http://127.0.0.1:9/v1", "api_key_env": "TRELLIS_UNIT_TEST_NO_KEY"}),
    );

    #[test]
    fn an_unset_key_is_refused_but_for_a_server_on_this_machine() {
        let dir = tempfile::tempdir().unwrap();
        let remote = json!({"base_url": "https://llm.example/v1",
                            "api_key_env": "TRELLIS_UNIT_TEST_NO_KEY"});
        let ws = workspace(
            dir.path(),
            json!([]),
            json!({"llm": {"provider": "openai", "model_id": "m"},
                   "providers": {"openai": remote}}),
        );
        let err = format!("{:#}", LlmSetup::new(None).step_llm(&ws, "a").unwrap_err());
        assert!(err.contains("set TRELLIS_UNIT_TEST_NO_KEY"), "{err}");
        let ws = workspace(
            dir.path(),
            json!([]),
            json!({"llm": {"provider": "openai", "model_id": "m"},
                   "providers": {"openai": LOCAL_KEYLESS.clone()}}),
        );
        assert!(local(None).step_llm(&ws, "a").unwrap().is_some());
        let only = local(None).with_providers(vec!["openai".into()]);
        only.step_llm(&ws, "a").unwrap();
        let err = local(Some(parse_llm_spec("OpenAI:m").unwrap()))
            .with_providers(vec!["openai".into()])
            .step_llm(&ws, "a")
            .unwrap_err();
        assert!(format!("{err:#}").contains("write \"openai\""), "{err:#}");
    }

    #[test]
    fn a_workspace_base_url_off_the_public_internet_needs_the_operators_approval() {
        let dir = tempfile::tempdir().unwrap();
        let at = |url: &str| {
            workspace(
                dir.path(),
                json!([]),
                json!({"llm": {"provider": "openai", "model_id": "m"},
                       "providers": {"openai": {"base_url": url,
                                                "api_key_env": "TRELLIS_UNIT_TEST_NO_KEY"}}}),
            )
        };
        let ws = at("http://127.0.0.1:9/v1");
        let err = format!("{:#}", LlmSetup::new(None).step_llm(&ws, "a").unwrap_err());
        assert!(
            err.contains(
                "workflow.json: providers.openai.base_url: http://127.0.0.1:9/v1 is 127.0.0.1 \
                 (loopback, RFC 1122), off the public internet, which a workspace cannot \
                 choose alone; the operator approves it with --allow-host 127.0.0.1:9 (or \
                 allow_host in "
            ),
            "{err}"
        );
        // The host on that port, the host on any port, or the origin for the key approve it.
        let approved = |edit: &dyn Fn(&mut KeyApprovals)| {
            let mut approvals = KeyApprovals::none();
            edit(&mut approvals);
            LlmSetup::new(None)
                .with_approvals(approvals)
                .step_llm(&ws, "a")
                .map(|llm| llm.is_some())
                .map_err(|e| format!("{e:#}"))
        };
        assert_eq!(
            approved(&|a| a.allow_host("127.0.0.1:9").unwrap()),
            Ok(true)
        );
        assert_eq!(approved(&|a| a.allow_host("127.0.0.1").unwrap()), Ok(true));
        let spec = "TRELLIS_UNIT_TEST_NO_KEY=http://127.0.0.1:9";
        assert_eq!(approved(&|a| a.allow_spec(spec).unwrap()), Ok(true));
        let other_port = approved(&|a| a.allow_host("127.0.0.1:10").unwrap()).unwrap_err();
        assert!(
            other_port.contains("--allow-host 127.0.0.1:9"),
            "{other_port}"
        );
        // Other spellings of this machine, and the private ranges, need it too.
        for (url, what) in [
            ("http://localhost:9/v1", "is this machine"),
            ("https://app.localhost:9/v1", "is this machine"),
            ("http://[::1]:9/v1", "is ::1 (loopback, RFC 4291)"),
            ("http://127.1.2.3:9", "is 127.1.2.3 (loopback, RFC 1122)"),
            ("HTTP://127.0.0.1:9/v1", "is 127.0.0.1 (loopback, RFC 1122)"),
            ("https://10.0.0.5/v1", "is 10.0.0.5 (private use, RFC 1918)"),
            (
                "https://[fd00::1]/v1",
                "is fd00::1 (unique local, RFC 4193)",
            ),
        ] {
            let ws = at(url);
            let err = format!("{:#}", LlmSetup::new(None).step_llm(&ws, "a").unwrap_err());
            assert!(
                err.contains(&format!("providers.openai.base_url: {url} {what}, off")),
                "{url}: {err}"
            );
        }
    }

    #[test]
    fn options_cannot_replace_what_the_host_writes_in_the_request() {
        for key in RESERVED_OPTIONS {
            let map = json!({"temperature": 0, key: "x"});
            let err = request_options(map.as_object(), "execution_llm.options")
                .unwrap_err()
                .to_string();
            assert_eq!(
                err,
                format!(
                    "execution_llm.options.{key}: the host writes \"{key}\" in the request \
                     body, options cannot replace it; remove it"
                )
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace(
            dir.path(),
            json!([{"id": "a", "agent_configs": {"execution_llm": {"provider": "openai",
                "model_id": "m", "options": {"model": "gpt-4-32k"}}}}]),
            json!({"providers": {"openai": LOCAL_KEYLESS.clone()}}),
        );
        let err = check_models(&ws, &ws.plan.steps[..1], &local(None)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "step \"a\": execution_llm.options.model: the host writes \"model\" in the \
             request body, options cannot replace it; remove it"
        );
    }

    fn names(models: &StepModels) -> Vec<String> {
        models
            .models
            .iter()
            .map(|m| format!("{}:{}", m.provider, m.model_id))
            .collect()
    }

    #[test]
    fn execution_llm_then_tier_then_default_and_the_override_wins() {
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace(
            dir.path(),
            json!([
                {"id": "a", "agent_configs": {"execution_llm": {"provider": "openai",
                    "model_id": "big", "options": {"temperature": 0.5},
                    "fallbacks": [{"provider": "openai", "model_id": "f1"},
                                  {"provider": "other", "model_id": "f2"}]}}},
                {"id": "b", "agent_configs": {"execution_tier": "low"}}
            ]),
            json!({"llm": {"provider": "openai", "model_id": "default"},
                   "tiers": {"low": {"provider": "openai", "model_id": "small"}},
                   "providers": {"openai": LOCAL_KEYLESS.clone(), "other": LOCAL_KEYLESS.clone()}}),
        );
        let a = step_models(&ws, "a", None).unwrap().unwrap();
        assert_eq!(a.source, ModelSource::ExecutionLlm);
        assert_eq!(names(&a), ["openai:big", "openai:f1", "other:f2"]);
        let b = step_models(&ws, "b", None).unwrap().unwrap();
        assert_eq!(b.source, ModelSource::Tier(ExecutionTier::Low));
        assert_eq!(names(&b), ["openai:small"]);
        let c = step_models(&ws, "c", None).unwrap().unwrap();
        assert_eq!(c.source, ModelSource::WorkflowDefault);
        assert_eq!(names(&c), ["openai:default"]);
        let over = parse_llm_spec("replay:demo").unwrap();
        let a = step_models(&ws, "a", Some(&over)).unwrap().unwrap();
        assert_eq!(names(&a), ["replay:demo"], "no fallbacks under --llm");

        let setup = local(None);
        let llm = setup.step_llm(&ws, "a").unwrap().unwrap();
        assert_eq!(llm.targets.len(), 3);
        assert_eq!(llm.options[0].as_ref().unwrap().temperature, Some(0.5));
        assert_eq!(llm.options[1], None);
    }

    #[test]
    fn a_step_without_a_model_or_with_an_unknown_tier_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace(
            dir.path(),
            json!([{"id": "b", "agent_configs": {"execution_tier": "high"}}]),
            json!({"providers": {"openai": LOCAL_KEYLESS.clone()}}),
        );
        let setup = LlmSetup::new(None);
        let err = check_models(&ws, &ws.plan.steps, &setup)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("step \"a\" (regular) needs an LLM and has none"),
            "{err}"
        );
        assert!(err.contains("--llm PROVIDER:MODEL"), "{err}");
        assert!(err.contains("execution_llm"), "{err}");
        assert!(err.contains("\"llm\" in workflow.json"), "{err}");
        assert!(err.contains("step \"b\""), "{err}");
        assert!(err.contains("no tiers.high"), "{err}");
        let over = local(Some(parse_llm_spec("openai:x").unwrap()));
        check_models(&ws, &ws.plan.steps, &over).unwrap();
        assert!(parse_llm_spec("openai").is_err());
        assert!(parse_llm_spec(":x").is_err());
    }

    #[test]
    fn options_split_into_known_fields_and_body_extras() {
        let map = json!({"temperature": 0, "max_tokens": 100, "top_p": 0.9});
        let o = request_options(map.as_object(), "execution_llm.options")
            .unwrap()
            .unwrap();
        assert_eq!(o.temperature, Some(0.0));
        assert_eq!(o.max_tokens, Some(100));
        assert_eq!(o.extra, Some(json!({"top_p": 0.9})));
        let bad = json!({"max_tokens": "lots"});
        let err = request_options(bad.as_object(), "execution_llm.options")
            .unwrap_err()
            .to_string();
        assert!(err.contains("execution_llm.options.max_tokens"), "{err}");
    }

    #[test]
    fn steps_replaying_one_cassette_share_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace(
            dir.path(),
            json!([]),
            json!({"llm": {"provider": "replay", "model_id": "tape"}}),
        );
        let setup = LlmSetup::new(None);
        assert!(setup.step_llm(&ws, "a").is_err(), "no cassette yet");
        std::fs::create_dir_all(dir.path().join(CASSETTES_DIR)).unwrap();
        std::fs::write(cassette_path(dir.path(), "tape"), "[]").unwrap();
        let a = setup.step_llm(&ws, "a").unwrap().unwrap().replay.unwrap();
        let b = setup.step_llm(&ws, "b").unwrap().unwrap().replay.unwrap();
        a.next_endpoint().unwrap();
        assert_eq!(b.position(), 1);
    }

    #[test]
    fn the_cassettes_of_a_run_count_their_values_together() {
        // Five models, each replaying a cassette of just under the budget of one: the
        // fifth would keep more parsed than a run may hold, and is refused.
        let dir = tempfile::tempdir().unwrap();
        let models = ["m0", "m1", "m2", "m3", "m4"];
        let configs: Vec<Value> = models
            .iter()
            .map(|m| {
                json!({"id": m, "agent_configs": {"execution_llm":
                {"provider": "replay", "model_id": m}}})
            })
            .collect();
        let ws = workspace(
            dir.path(),
            Value::Array(configs),
            json!({"llm": {"provider": "replay", "model_id": "m0"}}),
        );
        std::fs::create_dir_all(dir.path().join(CASSETTES_DIR)).unwrap();
        let per_cassette = MAX_REPLAY_VALUES / 4 - 2;
        let cassette = format!("[{}0]", "0,".repeat(per_cassette - 2));
        for m in models {
            std::fs::write(cassette_path(dir.path(), m), &cassette).unwrap();
        }
        let setup = LlmSetup::new(None);
        for m in &models[..4] {
            let cursor = setup.step_llm(&ws, m).unwrap().unwrap().replay.unwrap();
            assert_eq!(cursor.values(), per_cassette);
        }
        let err = format!("{:#}", setup.step_llm(&ws, "m4").unwrap_err());
        assert!(
            err.contains(&format!(
                "cassettes/m4.json: the run's cassettes would hold about {} JSON values \
                 together, more than the {MAX_REPLAY_VALUES} one run replays",
                5 * per_cassette
            )),
            "{err}"
        );
        // A model already replayed is not counted twice.
        assert!(setup.step_llm(&ws, "m0").is_ok());
    }

    #[test]
    fn a_sub_agent_has_its_own_models_only_when_its_config_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace(
            dir.path(),
            json!([
                {"id": "b", "agent_configs": {"execution_llm":
                    {"provider": "replay", "model_id": "tape"}}},
                {"id": "c", "agent_configs": {"execution_llm":
                    {"provider": "replay", "model_id": "other"}}},
                {"id": "d", "agent_configs": {"selected_tools": []}}
            ]),
            json!({"llm": {"provider": "replay", "model_id": "tape"}}),
        );
        std::fs::create_dir_all(dir.path().join(CASSETTES_DIR)).unwrap();
        for name in ["tape", "other"] {
            std::fs::write(cassette_path(dir.path(), name), "[]").unwrap();
        }
        let setup = LlmSetup::new(None);
        let clone = setup.clone();
        assert!(setup.own_step_llm(&ws, "a").unwrap().is_none(), "no entry");
        assert!(
            setup.own_step_llm(&ws, "d").unwrap().is_none(),
            "no model in it"
        );
        let parent = setup.step_llm(&ws, "a").unwrap().unwrap().replay.unwrap();
        // The same cassette shares one position, across clones of the setup too.
        let same = clone
            .own_step_llm(&ws, "b")
            .unwrap()
            .unwrap()
            .replay
            .unwrap();
        let other = clone.own_step_llm(&ws, "c").unwrap().unwrap();
        parent.next_endpoint().unwrap();
        assert_eq!(same.position(), 1);
        assert_eq!(other.targets[0].model, "other");
        assert_eq!(other.replay.unwrap().position(), 0);
        let over = LlmSetup::new(Some(parse_llm_spec("openai:x").unwrap()));
        assert!(
            over.own_step_llm(&ws, "b").unwrap().is_none(),
            "--llm: inherit"
        );
    }
}
