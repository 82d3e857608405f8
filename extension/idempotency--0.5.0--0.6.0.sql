-- pg_idempotency 0.5.0 -> 0.6.0: guarantees that hold under every interleaving
-- (fences that never repeat, leases that outlive their key's ttl, cleanup that
-- leaves live work alone), one complete() for both protocols, and every object
-- safe under a hostile search_path.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.6.0'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Fences (protocol)

-- ---------------------------------------------------------------------------
-- Protocol functions (protocol)

-- ---------------------------------------------------------------------------
-- Cleanup (protocol)

-- ---------------------------------------------------------------------------
-- search_path hardening of the remaining objects (security)
-- sql/security_search_path.sql calls every function and procedure under a
-- search_path of traps (and pg_temp traps). Against 0.5.0 only the cleanup
-- procedure fires one (its DECLAREd timestamptz variables, fixed above); every
-- other object pins search_path = pg_catalog, pg_temp or, for the status view,
-- was bound when it was created, so nothing else needs replacing here.

-- ---------------------------------------------------------------------------
-- Privileges
