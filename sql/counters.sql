-- idempotency.stats counts every call exactly, per database and action.
-- Counters are not transactional: a call counts when it runs, committed or
-- not. They need the library in shared_preload_libraries: on a server without
-- it this file checks nothing and says so (expected/counters_1.out);
-- tests/no_preload/counters_off checks such a server.
\set VERBOSITY sqlstate
SELECT current_setting('shared_preload_libraries') ~ '(^|[ ,])idempotency($|[ ,])' AS preloaded \gset
\if :preloaded
\else
\echo 'counters: NOT RUN, idempotency is not in shared_preload_libraries'
\quit
\endif
SELECT idempotency.stats_reset() AS reset_at \gset
-- The nonzero counters of this test's actions, one line per action.
CREATE TEMP VIEW counted AS
SELECT s.action, string_agg(e.key || '=' || e.value, ' ' ORDER BY e.key) AS counts
  FROM idempotency.stats AS s,
       jsonb_each_text(to_jsonb(s) - '{database,action,wait_le_ms,wait_buckets,wait_ms_sum,wait_ms_max,stats_reset}'::text[]) AS e
 WHERE s.database = current_database() AND (s.action LIKE 'ctr%' OR s.action = '(unknown)') AND e.value <> '0'
 GROUP BY 1 ORDER BY 1;
SELECT count(*) FILTER (WHERE stats_reset <> :'reset_at') AS other_reset_time,
       count(*) FILTER (WHERE begin_started > 0) AS counting_after_reset
  FROM idempotency.stats;

-- Transactional protocol: started + completed, replay, mismatch.
BEGIN;
SELECT outcome FROM idempotency.begin('p', 'c-1', 'ctr_order', idempotency.fingerprint('POST', '/o', '{"n":1}'));
SELECT idempotency.complete('p', 'c-1', status => 201);
COMMIT;
SELECT outcome FROM idempotency.begin('p', 'c-1', 'ctr_order', idempotency.fingerprint('POST', '/o', '{"n":1}'));
SELECT outcome FROM idempotency.begin('p', 'c-1', 'ctr_order', idempotency.fingerprint('POST', '/o', '{"n":2}'));
-- A one-time secret, replayed without its body.
BEGIN;
SELECT outcome FROM idempotency.begin('p', 'c-2', 'ctr_token', idempotency.fingerprint('POST', '/t'));
SELECT idempotency.complete('p', 'c-2', status => 201, body => 'sk', one_time_secret => true);
COMMIT;
SELECT outcome FROM idempotency.begin('p', 'c-2', 'ctr_token', idempotency.fingerprint('POST', '/t'));
-- A commit refused for a missing complete; a rolled-back start still counts as started.
BEGIN;
SELECT outcome FROM idempotency.begin('p', 'c-3', 'ctr_order', idempotency.fingerprint('POST', '/o', '{"n":3}'));
COMMIT;
BEGIN;
SELECT outcome FROM idempotency.begin('p', 'c-4', 'ctr_order', idempotency.fingerprint('POST', '/o', '{"n":4}'));
ROLLBACK;
SELECT * FROM counted;

-- save_final: stored, refused (a live row holds the key), refused (not final).
SELECT idempotency.save_final('p', 's-1', 'ctr_refund', idempotency.fingerprint('POST', '/r'), 422) AS stored,
       idempotency.save_final('p', 's-1', 'ctr_refund', idempotency.fingerprint('POST', '/r'), 422) AS again,
       idempotency.save_final('p', 's-2', 'ctr_refund', idempotency.fingerprint('POST', '/r'), 503) AS not_final;

-- Lease protocol: started, in_progress, renewed, a stale fence, completed, a
-- stale completion, replay.
SELECT fence AS f1 FROM idempotency.acquire('p', 'l-1', 'ctr_charge', idempotency.fingerprint('POST', '/c')) \gset
SELECT outcome FROM idempotency.acquire('p', 'l-1', 'ctr_charge', idempotency.fingerprint('POST', '/c'), wait => '0');
SELECT idempotency.renew('p', 'l-1', :f1) AS renewed, idempotency.renew('p', 'l-1', :f1 - 1) AS stale;
SELECT idempotency.complete('p', 'l-1', status => 200, fence => :f1) AS completed,
       idempotency.complete('p', 'l-1', status => 200, fence => :f1) AS completed_again;
SELECT outcome FROM idempotency.acquire('p', 'l-1', 'ctr_charge', idempotency.fingerprint('POST', '/c'));
-- A takeover of a lapsed lease; the old holder's fence is stale; release.
SELECT fence AS f2 FROM idempotency.acquire('p', 'l-2', 'ctr_charge', idempotency.fingerprint('POST', '/c'),
                                            lease => '100 ms') \gset
SELECT pg_sleep(0.2);
SELECT action, fence = :f2 AS same_fence, released, abandoned_since IS NOT NULL AS has_since, live
  FROM idempotency.abandoned WHERE key = 'l-2';
SELECT fence AS f3 FROM idempotency.acquire('p', 'l-2', 'ctr_charge', idempotency.fingerprint('POST', '/c')) \gset
SELECT count(*) AS abandoned_after_takeover FROM idempotency.abandoned WHERE key = 'l-2';
SELECT idempotency.complete('p', 'l-2', status => 200, fence => :f2) AS old_holder,
       idempotency.release('p', 'l-2', :f3) AS released, idempotency.release('p', 'l-2', :f3) AS released_again;
SELECT action, released, abandoned_since FROM idempotency.abandoned WHERE key = 'l-2';
-- begin() on a key a live lease holds: in_progress at once (no wait: nobody holds the key lock).
SELECT outcome FROM idempotency.acquire('p', 'l-3', 'ctr_charge', idempotency.fingerprint('POST', '/c'));
SELECT outcome FROM idempotency.begin('p', 'l-3', 'ctr_charge', idempotency.fingerprint('POST', '/c'));
-- A fence for a key that has no row: a stale fence of no known action.
SELECT idempotency.renew('p', 'no-such-key', 1) AS renewed;
SELECT * FROM counted;

-- Cleanup counts the rows it deleted, per action.
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
SELECT 'p', 'old-' || i, 'ctr_old', decode(repeat('00', 32), 'hex'), 'completed', 200,
       now() - interval '2 days', now() - interval '1 day'
  FROM generate_series(1, 3) AS i;
CALL idempotency.cleanup();
SELECT * FROM counted WHERE action = 'ctr_old';

-- No wait for a held key in this session: the histogram is empty, with its fixed bounds.
SELECT waits, wait_ms_sum, wait_ms_max, wait_le_ms, wait_buckets FROM idempotency.stats
 WHERE database = current_database() AND action = 'ctr_order';

-- The outcome expired (0.8.0): an expired key of an action that refuses it.
SELECT idempotency.set_expiry_policy('ctr_expired', 'refuse');
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
VALUES ('p', 'exp-1', 'ctr_expired', idempotency.fingerprint('POST', '/e'), 'completed', 201,
        now() - interval '2 hours', now() - interval '1 hour');
SELECT outcome FROM idempotency.begin('p', 'exp-1', 'ctr_expired', idempotency.fingerprint('POST', '/e'));
SELECT outcome FROM idempotency.acquire('p', 'exp-1', 'ctr_expired', idempotency.fingerprint('POST', '/e'));
SELECT * FROM counted WHERE action = 'ctr_expired';
SELECT idempotency.set_expiry_policy('ctr_expired', 'run');

-- A reset zeroes every counter (the rows stay) and moves stats_reset.
SELECT idempotency.stats_reset() > :'reset_at' AS reset_later;
SELECT * FROM counted;
SELECT count(*) > 0 AS rows_kept, bool_and(stats_reset > :'reset_at') AS reset_shown
  FROM idempotency.stats WHERE action LIKE 'ctr%';
-- An action name longer than the 255 bytes shown is cut on a character
-- boundary of the database's encoding: 'lng_' and 200 times U+00E9 (two
-- bytes each in UTF-8) cut at 255 bytes would end in half a character (0.6.0:
-- convert_to failed with 22021, and the view could not be read under
-- client_encoding LATIN1); it keeps 254 bytes, 129 characters, and a client
-- reading it as LATIN1 gets all of them.
SELECT idempotency.save_final('p', 'long-1', 'lng_' || repeat(chr(233), 200),
                              idempotency.fingerprint('POST', '/l'), 422) AS stored;
SELECT octet_length(action) AS bytes, length(action) AS characters,
       octet_length(convert_to(action, 'UTF8')) AS utf8_bytes,
       octet_length(convert_to(action, 'LATIN1')) AS latin1_bytes, save_final_stored
  FROM idempotency.stats WHERE database = current_database() AND action LIKE 'lng\_%';
SET client_encoding = 'LATIN1';
SELECT action AS long_action FROM idempotency.stats
 WHERE database = current_database() AND action LIKE 'lng\_%' \gset
SELECT octet_length(:'long_action') AS utf8_bytes_sent_back_as_latin1;
RESET client_encoding;
DELETE FROM idempotency.keys;
