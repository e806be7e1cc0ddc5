//! Award definitions: the contract's JSON, checked against the registry.
//!
//! A definition is accepted only if every filter, rule and strategy name
//! resolves to a registered function of the right kind that accepts its
//! config, and the strategy refers to exactly the award's objectives.
//! Applying a file is all or nothing.

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::registry::{Binding, Registry};
use crate::runtime::FilterInstance;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AwardDefinition {
    pub id: String,
    pub title: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub revocation: Revocation,
    #[serde(default = "enabled")]
    pub enabled: bool,
    pub objectives: Vec<ObjectiveDefinition>,
    pub strategy: Value,
    #[serde(default = "tree_strategy")]
    pub strategy_function: String,
    /// `"history"`: applied new or changed, the award also credits what
    /// users did before (`crate::backfill`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill: Option<BackfillFrom>,
    /// Whether anyone may see a user's progress on this award as a public
    /// badge (HTTP functions' `public-badge`; users may opt out).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub public_badge: bool,
}

/// What an award credits when it is applied, besides the events after it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackfillFrom {
    /// The content items Laurel stores, each with its last applied event.
    History,
}

fn enabled() -> bool {
    true
}

fn tree_strategy() -> String {
    "TreeStrategy".to_string()
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Revocation {
    /// Progress below the goal un-completes the award.
    #[default]
    Live,
    /// Once complete, always complete.
    Sticky,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ObjectiveDefinition {
    pub id: String,
    #[serde(default)]
    pub filters: Vec<FunctionRef>,
    pub rule: FunctionRef,
    pub progress_counter: String,
}

/// A function by name, with its config.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FunctionRef {
    pub name: String,
    #[serde(default = "empty_object")]
    pub config: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

impl FunctionRef {
    /// The config as the function receives it.
    pub fn config_text(&self) -> String {
        self.config.to_string()
    }
}

/// One problem with a definition, naming where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefinitionError {
    pub award: String,
    pub objective: Option<String>,
    pub function: Option<String>,
    pub reason: String,
}

impl fmt::Display for DefinitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "award {}", self.award)?;
        if let Some(objective) = &self.objective {
            write!(f, ", objective {objective}")?;
        }
        if let Some(function) = &self.function {
            write!(f, ", function {function}")?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// All problems found in a set of definitions.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct InvalidDefinitions(pub Vec<DefinitionError>);

/// Parses one definition or an array of them.
pub fn parse(text: &str) -> Result<Vec<AwardDefinition>, InvalidDefinitions> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| invalid("?", format!("not valid JSON: {e}")))?;
    let items = match value {
        Value::Array(items) => items,
        single => vec![single],
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let name = item
                .get("id")
                .and_then(Value::as_str)
                .map_or_else(|| format!("#{}", i + 1), str::to_string);
            serde_json::from_value(without_schema(item))
                .map_err(|e| invalid(&name, format!("invalid definition: {e}")))
        })
        .collect()
}

/// A definition without its `"$schema"` (the address of its JSON Schema,
/// for editors), when that is a string; anything else stays and is refused
/// as an unknown field.
pub(crate) fn without_schema(mut item: Value) -> Value {
    if let Some(object) = item.as_object_mut()
        && object.get("$schema").is_some_and(Value::is_string)
    {
        object.remove("$schema");
    }
    item
}

fn invalid(award: &str, reason: String) -> InvalidDefinitions {
    InvalidDefinitions(vec![DefinitionError {
        award: award.to_string(),
        objective: None,
        function: None,
        reason,
    }])
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// Checks definitions against the registry: every function resolves, is of
/// the right kind, and accepts its config (creating an instance of it is the
/// check). Returns every problem found.
///
/// Returns the sources the objectives' filters name (to register them).
pub fn validate(
    definitions: &[AwardDefinition],
    registry: &Arc<Registry>,
) -> Result<BTreeSet<String>, InvalidDefinitions> {
    let mut errors = Vec::new();
    let mut sources = BTreeSet::new();
    let mut seen_awards = HashSet::new();
    for award in definitions {
        let at =
            |objective: Option<&str>, function: Option<&str>, reason: String| DefinitionError {
                award: award.id.clone(),
                objective: objective.map(str::to_string),
                function: function.map(str::to_string),
                reason,
            };
        if !valid_id(&award.id) {
            errors.push(at(None, None, "the id must be 1-128 characters of A-Z a-z 0-9 _ . - starting with a letter or digit".into()));
        }
        if !seen_awards.insert(award.id.as_str()) {
            errors.push(at(None, None, "defined twice in the same file".into()));
        }
        if award.title.trim().is_empty() {
            errors.push(at(None, None, "the title is empty".into()));
        }
        if award.objectives.is_empty() {
            errors.push(at(None, None, "it has no objectives".into()));
        }
        let mut objective_ids = BTreeSet::new();
        for objective in &award.objectives {
            let id = objective.id.as_str();
            if !valid_id(id) {
                errors.push(at(
                    Some(id),
                    None,
                    "the objective id must be 1-128 characters of A-Z a-z 0-9 _ . -".into(),
                ));
            }
            if !objective_ids.insert(id) {
                errors.push(at(Some(id), None, "the objective is defined twice".into()));
            }
            if objective.progress_counter.is_empty() {
                errors.push(at(Some(id), None, "progress_counter is empty".into()));
            }
            let mut filters = Vec::new();
            for filter in &objective.filters {
                match registry.bind_filter(&filter.name, &filter.config_text()) {
                    Ok(binding) => filters.push(binding),
                    Err(error) => errors.push(at(Some(id), Some(&filter.name), error.to_string())),
                }
            }
            sources.extend(sources_of(&mut filters).into_iter().flatten());
            if let Err(error) =
                registry.bind_rule(&objective.rule.name, &objective.rule.config_text())
            {
                errors.push(at(Some(id), Some(&objective.rule.name), error.to_string()));
            }
        }
        match registry.bind_strategy(&award.strategy_function, &award.strategy.to_string()) {
            Ok(mut strategy) => {
                let used: BTreeSet<&str> = strategy
                    .instance()
                    .objectives()
                    .iter()
                    .map(String::as_str)
                    .collect();
                for missing in used.difference(&objective_ids) {
                    errors.push(at(
                        None,
                        Some(&award.strategy_function),
                        format!("the strategy refers to objective `{missing}`, which the award does not define"),
                    ));
                }
                for unused in objective_ids.difference(&used) {
                    errors.push(at(
                        Some(unused),
                        Some(&award.strategy_function),
                        "the strategy does not use this objective".to_string(),
                    ));
                }
            }
            Err(error) => errors.push(at(None, Some(&award.strategy_function), error.to_string())),
        }
    }
    if errors.is_empty() {
        Ok(sources)
    } else {
        Err(InvalidDefinitions(errors))
    }
}

/// The sources a filter chain can match (the intersection of its filters'
/// answers), or `None` when it can match any.
pub fn sources_of<'a>(
    filters: impl IntoIterator<Item = &'a mut Binding<FilterInstance>>,
) -> Option<BTreeSet<String>> {
    declared(filters, FilterInstance::sources)
}

/// The event types an objective with these filters can match: those every
/// filter that declares its types can match (None: any).
pub fn event_types_of<'a>(
    filters: impl IntoIterator<Item = &'a mut Binding<FilterInstance>>,
) -> Option<BTreeSet<String>> {
    declared(filters, FilterInstance::event_types)
}

/// What every filter that declares something (`declares`) allows.
fn declared<'a>(
    filters: impl IntoIterator<Item = &'a mut Binding<FilterInstance>>,
    declares: fn(&FilterInstance) -> Option<&[String]>,
) -> Option<BTreeSet<String>> {
    let mut allowed: Option<BTreeSet<String>> = None;
    for filter in filters {
        if let Some(these) = declares(filter.instance()) {
            let these: BTreeSet<String> = these.iter().cloned().collect();
            allowed = Some(match allowed {
                Some(previous) => previous.intersection(&these).cloned().collect(),
                None => these,
            });
        }
    }
    allowed
}

/// Why applying definitions failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Invalid(#[from] InvalidDefinitions),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// Parses, checks and stores definitions, all or nothing; registers the
/// sources they name. Returns each award's new version.
pub async fn apply(
    store: &mut crate::store::Store,
    registry: &Arc<Registry>,
    text: &str,
) -> Result<Vec<(String, i32)>, ApplyError> {
    let (definitions, sources) = check(store, registry, text).await?;
    let rows: Vec<(String, Value, bool)> = definitions
        .iter()
        .map(|d| {
            (
                d.id.clone(),
                serde_json::to_value(d).expect("a definition serializes"),
                d.enabled,
            )
        })
        .collect();
    let sources: Vec<String> = sources.into_iter().collect();
    let applied = store.apply_awards(&rows, &sources).await?;
    // Awards that credit the past: a backfill for each new version (an
    // unchanged definition keeps its version and its backfill).
    for definition in definitions
        .iter()
        .filter(|d| d.backfill.is_some() && d.enabled)
    {
        let Some((_, version)) = applied.iter().find(|(id, _)| *id == definition.id) else {
            continue;
        };
        let started = store.history_backfill(&definition.id).await?;
        if started.is_some_and(|b| b.award_version == *version) {
            continue;
        }
        if let Err(error) = request_backfill(store, registry, &definition.id).await {
            tracing::warn!(message = "The award was applied, but its backfill from history could not be started; start it with `laurel awards backfill`.", award = %definition.id, error = %format!("{error:#}"));
        }
    }
    Ok(applied)
}

/// Parses and checks definitions as [`apply`] does, writing nothing: the
/// definitions and the sources they name.
pub async fn check(
    store: &crate::store::Store,
    registry: &Arc<Registry>,
    text: &str,
) -> Result<(Vec<AwardDefinition>, BTreeSet<String>), ApplyError> {
    let definitions = parse(text)?;
    // The versions in the database now, even those pushed by another
    // process whose notification has not arrived: a push that answered is
    // seen by the next check.
    match registry.sync_now(store).await {
        Ok(()) => {}
        Err(crate::registry::RegistryError::Store(error)) => return Err(error.into()),
        Err(error) => {
            tracing::warn!(message = "Failed to read the registered functions before a check.", %error)
        }
    }
    let checked = {
        let registry = registry.clone();
        let definitions = definitions.clone();
        // Checking instantiates components: CPU work, off the async workers.
        tokio::task::spawn_blocking(move || validate(&definitions, &registry)).await
    };
    let sources = match checked {
        Ok(result) => result?,
        Err(join) => {
            return Err(invalid("?", format!("checking the definitions failed: {join}")).into());
        }
    };
    Ok((definitions, sources))
}

/// Why a checked push failed.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
    #[error("{}", refusal(name, action, problems, "--force"))]
    BreaksAwards {
        name: String,
        /// What was refused: `push`, `promote` or `roll back`.
        action: &'static str,
        problems: Vec<DefinitionError>,
    },
    /// Promote or rollback: no such version, or nothing to return to.
    #[error("{0}")]
    NoVersion(String),
}

impl PushError {
    /// The message, naming how the caller's interface overrides a refusal
    /// (`--force` on the command line, `?force=true` over HTTP).
    pub fn message(&self, force: &str) -> String {
        match self {
            PushError::BreaksAwards {
                name,
                action,
                problems,
            } => refusal(name, action, problems, force),
            PushError::Registry(error) => error.to_string(),
            PushError::NoVersion(message) => message.clone(),
        }
    }
}

fn refusal(name: &str, action: &str, problems: &[DefinitionError], force: &str) -> String {
    let broken = match problems.len() {
        1 => "an award that uses it".to_string(),
        n => format!("{n} uses of it in awards"),
    };
    let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
    format!(
        "refusing to {action} {name}: the new version would break {broken} ({action} with {force} to do it anyway): {}",
        problems.join("; ")
    )
}

impl From<crate::store::StoreError> for PushError {
    fn from(error: crate::store::StoreError) -> Self {
        PushError::Registry(error.into())
    }
}

impl From<crate::runtime::LoadError> for PushError {
    fn from(error: crate::runtime::LoadError) -> Self {
        PushError::Registry(error.into())
    }
}

/// Registers a new version of `name` (see `registry::push`), first checking
/// that every award using `name` still works with it: each filter, rule or
/// strategy config it is given must be accepted by the new version. With
/// `force`, pushes anyway (bindings that the new version refuses stay on
/// the version they have, and say so in the log).
pub async fn push_function(
    store: &mut crate::store::Store,
    runtime: &crate::runtime::Runtime,
    name: &str,
    pushed: Pushed<'_>,
    force: bool,
) -> Result<(crate::runtime::FunctionKind, crate::store::PushOutcome), PushError> {
    let Pushed {
        bytes,
        expected,
        limits,
    } = pushed;
    if !force {
        check_uses(store, runtime, name, bytes, expected, limits, "push").await?;
    }
    let stage = crate::registry::Stage::Live;
    Ok(crate::registry::push_staged(store, runtime, name, bytes, expected, limits, stage).await?)
}

/// A component as pushed: its bytes, the kind it must be (if given), and
/// the limits it asks for.
#[derive(Debug, Clone, Copy)]
pub struct Pushed<'a> {
    pub bytes: &'a [u8],
    pub expected: Option<crate::runtime::FunctionKind>,
    pub limits: crate::runtime::FunctionLimits,
}

impl<'a> Pushed<'a> {
    /// `bytes`, of whatever kind they are, under the server's defaults.
    pub fn of(bytes: &'a [u8]) -> Pushed<'a> {
        Pushed {
            bytes,
            expected: None,
            limits: Default::default(),
        }
    }
}

/// Registers `bytes` as a shadow candidate of `name`: a new version that
/// serves nothing until [`promote`] (its uses are checked then).
pub async fn push_shadow(
    store: &mut crate::store::Store,
    runtime: &crate::runtime::Runtime,
    name: &str,
    pushed: Pushed<'_>,
) -> Result<(crate::runtime::FunctionKind, crate::store::PushOutcome), PushError> {
    let stage = crate::registry::Stage::Shadow;
    let Pushed {
        bytes,
        expected,
        limits,
    } = pushed;
    Ok(crate::registry::push_staged(store, runtime, name, bytes, expected, limits, stage).await?)
}

/// Makes `version` of `name` the one that serves, first checking (unless
/// `force`) that every award using `name` works with it.
pub async fn promote(
    store: &mut crate::store::Store,
    runtime: &crate::runtime::Runtime,
    name: &str,
    version: i32,
    force: bool,
) -> Result<crate::store::LiveChange, PushError> {
    make_live(store, runtime, name, version, force, "promote").await
}

/// Makes the version that served before the last push, promote or
/// rollback of `name` serve again: one step back, no new version.
pub async fn rollback(
    store: &mut crate::store::Store,
    runtime: &crate::runtime::Runtime,
    name: &str,
    force: bool,
) -> Result<crate::store::LiveChange, PushError> {
    let previous = match store.live_function(name).await? {
        None => {
            return Err(PushError::NoVersion(format!(
                "no function named {name} is registered"
            )));
        }
        Some((live, None)) => {
            return Err(PushError::NoVersion(format!(
                "{name} v{live} is the only version that has served: there is nothing to roll back to"
            )));
        }
        Some((_, Some(previous))) => previous,
    };
    make_live(store, runtime, name, previous, force, "roll back").await
}

async fn make_live(
    store: &mut crate::store::Store,
    runtime: &crate::runtime::Runtime,
    name: &str,
    version: i32,
    force: bool,
    action: &'static str,
) -> Result<crate::store::LiveChange, PushError> {
    let found = store
        .function_version(name, version)
        .await?
        .ok_or_else(|| PushError::NoVersion(format!("{name} has no version {version}")))?;
    if !force {
        let expected = crate::runtime::FunctionKind::parse(&found.kind);
        check_uses(
            store,
            runtime,
            name,
            &found.bytes,
            expected,
            found.limits,
            action,
        )
        .await?;
    }
    store
        .set_live_function(name, version)
        .await?
        .ok_or_else(|| PushError::NoVersion(format!("{name} has no version {version}")))
}

/// Refuses `bytes` as `name` if an award's use of `name` would break.
async fn check_uses(
    store: &crate::store::Store,
    runtime: &crate::runtime::Runtime,
    name: &str,
    bytes: &[u8],
    expected: Option<crate::runtime::FunctionKind>,
    limits: crate::runtime::FunctionLimits,
    action: &'static str,
) -> Result<(), PushError> {
    let awards: Vec<AwardDefinition> = store
        .awards()
        .await?
        .into_iter()
        .filter_map(|row| serde_json::from_value(row.definition).ok())
        .collect();
    let (runtime, name_owned, bytes_owned) = (runtime.clone(), name.to_string(), bytes.to_vec());
    let problems = tokio::task::spawn_blocking(move || {
        // Loaded as itself (its compiled form is found by its own
        // sha256), checked against every award that uses the name. What
        // does not load as an award's function (an HTTP function, or no
        // component at all) breaks only the awards that use the name; the
        // push itself says what it is.
        let function = match runtime.load_with(&name_owned, 0, &bytes_owned, expected, limits) {
            Ok(function) => function,
            Err(_) if !awards.iter().any(|a| a.uses(&name_owned)) => {
                return Ok(Vec::new());
            }
            Err(error) => return Err(error),
        };
        Ok::<_, crate::runtime::LoadError>(uses_refused(&function, &awards))
    })
    .await
    .map_err(|join| {
        PushError::Registry(crate::registry::RegistryError::Unloadable {
            name: name.to_string(),
            version: 0,
            reason: join.to_string(),
        })
    })??;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(PushError::BreaksAwards {
            name: name.to_string(),
            action,
            problems,
        })
    }
}

/// Every use of `function`'s name in `awards` that it refuses.
fn uses_refused(
    function: &Arc<crate::runtime::Function>,
    awards: &[AwardDefinition],
) -> Vec<DefinitionError> {
    use crate::runtime::{
        FilterInstance, FunctionError, FunctionKind, RuleInstance, StrategyInstance,
        TransformInstance,
    };
    let name = function.name.as_str();
    // Why the new version cannot take this use, if it cannot.
    let refusal = |used_as: FunctionKind, config: &str| -> Option<String> {
        if function.kind != used_as {
            return Some(format!(
                "it is used as a {used_as}, and the new version is a {}",
                function.kind
            ));
        }
        let created = match used_as {
            FunctionKind::Filter => FilterInstance::new(function.clone(), config).map(drop),
            FunctionKind::Rule => RuleInstance::new(function.clone(), config).map(drop),
            FunctionKind::Strategy => StrategyInstance::new(function.clone(), config).map(drop),
            FunctionKind::Transform => TransformInstance::new(function.clone(), config).map(drop),
            FunctionKind::Http => return Some("an HTTP function serves no award".into()),
        };
        match created {
            Ok(()) => None,
            Err(FunctionError::Config { reason, .. }) => {
                Some(format!("the new version rejects its config: {reason}"))
            }
            Err(error) => Some(format!("the new version fails on its config: {error}")),
        }
    };
    let mut problems = Vec::new();
    for award in awards {
        let mut uses: Vec<(Option<&str>, FunctionKind, String)> = Vec::new();
        for objective in &award.objectives {
            for filter in objective.filters.iter().filter(|f| f.name == name) {
                uses.push((
                    Some(&objective.id),
                    FunctionKind::Filter,
                    filter.config_text(),
                ));
            }
            if objective.rule.name == name {
                uses.push((
                    Some(&objective.id),
                    FunctionKind::Rule,
                    objective.rule.config_text(),
                ));
            }
        }
        if award.strategy_function == name {
            uses.push((None, FunctionKind::Strategy, award.strategy.to_string()));
        }
        for (objective, used_as, config) in uses {
            if let Some(reason) = refusal(used_as, &config) {
                problems.push(DefinitionError {
                    award: award.id.clone(),
                    objective: objective.map(str::to_string),
                    function: Some(name.to_string()),
                    reason,
                });
            }
        }
    }
    problems
}
impl AwardDefinition {
    /// Whether it names `function` as a filter, rule or strategy.
    pub fn uses(&self, function: &str) -> bool {
        self.strategy_function == function
            || self
                .objectives
                .iter()
                .any(|o| o.rule.name == function || o.filters.iter().any(|f| f.name == function))
    }
}

/// Starts (or starts over) the backfill from history of `award_id`, over
/// the registered sources that some objective of it can match.
pub async fn request_backfill(
    store: &crate::store::Store,
    registry: &Arc<Registry>,
    award_id: &str,
) -> anyhow::Result<crate::store::HistoryBackfill> {
    let (award, version, _) = enabled_award(store, award_id).await?;
    let names: Vec<String> = store.sources().await?.into_iter().map(|s| s.name).collect();
    let registry = registry.clone();
    let sources = tokio::task::spawn_blocking(move || {
        let awards = [award];
        names
            .into_iter()
            .filter(|source| {
                crate::objectives::Plan::build(source, &awards, &registry).objective_count() > 0
            })
            .collect::<Vec<_>>()
    })
    .await?;
    let backfill = store
        .request_history_backfill(award_id, version, &sources)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no award named {award_id}"))?;
    tracing::info!(message = "Backfill from history requested.", award = %award_id, version, sources = ?sources, items = backfill.total);
    Ok(backfill)
}

/// The enabled definition of `award_id` and its version.
pub async fn enabled_award(
    store: &crate::store::Store,
    award_id: &str,
) -> anyhow::Result<(AwardDefinition, i32, chrono::DateTime<chrono::Utc>)> {
    let row = store
        .awards()
        .await?
        .into_iter()
        .find(|r| r.id == award_id)
        .ok_or_else(|| anyhow::anyhow!("no award named {award_id}"))?;
    anyhow::ensure!(
        row.enabled,
        "award {award_id} is disabled: it counts nothing, so there is nothing to backfill"
    );
    let award: AwardDefinition = serde_json::from_value(row.definition)
        .map_err(|e| anyhow::anyhow!("award {award_id} as stored cannot be read: {e}"))?;
    Ok((award, row.version, row.updated_at))
}
