// The SQL functions over the counters' table (counters.cpp): read every
// (database, action) for idempotency.stats, reset them, and count what
// cleanup deleted. Without the preloaded library they warn and do nothing.
#include "counters.hpp"

#include "counters_table.hpp"
#include "guard.hpp"

#include "compat.hpp"

extern "C" {
#include "postgres.h"

#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

namespace idem::pg {

namespace {

void warn_off() {
    ereport(
        WARNING,
        (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE), errmsg("idempotency counters are off"),
         errdetail("The idempotency library was not loaded by shared_preload_libraries."),
         errhint("Add idempotency to shared_preload_libraries (e.g. 'pg_cron,idempotency') and "
                 "restart the server.")));
}

Datum array_of(const Datum* values, int n, Oid type) {
    return PointerGetDatum(
        construct_array(const_cast<Datum*>(values), n, type, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

// The entry's action name as text of this database. A name is kept in the
// encoding of the database that named it; one named in a database of another
// encoding is shown with its non-ASCII bytes as \xNN, which every encoding
// can hold (converting could fail on characters this encoding lacks).
Datum action_text(const Entry* entry) {
    if (entry->encoding == GetDatabaseEncoding()) return CStringGetTextDatum(entry->action);
    StringInfoData name;
    initStringInfo(&name);
    for (const char* c = entry->action; *c != '\0'; ++c) {
        const auto byte = static_cast<unsigned char>(*c);
        if (IS_HIGHBIT_SET(byte))
            appendStringInfo(&name, "\\x%02x", byte);
        else
            appendStringInfoChar(&name, *c);
    }
    return CStringGetTextDatum(name.data);
}

// Columns of idempotency.stats_counters(): the counters of 0.7.0, the waits,
// the reset, then the counters added since (0.8.0), which a 0.7.0 schema's
// declaration does not have (its descriptor is shorter).
constexpr int kCounters070 = static_cast<int>(kFirstCounter080);
enum StatsColumn {
    sDatabase,
    sAction,
    sFirstCounter,
    sWaits = sFirstCounter + kCounters070,
    sWaitSum,
    sWaitMax,
    sWaitLe,
    sWaitBuckets,
    sReset,
    sFirstCounter080,
    sColumns = sFirstCounter080 + kCounters - kCounters070
};

void put_row(Tuplestorestate* store, TupleDesc desc, const Entry* entry_in, TimestampTz reset_at) {
    auto* entry = const_cast<Entry*>(entry_in);
    Datum values[sColumns];
    bool nulls[sColumns] = {};
    char* database =
        OidIsValid(entry->key.database) ? get_database_name(entry->key.database) : nullptr;
    nulls[sDatabase] = database == nullptr;
    values[sDatabase] =
        database == nullptr ? 0 : DirectFunctionCall1(namein, CStringGetDatum(database));
    values[sAction] = action_text(entry);
    for (int i = 0; i < kCounters; ++i)
        values[i < kCounters070 ? sFirstCounter + i : sFirstCounter080 + i - kCounters070] =
            Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&entry->counts[i])));
    Datum bounds[kBuckets];
    Datum cumulative[kBuckets];
    uint64 total = 0;
    for (int i = 0; i < kBuckets; ++i) {
        total += pg_atomic_read_u64(&entry->buckets[i]);
        cumulative[i] = Int64GetDatum(static_cast<int64>(total));
        bounds[i] =
            Float8GetDatum(i < kBuckets - 1 ? kBucketBoundsUs[i] / 1000.0 : get_float8_infinity());
    }
    values[sWaits] = Int64GetDatum(static_cast<int64>(total));
    values[sWaitSum] = Float8GetDatum(pg_atomic_read_u64(&entry->wait_sum_us) / 1000.0);
    values[sWaitMax] = Float8GetDatum(pg_atomic_read_u64(&entry->wait_max_us) / 1000.0);
    values[sWaitLe] = array_of(bounds, kBuckets, FLOAT8OID);
    values[sWaitBuckets] = array_of(cumulative, kBuckets, INT8OID);
    values[sReset] = TimestampTzGetDatum(reset_at);
    // A 0.7.0 schema declares the columns up to sReset only.
    if (desc->natts != sFirstCounter080 && desc->natts != sColumns)
        elog(ERROR, "idempotency.stats_counters() declares %d columns, not %d or %d", desc->natts,
             static_cast<int>(sFirstCounter080), static_cast<int>(sColumns));
    tuplestore_putvalues(store, desc, values, nulls);
}

}  // namespace

}  // namespace idem::pg

using namespace idem::pg;

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_stats_counters);
}
/// idempotency.stats_counters() -> SETOF record: the counters of every
/// (database, action) since the last reset; none, with a WARNING, when the
/// library was not preloaded.
Datum idempotency_stats_counters(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        compat::InitMaterializedSRF(fcinfo, 0);
        if (!counters_on()) {
            warn_off();
            return static_cast<Datum>(0);
        }
        auto* result = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
        const TimestampTz reset_at = counters_reset_at();
        // The database names are read with the lock released (catalog access may
        // wait). The server-wide '(other)' row is always there, so that
        // stats_reset shows even before the first call (after a start, a crash or
        // a reset).
        Entry** found = static_cast<Entry**>(palloc(sizeof(Entry*) * (counters_capacity() + 1)));
        const int count = counters_snapshot(found);
        for (int i = 0; i < count; ++i)
            put_row(result->setResult, result->setDesc, found[i], reset_at);
        return static_cast<Datum>(0);
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_stats_reset);
}
/// idempotency.stats_reset() -> timestamptz: zeroes every counter of every
/// database and returns the time of the reset (NULL, with a WARNING, when the
/// counters are off).
Datum idempotency_stats_reset(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        if (!counters_on()) {
            warn_off();
            PG_RETURN_NULL();
        }
        PG_RETURN_TIMESTAMPTZ(counters_reset());
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_count_cleanup);
}
/// idempotency.count_cleanup(action, deleted) -> boolean: counts rows that
/// idempotency.cleanup_batch() deleted (true; called by it only).
Datum idempotency_count_cleanup(FunctionCallInfo call) {
    return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        count_event(Counter::cleanup_deleted, PG_GETARG_TEXT_PP(0), PG_GETARG_INT64(1));
        PG_RETURN_BOOL(true);
    });
}
