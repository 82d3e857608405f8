// The key table itself, for both back-ends of the key store: its OIDs and
// owner cached per session (forgotten when its relation cache entry is
// invalidated), a key row read by the table's own attribute numbers, and the
// switch to the owner's rights around SQL that the store runs.
#include "key_table.hpp"

extern "C" {
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
}

namespace idem::pg {

namespace {

const KeyTable kUnknown{InvalidOid, InvalidOid, InvalidOid, InvalidOid, Placement::local};
KeyTable cached = kUnknown;

// Citus invalidates a table's relation cache entry when it distributes or
// undistributes it, so the placement is read again then too.
void forget_key_relations(Datum arg, Oid relid) {
    if (relid == InvalidOid || relid == cached.table || relid == cached.index ||
        relid == cached.fences)
        cached = kUnknown;
}

}  // namespace

KeyTable key_table() {
    if (!OidIsValid(cached.table) || !OidIsValid(cached.index) || !OidIsValid(cached.fences)) {
        Oid schema = get_namespace_oid("idempotency", false);
        KeyTable found{get_relname_relid("keys", schema), get_relname_relid("keys_pkey", schema),
                       get_relname_relid("fences", schema), InvalidOid, Placement::local};
        if (!OidIsValid(found.table) || !OidIsValid(found.index))
            ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE),
                            errmsg("idempotency.keys or its primary key is missing")));
        if (!OidIsValid(found.fences))
            ereport(
                ERROR,
                (errcode(ERRCODE_UNDEFINED_TABLE), errmsg("idempotency.fences is missing"),
                 errhint("The installed library is newer than the extension's objects: run ALTER "
                         "EXTENSION idempotency UPDATE.")));
        Relation table = table_open(found.table, AccessShareLock);
        found.owner = table->rd_rel->relowner;
        table_close(table, AccessShareLock);
        found.placement = citus_placement(found.table, found.owner);
        cached = found;
    }
    return cached;
}

void key_table_init() {
    CacheRegisterRelcacheCallback(forget_key_relations, (Datum)0);
    placement_init();
}

// The key row from a copied tuple with the table's own columns, by attribute number.
KeyRow row_from_tuple(HeapTuple tuple, TupleDesc desc) {
    KeyRow row;
    bool isnull;
    auto column = [&](KeysColumn number) { return heap_getattr(tuple, number, desc, &isnull); };
    row.found = true;
    text* state = DatumGetTextPP(column(aState));
    row.completed =
        VARSIZE_ANY_EXHDR(state) == 9 && memcmp(VARDATA_ANY(state), "completed", 9) == 0;
    row.tombstone = VARSIZE_ANY_EXHDR(state) == 7 && memcmp(VARDATA_ANY(state), "expired", 7) == 0;
    row.request_sha256 = DatumGetByteaPP(column(aSha));
    row.action = column(aAction);
    const Datum status = column(aStatus);
    row.has_status = !isnull;
    row.status = isnull ? 0 : DatumGetInt16(status);
    row.headers = column(aHeaders);
    row.headers_null = isnull;
    row.body = column(aBody);
    row.body_null = isnull;
    row.resource_id = column(aResourceId);
    row.resource_id_null = isnull;
    const Datum secret = column(aSecret);
    row.one_time_secret = !isnull && DatumGetBool(secret);
    row.fence = DatumGetInt64(column(aFence));
    const Datum lease_until = column(aLeaseUntil);
    row.has_lease = !isnull;
    row.lease_until = isnull ? 0 : DatumGetTimestampTz(lease_until);
    row.created_at = DatumGetTimestampTz(column(aCreated));
    row.expires_at = DatumGetTimestampTz(column(aExpires));
    row.has_times = true;
    return row;
}

SavedUser spi_connect_as(Oid owner) {
    SavedUser saved;
    GetUserIdAndSecContext(&saved.user, &saved.context);
    SetUserIdAndSecContext(owner, saved.context | SECURITY_LOCAL_USERID_CHANGE);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    return saved;
}

void spi_finish_as(const SavedUser& saved) {
    SPI_finish();
    SetUserIdAndSecContext(saved.user, saved.context);
}

SPIPlanPtr keep_plan(const char* sql, int nargs, Oid* types) {
    SPIPlanPtr plan = SPI_prepare(sql, nargs, types);
    if (plan == nullptr) elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
    if (SPI_keepplan(plan) != 0) elog(ERROR, "SPI_keepplan failed");
    return plan;
}

}  // namespace idem::pg
