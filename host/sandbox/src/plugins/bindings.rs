//! Host-side bindings generated from `wit/trellis-plugin@<version>/` (the single source of
//! truth).
//!
//! Each world gets its own module; the shared `host` and `types` interfaces of 0.1.0 are
//! generated once, in the tool world, and reused by the other 0.1.0 worlds. The 0.2.0 script
//! world and the 0.3.0 provider world have their own.

/// World `tool-plugin`.
pub mod tool {
    wasmtime::component::bindgen!({
        path: "../../wit/trellis-plugin@0.1.0",
        world: "tool-plugin",
        imports: {
            "trellis:plugin/workflow-db.query": async,
            "trellis:plugin/workflow-db.execute": async,
        },
        exports: { default: async },
    });
}

/// World `validator-plugin`.
pub mod validator {
    wasmtime::component::bindgen!({
        path: "../../wit/trellis-plugin@0.1.0",
        world: "validator-plugin",
        exports: { default: async },
        with: {
            "trellis:plugin/host": super::tool::trellis::plugin::host,
            "trellis:plugin/types": super::tool::trellis::plugin::types,
        },
    });
}

/// World `llm-provider`. `wasi:http` and `wasi:io` come from wasmtime's own
/// bindings, so the linker can take their implementations as they are.
pub mod llm {
    wasmtime::component::bindgen!({
        path: "../../wit/trellis-plugin@0.1.0",
        world: "llm-provider",
        exports: { default: async },
        with: {
            "trellis:plugin/host": super::tool::trellis::plugin::host,
            "trellis:plugin/types": super::tool::trellis::plugin::types,
            "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            "wasi:io": wasmtime_wasi::p2::bindings::io,
            "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
        },
    });
}

/// World `llm-provider` of `wit/trellis-plugin@0.3.0/`: the provider that may report its
/// reply as it reads it (`trellis:plugin/reply`). Its `host`, `types` and `reply` are
/// generated here at 0.3.0; WASI comes from wasmtime's own bindings.
pub mod llm3 {
    wasmtime::component::bindgen!({
        path: "../../wit/trellis-plugin@0.3.0",
        world: "llm-provider",
        exports: { default: async },
        with: {
            "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            "wasi:io": wasmtime_wasi::p2::bindings::io,
            "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
        },
    });
}

/// World `script-runner` of `wit/trellis-plugin@0.2.0/`: the Python script runner's world,
/// which adds `wasi:http` and `workflow-db.run`. Only its `trellis:plugin` interfaces are
/// generated here (at 0.2.0, beside the 0.1.0 ones of the worlds above); WASI comes from
/// wasmtime's own bindings.
pub mod script {
    wasmtime::component::bindgen!({
        path: "../../wit/trellis-plugin@0.2.0",
        world: "script-runner",
        require_store_data_send: true,
        imports: {
            "trellis:plugin/workflow-db.query": async,
            "trellis:plugin/workflow-db.execute": async,
            "trellis:plugin/workflow-db.run": async,
        },
        with: {
            "wasi": wasmtime_wasi::p2::bindings,
            "wasi:http": wasmtime_wasi_http::p2::bindings::http,
        },
    });
}

/// World `shell-tool` of `wit/trellis-shell@0.1.0/`: the bundled shell, a tool plugin that
/// also imports `trellis:shell/commands`. Only `commands` is generated here (its `run`
/// async: it runs another instance); the tool world's interfaces are the ones above.
pub mod shell {
    wasmtime::component::bindgen!({
        path: "../../wit/trellis-shell@0.1.0",
        world: "shell-tool",
        imports: { "trellis:shell/commands.run": async },
        with: {
            "trellis:plugin/host": super::tool::trellis::plugin::host,
            "trellis:plugin/types": super::tool::trellis::plugin::types,
            "trellis:plugin/workflow-db": super::tool::trellis::plugin::workflow_db,
            "trellis:plugin/tool": super::tool::exports::trellis::plugin::tool,
        },
    });
}
