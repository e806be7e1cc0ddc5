"""The `rules` export of a Laurel rule built with componentize-py (the
SDK's glue: a project's code is in app.py)."""

from componentize_py_types import Err, Ok
from wit_world.imports import types

import laurel
from laurel_resource import Resource


class Rule(Resource):
    def contribute(self, batch):
        contribute = self.function.contribute
        answers = []
        for event in laurel.events(batch):
            try:
                answer = contribute(event)
            except laurel.Unusable as unusable:
                answer = unusable
            if answer is None:
                answers.append(Ok(None))
            elif isinstance(answer, laurel.Unusable):
                answers.append(Err(answer.reason))
            elif isinstance(answer, laurel.Contribution):
                counters = [
                    types.Counter(name=str(name), value=laurel.whole(value, name))
                    for name, value in answer.counters.items()
                ]
                answers.append(
                    Ok(
                        types.Contribution(
                            counters=counters,
                            dedup_key=None if answer.dedup_key is None else str(answer.dedup_key),
                            additive=bool(answer.additive),
                        )
                    )
                )
            else:
                raise TypeError(
                    f"contribute returned a {type(answer).__name__}: return a laurel.Contribution "
                    "(laurel.absolute, laurel.additive), None or laurel.Unusable"
                )
        return answers
