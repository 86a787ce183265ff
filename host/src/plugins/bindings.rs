//! Host-side bindings generated from `wit/` (the single source of truth).
//!
//! Each world gets its own module; the shared `host` and `types` interfaces are
//! generated once, in the tool world, and reused by the others.

/// World `tool-plugin`.
pub mod tool {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "tool-plugin",
        exports: { default: async },
    });
}

/// World `validator-plugin`.
pub mod validator {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "validator-plugin",
        exports: { default: async },
        with: {
            "trellis:plugin/host": super::tool::trellis::plugin::host,
            "trellis:plugin/types": super::tool::trellis::plugin::types,
        },
    });
}
