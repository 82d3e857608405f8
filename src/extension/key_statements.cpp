// The statement back-end: the SQL statements on idempotency.keys, prepared
// once per session and kept.
// They run with the rights of the table's owner, switched on here around each
// statement only (the SQL functions are neither SECURITY DEFINER nor pin a
// search_path, which would cost every call a save and restore of every
// setting), and under the caller's search_path: so every function, operator
// and type in them is schema-qualified, and a hostile search_path resolves
// nothing here. An error while switched is fine: aborting the (sub)transaction
// restores the caller's user id.
#include "key_statements.hpp"

extern "C" {
#include "postgres.h"

#include "catalog/pg_type.h"
#include "access/htup_details.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
}

namespace idem::pg::statements {

namespace {

// When an existing row may be replaced by a new attempt (the WHERE of every
// upsert below; KeyRow::live and outcome_for say the same in C): the row is
// dead (its key expired and no lease holds it), or it is an in_progress row of
// the same request whose lease ran out. A live row of another request is never
// replaced, whichever function asks: that is a mismatch.
#define REPLACEABLE_ROW(NOW, CLOCK)                                \
    " WHERE (k.expires_at OPERATOR(pg_catalog.<=) " NOW            \
    "        AND (k.lease_until IS NULL"                           \
    "             OR k.lease_until OPERATOR(pg_catalog.<=) " CLOCK \
    "))"                                                           \
    "    OR (k.state OPERATOR(pg_catalog.=) 'in_progress'"         \
    "        AND k.lease_until OPERATOR(pg_catalog.<=) " CLOCK     \
    "        AND k.request_sha256 OPERATOR(pg_catalog.=) excluded.request_sha256)"

// A replaced row's successor keeps a fence above the row's (FENCE_ABOVE_ROW).
// begin() and acquire() draw their fence from the row they looked up, so this
// changes nothing for them; save_final() and claim() do not look the row up.
#define FENCE_ABOVE_ROW \
    "fence = GREATEST(excluded.fence, k.fence OPERATOR(pg_catalog.+) 1::pg_catalog.int8)"

// A completed row with its fence ($11), replacing a replaceable row.
const char* const kStoreSql =
    "INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state, "
    "response_status,"
    "       response_headers, response_body, resource_id, one_time_secret, created_at, expires_at, "
    "fence)"
    " VALUES ($1, $2, $3, $4, 'completed', $5, $6, $7, $8, $9, $12,"
    "         $12 OPERATOR(pg_catalog.+) $10, $11)"
    " ON CONFLICT (principal, key) DO UPDATE"
    "   SET action = excluded.action, request_sha256 = excluded.request_sha256, state = "
    "'completed',"
    "       response_status = excluded.response_status, response_headers = "
    "excluded.response_headers,"
    "       response_body = excluded.response_body, resource_id = excluded.resource_id,"
    "       one_time_secret = excluded.one_time_secret, " FENCE_ABOVE_ROW
    ", lease_until = NULL,"
    "       created_at = excluded.created_at, expires_at = excluded.expires_at" REPLACEABLE_ROW(
        "$12", "$13");

// A new completed row, when the direct insert cannot be used (triggers, row
// security, columns someone added). Every writer of new rows holds the key
// lock, so no speculative insertion is needed.
const char* const kInsertSql =
    "INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status,"
    "       response_headers, response_body, resource_id, one_time_secret, created_at, expires_at, "
    "fence)"
    " VALUES ($1, $2, $3, $4, 'completed', $5, $6, $7, $8, $9, $12,"
    "         $12 OPERATOR(pg_catalog.+) $10, $11)";

// The in_progress row of a lease with its fence ($7). A takeover of a live key
// keeps its created_at and expires_at: the key's TTL runs from its first use.
const char* const kLeaseSql =
    "INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state, lease_until,"
    "       created_at, expires_at, fence)"
    " VALUES ($1, $2, $3, $4, 'in_progress', $9 OPERATOR(pg_catalog.+) "
    "$5,"
    "         $8, $8 OPERATOR(pg_catalog.+) $6, $7)"
    " ON CONFLICT (principal, key) DO UPDATE"
    "   SET action = excluded.action, request_sha256 = excluded.request_sha256, state = "
    "'in_progress',"
    "       response_status = NULL, response_headers = NULL, response_body = NULL, resource_id = "
    "NULL,"
    "       one_time_secret = false, " FENCE_ABOVE_ROW
    ", lease_until = excluded.lease_until,"
    "       created_at = CASE WHEN k.expires_at OPERATOR(pg_catalog.<=) $8"
    "                    THEN excluded.created_at ELSE k.created_at END,"
    "       expires_at = CASE WHEN k.expires_at OPERATOR(pg_catalog.<=) $8"
    "                    THEN excluded.expires_at ELSE k.expires_at END" REPLACEABLE_ROW(
        "$8", "$9") " RETURNING fence, lease_until, created_at, expires_at";

// Renewal while the row is live; a lease may outlive the key's ttl.
const char* const kRenewSql =
    "UPDATE idempotency.keys"
    "   SET lease_until = $6 OPERATOR(pg_catalog.+) $4"
    " WHERE principal OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"
    "   AND fence OPERATOR(pg_catalog.=) $3 AND state OPERATOR(pg_catalog.=) 'in_progress'"
    "   AND (expires_at OPERATOR(pg_catalog.>) $5"
    "        OR lease_until OPERATOR(pg_catalog.>) $6)"
    " RETURNING action";

// The completion of a lease, while the row is live exactly as renewal asks
// (until 0.9.0 a late completion revived a dead row, whose key had already
// answered expired or could start again). A key completed after its ttl ran
// out (its lease kept it live) is kept for one more ttl from now, so that its response can be
// replayed: complete_lease() computes that expiry from the returned times and
// writes it with kExtendExpirySql (until 0.8.0 every completion moved the
// expiry to now + ttl, which the docs never said and the clients did not expect). Not in this
// statement: Citus refuses a stable function (timestamptz + interval) over columns in an UPDATE.
const char* const kCompleteLeaseSql =
    "UPDATE idempotency.keys SET state = 'completed', response_status = $4,"
    "       response_body = $5, response_headers = $6, resource_id = $7,"
    "       one_time_secret = $8, lease_until = NULL"
    " WHERE principal OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"
    "   AND fence OPERATOR(pg_catalog.=) $3 AND state OPERATOR(pg_catalog.=) 'in_progress'"
    "   AND (expires_at OPERATOR(pg_catalog.>) $9"
    "        OR lease_until OPERATOR(pg_catalog.>) $10)"
    " RETURNING action, created_at, expires_at";

// A completed lease's later expiry ($3), computed by complete_lease().
const char* const kExtendExpirySql =
    "UPDATE idempotency.keys SET expires_at = $3"
    " WHERE principal OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"
    "   AND expires_at OPERATOR(pg_catalog.<) $3";

// The row stays, with its lease ended; the next holder's fence is higher anyway.
const char* const kReleaseSql =
    "UPDATE idempotency.keys SET lease_until = '-infinity'"
    " WHERE principal OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"
    "   AND fence OPERATOR(pg_catalog.=) $3 AND state OPERATOR(pg_catalog.=) 'in_progress'"
    "   AND lease_until OPERATOR(pg_catalog.>) $5"
    " RETURNING action";

// A claim is a completed row with status 204, no body and an all-zero
// fingerprint (no request can have it), so begin()/acquire() on a claimed key
// answer mismatch. Only a dead row is replaced.
const char* const kClaimSql =
    "INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state, "
    "response_status,"
    "       created_at, expires_at, fence)"
    " VALUES ($1, $2, 'claim', pg_catalog.decode(pg_catalog.repeat('00', 32), 'hex'), 'completed', "
    "204,"
    "         $5, $5 OPERATOR(pg_catalog.+) $3, $4)"
    " ON CONFLICT (principal, key) DO UPDATE"
    "   SET action = excluded.action, request_sha256 = excluded.request_sha256, state = "
    "'completed',"
    "       response_status = 204, response_headers = NULL, response_body = NULL, resource_id = "
    "NULL,"
    "       one_time_secret = false, " FENCE_ABOVE_ROW
    ", lease_until = NULL,"
    "       created_at = excluded.created_at, expires_at = excluded.expires_at"
    " WHERE k.expires_at OPERATOR(pg_catalog.<=) $5"
    "   AND (k.lease_until IS NULL OR k.lease_until OPERATOR(pg_catalog.<=) "
    "$6)";

// The lookup of the distributed mode: the table's own columns, in its order.
const char* const kLookupSql =
    "SELECT principal, key, action, request_sha256, state, response_status, response_headers,"
    "       response_body, resource_id, one_time_secret, fence, lease_until, created_at, "
    "expires_at"
    "  FROM idempotency.keys"
    " WHERE principal OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2";

const char* const kForgetSql =
    "DELETE FROM idempotency.keys WHERE principal OPERATOR(pg_catalog.=) $1 AND key "
    "OPERATOR(pg_catalog.=) $2";

// Whether the action ($1) of a key that expired at $2 refuses it now ($3):
// the policy of idempotency.set_expiry_policy (0.8.0 on).
const char* const kExpiryRefusedSql =
    "SELECT p.action FROM idempotency.expiry_policies AS p"
    " WHERE p.action OPERATOR(pg_catalog.=) $1"
    "   AND $2 OPERATOR(pg_catalog.+) p.grace OPERATOR(pg_catalog.>) $3";

// What a statement returns into `returned` of run().
enum class Returns {
    lease,         // fence, lease_until, created_at, expires_at of a written lease row
    whole_row,     // the table's own columns (the lookup)
    action_times,  // action, created_at, expires_at (the lease's completion)
};

// One kept plan per statement. Every statement takes two more parameters
// after its own nargs: the transaction's start (now()) and the time of the
// call (clock_timestamp()), passed in rather than called, so that no
// statement has a volatile function and Citus runs it on a distributed table
// (it refuses volatile functions in modifications, and all but immutable ones
// in ON CONFLICT clauses). A statement that reads neither ignores them.
struct Statement {
    const char* sql;
    int nargs;
    Oid types[11];
    int expected_rc;
    Returns returns = Returns::lease;
    SPIPlanPtr plan = nullptr;
};
constexpr int kMaxArgs = 13;  // 11 and the two times

// The parameters of a completed row (kStoreSql, kInsertSql).
#define COMPLETED_ROW_TYPES                                                                 \
    {                                                                                       \
        TEXTOID, TEXTOID, TEXTOID, BYTEAOID, INT2OID, JSONBOID, BYTEAOID, TEXTOID, BOOLOID, \
            INTERVALOID, INT8OID                                                            \
    }

Statement store_statement{kStoreSql, 11, COMPLETED_ROW_TYPES, SPI_OK_INSERT};
Statement insert_statement{kInsertSql, 11, COMPLETED_ROW_TYPES, SPI_OK_INSERT};
Statement lease_statement{kLeaseSql,
                          7,
                          {TEXTOID, TEXTOID, TEXTOID, BYTEAOID, INTERVALOID, INTERVALOID, INT8OID},
                          SPI_OK_INSERT_RETURNING};
Statement renew_statement{
    kRenewSql, 4, {TEXTOID, TEXTOID, INT8OID, INTERVALOID}, SPI_OK_UPDATE_RETURNING};
Statement complete_lease_statement{
    kCompleteLeaseSql,
    8,
    {TEXTOID, TEXTOID, INT8OID, INT2OID, BYTEAOID, JSONBOID, TEXTOID, BOOLOID},
    SPI_OK_UPDATE_RETURNING,
    Returns::action_times};
Statement extend_expiry_statement{
    kExtendExpirySql, 3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}, SPI_OK_UPDATE};
Statement release_statement{kReleaseSql, 3, {TEXTOID, TEXTOID, INT8OID}, SPI_OK_UPDATE_RETURNING};
Statement claim_statement{kClaimSql, 4, {TEXTOID, TEXTOID, INTERVALOID, INT8OID}, SPI_OK_INSERT};
Statement forget_statement{kForgetSql, 2, {TEXTOID, TEXTOID}, SPI_OK_DELETE};
Statement expiry_refused_statement{kExpiryRefusedSql, 2, {TEXTOID, TIMESTAMPTZOID}, SPI_OK_SELECT};
Statement lookup_statement{kLookupSql, 2, {TEXTOID, TEXTOID}, SPI_OK_SELECT, Returns::whole_row};

// Prepares a statement once per session (the plan is kept across
// transactions), with the two times after its own parameters.
void prepare(Statement& statement) {
    if (statement.plan != nullptr) return;
    Oid types[kMaxArgs];
    memcpy(types, statement.types, sizeof(Oid) * statement.nargs);
    types[statement.nargs] = types[statement.nargs + 1] = TIMESTAMPTZOID;
    statement.plan = keep_plan(statement.sql, statement.nargs + 2, types);
}

// Runs a statement as the key table's owner inside its own SPI connection;
// returns the number of rows it processed. With `returned`, the first
// returned row is copied into the caller's memory context; with `action`, the
// text the statement returned (its only column) is. `snapshot`: the one to
// read with, or InvalidSnapshot for the transaction's rules.
uint64 run(const KeyTable& table, Statement& statement, Datum* own_values, const char* own_nulls,
           KeyRow* returned = nullptr, text** action = nullptr,
           Snapshot snapshot = InvalidSnapshot) {
    MemoryContext caller_context = CurrentMemoryContext;
    Datum values[kMaxArgs];
    char nulls[kMaxArgs];
    memcpy(values, own_values, sizeof(Datum) * statement.nargs);
    for (int i = 0; i < statement.nargs; ++i) nulls[i] = own_nulls == nullptr ? ' ' : own_nulls[i];
    values[statement.nargs] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
    values[statement.nargs + 1] = TimestampTzGetDatum(GetCurrentTimestamp());
    nulls[statement.nargs] = nulls[statement.nargs + 1] = ' ';

    const SavedUser saved = spi_connect_as(table.owner);
    prepare(statement);
    const int rc = snapshot == InvalidSnapshot
                       ? SPI_execute_plan(statement.plan, values, nulls, false, 0)
                       : SPI_execute_snapshot(statement.plan, values, nulls, snapshot,
                                              InvalidSnapshot, true, false, 0);
    if (rc != statement.expected_rc)
        elog(ERROR, "statement on idempotency.keys failed: %s", SPI_result_code_string(rc));
    const uint64 processed = SPI_processed;
    if (returned != nullptr && processed == 1 && statement.returns == Returns::whole_row) {
        MemoryContext spi_context = MemoryContextSwitchTo(caller_context);
        *returned = row_from_tuple(SPI_copytuple(SPI_tuptable->vals[0]), SPI_tuptable->tupdesc);
        MemoryContextSwitchTo(spi_context);
    } else if (returned != nullptr && processed == 1 &&
               statement.returns == Returns::action_times) {
        bool isnull;
        returned->found = true;
        returned->created_at = DatumGetTimestampTz(
            SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
        returned->expires_at = DatumGetTimestampTz(
            SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull));
        returned->has_times = true;
    } else if (returned != nullptr && processed == 1) {
        // fence, lease_until, created_at, expires_at of the written lease row
        MemoryContext spi_context = MemoryContextSwitchTo(caller_context);
        HeapTuple tuple = SPI_copytuple(SPI_tuptable->vals[0]);
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool isnull;
        returned->found = true;
        returned->fence = DatumGetInt64(heap_getattr(tuple, 1, desc, &isnull));
        returned->lease_until = DatumGetTimestampTz(heap_getattr(tuple, 2, desc, &isnull));
        returned->has_lease = true;
        returned->created_at = DatumGetTimestampTz(heap_getattr(tuple, 3, desc, &isnull));
        returned->expires_at = DatumGetTimestampTz(heap_getattr(tuple, 4, desc, &isnull));
        returned->has_times = true;
        MemoryContextSwitchTo(spi_context);
    }
    if (action != nullptr && processed == 1) {
        bool isnull;
        const Datum value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
        MemoryContext spi_context = MemoryContextSwitchTo(caller_context);
        *action = isnull ? nullptr : DatumGetTextPCopy(value);
        MemoryContextSwitchTo(spi_context);
    }
    spi_finish_as(saved);
    return processed;
}

}  // namespace

bool store_completed(const KeyTable& table, const Request& request, const StoredResponse& response,
                     const Interval* ttl, int64 fence, bool known_absent) {
    Datum values[11] = {PointerGetDatum(request.principal),
                        PointerGetDatum(request.key),
                        PointerGetDatum(request.action),
                        PointerGetDatum(request.fingerprint),
                        Int16GetDatum(static_cast<int16>(response.status)),
                        response.headers,
                        response.body,
                        response.resource_id,
                        BoolGetDatum(response.one_time_secret),
                        IntervalPGetDatum(ttl),
                        Int64GetDatum(fence)};
    const char nulls[11] = {' ',
                            ' ',
                            ' ',
                            ' ',
                            ' ',
                            response.headers_null ? 'n' : ' ',
                            response.body_null ? 'n' : ' ',
                            response.resource_id_null ? 'n' : ' ',
                            ' ',
                            ' ',
                            ' '};
    return run(table, known_absent ? insert_statement : store_statement, values, nulls) == 1;
}

KeyRow take_lease(const KeyTable& table, const Request& request, const Interval* lease,
                  const Interval* ttl, int64 fence) {
    Datum values[7] = {PointerGetDatum(request.principal),
                       PointerGetDatum(request.key),
                       PointerGetDatum(request.action),
                       PointerGetDatum(request.fingerprint),
                       IntervalPGetDatum(lease),
                       IntervalPGetDatum(ttl),
                       Int64GetDatum(fence)};
    KeyRow written;
    run(table, lease_statement, values, nullptr, &written);
    return written;
}

bool renew_lease(const KeyTable& table, Datum principal, Datum key, Datum fence,
                 const Interval* lease, text** action) {
    Datum values[4] = {principal, key, fence, IntervalPGetDatum(lease)};
    return run(table, renew_statement, values, nullptr, nullptr, action) == 1;
}

bool complete_lease(const KeyTable& table, Datum principal, Datum key, Datum fence,
                    const StoredResponse& response, text** action) {
    Datum values[8] = {principal,
                       key,
                       fence,
                       Int16GetDatum(static_cast<int16>(response.status)),
                       response.body,
                       response.headers,
                       response.resource_id,
                       BoolGetDatum(response.one_time_secret)};
    const char nulls[8] = {' ',
                           ' ',
                           ' ',
                           ' ',
                           response.body_null ? 'n' : ' ',
                           response.headers_null ? 'n' : ' ',
                           response.resource_id_null ? 'n' : ' ',
                           ' '};
    KeyRow times;
    if (run(table, complete_lease_statement, values, nulls, &times, action) != 1) return false;
    // Completed after its ttl ran out (the lease kept it live): now() + the key's
    // ttl (expires_at - created_at), as SQL computes it. Before that, the key
    // keeps the expiry acquire gave it (and told the caller).
    const TimestampTz now = GetCurrentTransactionStartTimestamp();
    if (times.expires_at <= now) {
        const Datum ttl = DirectFunctionCall2(timestamp_mi, TimestampTzGetDatum(times.expires_at),
                                              TimestampTzGetDatum(times.created_at));
        Datum extend[3] = {
            principal, key,
            DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now), ttl)};
        run(table, extend_expiry_statement, extend, nullptr);
    }
    return true;
}

bool release_lease(const KeyTable& table, Datum principal, Datum key, Datum fence, text** action) {
    Datum values[3] = {principal, key, fence};
    return run(table, release_statement, values, nullptr, nullptr, action) == 1;
}

bool insert_claim(const KeyTable& table, text* principal, text* key, const Interval* ttl,
                  int64 fence) {
    Datum values[4] = {PointerGetDatum(principal), PointerGetDatum(key), IntervalPGetDatum(ttl),
                       Int64GetDatum(fence)};
    return run(table, claim_statement, values, nullptr) == 1;
}

bool forget_key(const KeyTable& table, text* principal, text* key) {
    Datum values[2] = {PointerGetDatum(principal), PointerGetDatum(key)};
    return run(table, forget_statement, values, nullptr) == 1;
}

KeyRow select_key(const KeyTable& table, text* principal, text* key, Snapshot snapshot) {
    Datum values[2] = {PointerGetDatum(principal), PointerGetDatum(key)};
    KeyRow row;
    run(table, lookup_statement, values, nullptr, &row, nullptr, snapshot);
    return row;
}

bool expiry_refused(const KeyTable& table, Datum action, TimestampTz expired_at) {
    // A schema older than 0.8.0 has no policies: an expired key is forgotten.
    if (!OidIsValid(get_relname_relid("expiry_policies", get_rel_namespace(table.table))))
        return false;
    Datum values[2] = {action, TimestampTzGetDatum(expired_at)};
    return run(table, expiry_refused_statement, values, nullptr) == 1;
}

}  // namespace idem::pg::statements
