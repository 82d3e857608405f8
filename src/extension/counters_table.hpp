// Between counters.cpp (the shared-memory table of counters and its locking)
// and counters_sql.cpp (the SQL functions that read and reset it): the layout
// of one entry, and the few operations the readers need.
#pragma once

#include "counters.hpp"

extern "C" {
#include "postgres.h"

#include "port/atomics.h"
#include "utils/timestamp.h"
}

namespace idem::pg {

constexpr int kCounters = static_cast<int>(Counter::count);
// Upper bounds of the wait histogram's buckets, in microseconds (1-2-5 steps
// from 1 ms to 1 min, then everything longer).
constexpr uint64 kBucketBoundsUs[] = {1000,    2000,    5000,     10000,    20000,
                                      50000,   100000,  200000,   500000,   1000000,
                                      2000000, 5000000, 10000000, 30000000, 60000000};
constexpr int kBuckets = sizeof kBucketBoundsUs / sizeof kBucketBoundsUs[0] + 1;  // + infinity
// Bytes kept of an action's name, its terminating NUL included (the entry is
// found by a 64-bit hash of all of it; the name is cut on a character boundary).
constexpr int kShownAction = 256;

struct EntryKey {
    Oid database;  ///< InvalidOid: the server-wide '(other)'
    uint32 unused;
    uint64 action_hash;  ///< 0: the database's '(other)'
};

/// The counters of one (database, action).
struct Entry {
    EntryKey key;
    int encoding;  ///< of `action`: the encoding of the database that named it
    char action[kShownAction];
    pg_atomic_uint64 counts[kCounters];
    pg_atomic_uint64 buckets[kBuckets];
    pg_atomic_uint64 wait_sum_us;
    pg_atomic_uint64 wait_max_us;
};

/// The most entries the table can hold, '(other)' rows included.
long counters_capacity();

/// Fills `out` (room for counters_capacity() + 1) with every entry, the
/// server-wide '(other)' last, under the table's lock; returns how many. The
/// entries stay valid for the life of the server.
int counters_snapshot(Entry** out);

/// When the counters started: the last reset, the server's start or a crash.
TimestampTz counters_reset_at();

/// Zeroes every entry of every database; returns the time of the reset.
TimestampTz counters_reset();

}  // namespace idem::pg
