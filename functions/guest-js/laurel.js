// Laurel's SDK for functions written in JavaScript.
//
// A function is a class of one kind, exported with the export function of
// its kind, whose result the module exports as is:
//
//   export const { filters, filterScope } = exportFilter(MinRating);
//   export const { rules } = exportRule(LongReviews);
//   export const { strategies } = exportStrategy(WeightedGoal);
//   export const { transforms, transformScope } = exportTransform(TripLines);
//
// - a filter has matches(event) -> boolean,
// - a rule has contribute(event) -> Contribution | null | Unusable,
// - a strategy has objectives() -> string[] and
//   evaluate(objectives) -> Progress | Unusable,
// - a transform has transform(record) -> Envelope[] | Unusable.
//
// Its constructor takes the config (the JSON the award or pipeline gives,
// parsed once when the function is created); throwing there refuses the
// config with the error's message. An Unusable answer (returned, or
// thrown) is the event's, user's or record's error; anything else thrown
// is a bug: the call traps and the host reports it.
//
// The batches of the WIT interface (laurel:award) are read here, once, for
// every function; jco builds the component (see the README of a project
// made by `laurel functions new --lang js`).

const ABSENT = 0xffffffff;
const EVENT_WORDS = 16;
const FIELD_WORDS = 5;
const RECORD_WORDS = 11;
const HEADER_WORDS = 4;

/** A config the function refuses; the message is what the operator sees. */
export class ConfigError extends Error {}

/** Why an event (rule), a user (strategy) or a record (transform) cannot be
 * used. Return it, or throw it. */
export class Unusable extends Error {
  constructor(reason) {
    super(String(reason));
    this.reason = String(reason);
  }
}

// Words cross as u32; some engines hand over those of 2^31 and more as
// negative numbers.
const u32 = (w) => w >>> 0;

function wordPair(low, high) {
  const value = BigInt(u32(low)) | (BigInt(u32(high)) << 32n);
  return Number(BigInt.asIntN(64, value));
}

function f64(low, high) {
  const view = new DataView(new ArrayBuffer(8));
  view.setUint32(0, u32(low), true);
  view.setUint32(4, u32(high), true);
  return view.getFloat64(0, true);
}

/** UTF-8 bytes (an array of numbers) as text; a bad sequence becomes
 * U+FFFD, or, when `strict`, makes the answer null. */
export function utf8Decode(bytes, strict = false) {
  const end = bytes.length;
  let out = "";
  let i = 0;
  while (i < end) {
    const b = bytes[i];
    let code = 0xfffd;
    let size = 1;
    if (b < 0x80) {
      code = b;
    } else if (b >= 0xc2 && b < 0xe0 && i + 1 < end && (bytes[i + 1] & 0xc0) === 0x80) {
      code = ((b & 0x1f) << 6) | (bytes[i + 1] & 0x3f);
      size = 2;
    } else if (b >= 0xe0 && b < 0xf0 && i + 2 < end && (bytes[i + 1] & 0xc0) === 0x80 && (bytes[i + 2] & 0xc0) === 0x80) {
      const c = ((b & 0x0f) << 12) | ((bytes[i + 1] & 0x3f) << 6) | (bytes[i + 2] & 0x3f);
      if (c >= 0x800 && (c < 0xd800 || c > 0xdfff)) {
        code = c;
        size = 3;
      }
    } else if (b >= 0xf0 && b < 0xf5 && i + 3 < end && (bytes[i + 1] & 0xc0) === 0x80 && (bytes[i + 2] & 0xc0) === 0x80 && (bytes[i + 3] & 0xc0) === 0x80) {
      const c = ((b & 0x07) << 18) | ((bytes[i + 1] & 0x3f) << 12) | ((bytes[i + 2] & 0x3f) << 6) | (bytes[i + 3] & 0x3f);
      if (c >= 0x10000 && c <= 0x10ffff) {
        code = c;
        size = 4;
      }
    }
    if (code === 0xfffd && size === 1 && strict) return null;
    out += String.fromCodePoint(code);
    i += size;
  }
  return out;
}

/** The batch's text, read by byte offsets (the batch's words). */
function textReader(text) {
  // ASCII text: a byte offset is a character index.
  if (/^[\x00-\x7f]*$/.test(text)) {
    return (offset, length) => (u32(offset) === ABSENT ? undefined : text.slice(offset, offset + length));
  }
  // Otherwise the UTF-16 index of every byte offset.
  const index = [];
  for (let i = 0; i < text.length; i++) {
    const code = text.codePointAt(i);
    const size = code < 0x80 ? 1 : code < 0x800 ? 2 : code < 0x10000 ? 3 : 4;
    for (let k = 0; k < size; k++) index.push(i);
    if (code >= 0x10000) i++;
  }
  index.push(text.length);
  return (offset, length) => {
    if (u32(offset) === ABSENT) return undefined;
    return text.slice(index[offset], index[offset + length]);
  };
}

/** One event of a batch: the envelope's fields, and its payload's scalar
 * leaves by JSON pointer (RFC 6901, e.g. "/rating"). */
export class Event {
  constructor(read, words, fields, at) {
    this.id = read(words[at], words[at + 1]);
    this.source = read(words[at + 2], words[at + 3]);
    this.type = read(words[at + 4], words[at + 5]);
    this.userId = read(words[at + 6], words[at + 7]);
    this.contentId = read(words[at + 8], words[at + 9]);
    this.status = read(words[at + 10], words[at + 11]);
    this.occurredAtMs = wordPair(words[at + 12], words[at + 13]);
    this._read = read;
    this._fields = fields;
    this._first = u32(words[at + 14]);
    this._count = u32(words[at + 15]);
  }

  _field(at) {
    const f = this._fields;
    const pointer = this._read(f[at], f[at + 1]);
    const kind = u32(f[at + 2]);
    let value = null;
    if (kind === 1 || kind === 2) value = kind === 2;
    else if (kind === 3) value = f64(f[at + 3], f[at + 4]);
    else if (kind === 4) value = this._read(f[at + 3], f[at + 4]);
    return [pointer, value];
  }

  /** Every scalar leaf of the payload: [pointer, value], where a value is
   * null, a boolean, a number or a string. */
  fields() {
    const all = [];
    for (let n = this._first; n < this._first + this._count; n++) all.push(this._field(n * FIELD_WORDS));
    return all;
  }

  _find(pointer) {
    for (let n = this._first; n < this._first + this._count; n++) {
      const at = n * FIELD_WORDS;
      if (this._read(this._fields[at], this._fields[at + 1]) === pointer) return this._field(at);
    }
    return undefined;
  }

  /** Whether the payload has a scalar at `pointer` (null counts). */
  has(pointer) {
    return this._find(pointer) !== undefined;
  }

  /** The scalar at `pointer`, or undefined when there is none (a JSON null
   * is null). */
  field(pointer) {
    const found = this._find(pointer);
    return found === undefined ? undefined : found[1];
  }

  /** The text at `pointer`, or undefined (absent or not a text). */
  text(pointer) {
    const value = this.field(pointer);
    return typeof value === "string" ? value : undefined;
  }

  /** The number at `pointer`, or undefined (absent or not a number). */
  number(pointer) {
    const value = this.field(pointer);
    return typeof value === "number" ? value : undefined;
  }
}

/** The events of a WIT event-batch, in order. */
export function events(batch) {
  const read = textReader(batch.text);
  const words = batch.events;
  const all = [];
  for (let at = 0; at + EVENT_WORDS <= words.length; at += EVENT_WORDS) all.push(new Event(read, words, batch.fields, at));
  return all;
}

/** For a content item: whether its current status is one of `statuses` (an
 * item without a status always counts); undefined for an event about no
 * content item (analytics). */
export function contentCounts(event, statuses = ["active"]) {
  if (event.contentId === undefined) return undefined;
  return event.status === undefined || statuses.includes(event.status);
}

/** What an event's content item contributes to an objective's counters. */
export class Contribution {
  constructor(counters, { dedupKey = undefined, additive = false } = {}) {
    this.counters = { ...counters };
    this.dedupKey = dedupKey;
    this.additive = additive;
  }

  /** The same contribution, counted once among the user's items that
   * share `key` (two reviews of one place count once). */
  withDedupKey(key) {
    return new Contribution(this.counters, { dedupKey: String(key), additive: this.additive });
  }
}

/** Absolute counter values for the item's current state (they replace the
 * item's last contribution). */
export const absolute = (counters) => new Contribution(counters);

/** Amounts to add (analytics events, which are about no content item). */
export const additive = (counters) => new Contribution(counters, { additive: true });

/** A user's progress towards an award; started and completed default to
 * progress > 0 and progress >= goal. */
export class Progress {
  constructor(progress, goal, { started = undefined, completed = undefined } = {}) {
    this.progress = Number(progress);
    this.goal = Number(goal);
    this.started = started === undefined ? this.progress > 0 : Boolean(started);
    this.completed = completed === undefined ? this.progress >= this.goal : Boolean(completed);
  }
}

/** One raw record of a transform's batch. */
export class Record {
  constructor(topic, partition, offset, value, key, timestampMs, headers) {
    this.topic = topic;
    this.partition = partition;
    this.offset = offset;
    this.value = value;
    this.key = key;
    this.timestampMs = timestampMs;
    this._headers = headers;
  }

  /** The record's headers: [name, value bytes], in order. */
  headers() {
    return this._headers.slice();
  }

  /** The value of the first header called `name`, or undefined. */
  header(name) {
    const found = this._headers.find(([header]) => header === name);
    return found === undefined ? undefined : found[1];
  }

  /** The value as text; Unusable when it is not UTF-8. */
  text() {
    const text = utf8Decode(this.value, true);
    if (text === null) throw new Unusable("the record is not UTF-8 text");
    return text;
  }

  /** A stable id for the n-th event made from this record:
   * topic/partition/offset (then /n): a record read twice makes the same
   * events, which ingest counts once. */
  eventId(n = 0) {
    const base = `${this.topic}/${this.partition}/${this.offset}`;
    return n === 0 ? base : `${base}/${n}`;
  }
}

/** The records of a WIT record-batch, in order. */
export function records(batch) {
  const bytes = batch.bytes;
  const words = batch.records;
  const heads = batch.headers;
  const piece = (offset, length) => bytes.slice(u32(offset), u32(offset) + u32(length));
  const all = [];
  for (let at = 0; at + RECORD_WORDS <= words.length; at += RECORD_WORDS) {
    const first = u32(words[at + 9]) * HEADER_WORDS;
    const end = Math.min(first + u32(words[at + 10]) * HEADER_WORDS, heads.length);
    const headers = [];
    for (let h = first; h < end; h += HEADER_WORDS) {
      headers.push([utf8Decode(piece(heads[h], heads[h + 1])), piece(heads[h + 2], heads[h + 3])]);
    }
    const timestamp = BigInt.asIntN(64, BigInt(u32(words[at + 7])) | (BigInt(u32(words[at + 8])) << 32n));
    all.push(
      new Record(
        batch.topic,
        words[at + 4] | 0,
        wordPair(words[at + 5], words[at + 6]),
        piece(words[at], words[at + 1]),
        u32(words[at + 2]) === ABSENT ? undefined : piece(words[at + 2], words[at + 3]),
        timestamp === -(2n ** 63n) ? undefined : Number(timestamp),
        headers,
      ),
    );
  }
  return all;
}

/** An event a transform makes (its source is the pipeline's). An object
 * payload is written as JSON. */
export class Envelope {
  constructor({ id, type, userId, occurredAt, payload = {}, authorized = true, contentId = undefined, status = undefined }) {
    Object.assign(this, { id, type, userId, occurredAt, payload, authorized, contentId, status });
  }
}

/** "2026-12-01T10:00:00.250Z" for `ms` milliseconds since the Unix epoch
 * (UTC; the milliseconds only when there are some). */
export function rfc3339FromMillis(ms) {
  const date = new Date(Number(ms));
  const text = date.toISOString();
  return date.getUTCMilliseconds() === 0 ? text.replace(".000Z", "Z") : text;
}

function create(Function, config) {
  let parsed;
  try {
    parsed = JSON.parse(config);
  } catch (error) {
    throw `the config is not JSON: ${error.message}`;
  }
  try {
    return new Function(parsed);
  } catch (error) {
    throw error instanceof Error ? error.message : String(error);
  }
}

/** What the four exported resources share: the project's class made from
 * the config once (`create` throws the refusal, the WIT's error). */
function resource(Function) {
  return class {
    constructor(function_) {
      this.function = function_;
    }
    static create(config) {
      return new this(create(Function, config));
    }
  };
}

function declared(function_, method) {
  if (typeof function_[method] !== "function") return undefined;
  const names = function_[method]();
  return names === undefined || names === null ? undefined : Array.from(names, String);
}

function unusable(answer) {
  return answer instanceof Unusable ? { tag: "err", val: answer.reason } : undefined;
}

function answerOf(call) {
  try {
    return call();
  } catch (error) {
    if (error instanceof Unusable) return error;
    throw error;
  }
}

function whole(value, name) {
  if (typeof value === "boolean") return value ? 1 : 0;
  if (typeof value === "bigint") return value;
  if (!Number.isInteger(value)) throw new TypeError(`counter "${name}" is ${value}: counter values are whole numbers (round them)`);
  return value;
}

/** The `filters` and `filterScope` exports of a filter class. */
export function exportFilter(Function) {
  class Filter extends resource(Function) {
    sources() {
      return declared(this.function, "sources");
    }
    matches(batch) {
      return events(batch).map((event) => Boolean(this.function.matches(event)));
    }
  }
  return {
    filters: { Filter },
    filterScope: {
      eventTypes(config) {
        try {
          return declared(create(Function, config), "eventTypes");
        } catch {
          return undefined;
        }
      },
    },
  };
}

/** The `rules` export of a rule class. */
export function exportRule(Function) {
  class Rule extends resource(Function) {
    contribute(batch) {
      return events(batch).map((event) => {
        const answer = answerOf(() => this.function.contribute(event));
        if (answer === undefined || answer === null) return { tag: "ok", val: undefined };
        const refused = unusable(answer);
        if (refused) return refused;
        if (!(answer instanceof Contribution)) {
          throw new TypeError("contribute returned something else than a Contribution (absolute, additive), null or Unusable");
        }
        return {
          tag: "ok",
          val: {
            counters: Object.entries(answer.counters).map(([name, value]) => ({ name, value: whole(value, name) })),
            dedupKey: answer.dedupKey,
            additive: Boolean(answer.additive),
          },
        };
      });
    }
  }
  return { rules: { Rule } };
}

/** The `strategies` export of a strategy class. */
export function exportStrategy(Function) {
  class Strategy extends resource(Function) {
    objectives() {
      return declared(this.function, "objectives") ?? [];
    }
    evaluate(users) {
      return users.map((states) => {
        const objectives = states.map((s) => ({
          objectiveId: s.objectiveId,
          value: s.value,
          counters: Object.fromEntries(s.counters.map((c) => [c.name, Number(c.value)])),
        }));
        const answer = answerOf(() => this.function.evaluate(objectives));
        const refused = unusable(answer);
        if (refused) return refused;
        if (!(answer instanceof Progress)) throw new TypeError("evaluate returned something else than a Progress or Unusable");
        return { tag: "ok", val: { progress: answer.progress, goal: answer.goal, started: answer.started, completed: answer.completed } };
      });
    }
  }
  return { strategies: { Strategy } };
}

/** The `transforms` and `transformScope` exports of a transform class. */
export function exportTransform(Function) {
  class Transform extends resource(Function) {
    apply(batch) {
      return records(batch).map((record) => this.one(record, undefined));
    }
    one(record, wanted) {
      const answer = answerOf(() => this.function.transform(record));
      const refused = unusable(answer);
      if (refused) return refused;
      if (!Array.isArray(answer)) throw new TypeError("transform returned something else than an array of Envelope or Unusable");
      const made = [];
      for (const event of answer) {
        if (!(event instanceof Envelope)) throw new TypeError("transform returned something else than an Envelope among its events");
        if (wanted !== undefined && !wanted.has(event.type)) continue;
        made.push({
          id: String(event.id),
          eventType: String(event.type),
          userId: String(event.userId),
          authorized: Boolean(event.authorized),
          contentId: event.contentId === undefined || event.contentId === null ? undefined : String(event.contentId),
          status: event.status === undefined || event.status === null ? undefined : String(event.status),
          occurredAt: String(event.occurredAt),
          payload: typeof event.payload === "string" ? event.payload : JSON.stringify(event.payload),
        });
      }
      return { tag: "ok", val: made };
    }
  }
  return {
    transforms: { Transform },
    transformScope: {
      applyForTypes(transform, batch, types) {
        const wanted = types === undefined || types === null ? undefined : new Set(types);
        const answers = [];
        records(batch).forEach((record, index) => {
          const events = transform.one(record, wanted);
          if (events.tag === "err" || events.val.length > 0) answers.push({ index, events });
        });
        return answers;
      },
    },
  };
}
