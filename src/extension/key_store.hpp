// The key store: every read and write of idempotency.keys, one interface.
// Behind it are two back-ends, chosen once per call in key_store.cpp: the
// direct one (key_direct.cpp: heap and primary key, for the lookup and the
// insert of a new completed key, the two steps every request takes) and the
// statement one (key_statements.cpp: SQL statements run with the owner's
// rights, for every other write, and for everything in the distributed mode:
// idempotency.distributed = on, or Citus distributes the table by principal,
// when the engine routes each statement to the shard of its principal; under
// Citus the lookup and the insert go direct again, on the principal's shard
// relation, once a locking call has locked that shard on this node).
// Callers never know which one ran; the back-ends never call each other.
#pragma once

#include "key_row.hpp"

extern "C" {
#include "postgres.h"

#include "datatype/timestamp.h"
#include "utils/snapshot.h"
}

namespace idem::pg {

/// The key row of (principal, key) through the primary key, or found = false.
/// `snapshot` InvalidSnapshot means the transaction's rules (a new snapshot
/// per call in READ COMMITTED, so a winner that committed while we waited is
/// seen). The row is copied into the current memory context.
KeyRow lookup_key(text* principal, text* key, Snapshot snapshot);

/// A new fence for a key whose row, as this call looked it up under the key
/// lock, is `current` (found or not; KeyRow{} when the call does not look it
/// up: the statement that replaces a row then keeps the fence above the row's).
/// On a 0.8.0 schema: this node's clock in microseconds since 1970, or the
/// row's fence + 1 when higher; never handed out twice for a key, on this node
/// or after the key's rows moved to another (docs/scale-out.md). On an older
/// schema: from idempotency.fences, as 0.7.0 did.
int64 next_fence(const KeyRow& current);

/// Stores a completed key with `fence`. `known_absent`: begin() saw no row, so
/// it is inserted directly; otherwise an upsert replaces only a replaceable
/// row (dead, or an in_progress row of the same request whose lease ran out).
/// Returns false when nothing was written.
bool store_completed(const Request& request, const StoredResponse& response, const Interval* ttl,
                     int64 fence, bool known_absent);

/// Writes the in_progress row of a lease with `fence`: a new row or a takeover
/// of a replaceable row. Returns the written row (fence, lease_until,
/// created_at, expires_at), or found = false when nothing was written.
KeyRow take_lease(const Request& request, const Interval* lease, const Interval* ttl, int64 fence);

/// Extends the lease of `fence` while the row is live. False: not held by it.
/// `action`, when given, gets the row's action when it was held (renew, complete and release
/// alike).
bool renew_lease(Datum principal, Datum key, Datum fence, const Interval* lease,
                 text** action = nullptr);

/// Stores the response of the lease `fence` (any status). False: not held by it.
bool complete_lease(Datum principal, Datum key, Datum fence, const StoredResponse& response,
                    text** action = nullptr);

/// Ends the live lease of `fence`. False: not held by it, or already run out.
bool release_lease(Datum principal, Datum key, Datum fence, text** action = nullptr);

/// Writes a claim marker (status 204, all-zero fingerprint) unless a live row
/// exists or an expired one is refused (expiry_refuses). False when the key is taken.
bool insert_claim(text* principal, text* key, const Interval* ttl, int64 fence);

/// Deletes one key. False when there was none.
bool forget_key(text* principal, text* key);

/// The row stands for a key that expired and is refused (0.8.0,
/// idempotency.set_expiry_policy 'refuse'): a live tombstone, or a dead row of
/// an action whose policy refuses it within its grace (cleanup has not reached
/// it yet; only then are the policies read, so a new key never pays for them).
/// Nothing may start or be written under such a key.
bool expiry_refuses(const KeyRow& row);

/// For a writer that decides on a lookup and writes later (save_final): the
/// row's key expired by its ttl and its action refuses it, whether or not a
/// lease still holds the row (that lease may run out or be released before the
/// write), or the row is a live tombstone. No new request may replace it in
/// this transaction.
bool expiry_refuses_takeover(const KeyRow& row);

/// Registers the relation cache callback that forgets the table's OIDs (from _PG_init).
void key_store_init();

}  // namespace idem::pg
