// Where Citus keeps the key table's rows (placement.cpp): the placement of
// idempotency.keys, the check before a key lock that this node holds a
// principal's shard, and the local shard relation the direct back-end may use
// once that check locked the shard. Without Citus none of it runs a statement.
// Part of the store layer: key_lock.cpp asks require_local_shard, key_table.cpp
// asks citus_placement once per session, key_store.cpp asks locked_local_shard.
#pragma once

extern "C" {
#include "postgres.h"
}

namespace idem::pg {

struct KeyTable;  // key_table.hpp

/// Where the key table's rows live, by Citus's metadata (pg_dist_partition).
enum class Placement {
    local,         // a plain table of this database (no Citus, or not distributed)
    by_principal,  // hash-distributed by principal: the distributed mode
    unsupported,   // distributed otherwise (reference table, another column)
};

/// Where Citus keeps the rows of `table` (its metadata read as `owner`).
Placement citus_placement(Oid table, Oid owner);

/// Raises 0A000 unless this node holds the shard of `principal` (Citus only;
/// a no-op for a local table): the key lock is a lock of this node, so two
/// calls for one key must run on the same node to exclude each other. Takes
/// Citus's shard metadata lock on the shard in share mode first, to the end of
/// the transaction, so that the shard cannot move away while the transaction
/// uses it; once per principal and transaction.
void require_local_shard(text* principal);

/// Under Citus (the key table distributed by principal), whether the shard of
/// `principal` is placed on another node than this one: read without taking
/// Citus's lock, for an error's detail only. False without Citus, for a table
/// not distributed by principal, or when the shard is here.
bool shard_elsewhere(text* principal);

/// Under Citus, the local shard relation that holds the rows of `principal`,
/// when a locking call of this transaction found its shard placed on this node
/// after taking Citus's shard metadata lock on it (require_local_shard; the
/// lock, held to the end of the transaction, keeps a move or split from
/// switching the shard away meanwhile). `shard` comes in as a copy of
/// key_table(); on true its table and index are the shard's relation and
/// primary key, which the direct back-end may read and write as Citus's own
/// local executor would. False, `shard` unchanged: no such check in this
/// transaction (or it was in a savepoint rolled back since), a Citus without
/// lock_shard_metadata, citus.enable_local_execution off, or a shard relation
/// without the key table's columns in its order and its primary key.
bool locked_local_shard(text* principal, KeyTable* shard);

/// Registers placement.cpp's cache and transaction callbacks (from key_table_init()).
void placement_init();

}  // namespace idem::pg
