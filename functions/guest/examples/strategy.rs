//! `WeightedGoal {"weights": {"photos": 1, "reviews": 2}, "goal": 10}`: the
//! award's progress is the weighted sum of its objectives' values, capped
//! at `goal`.

use std::collections::BTreeMap;

use laurel_guest::{ObjectiveState, Progress, Strategy, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    weights: BTreeMap<String, f64>,
    goal: f64,
}

pub struct WeightedGoal(Config);

impl Strategy for WeightedGoal {
    fn from_config(config: &str) -> Result<Self, String> {
        let config: Config = parse_config(config)?;
        if config.weights.is_empty() {
            return Err("`weights` names no objective".into());
        }
        if !(config.goal.is_finite() && config.goal > 0.0) {
            return Err(format!(
                "`goal` must be a positive number, not {}",
                config.goal
            ));
        }
        Ok(WeightedGoal(config))
    }

    fn objectives(&self) -> Vec<String> {
        self.0.weights.keys().cloned().collect()
    }

    fn evaluate(&self, objectives: &[ObjectiveState]) -> Result<Progress, String> {
        let sum: f64 = objectives
            .iter()
            .map(|o| o.value * self.0.weights.get(&o.objective_id).copied().unwrap_or(0.0))
            .sum();
        let progress = sum.min(self.0.goal);
        Ok(Progress {
            progress,
            goal: self.0.goal,
            started: progress > 0.0,
            completed: progress >= self.0.goal,
        })
    }
}

laurel_guest::export_strategy!(WeightedGoal);
