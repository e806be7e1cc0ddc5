-- Ids compare as bytes. With the database's collation (C.UTF-8 here,
-- often en_US.UTF-8 in production) every index comparison of a user,
-- award, objective, content or event id went through the locale's strcoll:
-- a measurable share of ingest's database time on the hottest indexes.
-- Ids are identifiers, not prose: byte order is also what the host sorts
-- by (its lock and write order). Equality is unchanged; only the order of
-- ids in listings (and of backfills' walk) becomes byte order.

ALTER TABLE users
    ALTER COLUMN user_id TYPE text COLLATE "C";

ALTER TABLE user_objective
    ALTER COLUMN user_id TYPE text COLLATE "C",
    ALTER COLUMN award_id TYPE text COLLATE "C",
    ALTER COLUMN objective_id TYPE text COLLATE "C";

ALTER TABLE content_items
    ALTER COLUMN user_id TYPE text COLLATE "C",
    ALTER COLUMN source TYPE text COLLATE "C",
    ALTER COLUMN content_id TYPE text COLLATE "C";

ALTER TABLE dedup_members
    ALTER COLUMN user_id TYPE text COLLATE "C",
    ALTER COLUMN award_id TYPE text COLLATE "C",
    ALTER COLUMN objective_id TYPE text COLLATE "C",
    ALTER COLUMN dedup_key TYPE text COLLATE "C",
    ALTER COLUMN source TYPE text COLLATE "C",
    ALTER COLUMN content_id TYPE text COLLATE "C";

ALTER TABLE applied_events
    ALTER COLUMN source TYPE text COLLATE "C",
    ALTER COLUMN event_id TYPE text COLLATE "C";

ALTER TABLE processing_log
    ALTER COLUMN user_id TYPE text COLLATE "C";

ALTER TABLE award_changes
    ALTER COLUMN user_id TYPE text COLLATE "C",
    ALTER COLUMN award_id TYPE text COLLATE "C";

ALTER TABLE user_achieve
    ALTER COLUMN user_id TYPE text COLLATE "C",
    ALTER COLUMN award_id TYPE text COLLATE "C";

ALTER TABLE award_transitions
    ALTER COLUMN user_id TYPE text COLLATE "C",
    ALTER COLUMN award_id TYPE text COLLATE "C";
