// Every read and write of idempotency.keys. The hot path (the lookup of
// begin() and acquire(), the insert of a new key by complete()) goes to the
// heap and the primary key directly, in key_store.cpp; the other writes are
// SQL statements, all in key_statements.cpp, run with the owner's rights.
// In the distributed mode (idempotency.distributed = on, or the table is
// distributed by Citus) the hot path is a SQL statement too, which the engine
// routes to the shard that holds the principal.
#pragma once

#include "key_row.hpp"

extern "C" {
#include "postgres.h"

#include "access/htup.h"
#include "access/tupdesc.h"
#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "utils/snapshot.h"
}

namespace idem::pg {

/// The key row of (principal, key) through the primary key, or found = false.
/// `snapshot` InvalidSnapshot means the transaction's rules (a new snapshot
/// per call in READ COMMITTED, so a winner that committed while we waited is
/// seen). The row is copied into the current memory context.
KeyRow lookup_key(text* principal, text* key, Snapshot snapshot);

/// A new fence from idempotency.fences: never handed out twice for a key.
int64 next_fence();

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
/// exists. False when the key is taken.
bool insert_claim(text* principal, text* key, const Interval* ttl, int64 fence);

/// Deletes one key. False when there was none.
bool forget_key(text* principal, text* key);

/// Raises 0A000 unless this node holds the shard of `principal` (Citus only;
/// a no-op for a local table): the key lock is a lock of this node, so two
/// calls for one key must run on the same node to exclude each other.
void require_local_shard(text* principal);

/// Registers the relation cache callback that forgets the table's OIDs (from _PG_init).
void key_store_init();

// Between key_store.cpp, key_statements.cpp and placement.cpp:

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

/// Whether every read and write goes through SQL statements (the distributed
/// mode): idempotency.distributed = on, or Citus distributes the table.
/// Raises 0A000 when Citus distributes it in a way the protocol cannot use.
bool by_statements();

/// Where Citus keeps the rows of `table` (its metadata read as `owner`).
Placement citus_placement(Oid table, Oid owner);

/// The key row of (principal, key) by a SELECT statement: lookup_key() in the
/// distributed mode, with the same snapshot rules.
KeyRow lookup_key_by_statement(text* principal, text* key, Snapshot snapshot);

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

/// A key row from a tuple whose columns are the table's own, in its order
/// (a heap tuple of the table, or the row of the lookup statement).
KeyRow row_from_tuple(HeapTuple tuple, TupleDesc desc);

/// Inserts a completed key row without the SQL executor, when the table is
/// the plain one the extension created. False, having written nothing, otherwise.
bool insert_key_row(const Request& request, const StoredResponse& response, const Interval* ttl,
                    int64 fence);

}  // namespace idem::pg
