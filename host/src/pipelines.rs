//! Pipeline definitions for the pre-filter: parsing, checking against the
//! registry (the transform exists, is a transform and accepts its config),
//! and applying them all or nothing.
//!
//! ```json
//! {"name": "navigator", "input_topic": "raw.navigator", "source": "bss",
//!  "transform": {"name": "KeyValueTransform", "config": {"fields": {..}}}}
//! ```

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::registry::Registry;
use crate::store::{Store, StoreError};

/// One pipeline: which raw topic, which transform, which source's events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineDefinition {
    pub name: String,
    pub input_topic: String,
    /// The source its events belong to (registered if new): they go to its
    /// topic, `events.<source>`.
    pub source: String,
    pub transform: TransformUse,
}

/// A transform function by name, with its config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformUse {
    pub name: String,
    #[serde(default = "empty_object")]
    pub config: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// One thing wrong with a pipeline definition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pipeline {pipeline}: {reason}")]
pub struct PipelineProblem {
    pub pipeline: String,
    pub reason: String,
}

/// Every problem found in a set of pipeline definitions.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct InvalidPipelines(pub Vec<PipelineProblem>);

#[derive(Debug, thiserror::Error)]
pub enum PipelineApplyError {
    #[error(transparent)]
    Invalid(#[from] InvalidPipelines),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn problem(pipeline: &str, reason: impl Into<String>) -> PipelineProblem {
    PipelineProblem {
        pipeline: pipeline.to_string(),
        reason: reason.into(),
    }
}

/// Parses one definition or an array of them.
pub fn parse(text: &str) -> Result<Vec<PipelineDefinition>, InvalidPipelines> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| InvalidPipelines(vec![problem("?", format!("not valid JSON: {e}"))]))?;
    let items = match value {
        Value::Array(items) => items,
        single => vec![single],
    };
    let mut definitions = Vec::new();
    let mut problems = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let name = item
            .get("name")
            .and_then(Value::as_str)
            .map_or_else(|| format!("#{}", i + 1), str::to_string);
        match serde_json::from_value(crate::definitions::without_schema(item)) {
            Ok(definition) => definitions.push(definition),
            Err(e) => problems.push(problem(&name, format!("invalid definition: {e}"))),
        }
    }
    if problems.is_empty() {
        Ok(definitions)
    } else {
        Err(InvalidPipelines(problems))
    }
}

/// A name as the database keeps names of awards, sources and pipelines.
fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// A Kafka topic name: 1 to 249 of letters, digits, `.`, `_`, `-`.
fn is_topic(topic: &str) -> bool {
    !topic.is_empty()
        && topic.len() <= 249
        && topic != "."
        && topic != ".."
        && topic
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Every problem of `definitions` at once: names, topics, duplicates, and
/// each transform bound with its config as the pre-filter would.
pub fn validate(
    definitions: &[PipelineDefinition],
    registry: &Arc<Registry>,
) -> Result<(), InvalidPipelines> {
    let mut problems = Vec::new();
    for (i, d) in definitions.iter().enumerate() {
        let name = d.name.as_str();
        if !is_name(name) {
            problems.push(problem(
                name,
                "the name must be 1 to 128 letters, digits, `_`, `.`, `-`, starting with a letter or digit",
            ));
        }
        if definitions[..i].iter().any(|other| other.name == d.name) {
            problems.push(problem(name, "defined twice"));
        }
        if !is_topic(&d.input_topic) {
            problems.push(problem(
                name,
                format!(
                    "input_topic {:?} is not a Kafka topic name (1 to 249 letters, digits, `.`, `_`, `-`)",
                    d.input_topic
                ),
            ));
        } else if d.input_topic.starts_with("events.") || d.input_topic.ends_with(".dead") {
            problems.push(problem(
                name,
                format!(
                    "input_topic {:?} is one Laurel writes (events.* or *.dead): a pipeline reads a raw topic",
                    d.input_topic
                ),
            ));
        }
        if !is_name(&d.source) {
            problems.push(problem(
                name,
                format!("source {:?} is not a source name", d.source),
            ));
        }
        if !d.transform.config.is_object() {
            problems.push(problem(name, "transform.config must be a JSON object"));
            continue;
        }
        if let Err(error) =
            registry.bind_transform(&d.transform.name, &d.transform.config.to_string())
        {
            problems.push(problem(
                name,
                format!("transform {}: {error}", d.transform.name),
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(InvalidPipelines(problems))
    }
}

/// Parses, checks and stores the pipelines in `text`, all or nothing;
/// returns each one's new version.
pub async fn apply(
    store: &mut Store,
    registry: &Arc<Registry>,
    text: &str,
) -> Result<Vec<(String, i32)>, PipelineApplyError> {
    let definitions = parse(text)?;
    if let Err(error) = registry.sync_now(store).await {
        tracing::warn!(message = "Failed to read the registered functions before a check.", %error);
    }
    let checked = {
        let (registry, definitions) = (registry.clone(), definitions.clone());
        // Binding instantiates components: CPU work, off the async workers.
        tokio::task::spawn_blocking(move || validate(&definitions, &registry)).await
    };
    match checked {
        Ok(result) => result?,
        Err(join) => {
            return Err(InvalidPipelines(vec![problem(
                "?",
                format!("checking the definitions failed: {join}"),
            )])
            .into());
        }
    }
    let rows: Vec<_> = definitions
        .into_iter()
        .map(|d| {
            (
                d.name,
                d.input_topic,
                d.source,
                d.transform.name,
                d.transform.config,
            )
        })
        .collect();
    Ok(store.apply_pipelines(&rows).await?)
}
