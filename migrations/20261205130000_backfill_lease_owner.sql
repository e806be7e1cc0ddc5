-- Who holds a backfill's lease: a token each claim draws. A worker whose
-- lease lapsed (a step that stalled) and was taken over finds out at its
-- next step, which records nothing, and cannot give back a lease that is
-- no longer its own.
ALTER TABLE history_backfills ADD COLUMN lease_owner text;
