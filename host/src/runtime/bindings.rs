//! The one place that generates host bindings from `wit/`. The `types`
//! interface is generated once (with the filter world) and shared.
//!
//! Filters and transforms are bound through their scoped worlds, whose
//! extra export is optional: a component built for the plain world (as
//! before the scope existed) has only the required one. Each export is
//! found by its own interface's indices ([`Scoped`]).

use wasmtime::component::InstancePre;

pub mod filter {
    wasmtime::component::bindgen!({
        world: "scoped-filter",
        path: "../wit",
        additional_derives: [PartialEq],
    });
}

pub mod rule {
    wasmtime::component::bindgen!({
        world: "rule",
        path: "../wit",
        with: { "laurel:award/types": crate::runtime::bindings::filter::laurel::award::types },
    });
}

pub mod strategy {
    wasmtime::component::bindgen!({
        world: "strategy",
        path: "../wit",
        with: { "laurel:award/types": crate::runtime::bindings::filter::laurel::award::types },
    });
}

pub mod transform {
    wasmtime::component::bindgen!({
        world: "scoped-transform",
        path: "../wit",
    });
}

pub use filter::exports::laurel::award::{filter_scope, filters};
pub use filter::laurel::award::types;
pub use filter::laurel::award::types::{Contribution, Counter, ObjectiveState, Progress};
pub use transform::exports::laurel::award::{transform_scope, transforms};

/// Export names by which a component's kind is recognised.
pub const FILTER_EXPORT: &str = "laurel:award/filters@0.1.0";
/// Optional beside [`FILTER_EXPORT`]: the event types a filter can match.
pub const FILTER_SCOPE_EXPORT: &str = "laurel:award/filter-scope@0.1.0";
pub const RULE_EXPORT: &str = "laurel:award/rules@0.1.0";
pub const STRATEGY_EXPORT: &str = "laurel:award/strategies@0.1.0";
pub const TRANSFORM_EXPORT: &str = "laurel:award/transforms@0.1.0";
/// Optional beside [`TRANSFORM_EXPORT`]: apply told the types kept.
pub const TRANSFORM_SCOPE_EXPORT: &str = "laurel:award/transform-scope@0.1.0";
pub const TYPES_IMPORT: &str = "laurel:award/types@0.1.0";

/// A component of a world with an optional export, linked: the required
/// interface's export indices, and the optional one's if it has it.
pub struct Scoped<Required, Optional, T: 'static> {
    pub pre: InstancePre<T>,
    pub required: Required,
    pub optional: Option<Optional>,
}

impl<Required, Optional, T: 'static> Scoped<Required, Optional, T> {
    /// Looks both up: the optional interface, named `optional_name`, is
    /// left out when the component does not export it, and must be
    /// complete when it does.
    pub fn new(
        pre: InstancePre<T>,
        required: impl FnOnce(&InstancePre<T>) -> wasmtime::Result<Required>,
        optional_name: &str,
        optional: impl FnOnce(&InstancePre<T>) -> wasmtime::Result<Optional>,
    ) -> wasmtime::Result<Self> {
        let required = required(&pre)?;
        let optional = match pre.component().get_export_index(None, optional_name) {
            Some(_) => Some(optional(&pre)?),
            None => None,
        };
        Ok(Scoped {
            pre,
            required,
            optional,
        })
    }
}
