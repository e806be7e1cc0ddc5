"""MinRating {"field": "/rating", "min": 4}: matches events whose payload
has a number at `field` (a JSON pointer) of at least `min`."""

import laurel


class MinRating:
    def __init__(self, config):
        self.field = config["field"]
        self.min = float(config["min"])
        if not self.field.startswith("/"):
            raise laurel.ConfigError(f'`field` {self.field!r} is not a JSON pointer (e.g. "/rating")')

    def matches(self, event):
        value = event.number(self.field)
        return value is not None and value >= self.min


laurel.export(MinRating)
