// The two rules of a key row that every room reads the same way: whether a
// lease holds it, and whether it counts at all (see key_row.hpp).
#include "key_row.hpp"

extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "utils/timestamp.h"
}

namespace idem::pg {

bool KeyRow::leased() const {
    return has_lease && !tombstone && lease_until > GetCurrentTimestamp();
}  // clock_timestamp()

bool KeyRow::live() const {
    return leased() || expires_at > GetCurrentTransactionStartTimestamp();
}  // now()

}  // namespace idem::pg
