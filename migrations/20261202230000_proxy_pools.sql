-- Proxy pools: what a pool admits (its checks and policy) and every
-- candidate it was given, with the outcome of its last check. Allocation
-- state (counts, in-flight leases) lives in Redis; this is the durable
-- record the re-checker works from and the admin API reports.

CREATE TABLE proxy_pools (
    name text PRIMARY KEY,
    -- 'least-used': the eligible member with the fewest allocations.
    -- 'least-concurrent': the member with the fewest unexpired leases
    -- (ties: fewest allocations), leases released or expired.
    policy text NOT NULL DEFAULT 'least-used'
        CHECK (policy IN ('least-used', 'least-concurrent')),
    check_url text NOT NULL,
    timeout_ms integer NOT NULL DEFAULT 5000 CHECK (timeout_ms > 0),
    schemes text[] NOT NULL DEFAULT '{http}',
    max_latency_ms integer NOT NULL DEFAULT 2000 CHECK (max_latency_ms > 0),
    deny text[] NOT NULL DEFAULT '{}',
    recheck_every_ms integer NOT NULL DEFAULT 300000 CHECK (recheck_every_ms > 0),
    lease_ttl_ms integer NOT NULL DEFAULT 60000 CHECK (lease_ttl_ms > 0),
    -- least-concurrent only: leases one member may hold at once (null: no cap).
    max_in_flight integer CHECK (max_in_flight > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE proxy_candidates (
    pool text NOT NULL REFERENCES proxy_pools (name) ON DELETE CASCADE,
    proxy text NOT NULL,
    eligible boolean NOT NULL DEFAULT false,
    -- Why it is not eligible (null while eligible or never checked).
    reason text,
    latency_ms integer,
    checks integer NOT NULL DEFAULT 0,
    checked_at timestamptz,
    -- Also a lease: a re-checker claims a candidate by moving this ahead.
    next_check_at timestamptz NOT NULL DEFAULT now(),
    added_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool, proxy)
);

CREATE INDEX proxy_candidates_due ON proxy_candidates (next_check_at);
