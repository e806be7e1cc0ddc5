-- The event pipeline: award definitions, sources, users, per-user objective
-- counters, per-content contributions, the processing log.

-- Every user_objective change draws its version from this one sequence.
CREATE SEQUENCE laurel_version AS bigint;

-- The current definition of each award (the contract's JSON, as applied).
CREATE TABLE awards (
    id         text        PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    version    integer     NOT NULL CHECK (version > 0),
    definition jsonb       NOT NULL,
    enabled    boolean     NOT NULL DEFAULT true,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Every version of every award; `definition` is null for a deletion.
CREATE TABLE award_history (
    award_id   text        NOT NULL,
    version    integer     NOT NULL,
    definition jsonb,
    changed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (award_id, version)
);

-- Sources read from Kafka: `events.<name>` unless `topic` says otherwise.
-- Registered when an award names them (SourceFilter) or by hand.
CREATE TABLE sources (
    name       text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    topic      text        NOT NULL,
    paused     boolean     NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Users who get no awards. A user who is not here is active; whether a
-- user is logged in comes with each event (`authorized`).
CREATE TABLE users (
    user_id    text        PRIMARY KEY,
    state      text        NOT NULL CHECK (state IN ('active', 'banned', 'deleted')),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One objective's counters for one user. `version` comes from
-- laurel_version on every change.
CREATE TABLE user_objective (
    user_id      text        NOT NULL,
    award_id     text        NOT NULL,
    objective_id text        NOT NULL,
    counters     jsonb       NOT NULL DEFAULT '{}',
    version      bigint      NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, award_id, objective_id)
);

-- Each content item (per source): the last event applied to it (an event
-- older than it, or the same event again, changes nothing) and what it
-- currently contributes to each objective, in one row:
-- shares = {"<award>/<objective>": {"c": {counter: value}, "k": dedup key}}.
CREATE TABLE content_items (
    user_id     text        NOT NULL,
    source      text        NOT NULL,
    content_id  text        NOT NULL,
    occurred_at timestamptz NOT NULL,
    event_id    text        NOT NULL,
    shares      jsonb       NOT NULL DEFAULT '{}',
    PRIMARY KEY (user_id, source, content_id)
);

-- Which items share a de-duplication key (a user's reviews of one object),
-- so a group's members can be found; only for contributions with a key.
CREATE TABLE dedup_members (
    user_id      text NOT NULL,
    award_id     text NOT NULL,
    objective_id text NOT NULL,
    dedup_key    text NOT NULL,
    source       text NOT NULL,
    content_id   text NOT NULL,
    PRIMARY KEY (user_id, award_id, objective_id, dedup_key, source, content_id)
);

-- Additive (analytics) events already applied: re-delivery adds nothing.
-- Kept for the retention period (see processing_log).
CREATE TABLE applied_events (
    source     text        NOT NULL,
    event_id   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, event_id)
);
CREATE INDEX applied_events_time ON applied_events (applied_at);

-- The ledger: which event changed which counters by how much under which
-- function versions; and which events were skipped or rejected, and why.
CREATE TABLE processing_log (
    id           bigserial   PRIMARY KEY,
    logged_at    timestamptz NOT NULL DEFAULT now(),
    source       text        NOT NULL,
    event_id     text,
    user_id      text,
    award_id     text,
    objective_id text,
    outcome      text        NOT NULL CHECK (outcome IN ('applied', 'skipped', 'rejected')),
    reason       text,
    deltas       jsonb,
    functions    jsonb
);
CREATE INDEX processing_log_user ON processing_log (user_id, id DESC);
CREATE INDEX processing_log_time ON processing_log (logged_at);
