// Keys begun with begin() in the current transaction, until complete() stores
// them; a commit with a key begun and not completed is refused.
#pragma once

#include "key_row.hpp"

extern "C" {
#include "postgres.h"

#include "datatype/timestamp.h"
}

namespace idem::pg {

/// One key begun in this transaction (copied into TopTransactionContext).
struct PendingKey {
    Request request;
    Interval ttl;
    int64 fence;                         // drawn by begin(); complete() writes it
    bool replaces;                       // begin() saw a row (dead, or a lapsed lease) to replace
    SubTransactionId subxact;            // where begin() ran (its lock belongs to it)
    SubTransactionId completed_subxact;  // where complete() ran, or InvalidSubTransactionId
};

/// The key begun in this transaction, or nullptr.
PendingKey* find_pending(text* principal, text* key);

/// Remembers a key that begin() started (its lock is held until the end of
/// the transaction or of the savepoint it was taken in).
void add_pending(const Request& request, const Interval& ttl, int64 fence, bool replaces);

/// Notes that complete() stored the key, in the current subtransaction.
void mark_completed(PendingKey* entry);

/// 55000 when the key was begun in this transaction: save_final(), acquire()
/// and claim() write rows of their own that would collide with complete().
void refuse_if_begun(text* principal, text* key, const char* function);

/// Registers the transaction and subtransaction callbacks (from _PG_init).
void pending_init();

}  // namespace idem::pg
