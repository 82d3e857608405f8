// The re-check, before a start under REPEATABLE READ or SERIALIZABLE, that the
// transaction's snapshot did not miss a row that committed under the key.
#pragma once

#include "key_row.hpp"

namespace idem::pg {

/// Under REPEATABLE READ / SERIALIZABLE the transaction snapshot may predate a
/// row that committed while we waited (or just before we looked): when the
/// latest state holds a row other than `seen` (what the snapshot found), raises
/// 40001 instead of starting - a second effect after a winner, or a complete()
/// that would collide with a row it cannot see - and counts it under the
/// request's action.
void require_snapshot_sees_winner(const Request& request, const KeyRow& seen);

}  // namespace idem::pg
