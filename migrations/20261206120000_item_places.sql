-- Of two events of one content item with the same occurred_at, the later
-- in its partition wins (Kafka keeps one key's events in the order they
-- were written), not the one with the larger id. Each item keeps where its
-- last event was (`TOPIC:PARTITION:OFFSET`; NULL for items applied before
-- this migration, which fall back to the larger id once), and the ids of
-- the events processed at the same occurred_at before it, so that none of
-- them changes the item again when it comes back at a later offset.
ALTER TABLE content_items
    ADD COLUMN place text,
    ADD COLUMN tied text[] NOT NULL DEFAULT '{}';

-- A dead letter of an event a pipeline made keeps its raw record's place
-- (the event's `laurel-place` header): its replay never overtakes a later
-- event of the same item at the same occurred_at.
ALTER TABLE dead_letters ADD COLUMN place text;
