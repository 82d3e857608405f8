// Server-side counters in shared memory: one entry per (database, action),
// each a row of atomic counters and a fixed log-scale histogram of the waits
// for a held key. Counting is lock-free: a backend finds an action's entry
// once (under a shared LWLock, or an exclusive one to add it), keeps the
// pointer in a backend-local table, and from then on only adds atomically.
// Entries are never removed (a reset zeroes them), so a kept pointer stays
// valid for the life of the server; after a crash the postmaster recreates
// shared memory and every backend, so the counters start again at zero.
//
// At most idempotency.max_actions actions get an entry of their own; the
// rest are counted under '(other)' (one per database while room is left,
// then one for the whole server, shown with database NULL, always listed).
#include "counters.hpp"

#include "guard.hpp"
#include "key_store.hpp"
#include "settings.hpp"

#include "compat.hpp"

extern "C" {
#include "postgres.h"

#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "common/hashfn.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

namespace idem::pg {

bool counters_attached = false;

namespace {

constexpr int kCounters = static_cast<int>(Counter::count);
// Upper bounds of the wait histogram's buckets, in microseconds (1-2-5 steps
// from 1 ms to 1 min, then everything longer).
constexpr uint64 kBucketBoundsUs[] = {1000,    2000,    5000,     10000,    20000,
                                      50000,   100000,  200000,   500000,   1000000,
                                      2000000, 5000000, 10000000, 30000000, 60000000};
constexpr int kBuckets = sizeof kBucketBoundsUs / sizeof kBucketBoundsUs[0] + 1;  // + infinity
// Shown bytes of an action's name (the entry is found by a 64-bit hash of all of it).
constexpr int kShownAction = 256;
// Entries for '(other)' beyond max_actions: one per database while they last.
constexpr int kOtherEntries = 64;
constexpr uint64 kOtherHash = 0;
const char* const kTrancheName = "idempotency counters";

struct EntryKey {
    Oid database;
    uint32 unused;
    uint64 action_hash;
};

struct Entry {
    EntryKey key;
    char action[kShownAction];
    pg_atomic_uint64 counts[kCounters];
    pg_atomic_uint64 buckets[kBuckets];
    pg_atomic_uint64 wait_sum_us;
    pg_atomic_uint64 wait_max_us;
};

struct Shared {
    LWLock* lock;
    pg_atomic_uint64 reset_at;  // TimestampTz of the last reset (or of the server's start)
    int named;                  // entries of named actions (at most max_actions)
    Entry other;                // '(other)' for the whole server, when no per-database one is left
};

Shared* shared = nullptr;
HTAB* entries = nullptr;  // shared, EntryKey -> Entry
HTAB* local = nullptr;    // this backend's, action hash -> Entry*

struct LocalEntry {
    uint64 action_hash;
    Entry* entry;
};

shmem_request_hook_type previous_request_hook = nullptr;
shmem_startup_hook_type previous_startup_hook = nullptr;

long capacity() { return static_cast<long>(max_actions) + kOtherEntries; }

void reset_entry(Entry* entry) {
    for (auto& count : entry->counts) pg_atomic_write_u64(&count, 0);
    for (auto& bucket : entry->buckets) pg_atomic_write_u64(&bucket, 0);
    pg_atomic_write_u64(&entry->wait_sum_us, 0);
    pg_atomic_write_u64(&entry->wait_max_us, 0);
}

void init_entry(Entry* entry, const char* action, int length) {
    length = Min(length, kShownAction - 1);
    memcpy(entry->action, action, length);
    entry->action[length] = '\0';
    for (auto& count : entry->counts) pg_atomic_init_u64(&count, 0);
    for (auto& bucket : entry->buckets) pg_atomic_init_u64(&bucket, 0);
    pg_atomic_init_u64(&entry->wait_sum_us, 0);
    pg_atomic_init_u64(&entry->wait_max_us, 0);
}

void request_shmem() {
    if (previous_request_hook != nullptr) previous_request_hook();
    RequestAddinShmemSpace(
        add_size(MAXALIGN(sizeof(Shared)), hash_estimate_size(capacity(), sizeof(Entry))));
    RequestNamedLWLockTranche(kTrancheName, 1);
}

void startup_shmem() {
    if (previous_startup_hook != nullptr) previous_startup_hook();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    bool found;
    shared = static_cast<Shared*>(ShmemInitStruct("idempotency counters", sizeof(Shared), &found));
    if (!found) {
        shared->lock = &(GetNamedLWLockTranche(kTrancheName))->lock;
        pg_atomic_init_u64(&shared->reset_at, static_cast<uint64>(GetCurrentTimestamp()));
        shared->named = 0;
        shared->other.key = EntryKey{InvalidOid, 0, kOtherHash};
        init_entry(&shared->other, "(other)", 7);
    }
    HASHCTL info;
    memset(&info, 0, sizeof info);
    info.keysize = sizeof(EntryKey);
    info.entrysize = sizeof(Entry);
    entries = ShmemInitHash("idempotency counters by action", capacity(), capacity(), &info,
                            HASH_ELEM | HASH_BLOBS);
    LWLockRelease(AddinShmemInitLock);
    counters_attached = true;
}

// The shared entry of (this database, action): found, added, or '(other)'.
Entry* shared_entry(uint64 hash, const char* action, int length) {
    EntryKey key{MyDatabaseId, 0, hash};
    LWLockAcquire(shared->lock, LW_SHARED);
    auto* entry = static_cast<Entry*>(hash_search(entries, &key, HASH_FIND, nullptr));
    LWLockRelease(shared->lock);
    if (entry != nullptr) return entry;

    LWLockAcquire(shared->lock, LW_EXCLUSIVE);
    bool found = false;
    if (shared->named < max_actions) {
        entry = static_cast<Entry*>(hash_search(entries, &key, HASH_ENTER_NULL, &found));
        if (entry != nullptr && !found) {
            init_entry(entry, action, length);
            ++shared->named;
        }
    } else {
        entry = static_cast<Entry*>(hash_search(entries, &key, HASH_FIND, nullptr));
    }
    if (entry == nullptr) {
        key.action_hash = kOtherHash;
        entry = static_cast<Entry*>(hash_search(entries, &key, HASH_ENTER_NULL, &found));
        if (entry != nullptr && !found) init_entry(entry, "(other)", 7);
        if (entry == nullptr) entry = &shared->other;
    }
    LWLockRelease(shared->lock);
    return entry;
}

// The action of the last call and its entry: a service calls begin() and
// complete() of one action in a row, so most calls stop at this memcmp.
char last_action[kShownAction];
int last_length = -1;
Entry* last_entry = nullptr;

void remember(const char* name, int length, Entry* entry) {
    if (length >= kShownAction) return;
    memcpy(last_action, name, length);
    last_length = length;
    last_entry = entry;
}

// The entry that counts `action` in this database, found once per backend.
Entry* entry_for(text* action) {
    const char* name = action == nullptr ? "(unknown)" : VARDATA_ANY(action);
    const int length = action == nullptr ? 9 : static_cast<int>(VARSIZE_ANY_EXHDR(action));
    if (length == last_length && memcmp(name, last_action, length) == 0) return last_entry;
    uint64 hash = hash_bytes_extended(reinterpret_cast<const unsigned char*>(name), length,
                                      0x636f756e74657273);
    if (hash == kOtherHash) hash = 1;
    if (local == nullptr) {
        HASHCTL info;
        memset(&info, 0, sizeof info);
        info.keysize = sizeof(uint64);
        info.entrysize = sizeof(LocalEntry);
        info.hcxt = TopMemoryContext;
        local = hash_create("idempotency counters of this backend", 64, &info,
                            HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
    }
    bool found;
    auto* cached = static_cast<LocalEntry*>(hash_search(local, &hash, HASH_FIND, nullptr));
    if (cached != nullptr) {
        remember(name, length, cached->entry);
        return cached->entry;
    }
    Entry* entry = shared_entry(hash, name, length);
    cached = static_cast<LocalEntry*>(hash_search(local, &hash, HASH_ENTER, &found));
    cached->entry = entry;
    remember(name, length, entry);
    return entry;
}

void add(Entry* entry, Counter counter, int64 n) {
    pg_atomic_fetch_add_u64(&entry->counts[static_cast<int>(counter)], n);
}

void add_wait(Entry* entry, const KeyLock& lock) {
    if (!lock.waited) return;
    const uint64 us = static_cast<uint64>(Max(lock.waited_us, 0));
    int bucket = 0;
    while (bucket < kBuckets - 1 && us > kBucketBoundsUs[bucket]) ++bucket;
    pg_atomic_fetch_add_u64(&entry->buckets[bucket], 1);
    pg_atomic_fetch_add_u64(&entry->wait_sum_us, us);
    uint64 max = pg_atomic_read_u64(&entry->wait_max_us);
    while (us > max && !pg_atomic_compare_exchange_u64(&entry->wait_max_us, &max, us)) {
    }
}

Counter outcome_counter(Caller caller, Outcome outcome) {
    const int base = static_cast<int>(caller == Caller::begin ? Counter::begin_started
                                                              : Counter::acquire_started);
    switch (outcome) {
        case Outcome::started: return static_cast<Counter>(base + 0);
        case Outcome::replay: return static_cast<Counter>(base + 1);
        case Outcome::secret_replay: return static_cast<Counter>(base + 2);
        case Outcome::mismatch: return static_cast<Counter>(base + 3);
        case Outcome::in_progress: return static_cast<Counter>(base + 4);
    }
    pg_unreachable();
}

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

// Columns of idempotency.stats_counters() after the counters.
enum StatsColumn {
    sDatabase,
    sAction,
    sFirstCounter,
    sWaits = sFirstCounter + kCounters,
    sWaitSum,
    sWaitMax,
    sWaitLe,
    sWaitBuckets,
    sReset,
    sColumns
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
    values[sAction] = CStringGetTextDatum(entry->action);
    for (int i = 0; i < kCounters; ++i)
        values[sFirstCounter + i] =
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
    tuplestore_putvalues(store, desc, values, nulls);
}

}  // namespace

void counters_init() {
    previous_request_hook = shmem_request_hook;
    shmem_request_hook = request_shmem;
    previous_startup_hook = shmem_startup_hook;
    shmem_startup_hook = startup_shmem;
}

void count_event(Counter counter, text* action, int64 n) {
    if (!counters_on() || n == 0) return;
    add(entry_for(action), counter, n);
}

void count_outcome(Caller caller, text* action, Outcome outcome, const KeyLock& lock,
                   const KeyRow* row) {
    if (!counters_on()) return;
    Entry* entry = entry_for(action);
    add(entry, outcome_counter(caller, outcome), 1);
    if (outcome == Outcome::started && row != nullptr && row->found && !row->completed)
        add(entry, Counter::takeovers, 1);
    add_wait(entry, lock);
}

void count_wait(text* action, const KeyLock& lock) {
    if (!counters_on() || !lock.waited) return;
    add_wait(entry_for(action), lock);
}

bool count_save_final(text* action, bool stored) {
    count_event(stored ? Counter::save_final_stored : Counter::save_final_refused, action);
    return stored;
}

bool count_fenced(Counter done, bool held, text* action, text* principal, text* key) {
    if (!counters_on()) return held;
    if (held) {
        count_event(done, action);
    } else {
        // Only the refusal looks the key up, for its action.
        const KeyRow row = lookup_key(principal, key, InvalidSnapshot);
        count_event(Counter::stale_fence, row.found ? DatumGetTextPP(row.action) : nullptr);
    }
    return held;
}

}  // namespace idem::pg

using namespace idem::pg;

/// idempotency.stats_counters() -> SETOF record: the counters of every
/// (database, action) since the last reset; none, with a WARNING, when the
/// library was not preloaded.
IDEM_SQL_FUNCTION(idempotency_stats_counters) {
    compat::InitMaterializedSRF(fcinfo, 0);
    if (!counters_on()) {
        warn_off();
        return static_cast<Datum>(0);
    }
    auto* result = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    const TimestampTz reset_at = static_cast<TimestampTz>(pg_atomic_read_u64(&shared->reset_at));
    // The database names are read with the lock released (catalog access may wait).
    int count = 0;
    Entry** found = static_cast<Entry**>(palloc(sizeof(Entry*) * (capacity() + 1)));
    LWLockAcquire(shared->lock, LW_SHARED);
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, entries);
    for (Entry* entry; (entry = static_cast<Entry*>(hash_seq_search(&scan))) != nullptr;)
        found[count++] = entry;
    LWLockRelease(shared->lock);
    found[count++] = &shared->other;
    // The server-wide '(other)' row is always there, so that stats_reset shows
    // even before the first call (after a start, a crash or a reset).
    for (int i = 0; i < count; ++i) put_row(result->setResult, result->setDesc, found[i], reset_at);
    return static_cast<Datum>(0);
}

/// idempotency.stats_reset() -> timestamptz: zeroes every counter of every
/// database and returns the time of the reset (NULL, with a WARNING, when the
/// counters are off).
IDEM_SQL_FUNCTION(idempotency_stats_reset) {
    if (!counters_on()) {
        warn_off();
        PG_RETURN_NULL();
    }
    LWLockAcquire(shared->lock, LW_SHARED);
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, entries);
    for (Entry* entry; (entry = static_cast<Entry*>(hash_seq_search(&scan))) != nullptr;)
        reset_entry(entry);
    reset_entry(&shared->other);
    const TimestampTz now = GetCurrentTimestamp();
    pg_atomic_write_u64(&shared->reset_at, static_cast<uint64>(now));
    LWLockRelease(shared->lock);
    PG_RETURN_TIMESTAMPTZ(now);
}

/// idempotency.count_cleanup(action, deleted) -> boolean: counts rows that
/// idempotency.cleanup_batch() deleted (true; called by it only).
IDEM_SQL_FUNCTION(idempotency_count_cleanup) {
    count_event(Counter::cleanup_deleted, PG_GETARG_TEXT_PP(0), PG_GETARG_INT64(1));
    PG_RETURN_BOOL(true);
}
