// The idempotency.key_outcome row of an outcome: what begin() and acquire()
// return, and the same columns in idempotency.batch_outcome.
#pragma once

#include "key_row.hpp"
#include "outcome.hpp"

extern "C" {
#include "postgres.h"

#include "fmgr.h"
}

namespace idem::pg {

/// The number of columns of idempotency.key_outcome (outcome to lease_until).
constexpr int kOutcomeColumns = 9;

/// Fills the kOutcomeColumns columns of idempotency.key_outcome into `values`
/// and `nulls`, as outcome_result shows them (idempotency.batch_outcome has
/// the same columns after ord and key).
void outcome_columns(Outcome outcome, const KeyRow* row, Datum* values, bool* nulls);

/// The idempotency.key_outcome row: the outcome and what of `row` it shows
/// (started: the row about to be written; replay: the stored response;
/// mismatch: the resource id; in_progress: the lease). `row` may be nullptr
/// (in_progress after a wait that ran out).
Datum outcome_result(FunctionCallInfo fcinfo, Outcome outcome, const KeyRow* row);

}  // namespace idem::pg
