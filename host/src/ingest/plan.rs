//! What a source's events mean for the objectives that can see them: the
//! filter chains and rules of those objectives, run through Wasm in batches.
//!
//! Pure apart from the function calls: no Kafka, no database. Runs on a
//! blocking thread.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use tracing::warn;

use crate::definitions::{self, AwardDefinition};
use crate::event::Envelope;
use crate::registry::{Binding, Registry};
use crate::runtime::{Contribution, Event, FilterInstance, FunctionError, RuleInstance};
use crate::store::{Counters, Effect, LogEntry, Outcome};

/// One objective's chain, bound to current function versions.
struct ObjectivePlan {
    award_id: String,
    objective_id: String,
    filters: Vec<Binding<FilterInstance>>,
    rule: Binding<RuleInstance>,
}

/// An event that cannot be applied, for the dead-letter topic.
#[derive(Debug, Clone)]
pub struct Rejected {
    /// Index of the event in the batch.
    pub index: usize,
    pub reason: String,
}

/// The objectives a source's events can reach.
pub struct Plan {
    objectives: Vec<ObjectivePlan>,
    /// Objectives that could not be bound (the award stays unapplied for
    /// this source until fixed), with the reason.
    pub unbound: Vec<String>,
}

/// The result of evaluating a batch.
#[derive(Default)]
pub struct Evaluation {
    pub outcomes: Vec<Outcome>,
    pub log: Vec<LogEntry>,
    pub rejected: Vec<Rejected>,
}

impl Plan {
    /// Binds every objective of `awards` whose filters can match `source`.
    pub fn build(source: &str, awards: &[AwardDefinition], registry: &Arc<Registry>) -> Plan {
        let mut objectives = Vec::new();
        let mut unbound = Vec::new();
        for award in awards {
            for objective in &award.objectives {
                let bound = (|| {
                    let mut filters = objective
                        .filters
                        .iter()
                        .map(|f| registry.bind_filter(&f.name, &f.config_text()))
                        .collect::<Result<Vec<_>, _>>()?;
                    if let Some(sources) = definitions::sources_of(&mut filters)
                        && !sources.contains(source)
                    {
                        return Ok(None);
                    }
                    let rule =
                        registry.bind_rule(&objective.rule.name, &objective.rule.config_text())?;
                    Ok::<_, crate::registry::RegistryError>(Some(ObjectivePlan {
                        award_id: award.id.clone(),
                        objective_id: objective.id.clone(),
                        filters,
                        rule,
                    }))
                })();
                match bound {
                    Ok(Some(plan)) => objectives.push(plan),
                    // Its filters never match this source.
                    Ok(None) => {}
                    Err(error) => {
                        let reason =
                            format!("award {}, objective {}: {error}", award.id, objective.id);
                        warn!(message = "Objective not applied.", source = %source, error = %reason);
                        unbound.push(reason);
                    }
                }
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

    /// Evaluates decoded, admitted events (in stream order).
    pub fn evaluate(&mut self, envelopes: &[Envelope]) -> Evaluation {
        let events: Vec<Event> = envelopes.iter().map(Envelope::to_function_event).collect();
        let mut evaluation = Evaluation::default();
        let mut rejected: BTreeMap<usize, String> = BTreeMap::new();
        // Per objective, the effect on each event (None: nothing to do).
        let mut effects: Vec<Vec<Option<Effect>>> = Vec::with_capacity(self.objectives.len());
        let mut versions: Vec<Arc<Value>> = Vec::with_capacity(self.objectives.len());
        for objective in &mut self.objectives {
            let result = objective.run(&events);
            let functions = Arc::new(objective.functions());
            versions.push(functions.clone());
            let mut these = vec![None; events.len()];
            match result {
                Ok(answers) => {
                    for (index, answer) in answers.into_iter().enumerate() {
                        match answer {
                            Answer::Effect(effect) => these[index] = Some(effect),
                            Answer::Nothing => {}
                            Answer::Unusable(reason) => evaluation.log.push(objective.unusable(
                                &envelopes[index],
                                &reason,
                                &functions,
                            )),
                        }
                    }
                }
                Err(_) => {
                    // A function failed on the batch: find the events it
                    // fails on, one by one; the rest go ahead.
                    for index in 0..events.len() {
                        match objective.run(std::slice::from_ref(&events[index])) {
                            Ok(mut answer) => match answer.pop() {
                                Some(Answer::Effect(effect)) => these[index] = Some(effect),
                                Some(Answer::Unusable(reason)) => evaluation.log.push(
                                    objective.unusable(&envelopes[index], &reason, &functions),
                                ),
                                _ => {}
                            },
                            Err(error) => {
                                let reason = format!(
                                    "award {}, objective {}: {error}",
                                    objective.award_id, objective.objective_id
                                );
                                rejected.entry(index).or_insert(reason);
                            }
                        }
                    }
                }
            }
            effects.push(these);
        }
        // Stream order: event by event, objective by objective.
        for (index, envelope) in envelopes.iter().enumerate() {
            if let Some(reason) = rejected.get(&index) {
                evaluation.rejected.push(Rejected {
                    index,
                    reason: reason.clone(),
                });
                evaluation.log.push(LogEntry {
                    event_id: Some(envelope.id.clone()),
                    user_id: Some(envelope.user_id.clone()),
                    award_id: None,
                    objective_id: None,
                    outcome: "rejected",
                    reason: reason.clone(),
                    functions: None,
                });
                continue;
            }
            for ((objective, these), functions) in
                self.objectives.iter().zip(&effects).zip(&versions)
            {
                if let Some(effect) = &these[index] {
                    evaluation.outcomes.push(Outcome {
                        event_id: envelope.id.clone(),
                        user_id: envelope.user_id.clone(),
                        award_id: objective.award_id.clone(),
                        objective_id: objective.objective_id.clone(),
                        content_id: envelope.content_id.clone(),
                        occurred_at: envelope.occurred_at,
                        effect: effect.clone(),
                        functions: functions.clone(),
                    });
                }
            }
        }
        evaluation
    }
}

enum Answer {
    Effect(Effect),
    Nothing,
    Unusable(String),
}

impl ObjectivePlan {
    /// The log entry for an event the rule says it cannot use.
    fn unusable(&self, envelope: &Envelope, reason: &str, functions: &Arc<Value>) -> LogEntry {
        LogEntry {
            event_id: Some(envelope.id.clone()),
            user_id: Some(envelope.user_id.clone()),
            award_id: Some(self.award_id.clone()),
            objective_id: Some(self.objective_id.clone()),
            outcome: "rejected",
            reason: format!("rule {}: {reason}", self.rule.name()),
            functions: Some(functions.clone()),
        }
    }

    /// The versions that decide this objective, for the processing log.
    fn functions(&self) -> Value {
        let mut map = serde_json::Map::new();
        for filter in &self.filters {
            let function = filter.current_function();
            map.insert(function.name.clone(), json!(function.version));
        }
        let rule = self.rule.current_function();
        map.insert(rule.name.clone(), json!(rule.version));
        Value::Object(map)
    }

    /// Filters (each sees only what the previous passed), then the rule.
    fn run(&mut self, events: &[Event]) -> Result<Vec<Answer>, FunctionError> {
        let mut passing: Vec<usize> = (0..events.len()).collect();
        // A content item that no longer passes contributes nothing now; the
        // filter that stopped it is named in the processing log.
        let mut answers: Vec<Answer> = events.iter().map(|_| Answer::Nothing).collect();
        for filter in &mut self.filters {
            if passing.is_empty() {
                break;
            }
            let answers_here = filter
                .instance()
                .matches(passing.iter().map(|&i| &events[i]))?;
            let mut excluded_by: Option<Arc<str>> = None;
            let mut still = Vec::with_capacity(passing.len());
            for (index, ok) in passing.into_iter().zip(answers_here) {
                if ok {
                    still.push(index);
                } else if events[index].content_id.is_some() {
                    let by = excluded_by
                        .get_or_insert_with(|| format!("filter {}", filter.name()).into());
                    answers[index] = Answer::Effect(Effect::Excluded { by: by.clone() });
                }
            }
            passing = still;
        }
        if passing.is_empty() {
            return Ok(answers);
        }
        let contributions = self
            .rule
            .instance()
            .contribute(passing.iter().map(|&i| &events[i]))?;
        for (index, contribution) in passing.into_iter().zip(contributions) {
            answers[index] = match contribution {
                Ok(Some(c)) => effect(&events[index], c),
                Ok(None) => Answer::Nothing,
                Err(reason) => Answer::Unusable(reason),
            };
        }
        Ok(answers)
    }
}

fn effect(event: &Event, contribution: Contribution) -> Answer {
    let mut counters = Counters::new();
    for counter in contribution.counters {
        *counters.entry(counter.name).or_insert(0) += counter.value;
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
