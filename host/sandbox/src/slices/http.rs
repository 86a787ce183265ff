//! The http slice: `wasi:http/outgoing-handler` and its types, gated per call by an
//! [`HttpPolicy`] (which origin, which credentials, how long); a call given no policy is
//! refused every request.

use wasmtime::component::Linker;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::llm::http::HttpPolicy;
use crate::state::CallState;

/// Links `wasi:http`, once.
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>) -> anyhow::Result<()> {
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
    Ok(())
}

/// The HTTP context of one call.
pub(crate) struct HttpState {
    ctx: WasiHttpCtx,
    policy: HttpPolicy,
}

impl HttpState {
    /// Requests as `policy` allows; none at all without one.
    pub(crate) fn new(policy: Option<HttpPolicy>) -> Self {
        HttpState {
            ctx: WasiHttpCtx::new(),
            policy: policy.unwrap_or_else(HttpPolicy::deny_all),
        }
    }
}

impl WasiHttpView for CallState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http.ctx,
            table: &mut self.table,
            hooks: &mut self.http.policy,
        }
    }
}
