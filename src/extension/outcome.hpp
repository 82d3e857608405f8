// From a key row to what begin() and acquire() answer: the outcome, the
// idempotency.key_outcome row that carries it, and what the counters are told
// of it (counters.hpp takes plain values: an event, an action, a wait).
#pragma once

#include "counters.hpp"
#include "key_lock.hpp"
#include "key_row.hpp"

extern "C" {
#include "postgres.h"

#include "fmgr.h"
}

namespace idem::pg {

/// What a new attempt under a key gets.
enum class Outcome { started, replay, mismatch, in_progress, secret_replay, expired };

/// The outcome for a request with `fingerprint`, given the key's row: started
/// (no live row, or an in_progress row of the same request whose lease ran
/// out), mismatch (a live row of another request), replay, secret_replay,
/// in_progress (a live lease), or expired (a tombstone, or a dead row that
/// its action's expiry policy refuses, of the same request).
Outcome outcome_for(const KeyRow& row, bytea* fingerprint);

/// Under REPEATABLE READ / SERIALIZABLE the transaction snapshot may predate a
/// row that committed while we waited (or just before we looked): when the
/// latest state holds a row other than `seen` (what the snapshot found), raises
/// 40001 instead of starting - a second effect after a winner, or a complete()
/// that would collide with a row it cannot see - and counts it under the
/// request's action.
void require_snapshot_sees_winner(const Request& request, const KeyRow& seen);

/// The number of columns of idempotency.key_outcome (outcome to lease_until).
constexpr int kOutcomeColumns = 9;

/// Fills the kOutcomeColumns columns of idempotency.key_outcome into `values`
/// and `nulls`, as outcome_result shows them (idempotency.batch_outcome has
/// the same columns after ord and key).
void outcome_columns(Outcome outcome, const KeyRow* row, Datum* values, bool* nulls);

/// The idempotency.key_outcome row: the outcome and what of `row` it shows
/// (started: the row about to be written; replay: the stored response;
/// mismatch: the resource id; in_progress: the lease). `row` may be nullptr
/// (in_progress after a wait that ran out).
Datum outcome_result(FunctionCallInfo fcinfo, Outcome outcome, const KeyRow* row);

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
