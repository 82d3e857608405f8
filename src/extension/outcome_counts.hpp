// What the counters of idempotency.stats are told of an outcome and of the
// calls around it: the protocol's words (an outcome, a caller, a key lock)
// turned into counters.hpp's plain values (a counter, an action, a wait).
#pragma once

#include "counters.hpp"
#include "key_lock.hpp"
#include "key_row.hpp"
#include "outcome.hpp"

extern "C" {
#include "postgres.h"
}

namespace idem::pg {

/// Which function asked, for the outcome counters.
enum class Caller { begin, acquire };

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
/// a stale-fence refusal when not, under the key's current action (looked up
/// here, in the protocol, only for a refusal with counters on). Returns `held`.
bool count_fenced(Counter done, bool held, text* action, text* principal, text* key);

}  // namespace idem::pg
