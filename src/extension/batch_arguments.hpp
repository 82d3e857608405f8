// Checks of the array arguments of the batch functions (batch.cpp): the keys
// of a batch and the arrays that run beside them, element by element.
#pragma once

extern "C" {
#include "postgres.h"

#include "fmgr.h"
}

namespace idem::pg {

/// The most keys in one batch call; more is 54000.
constexpr int kMaxBatchKeys = 1000;

/// The keys of a batch, each checked as a single call's key. The arrays are
/// palloc'd in the current memory context.
struct BatchKeys {
    int count;    ///< number of keys (0 for an empty array)
    text** keys;  ///< the keys, in input order
    int* sorted;  ///< positions (0-based) in key order: the order the key locks are taken in
};

/// The keys of array argument `arg`: 22004 when the argument is NULL; 22023
/// for a multi-dimensional array, a NULL element or a key given twice; 54000
/// for more than kMaxBatchKeys keys; 22P02 for a malformed key (check_key).
BatchKeys batch_keys(FunctionCallInfo fcinfo, int arg);

/// The elements of array argument `arg` (element type `type`), which must have
/// `count` elements (22023 naming `name` otherwise, or for a multi-dimensional
/// array). A NULL argument: nullptr when `optional`, 22004 otherwise. With
/// `nulls` nullptr a NULL element is 22023; otherwise `*nulls` gets the flags.
Datum* batch_array(FunctionCallInfo fcinfo, int arg, Oid type, int count, const char* name,
                   bool optional, bool** nulls);

}  // namespace idem::pg
