// Module entry: PG_MODULE_MAGIC, _PG_init (settings and the planner hook of
// idempotency.routed, then the cache and
// transaction callbacks - the schema version's among them - and the counters'
// shared memory when preloaded),
// and the one function that turns a captured C++ failure into a PostgreSQL
// error.
#include "counters.hpp"
#include "guard.hpp"
#include "key_store.hpp"
#include "pending.hpp"
#include "routed.hpp"
#include "schema_version.hpp"
#include "settings.hpp"

extern "C" {
#include "postgres.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

PG_MODULE_MAGIC;

void _PG_init(void);
}

namespace idem::pg {

void raise_sql_error(const SqlError& error) {
    ereport(ERROR, (errcode(error.sqlstate), errmsg("%s", error.message)));
    pg_unreachable();
}

}  // namespace idem::pg

extern "C" void _PG_init(void) {
    // Before define_settings() reserves the prefix, which drops unknown placeholders.
    idem::pg::routed_init();
    idem::pg::define_settings();
    idem::pg::key_store_init();
    idem::pg::pending_init();
    idem::pg::schema_version_init();
    // Counters live in shared memory, which only a preloaded library can ask for.
    if (process_shared_preload_libraries_in_progress) idem::pg::counters_init();
}
