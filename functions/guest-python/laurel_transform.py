"""What componentize-py builds for a transform
(`laurel:award/scoped-transform`): the project's app.py, its `transforms`
export, and `transform-scope`."""

from componentize_py_types import Err
from wit_world.exports.transform_scope import Answer

import app  # noqa: F401  (the project's function: it calls laurel.export)
import laurel
from transforms import Transform  # noqa: F401


class TransformScope:
    def apply_for_types(self, transform, batch, types):
        wanted = None if types is None else set(types)
        answers = []
        for index, record in enumerate(laurel.records(batch)):
            events = transform.one(record, wanted)
            if isinstance(events, Err) or events.value:
                answers.append(Answer(index=index, events=events))
        return answers
