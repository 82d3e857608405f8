// Every difference between the PostgreSQL versions the extension builds
// against (15, 17 and 18; 16 shares 17's signatures), in one place. Each
// wrapper keeps PostgreSQL 15's argument list, so a call site differs from the
// plain call only by the `compat::` prefix. Include after the PostgreSQL
// headers (executor/executor.h, access/genam.h).
#pragma once

extern "C" {
#include "postgres.h"

#include "access/genam.h"
#include "executor/executor.h"
#include "funcapi.h"
#include "nodes/bitmapset.h"
#include "nodes/pg_list.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/guc.h"
#include "utils/guc_tables.h"
#if PG_VERSION_NUM >= 160000
#include "parser/parse_relation.h"
#include "varatt.h"  // VARSIZE_ANY & co., in postgres.h up to 15
#endif
}

#if PG_VERSION_NUM < 150000 || PG_VERSION_NUM >= 190000
#error "pg_idempotency builds against PostgreSQL 15, 16, 17 and 18"
#endif

namespace compat {

/// ExecInitRangeTable(estate, range_table) of PostgreSQL 15. Since 16 the
/// executor also takes the permission entries of the relations (made here from
/// the range table, one per relation entry, as the parser would); since 18 the
/// set of range table indexes left after pruning (all of them: nothing is pruned).
inline void ExecInitRangeTable(EState* estate, List* range_table) {
#if PG_VERSION_NUM >= 160000
    List* permissions = NIL;
    ListCell* cell;
    foreach (cell, range_table) {
        auto* entry = static_cast<RangeTblEntry*>(lfirst(cell));
        if (entry->rtekind == RTE_RELATION && entry->perminfoindex == 0)
            addRTEPermissionInfo(&permissions, entry);
    }
#endif
#if PG_VERSION_NUM >= 180000
    ::ExecInitRangeTable(estate, range_table, permissions,
                         bms_add_range(nullptr, 1, list_length(range_table)));
#elif PG_VERSION_NUM >= 160000
    ::ExecInitRangeTable(estate, range_table, permissions);
#else
    ::ExecInitRangeTable(estate, range_table);
#endif
}

/// ExecInsertIndexTuples() of PostgreSQL 15. Since 16 it also takes
/// `onlySummarizing` (false: a new row goes into every index).
inline List* ExecInsertIndexTuples(ResultRelInfo* result_rel, TupleTableSlot* slot, EState* estate,
                                   bool update, bool no_dup_err, bool* spec_conflict,
                                   List* arbiter_indexes) {
#if PG_VERSION_NUM >= 160000
    return ::ExecInsertIndexTuples(result_rel, slot, estate, update, no_dup_err, spec_conflict,
                                   arbiter_indexes, false);
#else
    return ::ExecInsertIndexTuples(result_rel, slot, estate, update, no_dup_err, spec_conflict,
                                   arbiter_indexes);
#endif
}

/// index_beginscan() of PostgreSQL 15. Since 18 it also takes an
/// IndexScanInstrumentation* (none: the scan is not shown by EXPLAIN).
inline IndexScanDesc index_beginscan(Relation heap, Relation index, Snapshot snapshot, int nkeys,
                                     int norderbys) {
#if PG_VERSION_NUM >= 180000
    return ::index_beginscan(heap, index, snapshot, nullptr, nkeys, norderbys);
#else
    return ::index_beginscan(heap, index, snapshot, nkeys, norderbys);
#endif
}

/// Memory for a GUC check hook's `extra` (the GUC machinery frees it): malloc
/// up to 15, the GUC memory context since 16 (guc_malloc, which a check hook
/// must use there: the GUC code frees `extra` with pfree). Null when out of memory.
inline void* guc_extra_alloc(size_t size) {
#if PG_VERSION_NUM >= 160000
    return ::guc_malloc(LOG, size);
#else
    return malloc(size);
#endif
}

/// Frees memory from guc_extra_alloc() that was not handed to the GUC machinery.
inline void guc_extra_free(void* pointer) {
#if PG_VERSION_NUM >= 160000
    ::guc_free(pointer);
#else
    free(pointer);
#endif
}

/// InitMaterializedSRF() (PostgreSQL 15.1 and later; 15.0 called it
/// SetSingleFuncCall, which every 15.x keeps and 16 dropped).
inline void InitMaterializedSRF(FunctionCallInfo fcinfo, bits32 flags) {
#if PG_VERSION_NUM < 160000
    ::SetSingleFuncCall(fcinfo, flags);
#else
    ::InitMaterializedSRF(fcinfo, flags);
#endif
}

/// The GUC record of the setting (or placeholder) `name`, or null when there
/// is none. Since 16 a hash lookup (find_option, declared in guc_tables.h); up
/// to 15 a scan of the variable array (find_option was static there). Only
/// called while the library loads, never per call.
inline config_generic* find_guc_record(const char* name) {
#if PG_VERSION_NUM >= 160000
    return ::find_option(name, false, true, ERROR);
#else
    config_generic** records = ::get_guc_variables();
    const int count = ::GetNumConfigOptions();
    for (int i = 0; i < count; ++i)
        if (pg_strcasecmp(records[i]->name, name) == 0) return records[i];
    return nullptr;
#endif
}

/// A one-dimensional bigint[] of `count` values. Since 16 construct_array_builtin()
/// knows the element type's length, by-value flag and alignment; up to 15
/// they are given (a bigint is by value where a float8 is).
inline ArrayType* construct_int8_array(Datum* values, int count) {
#if PG_VERSION_NUM >= 160000
    return construct_array_builtin(values, count, INT8OID);
#else
    return construct_array(values, count, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
#endif
}

}  // namespace compat
