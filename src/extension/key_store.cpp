// The key store's facade: each call picks its back-end once, here, and hands
// the key table's OIDs to it. The direct back-end serves the lookup and the
// insert of a new completed key on a plain local table, and under Citus on the
// principal's local shard once a locking call of the transaction has locked
// it there; the statement back-end serves every other write, and everything
// else in the distributed mode.
// A back-end never calls the other, nor this file.
#include "key_store.hpp"
#include "key_direct.hpp"
#include "key_statements.hpp"
#include "key_table.hpp"
#include "schema_version.hpp"
#include "settings.hpp"

extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "commands/sequence.h"
#include "utils/timestamp.h"
}

namespace idem::pg {

namespace {

enum class Backend { direct, statements };

// The microseconds from 1970-01-01 to 2000-01-01 (PostgreSQL's epoch): fences
// count from 1970, so that to_timestamp(fence / 1e6) reads as the time of the draw.
constexpr int64 kUnixEpochInPostgresUs =
    int64{POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE} * SECS_PER_DAY * USECS_PER_SEC;

// The back-end of a lookup or of the insert of a new key for `principal`, and
// the relation it uses in *use: statements with idempotency.distributed = on;
// the direct one on a plain local table; under Citus (the table distributed by
// principal) the direct one on the principal's local shard relation when a
// locking call of this transaction checked and locked it there
// (locked_local_shard), statements otherwise. Raises 0A000 when Citus
// distributes the table in a way the protocol cannot use.
Backend backend_for(const KeyTable& table, text* principal, KeyTable* use) {
    if (unlikely(table.placement == Placement::unsupported))
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("idempotency.keys is distributed by Citus, but not by principal"),
                 errdetail("A key lock is a lock of one node: all calls for a principal must "
                           "run on the node that holds its rows."),
                 errhint("Undistribute the table (undistribute_table) and run "
                         "idempotency.distribute(), which distributes it by principal.")));
    *use = table;
    if (distributed == kDistributedOn) return Backend::statements;
    if (table.placement == Placement::local) return Backend::direct;
    return locked_local_shard(principal, use) ? Backend::direct : Backend::statements;
}

}  // namespace

KeyRow lookup_key(text* principal, text* key, Snapshot snapshot) {
    const KeyTable table = key_table();
    KeyTable use;
    if (backend_for(table, principal, &use) == Backend::statements)
        return statements::select_key(table, principal, key, snapshot);
    return direct::scan_key(use, principal, key, snapshot);
}

// From 0.8.0 a fence is this node's clock in microseconds since 1970, or the
// key's row's fence + 1 when that is higher, so that a key's fences grow on
// whichever node its rows are: a row moves with its shard and carries its
// fence; a row that is gone was deleted (cleanup, forget) after its fence was
// drawn, so the clock has moved on since - on this node because its clock does
// not step back, on another as long as the nodes' clocks agree to within the
// time the key stayed away (docs/scale-out.md, "Fences across moves", has the
// argument). A crash or a dump and restore does not take the clock back. A
// 0.6.0 or 0.7.0 schema keeps drawing from idempotency.fences as those
// releases did: a node still on the old library would draw far below the clock.
int64 next_fence(const KeyRow& current) {
    if (!schema_at_least("0.8.0")) return nextval_internal(key_table().fences, false);
    const int64 clock = GetCurrentTimestamp() + kUnixEpochInPostgresUs;
    if (!current.found || current.fence < clock) return clock;
    if (unlikely(current.fence == PG_INT64_MAX))
        ereport(ERROR, (errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
                        errmsg("the key's fence is the largest bigint: no higher fence is left"),
                        errhint("Forget the key (idempotency.forget), or wait until it expires and "
                                "cleanup deletes it.")));
    return current.fence + 1;
}

// A new key (known_absent) is inserted directly when the direct back-end can
// (a plain local table or a locked local shard, no trigger, row security or
// added column); anything
// else, and a row that replaces another, is a statement.
bool store_completed(const Request& request, const StoredResponse& response, const Interval* ttl,
                     int64 fence, bool known_absent) {
    const KeyTable table = key_table();
    KeyTable use;
    if (known_absent && backend_for(table, request.principal, &use) == Backend::direct &&
        direct::insert_completed(use, request, response, ttl, fence))
        return true;
    return statements::store_completed(table, request, response, ttl, fence, known_absent);
}

// The writes below have an ON CONFLICT or a WHERE on the row's state: they are
// statements whatever the placement (the executor evaluates them).

KeyRow take_lease(const Request& request, const Interval* lease, const Interval* ttl, int64 fence) {
    return statements::take_lease(key_table(), request, lease, ttl, fence);
}

bool renew_lease(Datum principal, Datum key, Datum fence, const Interval* lease, text** action) {
    return statements::renew_lease(key_table(), principal, key, fence, lease, action);
}

bool complete_lease(Datum principal, Datum key, Datum fence, const StoredResponse& response,
                    text** action) {
    return statements::complete_lease(key_table(), principal, key, fence, response, action);
}

bool release_lease(Datum principal, Datum key, Datum fence, text** action) {
    return statements::release_lease(key_table(), principal, key, fence, action);
}

// A live row keeps the key (the statement checks that again); so does an
// expired row that its action's policy refuses, which only a lookup can tell.
bool insert_claim(text* principal, text* key, const Interval* ttl, int64 fence) {
    const KeyRow row = lookup_key(principal, key, InvalidSnapshot);
    if (row.found && (row.live() || expiry_refuses(row))) return false;
    return statements::insert_claim(key_table(), principal, key, ttl, fence);
}

bool forget_key(text* principal, text* key) {
    return statements::forget_key(key_table(), principal, key);
}

// A live row refuses only as a tombstone; a dead one as expiry_refuses_takeover says.
bool expiry_refuses(const KeyRow& row) {
    if (!row.found) return false;
    return row.live() ? row.tombstone : expiry_refuses_takeover(row);
}

// What cannot change while the caller waits to write decides: a lease that
// holds an expired row now may run out, or be released, before the caller's
// upsert runs (renew, complete and release take no key lock), and the upsert's
// WHERE checks liveness only. A tombstone refuses until its end; any other row
// whose ttl ran out asks its action's policy. The policies are read by a
// statement whatever the placement: under Citus they are a reference table,
// read on the node of the principal's shard.
bool expiry_refuses_takeover(const KeyRow& row) {
    if (!row.found) return false;
    if (row.tombstone) return row.live();
    if (row.expires_at > GetCurrentTransactionStartTimestamp()) return false;
    return statements::expiry_refused(key_table(), row.action, row.expires_at);
}

void key_store_init() { key_table_init(); }

}  // namespace idem::pg
