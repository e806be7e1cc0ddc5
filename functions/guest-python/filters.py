"""The `filters` export of a Laurel filter built with componentize-py (the
SDK's glue: a project's code is in app.py)."""

from componentize_py_types import Err

import laurel


class Filter:
    def __init__(self, function):
        self.function = function

    @classmethod
    def create(cls, config):
        function, refused = laurel.create(config)
        if refused is not None:
            raise Err(refused)
        return cls(function)

    def sources(self):
        return laurel.declared(self.function, "sources")

    def matches(self, batch):
        matches = self.function.matches
        return [bool(matches(event)) for event in laurel.events(batch)]
