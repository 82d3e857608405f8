// What the rooms of the key store share about idempotency.keys: its OIDs and
// owner (looked up once per session), where Citus keeps its rows, its columns
// by attribute number, a key row from a tuple, and SQL run with the owner's
// rights. Internal to the store layer: callers use key_store.hpp.
#pragma once

#include "key_row.hpp"

extern "C" {
#include "postgres.h"

#include "access/htup.h"
#include "access/tupdesc.h"
#include "executor/spi.h"
}

namespace idem::pg {

/// Where the key table's rows live, by Citus's metadata (pg_dist_partition).
enum class Placement {
    local,         // a plain table of this database (no Citus, or not distributed)
    by_principal,  // hash-distributed by principal: the distributed mode
    unsupported,   // distributed otherwise (reference table, another column)
};

/// The OIDs of the key table, its primary key, the fence sequence, and the
/// table's owner, and where its rows live, looked up once per session (and
/// again after the table's relation cache entry is invalidated).
struct KeyTable {
    Oid table;
    Oid index;
    Oid fences;
    Oid owner;
    Placement placement;
};

/// The key table's OIDs (a copy: opening a relation accepts invalidation
/// messages, and the cache may be cleared in between).
KeyTable key_table();

/// Registers the relation cache callback that forgets the table's OIDs.
void key_table_init();

/// Attribute numbers of idempotency.keys: the table's own columns come first,
/// in this order.
enum KeysColumn {
    aPrincipal = 1,
    aKey,
    aAction,
    aSha,
    aState,
    aStatus,
    aHeaders,
    aBody,
    aResourceId,
    aSecret,
    aFence,
    aLeaseUntil,
    aCreated,
    aExpires,
    aColumns = aExpires
};

/// A key row from a tuple whose columns are the table's own, in its order
/// (a heap tuple of the table, or the row of the lookup statement).
KeyRow row_from_tuple(HeapTuple tuple, TupleDesc desc);

/// Where Citus keeps the rows of `table` (its metadata read as `owner`), in placement.cpp.
Placement citus_placement(Oid table, Oid owner);

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

/// The caller's user id and security context, saved while SQL runs as the
/// key table's owner.
struct SavedUser {
    Oid user;
    int context;
};

/// Switches to `owner` (the key table's) and connects to SPI. An error before
/// spi_finish_as() is fine: aborting the (sub)transaction restores the user id.
SavedUser spi_connect_as(Oid owner);

/// Disconnects from SPI and switches back to the caller.
void spi_finish_as(const SavedUser& saved);

/// A plan prepared in the current SPI connection and kept for the session.
SPIPlanPtr keep_plan(const char* sql, int nargs, Oid* types);

}  // namespace idem::pg
