// The key lock. Its tag is derived from (principal, key) in a lock class of
// our own, in field4 of an advisory-type tag: pg_advisory_lock() uses 1 and 2
// there, so our locks never meet the application's own advisory locks. They
// show in pg_locks as locktype 'advisory' with objsubid 18756.
#include "key_lock.hpp"
#include "placement.hpp"

extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"
}

namespace idem::pg {

namespace {

constexpr uint16 kKeyLockClass = 0x4944;

void key_locktag(LOCKTAG* tag, text* principal, text* key) {
    uint64 h = hash_bytes_extended(reinterpret_cast<const unsigned char*>(VARDATA_ANY(principal)),
                                   VARSIZE_ANY_EXHDR(principal), UINT64CONST(0x6964656d706f7465));
    h = hash_bytes_extended(reinterpret_cast<const unsigned char*>(VARDATA_ANY(key)),
                            VARSIZE_ANY_EXHDR(key), h);
    SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, static_cast<uint32>(h >> 32), static_cast<uint32>(h),
                         kKeyLockClass);
}

// Waits up to wait_ms for the key lock. The wait runs in a subtransaction with
// lock_timeout set, so that running out of time is an error we can swallow
// without aborting the caller's transaction. Only contended keys get here.
// A timeout that fires as the lock is granted counts as a timeout: the lock is
// given back, and nothing of the timeout is left pending for the caller.
bool wait_for_key_lock(const LOCKTAG* tag, int wait_ms) {
    MemoryContext caller_context = CurrentMemoryContext;
    ResourceOwner caller_owner = CurrentResourceOwner;
    volatile bool acquired = false;

    BeginInternalSubTransaction(nullptr);
    MemoryContextSwitchTo(caller_context);
    PG_TRY();
    {
        char timeout[32];
        snprintf(timeout, sizeof timeout, "%d", wait_ms);
        int nest_level = NewGUCNestLevel();
        set_config_option("lock_timeout", timeout, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
                          true, 0, false);
        (void)LockAcquire(tag, ExclusiveLock, false, false);
        // The lock_timeout timer can fire after the lock was granted and before
        // ProcSleep turned it off: its cancel is then pending, and would cancel
        // the caller's next statement "due to lock timeout". Taken here, inside
        // the subtransaction, it is the timeout it is (the lock goes back with
        // the subtransaction); a user's cancel or a statement timeout pending
        // here stays the error it is.
        CHECK_FOR_INTERRUPTS();
        AtEOXact_GUC(true, nest_level);
        // Committing the subtransaction hands the lock to the caller's transaction.
        ReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(caller_context);
        CurrentResourceOwner = caller_owner;
        acquired = true;
    }
    PG_CATCH();
    {
        MemoryContextSwitchTo(caller_context);
        ErrorData* error = CopyErrorData();
        FlushErrorState();
        RollbackAndReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(caller_context);
        CurrentResourceOwner = caller_owner;
        // Deadlocks, cancels and statement timeouts stay errors.
        if (error->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE) ReThrowError(error);
        FreeErrorData(error);
    }
    PG_END_TRY();
    return acquired;
}

}  // namespace

KeyLock lock_key(text* principal, text* key, int wait_ms) {
    // Under Citus the lock must be taken where the principal's rows are, the
    // one node every delegated call for the principal runs on.
    require_local_shard(principal);
    KeyLock lock;
    key_locktag(&lock.tag, principal, key);
    if (LockAcquire(&lock.tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
        lock.holder = LockHolder::statement;
    else {
        const TimestampTz started = GetCurrentTimestamp();
        lock.holder = wait_ms > 0 && wait_for_key_lock(&lock.tag, wait_ms) ? LockHolder::transaction
                                                                           : LockHolder::none;
        lock.waited = true;
        lock.waited_us = GetCurrentTimestamp() - started;
    }
    return lock;
}

void unlock_key(const KeyLock& lock) {
    if (lock.holder == LockHolder::none) return;
    ResourceOwner current = CurrentResourceOwner;
    if (lock.holder == LockHolder::transaction) CurrentResourceOwner = CurTransactionResourceOwner;
    LockRelease(&lock.tag, ExclusiveLock, false);
    CurrentResourceOwner = current;
}

}  // namespace idem::pg
