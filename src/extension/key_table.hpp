// What the rooms of the key store share about idempotency.keys: its OIDs and
// owner (looked up once per session) with where Citus keeps its rows
// (placement.hpp), its columns by attribute number, a key row from a tuple,
// and SQL run with the owner's rights. Internal to the store layer: callers
// use key_store.hpp.
#pragma once

#include "key_row.hpp"
#include "placement.hpp"

extern "C" {
#include "postgres.h"

#include "access/htup.h"
#include "access/tupdesc.h"
#include "executor/spi.h"
}

namespace idem::pg {

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
