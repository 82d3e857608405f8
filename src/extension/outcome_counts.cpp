// What the counters are told of an outcome, a wait, save_final() and a fenced
// call (see outcome_counts.hpp).
#include "outcome_counts.hpp"

#include "counters.hpp"
#include "key_store.hpp"

extern "C" {
#include "postgres.h"

#include "utils/builtins.h"
}

namespace idem::pg {

namespace {

// The counter of an outcome: the five of begin, or the five of acquire, in
// the order of Outcome's texts in idempotency.stats; expired (0.8.0) after them.
Counter outcome_counter(Caller caller, Outcome outcome) {
    const int base = static_cast<int>(caller == Caller::begin ? Counter::begin_started
                                                              : Counter::acquire_started);
    switch (outcome) {
        case Outcome::started: return static_cast<Counter>(base + 0);
        case Outcome::replay: return static_cast<Counter>(base + 1);
        case Outcome::secret_replay: return static_cast<Counter>(base + 2);
        case Outcome::mismatch: return static_cast<Counter>(base + 3);
        case Outcome::in_progress: return static_cast<Counter>(base + 4);
        case Outcome::expired:
            return caller == Caller::begin ? Counter::begin_expired : Counter::acquire_expired;
    }
    pg_unreachable();
}

}  // namespace

void count_outcome(Caller caller, text* action, Outcome outcome, const KeyLock& lock,
                   const KeyRow* row) {
    const bool takeover = outcome == Outcome::started && row != nullptr && row->found &&
                          !row->completed && !row->tombstone;
    count_start(outcome_counter(caller, outcome), action, takeover, lock.waited, lock.waited_us);
}

void count_wait(text* action, const KeyLock& lock) {
    if (lock.waited) count_wait(action, lock.waited_us);
}

bool count_save_final(text* action, bool stored) {
    count_event(stored ? Counter::save_final_stored : Counter::save_final_refused, action);
    return stored;
}

bool count_fenced(Counter done, bool held, text* action, text* principal, text* key) {
    if (held) {
        count_event(done, action);
    } else if (counters_on()) {
        const KeyRow row = lookup_key(principal, key, InvalidSnapshot);
        count_event(Counter::stale_fence, row.found ? DatumGetTextPP(row.action) : nullptr);
    }
    return held;
}

}  // namespace idem::pg
