// The configuration parameters (GUCs) of the extension: their definitions,
// ranges and descriptions in one table, and what happens to a value that was
// set before the library was loaded.
//
// Without preload, PostgreSQL keeps `SET idempotency.key_ttl = 'banana'` (and
// startup options, ALTER ROLE/DATABASE values, SET LOCAL, function SET
// clauses) as unchecked placeholders; when the library loads, the definitions
// below re-apply each level of each placeholder with the role and context
// that set it. A level that fails (an invalid value, or a superuser-only
// setting such as principal_binding set by a role that may not set it) is
// dropped with a WARNING, and the setting silently falls back to the level
// below, often the built-in default. An idempotency store that ran with a TTL
// nobody chose, or with principal_binding off because the bound role said so
// in PGOPTIONS, would break its promises quietly. So the placeholder's levels
// are recorded before the definitions and compared with what PostgreSQL made
// of them (sources, roles, contexts, the stack of SET LOCAL and function SET
// levels): any difference means a value was dropped, and every function
// refuses (42501 for principal_binding, 22023 for the others) while the value
// in effect may be one nobody allowed:
//  - a dropped reset-level value (startup option, options=, ALTER ROLE or
//    ALTER DATABASE value, configuration file): whenever the value in effect is
//    the reset value, so RESET and DISCARD ALL bring the refusal back;
//  - a dropped value at any level: until a value is SET at session level
//    (plain SET or set_config(..., false), which for principal_binding only a
//    superuser can do) and the transaction that loaded the library is over;
//    SET LOCAL, a function's SET clause and a rolled-back SET do not lift it.
// The comparison reads PostgreSQL's own record of the settings
// (utils/guc_tables.h) instead of re-implementing its privilege rules, so any
// reason for a drop is caught; the per-call check reads only a cached record
// pointer, and only after a drop. With the library in shared_preload_libraries
// nothing is a placeholder: a bad value is refused when it is set (a startup
// option by a role that may not set it refuses the connection).
#include "settings.hpp"
#include "statuses.hpp"

#include <cstdlib>

extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/guc_tables.h"
}

#include "compat.hpp"  // PostgreSQL 15 / 16-17 / 18 differences

namespace idem::pg {

int max_json_depth = 1000;
int key_ttl_seconds = 86400;
int wait_timeout_ms = 5000;
int max_key_length = 255;
int key_format = kKeyFormatAny;
int lease_ms = 30000;
int cleanup_batch_size = 1000;
int principal_binding = kBindingOff;
int max_actions = 1000;
int distributed = kDistributedAuto;

namespace {

char* final_statuses_setting = nullptr;
// Parsed form of idempotency.final_statuses.
const idem::core::StatusTable* final_status_table = nullptr;

const struct config_enum_entry key_format_options[] = {
    {"any", kKeyFormatAny, false},
    {"uuid", kKeyFormatUuid, false},
    {"uuidv7", kKeyFormatUuidV7, false},
    {nullptr, 0, false},
};

const struct config_enum_entry distributed_options[] = {
    {"auto", kDistributedAuto, false},
    {"on", kDistributedOn, false},
    {nullptr, 0, false},
};

const struct config_enum_entry principal_binding_options[] = {
    {"off", kBindingOff, false},
    {"current_user", kBindingCurrentUser, false},
    {nullptr, 0, false},
};

// Every setting, in one order: a setting's bit in the masks below is its index here.
enum Setting {
    kMaxJsonDepth,
    kKeyTtl,
    kWaitTimeout,
    kMaxKeyLength,
    kLease,
    kCleanupBatchSize,
    kKeyFormat,
    kFinalStatuses,
    kPrincipalBinding,
    kDistributed,
    kSettingCount
};

struct IntSetting {
    Setting id;
    const char* name;
    const char* short_desc;
    const char* long_desc;
    int* variable;
    int boot;
    int min;
    int max;
    int flags;
    GucIntAssignHook assign;
};

const IntSetting int_settings[] = {
    {kMaxJsonDepth, "idempotency.max_json_depth",
     "Deepest nesting of arrays and objects that idempotency.jcs and idempotency.fingerprint "
     "accept.",
     "Deeper documents are rejected with SQLSTATE 54000. The parser never recurses, so this bounds "
     "memory and "
     "time, not stack use.",
     &max_json_depth, 1000, 1, 1000000, 0, nullptr},
    {kKeyTtl, "idempotency.key_ttl", "How long a key counts after its first use.",
     "Rows older than this behave as absent (unless a lease holds them) and are removed by "
     "cleanup. begin(), "
     "acquire(), save_final() and claim() take a per-call ttl that overrides it.",
     &key_ttl_seconds, 86400, 1, kMaxTtlSeconds, GUC_UNIT_S, nullptr},
    {kWaitTimeout, "idempotency.wait_timeout",
     "How long begin() waits for another transaction that holds the same key.",
     "When it runs out, begin() returns in_progress and the caller's transaction stays usable.",
     &wait_timeout_ms, 5000, 0, 3600 * 1000, GUC_UNIT_MS, nullptr},
    {kMaxKeyLength, "idempotency.max_key_length", "Longest idempotency key accepted, in bytes.",
     nullptr, &max_key_length, 255, 1, 1024, 0, nullptr},
    {kLease, "idempotency.lease", "Default lease of idempotency.acquire() and renew().",
     "A lease-held key counts as in progress until the lease runs out; then another acquire() may "
     "take it over "
     "with a higher fence. Clients renew every third of it, at most every 50 ms.",
     &lease_ms, 30000, kMinLeaseMs, kMaxLeaseMs, GUC_UNIT_MS, nullptr},
    {kCleanupBatchSize, "idempotency.cleanup_batch_size",
     "Rows idempotency.cleanup() deletes per batch (one transaction each).",
     "Larger batches delete faster; smaller ones hold fewer row locks and less WAL per commit.",
     &cleanup_batch_size, 1000, 1, 1000000, 0, nullptr},
};

const char* const setting_names[kSettingCount] = {
    "idempotency.max_json_depth", "idempotency.key_ttl",        "idempotency.wait_timeout",
    "idempotency.max_key_length", "idempotency.lease",          "idempotency.cleanup_batch_size",
    "idempotency.key_format",     "idempotency.final_statuses", "idempotency.principal_binding",
    "idempotency.distributed",
};

bool check_final_statuses(char** newval, void** extra, GucSource source) {
    // GUC "extra" data is freed by the GUC machinery (malloc'd up to 15, guc_malloc'd since 16).
    auto* table = static_cast<idem::core::StatusTable*>(
        compat::guc_extra_alloc(sizeof(idem::core::StatusTable)));
    if (table == nullptr) return false;
    if (!idem::core::parse_status_list(*newval, *table)) {
        compat::guc_extra_free(table);
        GUC_check_errdetail(
            "Use a comma-separated list of status codes (409) and classes (2xx), 100 to 599.");
        return false;
    }
    *extra = table;
    return true;
}

void assign_final_statuses(const char* newval, void* extra) {
    final_status_table = static_cast<const idem::core::StatusTable*>(extra);
}

// One level of a setting as PostgreSQL recorded it: who set the value, in
// which context, from which source (and for a stack entry, what kind of SET
// made it and at which nesting level).
struct Level {
    int state;
    int nest_level;
    GucSource source;
    GucContext scontext;
    Oid srole;
    GucContext masked_scontext;
    Oid masked_srole;
};

// Levels kept per setting; a deeper stack (functions with SET clauses nested
// more than this when the library loads) counts as a drop: fail closed.
constexpr int kMaxLevels = 32;

// A setting's record, reduced to what a drop changes: the reset level, the
// current level and the stack of SET LOCAL / SET / function SET levels.
struct Levels {
    bool present = false;
    bool too_deep = false;
    Level reset{};
    Level current{};
    int depth = 0;
    Level stack[kMaxLevels];
};

// The cached records of the settings (they never move once defined).
config_generic* records[kSettingCount];
// Settings whose reset-level value was dropped when the library loaded.
uint32 dropped_reset_values = 0;
// Settings with a dropped value not yet replaced by a session-level SET.
uint32 unverified_settings = 0;
// Whether the transaction in which the library was loaded (and whose SET
// LOCAL and function SET levels were re-applied) has ended.
bool load_transaction_over = true;

Levels levels_of(const config_generic* record) {
    Levels levels;
    if (record == nullptr) return levels;
    levels.present = true;
    levels.reset = {0,
                    0,
                    record->reset_source,
                    record->reset_scontext,
                    record->reset_srole,
                    PGC_INTERNAL,
                    InvalidOid};
    levels.current = {0,         0, record->source, record->scontext, record->srole, PGC_INTERNAL,
                      InvalidOid};
    for (const GucStack* entry = record->stack; entry != nullptr; entry = entry->prev) {
        if (levels.depth == kMaxLevels) {
            levels.too_deep = true;
            break;
        }
        const bool masked = entry->state == GUC_SET_LOCAL;
        levels.stack[levels.depth++] = {entry->state,
                                        entry->nest_level,
                                        entry->source,
                                        entry->scontext,
                                        entry->srole,
                                        masked ? entry->masked_scontext : PGC_INTERNAL,
                                        masked ? entry->masked_srole : InvalidOid};
    }
    return levels;
}

// A default-sourced value has no setter (a placeholder leaves role and context
// unset there, a definition says the bootstrap superuser): compare the rest.
bool same_level(const Level& a, const Level& b) {
    if (a.state != b.state || a.nest_level != b.nest_level || a.source != b.source) return false;
    if (a.source == PGC_S_DEFAULT) return true;
    return a.scontext == b.scontext && a.srole == b.srole &&
           a.masked_scontext == b.masked_scontext && a.masked_srole == b.masked_srole;
}

// Compares a placeholder's levels with the defined setting's and records a drop.
void note_drops(Setting id, const Levels& placeholder, const Levels& defined) {
    if (!placeholder.present) return;
    const uint32 bit = 1u << id;
    if (!defined.present || placeholder.too_deep || defined.too_deep) {
        dropped_reset_values |= bit;
        unverified_settings |= bit;
        return;
    }
    if (placeholder.reset.source != PGC_S_DEFAULT && !same_level(placeholder.reset, defined.reset))
        dropped_reset_values |= bit;
    bool same =
        placeholder.depth == defined.depth && same_level(placeholder.current, defined.current);
    for (int i = 0; same && i < placeholder.depth; ++i)
        same = same_level(placeholder.stack[i], defined.stack[i]);
    if (!same || (dropped_reset_values & bit)) unverified_settings |= bit;
}

void end_of_load_transaction(XactEvent event, void* arg) {
    if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT || event == XACT_EVENT_PREPARE ||
        event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT)
        load_transaction_over = true;
}

// Whether setting `id` may still be in effect with a value other than the one
// set for it (see the top of this file). Clears its session-level mark once a
// session-level SET has replaced the dropped value.
bool unverified(Setting id) {
    const uint32 bit = 1u << id;
    const config_generic* record = records[id];
    if (record == nullptr) return true;
    if ((dropped_reset_values & bit) && record->source == record->reset_source &&
        record->scontext == record->reset_scontext && record->srole == record->reset_srole)
        return true;
    if (!(unverified_settings & bit)) return false;
    if (load_transaction_over && record->stack == nullptr && record->source == PGC_S_SESSION) {
        unverified_settings &= ~bit;
        return false;
    }
    return true;
}

[[noreturn]] void refuse_binding() {
    ereport(ERROR,
            (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
             errmsg("idempotency.principal_binding is not one a superuser set"),
             errdetail("A value for it set before the idempotency library was loaded could not "
                       "be applied (set by a role that may not set it, or invalid), so the "
                       "binding in effect may not be the one configured."),
             errhint("Reconnect without setting idempotency.principal_binding (PGOPTIONS, "
                     "options= in the connection string, SET before the first call), or have a "
                     "superuser SET it in this session. With idempotency in "
                     "shared_preload_libraries such a value is refused when it is set.")));
    pg_unreachable();
}

[[noreturn]] void refuse_setting(Setting id) {
    ereport(ERROR,
            (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
             errmsg("%s was set to a value that could not be applied when the idempotency "
                    "library was loaded",
                    setting_names[id]),
             errdetail("PostgreSQL could not check the value before and fell back to another; "
                       "idempotency refuses to run with a setting other than the one you chose."),
             errhint("SET a valid value in this session (SET LOCAL, a function's SET clause, "
                     "RESET and DISCARD ALL do not lift this), or fix it where it was set and "
                     "reconnect; add idempotency to shared_preload_libraries or "
                     "session_preload_libraries so that values are checked when they are set.")));
    pg_unreachable();
}

// The slow path of require_valid_settings(), taken only after a drop.
void refuse_unverified_settings() {
    if ((dropped_reset_values | unverified_settings) & (1u << kPrincipalBinding) &&
        unverified(kPrincipalBinding))
        refuse_binding();
    for (int i = 0; i < kSettingCount; ++i)
        if (((dropped_reset_values | unverified_settings) & (1u << i)) &&
            unverified(static_cast<Setting>(i)))
            refuse_setting(static_cast<Setting>(i));
}
}  // namespace

bool is_final_status(int status) {
    if (status < 100 || status > 599 || final_status_table == nullptr) return false;
    return (*final_status_table)[static_cast<std::size_t>(status - 100)];
}

void define_settings() {
    // The placeholders' levels, taken before the definitions below replace them.
    Levels placeholders[kSettingCount];
    for (int i = 0; i < kSettingCount; ++i)
        placeholders[i] = levels_of(compat::find_guc_record(setting_names[i]));

    for (const IntSetting& s : int_settings)
        DefineCustomIntVariable(s.name, s.short_desc, s.long_desc, s.variable, s.boot, s.min, s.max,
                                PGC_USERSET, s.flags, nullptr, s.assign, nullptr);
    DefineCustomEnumVariable(
        "idempotency.key_format", "Which idempotency keys are accepted: any, uuid or uuidv7.",
        "any accepts 1 to max_key_length bytes without control characters.", &key_format,
        kKeyFormatAny, key_format_options, PGC_USERSET, 0, nullptr, nullptr, nullptr);
    DefineCustomStringVariable(
        "idempotency.final_statuses", "HTTP statuses whose responses are stored and replayed.",
        "A comma-separated list of codes (409) and classes (2xx). Others (401, 429, 5xx by "
        "default) are not stored, so a retry runs again.",
        &final_statuses_setting, "2xx,400,403,404,409,410,412,413,415,422", PGC_USERSET, 0,
        check_final_statuses, assign_final_statuses, nullptr);
    DefineCustomEnumVariable(
        "idempotency.principal_binding",
        "Whether a role may act only for the principal that is its own name: off or "
        "current_user.",
        "Set by a superuser (postgresql.conf, ALTER ROLE ... SET, ALTER DATABASE ... SET). "
        "Under current_user every function refuses (42501) any other principal.",
        &principal_binding, kBindingOff, principal_binding_options, PGC_SUSET, 0, nullptr, nullptr,
        nullptr);
    DefineCustomEnumVariable(
        "idempotency.distributed",
        "How the protocol reads and writes idempotency.keys: auto or on.",
        "on: by SQL statements only, which Citus routes to the shard of the principal (the "
        "distributed mode). auto: so where Citus distributes idempotency.keys (but for the "
        "lookup and a new key's insert on the node that holds the principal's shard, which use "
        "the shard's table directly), and directly through the heap and the primary key of a "
        "local table otherwise.",
        &distributed, kDistributedAuto, distributed_options, PGC_USERSET, 0, nullptr, nullptr,
        nullptr);
    // A server-start setting can only be defined while the library is preloaded.
    if (process_shared_preload_libraries_in_progress)
        DefineCustomIntVariable(
            "idempotency.max_actions",
            "How many actions idempotency.stats counts each under its own name.",
            "Per server, across databases; calls of further actions are counted under "
            "'(other)'. Takes effect at server start (the counters need idempotency in "
            "shared_preload_libraries).",
            &max_actions, 1000, 1, 100000, PGC_POSTMASTER, 0, nullptr, nullptr, nullptr);
    MarkGUCPrefixReserved("idempotency");

    for (int i = 0; i < kSettingCount; ++i) {
        records[i] = compat::find_guc_record(setting_names[i]);
        note_drops(static_cast<Setting>(i), placeholders[i], levels_of(records[i]));
    }
    // Stack levels exist only inside the transaction that loads the library
    // (none at all when session_preload_libraries loads it at connection).
    if (unverified_settings != 0 && IsTransactionState()) {
        load_transaction_over = false;
        RegisterXactCallback(end_of_load_transaction, nullptr);
    }
}

void require_valid_settings() {
    if (likely((dropped_reset_values | unverified_settings) == 0)) return;
    refuse_unverified_settings();
}

}  // namespace idem::pg
