//! `call_sub_agent`: one call of a route's sub-agent, run as a child agent in a fresh call
//! folder with its route's conversation (see [`crate::routes`]).

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use super::budget::TurnShares;
use super::prompts::{system_prompt, unsandboxed_note};
use super::turn::{MIN_CALL_TIME, parse_arguments, tool_record};
use super::{AgentSetup, Resolver, Run, StepRunner, TurnEnd};
use crate::events::RunEvent;
use crate::grants::{AgentFolders, TurnAccess};
use crate::routes::{AgentHome, CallResult, call_preamble, files_written};
use crate::session::{SESSION_FILE, Session, Status, ToolCallRecord, now_rfc3339};
use trellis_sandbox::llm::{Message, ToolCall};
use trellis_workflow::plan::{Item, ItemBody, Step, StepKind};

/// The item id of a later call's turn: the caller's new instructions, in the route's
/// conversation so far.
pub const FOLLOW_UP_ITEM_ID: &str = "follow-up";

impl StepRunner<'_> {
    /// One `call_sub_agent` call of the agent of `parent`: checks the route and the depth,
    /// runs the route's sub-agent in a fresh call folder and returns what it did. Never
    /// fails: errors (an unknown route, too deep) land in the record as tool errors, and a
    /// sub-agent that fails is a result saying so.
    /// The sub-agent's turns share the calling turn's budgets (`shares`); a call is not
    /// started when the calling turn's call time is spent, its whole time (its model calls
    /// too, not only its tool calls) is taken from it, and its model calls end when that
    /// time does.
    pub(super) fn sub_agent_call<'s>(
        &'s self,
        parent: &'s Run<'_>,
        call: &'s ToolCall,
        shares: &'s Arc<TurnShares>,
    ) -> futures::future::BoxFuture<'s, ToolCallRecord> {
        Box::pin(async move {
            let started_at = now_rfc3339();
            let t0 = Instant::now();
            let args = parse_arguments(&call.arguments);
            let outcome = match &args {
                Err(e) => Err(e.clone()),
                Ok(_) if shares.call_time.spent_below(MIN_CALL_TIME) => {
                    Err(shares.call_time.spent())
                }
                Ok(a) => {
                    let before = shares.call_time.used();
                    // Its model calls end when the turn's call time does.
                    let deadline = Instant::now() + shares.call_time.left();
                    let outer = shares.sub_agent_deadline();
                    shares
                        .set_sub_agent_deadline(Some(outer.map_or(deadline, |o| o.min(deadline))));
                    let outcome = self.run_call(parent, a, shares).await;
                    shares.set_sub_agent_deadline(outer);
                    // Its tool calls took their time already; the rest (its model calls,
                    // its gates) is taken now.
                    let theirs = shares.call_time.used().saturating_sub(before);
                    let rest = t0.elapsed().saturating_sub(theirs);
                    shares.call_time.settle(std::time::Duration::ZERO, rest);
                    outcome
                }
            };
            tool_record(call, args, outcome, started_at, t0)
        })
    }

    pub(super) async fn run_call(
        &self,
        parent: &Run<'_>,
        args: &Value,
        shares: &Arc<TurnShares>,
    ) -> Result<Value, String> {
        let routes = parent.step.predefined_routes();
        let route_id = args
            .get("route_id")
            .and_then(Value::as_str)
            .ok_or("call_sub_agent needs a string \"route_id\"")?;
        let instructions = args
            .get("instructions")
            .and_then(Value::as_str)
            .ok_or("call_sub_agent needs a string \"instructions\"")?;
        if let Some(extra) = args
            .as_object()
            .and_then(|o| o.keys().find(|k| *k != "route_id" && *k != "instructions"))
        {
            return Err(format!(
                "call_sub_agent takes route_id and instructions only, not {extra:?}"
            ));
        }
        let route = routes
            .iter()
            .find(|r| r.route_id == route_id)
            .ok_or_else(|| {
                format!(
                    "unknown route_id {route_id:?}: the routes of {} are {}",
                    parent.label,
                    routes
                        .iter()
                        .map(|r| format!("{:?}", r.route_id))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
        if parent.depth >= self.max_route_depth {
            return Err(format!(
                "route {route_id:?} refused: sub-agents nest at most {} level(s) deep and {} is \
                 already at depth {}",
                self.max_route_depth, parent.label, parent.depth
            ));
        }
        if self.cancelled() {
            return Err("stop requested".to_string());
        }
        let ws = parent.ws;
        let step: &Step = &route.sub_agent_step;
        // The step's own id: an orphan step a route names keeps its id (and step config).
        let own = match &self.resolver {
            Some(Resolver(resolve)) => resolve(ws, &step.id)
                .map_err(|e| format!("route {route_id:?}: its model: {e:#}"))?,
            None => None,
        };
        let models = own.unwrap_or_else(|| parent.models.clone());
        let home =
            AgentHome::new(&ws.root, &parent.owner_rel, route_id).map_err(|e| format!("{e:#}"))?;
        let call_id = home.next_call(&ws.fs).map_err(|e| format!("{e:#}"))?;
        let output_rel = home.call_rel(&call_id);
        let label = format!("{}/{route_id}", parent.label);
        let folders = AgentFolders {
            output: output_rel.clone(),
            shared: parent.folders.shared.clone().or_else(|| {
                Some(format!(
                    "{}/{}",
                    parent.folders.output,
                    crate::routes::SHARED_DIR
                ))
            }),
            sub_agent: true,
        };
        let configs = ws.agent_configs(&step.id);
        let logs = parent.logs.join(crate::routes::AGENTS_DIR).join(route_id);
        ws.fs
            .create_dir_all(&logs)
            .map_err(|e| format!("creating {}: {e}", logs.display()))?;
        // The route's conversation so far is the host's own copy: `session.json` is in a
        // folder the caller's tools can write, so what is there is never read back.
        let kept = self
            .sub_agent_sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&home.dir)
            .cloned();
        let (session, history, size) = match kept {
            Some(kept) => (kept.session, kept.history, kept.size),
            None => {
                if matches!(ws.fs.kind(home.dir.join(SESSION_FILE)), Ok(Some(_))) {
                    tracing::warn!(
                        "{}/{SESSION_FILE} was not written by this run: the route's \
                         conversation starts afresh",
                        home.rel
                    );
                }
                (
                    Session::new(route_id, &parent.run_folder),
                    Vec::new(),
                    Default::default(),
                )
            }
        };
        let mut run = self.new_run(
            ws,
            step,
            AgentSetup {
                configs,
                run_folder: parent.run_folder.clone(),
                output_dir: ws.root.join(&output_rel),
                folders,
                session_dir: home.dir.clone(),
                owner_rel: home.rel.clone(),
                models,
                logs,
                label: label.clone(),
                depth: parent.depth + 1,
                entry_prefix: format!("{call_id}/"),
                preamble: Some(call_preamble(&call_id, instructions)),
                session,
                history,
            },
        );
        run.caller_shares = Some(shares.clone());
        run.session_size = size;
        // The system prompt names this call's folders: it is replaced on every call, the
        // rest of the conversation is kept.
        let grant = run
            .grant_for(TurnAccess::for_step(&run.configs))
            .map_err(TurnEnd::reason)?;
        let system = unsandboxed_note(system_prompt(&ws.plan, step, &grant), &run.tools);
        // Saved again with the route's session at every call: kept, so counted.
        self.keep("the step's system prompt", system.len())
            .map_err(TurnEnd::reason)?;
        let system = Message::system(system);
        match run.history.first_mut() {
            Some(first) if first.role == trellis_sandbox::llm::Role::System => *first = system,
            _ => run.history.insert(0, system),
        }
        run.session.status = Status::Running;
        // Each call adds to the route's conversation: a checkpoint, not the whole of it again
        // (5,000 calls of one turn rewrote a growing session 20,000 times, 15 GB); the
        // calling step's end writes what checkpoints left out.
        run.checkpoint_session().map_err(|e| format!("{e:#}"))?;
        self.observer.emit(RunEvent::SubAgentStarted {
            step_id: parent.label.clone(),
            route_id: route_id.to_string(),
            call_id: call_id.clone(),
            depth: run.depth,
        });
        // A later call continues the route's conversation with the new instructions alone
        // (then the step's final gate); the first call runs the step's items.
        let continuing = run
            .history
            .iter()
            .any(|m| m.role == trellis_sandbox::llm::Role::User);
        let scripted = matches!(step.kind, StepKind::Regular) && run.configs.is_scripted();
        let result = if scripted {
            run.preamble = None;
            self.run_scripted(&mut run).await
        } else if continuing {
            let item = Item {
                id: FOLLOW_UP_ITEM_ID.to_string(),
                title: None,
                kind: None,
                body: ItemBody::UserMessage {
                    message: run.preamble.take().unwrap_or_default(),
                    write_access: None,
                },
            };
            self.run_items(&mut run, &[item]).await
        } else {
            let items = step.effective_items();
            self.run_items(&mut run, &items).await
        };
        let (status, error) = match result {
            Ok(()) => (Status::Completed, None),
            Err(TurnEnd::Stopped) => (Status::Stopped, Some("stop requested".to_string())),
            Err(TurnEnd::Failed(reason)) => (Status::Failed, Some(reason)),
        };
        run.session.status = status;
        if let Err(e) = run.checkpoint_session() {
            tracing::warn!("{label}: {e:#}");
        }
        self.sub_agent_sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                home.dir.clone(),
                SubAgentSession {
                    session: run.session.clone(),
                    history: run.history.clone(),
                    size: run.session_size.clone(),
                    behind: run.session_behind(),
                },
            );
        self.observer.emit(RunEvent::SubAgentEnded {
            step_id: parent.label.clone(),
            route_id: route_id.to_string(),
            call_id: call_id.clone(),
            status,
        });
        Ok(CallResult {
            route_id: route_id.to_string(),
            call_id,
            status,
            answer: run.final_text,
            error,
            files: files_written(&ws.fs, &ws.root, &run.output_dir),
            output_folder: output_rel,
        }
        .to_value())
    }
}

/// A route's conversation as the host kept it at the end of its last call.
#[derive(Debug, Clone)]
pub(super) struct SubAgentSession {
    session: Session,
    history: Vec<Message>,
    size: super::run::SessionSize,
    /// Its `session.json` lacks part of it: the calling step's end writes it whole.
    behind: bool,
}

impl StepRunner<'_> {
    /// Writes whole the `session.json` of each route whose last call's checkpoint left part
    /// of its conversation out (at the calling step's end).
    pub(super) fn write_route_sessions(&self, fs: &trellis_sandbox::store::WorkspaceFs) {
        let mut kept = self
            .sub_agent_sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (dir, route) in kept.iter_mut().filter(|(_, r)| r.behind) {
            route.session.conversation_history = route
                .history
                .iter()
                .map(|m| serde_json::to_value(m).unwrap_or(serde_json::Value::Null))
                .collect();
            match route.session.write(fs, dir) {
                Ok(()) => route.behind = false,
                Err(e) => tracing::warn!("writing session.json in {}: {e}", dir.display()),
            }
        }
    }
}
