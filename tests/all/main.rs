//! The integration tests: one binary (linking wasmtime once), a module per area. Each
//! drives the real thing: guest components built from source, real SQLite files, the
//! `trellis` binary, and HTTP servers the tests start on 127.0.0.1.

mod support;

mod agent_db_tools;
mod anthropic_provider;
mod builder_cli;
mod builder_compat;
mod builder_edits;
mod builder_executions;
mod builder_reads;
mod cli;
mod compat_access;
mod compat_load;
mod compat_plans;
mod db_fences;
mod db_links;
mod docs_citations;
mod docs_examples;
mod fs_races;
mod golden_prompts;
mod host_files;
mod kill_loop;
mod llm_providers;
mod load;
mod mcp_serve;
mod mcp_servers;
mod plugin_authoring;
mod plugin_loading;
mod preflight;
mod provider_faults;
mod provider_fences;
mod redteam_budgets;
mod redteam_builder;
mod redteam_db;
mod redteam_fastpath;
mod redteam_host;
mod redteam_mcp;
mod redteam_net;
mod redteam_round3;
mod routes;
mod run_cli;
mod runtime;
mod sandbox;
mod scenarios;
mod script_net;
mod scripted_steps;
mod scripts;
mod sequence_driver;
mod turn_budgets;
mod turn_grants;
mod validators;
mod workflow_cli;
mod workspace_lock;
mod workspace_tools;
