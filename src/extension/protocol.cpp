// The key store, the transactional protocol and the lease protocol:
//   idempotency.begin, complete, save_final, is_final, forget,
//   acquire, renew, complete(fence), release, claim
//
// How duplicates are kept apart. begin() takes a transaction-level lock whose
// tag is derived from (principal, key) in a lock class of our own, then looks
// the key up. A new key writes nothing yet: the key row is inserted once, by
// complete(), in the caller's transaction. So a request costs one index
// lookup and one insert, and leaves no dead tuple behind. A duplicate that
// arrives meanwhile blocks on the lock; when the first transaction commits
// its row is visible (the lookup takes a new snapshot in READ COMMITTED) and
// the duplicate replays; when it rolls back the duplicate starts.
//
// This file is PostgreSQL-facing code only: no C++ object with a destructor
// lives in any frame here, so a PostgreSQL error (longjmp) can unwind through
// every function safely.
#include "settings.hpp"
#include "statuses.hpp"

extern "C" {
#include "postgres.h"

#include <limits.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/namespace.h"
#include "executor/tuptable.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "storage/lock.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

PG_FUNCTION_INFO_V1(idempotency_begin);
PG_FUNCTION_INFO_V1(idempotency_complete);
PG_FUNCTION_INFO_V1(idempotency_save_final);
PG_FUNCTION_INFO_V1(idempotency_is_final);
PG_FUNCTION_INFO_V1(idempotency_forget);
PG_FUNCTION_INFO_V1(idempotency_acquire);
PG_FUNCTION_INFO_V1(idempotency_renew);
PG_FUNCTION_INFO_V1(idempotency_complete_fenced);
PG_FUNCTION_INFO_V1(idempotency_release);
PG_FUNCTION_INFO_V1(idempotency_claim);
}
#include "compat.hpp"  // PostgreSQL 15 / 16-17 / 18 differences

namespace idem::pg {

int key_ttl_seconds = 86400;
int wait_timeout_ms = 5000;
int max_key_length = 255;
int key_format = kKeyFormatAny;
int lease_ms = 30000;
int cleanup_batch_size = 1000;

namespace {

// ---------------------------------------------------------------------------
// Settings

char* final_statuses_setting = nullptr;
// Parsed form of idempotency.final_statuses.
const idem::core::StatusTable* final_status_table = nullptr;

const struct config_enum_entry key_format_options[] = {
    {"any", kKeyFormatAny, false},
    {"uuid", kKeyFormatUuid, false},
    {"uuidv7", kKeyFormatUuidV7, false},
    {nullptr, 0, false},
};

bool check_final_statuses(char** newval, void** extra, GucSource source) {
    // GUC "extra" data is freed by the GUC machinery (malloc'd up to 15, guc_malloc'd since 16).
    auto* table = static_cast<idem::core::StatusTable*>(compat::guc_extra_alloc(sizeof(idem::core::StatusTable)));
    if (table == nullptr) return false;
    if (!idem::core::parse_status_list(*newval, *table)) {
        compat::guc_extra_free(table);
        GUC_check_errdetail("Use a comma-separated list of status codes (409) and classes (2xx), 100 to 599.");
        return false;
    }
    *extra = table;
    return true;
}

void assign_final_statuses(const char* newval, void* extra) {
    final_status_table = static_cast<const idem::core::StatusTable*>(extra);
}

// ---------------------------------------------------------------------------
// Argument checks

[[noreturn]] void invalid(const char* message, const char* detail = nullptr) {
    if (detail != nullptr)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s", message), errdetail("%s", detail)));
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s", message)));
    pg_unreachable();
}

void require_args(FunctionCallInfo fcinfo, int count, const char* names) {
    for (int i = 0; i < count; ++i)
        if (PG_ARGISNULL(i))
            ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("%s must not be null", names)));
}

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Keys and principals are never echoed in messages above DEBUG: they may be secrets.
void check_key(text* key) {
    const char* p = VARDATA_ANY(key);
    const int length = VARSIZE_ANY_EXHDR(key);
    if (length == 0) invalid("idempotency key must not be empty");
    if (length > max_key_length)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("idempotency key is %d bytes long, longer than idempotency.max_key_length (%d)",
                               length, max_key_length)));
    for (int i = 0; i < length; ++i) {
        unsigned char c = static_cast<unsigned char>(p[i]);
        if (c < 0x20 || c == 0x7f) invalid("idempotency key must not contain control characters");
    }
    if (key_format == kKeyFormatAny) return;
    bool ok = length == 36;
    for (int i = 0; ok && i < 36; ++i) ok = (i == 8 || i == 13 || i == 18 || i == 23) ? p[i] == '-' : is_hex(p[i]);
    if (!ok) invalid("idempotency key is not a UUID", "idempotency.key_format requires the form 8-4-4-4-12 hexadecimal digits.");
    if (key_format == kKeyFormatUuidV7 && (p[14] != '7' || strchr("89abAB", p[19]) == nullptr))
        invalid("idempotency key is not a version 7 UUID", "idempotency.key_format is uuidv7.");
}

void check_principal(text* principal) {
    if (VARSIZE_ANY_EXHDR(principal) > 1024) invalid("principal must be at most 1024 bytes long");
}

void check_action(text* action) {
    if (VARSIZE_ANY_EXHDR(action) == 0) invalid("action must not be empty");
    if (VARSIZE_ANY_EXHDR(action) > 1024) invalid("action must be at most 1024 bytes long");
}

void check_fingerprint(bytea* fingerprint) {
    if (VARSIZE_ANY_EXHDR(fingerprint) != 32)
        invalid("fingerprint must be 32 bytes (SHA-256)", "Compute it with idempotency.fingerprint().");
}

int64 interval_usecs(const Interval* span) {
    return span->time + span->day * USECS_PER_DAY + static_cast<int64>(span->month) * DAYS_PER_MONTH * USECS_PER_DAY;
}

// The TTL argument, or idempotency.key_ttl when NULL; must be positive.
Interval ttl_argument(FunctionCallInfo fcinfo, int arg) {
    Interval ttl;
    if (PG_ARGISNULL(arg)) {
        memset(&ttl, 0, sizeof ttl);
        ttl.time = static_cast<int64>(key_ttl_seconds) * USECS_PER_SEC;
        return ttl;
    }
    ttl = *PG_GETARG_INTERVAL_P(arg);
    if (interval_usecs(&ttl) <= 0) invalid("ttl must be positive");
    return ttl;
}

// The lease argument, or idempotency.lease when NULL; must be positive.
Interval lease_argument(FunctionCallInfo fcinfo, int arg) {
    Interval lease;
    if (PG_ARGISNULL(arg)) {
        memset(&lease, 0, sizeof lease);
        lease.time = static_cast<int64>(lease_ms) * 1000;
        return lease;
    }
    lease = *PG_GETARG_INTERVAL_P(arg);
    if (interval_usecs(&lease) <= 0) invalid("lease must be positive");
    return lease;
}

// The wait argument in milliseconds, or idempotency.wait_timeout when NULL.
int wait_argument(FunctionCallInfo fcinfo, int arg) {
    if (PG_ARGISNULL(arg)) return wait_timeout_ms;
    int64 usecs = interval_usecs(PG_GETARG_INTERVAL_P(arg));
    if (usecs < 0) invalid("wait must not be negative");
    int64 ms = (usecs + 999) / 1000;
    return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

int status_argument(FunctionCallInfo fcinfo, int arg) {
    int status = PG_GETARG_INT32(arg);
    if (status < 100 || status > 599) invalid("HTTP status must be between 100 and 599");
    return status;
}

void check_headers(FunctionCallInfo fcinfo, int arg) {
    if (PG_ARGISNULL(arg)) return;
    Jsonb* headers = PG_GETARG_JSONB_P(arg);
    if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
        invalid("headers must be a JSON object of header name to value");
}

// ---------------------------------------------------------------------------
// The key lock

// Lock class in the field4 of an advisory-type tag. pg_advisory_lock() uses 1
// and 2 there, so our locks never meet the application's own advisory locks.
// They show in pg_locks as locktype 'advisory' with objsubid 18756.
constexpr uint16 kKeyLockClass = 0x4944;

void key_locktag(LOCKTAG* tag, text* principal, text* key) {
    uint64 h = hash_bytes_extended(reinterpret_cast<const unsigned char*>(VARDATA_ANY(principal)),
                                   VARSIZE_ANY_EXHDR(principal), UINT64CONST(0x6964656d706f7465));
    h = hash_bytes_extended(reinterpret_cast<const unsigned char*>(VARDATA_ANY(key)), VARSIZE_ANY_EXHDR(key), h);
    SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, static_cast<uint32>(h >> 32), static_cast<uint32>(h), kKeyLockClass);
}

// Waits up to wait_ms for the key lock. The wait runs in a subtransaction with
// lock_timeout set, so that running out of time is an error we can swallow
// without aborting the caller's transaction. Only contended keys get here.
bool wait_for_key_lock(const LOCKTAG* tag, int wait_ms) {
    MemoryContext caller_context = CurrentMemoryContext;
    ResourceOwner caller_owner = CurrentResourceOwner;
    volatile bool acquired = false;

    BeginInternalSubTransaction(nullptr);
    MemoryContextSwitchTo(caller_context);
    PG_TRY();
    {
        char timeout[32];
        snprintf(timeout, sizeof timeout, "%d", wait_ms);
        int nest_level = NewGUCNestLevel();
        set_config_option("lock_timeout", timeout, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
        (void)LockAcquire(tag, ExclusiveLock, false, false);
        AtEOXact_GUC(true, nest_level);
        // Committing the subtransaction hands the lock to the caller's transaction.
        ReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(caller_context);
        CurrentResourceOwner = caller_owner;
        acquired = true;
    }
    PG_CATCH();
    {
        MemoryContextSwitchTo(caller_context);
        ErrorData* error = CopyErrorData();
        FlushErrorState();
        RollbackAndReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(caller_context);
        CurrentResourceOwner = caller_owner;
        // Deadlocks, cancels and statement timeouts stay errors.
        if (error->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE) ReThrowError(error);
        FreeErrorData(error);
    }
    PG_END_TRY();
    return acquired;
}

// Who holds a key lock we took: the statement's resource owner (fast path) or,
// after a wait in a subtransaction, the transaction's.
enum class LockHolder { none, statement, transaction };

LockHolder lock_key(const LOCKTAG* tag, int wait_ms) {
    if (LockAcquire(tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL) return LockHolder::statement;
    if (wait_ms <= 0) return LockHolder::none;
    return wait_for_key_lock(tag, wait_ms) ? LockHolder::transaction : LockHolder::none;
}

// Releases a key lock before the end of the transaction.
void unlock_key(const LOCKTAG* tag, LockHolder holder) {
    ResourceOwner current = CurrentResourceOwner;
    if (holder == LockHolder::transaction) CurrentResourceOwner = CurTransactionResourceOwner;
    LockRelease(tag, ExclusiveLock, false);
    CurrentResourceOwner = current;
}

// ---------------------------------------------------------------------------
// Keys begun in the current transaction

struct PendingKey {
    text* principal;
    text* key;
    text* action;
    bytea* fingerprint;
    Interval ttl;
    bool replaces;                       // begin saw a row (expired, or its lease ended) to replace
    SubTransactionId subxact;            // where begin ran (its lock belongs to it)
    SubTransactionId completed_subxact;  // where complete ran, or InvalidSubTransactionId
};

PendingKey* pending = nullptr;  // in TopTransactionContext
int pending_count = 0;
int pending_capacity = 0;

bool same_text(text* a, text* b) {
    return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
           memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

PendingKey* find_pending(text* principal, text* key) {
    for (int i = 0; i < pending_count; ++i)
        if (same_text(pending[i].key, key) && same_text(pending[i].principal, principal)) return &pending[i];
    return nullptr;
}

// The leading arguments of every call that names a request: principal, key,
// action and fingerprint (arguments 0 to 3), checked.
struct RequestArgs {
    text* principal;
    text* key;
    text* action;
    bytea* fingerprint;
};

RequestArgs request_args(FunctionCallInfo fcinfo) {
    require_args(fcinfo, 4, "principal, key, action and fingerprint");
    RequestArgs args{PG_GETARG_TEXT_PP(0), PG_GETARG_TEXT_PP(1), PG_GETARG_TEXT_PP(2), PG_GETARG_BYTEA_PP(3)};
    check_principal(args.principal);
    check_key(args.key);
    check_action(args.action);
    check_fingerprint(args.fingerprint);
    return args;
}

// save_final, acquire and claim write key rows of their own; in the
// transaction that began the key with begin() that would collide with complete().
void refuse_if_begun(text* principal, text* key, const char* function) {
    if (find_pending(principal, key) != nullptr)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("idempotency key was started with begin() in this transaction"),
                        errhint("%s cannot be used for it here; finish it with idempotency.complete().", function)));
}

text* copy_to_transaction(text* value) {
    Size size = VARSIZE_ANY(value);
    text* copy = static_cast<text*>(MemoryContextAlloc(TopTransactionContext, size));
    memcpy(copy, value, size);
    return copy;
}

void add_pending(text* principal, text* key, text* action, bytea* fingerprint, const Interval& ttl, bool replaces) {
    if (pending_count == pending_capacity) {
        int capacity = pending_capacity == 0 ? 4 : pending_capacity * 2;
        PendingKey* grown = static_cast<PendingKey*>(MemoryContextAlloc(TopTransactionContext, sizeof(PendingKey) * capacity));
        if (pending_count > 0) memcpy(grown, pending, sizeof(PendingKey) * pending_count);
        pending = grown;
        pending_capacity = capacity;
    }
    PendingKey& entry = pending[pending_count];
    entry.principal = copy_to_transaction(principal);
    entry.key = copy_to_transaction(key);
    entry.action = copy_to_transaction(action);
    entry.fingerprint = copy_to_transaction(fingerprint);
    entry.ttl = ttl;
    entry.replaces = replaces;
    entry.subxact = GetCurrentSubTransactionId();
    entry.completed_subxact = InvalidSubTransactionId;
    ++pending_count;
}

void on_transaction_event(XactEvent event, void* arg) {
    switch (event) {
        case XACT_EVENT_PRE_COMMIT:
        case XACT_EVENT_PARALLEL_PRE_COMMIT:
        case XACT_EVENT_PRE_PREPARE:
            // Committing the handler's writes without the key row would open
            // exactly the window this extension exists to close.
            for (int i = 0; i < pending_count; ++i)
                if (pending[i].completed_subxact == InvalidSubTransactionId)
                    ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                                    errmsg("idempotency key was started but not completed in this transaction"),
                                    errhint("Call idempotency.complete() before COMMIT, or ROLLBACK.")));
            break;
        default:
            // Commit, abort, prepare: the list lived in TopTransactionContext.
            pending = nullptr;
            pending_count = 0;
            pending_capacity = 0;
            break;
    }
}

void on_subtransaction_event(SubXactEvent event, SubTransactionId subxact, SubTransactionId parent, void* arg) {
    if (event == SUBXACT_EVENT_ABORT_SUB) {
        // A rolled-back savepoint released the locks of the keys begun in it
        // and removed the rows completed in it.
        int kept = 0;
        for (int i = 0; i < pending_count; ++i) {
            if (pending[i].subxact == subxact) continue;
            if (pending[i].completed_subxact == subxact) pending[i].completed_subxact = InvalidSubTransactionId;
            pending[kept++] = pending[i];
        }
        pending_count = kept;
    } else if (event == SUBXACT_EVENT_COMMIT_SUB) {
        for (int i = 0; i < pending_count; ++i) {
            if (pending[i].subxact == subxact) pending[i].subxact = parent;
            if (pending[i].completed_subxact == subxact) pending[i].completed_subxact = parent;
        }
    }
}

// ---------------------------------------------------------------------------
// Statements (prepared once per backend and kept)

SPIPlanPtr store_plan = nullptr;
SPIPlanPtr insert_plan = nullptr;
SPIPlanPtr forget_plan = nullptr;
SPIPlanPtr lease_plan = nullptr;
SPIPlanPtr renew_plan = nullptr;
SPIPlanPtr fenced_complete_plan = nullptr;
SPIPlanPtr release_plan = nullptr;
SPIPlanPtr claim_plan = nullptr;

// Writes the in_progress row of a lease: a new row, or a takeover of an
// expired row or of an in_progress row whose lease ran out (fence + 1). A
// takeover of a live key keeps its created_at and expires_at: the key's TTL
// runs from its first use.
const char* const kLeaseSql =
    "INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state, lease_until,"
    "       created_at, expires_at)"
    " VALUES ($1, $2, $3, $4, 'in_progress', pg_catalog.clock_timestamp() + $5, pg_catalog.now(),"
    "         pg_catalog.now() + $6)"
    " ON CONFLICT (principal, key) DO UPDATE"
    "   SET action = excluded.action, request_sha256 = excluded.request_sha256, state = 'in_progress',"
    "       response_status = NULL, response_headers = NULL, response_body = NULL, resource_id = NULL,"
    "       one_time_secret = false, fence = k.fence + 1, lease_until = excluded.lease_until,"
    "       created_at = CASE WHEN k.expires_at <= pg_catalog.now() THEN excluded.created_at ELSE k.created_at END,"
    "       expires_at = CASE WHEN k.expires_at <= pg_catalog.now() THEN excluded.expires_at ELSE k.expires_at END"
    " WHERE k.expires_at <= pg_catalog.now()"
    "    OR (k.state = 'in_progress' AND k.lease_until <= pg_catalog.clock_timestamp())"
    " RETURNING fence, lease_until, created_at, expires_at";

SPIPlanPtr prepared(SPIPlanPtr* slot, const char* sql, int nargs, Oid* types) {
    if (*slot == nullptr) {
        SPIPlanPtr plan = SPI_prepare(sql, nargs, types);
        if (plan == nullptr) elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
        if (SPI_keepplan(plan) != 0) elog(ERROR, "SPI_keepplan failed");
        *slot = plan;
    }
    return *slot;
}

enum LookupColumn {
    kState = 1, kSha, kStatus, kHeaders, kBody, kResourceId, kSecret, kCreated, kExpires, kFence, kLeaseUntil,
    kLive, kLeaseLive
};


// Inserts the final row; replaces an expired row or an in_progress row whose
// lease ran out, never a live one (then nothing is written).
const char* const kStoreSql =
    "INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state, response_status,"
    "       response_headers, response_body, resource_id, one_time_secret, created_at, expires_at)"
    " VALUES ($1, $2, $3, $4, 'completed', $5, $6, $7, $8, $9, pg_catalog.now(), pg_catalog.now() + $10)"
    " ON CONFLICT (principal, key) DO UPDATE"
    "   SET action = excluded.action, request_sha256 = excluded.request_sha256, state = 'completed',"
    "       response_status = excluded.response_status, response_headers = excluded.response_headers,"
    "       response_body = excluded.response_body, resource_id = excluded.resource_id,"
    "       one_time_secret = excluded.one_time_secret, fence = k.fence + 1, lease_until = NULL,"
    "       created_at = excluded.created_at, expires_at = excluded.expires_at"
    " WHERE k.expires_at <= pg_catalog.now()"
    "    OR (k.state = 'in_progress' AND k.lease_until <= pg_catalog.clock_timestamp())";

// The common case of complete(): the key had no row when begin() looked, and
// every writer of new key rows (begin/complete, acquire, save_final, claim)
// holds the key lock, so a plain INSERT suffices: no speculative insertion,
// no extra WAL record.
const char* const kInsertSql =
    "INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status,"
    "       response_headers, response_body, resource_id, one_time_secret, created_at, expires_at)"
    " VALUES ($1, $2, $3, $4, 'completed', $5, $6, $7, $8, $9, pg_catalog.now(), pg_catalog.now() + $10)";

// A looked-up key row, copied out of SPI memory.
struct KeyRow {
    bool found;
    HeapTuple tuple;
    TupleDesc desc;
};

Datum column(const KeyRow& row, int number, bool* isnull) { return heap_getattr(row.tuple, number, row.desc, isnull); }

bool column_bool(const KeyRow& row, int number) {
    bool isnull;
    Datum value = column(row, number, &isnull);
    return !isnull && DatumGetBool(value);
}

bool row_is_completed(const KeyRow& row) {
    bool isnull;
    text* state = DatumGetTextPP(column(row, kState, &isnull));
    return VARSIZE_ANY_EXHDR(state) == 9 && memcmp(VARDATA_ANY(state), "completed", 9) == 0;
}

// A live row that a new attempt must respect: anything but an in_progress row
// whose lease ran out.
bool row_blocks_start(const KeyRow& row) {
    if (!row.found || !column_bool(row, kLive)) return false;
    return row_is_completed(row) || column_bool(row, kLeaseLive);
}

// The key table and its primary key, looked up once and forgotten whenever
// the relation cache says either changed (DROP/CREATE EXTENSION, REINDEX...).
Oid keys_table_oid = InvalidOid;
Oid keys_index_oid = InvalidOid;

void forget_key_relations(Datum arg, Oid relid) {
    if (relid == InvalidOid || relid == keys_table_oid || relid == keys_index_oid) {
        keys_table_oid = InvalidOid;
        keys_index_oid = InvalidOid;
    }
}

// Attribute numbers of idempotency.keys: the table's own columns come first,
// in this order (lookup_key reads and insert_key_row writes them by position).
enum KeysColumn {
    aPrincipal = 1, aKey, aAction, aSha, aState, aStatus, aHeaders, aBody, aResourceId, aSecret, aFence,
    aLeaseUntil, aCreated, aExpires, aColumns = aExpires
};

// The most attributes (dropped ones included) a key row is written for directly.
constexpr int kMaxKeyColumns = 32;

// Whether the key table has its own columns only (a column someone added and
// dropped again does not count): then insert_key_row can write a row by
// position; otherwise the INSERT statement fills what others added.
bool only_own_columns(TupleDesc desc) {
    if (desc->natts < aColumns || desc->natts > kMaxKeyColumns) return false;
    for (int i = aColumns; i < desc->natts; ++i)
        if (!TupleDescAttr(desc, i)->attisdropped) return false;
    return true;
}

// The shape of a looked-up row (LookupColumn order), made once per backend.
TupleDesc lookup_desc() {
    static TupleDesc desc = nullptr;
    if (desc == nullptr) {
        MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
        TupleDesc d = CreateTemplateTupleDesc(kLeaseLive);
        TupleDescInitEntry(d, kState, "state", TEXTOID, -1, 0);
        TupleDescInitEntry(d, kSha, "request_sha256", BYTEAOID, -1, 0);
        TupleDescInitEntry(d, kStatus, "response_status", INT4OID, -1, 0);
        TupleDescInitEntry(d, kHeaders, "response_headers", JSONBOID, -1, 0);
        TupleDescInitEntry(d, kBody, "response_body", BYTEAOID, -1, 0);
        TupleDescInitEntry(d, kResourceId, "resource_id", TEXTOID, -1, 0);
        TupleDescInitEntry(d, kSecret, "one_time_secret", BOOLOID, -1, 0);
        TupleDescInitEntry(d, kCreated, "created_at", TIMESTAMPTZOID, -1, 0);
        TupleDescInitEntry(d, kExpires, "expires_at", TIMESTAMPTZOID, -1, 0);
        TupleDescInitEntry(d, kFence, "fence", INT8OID, -1, 0);
        TupleDescInitEntry(d, kLeaseUntil, "lease_until", TIMESTAMPTZOID, -1, 0);
        TupleDescInitEntry(d, kLive, "live", BOOLOID, -1, 0);
        TupleDescInitEntry(d, kLeaseLive, "lease_live", BOOLOID, -1, 0);
        MemoryContextSwitchTo(old);
        desc = d;
    }
    return desc;
}

// The OIDs of the key table and its primary key.
struct KeyTableOids {
    Oid table;
    Oid index;
};

// The key table's OIDs, looked up once per session (dropped by the relcache
// callback above). Callers use the returned copy: opening a relation accepts
// invalidation messages, and the callback may clear the cache in between.
KeyTableOids resolve_key_table() {
    if (!OidIsValid(keys_table_oid) || !OidIsValid(keys_index_oid)) {
        Oid schema = get_namespace_oid("idempotency", false);
        Oid table = get_relname_relid("keys", schema);
        Oid index = get_relname_relid("keys_pkey", schema);
        if (!OidIsValid(table) || !OidIsValid(index))
            ereport(ERROR,
                    (errcode(ERRCODE_UNDEFINED_TABLE), errmsg("idempotency.keys or its primary key is missing")));
        keys_table_oid = table;
        keys_index_oid = index;
    }
    return KeyTableOids{keys_table_oid, keys_index_oid};
}

// Looks the key up through the primary key index directly: no SPI, no
// executor, on the path every request takes. `snapshot` InvalidSnapshot means
// the transaction's own rules (a new snapshot per call in READ COMMITTED, so
// a winner that committed while we waited is seen). The row is copied into
// the current memory context.
KeyRow lookup_key(text* principal, text* key, Snapshot snapshot) {
    const KeyTableOids oids = resolve_key_table();
    Relation table = table_open(oids.table, AccessShareLock);
    Relation index = index_open(oids.index, AccessShareLock);
    Snapshot scan_snapshot = RegisterSnapshot(snapshot == InvalidSnapshot ? GetTransactionSnapshot() : snapshot);

    ScanKeyData keys[2];
    ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid, index->rd_indcollation[0], F_TEXTEQ,
                           PointerGetDatum(principal));
    ScanKeyEntryInitialize(&keys[1], 0, 2, BTEqualStrategyNumber, InvalidOid, index->rd_indcollation[1], F_TEXTEQ,
                           PointerGetDatum(key));
    IndexScanDesc scan = compat::index_beginscan(table, index, scan_snapshot, 2, 0);
    index_rescan(scan, keys, 2, nullptr, 0);
    TupleTableSlot* slot = table_slot_create(table, nullptr);

    KeyRow row{false, nullptr, lookup_desc()};
    if (index_getnext_slot(scan, ForwardScanDirection, slot)) {
        slot_getallattrs(slot);
        Datum values[kLeaseLive];
        bool nulls[kLeaseLive];
        auto take = [&](int target, int source) {
            values[target - 1] = slot->tts_values[source - 1];
            nulls[target - 1] = slot->tts_isnull[source - 1];
        };
        take(kState, aState);
        take(kSha, aSha);
        take(kStatus, aStatus);
        if (!nulls[kStatus - 1]) values[kStatus - 1] = Int32GetDatum(DatumGetInt16(values[kStatus - 1]));
        take(kHeaders, aHeaders);
        take(kBody, aBody);
        take(kResourceId, aResourceId);
        take(kSecret, aSecret);
        take(kCreated, aCreated);
        take(kExpires, aExpires);
        take(kFence, aFence);
        take(kLeaseUntil, aLeaseUntil);
        const TimestampTz expires = DatumGetTimestampTz(values[kExpires - 1]);
        values[kLive - 1] = BoolGetDatum(expires > GetCurrentTransactionStartTimestamp());  // now()
        nulls[kLive - 1] = false;
        const bool leased = !nulls[kLeaseUntil - 1] &&
                            DatumGetTimestampTz(values[kLeaseUntil - 1]) > GetCurrentTimestamp();  // clock_timestamp()
        values[kLeaseLive - 1] = BoolGetDatum(leased);
        nulls[kLeaseLive - 1] = false;
        row.found = true;
        row.tuple = heap_form_tuple(row.desc, values, nulls);  // copies out of the buffer
    }
    ExecDropSingleTupleTableSlot(slot);
    index_endscan(scan);
    UnregisterSnapshot(scan_snapshot);
    index_close(index, NoLock);  // locks are kept until the end of the transaction
    table_close(table, NoLock);
    return row;
}

// Inserts a completed key row without the SQL executor: a heap insert and the
// index entries, as logical replication's apply does. Only for a key known to
// be absent (complete() after begin() found no row). Returns false, having
// written nothing, when the table is not the plain one the extension created
// (triggers, row security, a column it does not know) - then the caller uses
// the INSERT statement.
//
// The table's CHECK constraints are not evaluated here: every value is checked
// by the callers before (fingerprint 32 bytes, status 100..599, headers a JSON
// object, a positive TTL) or is fixed (state 'completed', fence 1), so they hold
// by construction; the statement path would re-read and re-plan all seven of
// them for every request. A duplicate key raises unique_violation as the
// INSERT would.
bool insert_key_row(text* principal, text* key, text* action, bytea* fingerprint, int status, Datum headers,
                    bool headers_null, Datum body, bool body_null, Datum resource_id, bool resource_id_null,
                    bool one_time_secret, const Interval* ttl) {
    Relation rel = table_open(resolve_key_table().table, RowExclusiveLock);
    TupleDesc desc = RelationGetDescr(rel);
    if (rel->trigdesc != nullptr || rel->rd_rel->relkind != RELKIND_RELATION || rel->rd_rel->relrowsecurity ||
        !only_own_columns(desc)) {
        table_close(rel, NoLock);
        return false;
    }
    const TimestampTz now = GetCurrentTransactionStartTimestamp();
    const Datum expires = DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now),
                                              IntervalPGetDatum(const_cast<Interval*>(ttl)));
    if (DatumGetTimestampTz(expires) <= now) {  // '1 month -30 days' in February: let the CHECK say so
        table_close(rel, NoLock);
        return false;
    }
    Datum values[kMaxKeyColumns] = {};
    bool nulls[kMaxKeyColumns];
    for (int i = 0; i < desc->natts; ++i) nulls[i] = true;
    auto set = [&](KeysColumn column, Datum value) {
        values[column - 1] = value;
        nulls[column - 1] = false;
    };
    set(aPrincipal, PointerGetDatum(principal));
    set(aKey, PointerGetDatum(key));
    set(aAction, PointerGetDatum(action));
    set(aSha, PointerGetDatum(fingerprint));
    set(aState, CStringGetTextDatum("completed"));
    set(aStatus, Int16GetDatum(static_cast<int16>(status)));
    if (!headers_null) set(aHeaders, headers);
    if (!body_null) set(aBody, body);
    if (!resource_id_null) set(aResourceId, resource_id);
    set(aSecret, BoolGetDatum(one_time_secret));
    set(aFence, Int64GetDatum(1));  // lease_until stays NULL: no lease
    set(aCreated, TimestampTzGetDatum(now));
    set(aExpires, expires);

    EState* estate = CreateExecutorState();
    RangeTblEntry* rte = makeNode(RangeTblEntry);
    rte->rtekind = RTE_RELATION;
    rte->relid = RelationGetRelid(rel);
    rte->relkind = rel->rd_rel->relkind;
    rte->rellockmode = RowExclusiveLock;
    compat::ExecInitRangeTable(estate, list_make1(rte));
    ResultRelInfo* result_rel = makeNode(ResultRelInfo);
    InitResultRelInfo(result_rel, rel, 1, nullptr, 0);
    estate->es_output_cid = GetCurrentCommandId(true);
    ExecOpenIndices(result_rel, false);

    TupleTableSlot* slot = table_slot_create(rel, &estate->es_tupleTable);
    ExecClearTuple(slot);
    memcpy(slot->tts_values, values, sizeof(Datum) * desc->natts);
    memcpy(slot->tts_isnull, nulls, sizeof(bool) * desc->natts);
    ExecStoreVirtualTuple(slot);
    table_tuple_insert(rel, slot, estate->es_output_cid, 0, nullptr);
    List* recheck = compat::ExecInsertIndexTuples(result_rel, slot, estate, false, false, nullptr, NIL);
    list_free(recheck);

    ExecCloseIndices(result_rel);
    ExecResetTupleTable(estate->es_tupleTable, false);
    FreeExecutorState(estate);
    table_close(rel, NoLock);  // the lock is kept until the end of the transaction
    CommandCounterIncrement();  // later statements of the transaction see the row, as after INSERT
    return true;
}

// Stores a completed key; returns the number of rows written (0 or 1). A key
// known to be absent is inserted directly (insert_key_row); otherwise the
// upsert statement replaces only an expired row or a lapsed lease.
uint64 store_key(text* principal, text* key, text* action, bytea* fingerprint, int status, Datum headers,
                 bool headers_null, Datum body, bool body_null, Datum resource_id, bool resource_id_null,
                 bool one_time_secret, const Interval* ttl, bool known_absent = false) {
    if (known_absent && insert_key_row(principal, key, action, fingerprint, status, headers, headers_null, body,
                                       body_null, resource_id, resource_id_null, one_time_secret, ttl))
        return 1;
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid types[10] = {TEXTOID, TEXTOID, TEXTOID, BYTEAOID, INT2OID, JSONBOID, BYTEAOID, TEXTOID, BOOLOID, INTERVALOID};
    SPIPlanPtr plan = known_absent ? prepared(&insert_plan, kInsertSql, 10, types)
                                   : prepared(&store_plan, kStoreSql, 10, types);
    Datum values[10] = {PointerGetDatum(principal), PointerGetDatum(key), PointerGetDatum(action),
                        PointerGetDatum(fingerprint), Int16GetDatum(static_cast<int16>(status)), headers, body,
                        resource_id, BoolGetDatum(one_time_secret), IntervalPGetDatum(ttl)};
    char nulls[10] = {' ', ' ', ' ', ' ', ' ', headers_null ? 'n' : ' ', body_null ? 'n' : ' ',
                      resource_id_null ? 'n' : ' ', ' ', ' '};
    int rc = SPI_execute_plan(plan, values, nulls, false, 0);
    if (rc != SPI_OK_INSERT) elog(ERROR, "storing the key failed: %s", SPI_result_code_string(rc));
    uint64 written = SPI_processed;
    SPI_finish();
    return written;
}

// ---------------------------------------------------------------------------
// OutcomeRow rows

enum ResultColumn {
    rOutcome, rStatus, rHeaders, rBody, rResourceId, rCreated, rExpires, rFence, rLeaseUntil, rColumns
};

struct OutcomeRow {
    Datum values[rColumns];
    bool nulls[rColumns];
};

void result_init(OutcomeRow* result, const char* outcome) {
    for (int i = 0; i < rColumns; ++i) {
        result->values[i] = (Datum)0;
        result->nulls[i] = true;
    }
    result->values[rOutcome] = CStringGetTextDatum(outcome);
    result->nulls[rOutcome] = false;
}

void result_copy(OutcomeRow* result, ResultColumn target, const KeyRow& row, int source) {
    bool isnull;
    Datum value = column(row, source, &isnull);
    result->values[target] = value;
    result->nulls[target] = isnull;
}

// The result row. Its type is the one the call expression declares, whose
// descriptor the type cache keeps across calls and statements (fn_extra lives
// only as long as one execution of a statement, so caching there saved
// nothing for prepared statements). Calls without an expression (direct
// function calls) fall back to get_call_result_type, kept in fn_extra.
Datum result_datum(FunctionCallInfo fcinfo, OutcomeRow* result) {
    const Oid type = get_fn_expr_rettype(fcinfo->flinfo);
    if (OidIsValid(type) && type != RECORDOID) {
        TupleDesc desc = lookup_rowtype_tupdesc_noerror(type, -1, true);
        if (desc != nullptr) {
            HeapTuple tuple = heap_form_tuple(desc, result->values, result->nulls);
            ReleaseTupleDesc(desc);
            return HeapTupleGetDatum(tuple);
        }
    }
    TupleDesc desc = static_cast<TupleDesc>(fcinfo->flinfo->fn_extra);
    if (desc == nullptr) {
        TupleDesc found;
        if (get_call_result_type(fcinfo, nullptr, &found) != TYPEFUNC_COMPOSITE)
            ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                            errmsg("function returning a row called in a context that cannot accept it")));
        MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
        desc = BlessTupleDesc(CreateTupleDescCopy(found));
        MemoryContextSwitchTo(old);
        fcinfo->flinfo->fn_extra = desc;
    }
    return HeapTupleGetDatum(heap_form_tuple(desc, result->values, result->nulls));
}

// What a looked-up row means for a new attempt with this fingerprint:
// started (no live row, or an in_progress row whose lease ran out), mismatch,
// replay, secret_replay or in_progress.
const char* outcome_for(const KeyRow& row, bytea* fingerprint) {
    if (!row.found || !column_bool(row, kLive)) return "started";
    bool isnull;
    bytea* stored = DatumGetByteaPP(column(row, kSha, &isnull));
    if (VARSIZE_ANY_EXHDR(stored) != 32 || memcmp(VARDATA_ANY(stored), VARDATA_ANY(fingerprint), 32) != 0)
        return "mismatch";
    if (row_is_completed(row)) return column_bool(row, kSecret) ? "secret_replay" : "replay";
    if (column_bool(row, kLeaseLive)) return "in_progress";
    return "started";
}

// Under REPEATABLE READ / SERIALIZABLE the transaction snapshot may predate a
// winner that committed while we waited (or just before we looked): if the
// latest state has a row that blocks a start, raise 40001 instead of
// starting a second effect. Call inside an SPI connection.
void require_snapshot_sees_winner(text* principal, text* key) {
    if (!IsolationUsesXactSnapshot()) return;
    if (row_blocks_start(lookup_key(principal, key, GetLatestSnapshot())))
        ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                        errmsg("could not serialize access due to a concurrent use of the idempotency key"),
                        errhint("Retry the transaction; it will see the stored response.")));
}

// Fills the result of an outcome other than started from the stored row.
void result_from_row(OutcomeRow* result, const char* outcome, const KeyRow& row) {
    result_init(result, outcome);
    result_copy(result, rCreated, row, kCreated);
    result_copy(result, rExpires, row, kExpires);
    result_copy(result, rFence, row, kFence);
    result_copy(result, rResourceId, row, kResourceId);
    if (strcmp(outcome, "replay") == 0) {
        result_copy(result, rStatus, row, kStatus);
        result_copy(result, rHeaders, row, kHeaders);
        result_copy(result, rBody, row, kBody);
    } else if (strcmp(outcome, "secret_replay") == 0) {
        result_copy(result, rStatus, row, kStatus);
    } else if (strcmp(outcome, "in_progress") == 0) {
        result_copy(result, rLeaseUntil, row, kLeaseUntil);
    }
}

}  // namespace

bool is_final_status(int status) {
    if (status < 100 || status > 599 || final_status_table == nullptr) return false;
    return (*final_status_table)[static_cast<std::size_t>(status - 100)];
}

void protocol_init() {
    DefineCustomIntVariable("idempotency.key_ttl", "How long a key counts after its first use.",
                            "Rows older than this behave as absent and are removed by cleanup. begin() and "
                            "save_final() take a per-call ttl that overrides it.",
                            &key_ttl_seconds, 86400, 1, 366 * 86400, PGC_USERSET, GUC_UNIT_S, nullptr, nullptr,
                            nullptr);
    DefineCustomIntVariable("idempotency.wait_timeout",
                            "How long begin() waits for another transaction that holds the same key.",
                            "When it runs out, begin() returns in_progress and the caller's transaction stays usable.",
                            &wait_timeout_ms, 5000, 0, 3600 * 1000, PGC_USERSET, GUC_UNIT_MS, nullptr, nullptr,
                            nullptr);
    DefineCustomIntVariable("idempotency.max_key_length", "Longest idempotency key accepted, in bytes.", nullptr,
                            &max_key_length, 255, 1, 1024, PGC_USERSET, 0, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("idempotency.lease", "Default lease of idempotency.acquire() and renew().",
                            "A lease-held key counts as in progress until the lease runs out; then another "
                            "acquire() may take it over (fence + 1). Clients renew at a third of it.",
                            &lease_ms, 30000, 10, 86400 * 1000, PGC_USERSET, GUC_UNIT_MS, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("idempotency.cleanup_batch_size",
                            "Rows idempotency.cleanup() deletes per batch (one transaction each).",
                            "Larger batches delete faster; smaller ones hold fewer row locks and less WAL per commit.",
                            &cleanup_batch_size, 1000, 1, 1000000, PGC_USERSET, 0, nullptr, nullptr, nullptr);
    DefineCustomEnumVariable("idempotency.key_format", "Which idempotency keys are accepted: any, uuid or uuidv7.",
                             "any accepts 1 to max_key_length bytes without control characters.", &key_format,
                             kKeyFormatAny, key_format_options, PGC_USERSET, 0, nullptr, nullptr, nullptr);
    DefineCustomStringVariable("idempotency.final_statuses",
                               "HTTP statuses whose responses are stored and replayed.",
                               "A comma-separated list of codes (409) and classes (2xx). Others (401, 429, 5xx "
                               "by default) are not stored, so a retry runs again.",
                               &final_statuses_setting, "2xx,400,403,404,409,410,412,413,415,422", PGC_USERSET, 0,
                               check_final_statuses, assign_final_statuses, nullptr);
    CacheRegisterRelcacheCallback(forget_key_relations, (Datum)0);
    RegisterXactCallback(on_transaction_event, nullptr);
    RegisterSubXactCallback(on_subtransaction_event, nullptr);
}

}  // namespace idem::pg

using namespace idem::pg;

extern "C" {

/// idempotency.begin(principal, key, action, fingerprint, ttl, wait) -> key_outcome
Datum idempotency_begin(PG_FUNCTION_ARGS) {
    const auto [principal, key, action, fingerprint] = request_args(fcinfo);
    Interval ttl = ttl_argument(fcinfo, 4);
    int wait_ms = wait_argument(fcinfo, 5);
    PreventCommandIfReadOnly("idempotency.begin()");
    PendingKey* mine = find_pending(principal, key);
    if (mine != nullptr && mine->completed_subxact == InvalidSubTransactionId)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("idempotency key was already started in this transaction"),
                        errhint("Call idempotency.complete() for it first.")));

    OutcomeRow result;
    LOCKTAG tag;
    key_locktag(&tag, principal, key);
    const LockHolder holder = lock_key(&tag, wait_ms);
    if (holder == LockHolder::none) {
        result_init(&result, "in_progress");
        return result_datum(fcinfo, &result);
    }

    KeyRow row = lookup_key(principal, key, InvalidSnapshot);
    const char* outcome = outcome_for(row, fingerprint);
    const bool started = strcmp(outcome, "started") == 0;
    if (started) require_snapshot_sees_winner(principal, key);

    if (started) {
        // complete() writes fence 1, or the replaced row's fence + 1.
        bool isnull;
        const int64 fence = row.found ? DatumGetInt64(column(row, kFence, &isnull)) + 1 : 1;
        result_init(&result, outcome);
        Datum now = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
        result.values[rCreated] = now;
        result.nulls[rCreated] = false;
        result.values[rExpires] = DirectFunctionCall2(timestamptz_pl_interval, now, IntervalPGetDatum(&ttl));
        result.nulls[rExpires] = false;
        result.values[rFence] = Int64GetDatum(fence);
        result.nulls[rFence] = false;
    } else {
        result_from_row(&result, outcome, row);
    }
    Datum datum = result_datum(fcinfo, &result);

    if (started) {
        add_pending(principal, key, action, fingerprint, ttl, row.found);
    } else {
        // Nothing to do under this key: let waiting duplicates go on now.
        unlock_key(&tag, holder);
    }
    return datum;
}

/// idempotency.complete(principal, key, status, body, headers, resource_id, one_time_secret) -> boolean
Datum idempotency_complete(PG_FUNCTION_ARGS) {
    require_args(fcinfo, 3, "principal, key and status");
    text* principal = PG_GETARG_TEXT_PP(0);
    text* key = PG_GETARG_TEXT_PP(1);
    int status = status_argument(fcinfo, 2);
    check_headers(fcinfo, 4);
    PendingKey* entry = find_pending(principal, key);
    if (entry == nullptr)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("idempotency key was not started in this transaction"),
                        errhint("Call idempotency.begin() in the same transaction and complete only when it returns started.")));
    if (entry->completed_subxact != InvalidSubTransactionId)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("idempotency key was already completed in this transaction")));
    if (!is_final_status(status))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("HTTP status %d is not final and cannot be stored", status),
                        errhint("Roll back instead, so that a retry runs again; see idempotency.final_statuses.")));
    const bool secret = !PG_ARGISNULL(6) && PG_GETARG_BOOL(6);

    uint64 written = store_key(entry->principal, entry->key, entry->action, entry->fingerprint, status,
                               secret || PG_ARGISNULL(4) ? (Datum)0 : PG_GETARG_DATUM(4), secret || PG_ARGISNULL(4),
                               secret || PG_ARGISNULL(3) ? (Datum)0 : PG_GETARG_DATUM(3), secret || PG_ARGISNULL(3),
                               PG_ARGISNULL(5) ? (Datum)0 : PG_GETARG_DATUM(5), PG_ARGISNULL(5), secret,
                               &entry->ttl, !entry->replaces);
    if (written != 1)
        ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                        errmsg("idempotency key was taken by another transaction"),
                        errhint("Retry the transaction.")));
    entry->completed_subxact = GetCurrentSubTransactionId();
    PG_RETURN_BOOL(true);
}

/// idempotency.save_final(principal, key, action, fingerprint, status, body, headers, ttl) -> boolean
Datum idempotency_save_final(PG_FUNCTION_ARGS) {
    const auto [principal, key, action, fingerprint] = request_args(fcinfo);
    require_args(fcinfo, 5, "status");
    int status = status_argument(fcinfo, 4);
    check_headers(fcinfo, 6);
    Interval ttl = ttl_argument(fcinfo, 7);
    PreventCommandIfReadOnly("idempotency.save_final()");
    refuse_if_begun(principal, key, "idempotency.save_final()");
    if (!is_final_status(status)) PG_RETURN_BOOL(false);

    LOCKTAG tag;
    key_locktag(&tag, principal, key);
    if (lock_key(&tag, wait_timeout_ms) == LockHolder::none) PG_RETURN_BOOL(false);
    uint64 written = store_key(principal, key, action, fingerprint, status,
                               PG_ARGISNULL(6) ? (Datum)0 : PG_GETARG_DATUM(6), PG_ARGISNULL(6),
                               PG_ARGISNULL(5) ? (Datum)0 : PG_GETARG_DATUM(5), PG_ARGISNULL(5), (Datum)0, true,
                               false, &ttl);
    PG_RETURN_BOOL(written == 1);
}

/// idempotency.is_final(status) -> boolean
Datum idempotency_is_final(PG_FUNCTION_ARGS) { PG_RETURN_BOOL(is_final_status(PG_GETARG_INT32(0))); }

/// idempotency.forget(principal, key) -> boolean
Datum idempotency_forget(PG_FUNCTION_ARGS) {
    text* principal = PG_GETARG_TEXT_PP(0);
    text* key = PG_GETARG_TEXT_PP(1);
    PreventCommandIfReadOnly("idempotency.forget()");
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid types[2] = {TEXTOID, TEXTOID};
    SPIPlanPtr plan =
        prepared(&forget_plan, "DELETE FROM idempotency.keys WHERE principal = $1 AND key = $2", 2, types);
    Datum values[2] = {PointerGetDatum(principal), PointerGetDatum(key)};
    int rc = SPI_execute_plan(plan, values, nullptr, false, 0);
    if (rc != SPI_OK_DELETE) elog(ERROR, "forgetting the key failed: %s", SPI_result_code_string(rc));
    uint64 deleted = SPI_processed;
    SPI_finish();
    PG_RETURN_BOOL(deleted > 0);
}

// ---------------------------------------------------------------------------
// The lease protocol: for effects outside the database. Each call is meant to
// commit on its own, right away.

/// idempotency.acquire(principal, key, action, fingerprint, lease, ttl, wait) -> key_outcome
Datum idempotency_acquire(PG_FUNCTION_ARGS) {
    const auto [principal, key, action, fingerprint] = request_args(fcinfo);
    Interval lease = lease_argument(fcinfo, 4);
    Interval ttl = ttl_argument(fcinfo, 5);
    int wait_ms = wait_argument(fcinfo, 6);
    PreventCommandIfReadOnly("idempotency.acquire()");
    refuse_if_begun(principal, key, "idempotency.acquire()");

    OutcomeRow result;
    LOCKTAG tag;
    key_locktag(&tag, principal, key);
    const LockHolder holder = lock_key(&tag, wait_ms);
    if (holder == LockHolder::none) {
        result_init(&result, "in_progress");
        return result_datum(fcinfo, &result);
    }

    MemoryContext caller_context = CurrentMemoryContext;
    KeyRow row = lookup_key(principal, key, InvalidSnapshot);
    const char* outcome = outcome_for(row, fingerprint);
    OutcomeRow written;
    bool have_written = false;
    if (strcmp(outcome, "started") == 0) {
        require_snapshot_sees_winner(principal, key);
        if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
        Oid types[6] = {TEXTOID, TEXTOID, TEXTOID, BYTEAOID, INTERVALOID, INTERVALOID};
        SPIPlanPtr plan = prepared(&lease_plan, kLeaseSql, 6, types);
        Datum values[6] = {PointerGetDatum(principal), PointerGetDatum(key), PointerGetDatum(action),
                           PointerGetDatum(fingerprint), IntervalPGetDatum(&lease), IntervalPGetDatum(&ttl)};
        int rc = SPI_execute_plan(plan, values, nullptr, false, 0);
        if (rc != SPI_OK_INSERT_RETURNING) elog(ERROR, "taking the lease failed: %s", SPI_result_code_string(rc));
        if (SPI_processed != 1)
            ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                            errmsg("idempotency key was taken by another transaction"), errhint("Retry.")));
        KeyRow lease_row{true, SPI_copytuple(SPI_tuptable->vals[0]), SPI_tuptable->tupdesc};
        MemoryContext spi_context = MemoryContextSwitchTo(caller_context);
        result_init(&written, "started");
        result_copy(&written, rFence, lease_row, 1);
        result_copy(&written, rLeaseUntil, lease_row, 2);
        result_copy(&written, rCreated, lease_row, 3);
        result_copy(&written, rExpires, lease_row, 4);
        MemoryContextSwitchTo(spi_context);
        SPI_finish();
        have_written = true;
    }

    if (have_written)
        result = written;
    else
        result_from_row(&result, outcome, row);
    Datum datum = result_datum(fcinfo, &result);
    if (!have_written) unlock_key(&tag, holder);
    return datum;
}

namespace {

// Runs one fenced statement ($1 principal, $2 key, $3 fence, more after);
// returns the number of rows it changed.
uint64 run_fenced(SPIPlanPtr* slot, const char* sql, int nargs, Oid* types, Datum* values, const char* nulls,
                  int expected_rc) {
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    SPIPlanPtr plan = prepared(slot, sql, nargs, types);
    int rc = SPI_execute_plan(plan, values, nulls, false, 0);
    if (rc != expected_rc) elog(ERROR, "fenced statement failed: %s", SPI_result_code_string(rc));
    uint64 changed = SPI_processed;
    SPI_finish();
    return changed;
}

}  // namespace

/// idempotency.renew(principal, key, fence, lease) -> boolean
Datum idempotency_renew(PG_FUNCTION_ARGS) {
    require_args(fcinfo, 3, "principal, key and fence");
    Interval lease = lease_argument(fcinfo, 3);
    PreventCommandIfReadOnly("idempotency.renew()");
    Oid types[4] = {TEXTOID, TEXTOID, INT8OID, INTERVALOID};
    Datum values[4] = {PG_GETARG_DATUM(0), PG_GETARG_DATUM(1), PG_GETARG_DATUM(2), IntervalPGetDatum(&lease)};
    uint64 changed = run_fenced(&renew_plan,
                                "UPDATE idempotency.keys SET lease_until = pg_catalog.clock_timestamp() + $4"
                                " WHERE principal = $1 AND key = $2 AND fence = $3 AND state = 'in_progress'"
                                "   AND expires_at > pg_catalog.now()",
                                4, types, values, nullptr, SPI_OK_UPDATE);
    PG_RETURN_BOOL(changed == 1);
}

/// idempotency.complete(principal, key, fence, status, body, headers, resource_id, one_time_secret) -> boolean
Datum idempotency_complete_fenced(PG_FUNCTION_ARGS) {
    require_args(fcinfo, 4, "principal, key, fence and status");
    int status = status_argument(fcinfo, 3);
    check_headers(fcinfo, 5);
    PreventCommandIfReadOnly("idempotency.complete()");
    const bool secret = !PG_ARGISNULL(7) && PG_GETARG_BOOL(7);
    Oid types[8] = {TEXTOID, TEXTOID, INT8OID, INT2OID, BYTEAOID, JSONBOID, TEXTOID, BOOLOID};
    Datum values[8] = {PG_GETARG_DATUM(0),
                       PG_GETARG_DATUM(1),
                       PG_GETARG_DATUM(2),
                       Int16GetDatum(static_cast<int16>(status)),
                       secret || PG_ARGISNULL(4) ? (Datum)0 : PG_GETARG_DATUM(4),
                       secret || PG_ARGISNULL(5) ? (Datum)0 : PG_GETARG_DATUM(5),
                       PG_ARGISNULL(6) ? (Datum)0 : PG_GETARG_DATUM(6),
                       BoolGetDatum(secret)};
    char nulls[8] = {' ', ' ', ' ', ' ', secret || PG_ARGISNULL(4) ? 'n' : ' ', secret || PG_ARGISNULL(5) ? 'n' : ' ',
                     PG_ARGISNULL(6) ? 'n' : ' ', ' '};
    uint64 changed = run_fenced(&fenced_complete_plan,
                                "UPDATE idempotency.keys SET state = 'completed', response_status = $4,"
                                "       response_body = $5, response_headers = $6, resource_id = $7,"
                                "       one_time_secret = $8, lease_until = NULL"
                                " WHERE principal = $1 AND key = $2 AND fence = $3 AND state = 'in_progress'",
                                8, types, values, nulls, SPI_OK_UPDATE);
    if (changed != 1)
        ereport(DEBUG1, (errmsg("idempotency: complete with a stale fence changed nothing")));
    PG_RETURN_BOOL(changed == 1);
}

/// idempotency.release(principal, key, fence) -> boolean
Datum idempotency_release(PG_FUNCTION_ARGS) {
    PreventCommandIfReadOnly("idempotency.release()");
    Oid types[3] = {TEXTOID, TEXTOID, INT8OID};
    Datum values[3] = {PG_GETARG_DATUM(0), PG_GETARG_DATUM(1), PG_GETARG_DATUM(2)};
    // The row stays, with its lease ended, so that the next holder gets a
    // higher fence than any earlier one and stale holders stay fenced out.
    uint64 changed = run_fenced(&release_plan,
                                "UPDATE idempotency.keys SET lease_until = '-infinity'"
                                " WHERE principal = $1 AND key = $2 AND fence = $3 AND state = 'in_progress'"
                                "   AND lease_until > '-infinity'",
                                3, types, values, nullptr, SPI_OK_UPDATE);
    PG_RETURN_BOOL(changed == 1);
}

/// idempotency.claim(principal, key, ttl) -> boolean
Datum idempotency_claim(PG_FUNCTION_ARGS) {
    require_args(fcinfo, 2, "principal and key");
    text* principal = PG_GETARG_TEXT_PP(0);
    text* key = PG_GETARG_TEXT_PP(1);
    check_principal(principal);
    check_key(key);
    Interval ttl = ttl_argument(fcinfo, 2);
    PreventCommandIfReadOnly("idempotency.claim()");
    refuse_if_begun(principal, key, "idempotency.claim()");
    // Like every writer of new key rows, hold the key lock. A transaction that
    // holds the key now is waited for (idempotency.wait_timeout): if it commits
    // a row the claim fails, if it rolls back the claim can still succeed.
    LOCKTAG tag;
    key_locktag(&tag, principal, key);
    if (lock_key(&tag, wait_timeout_ms) == LockHolder::none) PG_RETURN_BOOL(false);
    Oid types[3] = {TEXTOID, TEXTOID, INTERVALOID};
    Datum values[3] = {PointerGetDatum(principal), PointerGetDatum(key), IntervalPGetDatum(&ttl)};
    // A claim is a completed row with status 204, no body and an all-zero
    // fingerprint (no request can have it), so begin()/acquire() on a claimed
    // key answer mismatch.
    uint64 changed = run_fenced(
        &claim_plan,
        "INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state, response_status,"
        "       created_at, expires_at)"
        " VALUES ($1, $2, 'claim', pg_catalog.decode(pg_catalog.repeat('00', 32), 'hex'), 'completed', 204,"
        "         pg_catalog.now(), pg_catalog.now() + $3)"
        " ON CONFLICT (principal, key) DO UPDATE"
        "   SET action = excluded.action, request_sha256 = excluded.request_sha256, state = 'completed',"
        "       response_status = 204, response_headers = NULL, response_body = NULL, resource_id = NULL,"
        "       one_time_secret = false, fence = k.fence + 1, lease_until = NULL,"
        "       created_at = excluded.created_at, expires_at = excluded.expires_at"
        " WHERE k.expires_at <= pg_catalog.now()",
        3, types, values, nullptr, SPI_OK_INSERT);
    PG_RETURN_BOOL(changed == 1);
}

}  // extern "C"
