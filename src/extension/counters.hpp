// Server-side counters: what every call of the protocol did, per database and
// per action, in shared memory (counters.cpp). The entry points call one of
// the count_* functions below, one line per event; each is a no-op unless the
// library was loaded by shared_preload_libraries (counters_on()).
#pragma once

#include "key_lock.hpp"
#include "key_row.hpp"
#include "outcome.hpp"

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
    count
};

/// Which function asked, for the outcome counters.
enum class Caller { begin, acquire };

/// The shared area is there (the library was preloaded).
extern bool counters_attached;

/// Whether counting is on in this server.
inline bool counters_on() { return counters_attached; }

/// Requests the shared memory and installs the hooks (from _PG_init, only
/// while shared_preload_libraries is processed).
void counters_init();

/// Counts `n` events `counter` under `action` (nullptr: '(unknown)').
void count_event(Counter counter, text* action, int64 n = 1);

/// Counts the outcome of begin() or acquire(), a takeover when the start
/// replaced an in_progress row (`row` may be nullptr), and the wait for the
/// key lock when there was one.
void count_outcome(Caller caller, text* action, Outcome outcome, const KeyLock& lock,
                   const KeyRow* row);

/// Counts the wait for the key lock, when there was one.
void count_wait(text* action, const KeyLock& lock);

/// Counts save_final()'s answer; returns `stored`.
bool count_save_final(text* action, bool stored);

/// Counts a call with a fence: `done` under `action` when it held the key,
/// a stale-fence refusal (under the key's current action, looked up) when
/// not. Returns `held`.
bool count_fenced(Counter done, bool held, text* action, text* principal, text* key);

}  // namespace idem::pg
