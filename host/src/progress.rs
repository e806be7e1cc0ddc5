//! Award progress from counters: an award's strategy bound and evaluated
//! on users' objective states ([`AwardPlan`]), and what new progress means
//! for completion ([`decide`]). Shared by the awards worker, the public
//! API (progress before a user starts) and the shadow diff.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::definitions::{AwardDefinition, Revocation};
use crate::registry::{Binding, Registry};
use crate::runtime::{Counter, ObjectiveState, Progress, StrategyInstance};
use crate::store::{AchieveState, ChangedAward, Counters, Transition, TransitionKind};

/// One award as the worker computes it.
pub struct AwardPlan {
    pub version: i32,
    pub revocation: Revocation,
    /// Objective ids with their progress counters, in definition order.
    pub objectives: Vec<(String, String)>,
    pub strategy: Result<Binding<StrategyInstance>, String>,
}

impl AwardPlan {
    pub fn new(definition: &AwardDefinition, version: i32, registry: &Arc<Registry>) -> AwardPlan {
        let strategy = registry
            .bind_strategy(
                &definition.strategy_function,
                &definition.strategy.to_string(),
            )
            .map_err(|error| format!("strategy {}: {error}", definition.strategy_function));
        AwardPlan {
            version,
            revocation: definition.revocation,
            objectives: definition
                .objectives
                .iter()
                .map(|o| (o.id.clone(), o.progress_counter.clone()))
                .collect(),
            strategy,
        }
    }

    /// The strategy's view of one user's objectives.
    pub fn states(&self, change: &ChangedAward) -> Vec<ObjectiveState> {
        self.states_of(|id| {
            change
                .objectives
                .iter()
                .find(|o| o.objective_id == id)
                .map(|o| &o.counters)
        })
    }

    /// The strategy's view of objectives whose counters `counters_of`
    /// gives by objective id (none: no counters yet).
    pub fn states_of<'c>(
        &self,
        counters_of: impl Fn(&str) -> Option<&'c Counters>,
    ) -> Vec<ObjectiveState> {
        self.objectives
            .iter()
            .map(|(id, progress_counter)| {
                let counters = counters_of(id);
                ObjectiveState {
                    objective_id: id.clone(),
                    value: counters
                        .and_then(|c| c.get(progress_counter))
                        .copied()
                        .unwrap_or(0) as f64,
                    counters: counters
                        .into_iter()
                        .flatten()
                        .map(|(name, value)| Counter {
                            name: name.clone(),
                            value: *value,
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// Progress per user, or the reason there is none. A function failure
    /// on the batch is retried user by user, so one user's bad input costs
    /// only that user's computation.
    pub fn evaluate(&mut self, users: &[Vec<ObjectiveState>]) -> Vec<Result<Progress, String>> {
        let strategy = match &mut self.strategy {
            Ok(strategy) => strategy,
            Err(error) => return vec![Err(error.clone()); users.len()],
        };
        let name = strategy.name().to_string();
        match strategy.instance().evaluate(users) {
            Ok(answers) => answers
                .into_iter()
                .map(|a| a.map_err(|reason| format!("strategy {name}: {reason}")))
                .collect(),
            Err(_) if users.len() > 1 => users
                .iter()
                .map(
                    |user| match strategy.instance().evaluate(std::slice::from_ref(user)) {
                        Ok(mut answers) => answers
                            .pop()
                            .unwrap_or_else(|| Err("no answer".into()))
                            .map_err(|reason| format!("strategy {name}: {reason}")),
                        Err(error) => Err(error.to_string()),
                    },
                )
                .collect(),
            Err(error) => vec![Err(error.to_string())],
        }
    }
}

/// An award's progress for users with these counters (objective id ->
/// counters), as the worker computes it with `registry`'s strategy.
/// Synchronous CPU work: call it from a blocking thread.
pub fn progress_of(
    definition: &AwardDefinition,
    registry: &Arc<Registry>,
    users: &[BTreeMap<String, Counters>],
) -> Vec<Result<Progress, String>> {
    let mut plan = AwardPlan::new(definition, 0, registry);
    let states: Vec<Vec<ObjectiveState>> = users
        .iter()
        .map(|objectives| plan.states_of(|id| objectives.get(id)))
        .collect();
    if states.is_empty() {
        return Vec::new();
    }
    plan.evaluate(&states)
}

/// An award's progress for a user who has no counters for it yet (what
/// an app shows before the user starts): the award's strategy evaluated on
/// empty objectives. Synchronous CPU work: call it from a blocking thread.
pub fn progress_at_zero(
    definition: &AwardDefinition,
    registry: &Arc<Registry>,
) -> Result<Progress, String> {
    let mut plan = AwardPlan::new(definition, 0, registry);
    let empty: Vec<ObjectiveState> = plan
        .objectives
        .iter()
        .map(|(id, _)| ObjectiveState {
            objective_id: id.clone(),
            value: 0.0,
            counters: Vec::new(),
        })
        .collect();
    plan.evaluate(&[empty])
        .pop()
        .unwrap_or_else(|| Err("the strategy gave no answer".into()))
}

/// What the new progress means for completion: the state to store and the
/// transition to record, if any.
pub fn decide(
    previous: Option<&AchieveState>,
    progress: &Progress,
    revocation: Revocation,
    now: DateTime<Utc>,
) -> (bool, Option<DateTime<Utc>>, Option<Transition>) {
    let was = previous.is_some_and(|s| s.completed);
    let since = previous.and_then(|s| s.completed_at);
    match (was, progress.completed, revocation) {
        (false, true, _) => (
            true,
            Some(now),
            Some(Transition {
                kind: TransitionKind::Completed,
                reason: None,
            }),
        ),
        (true, true, _) | (true, false, Revocation::Sticky) => (true, since, None),
        (true, false, Revocation::Live) => (
            false,
            None,
            Some(Transition {
                kind: TransitionKind::Revoked,
                reason: Some(format!(
                    "progress {} fell below the goal {}",
                    progress.progress, progress.goal
                )),
            }),
        ),
        (false, false, _) => (false, None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(progress: f64, goal: f64) -> Progress {
        Progress {
            progress,
            goal,
            started: progress > 0.0,
            completed: progress >= goal,
        }
    }

    fn completed_state(at: DateTime<Utc>) -> AchieveState {
        AchieveState {
            award_version: 1,
            progress: 5.0,
            goal: 5.0,
            started: true,
            completed: true,
            completed_at: Some(at),
            version: 1,
            error: None,
        }
    }

    #[test]
    fn reaching_the_goal_completes_once() {
        let now = Utc::now();
        let (completed, at, transition) = decide(None, &progress(5.0, 5.0), Revocation::Live, now);
        assert!(completed);
        assert_eq!(at, Some(now));
        assert_eq!(transition.map(|t| t.kind), Some(TransitionKind::Completed));

        let earlier = now - chrono::Duration::hours(1);
        let previous = completed_state(earlier);
        let (completed, at, transition) =
            decide(Some(&previous), &progress(6.0, 5.0), Revocation::Live, now);
        assert!(completed);
        assert_eq!(at, Some(earlier), "completed_at is set once");
        assert!(transition.is_none());
    }

    #[test]
    fn live_award_is_revoked_below_its_goal_with_a_reason() {
        let previous = completed_state(Utc::now());
        let (completed, at, transition) = decide(
            Some(&previous),
            &progress(4.0, 5.0),
            Revocation::Live,
            Utc::now(),
        );
        assert!(!completed);
        assert_eq!(at, None);
        let transition = transition.expect("a revocation");
        assert_eq!(transition.kind, TransitionKind::Revoked);
        assert_eq!(
            transition.reason.as_deref(),
            Some("progress 4 fell below the goal 5")
        );
    }

    #[test]
    fn sticky_award_stays_complete() {
        let at = Utc::now();
        let previous = completed_state(at);
        let (completed, completed_at, transition) = decide(
            Some(&previous),
            &progress(0.0, 5.0),
            Revocation::Sticky,
            Utc::now(),
        );
        assert!(completed);
        assert_eq!(completed_at, Some(at));
        assert!(transition.is_none());
    }
}
