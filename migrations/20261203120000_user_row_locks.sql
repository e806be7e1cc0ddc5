-- Ingest makes the batches that touch one user apply one after the other
-- by locking the user's row here (FOR UPDATE, in user id order), where it
-- took an advisory lock per user. Row locks are kept in the rows, so a
-- batch of any number of users fits. An advisory lock takes a slot in
-- PostgreSQL's shared lock table (max_locks_per_transaction x
-- max_connections: 6,400 slots by default, about 12,000 with its slack),
-- and one batch of 10,000 distinct users, or a few concurrent smaller ones,
-- filled it: "out of shared memory" for the batch, retried forever, and for
-- any other session that needed a lock at that moment.
CREATE TABLE user_locks (
    user_id text COLLATE "C" PRIMARY KEY
);
--
-- Upgrading: ingest processes from before this migration take the advisory
-- locks and would not wait for these row locks; stop them before starting
-- ingest processes of this version.
