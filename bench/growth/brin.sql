-- A candidate to measure with bench/growth/run.sh (SCHEMA_SQL=bench/growth/brin.sql), not
-- shipped: the expiry B-tree replaced by a BRIN index. Cleanup needs the
-- B-tree (its batches are ORDER BY expires_at LIMIT n, resumed from the last
-- expiry): see bench/growth/README.md.
DROP INDEX idempotency.keys_expiry_bucket_idx;
CREATE INDEX keys_expires_at_brin ON idempotency.keys USING brin (expires_at);
