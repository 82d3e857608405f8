// The statement back-end of the key store: every read and write of
// idempotency.keys as a SQL statement, prepared once per session and run with
// the table owner's rights. It serves every write but the direct insert, and
// in the distributed mode the lookup too (the engine routes each statement to
// the shard of its principal). Internal to the store: only key_store.cpp calls it.
#pragma once

#include "key_row.hpp"
#include "key_table.hpp"

extern "C" {
#include "postgres.h"

#include "datatype/timestamp.h"
#include "utils/snapshot.h"
}

namespace idem::pg::statements {

/// The key row of (principal, key) by a SELECT statement, with lookup_key()'s snapshot rules.
KeyRow select_key(const KeyTable& table, text* principal, text* key, Snapshot snapshot);

/// Stores a completed key with `fence`: an INSERT when `known_absent`, else an
/// upsert that replaces only a replaceable row. False when nothing was written.
bool store_completed(const KeyTable& table, const Request& request, const StoredResponse& response,
                     const Interval* ttl, int64 fence, bool known_absent);

/// The in_progress row of a lease (new, or a takeover); found = false when nothing was written.
KeyRow take_lease(const KeyTable& table, const Request& request, const Interval* lease,
                  const Interval* ttl, int64 fence);

/// Extends the lease of `fence` while the row is live; `action` gets the row's action.
bool renew_lease(const KeyTable& table, Datum principal, Datum key, Datum fence,
                 const Interval* lease, text** action);

/// Stores the response of the lease `fence`; `action` gets the row's action.
bool complete_lease(const KeyTable& table, Datum principal, Datum key, Datum fence,
                    const StoredResponse& response, text** action);

/// Ends the live lease of `fence`; `action` gets the row's action.
bool release_lease(const KeyTable& table, Datum principal, Datum key, Datum fence, text** action);

/// Writes a claim marker unless a live row exists.
bool insert_claim(const KeyTable& table, text* principal, text* key, const Interval* ttl,
                  int64 fence);

/// Deletes one key.
bool forget_key(const KeyTable& table, text* principal, text* key);

/// Whether idempotency.expiry_policies refuses a key of `action` that expired
/// at `expired_at`: a refuse policy whose grace has not run out by now().
/// False on a schema without the table (0.7.0).
bool expiry_refused(const KeyTable& table, Datum action, TimestampTz expired_at);

}  // namespace idem::pg::statements
