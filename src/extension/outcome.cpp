// From a key row to the outcome of begin() and acquire(), and the one place
// where an outcome becomes the text of idempotency.key_outcome.outcome.
#include "outcome.hpp"

#include "counters.hpp"
#include "key_store.hpp"

extern "C" {
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"
}

namespace idem::pg {

namespace {

const char* outcome_text(Outcome outcome) {
    switch (outcome) {
        case Outcome::started: return "started";
        case Outcome::replay: return "replay";
        case Outcome::mismatch: return "mismatch";
        case Outcome::in_progress: return "in_progress";
        case Outcome::secret_replay: return "secret_replay";
        case Outcome::expired: return "expired";
    }
    pg_unreachable();
}

// Columns of idempotency.key_outcome.
enum ResultColumn {
    rOutcome,
    rStatus,
    rHeaders,
    rBody,
    rResourceId,
    rCreated,
    rExpires,
    rFence,
    rLeaseUntil,
    rColumns
};
static_assert(rColumns == kOutcomeColumns, "the columns of idempotency.key_outcome");

// The result's descriptor: the type the call expression declares, whose
// descriptor the type cache keeps across calls and statements (fn_extra lives
// only as long as one execution of a statement). Calls without an expression
// (direct function calls) fall back to get_call_result_type, kept in fn_extra.
// `release`: the descriptor is reference-counted and must be released.
TupleDesc result_descriptor(FunctionCallInfo fcinfo, bool* release) {
    const Oid type = get_fn_expr_rettype(fcinfo->flinfo);
    if (OidIsValid(type) && type != RECORDOID) {
        TupleDesc desc = lookup_rowtype_tupdesc_noerror(type, -1, true);
        if (desc != nullptr) {
            *release = true;
            return desc;
        }
    }
    *release = false;
    TupleDesc desc = static_cast<TupleDesc>(fcinfo->flinfo->fn_extra);
    if (desc == nullptr) {
        TupleDesc found;
        if (get_call_result_type(fcinfo, nullptr, &found) != TYPEFUNC_COMPOSITE)
            ereport(ERROR,
                    (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                     errmsg("function returning a row called in a context that cannot accept it")));
        MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
        desc = BlessTupleDesc(CreateTupleDescCopy(found));
        MemoryContextSwitchTo(old);
        fcinfo->flinfo->fn_extra = desc;
    }
    return desc;
}

}  // namespace

Outcome outcome_for(const KeyRow& row, bytea* fingerprint) {
    if (!row.found) return Outcome::started;
    const bool refused = expiry_refuses(row);
    if (!refused && !row.live()) return Outcome::started;
    if (VARSIZE_ANY_EXHDR(row.request_sha256) != 32 ||
        memcmp(VARDATA_ANY(row.request_sha256), VARDATA_ANY(fingerprint), 32) != 0)
        return Outcome::mismatch;
    if (refused) return Outcome::expired;
    if (row.completed) return row.one_time_secret ? Outcome::secret_replay : Outcome::replay;
    return row.leased() ? Outcome::in_progress : Outcome::started;
}

void require_snapshot_sees_winner(const Request& request, const KeyRow& seen) {
    if (!IsolationUsesXactSnapshot()) return;
    const KeyRow latest = lookup_key(request.principal, request.key, GetLatestSnapshot());
    // Nothing committed under the key since the snapshot (or the row was
    // deleted since): what the snapshot saw is what will be replaced. Any
    // other row - a winner to replay, or one that expired by now() but that
    // the snapshot cannot see, which complete() would collide with - is a
    // concurrent change this transaction cannot build on.
    if (!latest.found || (seen.found && latest.fence == seen.fence)) return;
    count_event(Counter::serialization_failures, request.action);
    ereport(ERROR,
            (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
             errmsg("could not serialize access due to a concurrent use of the idempotency key"),
             errhint("Retry the transaction; it will see the stored response.")));
}

namespace {

// The counter of an outcome: the five of begin, or the five of acquire, in
// the order of Outcome's texts in idempotency.stats; expired (0.8.0) after them.
Counter outcome_counter(Caller caller, Outcome outcome) {
    const int base = static_cast<int>(caller == Caller::begin ? Counter::begin_started
                                                              : Counter::acquire_started);
    switch (outcome) {
        case Outcome::started: return static_cast<Counter>(base + 0);
        case Outcome::replay: return static_cast<Counter>(base + 1);
        case Outcome::secret_replay: return static_cast<Counter>(base + 2);
        case Outcome::mismatch: return static_cast<Counter>(base + 3);
        case Outcome::in_progress: return static_cast<Counter>(base + 4);
        case Outcome::expired:
            return caller == Caller::begin ? Counter::begin_expired : Counter::acquire_expired;
    }
    pg_unreachable();
}

}  // namespace

void count_outcome(Caller caller, text* action, Outcome outcome, const KeyLock& lock,
                   const KeyRow* row) {
    const bool takeover = outcome == Outcome::started && row != nullptr && row->found &&
                          !row->completed && !row->tombstone;
    count_start(outcome_counter(caller, outcome), action, takeover, lock.waited, lock.waited_us);
}

void count_wait(text* action, const KeyLock& lock) {
    if (lock.waited) count_wait(action, lock.waited_us);
}

bool count_save_final(text* action, bool stored) {
    count_event(stored ? Counter::save_final_stored : Counter::save_final_refused, action);
    return stored;
}

bool count_fenced(Counter done, bool held, text* action, text* principal, text* key) {
    if (held) {
        count_event(done, action);
    } else if (counters_on()) {
        const KeyRow row = lookup_key(principal, key, InvalidSnapshot);
        count_event(Counter::stale_fence, row.found ? DatumGetTextPP(row.action) : nullptr);
    }
    return held;
}

void outcome_columns(Outcome outcome, const KeyRow* row, Datum* values, bool* nulls) {
    for (int column = 0; column < rColumns; ++column) {
        values[column] = 0;
        nulls[column] = true;
    }
    auto set = [&](ResultColumn column, Datum value) {
        values[column] = value;
        nulls[column] = false;
    };
    set(rOutcome, CStringGetTextDatum(outcome_text(outcome)));
    if (outcome == Outcome::expired) {
        // Only when the key was first used and when it expired: nothing else is kept.
        set(rCreated, TimestampTzGetDatum(row->created_at));
        set(rExpires, TimestampTzGetDatum(row->expired_at()));
    } else if (row != nullptr && row->found) {
        if (row->has_times) {
            set(rCreated, TimestampTzGetDatum(row->created_at));
            set(rExpires, TimestampTzGetDatum(row->expires_at));
        }
        set(rFence, Int64GetDatum(row->fence));
        if (outcome != Outcome::started && !row->resource_id_null)
            set(rResourceId, row->resource_id);
        if ((outcome == Outcome::replay || outcome == Outcome::secret_replay) && row->has_status)
            set(rStatus, Int32GetDatum(row->status));
        if (outcome == Outcome::replay) {
            if (!row->headers_null) set(rHeaders, row->headers);
            if (!row->body_null) set(rBody, row->body);
        }
        if ((outcome == Outcome::in_progress || outcome == Outcome::started) && row->has_lease)
            set(rLeaseUntil, TimestampTzGetDatum(row->lease_until));
    }
}

Datum outcome_result(FunctionCallInfo fcinfo, Outcome outcome, const KeyRow* row) {
    Datum values[rColumns];
    bool nulls[rColumns];
    outcome_columns(outcome, row, values, nulls);
    bool release;
    TupleDesc desc = result_descriptor(fcinfo, &release);
    HeapTuple tuple = heap_form_tuple(desc, values, nulls);
    if (release) ReleaseTupleDesc(desc);
    return HeapTupleGetDatum(tuple);
}

}  // namespace idem::pg
