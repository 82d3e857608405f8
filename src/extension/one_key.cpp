// The protocol for one key, shared by the single-key entry points
// (transactional.cpp, lease.cpp) and the batches (batch.cpp). See one_key.hpp.
#include "one_key.hpp"

#include "counters.hpp"
#include "key_lock.hpp"
#include "key_store.hpp"
#include "outcome.hpp"
#include "outcome_counts.hpp"
#include "placement.hpp"
#include "snapshot_check.hpp"
#include "settings.hpp"

extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
}

namespace idem::pg {

void refuse_if_open(text* principal, text* key) {
    const PendingKey* mine = find_pending(principal, key);
    if (mine != nullptr && mine->completed_subxact == InvalidSubTransactionId)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("idempotency key was already started in this transaction"),
                        errhint("Call idempotency.complete() for it first.")));
}

Outcome begin_key(const Request& request, const Interval& ttl, int wait_ms, KeyRow* shown) {
    const KeyLock lock = lock_key(request.principal, request.key, wait_ms);
    if (lock.holder == LockHolder::none) {
        count_outcome(Caller::begin, request.action, Outcome::in_progress, lock, nullptr);
        shown->found = false;
        return Outcome::in_progress;
    }

    const KeyRow row = lookup_key(request.principal, request.key, InvalidSnapshot);
    const Outcome outcome = outcome_for(row, request.fingerprint);
    if (outcome != Outcome::started) {
        count_outcome(Caller::begin, request.action, outcome, lock, &row);
        *shown = row;
        unlock_key(lock);  // nothing to do under this key: waiting duplicates may go on
        return outcome;
    }

    require_snapshot_sees_winner(request, row);
    count_outcome(Caller::begin, request.action, Outcome::started, lock, &row);
    // The row complete() will write, with the fence drawn now so that the caller knows it.
    KeyRow started;
    started.found = true;
    started.fence = next_fence(row);
    started.created_at = GetCurrentTransactionStartTimestamp();
    started.expires_at = DatumGetTimestampTz(
        DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(started.created_at),
                            IntervalPGetDatum(const_cast<Interval*>(&ttl))));
    started.has_times = true;
    add_pending(request, ttl, started.fence, row.found);
    *shown = started;
    return Outcome::started;
}

void require_completable(const PendingKey* entry, text* principal, int status) {
    // Under Citus a complete that Citus did not delegate runs on the node it was
    // sent to (the coordinator), which never saw the begin delegated elsewhere.
    if (entry == nullptr && shard_elsewhere(principal))
        ereport(
            ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("idempotency key was not started in this transaction"),
             errdetail("This node does not hold the principal's shard: the call ran on the node "
                       "it was sent to, not where begin ran. Citus delegates a call alone in its "
                       "statement, SELECT f(...) or SELECT ... FROM f(...), with the principal a "
                       "literal or a parameter."),
             errhint("Send complete in that form, or on the connection to the node of the "
                     "principal's shard (see docs/scale-out.md).")));
    if (entry == nullptr)
        ereport(
            ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("idempotency key was not started in this transaction"),
             errhint("Call idempotency.begin() in the same transaction and complete only when it "
                     "returns started; pass fence => for a key taken with "
                     "idempotency.acquire().")));
    if (entry->completed_subxact != InvalidSubTransactionId)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("idempotency key was already completed in this transaction")));
    if (!is_final_status(status))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("HTTP status %d is not final and cannot be stored", status),
                        errhint("Roll back instead, so that a retry runs again; see "
                                "idempotency.final_statuses.")));
}

void complete_key(PendingKey* entry, const StoredResponse& response) {
    const bool stored =
        store_completed(entry->request, response, &entry->ttl, entry->fence, !entry->replaces);
    count_event(stored ? Counter::completed : Counter::serialization_failures,
                entry->request.action);
    if (!stored)
        ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                        errmsg("idempotency key was taken by another transaction"),
                        errhint("Retry the transaction.")));
    mark_completed(entry);
}

bool claim_key(text* principal, text* key, const Interval& ttl, int wait_ms) {
    if (lock_key(principal, key, wait_ms).holder == LockHolder::none) return false;
    return insert_claim(principal, key, &ttl, next_fence(KeyRow{}));
}

}  // namespace idem::pg
