//! What a source's events mean for the objectives that can see them: the
//! filter chains and rules of those objectives, run through Wasm in batches.
//!
//! Pure apart from the function calls: no Kafka, no database. Runs on a
//! blocking thread.
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

use crate::definitions::AwardDefinition;
use crate::event::Envelope;
use crate::registry::{Binding, Registry};
use crate::runtime::{Contribution, Event, FilterInstance, FunctionError, RuleInstance};
use crate::store::{Counters, Effect, LogEntry, Outcome};

/// A function of an objective, bound to its current version, or why it
/// cannot be.
enum Bound<I> {
    Ready(Binding<I>),
    Broken { name: String, reason: Arc<str> },
}

impl<I: crate::registry::BoundInstance> Bound<I> {
    fn name(&self) -> &str {
        match self {
            Bound::Ready(binding) => binding.name(),
            Bound::Broken { name, .. } => name,
        }
    }

    fn broken(&self) -> Option<&Arc<str>> {
        match self {
            Bound::Broken { reason, .. } => Some(reason),
            Bound::Ready(_) => None,
        }
    }
}

/// One objective's chain.
struct ObjectivePlan {
    award_id: String,
    objective_id: String,
    filters: Vec<Bound<FilterInstance>>,
    rule: Bound<RuleInstance>,
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

/// The objectives a source's events can reach.
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
        let mut objectives = Vec::new();
        let mut unbound = Vec::new();
        for award in awards {
            for objective in &award.objectives {
                let where_ = |error: &dyn std::fmt::Display| -> Arc<str> {
                    format!("award {}, objective {}: {error}", award.id, objective.id).into()
                };
                let mut filters: Vec<Bound<FilterInstance>> = objective
                    .filters
                    .iter()
                    .map(|f| match registry.bind_filter(&f.name, &f.config_text()) {
                        Ok(binding) => Bound::Ready(binding),
                        Err(error) => Bound::Broken {
                            name: f.name.clone(),
                            reason: where_(&error),
                        },
                    })
                    .collect();
                // Filters that name their sources decide whether this
                // objective can see this source, bound or not the others.
                if let Some(sources) = sources_of(&mut filters)
                    && !sources.contains(source)
                {
                    continue;
                }
                let rule =
                    match registry.bind_rule(&objective.rule.name, &objective.rule.config_text()) {
                        Ok(binding) => Bound::Ready(binding),
                        Err(error) => Bound::Broken {
                            name: objective.rule.name.clone(),
                            reason: where_(&error),
                        },
                    };
                let plan = ObjectivePlan {
                    award_id: award.id.clone(),
                    objective_id: objective.id.clone(),
                    filters,
                    rule,
                };
                if let Some(reason) = plan.broken() {
                    warn!(message = "Objective cannot be bound; its events are held for it.", source = %source, error = %reason);
                    unbound.push(reason.to_string());
                }
                objectives.push(plan);
            }
        }
        Plan {
            objectives,
            unbound,
        }
    }

    pub fn objective_count(&self) -> usize {
        self.objectives.len()
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
        // Per objective, the answer for each event (None: out of scope).
        let mut answers: Vec<Vec<Option<Answer>>> = Vec::with_capacity(self.objectives.len());
        let mut versions: Vec<Arc<Value>> = Vec::with_capacity(self.objectives.len());
        for objective in &mut self.objectives {
            let in_scope: Vec<usize> = match scopes {
                None => (0..events.len()).collect(),
                Some(scopes) => (0..events.len())
                    .filter(|&i| objective.is_in(&scopes[i]))
                    .collect(),
            };
            let functions = Arc::new(objective.functions());
            versions.push(functions.clone());
            let mut these: Vec<Option<Answer>> = (0..events.len()).map(|_| None).collect();
            if !in_scope.is_empty() {
                for (index, answer) in in_scope.iter().zip(objective.answers(&events, &in_scope)) {
                    these[*index] = Some(answer);
                }
            }
            answers.push(these);
        }
        // Stream order: event by event, objective by objective.
        for (position, envelope) in envelopes.iter().enumerate() {
            for ((objective, these), functions) in
                self.objectives.iter().zip(&mut answers).zip(&versions)
            {
                let effect = match these[position].take() {
                    Some(Answer::Effect(effect)) => effect,
                    Some(Answer::Unusable(reason)) => {
                        evaluation.log.push(objective.unusable(
                            indexes[position],
                            envelope,
                            &reason,
                            functions,
                        ));
                        continue;
                    }
                    Some(Answer::Nothing) | None => continue,
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

/// The sources the bound filters can match (None: any).
fn sources_of(filters: &mut [Bound<FilterInstance>]) -> Option<BTreeSet<String>> {
    let mut sources: Option<BTreeSet<String>> = None;
    for filter in filters {
        if let Bound::Ready(binding) = filter
            && let Some(these) = binding.instance().sources()
        {
            let these: BTreeSet<String> = these.iter().cloned().collect();
            sources = Some(match sources {
                Some(previous) => previous.intersection(&these).cloned().collect(),
                None => these,
            });
        }
    }
    sources
}

enum Answer {
    Effect(Effect),
    Nothing,
    Unusable(String),
}

impl ObjectivePlan {
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

    /// The answers for `events[i]`, i in `in_scope`. A function failing on
    /// the batch is tried event by event to find the events it fails on:
    /// those are held for this objective, the rest go ahead.
    fn answers(&mut self, events: &[Event], in_scope: &[usize]) -> Vec<Answer> {
        match self.run(events, in_scope) {
            Ok(answers) => answers,
            Err(_) if in_scope.len() > 1 => in_scope
                .iter()
                .map(|&index| match self.run(events, &[index]) {
                    Ok(mut answer) => answer.pop().unwrap_or(Answer::Nothing),
                    Err(error) => self.held(&error),
                })
                .collect(),
            Err(error) => vec![self.held(&error)],
        }
    }

    fn held(&self, error: &FunctionError) -> Answer {
        Answer::Effect(Effect::Held {
            reason: format!(
                "award {}, objective {}: {error}",
                self.award_id, self.objective_id
            )
            .into(),
        })
    }

    /// The log entry for an event the rule says it cannot use.
    fn unusable(
        &self,
        index: usize,
        envelope: &Envelope,
        reason: &str,
        functions: &Arc<Value>,
    ) -> LogEntry {
        LogEntry {
            index,
            event_id: Some(envelope.id.clone()),
            user_id: Some(envelope.user_id.clone()),
            award_id: Some(self.award_id.clone()),
            objective_id: Some(self.objective_id.clone()),
            outcome: "rejected",
            reason: format!("rule {}: {reason}", self.rule.name()),
            functions: Some(functions.clone()),
        }
    }

    /// The versions that decide this objective, for the processing log
    /// (null for a function that cannot be bound).
    fn functions(&self) -> Value {
        let mut map = serde_json::Map::new();
        let functions = self
            .filters
            .iter()
            .map(|f| match f {
                Bound::Ready(b) => (b.name(), Some(b.current_function().version)),
                Bound::Broken { name, .. } => (name.as_str(), None),
            })
            .chain([match &self.rule {
                Bound::Ready(b) => (b.name(), Some(b.current_function().version)),
                Bound::Broken { name, .. } => (name.as_str(), None),
            }]);
        for (name, version) in functions {
            map.insert(name.to_string(), json!(version));
        }
        Value::Object(map)
    }

    /// Filters (each sees only what the previous passed), then the rule,
    /// for `events[i]`, i in `in_scope`; one answer per such event.
    fn run(&mut self, events: &[Event], in_scope: &[usize]) -> Result<Vec<Answer>, FunctionError> {
        let mut passing: Vec<usize> = (0..in_scope.len()).collect();
        let event = |p: usize| &events[in_scope[p]];
        // A content item that no longer passes contributes nothing now; the
        // filter that stopped it is named in the processing log.
        let mut answers: Vec<Answer> = in_scope.iter().map(|_| Answer::Nothing).collect();
        for filter in &mut self.filters {
            if passing.is_empty() {
                break;
            }
            let filter = match filter {
                Bound::Ready(binding) => binding,
                Bound::Broken { reason, .. } => return Ok(held(answers, &passing, reason)),
            };
            let answers_here = filter
                .instance()
                .matches(passing.iter().map(|&p| event(p)))?;
            let mut excluded_by: Option<Arc<str>> = None;
            let mut still = Vec::with_capacity(passing.len());
            for (p, ok) in passing.into_iter().zip(answers_here) {
                if ok {
                    still.push(p);
                } else if event(p).content_id.is_some() {
                    let by = excluded_by
                        .get_or_insert_with(|| format!("filter {}", filter.name()).into());
                    answers[p] = Answer::Effect(Effect::Excluded { by: by.clone() });
                }
            }
            passing = still;
        }
        if passing.is_empty() {
            return Ok(answers);
        }
        let rule = match &mut self.rule {
            Bound::Ready(binding) => binding,
            Bound::Broken { reason, .. } => return Ok(held(answers, &passing, reason)),
        };
        let contributions = rule
            .instance()
            .contribute(passing.iter().map(|&p| event(p)))?;
        for (p, contribution) in passing.into_iter().zip(contributions) {
            answers[p] = match contribution {
                Ok(Some(c)) => effect(event(p), c),
                Ok(None) => Answer::Nothing,
                Err(reason) => Answer::Unusable(reason),
            };
        }
        Ok(answers)
    }
}

/// `answers` with every event still passing held (a function of the chain
/// cannot be bound).
fn held(mut answers: Vec<Answer>, passing: &[usize], reason: &Arc<str>) -> Vec<Answer> {
    for &p in passing {
        answers[p] = Answer::Effect(Effect::Held {
            reason: reason.clone(),
        });
    }
    answers
}

fn effect(event: &Event, contribution: Contribution) -> Answer {
    let mut counters = Counters::new();
    for counter in contribution.counters {
        let total = counters.entry(counter.name).or_insert(0);
        match total.checked_add(counter.value) {
            Some(sum) => *total = sum,
            None => {
                return Answer::Unusable(
                    "the rule named one counter several times and the sum overflows".to_string(),
                );
            }
        }
    }
    if contribution.additive || event.content_id.is_none() {
        // Without a content item there is nothing to replace: it can only add.
        Answer::Effect(Effect::Additive { counters })
    } else {
        Answer::Effect(Effect::Contribution {
            counters,
            dedup_key: contribution.dedup_key,
        })
    }
}
