//! Test-only strategy: progress is the first objective's value towards
//! `goal`; with `"sleep": true` in its config every evaluation sleeps for
//! an hour first (`std::thread::sleep`: a blocking host call), so the
//! sandbox can be tested with a real strategy.

use std::time::Duration;

use laurel_guest::{ObjectiveState, Progress, Strategy};
use serde::Deserialize;

#[derive(Deserialize)]
struct Config {
    objective: String,
    goal: f64,
    #[serde(default)]
    sleep: bool,
}

pub struct HostileStrategy(Config);

impl Strategy for HostileStrategy {
    fn from_config(config: &str) -> Result<Self, String> {
        serde_json::from_str(config)
            .map(HostileStrategy)
            .map_err(|e| e.to_string())
    }

    fn objectives(&self) -> Vec<String> {
        vec![self.0.objective.clone()]
    }

    fn evaluate(&self, objectives: &[ObjectiveState]) -> Result<Progress, String> {
        if self.0.sleep {
            std::thread::sleep(Duration::from_secs(3600));
        }
        let value = objectives.first().map_or(0.0, |o| o.value);
        Ok(Progress {
            progress: value.min(self.0.goal),
            goal: self.0.goal,
            started: value > 0.0,
            completed: value >= self.0.goal,
        })
    }
}

laurel_guest::export_strategy!(HostileStrategy);
