-- What ingest could not apply, kept for replay after a fix: an event
-- dead-lettered whole (malformed, refused by a limit, a counter that would
-- overflow; award_id and objective_id null), or an event held for one
-- objective whose function failed, is quarantined or cannot be bound
-- (the other objectives applied it). The message is kept as it came
-- (key and value as bytes), with where it came from. A replay that
-- resolves a row sets replayed_at; one that fails again keeps the row
-- with the new reason.
CREATE TABLE dead_letters (
    id           bigserial   PRIMARY KEY,
    source       text        NOT NULL,
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    "offset"     bigint      NOT NULL,
    key          bytea,
    value        bytea,
    award_id     text,
    objective_id text,
    -- As read from the message, made printable: for listing and search.
    event_id     text,
    user_id      text,
    reason       text        NOT NULL,
    attempts     integer     NOT NULL DEFAULT 0,
    dead_at      timestamptz NOT NULL DEFAULT now(),
    replayed_at  timestamptz,
    -- A message redelivered by Kafka is kept once (per objective).
    UNIQUE NULLS NOT DISTINCT (topic, partition, "offset", award_id, objective_id)
);
-- What a replay walks: a source's open dead letters, oldest first.
CREATE INDEX dead_letters_open ON dead_letters (source, id) WHERE replayed_at IS NULL;
-- An award's open holds (shown on the award).
CREATE INDEX dead_letters_held ON dead_letters (award_id, objective_id) WHERE replayed_at IS NULL AND award_id IS NOT NULL;
CREATE INDEX dead_letters_time ON dead_letters (dead_at);
