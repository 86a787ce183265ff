//! The `validator-plugin` world: custom checks of a step's output files.
//!
//! A file rule in a `validation_schema` whose `validation_type` names the plugin
//! is sent to [`ValidatorPlugin::validate`]. The plugin sees the step output folder
//! read-only and nothing else.
//!
//! ```rust,ignore
//! use trellis_plugin_sdk::{export_validator_plugin, validator::{Check, Report, Request, ValidatorPlugin}};
//!
//! struct NotEmpty;
//!
//! impl ValidatorPlugin for NotEmpty {
//!     fn validate(request: Request) -> Result<Report, String> {
//!         let text = std::fs::read_to_string(&request.file).map_err(|e| e.to_string())?;
//!         let check = Check::new(&request.file, "not_empty", !text.trim().is_empty())
//!             .expected("some text")
//!             .actual(format!("{} bytes", text.len()))
//!             .message("write the step's findings into the file");
//!         Ok(Report::from_checks(vec![check]))
//!     }
//! }
//!
//! export_validator_plugin!(NotEmpty);
//! ```

use std::fmt;
use std::marker::PhantomData;

use serde_json::Value;

use crate::bindings::validator_world::exports::trellis::plugin::validator::{
    Guest, ValidateRequest,
};

pub use crate::bindings::validator_world::exports::trellis::plugin::validator::{Check, Report};

/// What to check, with the rule already parsed.
#[derive(Debug, Clone)]
pub struct Request {
    /// The `validation_type` of the rule, e.g. `csv`.
    pub validation_type: String,
    /// The file to check, as a path inside the guest's preopened folders; open it
    /// with `std::fs` as is.
    pub file: String,
    /// The whole file rule from the schema, so the plugin can read its own options.
    pub rule: Value,
}

/// A validator plugin. `validate` is an associated function because every
/// validation runs in a fresh instance.
pub trait ValidatorPlugin {
    /// Runs every check on one file. Return `Err` only when the rule itself cannot
    /// be applied (for example a malformed option); that fails the gate with the
    /// message. Failed checks belong in the [`Report`].
    fn validate(request: Request) -> Result<Report, String>;
}

impl Check {
    /// A check of `kind` (a short name such as `header`) on `file` with its
    /// outcome; the other fields start empty.
    pub fn new(file: impl Into<String>, kind: impl Into<String>, passed: bool) -> Self {
        Check {
            file: file.into(),
            path: String::new(),
            kind: kind.into(),
            passed,
            expected: String::new(),
            actual: String::new(),
            message: String::new(),
        }
    }

    /// Where in the file: a column, a row, a JSON path.
    pub fn at(mut self, path: impl Into<String>) -> Self {
        self.path = path.into();
        self
    }

    /// What was expected, for a person to read.
    pub fn expected(mut self, expected: impl Into<String>) -> Self {
        self.expected = expected.into();
        self
    }

    /// What was found.
    pub fn actual(mut self, actual: impl Into<String>) -> Self {
        self.actual = actual.into();
        self
    }

    /// A sentence the agent can act on when the check failed.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }
}

impl Report {
    /// A report of `checks` in the order they ran, with no warnings.
    pub fn from_checks(checks: Vec<Check>) -> Self {
        Report {
            checks,
            warnings: Vec::new(),
        }
    }

    /// Adds a problem with the rule itself that does not fail the gate.
    pub fn warn(mut self, warning: impl Into<String>) -> Self {
        self.warnings.push(warning.into());
        self
    }
}

/// Bridges a [`ValidatorPlugin`] to the generated `Guest` trait; named by
/// [`export_validator_plugin!`](crate::export_validator_plugin) only.
#[doc(hidden)]
pub struct Adapter<P>(PhantomData<P>);

impl<P> fmt::Debug for Adapter<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Adapter")
    }
}

impl<P: ValidatorPlugin> Guest for Adapter<P> {
    fn validate(request: ValidateRequest) -> Result<Report, String> {
        let rule = serde_json::from_str(&request.rule)
            .map_err(|e| format!("the rule for `{}` is not valid JSON: {e}", request.file))?;
        P::validate(Request {
            validation_type: request.validation_type,
            file: request.file,
            rule,
        })
    }
}

/// Exports a [`ValidatorPlugin`] as the plugin's `validator` interface. Use it
/// once, at the top level of a `cdylib` crate.
///
/// ```rust,ignore
/// trellis_plugin_sdk::export_validator_plugin!(NotEmpty);
/// ```
#[macro_export]
macro_rules! export_validator_plugin {
    ($plugin:ty) => {
        // The generated export macro takes an identifier, not a generic type.
        #[doc(hidden)]
        type __TrellisValidatorPluginExport = $crate::validator::Adapter<$plugin>;
        $crate::bindings::validator_world::__export_validator_world!(
            __TrellisValidatorPluginExport with_types_in $crate::bindings::validator_world
        );
    };
}
