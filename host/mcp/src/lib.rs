//! Trellis and the Model Context Protocol: the tool plugins of a registry served to MCP
//! clients over stdio and streamable HTTP (`trellis mcp serve`, [`serve`]), a front end
//! beside the CLI and the builder.

pub mod client;
pub mod serve;
