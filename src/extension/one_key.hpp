// The protocol for one key once its arguments are checked: the steps of
// begin(), complete() and claim() that the single-key entry points and the
// batches (batch.cpp) share, so that a key in a batch gets exactly the
// outcome the single call would give it.
#pragma once

#include "key_row.hpp"
#include "pending.hpp"

extern "C" {
#include "postgres.h"

#include "datatype/timestamp.h"
}

namespace idem::pg {

enum class Outcome;

/// 55000 when the key was begun in this transaction and not yet completed
/// (begin() again must wait for complete()).
void refuse_if_open(text* principal, text* key);

/// begin() for one key: takes the key lock (waiting up to wait_ms for a
/// transaction that holds it), looks the key up and decides the outcome; for
/// a start, draws the fence and remembers the key for complete(). `shown`
/// gets the row the outcome shows (found = false after a wait that ran out).
/// A replay, mismatch or in_progress releases the key lock at once.
Outcome begin_key(const Request& request, const Interval& ttl, int wait_ms, KeyRow* shown);

/// 55000 unless `entry` (the key of `principal` as find_pending found it, maybe
/// nullptr) was begun and not yet completed in this transaction (under Citus,
/// with a detail when this node does not hold the principal's shard: the call
/// was not delegated); 22023 when `status` is not final. complete()'s checks,
/// before anything is stored.
void require_completable(const PendingKey* entry, text* principal, int status);

/// Stores the response of a key begun in this transaction (checked with
/// require_completable) and marks it completed; 40001 when another
/// transaction took the key.
void complete_key(PendingKey* entry, const StoredResponse& response);

/// claim() for one key: the key lock (waiting up to wait_ms), then a claim
/// marker unless a live row holds the key. True when this call claimed it.
bool claim_key(text* principal, text* key, const Interval& ttl, int wait_ms);

}  // namespace idem::pg
