//! A step script's network: its hosts, the operator's secrets it may name by placeholder,
//! and the bounds of its requests.

use super::*;

/// The placeholder a script sees in `SECRET_<NAME>` for the operator's secret in that
/// variable.
pub fn secret_placeholder(var: &str) -> String {
    format!("{PLACEHOLDER_PREFIX}{var}")
}

/// What every secret's placeholder starts with; the variable's name follows it.
pub(super) const PLACEHOLDER_PREFIX: &str = "trellis-secret:";

/// What a step script may reach over `wasi:http`.
#[derive(Debug, Clone)]
pub struct ScriptNet {
    /// The step's `allowed_hosts`.
    pub hosts: Vec<HostRule>,
    /// The operator's approvals: which origins receive which secret, which hosts may be
    /// loopback or private.
    pub approvals: std::sync::Arc<crate::llm::KeyApprovals>,
    /// The operator's secrets: variable name (`SECRET_<NAME>`) and value.
    pub secrets: Vec<(String, Secret)>,
}

impl ScriptNet {
    /// The secrets' values, to be hidden wherever the script could echo what an approved
    /// server sent back (its stdout, stderr and log lines).
    pub fn secret_values(&self) -> Vec<String> {
        self.secrets
            .iter()
            .filter_map(|(_, secret)| secret.value())
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .collect()
    }
}

/// Outgoing requests of one step script, at once, in all and per body.
pub(crate) const SCRIPT_REQUEST_LIMITS: RequestLimits = RequestLimits {
    live: 4,
    total: 1000,
    body_bytes: 32 << 20,
};

/// Largest response body a script may read, in bytes.
pub(crate) const SCRIPT_RESPONSE_BYTES: u64 = 32 << 20;
