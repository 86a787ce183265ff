//! What an MCP client sends `trellis mcp serve` over stdio: the fuzzed bytes are the client's
//! side of the pipe (newline-delimited JSON-RPC), read by the server's dispatcher until the
//! client closes it. The server must end when its input ends, within a bound (no hang), and
//! every line it answers must be one JSON-RPC message.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trellis_mcp::serve::ToolServer;
use trellis_sandbox::{CacheSetting, Engine, Grant, Limits, PluginRegistry};

/// How long the server may take to answer everything and end once its input closed.
const BOUND: Duration = Duration::from_secs(5);

fn server() -> &'static ToolServer {
    static SERVER: OnceLock<ToolServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let engine = Engine::new(CacheSetting::Disabled).unwrap();
        let registry = Arc::new(PluginRegistry::empty(&engine).unwrap());
        ToolServer::new(registry, Grant::none(), Limits::default(), &[]).unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let input = data.to_vec();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let output = runtime.block_on(async move {
        let (client, server_end) = tokio::io::duplex(64 << 10);
        let (server_reader, server_writer) = tokio::io::split(server_end);
        let serving = tokio::spawn(server().clone().serve_pipes(server_reader, server_writer));
        let (mut client_reader, mut client_writer) = tokio::io::split(client);
        let writing = tokio::spawn(async move {
            let _ = client_writer.write_all(&input).await;
            let _ = client_writer.shutdown().await;
            // Kept open for writing until the server ends, as a client that sent all it had.
            client_writer
        });
        let mut output = Vec::new();
        let read = tokio::time::timeout(BOUND, client_reader.read_to_end(&mut output)).await;
        assert!(
            read.is_ok(),
            "the server did not end within {BOUND:?} of its input's end"
        );
        let _ = tokio::time::timeout(BOUND, serving)
            .await
            .expect("the server hung");
        drop(writing.await);
        output
    });
    for line in output.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let message: serde_json::Value = serde_json::from_slice(line).unwrap_or_else(|e| {
            panic!(
                "the server wrote a line that is not JSON ({e}): {:?}",
                String::from_utf8_lossy(line)
            )
        });
        assert_eq!(
            message["jsonrpc"], "2.0",
            "not a JSON-RPC message: {message}"
        );
    }
});
