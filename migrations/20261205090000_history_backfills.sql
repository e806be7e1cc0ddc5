-- Awards that credit the past. Each content item keeps the last event
-- applied to it, as it came (NULL for items applied before this migration:
-- what a backfill cannot recover, and says so).
ALTER TABLE content_items ADD COLUMN event bytea;

-- A backfill from history: an award's objectives evaluated over the stored
-- items of its sources, walked in key order. One row per award; asking
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
    lease_until   timestamptz,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz
);
