// Checks of the array arguments of the batch functions. As everywhere, keys
// and principals are never echoed in messages: a repeated key is named by its
// positions in the array.
#include "batch_arguments.hpp"

#include "arguments.hpp"

extern "C" {
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/lsyscache.h"
}

namespace idem::pg {

namespace {

// Orders two positions by their keys' bytes, then by length: the one fixed
// order in which every batch takes its key locks.
int compare_keys(const void* a, const void* b, void* arg) {
    text** keys = static_cast<text**>(arg);
    text* left = keys[*static_cast<const int*>(a)];
    text* right = keys[*static_cast<const int*>(b)];
    const int left_length = VARSIZE_ANY_EXHDR(left);
    const int right_length = VARSIZE_ANY_EXHDR(right);
    const int common =
        memcmp(VARDATA_ANY(left), VARDATA_ANY(right), Min(left_length, right_length));
    if (common != 0) return common;
    return (left_length > right_length) - (left_length < right_length);
}

// The array of argument `arg`, one-dimensional, with at most kMaxBatchKeys elements.
ArrayType* batch_array_argument(FunctionCallInfo fcinfo, int arg, const char* name) {
    ArrayType* array = PG_GETARG_ARRAYTYPE_P(arg);
    if (ARR_NDIM(array) > 1)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s must be a one-dimensional array", name)));
    const int count = ArrayGetNItems(ARR_NDIM(array), ARR_DIMS(array));
    if (count > kMaxBatchKeys)
        ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                        errmsg("a batch holds at most %d keys, not %d", kMaxBatchKeys, count),
                        errhint("Split the keys into several calls.")));
    return array;
}

}  // namespace

Datum* batch_array(FunctionCallInfo fcinfo, int arg, Oid type, int count, const char* name,
                   bool optional, bool** nulls) {
    if (PG_ARGISNULL(arg)) {
        if (optional) return nullptr;
        ereport(ERROR,
                (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("%s must not be null", name)));
    }
    ArrayType* array = batch_array_argument(fcinfo, arg, name);
    int16 length;
    bool by_value;
    char align;
    get_typlenbyvalalign(type, &length, &by_value, &align);
    Datum* elements;
    bool* element_nulls;
    int found;
    deconstruct_array(array, type, length, by_value, align, &elements, &element_nulls, &found);
    if (found != count)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s has %d elements, keys has %d", name, found, count),
                        errdetail("The i-th element belongs to the i-th key.")));
    if (nulls != nullptr) {
        *nulls = element_nulls;
        return elements;
    }
    for (int i = 0; i < found; ++i)
        if (element_nulls[i])
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("%s must not contain NULL (element %d is NULL)", name, i + 1)));
    return elements;
}

BatchKeys batch_keys(FunctionCallInfo fcinfo, int arg) {
    if (PG_ARGISNULL(arg))
        ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("keys must not be null")));
    ArrayType* array = batch_array_argument(fcinfo, arg, "keys");
    const int count = ArrayGetNItems(ARR_NDIM(array), ARR_DIMS(array));
    Datum* elements = batch_array(fcinfo, arg, TEXTOID, count, "keys", false, nullptr);

    BatchKeys batch;
    batch.count = count;
    batch.keys = static_cast<text**>(palloc(sizeof(text*) * Max(count, 1)));
    batch.sorted = static_cast<int*>(palloc(sizeof(int) * Max(count, 1)));
    for (int i = 0; i < count; ++i) {
        batch.keys[i] = DatumGetTextPP(elements[i]);
        check_key(batch.keys[i]);
        batch.sorted[i] = i;
    }
    qsort_arg(batch.sorted, count, sizeof(int), compare_keys, batch.keys);
    for (int i = 1; i < count; ++i)
        if (compare_keys(&batch.sorted[i - 1], &batch.sorted[i], batch.keys) == 0)
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("keys must not repeat: key %d is key %d again",
                                   Max(batch.sorted[i - 1], batch.sorted[i]) + 1,
                                   Min(batch.sorted[i - 1], batch.sorted[i]) + 1),
                            errdetail("A batch gives each key one outcome.")));
    return batch;
}

}  // namespace idem::pg
