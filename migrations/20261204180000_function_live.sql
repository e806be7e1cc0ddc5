-- Which version of each function serves. A push makes its version live
-- (as before, the newest); a version pushed as a shadow candidate serves
-- nothing until it is promoted; a rollback makes the version that was live
-- before the last change live again, without a new version.
CREATE TABLE function_live (
    name       text        PRIMARY KEY,
    version    integer     NOT NULL,
    -- The version that was live before this one (what a rollback returns to).
    previous   integer,
    changed_at timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (name, version) REFERENCES functions (name, version),
    FOREIGN KEY (name, previous) REFERENCES functions (name, version)
);

INSERT INTO function_live (name, version, previous)
SELECT name, max(version),
       CASE WHEN max(version) > 1 THEN max(version) - 1 END
FROM functions GROUP BY name;
