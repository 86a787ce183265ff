//! The sessions of the HTTP transport: rmcp's session manager with a cap on live sessions,
//! and the cap on requests without a session in progress (rmcp serves a request that names
//! its protocol version itself with an instance of its own, which no session counts).

use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};

use super::http::{Response, plain_owned};

/// The header naming a request's MCP session.
pub(super) const SESSION_HEADER: &str = "mcp-session-id";

/// Whether `body` is an `initialize` request, which opens a session (and meets the session
/// cap) rather than being served on its own.
pub(super) fn opens_session(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Method<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_slice::<Method<'_>>(body)
        .is_ok_and(|m| m.method.as_deref() == Some("initialize"))
}

/// The answer to a request without a session past the cap on those in progress.
pub(super) fn sessionless_full(max: usize) -> Response {
    let mut response = plain_owned(
        hyper::StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "service unavailable: {max} requests without an MCP session are in progress, the \
             limit (`trellis mcp serve --max-sessions`, which caps them apart from the \
             sessions); wait for one to end, or open a session (`initialize`)"
        ),
    );
    response.headers_mut().insert(
        hyper::header::RETRY_AFTER,
        hyper::header::HeaderValue::from_static("1"),
    );
    response
}

tokio::task_local! {
    /// Set, within one request, when it was refused a new session for the cap.
    pub(super) static SESSION_REFUSED: std::cell::Cell<bool>;
}

/// rmcp's session manager with a cap on live sessions.
pub(super) struct CappedSessions {
    pub(super) inner: LocalSessionManager,
    pub(super) max: usize,
    /// Held while a session is counted and made, so two at once cannot pass the cap.
    pub(super) creating: tokio::sync::Mutex<()>,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum SessionsError {
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
    #[error("{}", sessions_full(*.0))]
    Full(usize),
}

pub(super) fn sessions_full(max: usize) -> String {
    format!(
        "service unavailable: {max} MCP sessions are open, the limit \
         (`trellis mcp serve --max-sessions`); close one (HTTP DELETE) or wait until one \
         idles out (5 minutes)"
    )
}

impl CappedSessions {
    async fn live(&self) -> usize {
        self.inner.sessions.read().await.len()
    }
}

impl SessionManager for CappedSessions {
    type Error = SessionsError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let _one_at_a_time = self.creating.lock().await;
        if self.live().await >= self.max {
            // rmcp would answer 500 with this error: the handler answers 503 instead.
            let _ = SESSION_REFUSED.try_with(|refused| refused.set(true));
            return Err(SessionsError::Full(self.max));
        }
        Ok(self.inner.create_session().await?)
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: rmcp::model::ClientJsonRpcMessage,
    ) -> Result<rmcp::model::ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: rmcp::model::ClientJsonRpcMessage,
    ) -> Result<impl futures::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>
    {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: rmcp::model::ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl futures::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>
    {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl futures::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>
    {
        Ok(self.inner.resume(id, last_event_id).await?)
    }
}
