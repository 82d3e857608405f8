// SQL entry points of the batches: idempotency.begin_batch, complete_batch and
// claim_batch, each the single-key function (one_key.cpp) for every key of an
// array, answered as one row per key in input order.
//
// Every argument is checked before the first key lock is taken or the first
// row written. The key locks are taken in the order of the keys' bytes
// (BatchKeys::sorted), whatever the input order, so two batches that share
// keys queue behind each other and never wait for each other in a cycle. The
// wait argument (claim_batch: idempotency.wait_timeout) bounds the waiting of
// the whole call: once it is spent, a key held by another transaction is
// answered at once, as with wait => 0.
#include <new>

#include "arguments.hpp"
#include "batch_arguments.hpp"
#include "guard.hpp"
#include "one_key.hpp"
#include "outcome.hpp"
#include "outcome_row.hpp"
#include "pending.hpp"
#include "settings.hpp"

extern "C" {
#include "postgres.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

using namespace idem::pg;

namespace {

// When the call's waiting must end: wait_ms from now.
TimestampTz wait_deadline(int wait_ms) {
    return TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
}

// What is left of the call's wait, in milliseconds (rounded up; 0 once spent).
int remaining_wait_ms(TimestampTz deadline, int wait_ms) {
    if (wait_ms == 0) return 0;
    const int64 left_us = deadline - GetCurrentTimestamp();
    if (left_us <= 0) return 0;
    return static_cast<int>(Min(static_cast<int64>(wait_ms), (left_us + 999) / 1000));
}

// A row (ord, key, flag) of complete_batch and claim_batch.
void put_flag_row(ReturnSetInfo* result, int position, text* key, bool flag) {
    Datum values[3] = {Int32GetDatum(position + 1), PointerGetDatum(key), BoolGetDatum(flag)};
    bool nulls[3] = {false, false, false};
    tuplestore_putvalues(result->setResult, result->setDesc, values, nulls);
}

}  // namespace

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_begin_batch);
}
/// idempotency.begin_batch(principal, keys, action, fingerprints, ttl, wait)
/// -> SETOF batch_outcome: begin() for each key, one row per key in input order.
Datum idempotency_begin_batch(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        require_arguments(fcinfo, 4, "principal, keys, action and fingerprints");
        text* principal = PG_GETARG_TEXT_PP(0);
        text* action = PG_GETARG_TEXT_PP(2);
        check_principal(principal);
        check_action(action);
        const BatchKeys batch = batch_keys(fcinfo, 1);
        Datum* prints =
            batch_array(fcinfo, 3, BYTEAOID, batch.count, "fingerprints", false, nullptr);
        for (int i = 0; i < batch.count; ++i) check_fingerprint(DatumGetByteaPP(prints[i]));
        const Interval ttl = ttl_argument(fcinfo, 4);
        const int wait_ms = wait_argument(fcinfo, 5);
        PreventCommandIfReadOnly("idempotency.begin_batch()");
        for (int i = 0; i < batch.count; ++i) refuse_if_open(principal, batch.keys[i]);

        // Each key in lock order; the answers are kept by position.
        auto* outcomes = static_cast<Outcome*>(palloc(sizeof(Outcome) * Max(batch.count, 1)));
        auto* shown = static_cast<KeyRow*>(palloc(sizeof(KeyRow) * Max(batch.count, 1)));
        const TimestampTz deadline = wait_deadline(wait_ms);
        for (int n = 0; n < batch.count; ++n) {
            const int i = batch.sorted[n];
            const Request request{principal, batch.keys[i], action, DatumGetByteaPP(prints[i])};
            new (&shown[i]) KeyRow();
            outcomes[i] = begin_key(request, ttl, remaining_wait_ms(deadline, wait_ms), &shown[i]);
        }

        InitMaterializedSRF(fcinfo, 0);
        auto* result = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
        Datum values[2 + kOutcomeColumns];
        bool nulls[2 + kOutcomeColumns];
        for (int i = 0; i < batch.count; ++i) {
            values[0] = Int32GetDatum(i + 1);
            values[1] = PointerGetDatum(batch.keys[i]);
            nulls[0] = nulls[1] = false;
            outcome_columns(outcomes[i], &shown[i], values + 2, nulls + 2);
            tuplestore_putvalues(result->setResult, result->setDesc, values, nulls);
        }
        return (Datum)0;
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_complete_batch);
}
/// idempotency.complete_batch(principal, keys, statuses, bodies, headers,
/// resource_ids) -> TABLE (ord, key, completed): complete() for each key begun
/// in this transaction; every key is checked before the first is stored.
Datum idempotency_complete_batch(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        require_arguments(fcinfo, 3, "principal, keys and statuses");
        text* principal = PG_GETARG_TEXT_PP(0);
        // Keys are begun under the binding, but the role may have changed since
        // (SET ROLE inside the transaction): the role completing must be bound too.
        check_principal_binding(principal);
        const BatchKeys batch = batch_keys(fcinfo, 1);
        const int n = batch.count;
        Datum* statuses = batch_array(fcinfo, 2, INT4OID, n, "statuses", false, nullptr);
        bool* no_body = nullptr;
        bool* no_headers = nullptr;
        bool* no_resource = nullptr;
        Datum* bodies = batch_array(fcinfo, 3, BYTEAOID, n, "bodies", true, &no_body);
        Datum* headers = batch_array(fcinfo, 4, JSONBOID, n, "headers", true, &no_headers);
        Datum* resources = batch_array(fcinfo, 5, TEXTOID, n, "resource_ids", true, &no_resource);

        auto* entries = static_cast<PendingKey**>(palloc(sizeof(PendingKey*) * Max(n, 1)));
        for (int i = 0; i < n; ++i) {
            check_status(DatumGetInt32(statuses[i]));
            if (headers != nullptr && !no_headers[i]) check_headers(DatumGetJsonbP(headers[i]));
            entries[i] = find_pending(principal, batch.keys[i]);
            require_completable(entries[i], principal, DatumGetInt32(statuses[i]));
        }

        InitMaterializedSRF(fcinfo, 0);
        auto* result = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
        for (int i = 0; i < n; ++i) {
            StoredResponse response{};
            response.status = DatumGetInt32(statuses[i]);
            response.body_null = bodies == nullptr || no_body[i];
            response.body = response.body_null ? (Datum)0 : bodies[i];
            response.headers_null = headers == nullptr || no_headers[i];
            response.headers = response.headers_null ? (Datum)0 : headers[i];
            response.resource_id_null = resources == nullptr || no_resource[i];
            response.resource_id = response.resource_id_null ? (Datum)0 : resources[i];
            complete_key(entries[i], response);
            put_flag_row(result, i, batch.keys[i], true);
        }
        return (Datum)0;
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_claim_batch);
}
/// idempotency.claim_batch(principal, keys, ttl) -> TABLE (ord, key, claimed):
/// claim() for each key, in one call.
Datum idempotency_claim_batch(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        require_arguments(fcinfo, 2, "principal and keys");
        text* principal = PG_GETARG_TEXT_PP(0);
        check_principal(principal);
        const BatchKeys batch = batch_keys(fcinfo, 1);
        const Interval ttl = ttl_argument(fcinfo, 2);
        PreventCommandIfReadOnly("idempotency.claim_batch()");
        for (int i = 0; i < batch.count; ++i)
            refuse_if_begun(principal, batch.keys[i], "idempotency.claim_batch()");

        auto* claimed = static_cast<bool*>(palloc(sizeof(bool) * Max(batch.count, 1)));
        const TimestampTz deadline = wait_deadline(wait_timeout_ms);
        for (int n = 0; n < batch.count; ++n) {
            const int i = batch.sorted[n];
            claimed[i] = claim_key(principal, batch.keys[i], ttl,
                                   remaining_wait_ms(deadline, wait_timeout_ms));
        }

        InitMaterializedSRF(fcinfo, 0);
        auto* result = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
        for (int i = 0; i < batch.count; ++i) put_flag_row(result, i, batch.keys[i], claimed[i]);
        return (Datum)0;
    });
}
