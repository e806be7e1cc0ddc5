"""The `filters` export of a Laurel filter built with componentize-py (the
SDK's glue: a project's code is in app.py)."""

import laurel
from laurel_resource import Resource


class Filter(Resource):
    def sources(self):
        return laurel.declared(self.function, "sources")

    def matches(self, batch):
        matches = self.function.matches
        return [bool(matches(event)) for event in laurel.events(batch)]
