// The library against the extension's schema version: the versions it can
// serve, the check made at every entry point, and its cache (see
// schema_version.hpp). pg_extension has a system cache (EXTENSIONOID), so an
// update of its row in any session reaches every backend as an invalidation,
// processed at its next transaction start or lock; the callback then makes
// the next call read the version again.
#include "schema_version.hpp"

extern "C" {
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/syscache.h"
}

namespace idem::pg {

namespace {

// Every release's SQL version up to this library's own, the last one (add
// each release here when its upgrade script is added to extension/).
const char* const kServedVersions[] = {"0.1.0", "0.2.0", "0.3.0", "0.4.0",
                                       "0.5.0", "0.6.0", "0.7.0"};
constexpr int kServedCount = sizeof kServedVersions / sizeof kServedVersions[0];
const char* const kLibraryVersion = kServedVersions[kServedCount - 1];

enum class SchemaState { unchecked, served };
SchemaState state = SchemaState::unchecked;

void forget_version(Datum, int, uint32) { state = SchemaState::unchecked; }

bool served(const char* version) {
    for (const char* known : kServedVersions)
        if (strcmp(known, version) == 0) return true;
    return false;
}

// The installed version of the extension in this database, palloc'd; nullptr
// when the extension is not (or no longer) there.
char* installed_version() {
    const Oid extension = get_extension_oid("idempotency", true);
    if (!OidIsValid(extension)) return nullptr;
    HeapTuple tuple = SearchSysCache1(EXTENSIONOID, ObjectIdGetDatum(extension));
    if (!HeapTupleIsValid(tuple)) return nullptr;
    bool isnull = true;
    const Datum value = SysCacheGetAttr(EXTENSIONOID, tuple, Anum_pg_extension_extversion, &isnull);
    char* version = isnull ? nullptr : TextDatumGetCString(value);
    ReleaseSysCache(tuple);
    return version;
}

}  // namespace

void schema_version_init() { CacheRegisterSyscacheCallback(EXTENSIONOID, forget_version, 0); }

void require_known_schema() {
    if (likely(state == SchemaState::served)) return;
    char* version = installed_version();
    // No extension row: a call while the extension is being dropped, nothing to
    // compare with (and nothing cached, so the next call looks again).
    if (version == nullptr) return;
    if (served(version)) {
        state = SchemaState::served;
        pfree(version);
        return;
    }
    ereport(ERROR,
            (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
             errmsg("the idempotency library of this session (%s) cannot serve the extension's "
                    "schema version %s",
                    kLibraryVersion, version),
             errdetail("This library serves versions %s to %s. The extension was updated "
                       "after this session loaded the library, or the installed library is "
                       "older than the schema.",
                       kServedVersions[0], kLibraryVersion),
             errhint("Reconnect: a new session loads the installed library. If new sessions "
                     "are refused too, install the idempotency package of version %s.",
                     version)));
}

}  // namespace idem::pg
