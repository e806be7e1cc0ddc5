-- An analytics event is applied once per (source, user, id), not per
-- (source, id): ids are the producer's (or a pipeline's position), and
-- another user's event may carry the same one, which made a real event
-- "already applied".
--
-- Every event applied before this migration stays applied: its row gets
-- the user '' , which a lookup takes for any user (as the key meant
-- then), until the row is pruned with its retention.
ALTER TABLE applied_events ADD COLUMN user_id text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE applied_events ALTER COLUMN user_id DROP DEFAULT;
ALTER TABLE applied_events DROP CONSTRAINT applied_events_pkey;
ALTER TABLE applied_events ADD PRIMARY KEY (source, event_id, user_id);

ALTER TABLE award_events ADD COLUMN user_id text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE award_events ALTER COLUMN user_id DROP DEFAULT;
ALTER TABLE award_events DROP CONSTRAINT award_events_pkey;
ALTER TABLE award_events ADD PRIMARY KEY (award_id, source, event_id, user_id);

-- How far back the record of applied ids is complete. Pruning raises a
-- horizon before it deletes the rows under it (rows are kept from when
-- their event was applied or happened, whichever is later), and a batch
-- reads it with a share lock: an analytics event from before the horizon
-- is refused with its reason, as a redelivery could not be told from a
-- first delivery. NULL: nothing pruned yet.
CREATE TABLE prune_horizons (
    name    text PRIMARY KEY,
    horizon timestamptz
);
INSERT INTO prune_horizons (name) VALUES ('applied_events'), ('award_events');
