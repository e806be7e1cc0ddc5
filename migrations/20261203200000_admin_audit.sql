-- Every write through the admin API: who (the token's name), what (method,
-- path, the award or function it changed, its version before and after),
-- when, and how it ended (the HTTP status).
CREATE TABLE admin_audit (
    id             bigserial   PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT now(),
    token_name     text        NOT NULL,
    method         text        NOT NULL,
    path           text        NOT NULL,
    status         integer     NOT NULL,
    target         text,
    version_before integer,
    version_after  integer
);
CREATE INDEX admin_audit_at ON admin_audit (at);
