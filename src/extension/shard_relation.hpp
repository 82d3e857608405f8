// The local shard relations of the key table under Citus (shard_relation.cpp):
// the relation of a shard id and its primary key, looked up once and checked to
// have the key table's own columns in its order, for the direct back-end.
// Part of the store layer: placement.cpp asks it for a shard its check locked.
#pragma once

extern "C" {
#include "postgres.h"
}

namespace idem::pg {

struct KeyTable;  // key_table.hpp

/// A shard relation of the key table on this node: its table and primary key,
/// and whether the direct back-end may use them (the key table's columns first
/// and in order, by name and type, and a primary key on (principal, key)).
struct ShardRelation {
    int64 shard;
    Oid table;
    Oid index;
    bool usable;
};

/// The relation of `shard` of `table` on this node (Citus names it
/// <table>_<shard id> in the table's schema), looked up once and kept until it,
/// its index or everything is invalidated; nullptr when there is none here.
const ShardRelation* shard_relation(const KeyTable& table, int64 shard);

/// Registers the relation cache callback that forgets the kept relations
/// (from placement_init()).
void shard_relation_init();

}  // namespace idem::pg
