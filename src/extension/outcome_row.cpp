// The idempotency.key_outcome row of an outcome, and the descriptor it is
// formed with (kept across calls by the type cache).
#include "outcome_row.hpp"

extern "C" {
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"
}

namespace idem::pg {

namespace {

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
