// SQL entry points of the transactional protocol (the effect commits in the
// caller's transaction): idempotency.begin, complete, save_final, is_final,
// forget, bound_principal.
//
// How duplicates are kept apart. begin() takes the key lock, then looks the
// key up. A new key writes nothing yet: the key row is inserted once, by
// complete(), in the caller's transaction. So a request costs one index lookup
// and one insert, and leaves no dead tuple behind. A duplicate that arrives
// meanwhile blocks on the lock; when the first transaction commits its row is
// visible (the lookup takes a new snapshot in READ COMMITTED) and the
// duplicate replays; when it rolls back the duplicate starts.
#include "arguments.hpp"
#include "counters.hpp"
#include "guard.hpp"
#include "key_lock.hpp"
#include "key_store.hpp"
#include "one_key.hpp"
#include "outcome.hpp"
#include "outcome_counts.hpp"
#include "outcome_row.hpp"
#include "pending.hpp"
#include "settings.hpp"

extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
}

using namespace idem::pg;

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_begin);
}
/// idempotency.begin(principal, key, action, fingerprint, ttl, wait) -> key_outcome
Datum idempotency_begin(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        const Request request = request_arguments(fcinfo);
        const Interval ttl = ttl_argument(fcinfo, 4);
        const int wait_ms = wait_argument(fcinfo, 5);
        PreventCommandIfReadOnly("idempotency.begin()");
        refuse_if_open(request.principal, request.key);

        KeyRow shown;
        const Outcome outcome = begin_key(request, ttl, wait_ms, &shown);
        return outcome_result(fcinfo, outcome, &shown);
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_complete);
}
/// idempotency.complete(principal, key, status, body, headers, resource_id, one_time_secret, fence)
/// -> boolean Without fence: stores the response of a key begun in this transaction. With fence:
/// the lease protocol's completion, true while fence holds the key.
Datum idempotency_complete(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        require_arguments(fcinfo, 3, "principal, key and status");
        const StoredResponse response = response_arguments(fcinfo, 2, 3, 4, 5, 6);
        if (argument_given(fcinfo, 7)) {
            PreventCommandIfReadOnly("idempotency.complete()");
            check_principal_binding(PG_GETARG_TEXT_PP(0));
            text* action = nullptr;
            const bool held = complete_lease(PG_GETARG_DATUM(0), PG_GETARG_DATUM(1),
                                             PG_GETARG_DATUM(7), response, &action);
            PG_RETURN_BOOL(count_fenced(Counter::lease_completed, held, action,
                                        PG_GETARG_TEXT_PP(0), PG_GETARG_TEXT_PP(1)));
        }
        // The key was begun under the binding, but the role may have changed since
        // (SET ROLE inside the transaction): the role completing must be bound too.
        check_principal_binding(PG_GETARG_TEXT_PP(0));
        PendingKey* entry = find_pending(PG_GETARG_TEXT_PP(0), PG_GETARG_TEXT_PP(1));
        require_completable(entry, PG_GETARG_TEXT_PP(0), response.status);
        complete_key(entry, response);
        PG_RETURN_BOOL(true);
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_save_final);
}
/// idempotency.save_final(principal, key, action, fingerprint, status, body, headers, ttl,
/// one_time_secret)
/// -> boolean. False when nothing was stored: not final, a live row of the key,
/// or the wait for a transaction that holds the key ran out (the response may
/// or may not be stored by then; the caller answers the same either way).
Datum idempotency_save_final(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        const Request request = request_arguments(fcinfo);
        require_arguments(fcinfo, 5, "status");
        const StoredResponse response = response_arguments(fcinfo, 4, 5, 6, -1, 8);
        const Interval ttl = ttl_argument(fcinfo, 7);
        PreventCommandIfReadOnly("idempotency.save_final()");
        refuse_if_begun(request.principal, request.key, "idempotency.save_final()");
        if (!is_final_status(response.status))
            PG_RETURN_BOOL(count_save_final(request.action, false));

        const KeyLock lock = lock_key(request.principal, request.key, wait_timeout_ms);
        count_wait(request.action, lock);
        if (lock.holder == LockHolder::none)
            PG_RETURN_BOOL(count_save_final(request.action, false));
        // A key that expired and is refused (a tombstone, or a row cleanup has
        // not reached yet, even while a lease still holds it: that lease may end
        // before the upsert below, whose WHERE checks liveness only) stores
        // nothing: the retry was told `expired`.
        if (expiry_refuses_takeover(lookup_key(request.principal, request.key, InvalidSnapshot)))
            PG_RETURN_BOOL(count_save_final(request.action, false));
        PG_RETURN_BOOL(count_save_final(
            request.action, store_completed(request, response, &ttl, next_fence(KeyRow{}), false)));
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_is_final);
}
/// idempotency.is_final(status) -> boolean
Datum idempotency_is_final(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        PG_RETURN_BOOL(is_final_status(PG_GETARG_INT32(0)));
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_forget);
}
/// idempotency.forget(principal, key) -> boolean: removes one key (operator tool).
Datum idempotency_forget(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        check_principal_binding(PG_GETARG_TEXT_PP(0));
        PreventCommandIfReadOnly("idempotency.forget()");
        PG_RETURN_BOOL(forget_key(PG_GETARG_TEXT_PP(0), PG_GETARG_TEXT_PP(1)));
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_bound_principal);
}
/// idempotency.bound_principal(principal) -> text: the principal, when the
/// calling role may act for it under idempotency.principal_binding (42501 otherwise).
Datum idempotency_bound_principal(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        check_principal_binding(PG_GETARG_TEXT_PP(0));
        PG_RETURN_DATUM(PG_GETARG_DATUM(0));
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_check_expiry_policy);
}
/// idempotency.check_expiry_policy(action, grace) -> void: set_expiry_policy's
/// checks of its action (begin's: 1 to 1024 bytes) and its grace (the ttl's:
/// more than 0 and at most 366 days on the timestamps it gives), so that a
/// policy can be set only for an action that begin accepts, with a grace that
/// a ttl could have. 22023 otherwise.
Datum idempotency_check_expiry_policy(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        require_arguments(fcinfo, 2, "action and grace");
        check_action(PG_GETARG_TEXT_PP(0));
        check_grace(PG_GETARG_INTERVAL_P(1));
        PG_RETURN_VOID();
    });
}
