"""LongReviews {"counter": "long_reviews", "min_chars": 100}: a content item
counts 1 in `counter` while it is active and its `payload.text` has at least
`min_chars` characters; an event without a content item (analytics) adds 1
when its text does."""

import laurel


class LongReviews:
    def __init__(self, config):
        self.counter = config["counter"]
        self.min_chars = int(config["min_chars"])
        if not self.counter:
            raise laurel.ConfigError("`counter` is empty")

    def contribute(self, event):
        text = event.text("/text")
        if text is None:
            return laurel.Unusable("the payload has no `text`")
        long = len(text) >= self.min_chars
        counts = laurel.content_counts(event)
        if counts is not None:
            # A content item: its current state, which replaces the last.
            return laurel.absolute({self.counter: int(counts and long)})
        # Analytics: each event adds.
        return laurel.additive({self.counter: 1}) if long else None


laurel.export(LongReviews)
