-- The views of the C++ edition, as its install script leaves them.

CREATE VIEW idempotency.abandoned AS
 SELECT k.principal,
    k.key,
    k.action,
    k.fence,
        CASE
            WHEN (k.lease_until = '-infinity'::timestamp with time zone)
            THEN NULL::timestamp with time zone
            ELSE k.lease_until
        END AS abandoned_since,
    (k.lease_until = '-infinity'::timestamp with time zone) AS released,
    k.created_at,
    k.expires_at,
    (k.expires_at > now()) AS live,
    k.request_sha256 AS fingerprint
   FROM idempotency.keys k
  WHERE ((k.state = 'in_progress'::text) AND (k.lease_until <= clock_timestamp()));

COMMENT ON VIEW idempotency.abandoned IS
    'Keys in progress whose lease lapsed or was released and that nobody took over: who, '
    'which key and action, the last fence, since when, and the request fingerprint to take '
    'them over with';

CREATE VIEW idempotency.oldest_keys AS
 SELECT DISTINCT ON (k.action, k.state, k.live) k.action,
    k.state,
    k.live,
    k.principal,
    k.key,
    k.created_at,
    k.expires_at,
    k.lease_until
   FROM ( SELECT r.principal,
            r.key,
            r.action,
            r.request_sha256,
            r.state,
            r.response_status,
            r.response_headers,
            r.response_body,
            r.resource_id,
            r.one_time_secret,
            r.fence,
            r.lease_until,
            r.created_at,
            r.expires_at,
            ((r.expires_at > now()) OR COALESCE((r.lease_until > clock_timestamp()), false)) AS live
           FROM idempotency.keys r) k
  ORDER BY k.action, k.state, k.live, k.created_at, k.principal, k.key;

COMMENT ON VIEW idempotency.oldest_keys IS
    'The oldest key of each (action, state, live) group of idempotency.status, with its '
    'principal: for the operator and support roles, not for monitoring';

CREATE VIEW idempotency.stats AS
 SELECT stats_counters.database,
    stats_counters.action,
    stats_counters.begin_started,
    stats_counters.begin_replay,
    stats_counters.begin_secret_replay,
    stats_counters.begin_mismatch,
    stats_counters.begin_in_progress,
    stats_counters.acquire_started,
    stats_counters.acquire_replay,
    stats_counters.acquire_secret_replay,
    stats_counters.acquire_mismatch,
    stats_counters.acquire_in_progress,
    stats_counters.takeovers,
    stats_counters.completed,
    stats_counters.lease_completed,
    stats_counters.save_final_stored,
    stats_counters.save_final_refused,
    stats_counters.commit_refused,
    stats_counters.serialization_failures,
    stats_counters.stale_fence,
    stats_counters.renewed,
    stats_counters.released,
    stats_counters.cleanup_deleted,
    stats_counters.waits,
    stats_counters.wait_ms_sum,
    stats_counters.wait_ms_max,
    stats_counters.wait_le_ms,
    stats_counters.wait_buckets,
    stats_counters.stats_reset,
    stats_counters.begin_expired,
    stats_counters.acquire_expired
   FROM idempotency.stats_counters() AS stats_counters;

COMMENT ON VIEW idempotency.stats IS
    'What every call did since stats_reset, per database and action: outcomes (expired since '
    '0.8.0), stores, refusals, 40001s, takeovers, stale fences, renewals, cleanup, and the '
    'waits for held keys. No key, principal or body';

CREATE VIEW idempotency.status AS
 SELECT k.action,
    k.state,
    ((k.expires_at > now()) OR COALESCE((k.lease_until > clock_timestamp()), false)) AS live,
    count(*) AS keys,
    min(k.created_at) AS oldest_created_at,
    max(k.created_at) AS newest_created_at,
    min(k.expires_at) AS next_expires_at,
    count(*) FILTER (WHERE ((k.state = 'in_progress'::text)
                            AND (k.lease_until > clock_timestamp()))) AS leases_live,
    min(k.lease_until) FILTER (WHERE (k.state = 'in_progress'::text)) AS earliest_lease_until
   FROM idempotency.keys k
  GROUP BY k.action, k.state,
           ((k.expires_at > now()) OR COALESCE((k.lease_until > clock_timestamp()), false));

COMMENT ON VIEW idempotency.status IS
    'Keys by action, state and live/expired: counts and times only, never a principal or a '
    'key (the oldest key of each group is in idempotency.oldest_keys)';
