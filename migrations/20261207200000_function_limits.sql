-- The limits a function version asked for at its push, in place of the
-- server's defaults (LAUREL_FUNCTION_CPU_MS, LAUREL_FUNCTION_MEMORY_MIB);
-- NULL: the default. Part of the version: the same bytes pushed with other
-- limits are a new version, and a rollback returns to the limits it had.
ALTER TABLE functions
    ADD COLUMN cpu_ms integer CHECK (cpu_ms > 0),
    ADD COLUMN memory_mib integer CHECK (memory_mib > 0);
