-- The awards worker: per-user award state, change detection, transitions,
-- webhooks and their delivery outbox, backfills.

-- One award's state for one user, computed by the award's strategy from its
-- objectives. `version` is the max version of those objectives at the time.
CREATE TABLE user_achieve (
    user_id       text             NOT NULL,
    award_id      text             NOT NULL,
    award_version integer          NOT NULL,
    progress      double precision NOT NULL,
    goal          double precision NOT NULL,
    remaining     double precision NOT NULL,
    started       boolean          NOT NULL,
    completed     boolean          NOT NULL,
    completed_at  timestamptz,
    version       bigint           NOT NULL,
    -- The strategy's error at the last evaluation (progress then kept).
    error         text,
    updated_at    timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, award_id)
);

-- Awards whose strategy failed for some users, found without a scan.
CREATE INDEX user_achieve_errors ON user_achieve (award_id) WHERE error IS NOT NULL;

-- (user, award) pairs whose objectives changed since the worker last
-- computed them. A marker is written by the same transaction as the
-- change (the triggers below), and deleted by the worker in the
-- transaction that computes the award. See ARCHITECTURE.md for why no
-- change can be lost between the two.
CREATE TABLE award_changes (
    user_id   text        NOT NULL,
    award_id  text        NOT NULL,
    -- The first unprocessed change: how long the oldest one has waited.
    marked_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, award_id)
);

-- `DO UPDATE ... WHERE false` updates nothing but locks the existing
-- marker (DO NOTHING would not): a writer whose marker a worker holds waits
-- for that worker, then finds the marker gone and inserts a new one.
CREATE FUNCTION laurel_mark_award_changes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO award_changes (user_id, award_id)
    SELECT DISTINCT user_id, award_id FROM changed ORDER BY 1, 2
    ON CONFLICT (user_id, award_id) DO UPDATE SET marked_at = award_changes.marked_at WHERE false;
    RETURN NULL;
END
$$;

CREATE TRIGGER user_objective_inserted AFTER INSERT ON user_objective
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION laurel_mark_award_changes();
CREATE TRIGGER user_objective_updated AFTER UPDATE ON user_objective
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION laurel_mark_award_changes();

-- Backfills walk an award's users in user id order.
CREATE INDEX user_objective_award ON user_objective (award_id, user_id);

-- Every completion and revocation, written once, in the transaction that
-- changed user_achieve.
CREATE TABLE award_transitions (
    id       bigserial        PRIMARY KEY,
    user_id  text             NOT NULL,
    award_id text             NOT NULL,
    kind     text             NOT NULL CHECK (kind IN ('completed', 'revoked')),
    progress double precision NOT NULL,
    goal     double precision NOT NULL,
    reason   text,
    at       timestamptz      NOT NULL DEFAULT now()
);
CREATE INDEX award_transitions_user ON award_transitions (user_id, award_id, id);

-- Where notifications go. `events`: the transition types it receives.
CREATE TABLE webhooks (
    name       text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    url        text        NOT NULL,
    events     text[]      NOT NULL DEFAULT '{award.completed}',
    proxy_pool text,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The outbox: one row per (transition, webhook), written with the
-- transition. The notifier claims due rows by pushing `next_attempt_at`
-- past a lease, so a notifier that dies mid-delivery only delays it.
CREATE TABLE notifications (
    id              bigserial   PRIMARY KEY,
    transition_id   bigint      NOT NULL REFERENCES award_transitions (id),
    webhook         text        NOT NULL,
    payload         jsonb       NOT NULL,
    state           text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
CREATE INDEX notifications_due ON notifications (next_attempt_at) WHERE state = 'pending';
CREATE INDEX notifications_finished ON notifications (finished_at) WHERE state <> 'pending';

-- Recomputing an award for every user who has counters for it (after the
-- award is created or changed): markers are written a bounded batch at a
-- time, users in id order from `next_user`.
CREATE TABLE award_backfills (
    award_id      text        PRIMARY KEY,
    award_version integer     NOT NULL,
    next_user     text        NOT NULL DEFAULT '',
    marked        bigint      NOT NULL DEFAULT 0,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz
);

-- Awards that exist now get computed for the users who already have
-- counters.
INSERT INTO award_backfills (award_id, award_version) SELECT id, version FROM awards;
