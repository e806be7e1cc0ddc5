// WeightedGoal {"weights": {"photos": 1, "reviews": 2}, "goal": 10}: the
// award's progress is the weighted sum of its objectives' values, capped at
// `goal`.

import { ConfigError, Progress, exportStrategy } from "laurel";

class WeightedGoal {
  constructor(config) {
    this.weights = new Map(Object.entries(config.weights ?? {}).map(([id, w]) => [id, Number(w)]));
    this.goal = Number(config.goal);
    if (this.weights.size === 0) throw new ConfigError("`weights` names no objective");
    if (!(Number.isFinite(this.goal) && this.goal > 0)) throw new ConfigError(`\`goal\` must be a positive number, not ${config.goal}`);
  }

  objectives() {
    return [...this.weights.keys()].sort();
  }

  evaluate(objectives) {
    const total = objectives.reduce((sum, o) => sum + o.value * (this.weights.get(o.objectiveId) ?? 0), 0);
    return new Progress(Math.min(total, this.goal), this.goal);
  }
}

export const { strategies } = exportStrategy(WeightedGoal);
