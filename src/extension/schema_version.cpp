// The library against the extension's schema version: the versions it can
// serve, the check made at every entry point, and its cache (see
// schema_version.hpp). pg_extension has a system cache (EXTENSIONOID), so an
// update of its row in any session reaches every backend as an invalidation,
// processed at its next transaction start or lock; the callback then makes
// the next call read the version again.
#include "schema_version.hpp"

extern "C" {
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/syscache.h"
}

#include <cstdlib>

namespace idem::pg {

namespace {

// Every release's SQL version up to this library's own, the last one (add
// each release here when its upgrade script is added to extension/).
const char* const kServedVersions[] = {"0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0",
                                       "0.6.0", "0.7.0", "0.8.0", "0.9.0"};
constexpr int kServedCount = sizeof kServedVersions / sizeof kServedVersions[0];
const char* const kLibraryVersion = kServedVersions[kServedCount - 1];

enum class SchemaState { unchecked, served };
SchemaState state = SchemaState::unchecked;
int served_index = -1;  // the schema's place in kServedVersions, while state is served

void forget_version(Datum, int, uint32) { state = SchemaState::unchecked; }

// The place of `version` in kServedVersions, or -1.
int served(const char* version) {
    for (int i = 0; i < kServedCount; ++i)
        if (strcmp(kServedVersions[i], version) == 0) return i;
    return -1;
}

// The installed version of the extension in this database, palloc'd; nullptr
// when the extension is not (or no longer) there. Read by an index scan, not
// through EXTENSIONOID, which a server older than this build may lack (see
// schema_version_init); it runs once per session and after invalidations.
char* installed_version() {
    const Oid extension = get_extension_oid("idempotency", true);
    if (!OidIsValid(extension)) return nullptr;
    Relation catalog = table_open(ExtensionRelationId, AccessShareLock);
    ScanKeyData key;
    ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
                ObjectIdGetDatum(extension));
    SysScanDesc scan = systable_beginscan(catalog, ExtensionOidIndexId, true, nullptr, 1, &key);
    char* version = nullptr;
    HeapTuple tuple = systable_getnext(scan);
    if (HeapTupleIsValid(tuple)) {
        bool isnull = true;
        const Datum value =
            heap_getattr(tuple, Anum_pg_extension_extversion, RelationGetDescr(catalog), &isnull);
        if (!isnull) version = TextDatumGetCString(value);
    }
    systable_endscan(scan);
    table_close(catalog, AccessShareLock);
    return version;
}

}  // namespace

// pg_extension got a system cache (EXTENSIONOID, appended to the list to keep
// the ABI) in the minor releases of 2025; a server older than the headers of
// this build may lack it, and a callback on a cache the server does not have
// is FATAL. There, a change of any function (PROCOID) stands in: every upgrade
// script replaces functions, and a spurious forget costs one index scan.
void schema_version_init() {
    const char* running = GetConfigOption("server_version_num", false, false);
    const bool has_extension_cache = running != nullptr && atoi(running) >= PG_VERSION_NUM;
    CacheRegisterSyscacheCallback(has_extension_cache ? EXTENSIONOID : PROCOID, forget_version, 0);
}

void require_known_schema() {
    if (likely(state == SchemaState::served)) return;
    char* version = installed_version();
    // No extension row: a call while the extension is being dropped, nothing to
    // compare with (and nothing cached, so the next call looks again).
    if (version == nullptr) return;
    served_index = served(version);
    if (served_index >= 0) {
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

// Reads the version when the cache was forgotten (an ALTER EXTENSION in this
// session or another); while the extension is being dropped there is no
// version, and the oldest behaviour is the one to keep.
bool schema_at_least(const char* version) {
    require_known_schema();
    const int wanted = served(version);
    return state == SchemaState::served && wanted >= 0 && served_index >= wanted;
}

}  // namespace idem::pg
