-- The key lock, outcomes, and the transactional protocol (begin, complete,
-- save_final, forget). How each piece maps from the C++ edition:
-- docs/trusted-edition.md.

-- The key lock: a transaction-level advisory lock on a 64-bit hash of
-- (principal, key) in the key space of seed 18756 (pg_locks: locktype
-- advisory, objsubid 1). Unambiguous input: the principal's length first.
CREATE FUNCTION idempotency.key_lock_id(principal text, key text)
RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
RETURN hashtextextended(octet_length(principal)::text || ':' || principal || key, 18756);
COMMENT ON FUNCTION idempotency.key_lock_id(text, text) IS
    'Trusted edition: the advisory lock id of a key (hash of principal and key, seed 18756)';

-- Waits up to wait_ms for the key lock. true: held until the transaction
-- ends. The wait runs in a subtransaction with lock_timeout, so running out
-- never aborts the caller's transaction; only a contended key pays for it.
CREATE FUNCTION idempotency.key_lock(lock_id bigint, wait_ms bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    saved text;
BEGIN
    IF pg_try_advisory_xact_lock(lock_id) THEN
        RETURN true;
    END IF;
    IF wait_ms <= 0 THEN
        RETURN false;
    END IF;
    saved := current_setting('lock_timeout');
    BEGIN
        PERFORM set_config('lock_timeout', wait_ms::text || 'ms', true);
        PERFORM pg_advisory_xact_lock(lock_id);
        PERFORM set_config('lock_timeout', saved, true);
        RETURN true;
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
END
$$;
COMMENT ON FUNCTION idempotency.key_lock(bigint, bigint) IS
    'Trusted edition: takes the key lock, waiting at most wait_ms (false when it ran out)';

-- A new fence: the clock in microseconds since 1970, or the row's fence + 1.
CREATE FUNCTION idempotency.next_fence(row_fence bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF row_fence = 9223372036854775807 THEN
        RAISE EXCEPTION 'the key''s fence is the largest bigint: no higher fence is left'
            USING ERRCODE = '22003';
    END IF;
    RETURN greatest((extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
                    coalesce(row_fence + 1, 1));
END
$$;
COMMENT ON FUNCTION idempotency.next_fence(bigint) IS
    'Trusted edition: a fence above the clock and the row''s fence (22003 at the largest)';

-- Whether an expired key is refused when a call would write over it: a
-- tombstone until its end, any other row whose ttl ran out as its action's
-- policy says (whatever a lease says: it may end before the write).
CREATE FUNCTION idempotency.expiry_refuses_takeover(r idempotency.keys)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF r.principal IS NULL THEN
        RETURN false;
    END IF;
    IF r.state = 'expired' THEN
        RETURN r.expires_at > now();
    END IF;
    IF r.expires_at > now() THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT FROM idempotency.expiry_policies AS p
                    WHERE p.action = r.action AND r.expires_at + p.grace > now());
END
$$;
COMMENT ON FUNCTION idempotency.expiry_refuses_takeover(idempotency.keys) IS
    'Trusted edition: whether an expired key refuses a write over it (save_final)';

-- Whether a key answers expired: a live row only as a tombstone, a dead one
-- as expiry_refuses_takeover says.
CREATE FUNCTION idempotency.expiry_refuses(r idempotency.keys)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF r.principal IS NULL THEN
        RETURN false;
    END IF;
    IF r.expires_at > now()
       OR (r.state = 'in_progress' AND r.lease_until > clock_timestamp()) THEN
        RETURN r.state = 'expired';
    END IF;
    RETURN idempotency.expiry_refuses_takeover(r);
END
$$;
COMMENT ON FUNCTION idempotency.expiry_refuses(idempotency.keys) IS
    'Trusted edition: whether an expired key is refused (outcome expired)';

-- The outcome of begin/acquire for the row found (NULL row: none).
CREATE FUNCTION idempotency.outcome_for(r idempotency.keys, fingerprint bytea)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    leased boolean;
BEGIN
    IF r.principal IS NULL THEN
        RETURN 'started';
    END IF;
    leased := r.state = 'in_progress' AND r.lease_until > clock_timestamp();
    IF r.state = 'expired' THEN
        IF r.expires_at <= now() THEN
            RETURN 'started';
        END IF;
    ELSIF NOT leased AND r.expires_at <= now() THEN
        IF NOT idempotency.expiry_refuses(r) THEN
            RETURN 'started';
        END IF;
        RETURN CASE WHEN r.request_sha256 = fingerprint THEN 'expired' ELSE 'mismatch' END;
    END IF;
    IF r.request_sha256 <> fingerprint THEN
        RETURN 'mismatch';
    END IF;
    IF r.state = 'expired' THEN
        RETURN 'expired';
    END IF;
    IF r.state = 'completed' THEN
        RETURN CASE WHEN r.one_time_secret THEN 'secret_replay' ELSE 'replay' END;
    END IF;
    RETURN CASE WHEN leased THEN 'in_progress' ELSE 'started' END;
END
$$;
COMMENT ON FUNCTION idempotency.outcome_for(idempotency.keys, bytea) IS
    'Trusted edition: the outcome of begin or acquire for a key row';

-- The key_outcome row of an outcome and the row it was decided on.
CREATE FUNCTION idempotency.answer(outcome text, r idempotency.keys)
RETURNS idempotency.key_outcome
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a idempotency.key_outcome;
BEGIN
    a.outcome := outcome;
    IF r.principal IS NULL THEN
        RETURN a;
    END IF;
    IF outcome = 'expired' THEN
        a.created_at := r.created_at;
        a.expires_at := CASE WHEN r.state = 'expired' THEN r.lease_until ELSE r.expires_at END;
        RETURN a;
    END IF;
    a.created_at := r.created_at;
    a.expires_at := r.expires_at;
    a.fence := r.fence;
    IF outcome <> 'started' THEN
        a.resource_id := r.resource_id;
    END IF;
    IF outcome IN ('replay', 'secret_replay') THEN
        a.response_status := r.response_status;
    END IF;
    IF outcome = 'replay' THEN
        a.response_headers := r.response_headers;
        a.response_body := r.response_body;
    END IF;
    IF outcome IN ('in_progress', 'started') AND r.state <> 'expired' THEN
        a.lease_until := r.lease_until;
    END IF;
    RETURN a;
END
$$;
COMMENT ON FUNCTION idempotency.answer(text, idempotency.keys) IS
    'Trusted edition: the key_outcome row of an outcome';

-- The key row as this transaction sees it. Under REPEATABLE READ or
-- SERIALIZABLE the row is locked (FOR UPDATE), which raises 40001 when a
-- transaction that committed after the snapshot changed or deleted it; a row
-- inserted after the snapshot makes begin's own INSERT raise 40001.
CREATE FUNCTION idempotency.find_key(principal text, key text)
RETURNS idempotency.keys
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r idempotency.keys;
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        SELECT * INTO r FROM idempotency.keys AS k
         WHERE k.principal = find_key.principal AND k.key = find_key.key;
    ELSE
        BEGIN
            SELECT * INTO r FROM idempotency.keys AS k
             WHERE k.principal = find_key.principal AND k.key = find_key.key FOR UPDATE;
        EXCEPTION WHEN serialization_failure THEN
            RAISE EXCEPTION 'could not serialize access due to a concurrent use of the '
                            'idempotency key' USING ERRCODE = '40001',
                HINT = 'Retry the transaction; it will see the stored response.';
        END;
    END IF;
    RETURN r;
END
$$;
COMMENT ON FUNCTION idempotency.find_key(text, text) IS
    'Trusted edition: the key row (locked under REPEATABLE READ and SERIALIZABLE)';

CREATE FUNCTION idempotency.refuse_read_only()
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('transaction_read_only') = 'on' THEN
        RAISE EXCEPTION 'cannot use an idempotency key in a read-only transaction'
            USING ERRCODE = '25006';
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.refuse_read_only() IS
    'Trusted edition: 25006 in a read-only transaction';

-- The row of a key begun in this transaction (NULL when another row exists).
CREATE FUNCTION idempotency.insert_begun(principal text, key text, action text,
                                         fingerprint bytea, ttl interval, fence bigint)
RETURNS idempotency.keys
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r idempotency.keys;
BEGIN
    INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state,
                                       created_at, expires_at, fence)
    VALUES (principal, key, action, fingerprint, 'in_progress', now(), now() + ttl, fence)
    ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
    RETURNING * INTO r;
    RETURN r;
END
$$;
COMMENT ON FUNCTION idempotency.insert_begun(text, text, text, bytea, interval, bigint) IS
    'Trusted edition: inserts the row of a key begun in this transaction';

-- begin for one key whose arguments are checked: shared by begin and
-- begin_batch. A started key writes its row at once, in_progress with no
-- lease (only this transaction sees it); complete turns it into the
-- completed row, and the deferred trigger keys_begun_must_complete refuses
-- the commit (55000) while it is still there.
CREATE FUNCTION idempotency.begin_key(principal text, key text, action text,
                                      fingerprint bytea, ttl interval, wait_ms bigint)
RETURNS idempotency.key_outcome
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r idempotency.keys;
    outcome text;
    lock_id bigint := hashtextextended(octet_length(principal)::text || ':' || principal || key,
                                       18756);  -- idempotency.key_lock_id, inline
    new_fence bigint;
    started_row idempotency.key_outcome;
BEGIN
    -- A live completed row answers without the lock: it cannot change while
    -- it lives (only forget removes it), so a replay never queues.
    SELECT * INTO r FROM idempotency.keys AS k
     WHERE k.principal = begin_key.principal AND k.key = begin_key.key;
    IF r.state = 'in_progress' AND r.lease_until IS NULL THEN
        RAISE EXCEPTION 'the idempotency key was already started in this transaction'
            USING ERRCODE = '55000';
    END IF;
    IF r.state = 'completed' AND r.expires_at > now()
       AND current_setting('transaction_isolation') = 'read committed' THEN
        RETURN idempotency.answer(idempotency.outcome_for(r, fingerprint), r);
    END IF;
    IF NOT pg_try_advisory_xact_lock(lock_id) THEN
        IF wait_ms <= 0 THEN
            RETURN idempotency.answer('in_progress', NULL);
        END IF;
        -- Contended: wait in a subtransaction. When the outcome is not started,
        -- the subtransaction is rolled back, which releases the lock at once.
        BEGIN
            IF NOT idempotency.key_lock(lock_id, wait_ms) THEN
                RETURN idempotency.answer('in_progress', NULL);
            END IF;
            r := idempotency.find_key(principal, key);
            outcome := idempotency.outcome_for(r, fingerprint);
            IF outcome <> 'started' THEN
                RAISE EXCEPTION USING ERRCODE = 'IDEM1';
            END IF;
        EXCEPTION WHEN SQLSTATE 'IDEM1' THEN
            RETURN idempotency.answer(outcome, r);
        END;
    ELSIF current_setting('transaction_isolation') = 'read committed' THEN
        -- Under READ COMMITTED a row seen before the lock is read again (a
        -- transaction may have changed it in between). With no row before the
        -- lock, the INSERT below finds out whether one was committed since.
        IF r.principal IS NOT NULL THEN
            SELECT * INTO r FROM idempotency.keys AS k
             WHERE k.principal = begin_key.principal AND k.key = begin_key.key;
            IF r.principal IS NOT NULL THEN
                outcome := idempotency.outcome_for(r, fingerprint);
                IF outcome <> 'started' THEN
                    RETURN idempotency.answer(outcome, r);
                END IF;
            END IF;
        END IF;
    ELSE
        r := idempotency.find_key(principal, key);
        outcome := idempotency.outcome_for(r, fingerprint);
        IF outcome <> 'started' THEN
            RETURN idempotency.answer(outcome, r);
        END IF;
    END IF;
    new_fence := CASE WHEN r.fence IS NULL OR r.fence < 9223372036854775807
                      THEN greatest((extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
                                    coalesce(r.fence + 1, 1))
                      ELSE idempotency.next_fence(r.fence) END;  -- 22003 at the largest
    IF r.principal IS NULL THEN
        -- Under REPEATABLE READ a row committed after the snapshot makes the
        -- INSERT raise 40001 (a subtransaction there only, for the message).
        IF current_setting('transaction_isolation') = 'read committed' THEN
            INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state,
                                               created_at, expires_at, fence)
            VALUES (principal, key, action, fingerprint, 'in_progress', now(), now() + ttl,
                    new_fence)
            ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
            RETURNING * INTO r;
            IF r.principal IS NULL THEN
                -- Committed between the first lookup and the lock: answer for it.
                SELECT * INTO r FROM idempotency.keys AS k
                 WHERE k.principal = begin_key.principal AND k.key = begin_key.key;
                outcome := idempotency.outcome_for(r, fingerprint);
                IF r.principal IS NOT NULL AND outcome <> 'started' THEN
                    RETURN idempotency.answer(outcome, r);
                END IF;
                r := NULL;  -- gone again, or already dead: the caller retries (40001)
            END IF;
        ELSE
            BEGIN
                r := idempotency.insert_begun(principal, key, action, fingerprint, ttl,
                                              new_fence);
            EXCEPTION WHEN serialization_failure THEN
                r := NULL;
            END;
        END IF;
        IF r.principal IS NULL THEN
            RAISE EXCEPTION 'could not serialize access due to a concurrent use of the '
                            'idempotency key' USING ERRCODE = '40001',
                HINT = 'Retry the transaction; it will see the stored response.';
        END IF;
    ELSE
        UPDATE idempotency.keys AS k
           SET action = begin_key.action, request_sha256 = fingerprint, state = 'in_progress',
               response_status = NULL, response_headers = NULL, response_body = NULL,
               resource_id = NULL, one_time_secret = false, fence = new_fence,
               lease_until = NULL, created_at = now(), expires_at = now() + ttl
         WHERE k.principal = begin_key.principal AND k.key = begin_key.key
           AND k.fence = r.fence
        RETURNING * INTO r;
        IF NOT FOUND THEN
            -- cleanup (or forget), which takes no key lock, deleted the dead row
            -- after it was read: the key has no row now.
            r := idempotency.insert_begun(principal, key, action, fingerprint, ttl, new_fence);
            IF r.principal IS NULL THEN
                RAISE EXCEPTION 'could not serialize access due to a concurrent use of the '
                                'idempotency key' USING ERRCODE = '40001',
                    HINT = 'Retry the transaction; it will see the stored response.';
            END IF;
        END IF;
    END IF;
    started_row.outcome := 'started';
    started_row.created_at := r.created_at;
    started_row.expires_at := r.expires_at;
    started_row.fence := r.fence;
    RETURN started_row;
END
$$;
COMMENT ON FUNCTION idempotency.begin_key(text, text, text, bytea, interval, bigint) IS
    'Trusted edition: begin for one checked key (begin and begin_batch)';

CREATE FUNCTION idempotency.begin(principal text, key text, action text, fingerprint bytea,
                                  ttl interval DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS idempotency.key_outcome
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s record := idempotency.protocol_settings();
BEGIN
    PERFORM idempotency.check_request(principal, key, action, fingerprint,
                                      s.max_key_length, s.key_format);
    IF current_setting('transaction_read_only') = 'on' THEN
        PERFORM idempotency.refuse_read_only();
    END IF;
    RETURN idempotency.begin_key(principal, key, action, fingerprint,
                                 CASE WHEN ttl IS NULL THEN s.key_ttl
                                      ELSE idempotency.check_ttl(ttl, s.key_ttl) END,
                                 CASE WHEN wait IS NULL THEN s.wait_ms
                                      ELSE idempotency.check_wait(wait, s.wait_ms) END);
END
$$;
COMMENT ON FUNCTION idempotency.begin(text, text, text, bytea, interval, interval) IS
    'Claims (principal, key) for this transaction and returns the outcome: started, replay, '
    'mismatch, in_progress, secret_replay or expired; waits at most wait (default '
    'idempotency.wait_timeout) for a transaction holding the key';

-- Commit refused while a key begun in this transaction is not completed.
CREATE FUNCTION idempotency.begun_must_complete()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT FROM idempotency.keys AS k
                WHERE k.principal = NEW.principal AND k.key = NEW.key
                  AND k.state = 'in_progress' AND k.lease_until IS NULL) THEN
        RAISE EXCEPTION 'an idempotency key begun in this transaction was not completed'
            USING ERRCODE = '55000',
                  HINT = 'Call idempotency.complete() before COMMIT, or roll back.';
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION idempotency.begun_must_complete() IS
    'Trusted edition: refuses (55000) the commit of a key begun and not completed';

CREATE CONSTRAINT TRIGGER keys_begun_must_complete
    AFTER INSERT OR UPDATE ON idempotency.keys
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.state = 'in_progress' AND NEW.lease_until IS NULL)
    EXECUTE FUNCTION idempotency.begun_must_complete();

-- complete without a fence, for one checked key: shared with complete_batch.
CREATE FUNCTION idempotency.complete_key(principal text, key text, status integer, body bytea,
                                         headers jsonb, resource_id text,
                                         one_time_secret boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE idempotency.keys AS k
       SET state = 'completed', response_status = status,
           response_body = CASE WHEN complete_key.one_time_secret THEN NULL ELSE body END,
           response_headers = CASE WHEN complete_key.one_time_secret THEN NULL ELSE headers END,
           resource_id = complete_key.resource_id,
           one_time_secret = coalesce(complete_key.one_time_secret, false)
     WHERE k.principal = complete_key.principal AND k.key = complete_key.key
       AND k.state = 'in_progress' AND k.lease_until IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key was not begun in this transaction, or already completed'
            USING ERRCODE = '55000',
                  HINT = 'Call idempotency.begin() first, in the same transaction.';
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION idempotency.complete_key(text, text, integer, bytea, jsonb, text, boolean)
    IS 'Trusted edition: complete for one key begun in this transaction';

CREATE FUNCTION idempotency.complete(principal text, key text, status integer,
                                     body bytea DEFAULT NULL, headers jsonb DEFAULT NULL,
                                     resource_id text DEFAULT NULL,
                                     one_time_secret boolean DEFAULT false,
                                     fence bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Without a fence only the key's checks are read here: the key must be one
    -- begin started in this transaction, after begin checked every setting.
    s record;
    max_key_length integer;
    key_format text;
BEGIN
    IF fence IS NOT NULL THEN
        s := idempotency.protocol_settings();
        max_key_length := s.max_key_length;
        key_format := s.key_format;
    ELSE
        max_key_length :=
            CASE WHEN coalesce(current_setting('idempotency.max_key_length', true), '') = ''
                 THEN 255
                 ELSE idempotency.setting_int('idempotency.max_key_length', 255, 1, 1024) END;
        key_format := coalesce(nullif(current_setting('idempotency.key_format', true), ''),
                               'any');
        IF key_format NOT IN ('any', 'uuid', 'uuidv7') THEN
            PERFORM idempotency.setting_bad('idempotency.key_format', key_format,
                                            'any, uuid, uuidv7');
        END IF;
    END IF;
    IF principal IS NULL OR key IS NULL OR status IS NULL THEN
        RAISE EXCEPTION 'principal, key and status must not be null' USING ERRCODE = '22004';
    END IF;
    IF status < 100 OR status > 599 THEN
        PERFORM idempotency.check_status(status);
    END IF;
    IF headers IS NOT NULL THEN
        PERFORM idempotency.check_headers(headers);
    END IF;
    IF current_setting('transaction_read_only') = 'on' THEN
        PERFORM idempotency.refuse_read_only();
    END IF;
    IF fence IS NOT NULL THEN
        IF octet_length(principal) = 0 OR octet_length(principal) > 1024 THEN
            PERFORM idempotency.check_principal(principal);
        END IF;
        IF octet_length(key) = 0 OR octet_length(key) > max_key_length
           OR key_format <> 'any' OR key ~ '[\x01-\x1f\x7f\u0080-\u009f]' THEN
            PERFORM idempotency.check_key(key, max_key_length, key_format);
        END IF;
        RETURN idempotency.complete_lease(principal, key, fence, status, body, headers,
                                          resource_id, coalesce(one_time_secret, false));
    END IF;
    -- Without a fence, as the C++ edition: a key not begun in this transaction
    -- is 55000 before anything else is judged (its principal and key were
    -- checked by begin), then a status that is not final is 22023.
    IF NOT idempotency.is_final(status) THEN
        IF EXISTS (SELECT FROM idempotency.keys AS k
                    WHERE k.principal = complete.principal AND k.key = complete.key
                      AND k.state = 'in_progress' AND k.lease_until IS NULL) THEN
            RAISE EXCEPTION 'status % is not final', status USING ERRCODE = '22023',
                HINT = 'Roll back instead, so that a retry runs again '
                       '(idempotency.final_statuses).';
        END IF;
        RAISE EXCEPTION 'idempotency key was not begun in this transaction, or already completed'
            USING ERRCODE = '55000',
                  HINT = 'Call idempotency.begin() first, in the same transaction.';
    END IF;
    -- complete_key, inline.
    UPDATE idempotency.keys AS k
       SET state = 'completed', response_status = status,
           response_body = CASE WHEN complete.one_time_secret THEN NULL ELSE body END,
           response_headers = CASE WHEN complete.one_time_secret THEN NULL ELSE headers END,
           resource_id = complete.resource_id,
           one_time_secret = coalesce(complete.one_time_secret, false)
     WHERE k.principal = complete.principal AND k.key = complete.key
       AND k.state = 'in_progress' AND k.lease_until IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key was not begun in this transaction, or already completed'
            USING ERRCODE = '55000',
                  HINT = 'Call idempotency.begin() first, in the same transaction.';
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION idempotency.complete(text, text, integer, bytea, jsonb, text, boolean,
                                         bigint) IS
    'Stores the final response of a key begun in this transaction (55000 otherwise); with '
    'fence, the lease protocol''s completion (false when the lease was lost)';

-- Whether the key was begun (and not completed) in this transaction: 55000.
CREATE FUNCTION idempotency.refuse_begun(principal text, key text, hint text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT FROM idempotency.keys AS k
                WHERE k.principal = refuse_begun.principal AND k.key = refuse_begun.key
                  AND k.state = 'in_progress' AND k.lease_until IS NULL) THEN
        RAISE EXCEPTION 'the idempotency key was begun in this transaction'
            USING ERRCODE = '55000', HINT = hint;
    END IF;
END
$$;
COMMENT ON FUNCTION idempotency.refuse_begun(text, text, text) IS
    'Trusted edition: 55000 when this transaction began the key';

CREATE FUNCTION idempotency.save_final(principal text, key text, action text, fingerprint bytea,
                                       status integer, body bytea DEFAULT NULL,
                                       headers jsonb DEFAULT NULL, ttl interval DEFAULT NULL,
                                       one_time_secret boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s record := idempotency.protocol_settings();
    span interval;
    r idempotency.keys;
    secret boolean := coalesce(one_time_secret, false);
BEGIN
    PERFORM idempotency.check_request(principal, key, action, fingerprint,
                                      s.max_key_length, s.key_format);
    PERFORM idempotency.check_status(status);
    PERFORM idempotency.check_headers(headers);
    span := idempotency.check_ttl(ttl, s.key_ttl);
    PERFORM idempotency.refuse_read_only();
    PERFORM idempotency.refuse_begun(principal, key, 'Use idempotency.complete() there.');
    IF NOT idempotency.is_final(status) THEN
        RETURN false;
    END IF;
    IF NOT idempotency.key_lock(idempotency.key_lock_id(principal, key), s.wait_ms) THEN
        RETURN false;
    END IF;
    r := idempotency.find_key(principal, key);
    IF idempotency.expiry_refuses_takeover(r) THEN
        RETURN false;
    END IF;
    INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state,
                                       response_status, response_headers, response_body,
                                       resource_id, one_time_secret, created_at, expires_at,
                                       fence)
    VALUES (principal, key, action, fingerprint, 'completed', status,
            CASE WHEN secret THEN NULL ELSE headers END,
            CASE WHEN secret THEN NULL ELSE body END, NULL, secret, now(), now() + span,
            idempotency.next_fence(r.fence))
    ON CONFLICT ON CONSTRAINT keys_pkey DO UPDATE
       SET action = excluded.action, request_sha256 = excluded.request_sha256,
           state = 'completed', response_status = excluded.response_status,
           response_headers = excluded.response_headers, response_body = excluded.response_body,
           resource_id = excluded.resource_id, one_time_secret = excluded.one_time_secret,
           fence = greatest(excluded.fence, k.fence + 1), lease_until = NULL,
           created_at = excluded.created_at, expires_at = excluded.expires_at
     WHERE (k.expires_at <= now()
            AND (k.lease_until IS NULL OR k.lease_until <= clock_timestamp()))
        OR (k.state = 'in_progress' AND k.lease_until <= clock_timestamp()
            AND k.request_sha256 = excluded.request_sha256);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION idempotency.save_final(text, text, text, bytea, integer, bytea, jsonb,
                                           interval, boolean) IS
    'Stores a final error response in its own transaction after the attempt rolled back; '
    'false when the key has a live row, is refused as expired, or the wait ran out';

CREATE FUNCTION idempotency.forget(principal text, key text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idempotency.protocol_settings();
    DELETE FROM idempotency.keys AS k
     WHERE k.principal = forget.principal AND k.key = forget.key;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION idempotency.forget(text, text) IS
    'Operator tool: removes one key (true if a row was deleted)';
