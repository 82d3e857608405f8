// The key lock: a transaction-level lock per (principal, key) in a lock class
// of the extension's own. Every writer of new key rows holds it, so that
// duplicates of one request queue behind each other instead of racing.
#pragma once

extern "C" {
#include "postgres.h"

#include "storage/lock.h"
}

namespace idem::pg {

/// Who holds a key lock that was taken: nobody (the wait ran out), the
/// statement's resource owner (no wait), or the transaction's (after a wait).
enum class LockHolder { none, statement, transaction };

/// A key lock and who holds it.
struct KeyLock {
    LOCKTAG tag;
    LockHolder holder;
    bool waited =
        false;  ///< the lock was held by another transaction: we waited (or gave up at once)
    int64 waited_us = 0;  ///< how long, in microseconds
};

/// Takes the lock of (principal, key), waiting up to wait_ms for a
/// transaction that holds it. Running out of time is not an error: holder is
/// none and the caller's transaction stays usable. Deadlocks, cancels and
/// statement timeouts stay errors.
KeyLock lock_key(text* principal, text* key, int wait_ms);

/// Releases a key lock before the end of the transaction (nothing to do under
/// the key: waiting duplicates may go on).
void unlock_key(const KeyLock& lock);

}  // namespace idem::pg
