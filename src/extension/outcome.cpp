// From a key row to the outcome of begin() and acquire(), and the one place
// where an outcome becomes the text of idempotency.key_outcome.outcome.
#include "outcome.hpp"

#include "compat.hpp"  // VARDATA_ANY & co. (varatt.h since 16)
#include "key_store.hpp"

extern "C" {
#include "postgres.h"
}

namespace idem::pg {

const char* outcome_text(Outcome outcome) {
    switch (outcome) {
        case Outcome::started: return "started";
        case Outcome::replay: return "replay";
        case Outcome::mismatch: return "mismatch";
        case Outcome::in_progress: return "in_progress";
        case Outcome::secret_replay: return "secret_replay";
        case Outcome::expired: return "expired";
    }
    pg_unreachable();
}

Outcome outcome_for(const KeyRow& row, bytea* fingerprint) {
    if (!row.found) return Outcome::started;
    const bool refused = expiry_refuses(row);
    if (!refused && !row.live()) return Outcome::started;
    if (VARSIZE_ANY_EXHDR(row.request_sha256) != 32 ||
        memcmp(VARDATA_ANY(row.request_sha256), VARDATA_ANY(fingerprint), 32) != 0)
        return Outcome::mismatch;
    if (refused) return Outcome::expired;
    if (row.completed) return row.one_time_secret ? Outcome::secret_replay : Outcome::replay;
    return row.leased() ? Outcome::in_progress : Outcome::started;
}

}  // namespace idem::pg
