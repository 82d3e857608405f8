// The direct back-end: the lookup through the primary key (no SPI, no
// executor) and the insert of a new completed key (a heap insert and its index
// entries, as logical replication's apply does). Neither checks privileges
// (PostgreSQL checks them in the executor, which these paths do not use), so
// they need no switch to the owner's rights; the functions that reach them are
// granted per role.
#include "key_direct.hpp"

extern "C" {
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "executor/executor.h"
#include "executor/tuptable.h"
#include "nodes/makefuncs.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
}

#include "compat.hpp"  // PostgreSQL 15 / 16-17 / 18 differences

namespace idem::pg::direct {

namespace {

// The most attributes (dropped ones included) a key row is written for directly.
constexpr int kMaxKeyColumns = 32;

// Whether the key table has its own columns only (a column someone added and
// dropped again does not count): then a row can be written by position;
// otherwise the INSERT statement fills what others added.
bool only_own_columns(TupleDesc desc) {
    if (desc->natts < aColumns || desc->natts > kMaxKeyColumns) return false;
    for (int i = aColumns; i < desc->natts; ++i)
        if (!TupleDescAttr(desc, i)->attisdropped) return false;
    return true;
}

}  // namespace

KeyRow scan_key(const KeyTable& oids, text* principal, text* key, Snapshot snapshot) {
    Relation table = table_open(oids.table, AccessShareLock);
    Relation index = index_open(oids.index, AccessShareLock);
    Snapshot scan_snapshot =
        RegisterSnapshot(snapshot == InvalidSnapshot ? GetTransactionSnapshot() : snapshot);

    ScanKeyData keys[2];
    ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
                           index->rd_indcollation[0], F_TEXTEQ, PointerGetDatum(principal));
    ScanKeyEntryInitialize(&keys[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
                           index->rd_indcollation[1], F_TEXTEQ, PointerGetDatum(key));
    IndexScanDesc scan = compat::index_beginscan(table, index, scan_snapshot, 2, 0);
    index_rescan(scan, keys, 2, nullptr, 0);
    TupleTableSlot* slot = table_slot_create(table, nullptr);

    KeyRow row;
    if (index_getnext_slot(scan, ForwardScanDirection, slot))
        row = row_from_tuple(ExecCopySlotHeapTuple(slot),
                             RelationGetDescr(table));  // out of the buffer
    ExecDropSingleTupleTableSlot(slot);
    index_endscan(scan);
    UnregisterSnapshot(scan_snapshot);
    index_close(index, NoLock);  // locks are kept until the end of the transaction
    table_close(table, NoLock);
    return row;
}

// The table's CHECK constraints are not evaluated here: every value is checked
// by the callers before (fingerprint 32 bytes, status 100..599, headers a JSON
// object, a positive TTL, a fence from the sequence) or is fixed (state
// 'completed'), so they hold by construction; the statement path would re-read
// and re-plan all seven of them for every request. A duplicate key raises
// unique_violation as the INSERT would.
bool insert_completed(const KeyTable& table, const Request& request, const StoredResponse& response,
                      const Interval* ttl, int64 fence) {
    Relation rel = table_open(table.table, RowExclusiveLock);
    TupleDesc desc = RelationGetDescr(rel);
    if (rel->trigdesc != nullptr || rel->rd_rel->relkind != RELKIND_RELATION ||
        rel->rd_rel->relrowsecurity || !only_own_columns(desc)) {
        table_close(rel, NoLock);
        return false;
    }
    const TimestampTz now = GetCurrentTransactionStartTimestamp();
    const Datum expires = DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now),
                                              IntervalPGetDatum(const_cast<Interval*>(ttl)));
    if (DatumGetTimestampTz(expires) <=
        now) {  // '1 month -30 days' in February: let the CHECK say so
        table_close(rel, NoLock);
        return false;
    }
    Datum values[kMaxKeyColumns] = {};
    bool nulls[kMaxKeyColumns];
    for (int i = 0; i < desc->natts; ++i) nulls[i] = true;
    auto set = [&](KeysColumn column, Datum value) {
        values[column - 1] = value;
        nulls[column - 1] = false;
    };
    set(aPrincipal, PointerGetDatum(request.principal));
    set(aKey, PointerGetDatum(request.key));
    set(aAction, PointerGetDatum(request.action));
    set(aSha, PointerGetDatum(request.fingerprint));
    set(aState, CStringGetTextDatum("completed"));
    set(aStatus, Int16GetDatum(static_cast<int16>(response.status)));
    if (!response.headers_null) set(aHeaders, response.headers);
    if (!response.body_null) set(aBody, response.body);
    if (!response.resource_id_null) set(aResourceId, response.resource_id);
    set(aSecret, BoolGetDatum(response.one_time_secret));
    set(aFence, Int64GetDatum(fence));  // lease_until stays NULL: no lease
    set(aCreated, TimestampTzGetDatum(now));
    set(aExpires, expires);

    EState* estate = CreateExecutorState();
    RangeTblEntry* rte = makeNode(RangeTblEntry);
    rte->rtekind = RTE_RELATION;
    rte->relid = RelationGetRelid(rel);
    rte->relkind = rel->rd_rel->relkind;
    rte->rellockmode = RowExclusiveLock;
    compat::ExecInitRangeTable(estate, list_make1(rte));
    ResultRelInfo* result_rel = makeNode(ResultRelInfo);
    InitResultRelInfo(result_rel, rel, 1, nullptr, 0);
    estate->es_output_cid = GetCurrentCommandId(true);
    ExecOpenIndices(result_rel, false);

    TupleTableSlot* slot = table_slot_create(rel, &estate->es_tupleTable);
    ExecClearTuple(slot);
    memcpy(slot->tts_values, values, sizeof(Datum) * desc->natts);
    memcpy(slot->tts_isnull, nulls, sizeof(bool) * desc->natts);
    ExecStoreVirtualTuple(slot);
    table_tuple_insert(rel, slot, estate->es_output_cid, 0, nullptr);
    List* recheck =
        compat::ExecInsertIndexTuples(result_rel, slot, estate, false, false, nullptr, NIL);
    list_free(recheck);

    ExecCloseIndices(result_rel);
    ExecResetTupleTable(estate->es_tupleTable, false);
    FreeExecutorState(estate);
    table_close(rel, NoLock);   // the lock is kept until the end of the transaction
    CommandCounterIncrement();  // later statements of the transaction see the row, as after INSERT
    return true;
}

}  // namespace idem::pg::direct
