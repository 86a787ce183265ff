//! What an external MCP server (one Trellis starts for a run's steps) sends back: the fuzzed
//! bytes are the server's side of a stdio pipe, read by Trellis's client as it initializes
//! the session, lists the tools and calls each with `{}`. Every step must end within a bound
//! (no hang), and a result must respect the size limit it was called with.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trellis_mcp::client::McpServers;

/// How long each step may take once the server's output has ended.
const BOUND: Duration = Duration::from_secs(5);
/// The result size limit the calls are made with.
const MAX_RESULT: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let answers = data.to_vec();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let (client_end, server) = tokio::io::duplex(64 << 10);
        let (client_reader, client_writer) = tokio::io::split(client_end);
        let (mut server_reader, mut server_writer) = tokio::io::split(server);
        tokio::spawn(async move {
            let _ = server_writer.write_all(&answers).await;
            let _ = server_writer.shutdown().await;
        });
        // What the client sends is read and dropped, so its writes never block.
        tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = server_reader.read_to_end(&mut sink).await;
        });
        let started = tokio::time::timeout(
            BOUND,
            McpServers::over_pipes("fuzz", client_reader, client_writer),
        )
        .await
        .expect("starting did not end within the bound");
        let Ok(mut servers) = started else {
            return;
        };
        let names: Vec<String> = servers.tools().map(|(_, t)| t.full_name.clone()).collect();
        let _ = servers.definitions(|_, _| true);
        for name in names {
            let called = tokio::time::timeout(
                BOUND,
                servers.call(&name, serde_json::json!({}), MAX_RESULT),
            )
            .await
            .expect("a call did not end within the bound");
            if let Ok(serde_json::Value::String(text)) = &called {
                assert!(
                    text.len() <= MAX_RESULT,
                    "a result of {} bytes passed",
                    text.len()
                );
            }
        }
        // Stopping gives a server 5 s to end its session before it is dropped.
        tokio::time::timeout(2 * BOUND, servers.stop())
            .await
            .expect("stopping did not end within the bound");
    });
});
