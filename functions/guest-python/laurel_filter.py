"""What componentize-py builds for a filter (`laurel:award/scoped-filter`):
the project's app.py, its `filters` export, and `filter-scope`."""

import app  # noqa: F401  (the project's function: it calls laurel.export)
import laurel
from filters import Filter  # noqa: F401


class FilterScope:
    def event_types(self, config):
        function, refused = laurel.create(config)
        if refused is not None:
            return None
        return laurel.declared(function, "event_types")
