"""What componentize-py builds for a strategy (`laurel:award/strategy`):
the project's app.py and its `strategies` export."""

import app  # noqa: F401  (the project's function: it calls laurel.export)
from strategies import Strategy  # noqa: F401
