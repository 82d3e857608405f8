//! The statements the crate sends, one constant each; the parameters are those the
//! crate binds (`$n::int8` milliseconds for an interval). `db.rs` runs each of them
//! over tokio-postgres or sqlx; every answer of an outcome that does not run the
//! caller's code comes whole from `idempotency.http_answer` in the same statement.

/// The statuses that are stored (idempotency.is_final), read once.
pub(crate) const FINAL_STATUSES_SQL: &str = "SELECT s FROM pg_catalog.generate_series(100, 599) \
    AS s WHERE idempotency.is_final(s)";
/// Claims a key in the caller's transaction: outcome, resource id, expiry, and the answer of every
/// outcome but started (idempotency.http_answer; CASE: no call then), in the one form Citus
/// delegates: SELECT ... FROM f(...), nothing else in FROM or WHERE.
pub(crate) const BEGIN_SQL: &str = "SELECT o.outcome, o.resource_id, floor(extract(epoch FROM \
    o.expires_at))::bigint, CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, \
    $10::text, $11::integer)).status END, CASE WHEN o.outcome <> 'started' THEN \
    (idempotency.http_answer(o, $10::text, $11::integer)).headers::text END, CASE WHEN \
    o.outcome <> 'started' THEN (idempotency.http_answer(o, $10::text, $11::integer)).body END \
    FROM idempotency.begin($1, $2, $3, idempotency.fingerprint($4, $5, $6, $7), $8::int8 * \
    interval '1 millisecond', $9::int8 * interval '1 millisecond') AS o";
/// Stores the final response of a key begin started, in the same transaction.
pub(crate) const COMPLETE_SQL: &str = "SELECT idempotency.complete($1, $2, status => $3::int4, \
    body => $4::bytea, headers => $5::text::jsonb, resource_id => $6::text, one_time_secret => \
    $7::boolean)";
/// Stores a final error response in a transaction of its own (the fingerprint computed as begin
/// computes it).
pub(crate) const SAVE_FINAL_SQL: &str = "SELECT idempotency.save_final($1, $2, $3, \
    idempotency.fingerprint($4, $5, $6, $7), status => $8::int4, body => $9::bytea, headers => \
    $10::text::jsonb, ttl => $11::int8 * interval '1 millisecond', one_time_secret => \
    $12::boolean)";
/// The stored row's expiry, read again after a statement that starts the ttl at its own now().
pub(crate) const STORED_EXPIRY_SQL: &str = "SELECT floor(extract(epoch FROM expires_at))::int8 \
    FROM idempotency.lookup($1, $2)";
/// The request fingerprint, as begin computes it.
pub(crate) const FINGERPRINT_SQL: &str = "SELECT idempotency.fingerprint($1, $2, $3, $4)";
/// Claims many keys in one round trip; the first six columns are begin's, the fingerprints are
/// computed by the server in the same statement, and each key's answer (but a started one's) by
/// idempotency.http_answer.
pub(crate) const BEGIN_BATCH_SQL: &str = "SELECT b.outcome, b.resource_id, CASE WHEN \
    isfinite(b.expires_at) THEN floor(extract(epoch FROM b.expires_at))::bigint END, a.status, \
    a.headers::text, a.body, b.ord, b.key, CASE WHEN isfinite(b.created_at) THEN b.created_at \
    END, CASE WHEN isfinite(b.expires_at) THEN b.expires_at END, b.fence, CASE WHEN \
    isfinite(b.lease_until) THEN b.lease_until END, b.response_status FROM \
    idempotency.begin_batch($1, $2::text[], $3, ARRAY(SELECT idempotency.fingerprint(u.m, u.p, \
    u.b, $7::text[]) FROM unnest($4::text[], $5::text[], $6::bytea[]) WITH ORDINALITY AS u(m, \
    p, b, n) ORDER BY u.n), $8::int8 * interval '1 millisecond', $9::int8 * interval '1 \
    millisecond') AS b LEFT JOIN LATERAL (SELECT * FROM idempotency.http_answer(b, $10::text, \
    $11::integer) WHERE b.outcome <> 'started' OFFSET 0) AS a ON true ORDER BY b.ord";
/// Stores the final responses of keys begin_batch started.
pub(crate) const COMPLETE_BATCH_SQL: &str = "SELECT ord, key, completed FROM \
    idempotency.complete_batch($1, $2::text[], $3::integer[], $4::bytea[], $5::text[]::jsonb[], \
    $6::text[]) ORDER BY ord";
/// Acquires a key under a lease: outcome, fence, expiry, the answer of an outcome that does not run
/// the body (idempotency.http_answer; CASE: no call for started) and the resource id, in the form
/// Citus delegates.
pub(crate) const ACQUIRE_SQL: &str = "SELECT o.outcome, o.fence, floor(extract(epoch FROM \
    o.expires_at))::int8, CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, \
    $11::text, $12::integer)).status END, CASE WHEN o.outcome <> 'started' THEN \
    (idempotency.http_answer(o, $11::text, $12::integer)).headers::text END, CASE WHEN \
    o.outcome <> 'started' THEN (idempotency.http_answer(o, $11::text, $12::integer)).body END, \
    o.resource_id FROM idempotency.acquire($1, $2, $3, idempotency.fingerprint($4, $5, $6, $7), \
    $8::int8 * interval '1 millisecond', $9::int8 * interval '1 millisecond', $10::int8 * \
    interval '1 millisecond') AS o";
/// Renews a held lease: true while the fence still holds the key.
pub(crate) const RENEW_SQL: &str = "SELECT idempotency.renew($1, $2, $3, $4::int8 * interval '1 \
    millisecond')";
/// Marks a held key done with a status, fenced.
pub(crate) const MARK_DONE_SQL: &str = "SELECT idempotency.complete($1, $2, fence => $3::int8, \
    status => $4::int4)";
/// Stores a held key's final response, fenced.
pub(crate) const REMEMBER_SQL: &str = "SELECT idempotency.complete($1, $2, fence => $3::int8, \
    status => $4::int4, body => $5::bytea, headers => $6::text::jsonb, resource_id => $7::text, \
    one_time_secret => $8::boolean)";
/// Releases a held key, fenced: a retry runs again.
pub(crate) const RELEASE_SQL: &str = "SELECT idempotency.release($1, $2, $3::int8)";
/// Claims a key for a window (push_unique).
pub(crate) const CLAIM_SQL: &str = "SELECT idempotency.claim($1, $2, $3::int8 * interval '1 \
    millisecond')";
/// Claims many keys for a window in one round trip.
pub(crate) const CLAIM_BATCH_SQL: &str = "SELECT ord, key, claimed FROM \
    idempotency.claim_batch($1, $2::text[], $3::int8 * interval '1 millisecond') ORDER BY ord";
