-- Diagnostic variants (not part of the default run; see README.md):
--   extension_noset: the extension's own C functions, declared again without
--                    SECURITY DEFINER and SET search_path, to show what that
--                    wrapper costs per call.
--   ideal_upsert:    ideal with the key row written by the extension's store
--                    statement shape (INSERT ... ON CONFLICT DO UPDATE ... WHERE),
--                    to show what a speculative insertion costs over a plain INSERT.
CREATE FUNCTION bench.begin_noset(principal text, key text, action text, fingerprint bytea,
                                  ttl interval DEFAULT NULL, wait interval DEFAULT NULL)
    RETURNS idempotency.key_outcome
    AS '$libdir/idempotency', 'idempotency_begin' LANGUAGE C VOLATILE;
CREATE FUNCTION bench.complete_noset(principal text, key text, status integer, body bytea DEFAULT NULL,
                                     headers jsonb DEFAULT NULL, resource_id text DEFAULT NULL,
                                     one_time_secret boolean DEFAULT false)
    RETURNS boolean
    AS '$libdir/idempotency', 'idempotency_complete' LANGUAGE C VOLATILE;
