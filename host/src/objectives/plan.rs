//! What a source's events mean for the objectives that can see them: the
//! filter chains and rules of those objectives, run through Wasm in batches.
//!
//! Pure apart from the function calls: no Kafka, no database. Runs on a
//! blocking thread. Each objective answers each event with a typed
//! [`Verdict`]; ingest turns verdicts into counter effects
//! ([`Plan::evaluate`]) and explain shows them ([`Plan::verdicts`]).
//!
//! A failing function affects its own objective only: when a filter or
//! rule traps, times out or is quarantined, or an objective cannot be bound
//! (a function is missing or refuses its config), the event is *held* for
//! that objective (`Effect::Held`: nothing changes there now, the event is
//! kept for replay) and applies to every other objective as usual.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{Value, json};
use tracing::warn;

use super::Verdict;
use crate::definitions::{AwardDefinition, ObjectiveDefinition, event_types_of, sources_of};
use crate::event::Envelope;
use crate::registry::{Binding, BoundInstance, Registry};
use crate::runtime::{Contribution, Event, FilterInstance, FunctionError, RuleInstance};
use crate::store::{Counters, Effect, LogEntry, Outcome};

/// A function of an objective, bound to its current version, or why it
/// cannot be.
struct Bound<I> {
    name: Arc<str>,
    binding: Result<Binding<I>, Arc<str>>,
}

impl<I: BoundInstance> Bound<I> {
    fn ready(&mut self) -> Option<&mut Binding<I>> {
        self.binding.as_mut().ok()
    }

    fn broken(&self) -> Option<&Arc<str>> {
        self.binding.as_ref().err()
    }

    /// The version that decides, for the processing log (None: unbound).
    fn version(&self) -> Option<i32> {
        let binding = self.binding.as_ref().ok()?;
        Some(binding.current_function().version)
    }
}

/// One objective's chain.
struct ObjectivePlan {
    award_id: String,
    objective_id: String,
    filters: Vec<Bound<FilterInstance>>,
    rule: Bound<RuleInstance>,
    /// The sources its bound filters can match (None: any).
    sources: Option<BTreeSet<String>>,
    /// The event types it can use (None: any): those every filter that
    /// declares its types can match; any when a function is unbound (its
    /// events are held, so none may be dropped).
    event_types: Option<BTreeSet<String>>,
}

/// Which objectives an event is evaluated for.
#[derive(Debug, Clone, PartialEq)]
pub enum Scope {
    /// Every objective of the plan (ingest, and a replayed dead letter).
    All,
    /// One objective (a replay of an event held for it).
    Objective {
        award_id: String,
        objective_id: String,
    },
}

/// The objectives a source's events can reach (or an award's objectives,
/// for explain), each bound to its functions' current versions.
pub struct Plan {
    objectives: Vec<ObjectivePlan>,
    /// Objectives that cannot be bound now, with the reason: their events
    /// are held for them until fixed.
    pub unbound: Vec<String>,
}

/// The result of evaluating a batch.
#[derive(Default)]
pub struct Evaluation {
    /// In stream order, an event's outcomes together.
    pub outcomes: Vec<Outcome>,
    pub log: Vec<LogEntry>,
}

impl Plan {
    /// Binds every objective of `awards` whose filters can match `source`.
    pub fn build(source: &str, awards: &[AwardDefinition], registry: &Arc<Registry>) -> Plan {
        let mut plan = Plan {
            objectives: Vec::new(),
            unbound: Vec::new(),
        };
        for award in awards {
            for objective in &award.objectives {
                let bound = ObjectivePlan::bind(award, objective, registry);
                // Filters that name their sources decide whether this
                // objective can see this source, bound or not the others.
                if bound.sources.as_ref().is_some_and(|s| !s.contains(source)) {
                    continue;
                }
                if let Some(reason) = bound.broken() {
                    warn!(message = "Objective cannot be bound; its events are held for it.", source = %source, error = %reason);
                    plan.unbound.push(reason.to_string());
                }
                plan.objectives.push(bound);
            }
        }
        plan
    }

    /// Binds every objective of one award, whatever its sources: explain
    /// runs an event of any source through every filter.
    pub fn for_award(award: &AwardDefinition, registry: &Arc<Registry>) -> Plan {
        let objectives: Vec<ObjectivePlan> = award
            .objectives
            .iter()
            .map(|objective| ObjectivePlan::bind(award, objective, registry))
            .collect();
        let unbound = objectives
            .iter()
            .filter_map(|o| o.broken().map(ToString::to_string))
            .collect();
        Plan {
            objectives,
            unbound,
        }
    }

    pub fn objective_count(&self) -> usize {
        self.objectives.len()
    }

    /// The event types some objective of the plan can use (None: any type
    /// may be). An event of another type is excluded by a filter of every
    /// objective, so the pre-filter drops it without running one.
    pub fn event_types(&self) -> Option<BTreeSet<String>> {
        let mut all = BTreeSet::new();
        for objective in &self.objectives {
            all.extend(objective.event_types.as_ref()?.iter().cloned());
        }
        Some(all)
    }

    /// Each objective's sources (None: any), in plan order.
    pub fn sources(&self) -> impl Iterator<Item = Option<&BTreeSet<String>>> {
        self.objectives.iter().map(|o| o.sources.as_ref())
    }

    /// What each objective makes of each event: `[objective][event]`.
    pub fn verdicts(&mut self, envelopes: &[Envelope]) -> Vec<Vec<Verdict>> {
        let events: Vec<Event> = envelopes.iter().map(Envelope::to_function_event).collect();
        let all: Vec<usize> = (0..events.len()).collect();
        self.objectives
            .iter_mut()
            .map(|objective| objective.verdicts(&events, &all))
            .collect()
    }

    /// Evaluates decoded, admitted events (in stream order) for every
    /// objective; `indexes` are their positions in the batch.
    pub fn evaluate(&mut self, envelopes: &[Envelope], indexes: &[usize]) -> Evaluation {
        self.evaluate_scoped(envelopes, indexes, None)
    }

    /// As [`Plan::evaluate`], each event for the objectives of its scope.
    pub fn evaluate_scoped(
        &mut self,
        envelopes: &[Envelope],
        indexes: &[usize],
        scopes: Option<&[Scope]>,
    ) -> Evaluation {
        let events: Vec<Event> = envelopes.iter().map(Envelope::to_function_event).collect();
        let mut evaluation = Evaluation::default();
        // Per objective, the verdict on each event (None: out of scope).
        let mut verdicts: Vec<Vec<Option<Verdict>>> = Vec::with_capacity(self.objectives.len());
        let mut versions: Vec<Arc<Value>> = Vec::with_capacity(self.objectives.len());
        for objective in &mut self.objectives {
            let in_scope: Vec<usize> = match scopes {
                None => (0..events.len()).collect(),
                Some(scopes) => (0..events.len())
                    .filter(|&i| objective.is_in(&scopes[i]))
                    .collect(),
            };
            versions.push(Arc::new(objective.functions()));
            let mut these: Vec<Option<Verdict>> = (0..events.len()).map(|_| None).collect();
            if !in_scope.is_empty() {
                let judged = objective.verdicts(&events, &in_scope);
                for (index, verdict) in in_scope.iter().zip(judged) {
                    these[*index] = Some(verdict);
                }
            }
            verdicts.push(these);
        }
        // Stream order: event by event, objective by objective.
        for (position, envelope) in envelopes.iter().enumerate() {
            for ((objective, these), functions) in
                self.objectives.iter().zip(&mut verdicts).zip(&versions)
            {
                let Some(verdict) = these[position].take() else {
                    continue;
                };
                let effect = match effect(verdict, envelope) {
                    Ok(Some(effect)) => effect,
                    Ok(None) => continue,
                    Err(reason) => {
                        evaluation.log.push(objective.refused(
                            indexes[position],
                            envelope,
                            reason,
                            functions,
                        ));
                        continue;
                    }
                };
                evaluation.outcomes.push(Outcome {
                    index: indexes[position],
                    event_id: envelope.id.clone(),
                    user_id: envelope.user_id.clone(),
                    award_id: objective.award_id.clone(),
                    objective_id: objective.objective_id.clone(),
                    content_id: envelope.content_id.clone(),
                    occurred_at: envelope.occurred_at,
                    effect,
                    functions: functions.clone(),
                });
            }
        }
        evaluation
    }
}

/// What a verdict changes in the counters (None: nothing), or the reason
/// the rule refused the event, for the log.
fn effect(verdict: Verdict, envelope: &Envelope) -> Result<Option<Effect>, String> {
    Ok(Some(match verdict {
        // An event without a content item never counted: nothing to undo.
        Verdict::Excluded { .. } if envelope.content_id.is_none() => return Ok(None),
        Verdict::Excluded { filter } => Effect::Excluded { filter },
        Verdict::Counted {
            counters,
            additive: true,
            ..
        } => Effect::Additive { counters },
        Verdict::Counted {
            counters,
            dedup_key,
            additive: false,
            ..
        } => Effect::Contribution {
            counters,
            dedup_key,
        },
        Verdict::Nothing { .. } => return Ok(None),
        Verdict::Refused { rule, reason } => return Err(format!("rule {rule}: {reason}")),
        Verdict::Held { reason } => Effect::Held { reason },
    }))
}

impl ObjectivePlan {
    fn bind(
        award: &AwardDefinition,
        objective: &ObjectiveDefinition,
        registry: &Arc<Registry>,
    ) -> ObjectivePlan {
        let where_ = |error: &dyn std::fmt::Display| -> Arc<str> {
            format!("award {}, objective {}: {error}", award.id, objective.id).into()
        };
        let mut filters: Vec<Bound<FilterInstance>> = objective
            .filters
            .iter()
            .map(|f| Bound {
                name: f.name.as_str().into(),
                binding: registry
                    .bind_filter(&f.name, &f.config_text())
                    .map_err(|error| where_(&error)),
            })
            .collect();
        let sources = sources_of(filters.iter_mut().filter_map(Bound::ready));
        let rule = Bound {
            name: objective.rule.name.as_str().into(),
            binding: registry
                .bind_rule(&objective.rule.name, &objective.rule.config_text())
                .map_err(|error| where_(&error)),
        };
        let all_bound = rule.broken().is_none() && filters.iter().all(|f| f.broken().is_none());
        let event_types = if all_bound {
            event_types_of(filters.iter_mut().filter_map(Bound::ready))
        } else {
            None
        };
        ObjectivePlan {
            award_id: award.id.clone(),
            objective_id: objective.id.clone(),
            filters,
            rule,
            sources,
            event_types,
        }
    }

    fn is_in(&self, scope: &Scope) -> bool {
        match scope {
            Scope::All => true,
            Scope::Objective {
                award_id,
                objective_id,
            } => *award_id == self.award_id && *objective_id == self.objective_id,
        }
    }

    /// Why this objective cannot run at all, if it cannot.
    fn broken(&self) -> Option<&Arc<str>> {
        self.filters
            .iter()
            .find_map(Bound::broken)
            .or_else(|| self.rule.broken())
    }

    /// The verdicts on `events[i]`, i in `in_scope`. A function failing on
    /// the batch is tried event by event to find the events it fails on:
    /// those are held for this objective, the rest go ahead.
    fn verdicts(&mut self, events: &[Event], in_scope: &[usize]) -> Vec<Verdict> {
        match self.run(events, in_scope) {
            Ok(verdicts) => verdicts,
            Err(_) if in_scope.len() > 1 => in_scope
                .iter()
                .map(|&index| match self.run(events, &[index]) {
                    Ok(mut verdict) => verdict.pop().unwrap_or_else(|| self.nothing()),
                    Err(error) => self.held(&error),
                })
                .collect(),
            Err(error) => vec![self.held(&error)],
        }
    }

    fn held(&self, error: &FunctionError) -> Verdict {
        Verdict::Held {
            reason: format!(
                "award {}, objective {}: {error}",
                self.award_id, self.objective_id
            )
            .into(),
        }
    }

    fn nothing(&self) -> Verdict {
        Verdict::Nothing {
            rule: self.rule.name.clone(),
        }
    }

    /// The log entry for an event the rule says it cannot use.
    fn refused(
        &self,
        index: usize,
        envelope: &Envelope,
        reason: String,
        functions: &Arc<Value>,
    ) -> LogEntry {
        LogEntry {
            index,
            event_id: Some(envelope.id.clone()),
            user_id: Some(envelope.user_id.clone()),
            award_id: Some(self.award_id.clone()),
            objective_id: Some(self.objective_id.clone()),
            outcome: "rejected",
            reason,
            functions: Some(functions.clone()),
        }
    }

    /// The versions that decide this objective, for the processing log
    /// (null for a function that cannot be bound).
    fn functions(&self) -> Value {
        let mut map = serde_json::Map::new();
        for function in self
            .filters
            .iter()
            .map(|f| (&f.name, f.version()))
            .chain([(&self.rule.name, self.rule.version())])
        {
            map.insert(function.0.to_string(), json!(function.1));
        }
        Value::Object(map)
    }

    /// Filters (each sees only what the previous passed), then the rule,
    /// for `events[i]`, i in `in_scope`; one verdict per such event.
    fn run(&mut self, events: &[Event], in_scope: &[usize]) -> Result<Vec<Verdict>, FunctionError> {
        let mut passing: Vec<usize> = (0..in_scope.len()).collect();
        let event = |p: usize| &events[in_scope[p]];
        let mut verdicts: Vec<Verdict> = in_scope.iter().map(|_| self.nothing()).collect();
        for filter in &mut self.filters {
            if passing.is_empty() {
                break;
            }
            let name = &filter.name;
            let binding = match &mut filter.binding {
                Ok(binding) => binding,
                Err(reason) => return Ok(held(verdicts, &passing, reason)),
            };
            let answers = binding
                .instance()
                .matches(passing.iter().map(|&p| event(p)))?;
            let mut still = Vec::with_capacity(passing.len());
            for (p, ok) in passing.into_iter().zip(answers) {
                if ok {
                    still.push(p);
                } else {
                    verdicts[p] = Verdict::Excluded {
                        filter: name.clone(),
                    };
                }
            }
            passing = still;
        }
        if passing.is_empty() {
            return Ok(verdicts);
        }
        let rule = self.rule.name.clone();
        let binding = match &mut self.rule.binding {
            Ok(binding) => binding,
            Err(reason) => return Ok(held(verdicts, &passing, reason)),
        };
        let contributions = binding
            .instance()
            .contribute(passing.iter().map(|&p| event(p)))?;
        for (p, contribution) in passing.into_iter().zip(contributions) {
            verdicts[p] = match contribution {
                Ok(Some(c)) => counted(&rule, event(p), c),
                Ok(None) => Verdict::Nothing { rule: rule.clone() },
                Err(reason) => Verdict::Refused {
                    rule: rule.clone(),
                    reason,
                },
            };
        }
        Ok(verdicts)
    }
}

/// `verdicts` with every event still passing held (a function of the chain
/// cannot be bound).
fn held(mut verdicts: Vec<Verdict>, passing: &[usize], reason: &Arc<str>) -> Vec<Verdict> {
    for &p in passing {
        verdicts[p] = Verdict::Held {
            reason: reason.clone(),
        };
    }
    verdicts
}

fn counted(rule: &Arc<str>, event: &Event, contribution: Contribution) -> Verdict {
    let mut counters = Counters::new();
    for counter in contribution.counters {
        let total = counters.entry(counter.name).or_insert(0);
        match total.checked_add(counter.value) {
            Some(sum) => *total = sum,
            None => {
                return Verdict::Refused {
                    rule: rule.clone(),
                    reason: "the rule named one counter several times and the sum overflows"
                        .to_string(),
                };
            }
        }
    }
    Verdict::Counted {
        rule: rule.clone(),
        counters,
        dedup_key: contribution.dedup_key,
        // Without a content item there is nothing to replace: it can only add.
        additive: contribution.additive || event.content_id.is_none(),
    }
}
