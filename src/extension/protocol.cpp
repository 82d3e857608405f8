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
#include "commands/sequence.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
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
PG_FUNCTION_INFO_V1(idempotency_bound_principal);
}

namespace idem::pg {

namespace {

// ---------------------------------------------------------------------------
// Argument checks

// Under idempotency.principal_binding = current_user a role acts only for the
// principal that is its own name. The role is the session's current role
// (after SET ROLE), not the owner that SECURITY DEFINER switches to.
void check_principal_binding(text* principal) {
    if (principal_binding == kBindingOff) return;
    const char* role = GetUserNameFromId(GetOuterUserId(), false);
    const size_t length = VARSIZE_ANY_EXHDR(principal);
    if (strlen(role) != length || memcmp(role, VARDATA_ANY(principal), length) != 0)
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("principal is not the calling role"),
                        errdetail("idempotency.principal_binding is current_user."),
                        errhint("Connect (or SET ROLE) as the role whose name is the principal.")));
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

// A key the client sent that the server refuses: 22P02, so that a client can
// answer 400 for exactly these and treat every 22023 as its own bug.
[[noreturn]] void malformed_key(const char* message, const char* detail = nullptr) {
    if (detail != nullptr)
        ereport(ERROR, (errcode(ERRCODE_INVALID_TEXT_REPRESENTATION), errmsg("%s", message), errdetail("%s", detail)));
    ereport(ERROR, (errcode(ERRCODE_INVALID_TEXT_REPRESENTATION), errmsg("%s", message)));
    pg_unreachable();
}

// Keys and principals are never echoed in messages above DEBUG: they may be secrets.
void check_key(text* key) {
    const char* p = VARDATA_ANY(key);
    const int length = VARSIZE_ANY_EXHDR(key);
    if (length == 0) malformed_key("idempotency key must not be empty");
    if (length > max_key_length)
        ereport(ERROR, (errcode(ERRCODE_INVALID_TEXT_REPRESENTATION),
                        errmsg("idempotency key is %d bytes long, longer than idempotency.max_key_length (%d)",
                               length, max_key_length)));
    const bool utf8 = GetDatabaseEncoding() == PG_UTF8;
    for (int i = 0; i < length; ++i) {
        unsigned char c = static_cast<unsigned char>(p[i]);
        // C0 controls, DEL, and the C1 controls U+0080..U+009F (UTF-8 C2 80..C2 9F).
        const bool c1 = utf8 && c == 0xc2 && i + 1 < length && static_cast<unsigned char>(p[i + 1]) < 0xa0;
        if (c < 0x20 || c == 0x7f || c1) malformed_key("idempotency key must not contain control characters");
    }
    if (key_format == kKeyFormatAny) return;
    bool ok = length == 36;
    for (int i = 0; ok && i < 36; ++i) ok = (i == 8 || i == 13 || i == 18 || i == 23) ? p[i] == '-' : is_hex(p[i]);
    if (!ok)
        malformed_key("idempotency key is not a UUID",
                      "idempotency.key_format requires the form 8-4-4-4-12 hexadecimal digits.");
    if (key_format == kKeyFormatUuidV7 && (p[14] != '7' || strchr("89abAB", p[19]) == nullptr))
        malformed_key("idempotency key is not a version 7 UUID", "idempotency.key_format is uuidv7.");
}

// An empty principal is refused: it is what an unauthenticated request turns
// into when an auth layer maps "nobody" to "", and every such request would
// share one key space. Single-tenant applications pass a constant.
void check_principal(text* principal) {
    if (VARSIZE_ANY_EXHDR(principal) == 0)
        invalid("principal must not be empty", "Pass the authenticated user, API key or tenant; a constant such as "
                                               "'default' for a single-tenant application.");
    if (VARSIZE_ANY_EXHDR(principal) > 1024) invalid("principal must be at most 1024 bytes long");
    check_principal_binding(principal);
}

void check_action(text* action) {
    if (VARSIZE_ANY_EXHDR(action) == 0) invalid("action must not be empty");
    if (VARSIZE_ANY_EXHDR(action) > 1024) invalid("action must be at most 1024 bytes long");
}

void check_fingerprint(bytea* fingerprint) {
    if (VARSIZE_ANY_EXHDR(fingerprint) != 32)
        invalid("fingerprint must be 32 bytes (SHA-256)", "Compute it with idempotency.fingerprint().");
}

// Microseconds of an interval (a month counts 30 days), saturated to the int64
// range so that no interval, however extreme, overflows.
int64 interval_usecs(const Interval* span) {
    const __int128 usecs = static_cast<__int128>(span->time) + static_cast<__int128>(span->day) * USECS_PER_DAY +
                           static_cast<__int128>(span->month) * DAYS_PER_MONTH * USECS_PER_DAY;
    if (usecs > PG_INT64_MAX) return PG_INT64_MAX;
    if (usecs < PG_INT64_MIN) return PG_INT64_MIN;
    return static_cast<int64>(usecs);
}

bool argument_given(FunctionCallInfo fcinfo, int arg) { return PG_NARGS() > arg && !PG_ARGISNULL(arg); }

Interval interval_of_usecs(int64 usecs) {
    Interval span;
    memset(&span, 0, sizeof span);
    span.time = usecs;
    return span;
}

// The TTL argument, or idempotency.key_ttl when NULL: more than 0, at most
// kMaxTtlSeconds (the setting's own maximum; any larger value would only
// push expires_at towards the end of the timestamp range).
Interval ttl_argument(FunctionCallInfo fcinfo, int arg) {
    if (!argument_given(fcinfo, arg)) return interval_of_usecs(static_cast<int64>(key_ttl_seconds) * USECS_PER_SEC);
    Interval ttl = *PG_GETARG_INTERVAL_P(arg);
    const int64 usecs = interval_usecs(&ttl);
    if (usecs <= 0 || usecs > static_cast<int64>(kMaxTtlSeconds) * USECS_PER_SEC)
        invalid("ttl must be more than 0 and at most 366 days");
    return ttl;
}

// The lease argument, or idempotency.lease when NULL: the setting's own range,
// kMinLeaseMs to kMaxLeaseMs. The floor is one a renewer can keep: clients
// renew every third of the lease but never more often than every 50 ms.
Interval lease_argument(FunctionCallInfo fcinfo, int arg) {
    if (!argument_given(fcinfo, arg)) return interval_of_usecs(static_cast<int64>(lease_ms) * 1000);
    Interval lease = *PG_GETARG_INTERVAL_P(arg);
    const int64 usecs = interval_usecs(&lease);
    if (usecs < static_cast<int64>(kMinLeaseMs) * 1000 || usecs > static_cast<int64>(kMaxLeaseMs) * 1000)
        invalid("lease must be between 100 milliseconds and 24 hours", "idempotency.lease has the same range.");
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
    int64 fence;                         // drawn by begin; complete writes it
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

void add_pending(text* principal, text* key, text* action, bytea* fingerprint, const Interval& ttl, int64 fence,
                 bool replaces) {
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
    entry.fence = fence;
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

// When an existing row may be replaced by a new attempt (the WHERE of every
// upsert below; lookup_key and outcome_for say the same in C): the row is dead
// (its key expired and no lease holds it), or it is an in_progress row of the
// same request whose lease ran out. A live row of another request is never
// replaced, whichever function asks: that is a mismatch.
#define REPLACEABLE_ROW                                                                                  \
    " WHERE (k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()"                                     \
    "        AND (k.lease_until IS NULL OR k.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()))" \
    "    OR (k.state OPERATOR(pg_catalog.=) 'in_progress'"                                              \
    "        AND k.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()"                    \
    "        AND k.request_sha256 OPERATOR(pg_catalog.=) excluded.request_sha256)"

// Writes the in_progress row of a lease with the fence drawn for it ($7): a
// new row, or a takeover of a replaceable row. A takeover of a live key keeps
// its created_at and expires_at: the key's TTL runs from its first use.
const char* const kLeaseSql =
    "INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state, lease_until,"
    "       created_at, expires_at, fence)"
    " VALUES ($1, $2, $3, $4, 'in_progress', pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $5,"
    "         pg_catalog.now(), pg_catalog.now() OPERATOR(pg_catalog.+) $6, $7)"
    " ON CONFLICT (principal, key) DO UPDATE"
    "   SET action = excluded.action, request_sha256 = excluded.request_sha256, state = 'in_progress',"
    "       response_status = NULL, response_headers = NULL, response_body = NULL, resource_id = NULL,"
    "       one_time_secret = false, fence = excluded.fence, lease_until = excluded.lease_until,"
    "       created_at = CASE WHEN k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()"
    "                    THEN excluded.created_at ELSE k.created_at END,"
    "       expires_at = CASE WHEN k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()"
    "                    THEN excluded.expires_at ELSE k.expires_at END"
    REPLACEABLE_ROW
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


// Inserts the final row with its fence ($11); replaces a replaceable row,
// never a live one of another request (then nothing is written).
const char* const kStoreSql =
    "INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state, response_status,"
    "       response_headers, response_body, resource_id, one_time_secret, created_at, expires_at, fence)"
    " VALUES ($1, $2, $3, $4, 'completed', $5, $6, $7, $8, $9, pg_catalog.now(),"
    "         pg_catalog.now() OPERATOR(pg_catalog.+) $10, $11)"
    " ON CONFLICT (principal, key) DO UPDATE"
    "   SET action = excluded.action, request_sha256 = excluded.request_sha256, state = 'completed',"
    "       response_status = excluded.response_status, response_headers = excluded.response_headers,"
    "       response_body = excluded.response_body, resource_id = excluded.resource_id,"
    "       one_time_secret = excluded.one_time_secret, fence = excluded.fence, lease_until = NULL,"
    "       created_at = excluded.created_at, expires_at = excluded.expires_at"
    REPLACEABLE_ROW;

// The common case of complete(): the key had no row when begin() looked, and
// every writer of new key rows (begin/complete, acquire, save_final, claim)
// holds the key lock, so a plain INSERT suffices: no speculative insertion,
// no extra WAL record. (Only when the direct insert cannot be used.)
const char* const kInsertSql =
    "INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status,"
    "       response_headers, response_body, resource_id, one_time_secret, created_at, expires_at, fence)"
    " VALUES ($1, $2, $3, $4, 'completed', $5, $6, $7, $8, $9, pg_catalog.now(),"
    "         pg_catalog.now() OPERATOR(pg_catalog.+) $10, $11)";

// The response a call stores, built once from its arguments. A one-time
// secret keeps neither body nor headers: only the status and the marker.
struct StoredResponse {
    int status;
    Datum headers;
    Datum body;
    Datum resource_id;
    bool headers_null;
    bool body_null;
    bool resource_id_null;
    bool one_time_secret;
};

// The response from the arguments at these positions (-1: no such argument).
StoredResponse response_arguments(FunctionCallInfo fcinfo, int status_arg, int body_arg, int headers_arg,
                                  int resource_id_arg, int secret_arg) {
    StoredResponse response{};
    response.status = status_argument(fcinfo, status_arg);
    check_headers(fcinfo, headers_arg);
    response.one_time_secret = secret_arg >= 0 && argument_given(fcinfo, secret_arg) && PG_GETARG_BOOL(secret_arg);
    auto take = [&](int arg, Datum* value, bool* isnull) {
        *isnull = arg < 0 || response.one_time_secret || !argument_given(fcinfo, arg);
        *value = *isnull ? (Datum)0 : PG_GETARG_DATUM(arg);
    };
    take(headers_arg, &response.headers, &response.headers_null);
    take(body_arg, &response.body, &response.body_null);
    response.resource_id_null = resource_id_arg < 0 || !argument_given(fcinfo, resource_id_arg);
    response.resource_id = response.resource_id_null ? (Datum)0 : PG_GETARG_DATUM(resource_id_arg);
    return response;
}

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
Oid fences_sequence_oid = InvalidOid;

void forget_key_relations(Datum arg, Oid relid) {
    if (relid == InvalidOid || relid == keys_table_oid || relid == keys_index_oid || relid == fences_sequence_oid) {
        keys_table_oid = InvalidOid;
        keys_index_oid = InvalidOid;
        fences_sequence_oid = InvalidOid;
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
    Oid fences;
};

// The key table's OIDs, looked up once per session (dropped by the relcache
// callback above). Callers use the returned copy: opening a relation accepts
// invalidation messages, and the callback may clear the cache in between.
KeyTableOids resolve_key_table() {
    if (!OidIsValid(keys_table_oid) || !OidIsValid(keys_index_oid) || !OidIsValid(fences_sequence_oid)) {
        Oid schema = get_namespace_oid("idempotency", false);
        Oid table = get_relname_relid("keys", schema);
        Oid index = get_relname_relid("keys_pkey", schema);
        Oid fences = get_relname_relid("fences", schema);
        if (!OidIsValid(table) || !OidIsValid(index))
            ereport(ERROR,
                    (errcode(ERRCODE_UNDEFINED_TABLE), errmsg("idempotency.keys or its primary key is missing")));
        if (!OidIsValid(fences))
            ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE), errmsg("idempotency.fences is missing"),
                            errhint("The installed library is newer than the extension's objects: run ALTER "
                                    "EXTENSION idempotency UPDATE.")));
        keys_table_oid = table;
        keys_index_oid = index;
        fences_sequence_oid = fences;
    }
    return KeyTableOids{keys_table_oid, keys_index_oid, fences_sequence_oid};
}

// A new fence: from one sequence per database, so a fence is never handed out
// twice for a key - not after cleanup or forget deleted its row, nor after a
// crash (a sequence never goes back past a value whose use committed), nor
// after dump and restore (the sequence is dumped with the extension's data).
int64 next_fence() { return nextval_internal(resolve_key_table().fences, false); }

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
    IndexScanDesc scan = index_beginscan(table, index, scan_snapshot, 2, 0);
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
        // A row is live while its key has not expired or a lease holds it (a
        // lease may outlive the key's ttl; only in_progress rows have one).
        const TimestampTz expires = DatumGetTimestampTz(values[kExpires - 1]);
        const bool leased = !nulls[kLeaseUntil - 1] &&
                            DatumGetTimestampTz(values[kLeaseUntil - 1]) > GetCurrentTimestamp();  // clock_timestamp()
        values[kLive - 1] = BoolGetDatum(leased || expires > GetCurrentTransactionStartTimestamp());  // now()
        nulls[kLive - 1] = false;
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
// object, a positive TTL, a fence from the sequence) or is fixed (state
// 'completed'), so they hold by construction; the statement path would re-read
// and re-plan all seven of them for every request. A duplicate key raises
// unique_violation as the INSERT would.
bool insert_key_row(text* principal, text* key, text* action, bytea* fingerprint, const StoredResponse& response,
                    const Interval* ttl, int64 fence) {
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
    set(aStatus, Int16GetDatum(static_cast<int16>(response.status)));
    if (!response.headers_null) set(aHeaders, response.headers);
    if (!response.body_null) set(aBody, response.body);
    if (!response.resource_id_null) set(aResourceId, response.resource_id);
    set(aSecret, BoolGetDatum(response.one_time_secret));
    set(aFence, Int64GetDatum(fence));  // lease_until stays NULL: no lease
    set(aCreated, TimestampTzGetDatum(now));
    set(aExpires, expires);

    EState* estate = CreateExecutorState();
    RangeTblEntry* rte = makeNode(RangeTblEntry);
    rte->rtekind = RTE_RELATION;
    rte->relid = RelationGetRelid(rel);
    rte->relkind = rel->rd_rel->relkind;
    rte->rellockmode = RowExclusiveLock;
    ExecInitRangeTable(estate, list_make1(rte));
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
    List* recheck = ExecInsertIndexTuples(result_rel, slot, estate, false, false, nullptr, NIL);
    list_free(recheck);

    ExecCloseIndices(result_rel);
    ExecResetTupleTable(estate->es_tupleTable, false);
    FreeExecutorState(estate);
    table_close(rel, NoLock);  // the lock is kept until the end of the transaction
    CommandCounterIncrement();  // later statements of the transaction see the row, as after INSERT
    return true;
}

// Stores a completed key with its fence; returns the number of rows written
// (0 or 1). A key known to be absent is inserted directly (insert_key_row);
// otherwise the upsert statement replaces only a replaceable row.
uint64 store_key(text* principal, text* key, text* action, bytea* fingerprint, const StoredResponse& response,
                 const Interval* ttl, int64 fence, bool known_absent = false) {
    if (known_absent && insert_key_row(principal, key, action, fingerprint, response, ttl, fence)) return 1;
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid types[11] = {TEXTOID, TEXTOID,  TEXTOID, BYTEAOID,    INT2OID, JSONBOID,
                     BYTEAOID, TEXTOID, BOOLOID, INTERVALOID, INT8OID};
    SPIPlanPtr plan = known_absent ? prepared(&insert_plan, kInsertSql, 11, types)
                                   : prepared(&store_plan, kStoreSql, 11, types);
    Datum values[11] = {PointerGetDatum(principal),
                        PointerGetDatum(key),
                        PointerGetDatum(action),
                        PointerGetDatum(fingerprint),
                        Int16GetDatum(static_cast<int16>(response.status)),
                        response.headers,
                        response.body,
                        response.resource_id,
                        BoolGetDatum(response.one_time_secret),
                        IntervalPGetDatum(ttl),
                        Int64GetDatum(fence)};
    char nulls[11] = {' ', ' ', ' ', ' ', ' ', response.headers_null ? 'n' : ' ', response.body_null ? 'n' : ' ',
                      response.resource_id_null ? 'n' : ' ', ' ', ' ', ' '};
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

void protocol_init() {
    CacheRegisterRelcacheCallback(forget_key_relations, (Datum)0);
    RegisterXactCallback(on_transaction_event, nullptr);
    RegisterSubXactCallback(on_subtransaction_event, nullptr);
}

}  // namespace idem::pg

using namespace idem::pg;

extern "C" {

/// idempotency.begin(principal, key, action, fingerprint, ttl, wait) -> key_outcome
Datum idempotency_begin(PG_FUNCTION_ARGS) {
    require_valid_settings();
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

    int64 fence = 0;
    if (started) {
        // The fence complete() will write, drawn now so that the caller knows it.
        fence = next_fence();
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
        add_pending(principal, key, action, fingerprint, ttl, fence, row.found);
    } else {
        // Nothing to do under this key: let waiting duplicates go on now.
        unlock_key(&tag, holder);
    }
    return datum;
}

}  // extern "C"

namespace idem::pg {
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

// The lease protocol's completion: stores the response while `fence` still
// holds the key (true); false, changing nothing, once another holder took the
// key over. A key whose ttl ran out while its lease kept it alive is kept for
// one more ttl from now, so that the stored response can be replayed.
Datum complete_with_fence(FunctionCallInfo fcinfo, int fence_arg, const StoredResponse& response) {
    PreventCommandIfReadOnly("idempotency.complete()");
    check_principal_binding(PG_GETARG_TEXT_PP(0));
    Oid types[8] = {TEXTOID, TEXTOID, INT8OID, INT2OID, BYTEAOID, JSONBOID, TEXTOID, BOOLOID};
    Datum values[8] = {PG_GETARG_DATUM(0),
                       PG_GETARG_DATUM(1),
                       PG_GETARG_DATUM(fence_arg),
                       Int16GetDatum(static_cast<int16>(response.status)),
                       response.body,
                       response.headers,
                       response.resource_id,
                       BoolGetDatum(response.one_time_secret)};
    char nulls[8] = {' ',
                     ' ',
                     ' ',
                     ' ',
                     response.body_null ? 'n' : ' ',
                     response.headers_null ? 'n' : ' ',
                     response.resource_id_null ? 'n' : ' ',
                     ' '};
    uint64 changed = run_fenced(
        &fenced_complete_plan,
        "UPDATE idempotency.keys SET state = 'completed', response_status = $4,"
        "       response_body = $5, response_headers = $6, resource_id = $7,"
        "       one_time_secret = $8, lease_until = NULL,"
        "       expires_at = GREATEST(expires_at, pg_catalog.now() OPERATOR(pg_catalog.+)"
        "                    (expires_at OPERATOR(pg_catalog.-) created_at))"
        " WHERE principal OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"
        "   AND fence OPERATOR(pg_catalog.=) $3 AND state OPERATOR(pg_catalog.=) 'in_progress'",
        8, types, values, nulls, SPI_OK_UPDATE);
    if (changed != 1) ereport(DEBUG1, (errmsg("idempotency: complete with a stale fence changed nothing")));
    PG_RETURN_BOOL(changed == 1);
}

}  // namespace
}  // namespace idem::pg

extern "C" {

/// idempotency.complete(principal, key, status, body, headers, resource_id, one_time_secret, fence) -> boolean
/// Without fence: the transactional completion of a key begun in this
/// transaction. With fence: the lease protocol's completion.
Datum idempotency_complete(PG_FUNCTION_ARGS) {
    require_valid_settings();
    require_args(fcinfo, 3, "principal, key and status");
    if (argument_given(fcinfo, 7)) return complete_with_fence(fcinfo, 7, response_arguments(fcinfo, 2, 3, 4, 5, 6));
    text* principal = PG_GETARG_TEXT_PP(0);
    text* key = PG_GETARG_TEXT_PP(1);
    const StoredResponse response = response_arguments(fcinfo, 2, 3, 4, 5, 6);
    PendingKey* entry = find_pending(principal, key);
    if (entry == nullptr)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("idempotency key was not started in this transaction"),
                        errhint("Call idempotency.begin() in the same transaction and complete only when it "
                                "returns started; pass fence => for a key taken with idempotency.acquire().")));
    if (entry->completed_subxact != InvalidSubTransactionId)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("idempotency key was already completed in this transaction")));
    if (!is_final_status(response.status))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("HTTP status %d is not final and cannot be stored", response.status),
                        errhint("Roll back instead, so that a retry runs again; see idempotency.final_statuses.")));

    uint64 written = store_key(entry->principal, entry->key, entry->action, entry->fingerprint, response,
                               &entry->ttl, entry->fence, !entry->replaces);
    if (written != 1)
        ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                        errmsg("idempotency key was taken by another transaction"),
                        errhint("Retry the transaction.")));
    entry->completed_subxact = GetCurrentSubTransactionId();
    PG_RETURN_BOOL(true);
}

/// The 0.3.0-0.5.0 overload complete(principal, key, fence, status, body,
/// headers, resource_id, one_time_secret); 0.6.0 drops it from SQL, the symbol
/// stays for the upgrade scripts that create it on the way.
Datum idempotency_complete_fenced(PG_FUNCTION_ARGS) {
    require_valid_settings();
    require_args(fcinfo, 4, "principal, key, fence and status");
    return complete_with_fence(fcinfo, 2, response_arguments(fcinfo, 3, 4, 5, 6, 7));
}

/// idempotency.save_final(principal, key, action, fingerprint, status, body, headers, ttl, one_time_secret)
/// -> boolean
Datum idempotency_save_final(PG_FUNCTION_ARGS) {
    require_valid_settings();
    const auto [principal, key, action, fingerprint] = request_args(fcinfo);
    require_args(fcinfo, 5, "status");
    const StoredResponse response = response_arguments(fcinfo, 4, 5, 6, -1, 8);
    Interval ttl = ttl_argument(fcinfo, 7);
    PreventCommandIfReadOnly("idempotency.save_final()");
    refuse_if_begun(principal, key, "idempotency.save_final()");
    if (!is_final_status(response.status)) PG_RETURN_BOOL(false);

    // false when the wait for a transaction that holds the key runs out: the
    // response may or may not be stored by then, and the caller answers the
    // same either way.
    LOCKTAG tag;
    key_locktag(&tag, principal, key);
    if (lock_key(&tag, wait_timeout_ms) == LockHolder::none) PG_RETURN_BOOL(false);
    uint64 written = store_key(principal, key, action, fingerprint, response, &ttl, next_fence());
    PG_RETURN_BOOL(written == 1);
}

/// idempotency.is_final(status) -> boolean
Datum idempotency_is_final(PG_FUNCTION_ARGS) {
    require_valid_settings();
    PG_RETURN_BOOL(is_final_status(PG_GETARG_INT32(0)));
}

/// idempotency.bound_principal(principal) -> text: the principal, when the
/// calling role may act for it under idempotency.principal_binding (42501 otherwise).
Datum idempotency_bound_principal(PG_FUNCTION_ARGS) {
    require_valid_settings();
    check_principal_binding(PG_GETARG_TEXT_PP(0));
    PG_RETURN_DATUM(PG_GETARG_DATUM(0));
}

/// idempotency.forget(principal, key) -> boolean
Datum idempotency_forget(PG_FUNCTION_ARGS) {
    require_valid_settings();
    text* principal = PG_GETARG_TEXT_PP(0);
    text* key = PG_GETARG_TEXT_PP(1);
    check_principal_binding(principal);
    PreventCommandIfReadOnly("idempotency.forget()");
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid types[2] = {TEXTOID, TEXTOID};
    SPIPlanPtr plan = prepared(&forget_plan,
                               "DELETE FROM idempotency.keys"
                               " WHERE principal OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2",
                               2, types);
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
    require_valid_settings();
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
        const int64 fence = next_fence();
        if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
        Oid types[7] = {TEXTOID, TEXTOID, TEXTOID, BYTEAOID, INTERVALOID, INTERVALOID, INT8OID};
        SPIPlanPtr plan = prepared(&lease_plan, kLeaseSql, 7, types);
        Datum values[7] = {PointerGetDatum(principal), PointerGetDatum(key),     PointerGetDatum(action),
                           PointerGetDatum(fingerprint), IntervalPGetDatum(&lease), IntervalPGetDatum(&ttl),
                           Int64GetDatum(fence)};
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

/// idempotency.renew(principal, key, fence, lease) -> boolean
/// Extends the lease while fence holds the key and the row is live (its key
/// has not expired or its lease has not run out); a lease may outlive the key's ttl.
Datum idempotency_renew(PG_FUNCTION_ARGS) {
    require_valid_settings();
    require_args(fcinfo, 3, "principal, key and fence");
    check_principal_binding(PG_GETARG_TEXT_PP(0));
    Interval lease = lease_argument(fcinfo, 3);
    PreventCommandIfReadOnly("idempotency.renew()");
    Oid types[4] = {TEXTOID, TEXTOID, INT8OID, INTERVALOID};
    Datum values[4] = {PG_GETARG_DATUM(0), PG_GETARG_DATUM(1), PG_GETARG_DATUM(2), IntervalPGetDatum(&lease)};
    uint64 changed = run_fenced(
        &renew_plan,
        "UPDATE idempotency.keys"
        "   SET lease_until = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $4"
        " WHERE principal OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"
        "   AND fence OPERATOR(pg_catalog.=) $3 AND state OPERATOR(pg_catalog.=) 'in_progress'"
        "   AND (expires_at OPERATOR(pg_catalog.>) pg_catalog.now()"
        "        OR lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp())",
        4, types, values, nullptr, SPI_OK_UPDATE);
    PG_RETURN_BOOL(changed == 1);
}

/// idempotency.release(principal, key, fence) -> boolean
/// Ends a live lease so that a retry may run again; false when fence no longer
/// holds the key or its lease had already run out.
Datum idempotency_release(PG_FUNCTION_ARGS) {
    require_valid_settings();
    check_principal_binding(PG_GETARG_TEXT_PP(0));
    PreventCommandIfReadOnly("idempotency.release()");
    Oid types[3] = {TEXTOID, TEXTOID, INT8OID};
    Datum values[3] = {PG_GETARG_DATUM(0), PG_GETARG_DATUM(1), PG_GETARG_DATUM(2)};
    // The row stays, with its lease ended; fences come from a sequence, so the
    // next holder's is higher than any earlier one's either way.
    uint64 changed = run_fenced(
        &release_plan,
        "UPDATE idempotency.keys SET lease_until = '-infinity'"
        " WHERE principal OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"
        "   AND fence OPERATOR(pg_catalog.=) $3 AND state OPERATOR(pg_catalog.=) 'in_progress'"
        "   AND lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()",
        3, types, values, nullptr, SPI_OK_UPDATE);
    PG_RETURN_BOOL(changed == 1);
}

/// idempotency.claim(principal, key, ttl) -> boolean
Datum idempotency_claim(PG_FUNCTION_ARGS) {
    require_valid_settings();
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
    Oid types[4] = {TEXTOID, TEXTOID, INTERVALOID, INT8OID};
    Datum values[4] = {PointerGetDatum(principal), PointerGetDatum(key), IntervalPGetDatum(&ttl),
                       Int64GetDatum(next_fence())};
    // A claim is a completed row with status 204, no body and an all-zero
    // fingerprint (no request can have it), so begin()/acquire() on a claimed
    // key answer mismatch. Only a dead row (expired, no live lease) is replaced.
    uint64 changed = run_fenced(
        &claim_plan,
        "INSERT INTO idempotency.keys AS k (principal, key, action, request_sha256, state, response_status,"
        "       created_at, expires_at, fence)"
        " VALUES ($1, $2, 'claim', pg_catalog.decode(pg_catalog.repeat('00', 32), 'hex'), 'completed', 204,"
        "         pg_catalog.now(), pg_catalog.now() OPERATOR(pg_catalog.+) $3, $4)"
        " ON CONFLICT (principal, key) DO UPDATE"
        "   SET action = excluded.action, request_sha256 = excluded.request_sha256, state = 'completed',"
        "       response_status = 204, response_headers = NULL, response_body = NULL, resource_id = NULL,"
        "       one_time_secret = false, fence = excluded.fence, lease_until = NULL,"
        "       created_at = excluded.created_at, expires_at = excluded.expires_at"
        " WHERE k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()"
        "   AND (k.lease_until IS NULL OR k.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())",
        4, types, values, nullptr, SPI_OK_INSERT);
    PG_RETURN_BOOL(changed == 1);
}

}  // extern "C"
