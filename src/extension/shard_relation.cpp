// The local shard relations of the key table under Citus: which relation and
// primary key hold a shard's rows on this node, checked once to have the key
// table's own columns in its order (see shard_relation.hpp). Only placement.cpp
// asks, for a shard whose metadata lock its check holds.
#include "shard_relation.hpp"

#include "key_table.hpp"

extern "C" {
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
}

namespace idem::pg {

namespace {

// The shard relations the direct back-end may use, by shard id: the relation
// and its primary key, checked once to have the key table's own columns in its
// order. Forgotten when any of them, or everything, is invalidated.
constexpr int kMaxShardRelations = 64;
ShardRelation shard_relations[kMaxShardRelations];
int shard_relation_count = 0;

void forget_shard_relations(Datum, Oid relid) {
    if (relid == InvalidOid) {
        shard_relation_count = 0;
        return;
    }
    for (int i = 0; i < shard_relation_count; ++i)
        if (shard_relations[i].table == relid || shard_relations[i].index == relid) {
            shard_relation_count = 0;
            return;
        }
}

// Whether `shard` has the key table's columns, by name and type, first and in
// order, and a primary key on (principal, key); its primary key in *index.
bool usable_shard(Relation shard, Relation table, Oid* index) {
    if (shard->rd_rel->relkind != RELKIND_RELATION) return false;
    TupleDesc mine = RelationGetDescr(shard);
    TupleDesc theirs = RelationGetDescr(table);
    if (mine->natts < aColumns || theirs->natts < aColumns) return false;
    for (int i = 0; i < aColumns; ++i) {
        Form_pg_attribute a = TupleDescAttr(mine, i);
        Form_pg_attribute b = TupleDescAttr(theirs, i);
        if (a->attisdropped || b->attisdropped || a->atttypid != b->atttypid ||
            strcmp(NameStr(a->attname), NameStr(b->attname)) != 0)
            return false;
    }
    list_free(RelationGetIndexList(shard));  // sets rd_pkindex
    *index = shard->rd_pkindex;
    if (!OidIsValid(*index)) return false;
    Relation pkey = index_open(*index, AccessShareLock);
    const bool two_columns = pkey->rd_index->indnkeyatts == 2 &&
                             pkey->rd_index->indkey.values[0] == aPrincipal &&
                             pkey->rd_index->indkey.values[1] == aKey;
    index_close(pkey, AccessShareLock);
    return two_columns;
}

// The relation of `shard` of the key table on this node, looked up once.
}  // namespace

const ShardRelation* shard_relation(const KeyTable& table, int64 shard) {
    for (int i = 0; i < shard_relation_count; ++i)
        if (shard_relations[i].shard == shard) return &shard_relations[i];
    // Citus names a shard by its table and shard id, in the table's schema.
    char name[NAMEDATALEN];
    snprintf(name, sizeof(name), "keys_" INT64_FORMAT, shard);
    ShardRelation found{shard, get_relname_relid(name, get_rel_namespace(table.table)), InvalidOid,
                        false};
    if (OidIsValid(found.table)) {
        Relation shell = table_open(table.table, AccessShareLock);
        Relation rel = table_open(found.table, AccessShareLock);
        found.usable = usable_shard(rel, shell, &found.index);
        table_close(rel, AccessShareLock);
        table_close(shell, AccessShareLock);
    }
    if (!OidIsValid(found.table)) return nullptr;  // not known here: looked up again next time
    if (shard_relation_count == kMaxShardRelations) shard_relation_count = 0;
    shard_relations[shard_relation_count] = found;
    return &shard_relations[shard_relation_count++];
}

void shard_relation_init() { CacheRegisterRelcacheCallback(forget_shard_relations, (Datum)0); }

}  // namespace idem::pg
