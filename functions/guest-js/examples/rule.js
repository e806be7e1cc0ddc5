// LongReviews {"counter": "long_reviews", "min_chars": 100}: a content item
// counts 1 in `counter` while it is active and its `payload.text` has at
// least `min_chars` characters; an event without a content item (analytics)
// adds 1 when its text does.

import { ConfigError, Unusable, absolute, additive, contentCounts, exportRule } from "laurel";

class LongReviews {
  constructor(config) {
    this.counter = config.counter;
    this.minChars = Number(config.min_chars);
    if (typeof this.counter !== "string" || this.counter === "") throw new ConfigError("`counter` is empty");
  }

  contribute(event) {
    const text = event.text("/text");
    if (text === undefined) return new Unusable("the payload has no `text`");
    const long = [...text].length >= this.minChars;
    const counts = contentCounts(event);
    // A content item: its current state, which replaces the last.
    if (counts !== undefined) return absolute({ [this.counter]: counts && long ? 1 : 0 });
    // Analytics: each event adds.
    return long ? additive({ [this.counter]: 1 }) : null;
  }
}

export const { rules } = exportRule(LongReviews);
