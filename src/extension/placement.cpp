// Where Citus keeps the key table's rows: the placement of idempotency.keys
// read from Citus's metadata (once per session, see key_table()); the check,
// before a key lock is taken, that this node holds the shard of a principal;
// and the local shard relation that the direct back-end may then use. Without
// Citus none of it runs a statement.
//
// A locking call for a principal under Citus (require_local_shard) asks Citus
// for the principal's shard (get_shard_id_for_distribution_column), takes
// Citus's shard metadata lock on it in share mode (lock_shard_metadata, the
// lock Citus's own executor takes for a write to the shard, and which a shard
// move or split takes in exclusive mode before it switches the shard to
// another node), and then reads pg_dist_placement again: only a shard placed
// on this node after the lock was granted passes. The lock is held to the end
// of the transaction, so the shard cannot move away while the transaction
// reads and writes it: the direct back-end then reads and writes the shard's
// own relation (idempotency.keys_<shard id>) through its heap and primary key,
// as it does the plain table on one node (locked_local_shard).
#include "placement.hpp"

#include "key_table.hpp"
#include "routed.hpp"
#include "shard_relation.hpp"

extern "C" {
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_index.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
}

#include "compat.hpp"  // PostgreSQL 15 / 16-17 / 18 differences

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

// Citus's placement state of an active placement (pg_dist_placement.shardstate).
constexpr int32 kShardStateActive = 1;

// Citus's functions, called through fmgr (no SQL): looked up once per session,
// forgotten when pg_proc changes (Citus installed, updated or dropped).
struct CitusFunctions {
    bool looked_up = false;
    bool has_shard_id = false;
    FmgrInfo shard_id;  // get_shard_id_for_distribution_column(regclass, "any")
    bool has_lock = false;
    FmgrInfo lock_metadata;  // lock_shard_metadata(integer, bigint[])
};
CitusFunctions citus;
// Where the lookups keep what the calls need (their FmgrInfo's state, the call
// expression): emptied at each new lookup, so that a session whose pg_proc
// changes often does not pile up old lookups.
MemoryContext citus_functions_context = nullptr;

void forget_functions(Datum, int, uint32) { citus.looked_up = false; }

Oid function_oid(const char* name, int nargs, const Oid* types) {
    List* qualified = list_make2(makeString(pstrdup("pg_catalog")), makeString(pstrdup(name)));
    return LookupFuncName(qualified, nargs, types, true);
}

void look_up_functions() {
    if (citus.looked_up) return;
    citus = CitusFunctions{};
    if (citus_functions_context == nullptr)
        citus_functions_context = AllocSetContextCreate(TopMemoryContext, "idempotency Citus calls",
                                                        ALLOCSET_SMALL_SIZES);
    else
        MemoryContextReset(citus_functions_context);
    // Citus declares the value "any"; the stand-in of the tests (fake_citus.sql) text.
    Oid shard_id_types[2] = {REGCLASSOID, ANYOID};
    Oid shard_id = function_oid("get_shard_id_for_distribution_column", 2, shard_id_types);
    if (!OidIsValid(shard_id)) {
        shard_id_types[1] = TEXTOID;
        shard_id = function_oid("get_shard_id_for_distribution_column", 2, shard_id_types);
    }
    if (OidIsValid(shard_id)) {
        fmgr_info_cxt(shard_id, &citus.shard_id, citus_functions_context);
        // "any" takes its type from the call's expression, as Citus reads it
        // (get_fn_expr_argtype): a call with a regclass and a text.
        MemoryContext old = MemoryContextSwitchTo(citus_functions_context);
        List* args = list_make2(makeNullConst(REGCLASSOID, -1, InvalidOid),
                                makeNullConst(TEXTOID, -1, DEFAULT_COLLATION_OID));
        FuncExpr* call =
            makeFuncExpr(shard_id, INT8OID, args, InvalidOid, InvalidOid, COERCE_EXPLICIT_CALL);
        MemoryContextSwitchTo(old);
        fmgr_info_set_expr(reinterpret_cast<Node*>(call), &citus.shard_id);
        citus.has_shard_id = true;
    }
    const Oid lock_types[2] = {INT4OID, INT8ARRAYOID};
    const Oid lock = function_oid("lock_shard_metadata", 2, lock_types);
    if (OidIsValid(lock)) {
        fmgr_info_cxt(lock, &citus.lock_metadata, citus_functions_context);
        citus.has_lock = true;
    }
    citus.looked_up = true;
}

// The shard of `principal` in `table`, asked of Citus as the table's owner
// (Citus checks that the caller may read the table).
int64 shard_of(const KeyTable& table, text* principal) {
    if (!citus.has_shard_id)
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_FUNCTION),
                        errmsg("idempotency.keys is distributed by Citus, but "
                               "get_shard_id_for_distribution_column is missing")));
    return DatumGetInt64(FunctionCall2Coll(&citus.shard_id, DEFAULT_COLLATION_OID,
                                           ObjectIdGetDatum(table.table),
                                           PointerGetDatum(principal)));
}

// Citus's shard metadata lock of `shard` in share mode, as Citus's executor
// takes it for a write, to the end of the transaction (Citus checks that the
// caller owns the table). Its result (void) is not read.
void lock_shard_metadata(int64 shard) {
    Datum ids[1] = {Int64GetDatum(shard)};
    ArrayType* array = compat::construct_int8_array(ids, 1);
    LOCAL_FCINFO(call, 2);
    InitFunctionCallInfoData(*call, &citus.lock_metadata, 2, InvalidOid, nullptr, nullptr);
    call->args[0].value = Int32GetDatum(ShareLock);
    call->args[0].isnull = false;
    call->args[1].value = PointerGetDatum(array);
    call->args[1].isnull = false;
    (void)FunctionCallInvoke(call);
}

// The one value of column `column` of catalog `name`'s first row, read with a
// new catalog snapshot (Citus's catalogs have no system cache: every scan takes one).
bool first_int4(const char* name, const char* column, int32* value) {
    const Oid relid = get_relname_relid(name, PG_CATALOG_NAMESPACE);
    if (!OidIsValid(relid)) return false;
    const AttrNumber attnum = get_attnum(relid, column);
    if (attnum == InvalidAttrNumber) return false;
    Relation rel = table_open(relid, AccessShareLock);
    SysScanDesc scan = systable_beginscan(rel, InvalidOid, false, nullptr, 0, nullptr);
    HeapTuple tuple = systable_getnext(scan);
    bool found = false;
    if (HeapTupleIsValid(tuple)) {
        bool isnull;
        const Datum datum = heap_getattr(tuple, attnum, RelationGetDescr(rel), &isnull);
        found = !isnull;
        if (found) *value = DatumGetInt32(datum);
    }
    systable_endscan(scan);
    table_close(rel, AccessShareLock);
    return found;
}

// Whether pg_dist_placement places `shard` on this node's group
// (pg_dist_local_group), active: read now (a new catalog snapshot), or as
// `snapshot` saw it.
bool placed_here(int64 shard, Snapshot snapshot = nullptr) {
    int32 local_group;
    if (!first_int4("pg_dist_local_group", "groupid", &local_group)) return false;
    const Oid relid = get_relname_relid("pg_dist_placement", PG_CATALOG_NAMESPACE);
    if (!OidIsValid(relid)) return false;
    const AttrNumber shard_column = get_attnum(relid, "shardid");
    const AttrNumber group_column = get_attnum(relid, "groupid");
    const AttrNumber state_column = get_attnum(relid, "shardstate");  // none in the stand-in
    if (shard_column == InvalidAttrNumber || group_column == InvalidAttrNumber) return false;
    const Oid index = get_relname_relid("pg_dist_placement_shardid_index", PG_CATALOG_NAMESPACE);
    Relation rel = table_open(relid, AccessShareLock);
    ScanKeyData key;
    ScanKeyInit(&key, shard_column, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(shard));
    SysScanDesc scan = systable_beginscan(rel, index, OidIsValid(index), snapshot, 1, &key);
    bool here = false;
    HeapTuple tuple;
    while (!here && HeapTupleIsValid(tuple = systable_getnext(scan))) {
        bool isnull;
        const Datum group = heap_getattr(tuple, group_column, RelationGetDescr(rel), &isnull);
        if (isnull || DatumGetInt32(group) != local_group) continue;
        if (state_column != InvalidAttrNumber) {
            const Datum state = heap_getattr(tuple, state_column, RelationGetDescr(rel), &isnull);
            if (isnull || DatumGetInt32(state) != kShardStateActive) continue;
        }
        here = true;
    }
    systable_endscan(scan);
    table_close(rel, AccessShareLock);
    return here;
}

// The principals whose shard this transaction found on this node, with the
// shard and whether Citus's metadata lock on it is held. In
// TopTransactionContext; forgotten at the end of the transaction, and an entry
// made in a savepoint that rolls back (its lock went with it) is forgotten then.
struct CheckedShard {
    text* principal;
    int64 shard;
    bool locked;
    SubTransactionId subtransaction;
};
constexpr int kMaxChecked = 16;  // more principals in one transaction: checked again each call
CheckedShard checked[kMaxChecked];
int checked_count = 0;

bool same_text(text* a, text* b) {
    return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
           memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

const CheckedShard* find_checked(text* principal) {
    for (int i = 0; i < checked_count; ++i)
        if (same_text(checked[i].principal, principal)) return &checked[i];
    return nullptr;
}

// Remembers (or, for a principal remembered before, replaces) the shard found
// for `principal` and whether its lock is held, in the current subtransaction.
void remember_checked(text* principal, int64 shard, bool locked) {
    for (int i = 0; i < checked_count; ++i)
        if (same_text(checked[i].principal, principal)) {
            checked[i].shard = shard;
            checked[i].locked = locked;
            checked[i].subtransaction = GetCurrentSubTransactionId();
            return;
        }
    if (checked_count == kMaxChecked) return;
    const Size size = VARSIZE_ANY(principal);
    auto* copy = static_cast<text*>(MemoryContextAlloc(TopTransactionContext, size));
    memcpy(copy, principal, size);
    checked[checked_count++] = CheckedShard{copy, shard, locked, GetCurrentSubTransactionId()};
}

void on_transaction_event(XactEvent event, void*) {
    if (event != XACT_EVENT_PRE_COMMIT && event != XACT_EVENT_PARALLEL_PRE_COMMIT &&
        event != XACT_EVENT_PRE_PREPARE)
        checked_count = 0;
}

void on_subtransaction_event(SubXactEvent event, SubTransactionId mine, SubTransactionId parent,
                             void*) {
    if (event == SUBXACT_EVENT_COMMIT_SUB) {
        for (int i = 0; i < checked_count; ++i)
            if (checked[i].subtransaction == mine) checked[i].subtransaction = parent;
    } else if (event == SUBXACT_EVENT_ABORT_SUB) {
        int kept = 0;
        for (int i = 0; i < checked_count; ++i)
            if (checked[i].subtransaction != mine) checked[kept++] = checked[i];
        checked_count = kept;
    }
}

// citus.enable_local_execution: off makes Citus reach even a local shard over
// a connection of its own, which the direct back-end must not bypass.
bool local_execution_on() {
    const char* value = GetConfigOption("citus.enable_local_execution", true, false);
    return value == nullptr || strcmp(value, "on") == 0;
}

// Whether this call reached this node because Citus delegated it here (its
// connections for delegated calls name themselves "citus_internal gpid=...").
bool delegated_here() {
    const char* name = GetConfigOption("application_name", true, false);
    return name != nullptr && strncmp(name, "citus_internal", 14) == 0;
}

// Whether idempotency.begin is delegated by its principal (pg_dist_object, read
// as the key table's owner on the way to a refusal): distribute() ran.
const char* const kDelegatedSql =
    "SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_object o"
    " WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass"
    "   AND o.distribution_argument_index IS NOT NULL"
    "   AND o.objid IN (SELECT p.oid FROM pg_catalog.pg_proc p"
    "                    WHERE p.pronamespace OPERATOR(pg_catalog.=)"
    "                          'idempotency'::pg_catalog.regnamespace"
    "                      AND p.proname OPERATOR(pg_catalog.=) 'begin')";

bool functions_delegated(Oid owner) {
    const Oid catalog = get_relname_relid("pg_dist_object", PG_CATALOG_NAMESPACE);
    if (!OidIsValid(catalog) ||
        get_attnum(catalog, "distribution_argument_index") == InvalidAttrNumber)
        return false;
    const SavedUser saved = spi_connect_as(owner);
    const int rc = SPI_execute(kDelegatedSql, true, 1);
    bool isnull = true;
    const int64 rows =
        rc == SPI_OK_SELECT && SPI_processed == 1
            ? DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull))
            : 0;
    spi_finish_as(saved);
    return !isnull && rows > 0;
}

// The refusal of a locking call on a node without the principal's shard: one
// SQLSTATE and message (the routers match both), a detail naming the cause:
// - the shard was here in the statement's snapshot (taken before the wait for
//   the shard lock): it moved while the call waited;
// - the call was routed here (idempotency.routed) or delegated here by Citus:
//   the shard was here when it was sent, and moved since;
// - the functions are delegated, yet the call ran where it was sent: its form;
// - the functions were never delegated: the setup.
[[noreturn]] void refuse_stale_placement(int64 shard, Oid owner) {
    const bool moved_while_waiting = ActiveSnapshotSet() && placed_here(shard, GetActiveSnapshot());
    const char* moved_after = moved_while_waiting ? "while this call waited for it"
                              : routed            ? "after this call was routed here"
                              : delegated_here()  ? "after this call was delegated here"
                                                  : nullptr;
    if (moved_after != nullptr)
        ereport(
            ERROR,
            (errcode(ERRCODE_FEATURE_NOT_SUPPORTED), errmsg("the key's shard is not on this node"),
             errdetail("The principal's shard moved to another node (a shard move or split) "
                       "%s; nothing was written.",
                       moved_after),
             errhint("Retry the request: a retry goes to the node that holds the shard now "
                     "(a router drops its cached placement; Citus delegates by its current "
                     "metadata).")));
    if (functions_delegated(owner))
        ereport(
            ERROR,
            (errcode(ERRCODE_FEATURE_NOT_SUPPORTED), errmsg("the key's shard is not on this node"),
             errdetail("The protocol functions are delegated, but Citus ran this call on the "
                       "node it was sent to: Citus delegates a call alone in its statement, "
                       "SELECT f(...) or SELECT ... FROM f(...), with the principal a literal "
                       "or a parameter, and not a generic plan."),
             errhint("Send the call in that form, or send the request to the node of the "
                     "principal's shard (see docs/scale-out.md).")));
    ereport(ERROR,
            (errcode(ERRCODE_FEATURE_NOT_SUPPORTED), errmsg("the key's shard is not on this node"),
             errdetail("idempotency.keys is distributed by principal; its key lock is a "
                       "lock of the node that holds the principal's shard, and the "
                       "protocol functions are not delegated to it."),
             errhint("Delegate them: run idempotency.distribute(), or "
                     "create_distributed_function(..., force_delegation => true) for each "
                     "(see docs/scale-out.md).")));
    pg_unreachable();
}

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

// The shard is asked for and the placement read at every locking call, also
// when this transaction holds the shard's lock already (then only the lock is
// not taken again): under Citus nothing moves or splits the shard while the
// lock is held, and what changes the metadata without it (an edit by hand) is
// refused all the same.
void require_local_shard(text* principal) {
    const KeyTable table = key_table();
    if (table.placement != Placement::by_principal) return;
    look_up_functions();
    // As the table's owner: Citus checks that its caller may read the table
    // and owns it. An error in between is fine: the abort restores the user.
    Oid user;
    int context;
    GetUserIdAndSecContext(&user, &context);
    SetUserIdAndSecContext(table.owner, context | SECURITY_LOCAL_USERID_CHANGE);
    const int64 shard = shard_of(table, principal);
    const CheckedShard* before = find_checked(principal);
    const bool held = before != nullptr && before->locked && before->shard == shard;
    if (!held && citus.has_lock) lock_shard_metadata(shard);
    SetUserIdAndSecContext(user, context);
    // Read after the lock: a move that switched the shard away has committed by now.
    if (!placed_here(shard)) refuse_stale_placement(shard, table.owner);
    if (!held) remember_checked(principal, shard, citus.has_lock);
}

bool shard_elsewhere(text* principal) {
    const KeyTable table = key_table();
    if (table.placement != Placement::by_principal) return false;
    look_up_functions();
    if (!citus.has_shard_id) return false;
    Oid user;
    int context;
    GetUserIdAndSecContext(&user, &context);
    SetUserIdAndSecContext(table.owner, context | SECURITY_LOCAL_USERID_CHANGE);
    const int64 shard = shard_of(table, principal);
    SetUserIdAndSecContext(user, context);
    return !placed_here(shard);
}

bool locked_local_shard(text* principal, KeyTable* shard) {
    const CheckedShard* entry = find_checked(principal);
    if (entry == nullptr || !entry->locked || !local_execution_on()) return false;
    const ShardRelation* relation = shard_relation(*shard, entry->shard);
    if (relation == nullptr || !relation->usable) return false;
    shard->table = relation->table;
    shard->index = relation->index;
    return true;
}

void placement_init() {
    shard_relation_init();
    CacheRegisterSyscacheCallback(PROCOID, forget_functions, (Datum)0);
    RegisterXactCallback(on_transaction_event, nullptr);
    RegisterSubXactCallback(on_subtransaction_event, nullptr);
}

}  // namespace idem::pg
