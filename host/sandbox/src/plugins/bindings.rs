//! Host-side bindings generated from `wit/trellis-plugin@0.1.0/` (the single source of truth).
//!
//! Each world gets its own module; the shared `host` and `types` interfaces are
//! generated once, in the tool world, and reused by the others.

/// World `tool-plugin`.
pub mod tool {
    wasmtime::component::bindgen!({
        path: "../../wit/trellis-plugin@0.1.0",
        world: "tool-plugin",
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
