// The snapshot's re-check before a start (see snapshot_check.hpp): the key
// looked up again with the latest snapshot, through the store.
#include "snapshot_check.hpp"

#include "counters.hpp"
#include "key_store.hpp"

extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "utils/snapmgr.h"
}

namespace idem::pg {

void require_snapshot_sees_winner(const Request& request, const KeyRow& seen) {
    if (!IsolationUsesXactSnapshot()) return;
    const KeyRow latest = lookup_key(request.principal, request.key, GetLatestSnapshot());
    // Nothing committed under the key since the snapshot (or the row was
    // deleted since): what the snapshot saw is what will be replaced. Any
    // other row - a winner to replay, or one that expired by now() but that
    // the snapshot cannot see, which complete() would collide with - is a
    // concurrent change this transaction cannot build on.
    if (!latest.found || (seen.found && latest.fence == seen.fence)) return;
    count_event(Counter::serialization_failures, request.action);
    ereport(ERROR,
            (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
             errmsg("could not serialize access due to a concurrent use of the idempotency key"),
             errhint("Retry the transaction; it will see the stored response.")));
}

}  // namespace idem::pg
