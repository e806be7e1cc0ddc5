//! `TreeStrategy`: the award tree of the background write-up.
//!
//! A node either names an objective (`{"objective_id": "photo"}`, whose value
//! is the objective's progress counter) or groups nodes
//! (`{"operation": "sum", "strategy": [..]}`; also `min` and `max`; `sum` when
//! omitted). Any node may have a `normalization_factor` (multiplies its
//! value, e.g. metres to km) and a `goal` (caps its value: `min(value,
//! goal)`). The award's goal is the root's goal; a root without one takes it
//! from its children (sum/min/max of their goals), so every leaf must then
//! have one. The award is started once any of its objectives has a non-zero
//! counter, and completed once progress reaches the goal.

use laurel_guest::{ObjectiveState, Progress, Strategy};
use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy)]
enum Operation {
    Sum,
    Min,
    Max,
}

#[derive(Debug)]
enum Content {
    Objective(String),
    Group(Operation, Vec<Node>),
}

#[derive(Debug)]
struct Node {
    content: Content,
    goal: Option<f64>,
    factor: f64,
}

pub struct TreeStrategy {
    root: Node,
    goal: f64,
    objectives: Vec<String>,
}

/// Values are rounded to this many decimal places so that `9500 * 0.001`
/// reads 9.5, not 9.500000000000002.
const SCALE: f64 = 1e9;

fn round(value: f64) -> f64 {
    (value * SCALE).round() / SCALE
}

fn number(map: &Map<String, Value>, key: &str, at: &str) -> Result<Option<f64>, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(v) if v.is_finite() && v >= 0.0 => Ok(Some(v)),
            _ => Err(format!(
                "{at}: `{key}` must be a non-negative number, got {n}"
            )),
        },
        Some(other) => Err(format!("{at}: `{key}` must be a number, got {other}")),
    }
}

fn parse_node(value: &Value, at: &str) -> Result<Node, String> {
    let Value::Object(map) = value else {
        return Err(format!("{at}: a node must be an object, got {value}"));
    };
    for key in map.keys() {
        if ![
            "objective_id",
            "operation",
            "strategy",
            "goal",
            "normalization_factor",
        ]
        .contains(&key.as_str())
        {
            return Err(format!(
                "{at}: unknown key `{key}` (expected objective_id, operation, strategy, goal, normalization_factor)"
            ));
        }
    }
    let goal = number(map, "goal", at)?;
    let factor = number(map, "normalization_factor", at)?.unwrap_or(1.0);
    let content = match (map.get("objective_id"), map.get("strategy")) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "{at}: a node has either `objective_id` or `strategy`, not both"
            ));
        }
        (Some(Value::String(id)), None) if !id.is_empty() => {
            if map.contains_key("operation") {
                return Err(format!("{at}: an objective node has no `operation`"));
            }
            Content::Objective(id.clone())
        }
        (Some(other), None) => {
            return Err(format!(
                "{at}: `objective_id` must be a non-empty string, got {other}"
            ));
        }
        (None, Some(Value::Array(children))) => {
            let operation = match map.get("operation") {
                None => Operation::Sum,
                Some(Value::String(op)) if op == "sum" => Operation::Sum,
                Some(Value::String(op)) if op == "min" => Operation::Min,
                Some(Value::String(op)) if op == "max" => Operation::Max,
                Some(other) => {
                    return Err(format!(
                        "{at}: unknown operation {other} (expected \"sum\", \"min\" or \"max\")"
                    ));
                }
            };
            if children.is_empty() {
                return Err(format!("{at}: `strategy` is empty"));
            }
            let children = children
                .iter()
                .enumerate()
                .map(|(i, child)| parse_node(child, &format!("{at}.strategy[{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            Content::Group(operation, children)
        }
        (None, Some(other)) => {
            return Err(format!(
                "{at}: `strategy` must be a list of nodes, got {other}"
            ));
        }
        (None, None) => return Err(format!("{at}: a node needs `objective_id` or `strategy`")),
    };
    Ok(Node {
        content,
        goal,
        factor,
    })
}

fn combine(operation: Operation, values: impl Iterator<Item = f64>) -> f64 {
    match operation {
        Operation::Sum => values.sum(),
        Operation::Min => values.fold(f64::INFINITY, f64::min),
        Operation::Max => values.fold(f64::NEG_INFINITY, f64::max),
    }
}

impl Node {
    /// The most this node can reach, if bounded.
    fn goal(&self) -> Option<f64> {
        let derived = match &self.content {
            Content::Objective(_) => None,
            Content::Group(operation, children) => {
                let goals = children.iter().map(Node::goal).collect::<Option<Vec<_>>>();
                goals.map(|goals| combine(*operation, goals.into_iter()) * self.factor)
            }
        };
        match (self.goal, derived) {
            (Some(own), Some(derived)) => Some(own.min(derived)),
            (own, derived) => own.or(derived),
        }
    }

    fn value(&self, objectives: &[ObjectiveState]) -> f64 {
        let raw = match &self.content {
            Content::Objective(id) => objectives
                .iter()
                .find(|o| o.objective_id == *id)
                .map_or(0.0, |o| o.value),
            Content::Group(operation, children) => {
                combine(*operation, children.iter().map(|c| c.value(objectives)))
            }
        };
        let value = raw * self.factor;
        self.goal.map_or(value, |goal| value.min(goal))
    }

    fn collect_objectives(&self, out: &mut Vec<String>) {
        match &self.content {
            Content::Objective(id) => {
                if !out.contains(id) {
                    out.push(id.clone());
                }
            }
            Content::Group(_, children) => children.iter().for_each(|c| c.collect_objectives(out)),
        }
    }
}

impl Strategy for TreeStrategy {
    fn from_config(config: &str) -> Result<Self, String> {
        let value: Value =
            serde_json::from_str(config).map_err(|error| format!("invalid config: {error}"))?;
        let root = parse_node(&value, "strategy")?;
        let goal = root.goal().ok_or_else(|| {
            "strategy: the tree has no goal: set `goal` on the root, or on every leaf".to_string()
        })?;
        if goal <= 0.0 {
            return Err(format!("strategy: the goal must be positive, got {goal}"));
        }
        let mut objectives = Vec::new();
        root.collect_objectives(&mut objectives);
        Ok(TreeStrategy {
            root,
            goal: round(goal),
            objectives,
        })
    }

    fn objectives(&self) -> Vec<String> {
        self.objectives.clone()
    }

    fn evaluate(&self, objectives: &[ObjectiveState]) -> Result<Progress, String> {
        if let Some(bad) = objectives.iter().find(|o| !o.value.is_finite()) {
            return Err(format!(
                "objective {} has a non-finite value",
                bad.objective_id
            ));
        }
        let progress = round(self.root.value(objectives).max(0.0));
        let started = objectives.iter().any(|o| {
            self.objectives.contains(&o.objective_id)
                && (o.value != 0.0 || o.counters.iter().any(|c| c.value != 0))
        });
        Ok(Progress {
            progress,
            goal: self.goal,
            started,
            completed: progress >= self.goal,
        })
    }
}

laurel_guest::export_strategy!(TreeStrategy);
