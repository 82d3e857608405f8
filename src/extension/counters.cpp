// Server-side counters in shared memory: one entry per (database, action),
// each a row of atomic counters and a fixed log-scale histogram of the waits
// for a held key. Counting is lock-free: a backend finds an action's entry
// once (under a shared LWLock, or an exclusive one to add it), keeps the
// pointer in a backend-local table, and from then on only adds atomically.
// Entries are never removed (a reset zeroes them), so a kept pointer stays
// valid for the life of the server; after a crash the postmaster recreates
// shared memory and every backend, so the counters start again at zero.
//
// Room is shared fairly: at most idempotency.max_actions actions get an entry
// of their own, and one database names at most its share of them,
// ceil(max_actions / 4), so that no database (or role of it) can take the
// table from the others. A database's further actions are counted under its
// own '(other)' (one per database while room is left, then one for the whole
// server, shown with database NULL, always listed). The SQL functions that
// read and reset the table are in counters_sql.cpp.
#include "counters.hpp"

#include "counters_table.hpp"
#include "settings.hpp"

extern "C" {
#include "postgres.h"

#include "common/hashfn.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
}

#include "compat.hpp"  // VARDATA_ANY & co. (varatt.h since 16)

namespace idem::pg {

bool counters_attached = false;

namespace {

// Entries for '(other)' beyond max_actions: one per database while they last.
constexpr int kOtherEntries = 64;
constexpr uint64 kOtherHash = 0;
// A database names at most ceil(max_actions / kShareDivisor) actions.
constexpr int kShareDivisor = 4;
const char* const kTrancheName = "idempotency counters";

struct Shared {
    LWLock* lock;
    pg_atomic_uint64 reset_at;  // TimestampTz of the last reset (or of the server's start)
    int named;                  // entries of named actions (at most max_actions)
    int others;                 // entries of per-database '(other)' (at most kOtherEntries)
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

int database_share() { return (max_actions + kShareDivisor - 1) / kShareDivisor; }

void reset_entry(Entry* entry) {
    for (auto& count : entry->counts) pg_atomic_write_u64(&count, 0);
    for (auto& bucket : entry->buckets) pg_atomic_write_u64(&bucket, 0);
    pg_atomic_write_u64(&entry->wait_sum_us, 0);
    pg_atomic_write_u64(&entry->wait_max_us, 0);
}

// `length` bytes of `action` are kept, at most kShownAction - 1 of them and
// cut on a character boundary of the database's encoding, so that the name
// reads back as valid text in every client encoding.
void init_entry(Entry* entry, const char* action, int length) {
    length = length < kShownAction ? length : pg_mbcliplen(action, length, kShownAction - 1);
    memcpy(entry->action, action, length);
    entry->action[length] = '\0';
    entry->encoding = GetDatabaseEncoding();
    for (auto& count : entry->counts) pg_atomic_init_u64(&count, 0);
    for (auto& bucket : entry->buckets) pg_atomic_init_u64(&bucket, 0);
    pg_atomic_init_u64(&entry->wait_sum_us, 0);
    pg_atomic_init_u64(&entry->wait_max_us, 0);
}

void request_shmem() {
    if (previous_request_hook != nullptr) previous_request_hook();
    RequestAddinShmemSpace(
        add_size(MAXALIGN(sizeof(Shared)), hash_estimate_size(counters_capacity(), sizeof(Entry))));
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
        shared->others = 0;
        shared->other.key = EntryKey{InvalidOid, 0, kOtherHash};
        init_entry(&shared->other, "(other)", 7);
    }
    HASHCTL info;
    memset(&info, 0, sizeof info);
    info.keysize = sizeof(EntryKey);
    info.entrysize = sizeof(Entry);
    entries = ShmemInitHash("idempotency counters by action", counters_capacity(),
                            counters_capacity(), &info, HASH_ELEM | HASH_BLOBS);
    LWLockRelease(AddinShmemInitLock);
    counters_attached = true;
}

// Named actions of `database` in the table (caller holds the lock). A scan:
// it runs only when a database adds an action, at most once per action and
// backend, never on the path of a counted call.
int named_in_database(Oid database) {
    int named = 0;
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, entries);
    for (Entry* entry; (entry = static_cast<Entry*>(hash_seq_search(&scan))) != nullptr;)
        if (entry->key.database == database && entry->key.action_hash != kOtherHash) ++named;
    return named;
}

// The '(other)' entry of this database, added while room is left, else the
// server's (caller holds the lock exclusively).
Entry* other_entry() {
    EntryKey key{MyDatabaseId, 0, kOtherHash};
    bool found = false;
    auto* entry = static_cast<Entry*>(hash_search(entries, &key, HASH_FIND, nullptr));
    if (entry == nullptr && shared->others < kOtherEntries) {
        entry = static_cast<Entry*>(hash_search(entries, &key, HASH_ENTER_NULL, &found));
        if (entry != nullptr && !found) {
            init_entry(entry, "(other)", 7);
            ++shared->others;
        }
    }
    return entry != nullptr ? entry : &shared->other;
}

// The shared entry of (this database, action): found, added within the
// database's share and the table's room, or the database's '(other)'.
Entry* shared_entry(uint64 hash, const char* action, int length) {
    EntryKey key{MyDatabaseId, 0, hash};
    LWLockAcquire(shared->lock, LW_SHARED);
    auto* entry = static_cast<Entry*>(hash_search(entries, &key, HASH_FIND, nullptr));
    LWLockRelease(shared->lock);
    if (entry != nullptr) return entry;

    LWLockAcquire(shared->lock, LW_EXCLUSIVE);
    entry = static_cast<Entry*>(hash_search(entries, &key, HASH_FIND, nullptr));
    if (entry == nullptr && shared->named < max_actions &&
        named_in_database(MyDatabaseId) < database_share()) {
        bool found = false;
        entry = static_cast<Entry*>(hash_search(entries, &key, HASH_ENTER_NULL, &found));
        if (entry != nullptr && !found) {
            init_entry(entry, action, length);
            ++shared->named;
        }
    }
    if (entry == nullptr) entry = other_entry();
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

void add_wait(Entry* entry, int64 waited_us) {
    const uint64 us = static_cast<uint64>(Max(waited_us, 0));
    int bucket = 0;
    while (bucket < kBuckets - 1 && us > kBucketBoundsUs[bucket]) ++bucket;
    pg_atomic_fetch_add_u64(&entry->buckets[bucket], 1);
    pg_atomic_fetch_add_u64(&entry->wait_sum_us, us);
    uint64 max = pg_atomic_read_u64(&entry->wait_max_us);
    while (us > max && !pg_atomic_compare_exchange_u64(&entry->wait_max_us, &max, us)) {
    }
}

}  // namespace

long counters_capacity() { return static_cast<long>(max_actions) + kOtherEntries; }

int counters_snapshot(Entry** out) {
    int count = 0;
    LWLockAcquire(shared->lock, LW_SHARED);
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, entries);
    for (Entry* entry; (entry = static_cast<Entry*>(hash_seq_search(&scan))) != nullptr;)
        out[count++] = entry;
    LWLockRelease(shared->lock);
    out[count++] = &shared->other;
    return count;
}

TimestampTz counters_reset_at() {
    return static_cast<TimestampTz>(pg_atomic_read_u64(&shared->reset_at));
}

TimestampTz counters_reset() {
    LWLockAcquire(shared->lock, LW_SHARED);
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, entries);
    for (Entry* entry; (entry = static_cast<Entry*>(hash_seq_search(&scan))) != nullptr;)
        reset_entry(entry);
    reset_entry(&shared->other);
    const TimestampTz now = GetCurrentTimestamp();
    pg_atomic_write_u64(&shared->reset_at, static_cast<uint64>(now));
    LWLockRelease(shared->lock);
    return now;
}

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

void count_start(Counter counter, text* action, bool takeover, bool waited, int64 waited_us) {
    if (!counters_on()) return;
    Entry* entry = entry_for(action);
    add(entry, counter, 1);
    if (takeover) add(entry, Counter::takeovers, 1);
    if (waited) add_wait(entry, waited_us);
}

void count_wait(text* action, int64 waited_us) {
    if (!counters_on()) return;
    add_wait(entry_for(action), waited_us);
}

}  // namespace idem::pg
