"""The `transforms` export of a Laurel transform built with componentize-py
(the SDK's glue: a project's code is in app.py)."""

from componentize_py_types import Err, Ok
from wit_world.exports.transforms import Envelope

import laurel
from laurel_resource import Resource


class Transform(Resource):
    def apply(self, batch):
        return [self.one(record, None) for record in laurel.records(batch)]

    def one(self, record, wanted):
        """One record's answer: its events (of the `wanted` types, when
        given), or why it is malformed."""
        try:
            answer = self.function.transform(record)
        except laurel.Unusable as unusable:
            answer = unusable
        if isinstance(answer, laurel.Unusable):
            return Err(answer.reason)
        if not isinstance(answer, (list, tuple)):
            raise TypeError(
                f"transform returned a {type(answer).__name__}: return a list of laurel.Envelope or laurel.Unusable"
            )
        made = []
        for event in answer:
            if not isinstance(event, laurel.Envelope):
                raise TypeError(f"transform returned a {type(event).__name__} among its events: make laurel.Envelope")
            if wanted is not None and event.type not in wanted:
                continue
            made.append(
                Envelope(
                    id=str(event.id),
                    event_type=str(event.type),
                    user_id=str(event.user_id),
                    authorized=bool(event.authorized),
                    content_id=None if event.content_id is None else str(event.content_id),
                    status=None if event.status is None else str(event.status),
                    occurred_at=str(event.occurred_at),
                    payload=event.payload_text(),
                )
            )
        return Ok(made)
