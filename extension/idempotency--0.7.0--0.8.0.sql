-- pg_idempotency 0.7.0 -> 0.8.0: expiry that says so (tombstones and the
-- expired outcome), batches, and fences that never repeat across shard moves.
-- Each feature adds its own section below.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.8.0'" to load this file. \quit
