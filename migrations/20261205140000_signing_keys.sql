-- Keys Laurel signs with, made here and never shown. `replay`: the mark a
-- replayed dead letter carries back to its pipeline's input topic
-- (laurel-origin, laurel-replay-for, laurel-replay-signature). Without a
-- valid signature the mark is ignored, so a raw producer cannot give its
-- records another record's position (and so its events' ids, which ingest
-- adds once) or hide them from a pipeline.
CREATE TABLE signing_keys (
    name text PRIMARY KEY,
    key  bytea NOT NULL
);
-- 32 bytes from PostgreSQL's strong random source (gen_random_uuid).
INSERT INTO signing_keys (name, key)
VALUES ('replay', decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'));
