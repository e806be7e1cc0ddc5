"""WeightedGoal {"weights": {"photos": 1, "reviews": 2}, "goal": 10}: the
award's progress is the weighted sum of its objectives' values, capped at
`goal`."""

import math

import laurel


class WeightedGoal:
    def __init__(self, config):
        self.weights = {str(k): float(v) for k, v in config["weights"].items()}
        self.goal = float(config["goal"])
        if not self.weights:
            raise laurel.ConfigError("`weights` names no objective")
        if not (math.isfinite(self.goal) and self.goal > 0):
            raise laurel.ConfigError(f"`goal` must be a positive number, not {self.goal}")

    def objectives(self):
        return sorted(self.weights)

    def evaluate(self, objectives):
        total = sum(o.value * self.weights.get(o.objective_id, 0.0) for o in objectives)
        return laurel.Progress(min(total, self.goal), self.goal)


laurel.export(WeightedGoal)
