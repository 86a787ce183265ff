//! The registry's validator plugins as the gate's [`CustomValidator`].

use std::path::Path;

use trellis_sandbox::Limits;
use trellis_sandbox::plugins::{PluginKind, PluginRegistry};

use super::{CustomValidator, ValidateFuture};

/// The registry's validator plugins as the gate's [`CustomValidator`]: a file rule
/// whose `validation_type` is `csv` goes to the validator plugin with id `csv`.
#[derive(Debug)]
pub struct PluginValidators<'a> {
    registry: &'a PluginRegistry,
    limits: Limits,
}

impl<'a> PluginValidators<'a> {
    /// Validators of `registry`, each call bounded by `limits`.
    pub fn new(registry: &'a PluginRegistry, limits: Limits) -> Self {
        PluginValidators { registry, limits }
    }
}

impl CustomValidator for PluginValidators<'_> {
    fn supports(&self, validation_type: &str) -> bool {
        self.registry
            .get(validation_type)
            .is_some_and(|p| p.manifest().kind == PluginKind::Validator)
    }

    fn validate<'a>(
        &'a self,
        validation_type: &'a str,
        file: &'a Path,
        rule: &'a serde_json::Value,
    ) -> ValidateFuture<'a> {
        Box::pin(self.registry.validate_file(
            validation_type,
            validation_type,
            file,
            rule,
            &self.limits,
        ))
    }
}
