-- A proxy candidate on a loopback, link-local or private address is
-- refused unless its pool allows it (a list entry pointing inside the
-- network would otherwise carry webhooks there).
ALTER TABLE proxy_pools ADD COLUMN allow_private boolean NOT NULL DEFAULT false;
