// SQL entry points of the lease protocol (effects outside the database; each
// call commits on its own, right away): idempotency.acquire, renew, release,
// claim, and the 0.3.0-0.5.0 overload of complete(fence). The lease
// protocol's completion itself is complete(..., fence => f), in
// transactional.cpp with the other complete().
#include "arguments.hpp"
#include "counters.hpp"
#include "guard.hpp"
#include "key_lock.hpp"
#include "key_store.hpp"
#include "one_key.hpp"
#include "outcome.hpp"
#include "outcome_counts.hpp"
#include "outcome_row.hpp"
#include "snapshot_check.hpp"
#include "pending.hpp"
#include "settings.hpp"

extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
}

using namespace idem::pg;

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_acquire);
}
/// idempotency.acquire(principal, key, action, fingerprint, lease, ttl, wait) -> key_outcome
Datum idempotency_acquire(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        const Request request = request_arguments(fcinfo);
        const Interval lease = lease_argument(fcinfo, 4);
        const Interval ttl = ttl_argument(fcinfo, 5);
        const int wait_ms = wait_argument(fcinfo, 6);
        PreventCommandIfReadOnly("idempotency.acquire()");
        refuse_if_begun(request.principal, request.key, "idempotency.acquire()");

        const KeyLock lock = lock_key(request.principal, request.key, wait_ms);
        if (lock.holder == LockHolder::none) {
            count_outcome(Caller::acquire, request.action, Outcome::in_progress, lock, nullptr);
            return outcome_result(fcinfo, Outcome::in_progress, nullptr);
        }

        const KeyRow row = lookup_key(request.principal, request.key, InvalidSnapshot);
        const Outcome outcome = outcome_for(row, request.fingerprint);
        if (outcome != Outcome::started) {
            count_outcome(Caller::acquire, request.action, outcome, lock, &row);
            Datum result = outcome_result(fcinfo, outcome, &row);
            unlock_key(lock);
            return result;
        }

        require_snapshot_sees_winner(request, row);
        // The caller holds the key with this fence as soon as it commits: the
        // grant (and, on a 0.7.0 schema, the sequence past it) must survive a
        // crash even under synchronous_commit = off, or a second holder could
        // start (or a fence be handed out again).
        ForceSyncCommit();
        const KeyRow written = take_lease(request, &lease, &ttl, next_fence(row));
        if (!written.found) {
            count_event(Counter::serialization_failures, request.action);
            ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                            errmsg("idempotency key was taken by another transaction"),
                            errhint("Retry.")));
        }
        count_outcome(Caller::acquire, request.action, Outcome::started, lock, &row);
        return outcome_result(fcinfo, Outcome::started, &written);
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_renew);
}
/// idempotency.renew(principal, key, fence, lease) -> boolean: extends the
/// lease while fence holds the key and the row is live; a lease may outlive
/// the key's ttl.
Datum idempotency_renew(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        require_arguments(fcinfo, 3, "principal, key and fence");
        check_principal_binding(PG_GETARG_TEXT_PP(0));
        const Interval lease = lease_argument(fcinfo, 3);
        PreventCommandIfReadOnly("idempotency.renew()");
        text* action = nullptr;
        const bool held = renew_lease(PG_GETARG_DATUM(0), PG_GETARG_DATUM(1), PG_GETARG_DATUM(2),
                                      &lease, &action);
        PG_RETURN_BOOL(count_fenced(Counter::renewed, held, action, PG_GETARG_TEXT_PP(0),
                                    PG_GETARG_TEXT_PP(1)));
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_release);
}
/// idempotency.release(principal, key, fence) -> boolean: ends a live lease so
/// that a retry may run again; false when fence no longer holds the key or its
/// lease had already run out.
Datum idempotency_release(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        check_principal_binding(PG_GETARG_TEXT_PP(0));
        PreventCommandIfReadOnly("idempotency.release()");
        text* action = nullptr;
        const bool held =
            release_lease(PG_GETARG_DATUM(0), PG_GETARG_DATUM(1), PG_GETARG_DATUM(2), &action);
        PG_RETURN_BOOL(count_fenced(Counter::released, held, action, PG_GETARG_TEXT_PP(0),
                                    PG_GETARG_TEXT_PP(1)));
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_claim);
}
/// idempotency.claim(principal, key, ttl) -> boolean: true for the first caller
/// within ttl. Like every writer of new key rows it holds the key lock: a
/// transaction that holds the key is waited for (idempotency.wait_timeout); if
/// it commits a row the claim fails, if it rolls back the claim can succeed.
Datum idempotency_claim(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        require_arguments(fcinfo, 2, "principal and key");
        text* principal = PG_GETARG_TEXT_PP(0);
        text* key = PG_GETARG_TEXT_PP(1);
        check_principal(principal);
        check_key(key);
        const Interval ttl = ttl_argument(fcinfo, 2);
        PreventCommandIfReadOnly("idempotency.claim()");
        refuse_if_begun(principal, key, "idempotency.claim()");
        PG_RETURN_BOOL(claim_key(principal, key, ttl, wait_timeout_ms));
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_complete_fenced);
}
/// The 0.3.0-0.5.0 overload complete(principal, key, fence, status, body,
/// headers, resource_id, one_time_secret). 0.6.0 drops it from SQL; the symbol
/// stays for the upgrade scripts that create it on the way.
Datum idempotency_complete_fenced(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        require_arguments(fcinfo, 4, "principal, key, fence and status");
        const StoredResponse response = response_arguments(fcinfo, 3, 4, 5, 6, 7);
        PreventCommandIfReadOnly("idempotency.complete()");
        check_principal_binding(PG_GETARG_TEXT_PP(0));
        PG_RETURN_BOOL(
            complete_lease(PG_GETARG_DATUM(0), PG_GETARG_DATUM(1), PG_GETARG_DATUM(2), response));
    });
}
