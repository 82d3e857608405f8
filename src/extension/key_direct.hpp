// The direct back-end of the key store: idempotency.keys through the heap and
// its primary key, without SPI or the executor. It serves the two steps every
// request takes (the lookup, the insert of a new completed key) when the table
// is a plain local one. Internal to the store: only key_store.cpp calls it.
#pragma once

#include "key_row.hpp"
#include "key_table.hpp"

extern "C" {
#include "postgres.h"

#include "datatype/timestamp.h"
#include "utils/snapshot.h"
}

namespace idem::pg::direct {

/// The key row of (principal, key) through the primary key, or found = false,
/// copied into the current memory context. `snapshot`: see lookup_key().
KeyRow scan_key(const KeyTable& table, text* principal, text* key, Snapshot snapshot);

/// Inserts a completed key row (a heap insert and its index entries) when the
/// table is the plain one the extension created: no trigger, no row security,
/// no column someone added. False, having written nothing, otherwise.
bool insert_completed(const KeyTable& table, const Request& request, const StoredResponse& response,
                      const Interval* ttl, int64 fence);

}  // namespace idem::pg::direct
