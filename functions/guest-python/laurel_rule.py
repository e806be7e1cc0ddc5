"""What componentize-py builds for a rule (`laurel:award/rule`): the
project's app.py and its `rules` export."""

import app  # noqa: F401  (the project's function: it calls laurel.export)
from rules import Rule  # noqa: F401
