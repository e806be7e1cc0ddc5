-- Awards that credit the past. Each content item keeps the last event
-- applied to it, as it came (NULL for items applied before this migration:
-- what a backfill cannot recover, and says so).
ALTER TABLE content_items ADD COLUMN event bytea;

-- The analytics events an award that credits the past has counted, by id
-- (kept as long as applied_events): a backfill reading them again from
-- Kafka counts each once.
CREATE TABLE award_events (
    award_id   text COLLATE "C" NOT NULL,
    source     text COLLATE "C" NOT NULL,
    event_id   text COLLATE "C" NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (award_id, source, event_id)
);
CREATE INDEX award_events_time ON award_events (applied_at);

-- A backfill from history: an award's objectives evaluated over the stored
-- items of its sources, walked in key order, then over the analytics
-- events its sources' topics retain, up to what ingest had committed. One row per award; asking
-- again starts it over (the contributions are absolute, so a second pass
-- changes nothing that the first got right). A worker holds the lease
-- while it takes steps; another takes over when it lapses.
CREATE TABLE history_backfills (
    award_id      text COLLATE "C" PRIMARY KEY,
    award_version integer     NOT NULL,
    sources       text[]      NOT NULL,
    -- The last item done: (user_id, source, content_id) in key order.
    next_user     text COLLATE "C" NOT NULL DEFAULT '',
    next_source   text COLLATE "C" NOT NULL DEFAULT '',
    next_content  text COLLATE "C" NOT NULL DEFAULT '',
    -- Items of the sources when it started (what the percentage is of).
    total         bigint      NOT NULL,
    done          bigint      NOT NULL DEFAULT 0,
    -- Items whose contribution changed.
    changed       bigint      NOT NULL DEFAULT 0,
    -- Items with no stored event (applied before events were kept).
    unrecoverable bigint      NOT NULL DEFAULT 0,
    -- Items a failing function held, or the database refused, and why.
    failed        bigint      NOT NULL DEFAULT 0,
    last_failure  text,
    -- The analytics phase: per "<source>/<partition>", [next, end) offsets
    -- (NULL until the items are walked).
    positions     jsonb,
    events_total  bigint      NOT NULL DEFAULT 0,
    events_done   bigint      NOT NULL DEFAULT 0,
    -- Analytics events counted for the first time.
    events_applied bigint     NOT NULL DEFAULT 0,
    -- The oldest retained message read: analytics before it are past
    -- Kafka's retention (NULL: none read). Whether every partition still
    -- held its first message.
    events_from   timestamptz,
    from_start    boolean     NOT NULL DEFAULT true,
    -- Why no analytics were read, if they were not (no broker given).
    events_note   text,
    lease_until   timestamptz,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz
);
