//! The one place that generates host bindings from `wit/`. The `types`
//! interface is generated once (with the filter world) and shared.

pub mod filter {
    wasmtime::component::bindgen!({
        world: "filter",
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
        world: "transform",
        path: "../wit",
    });
}

pub use filter::laurel::award::types;
pub use filter::laurel::award::types::{Contribution, Counter, ObjectiveState, Progress};

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
