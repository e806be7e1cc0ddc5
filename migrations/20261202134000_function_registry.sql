-- The function registry: every version of every Wasm component ever pushed.
-- A name's current version is its highest; old versions stay for audit and
-- so that in-flight calls and the processing log can name what ran.
CREATE TABLE functions (
    name              text        NOT NULL CHECK (name ~ '^[A-Za-z][A-Za-z0-9_.-]{0,127}$'),
    version           integer     NOT NULL CHECK (version > 0),
    kind              text        NOT NULL CHECK (kind IN ('filter', 'rule', 'strategy', 'http')),
    sha256            text        NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    bytes             bytea       NOT NULL,
    builtin           boolean     NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now(),
    -- Set when a version keeps failing; a newer version starts clean.
    quarantined_at    timestamptz,
    quarantine_reason text,
    PRIMARY KEY (name, version)
);

CREATE INDEX functions_sha256 ON functions (name, sha256);
