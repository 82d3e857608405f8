// SQL entry point idempotency.expiry_bucket: the key of the index cleanup
// walks (idempotency.keys_expiry_bucket_idx), expires_at cut to 10 ms.
//
// Keys that expire within the same 10 ms share one index key, which the
// B-tree keeps once with a list of row pointers (deduplication): about 7 bytes
// per key at 1,000 keyed writes per second and more, against 20-30 for an index
// on expires_at itself. Cleanup still takes its batches in exact expires_at
// order (an incremental sort inside each bucket), see cleanup_batch.
extern "C" {
#include "postgres.h"

#include "fmgr.h"
#include "utils/timestamp.h"
}

namespace {

// 10 ms in the microseconds of a timestamptz.
constexpr int64 kBucketMicroseconds = 10000;

}  // namespace

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_expiry_bucket);
}
/// idempotency.expiry_bucket(timestamptz) -> bigint: the 10 ms interval the
/// time falls in, counted from 2000-01-01 (floor division, so earlier times
/// give negative numbers and the order of times is kept). IMMUTABLE and
/// STRICT; -infinity and infinity give the lowest and highest buckets. Pure
/// arithmetic: no schema check, no error, nothing to guard.
Datum idempotency_expiry_bucket(FunctionCallInfo fcinfo) {
    const TimestampTz time = PG_GETARG_TIMESTAMPTZ(0);
    int64 bucket = time / kBucketMicroseconds;
    if (time % kBucketMicroseconds < 0) --bucket;  // C++ division rounds toward zero
    PG_RETURN_INT64(bucket);
}
