// From a key row to what begin() and acquire() answer: the outcome, and the
// idempotency.key_outcome row that carries it.
#pragma once

#include "key_row.hpp"

extern "C" {
#include "postgres.h"

#include "fmgr.h"
}

namespace idem::pg {

/// What a new attempt under a key gets.
enum class Outcome { started, replay, mismatch, in_progress, secret_replay };

/// The outcome for a request with `fingerprint`, given the key's row: started
/// (no live row, or an in_progress row of the same request whose lease ran
/// out), mismatch (a live row of another request), replay, secret_replay, or
/// in_progress (a live lease).
Outcome outcome_for(const KeyRow& row, bytea* fingerprint);

/// Under REPEATABLE READ / SERIALIZABLE the transaction snapshot may predate a
/// row that committed while we waited (or just before we looked): when the
/// latest state holds a row other than `seen` (what the snapshot found), raises
/// 40001 instead of starting - a second effect after a winner, or a complete()
/// that would collide with a row it cannot see - and counts it under the
/// request's action.
void require_snapshot_sees_winner(const Request& request, const KeyRow& seen);

/// The idempotency.key_outcome row: the outcome and what of `row` it shows
/// (started: the row about to be written; replay: the stored response;
/// mismatch: the resource id; in_progress: the lease). `row` may be nullptr
/// (in_progress after a wait that ran out).
Datum outcome_result(FunctionCallInfo fcinfo, Outcome outcome, const KeyRow* row);

}  // namespace idem::pg
