//! Guest-side SDK for Laurel functions.
//!
//! One place generates the guest bindings for the `filter`, `rule`,
//! `strategy` and `transform` worlds of `wit/award.wit` (the `types`
//! interface is generated once and shared). A function implements one plain
//! Rust trait ([`Filter`], [`Rule`], [`Strategy`] or [`Transform`]), per
//! event, user or record, and exports it with [`export_filter!`],
//! [`export_rule!`], [`export_strategy!`] or [`export_transform!`]: the
//! batch calls of the WIT interface are written here once.
//!
//! The traits are ordinary Rust, so the same function compiles natively too
//! (the host's benchmark measures exactly that against the component).
#![warn(missing_docs)]

#[allow(missing_docs, clippy::all)]
pub mod filter {
    wit_bindgen::generate!({
        world: "scoped-filter",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "export_filter_world",
        default_bindings_module: "laurel_guest::filter",
    });
}

#[allow(missing_docs, clippy::all)]
pub mod rule {
    wit_bindgen::generate!({
        world: "rule",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "export_rule_world",
        default_bindings_module: "laurel_guest::rule",
        with: { "laurel:award/types@0.1.0": crate::filter::laurel::award::types },
    });
}

#[allow(missing_docs, clippy::all)]
pub mod strategy {
    wit_bindgen::generate!({
        world: "strategy",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "export_strategy_world",
        default_bindings_module: "laurel_guest::strategy",
        with: { "laurel:award/types@0.1.0": crate::filter::laurel::award::types },
    });
}

#[allow(missing_docs, clippy::all)]
pub mod transform {
    wit_bindgen::generate!({
        world: "scoped-transform",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "export_transform_world",
        default_bindings_module: "laurel_guest::transform",
    });
}

pub use filter::laurel::award::types::{Contribution, Counter, ObjectiveState, Progress};
pub use transform::exports::laurel::award::transforms::Envelope;

/// The raw WIT types of an event batch (the SDK reads them as [`Event`] views).
pub mod wit {
    pub use crate::filter::laurel::award::types::EventBatch;
    pub use crate::transform::exports::laurel::award::transforms::RecordBatch;
}

mod batch;
mod config;
pub mod mapping;
pub mod pointer;
mod records;
pub mod time;

pub use batch::{BatchBuilder, Event, Value, events};
pub use config::parse_config;
pub use records::{Record, RecordBatchBuilder, records};

/// A filter: answers only "does this event fit?".
pub trait Filter: Sized + 'static {
    /// Parses the function's JSON config; the error text is shown to the
    /// operator who wrote it.
    fn from_config(config: &str) -> Result<Self, String>;
    /// The sources this filter can ever match; `None` when any.
    fn sources(&self) -> Option<Vec<String>> {
        None
    }
    /// The event types this filter can ever match; `None` when any. The
    /// pre-filter drops events of a type no objective's filters can match
    /// before any filter runs.
    fn event_types(&self) -> Option<Vec<String>> {
        None
    }
    /// Whether `event` fits.
    fn matches(&self, event: &Event<'_>) -> bool;
}

/// A rule: what an event's content item contributes to the counters.
pub trait Rule: Sized + 'static {
    /// The rule made from its JSON config, or why the config is refused
    /// (the award that names it is refused with this reason).
    fn from_config(config: &str) -> Result<Self, String>;
    /// `Ok(None)`: the rule ignores this event. `Err`: the event is unusable
    /// for this rule (it is dead-lettered with this reason).
    fn contribute(&self, event: &Event<'_>) -> Result<Option<Contribution>, String>;
}

/// A strategy: objective states of one user -> award progress.
pub trait Strategy: Sized + 'static {
    /// The strategy made from its JSON config, or why it is refused.
    fn from_config(config: &str) -> Result<Self, String>;
    /// The objective ids the config refers to.
    fn objectives(&self) -> Vec<String>;
    /// One user's progress from the states of the award's objectives, or
    /// why there is none (the user's award is not computed, and says so).
    fn evaluate(&self, objectives: &[ObjectiveState]) -> Result<Progress, String>;
}

/// A transform: one raw record (of an analytics topic) -> the events it
/// becomes (none, one or more), or why it is malformed.
pub trait Transform: Sized + 'static {
    /// The transform made from its JSON config, or why it is refused.
    fn from_config(config: &str) -> Result<Self, String>;
    /// `Err`: the record is malformed (it is dead-lettered with this
    /// reason). The events' source is the pipeline's.
    fn transform(&self, record: &Record<'_>) -> Result<Vec<Envelope>, String>;

    /// As [`Transform::transform`], where only events whose type `wanted`
    /// accepts need be made: the pre-filter drops the others anyway. A
    /// transform that can find a record's type cheaply overrides it to skip
    /// the rest of the work for records nobody keeps.
    fn transform_wanted(
        &self,
        record: &Record<'_>,
        wanted: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Envelope>, String> {
        let mut events = self.transform(record)?;
        events.retain(|event| wanted(&event.event_type));
        Ok(events)
    }
}

/// Exports a [`Filter`] implementation as a component of the
/// `scoped-filter` world (the `filter` world plus `filter-scope`).
#[macro_export]
macro_rules! export_filter {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::filter::exports::laurel::award::filter_scope as scope;
            use $crate::filter::exports::laurel::award::filters as api;
            pub struct Component;
            pub struct Instance($ty);
            impl api::Guest for Component {
                type Filter = Instance;
            }
            impl scope::Guest for Component {
                fn event_types(config: String) -> Option<Vec<String>> {
                    <$ty as $crate::Filter>::from_config(&config)
                        .ok()
                        .and_then(|f| $crate::Filter::event_types(&f))
                }
            }
            impl api::GuestFilter for Instance {
                fn create(config: String) -> Result<api::Filter, String> {
                    <$ty as $crate::Filter>::from_config(&config)
                        .map(|f| api::Filter::new(Instance(f)))
                }
                fn sources(&self) -> Option<Vec<String>> {
                    $crate::Filter::sources(&self.0)
                }
                fn matches(&self, batch: $crate::wit::EventBatch) -> Vec<bool> {
                    $crate::events(&batch)
                        .map(|e| $crate::Filter::matches(&self.0, &e))
                        .collect()
                }
            }
    $crate::filter::export_filter_world!(Component with_types_in $crate::filter);
        };
    };
}

/// Exports a [`Rule`] implementation as a component of the `rule` world.
#[macro_export]
macro_rules! export_rule {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::rule::exports::laurel::award::rules as api;
            pub struct Component;
            pub struct Instance($ty);
            impl api::Guest for Component {
                type Rule = Instance;
            }
            impl api::GuestRule for Instance {
                fn create(config: String) -> Result<api::Rule, String> {
                    <$ty as $crate::Rule>::from_config(&config).map(|r| api::Rule::new(Instance(r)))
                }
                fn contribute(
                    &self,
                    batch: $crate::wit::EventBatch,
                ) -> Vec<Result<Option<$crate::Contribution>, String>> {
                    $crate::events(&batch)
                        .map(|e| $crate::Rule::contribute(&self.0, &e))
                        .collect()
                }
            }
    $crate::rule::export_rule_world!(Component with_types_in $crate::rule);
        };
    };
}

/// Exports a [`Strategy`] implementation as a component of the `strategy` world.
#[macro_export]
macro_rules! export_strategy {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::strategy::exports::laurel::award::strategies as api;
            pub struct Component;
            pub struct Instance($ty);
            impl api::Guest for Component {
                type Strategy = Instance;
            }
            impl api::GuestStrategy for Instance {
                fn create(config: String) -> Result<api::Strategy, String> {
                    <$ty as $crate::Strategy>::from_config(&config)
                        .map(|s| api::Strategy::new(Instance(s)))
                }
                fn objectives(&self) -> Vec<String> {
                    $crate::Strategy::objectives(&self.0)
                }
                fn evaluate(
                    &self,
                    users: Vec<Vec<$crate::ObjectiveState>>,
                ) -> Vec<Result<$crate::Progress, String>> {
                    users
                        .iter()
                        .map(|u| $crate::Strategy::evaluate(&self.0, u))
                        .collect()
                }
            }
    $crate::strategy::export_strategy_world!(Component with_types_in $crate::strategy);
        };
    };
}

/// Exports a [`Transform`] implementation as a component of the
/// `scoped-transform` world (the `transform` world plus `transform-scope`).
#[macro_export]
macro_rules! export_transform {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::transform::exports::laurel::award::transform_scope as scope;
            use $crate::transform::exports::laurel::award::transforms as api;
            pub struct Component;
            pub struct Instance($ty);
            impl api::Guest for Component {
                type Transform = Instance;
            }
            impl scope::Guest for Component {
                fn apply_for_types(
                    transform: api::TransformBorrow<'_>,
                    batch: $crate::wit::RecordBatch,
                    types: Option<Vec<String>>,
                ) -> Vec<scope::Answer> {
                    let this: &Instance = transform.get();
                    // Only the records that made events or are malformed
                    // are answered for.
                    let answer =
                        |(index, events): (usize, Result<Vec<$crate::Envelope>, String>)| {
                            let made_none = matches!(&events, Ok(made) if made.is_empty());
                            (!made_none).then(|| scope::Answer {
                                index: index as u32,
                                events,
                            })
                        };
                    match types {
                        None => $crate::records(&batch)
                            .map(|r| $crate::Transform::transform(&this.0, &r))
                            .enumerate()
                            .filter_map(answer)
                            .collect(),
                        Some(types) => {
                            let wanted = |t: &str| types.iter().any(|w| w == t);
                            $crate::records(&batch)
                                .map(|r| $crate::Transform::transform_wanted(&this.0, &r, &wanted))
                                .enumerate()
                                .filter_map(answer)
                                .collect()
                        }
                    }
                }
            }
            impl api::GuestTransform for Instance {
                fn create(config: String) -> Result<api::Transform, String> {
                    <$ty as $crate::Transform>::from_config(&config)
                        .map(|t| api::Transform::new(Instance(t)))
                }
                fn apply(
                    &self,
                    batch: $crate::wit::RecordBatch,
                ) -> Vec<Result<Vec<$crate::Envelope>, String>> {
                    $crate::records(&batch)
                        .map(|r| $crate::Transform::transform(&self.0, &r))
                        .collect()
                }
            }
    $crate::transform::export_transform_world!(Component with_types_in $crate::transform);
        };
    };
}

impl Contribution {
    /// A contribution of absolute counter values for a content item.
    pub fn absolute(counters: impl IntoIterator<Item = (String, i64)>) -> Self {
        Contribution {
            counters: counters
                .into_iter()
                .map(|(name, value)| Counter { name, value })
                .collect(),
            dedup_key: None,
            additive: false,
        }
    }

    /// A contribution that adds to the counters (analytics events).
    pub fn additive(counters: impl IntoIterator<Item = (String, i64)>) -> Self {
        Contribution {
            additive: true,
            ..Self::absolute(counters)
        }
    }

    /// The same contribution, counted once among the user's items that
    /// share `key` (two reviews of one place count once).
    pub fn with_dedup_key(self, key: impl Into<String>) -> Self {
        Contribution {
            dedup_key: Some(key.into()),
            ..self
        }
    }
}

/// Which content statuses count as "present" for rules that count content
/// items; `["active"]` unless the config says otherwise.
pub fn default_counted_statuses() -> Vec<String> {
    vec!["active".to_string()]
}

/// For a content item: whether its current status is one of `statuses` (an
/// item without a status model always counts). `None` for events that are
/// not about a content item (analytics).
pub fn content_counts(event: &Event<'_>, statuses: &[String]) -> Option<bool> {
    event.content_id?;
    Some(
        event
            .status
            .is_none_or(|status| statuses.iter().any(|s| s == status)),
    )
}

/// The README's Rust examples, compiled (and run) as doc tests, so they
/// cannot drift from the SDK.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;
