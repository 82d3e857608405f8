// From a key row to what begin() and acquire() answer: the outcome. Its row
// (idempotency.key_outcome) is outcome_row.hpp's, what the counters are told of
// it outcome_counts.hpp's, the re-check of the snapshot snapshot_check.hpp's.
#pragma once

#include "key_row.hpp"

extern "C" {
#include "postgres.h"
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

/// The text of an outcome in idempotency.key_outcome.outcome ("started", ...).
const char* outcome_text(Outcome outcome);

}  // namespace idem::pg
