// MinRating {"field": "/rating", "min": 4}: matches events whose payload has
// a number at `field` (a JSON pointer) of at least `min`.

import { ConfigError, exportFilter } from "laurel";

class MinRating {
  constructor(config) {
    this.field = config.field;
    this.min = Number(config.min);
    if (typeof this.field !== "string" || !this.field.startsWith("/")) {
      throw new ConfigError(`\`field\` ${JSON.stringify(this.field)} is not a JSON pointer (e.g. "/rating")`);
    }
    if (!Number.isFinite(this.min)) throw new ConfigError("`min` must be a number");
  }

  matches(event) {
    const value = event.number(this.field);
    return value !== undefined && value >= this.min;
  }
}

export const { filters, filterScope } = exportFilter(MinRating);
