// Module entry: PG_MODULE_MAGIC, the configuration parameters, and the one
// function that turns a captured C++ failure into a PostgreSQL error.
#include "guard.hpp"
#include "settings.hpp"

extern "C" {
#include "postgres.h"
#include "fmgr.h"
#include "utils/guc.h"

PG_MODULE_MAGIC;

void _PG_init(void);
}

namespace idem::pg {

int max_json_depth = 1000;

void raise_sql_error(const SqlError& error) {
    ereport(ERROR, (errcode(error.sqlstate), errmsg("%s", error.message)));
    pg_unreachable();
}

}  // namespace idem::pg

extern "C" void _PG_init(void) {
    DefineCustomIntVariable(
        "idempotency.max_json_depth",
        "Deepest nesting of arrays and objects that idempotency.jcs and idempotency.fingerprint accept.",
        "Deeper documents are rejected with SQLSTATE 54000. The parser never recurses, so this "
        "bounds memory and time, not stack use.",
        &idem::pg::max_json_depth, 1000, 1, 1000000, PGC_USERSET, 0, nullptr, nullptr, nullptr);

    idem::pg::protocol_init();

    MarkGUCPrefixReserved("idempotency");
}
