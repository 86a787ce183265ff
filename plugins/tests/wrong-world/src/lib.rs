//! A valid component of the `validator-plugin` world. Host tests load it where a
//! tool plugin is expected and assert that the error names the wrong world
//! instead of failing somewhere deeper.

use trellis_plugin_sdk::export_validator_plugin;
use trellis_plugin_sdk::validator::{Check, Report, Request, ValidatorPlugin};

struct AlwaysPasses;

impl ValidatorPlugin for AlwaysPasses {
    fn validate(request: Request) -> Result<Report, String> {
        let check = Check::new(request.file, request.validation_type, true)
            .expected("anything")
            .actual("something");
        Ok(Report::from_checks(vec![check]))
    }
}

export_validator_plugin!(AlwaysPasses);
