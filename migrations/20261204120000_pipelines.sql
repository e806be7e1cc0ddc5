-- The pre-filter's pipelines: each reads one raw analytics topic, turns
-- its records into events with a transform function (by name, with its
-- JSON config) and produces those some award can use to events.<source>.
-- A change bumps the version (the running consumer restarts on it) and is
-- announced on laurel_pipelines.
CREATE TABLE pipelines (
    name             text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    input_topic      text        NOT NULL CHECK (input_topic ~ '^[A-Za-z0-9._-]{1,249}$'),
    source           text        NOT NULL REFERENCES sources (name),
    transform        text        NOT NULL,
    transform_config jsonb       NOT NULL,
    paused           boolean     NOT NULL DEFAULT false,
    version          integer     NOT NULL DEFAULT 1,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- Transforms are functions too.
ALTER TABLE functions DROP CONSTRAINT functions_kind_check;
ALTER TABLE functions ADD CONSTRAINT functions_kind_check
    CHECK (kind IN ('filter', 'rule', 'strategy', 'http', 'transform'));
