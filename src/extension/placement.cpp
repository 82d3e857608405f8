// Where Citus keeps the key table's rows: the placement of idempotency.keys
// read from Citus's metadata (once per session, see key_table()), and the
// check that this node holds the shard of a principal before its key lock is
// taken. Both are SQL on Citus's catalogs, run as the table's owner; without
// Citus neither runs a statement.
#include "key_store.hpp"
#include "key_table.hpp"

extern "C" {
#include "postgres.h"

#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/lsyscache.h"
}

namespace idem::pg {

namespace {

// How Citus distributes the key table ($1): no row for a table it does not
// know; 'h' and the column's name for a hash-distributed one.
const char* const kPlacementSql =
    "SELECT p.partmethod::pg_catalog.text,"
    "       CASE WHEN p.partmethod OPERATOR(pg_catalog.=) 'h'"
    "            THEN pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) END"
    "  FROM pg_catalog.pg_dist_partition p"
    " WHERE p.logicalrelid::pg_catalog.oid OPERATOR(pg_catalog.=) $1";

// Whether this node holds a placement of the shard of principal $2 of table $1.
const char* const kLocalShardSql =
    "SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_placement pl, "
    "pg_catalog.pg_dist_local_group g"
    " WHERE pl.groupid OPERATOR(pg_catalog.=) g.groupid"
    "   AND pl.shardid OPERATOR(pg_catalog.=)"
    "       pg_catalog.get_shard_id_for_distribution_column($1::pg_catalog.regclass, $2)";

// The plan of kLocalShardSql, kept for the session.
SPIPlanPtr local_shard_plan = nullptr;

}  // namespace

Placement citus_placement(Oid table, Oid owner) {
    // Without Citus there is no pg_dist_partition, and nothing to ask.
    if (!OidIsValid(get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE)))
        return Placement::local;
    // Not kept: read once per session, and the catalog may come and go with Citus.
    Oid types[1] = {OIDOID};
    const SavedUser saved = spi_connect_as(owner);
    Datum values[1] = {ObjectIdGetDatum(table)};
    const int rc = SPI_execute_with_args(kPlacementSql, 1, types, values, nullptr, true, 1);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "reading pg_dist_partition failed: %s", SPI_result_code_string(rc));
    Placement placement = Placement::local;
    if (SPI_processed == 1) {
        char* method = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
        char* column = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
        const bool hashed = method != nullptr && strcmp(method, "h") == 0;
        placement = hashed && column != nullptr && strcmp(column, "principal") == 0
                        ? Placement::by_principal
                        : Placement::unsupported;
    }
    spi_finish_as(saved);
    return placement;
}

void require_local_shard(text* principal) {
    const KeyTable table = key_table();
    if (table.placement != Placement::by_principal) return;
    Datum values[2] = {ObjectIdGetDatum(table.table), PointerGetDatum(principal)};
    const SavedUser saved = spi_connect_as(table.owner);
    if (local_shard_plan == nullptr) {
        Oid types[2] = {OIDOID, TEXTOID};
        local_shard_plan = keep_plan(kLocalShardSql, 2, types);
    }
    const int rc = SPI_execute_plan(local_shard_plan, values, nullptr, true, 1);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "reading pg_dist_placement failed: %s", SPI_result_code_string(rc));
    bool isnull;
    const int64 here =
        DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
    spi_finish_as(saved);
    if (here == 0)
        ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                        errmsg("the key's shard is not on this node"),
                        errdetail("idempotency.keys is distributed by principal; its key lock is a "
                                  "lock of the node that holds the principal's shard."),
                        errhint("Delegate the protocol functions to that node: run "
                                "idempotency.distribute(), or create_distributed_function(..., "
                                "force_delegation => true) for each (see docs/scale-out.md).")));
}

}  // namespace idem::pg
