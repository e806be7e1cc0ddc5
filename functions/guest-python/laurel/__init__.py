"""Laurel's SDK for functions written in Python.

A function is a class of one kind, exported once with :func:`export`:

- a filter has ``matches(event) -> bool``,
- a rule has ``contribute(event) -> Contribution | None | Unusable``,
- a strategy has ``objectives() -> list[str]`` and
  ``evaluate(objectives) -> Progress | Unusable``,
- a transform has ``transform(record) -> list[Envelope] | Unusable``.

Its ``__init__`` takes the config (the JSON the award or pipeline gives,
parsed once when the function is created); raising ``ValueError`` (or
:class:`ConfigError`) there refuses the config with that text. A rule's,
strategy's or transform's :class:`Unusable` answer (returned, or raised) is
the event's, user's or record's error; any other exception is a bug: the
call traps and the host reports the traceback.

The batches of the WIT interface (``laurel:award``) are read here, once,
for every function; ``componentize-py`` builds the component (see the
README of a project made by ``laurel functions new --lang python``).
"""

import json
import struct

__all__ = [
    "ConfigError",
    "Contribution",
    "Envelope",
    "Event",
    "ObjectiveState",
    "Progress",
    "Record",
    "Unusable",
    "absolute",
    "additive",
    "content_counts",
    "export",
    "rfc3339_from_millis",
]

_ABSENT = 0xFFFFFFFF
_EVENT_WORDS = 16
_FIELD_WORDS = 5
_RECORD_WORDS = 11
_HEADER_WORDS = 4
_NO_TIMESTAMP = -(2**63)


class ConfigError(ValueError):
    """A config the function refuses; the text is what the operator sees."""


class Unusable(Exception):
    """An answer that says why an event (rule), a user (strategy) or a
    record (transform) cannot be used. Return it, or raise it."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = str(reason)


def _word_pair(low, high):
    value = (low & 0xFFFFFFFF) | ((high & 0xFFFFFFFF) << 32)
    return value - (1 << 64) if value >= 1 << 63 else value


class _Text:
    """The batch's text as UTF-8 bytes: the batch's words are byte offsets."""

    __slots__ = ("raw",)

    def __init__(self, text):
        self.raw = text.encode("utf-8", "surrogatepass")

    def string(self, offset, length):
        if offset == _ABSENT:
            return None
        return self.raw[offset : offset + length].decode("utf-8", "replace")


class Event:
    """One event of a batch: the envelope's fields, and its payload's scalar
    leaves by JSON pointer (RFC 6901, e.g. ``/rating``)."""

    __slots__ = (
        "id",
        "source",
        "type",
        "user_id",
        "content_id",
        "status",
        "occurred_at_ms",
        "_text",
        "_fields",
        "_first",
        "_count",
    )

    def __init__(self, text, words, fields, at):
        w = words[at : at + _EVENT_WORDS]
        self._text = text
        self.id = text.string(w[0], w[1])
        self.source = text.string(w[2], w[3])
        self.type = text.string(w[4], w[5])
        self.user_id = text.string(w[6], w[7])
        self.content_id = text.string(w[8], w[9])
        self.status = text.string(w[10], w[11])
        self.occurred_at_ms = _word_pair(w[12], w[13])
        self._fields = fields
        self._first = w[14]
        self._count = w[15]

    def fields(self):
        """Every scalar leaf of the payload: ``(pointer, value)``, where a
        value is ``None`` (JSON null), a bool, a float or a str."""
        for n in range(self._first, self._first + self._count):
            yield self._field(n * _FIELD_WORDS)

    def _field(self, at):
        f = self._fields
        pointer = self._text.string(f[at], f[at + 1])
        kind = f[at + 2]
        if kind == 0:
            value = None
        elif kind in (1, 2):
            value = kind == 2
        elif kind == 3:
            value = struct.unpack("<d", struct.pack("<II", f[at + 3], f[at + 4]))[0]
        else:
            value = self._text.string(f[at + 3], f[at + 4])
        return pointer, value

    def _find(self, pointer):
        wanted = pointer.encode("utf-8")
        raw, f = self._text.raw, self._fields
        for n in range(self._first, self._first + self._count):
            at = n * _FIELD_WORDS
            offset, length = f[at], f[at + 1]
            if length == len(wanted) and raw[offset : offset + length] == wanted:
                return self._field(at)
        return None

    def has(self, pointer):
        """Whether the payload has a scalar at ``pointer`` (null counts)."""
        return self._find(pointer) is not None

    def field(self, pointer, default=None):
        """The scalar at ``pointer``, or ``default`` when there is none (a
        JSON null is ``None``)."""
        found = self._find(pointer)
        return default if found is None else found[1]

    def text(self, pointer):
        """The text at ``pointer``, or ``None`` (absent or not a text)."""
        value = self.field(pointer)
        return value if isinstance(value, str) else None

    def number(self, pointer):
        """The number at ``pointer``, or ``None`` (absent or not a number)."""
        value = self.field(pointer)
        return value if isinstance(value, float) else None

    def __repr__(self):
        return f"Event(id={self.id!r}, type={self.type!r}, user_id={self.user_id!r})"


def events(batch):
    """The events of a WIT ``event-batch``, in order."""
    text = _Text(batch.text)
    words, fields = batch.events, batch.fields
    return [Event(text, words, fields, at) for at in range(0, len(words), _EVENT_WORDS)]


def content_counts(event, statuses=("active",)):
    """For a content item: whether its current status is one of
    ``statuses`` (an item without a status always counts). ``None`` for an
    event that is about no content item (analytics)."""
    if event.content_id is None:
        return None
    return event.status is None or event.status in statuses


class Contribution:
    """What an event's content item contributes to an objective's counters."""

    __slots__ = ("counters", "dedup_key", "additive")

    def __init__(self, counters, dedup_key=None, additive=False):
        self.counters = dict(counters)
        self.dedup_key = dedup_key
        self.additive = additive

    def with_dedup_key(self, key):
        """The same contribution, counted once among the user's items that
        share ``key`` (two reviews of one place count once)."""
        return Contribution(self.counters, dedup_key=key, additive=self.additive)


def absolute(counters):
    """A contribution of absolute counter values for the item's current
    state (they replace the item's last contribution)."""
    return Contribution(counters)


def additive(counters):
    """A contribution of amounts to add (analytics events, which are about
    no content item)."""
    return Contribution(counters, additive=True)


class ObjectiveState:
    """One objective's state for one user, as a strategy sees it."""

    __slots__ = ("objective_id", "value", "counters")

    def __init__(self, objective_id, value, counters):
        self.objective_id = objective_id
        self.value = value
        self.counters = counters

    def __repr__(self):
        return f"ObjectiveState({self.objective_id!r}, {self.value!r})"


class Progress:
    """A user's progress towards an award. ``started`` and ``completed``
    default to ``progress > 0`` and ``progress >= goal``."""

    __slots__ = ("progress", "goal", "started", "completed")

    def __init__(self, progress, goal, started=None, completed=None):
        self.progress = float(progress)
        self.goal = float(goal)
        self.started = self.progress > 0 if started is None else bool(started)
        self.completed = self.progress >= self.goal if completed is None else bool(completed)


class Record:
    """One raw record of a transform's batch."""

    __slots__ = ("topic", "partition", "offset", "value", "key", "timestamp_ms", "_headers")

    def __init__(self, topic, partition, offset, value, key, timestamp_ms, headers):
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.value = value
        self.key = key
        self.timestamp_ms = timestamp_ms
        self._headers = headers

    def headers(self):
        """The record's headers: ``(name, value bytes)``, in order."""
        return list(self._headers)

    def header(self, name):
        """The value of the first header called ``name``, or ``None``."""
        for header, value in self._headers:
            if header == name:
                return value
        return None

    def text(self):
        """The value as text; :class:`Unusable` when it is not UTF-8."""
        try:
            return self.value.decode("utf-8")
        except UnicodeDecodeError as error:
            raise Unusable(f"the record is not UTF-8 text: {error}") from None

    def event_id(self, n=0):
        """A stable id for the ``n``-th event made from this record:
        ``topic/partition/offset`` (then ``/n``): a record read twice makes
        the same events, which ingest counts once."""
        base = f"{self.topic}/{self.partition}/{self.offset}"
        return base if n == 0 else f"{base}/{n}"


def records(batch):
    """The records of a WIT ``record-batch``, in order."""
    data = bytes(batch.bytes)
    words, heads = batch.records, batch.headers

    def piece(offset, length):
        return data[offset : offset + length]

    out = []
    for at in range(0, len(words), _RECORD_WORDS):
        w = words[at : at + _RECORD_WORDS]
        first = w[9] * _HEADER_WORDS
        headers = []
        for h in range(first, min(first + w[10] * _HEADER_WORDS, len(heads)), _HEADER_WORDS):
            name = piece(heads[h], heads[h + 1]).decode("utf-8", "replace")
            headers.append((name, piece(heads[h + 2], heads[h + 3])))
        partition = w[4] - (1 << 32) if w[4] >= 1 << 31 else w[4]
        timestamp = _word_pair(w[7], w[8])
        out.append(
            Record(
                batch.topic,
                partition,
                _word_pair(w[5], w[6]),
                piece(w[0], w[1]),
                None if w[2] == _ABSENT else piece(w[2], w[3]),
                None if timestamp == _NO_TIMESTAMP else timestamp,
                headers,
            )
        )
    return out


class Envelope:
    """An event a transform makes (its source is the pipeline's). A dict
    ``payload`` is written as JSON."""

    __slots__ = ("id", "type", "user_id", "occurred_at", "payload", "authorized", "content_id", "status")

    def __init__(
        self, id, type, user_id, occurred_at, payload=None, authorized=True, content_id=None, status=None
    ):
        self.id = id
        self.type = type
        self.user_id = user_id
        self.occurred_at = occurred_at
        self.payload = {} if payload is None else payload
        self.authorized = authorized
        self.content_id = content_id
        self.status = status

    def payload_text(self):
        if isinstance(self.payload, str):
            return self.payload
        return json.dumps(self.payload, separators=(",", ":"))


def rfc3339_from_millis(ms):
    """``2026-12-01T10:00:00.250Z`` for ``ms`` milliseconds since the Unix
    epoch (UTC; the milliseconds only when there are some)."""
    seconds, millis = divmod(int(ms), 1000)
    days, second_of_day = divmod(seconds, 86400)
    z = days + 719468
    era, day_of_era = divmod(z, 146097)
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    mp = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = year_of_era + era * 400 + (1 if month <= 2 else 0)
    hour, rest = divmod(second_of_day, 3600)
    minute, second = divmod(rest, 60)
    time = f"{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}"
    return f"{time}.{millis:03}Z" if millis else f"{time}Z"


_exported = {}


def export(cls):
    """Exports ``cls`` as this component's function (one per component);
    its kind is the one the build names. Returns ``cls``, so it can be used
    as a decorator."""
    _exported["function"] = cls
    return cls


def exported():
    """The class given to :func:`export` (by the project's ``app`` module)."""
    import app  # noqa: F401  (the project's module: it calls export)

    try:
        return _exported["function"]
    except KeyError:
        raise RuntimeError("app.py exports no function: end it with laurel.export(YourClass)") from None


def declared(function, method):
    """The names `function.method()` declares (sources, event types,
    objectives), or ``None`` when the class does not define the method."""
    declare = getattr(function, method, None)
    if declare is None:
        return None
    names = declare()
    return None if names is None else [str(name) for name in names]


def whole(value, name):
    """A counter's value as the host takes it: a whole number."""
    if isinstance(value, bool):
        return int(value)
    if not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise TypeError(f"counter {name!r} is {value!r}: counter values are whole numbers (round them)")
    if not -(2**63) <= value < 2**63:
        raise OverflowError(f"counter {name!r} is {value}, outside a signed 64-bit integer")
    return value


def create(config):
    """The exported class made from the config text, or the refusal's text."""
    try:
        parsed = json.loads(config)
    except ValueError as error:
        return None, f"the config is not JSON: {error}"
    try:
        return exported()(parsed), None
    except ValueError as error:
        return None, str(error)
    except (KeyError, TypeError, AttributeError) as error:
        return None, f"invalid config: {type(error).__name__}: {error}"
