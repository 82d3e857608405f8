// Server-side counters: what every call of the protocol did, per database and
// per action, in shared memory (counters.cpp; the SQL functions that read and
// reset them are in counters_sql.cpp). A counter is told what happened - an
// event, an action name, how long a call waited - and knows nothing of keys,
// rows or outcomes: outcome_counts.hpp turns the protocol's results into these calls.
// Each function is a no-op unless the library was loaded by
// shared_preload_libraries (counters_on()).
#pragma once

extern "C" {
#include "postgres.h"

#include "fmgr.h"
}

namespace idem::pg {

/// The events counted, one shared counter each per (database, action). The
/// order is the order of the columns of idempotency.stats.
enum class Counter {
    begin_started,
    begin_replay,
    begin_secret_replay,
    begin_mismatch,
    begin_in_progress,
    acquire_started,
    acquire_replay,
    acquire_secret_replay,
    acquire_mismatch,
    acquire_in_progress,
    takeovers,  ///< starts (begin or acquire) that replaced an in_progress row whose lease lapsed
    completed,  ///< complete() without fence: response stored
    lease_completed,         ///< complete(fence => f): true
    save_final_stored,       ///< save_final(): true
    save_final_refused,      ///< save_final(): false
    commit_refused,          ///< COMMIT refused: a key begun and not completed
    serialization_failures,  ///< 40001 raised by the extension
    stale_fence,             ///< complete/renew/release with a fence that no longer holds the key
    renewed,                 ///< renew(): true
    released,                ///< release(): true
    cleanup_deleted,         ///< rows deleted by cleanup
    // 0.8.0: columns after stats_reset (counters_sql.cpp), shown on a 0.8.0 schema
    begin_expired,    ///< begin() answered expired (a refused expired key)
    acquire_expired,  ///< acquire() answered expired
    count
};

/// The first counter that 0.7.0's stats_counters() does not have.
constexpr Counter kFirstCounter080 = Counter::begin_expired;

/// The shared area is there (the library was preloaded).
extern bool counters_attached;

/// Whether counting is on in this server.
inline bool counters_on() { return counters_attached; }

/// Requests the shared memory and installs the hooks (from _PG_init, only
/// while shared_preload_libraries is processed).
void counters_init();

/// Counts `n` events `counter` under `action` (nullptr: '(unknown)').
void count_event(Counter counter, text* action, int64 n = 1);

/// Counts one event `counter` under `action`, a takeover too when `takeover`,
/// and a wait of `waited_us` microseconds when `waited`: one entry lookup for
/// the whole start of a request.
void count_start(Counter counter, text* action, bool takeover, bool waited, int64 waited_us);

/// Counts a wait of `waited_us` microseconds for a key another transaction held.
void count_wait(text* action, int64 waited_us);

}  // namespace idem::pg
