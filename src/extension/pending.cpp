// Keys begun in the current transaction. The list lives in
// TopTransactionContext and is forgotten at commit or abort; a rolled-back
// savepoint forgets the keys begun in it and the completions made in it.
#include "pending.hpp"

#include "counters.hpp"

extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "utils/memutils.h"
}

#include "compat.hpp"  // PostgreSQL 15 / 16-17 / 18 differences

namespace idem::pg {

namespace {

PendingKey* pending = nullptr;  // in TopTransactionContext
int pending_count = 0;
int pending_capacity = 0;

bool same_text(text* a, text* b) {
    return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
           memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

text* copy_to_transaction(text* value) {
    Size size = VARSIZE_ANY(value);
    text* copy = static_cast<text*>(MemoryContextAlloc(TopTransactionContext, size));
    memcpy(copy, value, size);
    return copy;
}

void on_transaction_event(XactEvent event, void* arg) {
    switch (event) {
        case XACT_EVENT_PRE_COMMIT:
        case XACT_EVENT_PARALLEL_PRE_COMMIT:
        case XACT_EVENT_PRE_PREPARE:
            // Committing the handler's writes without the key row would open
            // exactly the window this extension exists to close.
            for (int i = 0; i < pending_count; ++i)
                if (pending[i].completed_subxact == InvalidSubTransactionId) {
                    count_event(Counter::commit_refused, pending[i].request.action);
                    ereport(
                        ERROR,
                        (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                         errmsg(
                             "idempotency key was started but not completed in this transaction"),
                         errhint("Call idempotency.complete() before COMMIT, or ROLLBACK.")));
                }
            break;
        default:
            // Commit, abort, prepare: the list lived in TopTransactionContext.
            pending = nullptr;
            pending_count = 0;
            pending_capacity = 0;
            break;
    }
}

void on_subtransaction_event(SubXactEvent event, SubTransactionId subxact, SubTransactionId parent,
                             void* arg) {
    if (event == SUBXACT_EVENT_ABORT_SUB) {
        // A rolled-back savepoint released the locks of the keys begun in it
        // and removed the rows completed in it.
        int kept = 0;
        for (int i = 0; i < pending_count; ++i) {
            if (pending[i].subxact == subxact) continue;
            if (pending[i].completed_subxact == subxact)
                pending[i].completed_subxact = InvalidSubTransactionId;
            pending[kept++] = pending[i];
        }
        pending_count = kept;
    } else if (event == SUBXACT_EVENT_COMMIT_SUB) {
        for (int i = 0; i < pending_count; ++i) {
            if (pending[i].subxact == subxact) pending[i].subxact = parent;
            if (pending[i].completed_subxact == subxact) pending[i].completed_subxact = parent;
        }
    }
}

}  // namespace

PendingKey* find_pending(text* principal, text* key) {
    for (int i = 0; i < pending_count; ++i)
        if (same_text(pending[i].request.key, key) &&
            same_text(pending[i].request.principal, principal))
            return &pending[i];
    return nullptr;
}

void add_pending(const Request& request, const Interval& ttl, int64 fence, bool replaces) {
    if (pending_count == pending_capacity) {
        int capacity = pending_capacity == 0 ? 4 : pending_capacity * 2;
        auto* grown = static_cast<PendingKey*>(
            MemoryContextAlloc(TopTransactionContext, sizeof(PendingKey) * capacity));
        if (pending_count > 0) memcpy(grown, pending, sizeof(PendingKey) * pending_count);
        pending = grown;
        pending_capacity = capacity;
    }
    PendingKey& entry = pending[pending_count];
    entry.request.principal = copy_to_transaction(request.principal);
    entry.request.key = copy_to_transaction(request.key);
    entry.request.action = copy_to_transaction(request.action);
    entry.request.fingerprint = copy_to_transaction(request.fingerprint);
    entry.ttl = ttl;
    entry.fence = fence;
    entry.replaces = replaces;
    entry.subxact = GetCurrentSubTransactionId();
    entry.completed_subxact = InvalidSubTransactionId;
    ++pending_count;
}

void mark_completed(PendingKey* entry) { entry->completed_subxact = GetCurrentSubTransactionId(); }

void refuse_if_begun(text* principal, text* key, const char* function) {
    if (find_pending(principal, key) != nullptr)
        ereport(ERROR,
                (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                 errmsg("idempotency key was started with begin() in this transaction"),
                 errhint("%s cannot be used for it here; finish it with idempotency.complete().",
                         function)));
}

void pending_init() {
    RegisterXactCallback(on_transaction_event, nullptr);
    RegisterSubXactCallback(on_subtransaction_event, nullptr);
}

}  // namespace idem::pg
