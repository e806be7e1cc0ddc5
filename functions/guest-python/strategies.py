"""The `strategies` export of a Laurel strategy built with componentize-py
(the SDK's glue: a project's code is in app.py)."""

from componentize_py_types import Err, Ok
from wit_world.imports import types

import laurel
from laurel_resource import Resource


class Strategy(Resource):
    def objectives(self):
        return laurel.declared(self.function, "objectives") or []

    def evaluate(self, users):
        evaluate = self.function.evaluate
        answers = []
        for states in users:
            objectives = [
                laurel.ObjectiveState(s.objective_id, s.value, {c.name: c.value for c in s.counters})
                for s in states
            ]
            try:
                answer = evaluate(objectives)
            except laurel.Unusable as unusable:
                answer = unusable
            if isinstance(answer, laurel.Unusable):
                answers.append(Err(answer.reason))
            elif isinstance(answer, laurel.Progress):
                answers.append(
                    Ok(
                        types.Progress(
                            progress=answer.progress,
                            goal=answer.goal,
                            started=answer.started,
                            completed=answer.completed,
                        )
                    )
                )
            else:
                raise TypeError(
                    f"evaluate returned a {type(answer).__name__}: return a laurel.Progress or laurel.Unusable"
                )
        return answers
