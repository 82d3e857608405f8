// The configuration parameters (GUCs) of the extension: their definitions,
// ranges and descriptions in one table, and what happens to a value that was
// set before the library was loaded.
//
// PostgreSQL keeps `SET idempotency.key_ttl = 'banana'` as an unchecked
// placeholder until the library loads (unless it is preloaded); on load it
// warns and falls back to the default. An idempotency store that silently ran
// with another TTL or other final statuses than the operator set would break
// its promises quietly, so such a value is remembered here and every function
// refuses to run (22023) until the setting gets a valid value. With the
// library in shared_preload_libraries or session_preload_libraries every
// value is checked when it is set, and none of this is needed.
#include "settings.hpp"
#include "statuses.hpp"

#include <cstdlib>

extern "C" {
#include "postgres.h"

#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/memutils.h"
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

// Every setting, in one order: the bit of a setting whose early value was
// invalid is its index here.
// Bits of the settings whose value from before the library was loaded was invalid.
uint32 invalid_early_values = 0;

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

// Clears the mark of a setting that gets a valid value (assign hooks run only
// for values that passed their checks).
template <Setting id>
void assigned(int newval, void* extra) {
    invalid_early_values &= ~(1u << id);
}

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
     &max_json_depth, 1000, 1, 1000000, 0, assigned<kMaxJsonDepth>},
    {kKeyTtl, "idempotency.key_ttl", "How long a key counts after its first use.",
     "Rows older than this behave as absent (unless a lease holds them) and are removed by "
     "cleanup. begin(), "
     "acquire(), save_final() and claim() take a per-call ttl that overrides it.",
     &key_ttl_seconds, 86400, 1, kMaxTtlSeconds, GUC_UNIT_S, assigned<kKeyTtl>},
    {kWaitTimeout, "idempotency.wait_timeout",
     "How long begin() waits for another transaction that holds the same key.",
     "When it runs out, begin() returns in_progress and the caller's transaction stays usable.",
     &wait_timeout_ms, 5000, 0, 3600 * 1000, GUC_UNIT_MS, assigned<kWaitTimeout>},
    {kMaxKeyLength, "idempotency.max_key_length", "Longest idempotency key accepted, in bytes.",
     nullptr, &max_key_length, 255, 1, 1024, 0, assigned<kMaxKeyLength>},
    {kLease, "idempotency.lease", "Default lease of idempotency.acquire() and renew().",
     "A lease-held key counts as in progress until the lease runs out; then another acquire() may "
     "take it over "
     "with a higher fence. Clients renew every third of it, at most every 50 ms.",
     &lease_ms, 30000, kMinLeaseMs, kMaxLeaseMs, GUC_UNIT_MS, assigned<kLease>},
    {kCleanupBatchSize, "idempotency.cleanup_batch_size",
     "Rows idempotency.cleanup() deletes per batch (one transaction each).",
     "Larger batches delete faster; smaller ones hold fewer row locks and less WAL per commit.",
     &cleanup_batch_size, 1000, 1, 1000000, 0, assigned<kCleanupBatchSize>},
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
    invalid_early_values &= ~(1u << kFinalStatuses);
}

bool valid_enum(const config_enum_entry* options, const char* value) {
    for (const config_enum_entry* option = options; option->name != nullptr; ++option)
        if (pg_strcasecmp(option->name, value) == 0) return true;
    return false;
}

// Whether a value set before the library was loaded would have been accepted.
bool valid_early_value(Setting id, const char* value) {
    for (const IntSetting& setting : int_settings) {
        if (setting.id != id) continue;
        int parsed;
        return parse_int(value, &parsed, setting.flags, nullptr) && parsed >= setting.min &&
               parsed <= setting.max;
    }
    if (id == kKeyFormat) return valid_enum(key_format_options, value);
    if (id == kPrincipalBinding) return valid_enum(principal_binding_options, value);
    if (id == kDistributed) return valid_enum(distributed_options, value);
    idem::core::StatusTable table;
    return idem::core::parse_status_list(value, table);
}

}  // namespace

bool is_final_status(int status) {
    if (status < 100 || status > 599 || final_status_table == nullptr) return false;
    return (*final_status_table)[static_cast<std::size_t>(status - 100)];
}

void define_settings() {
    // The placeholders' values, taken before the definitions below replace them.
    char* early[kSettingCount];
    for (int i = 0; i < kSettingCount; ++i) {
        const char* value = GetConfigOption(setting_names[i], true, false);
        early[i] = value == nullptr ? nullptr : MemoryContextStrdup(TopMemoryContext, value);
    }

    for (const IntSetting& s : int_settings)
        DefineCustomIntVariable(s.name, s.short_desc, s.long_desc, s.variable, s.boot, s.min, s.max,
                                PGC_USERSET, s.flags, nullptr, s.assign, nullptr);
    DefineCustomEnumVariable(
        "idempotency.key_format", "Which idempotency keys are accepted: any, uuid or uuidv7.",
        "any accepts 1 to max_key_length bytes without control characters.", &key_format,
        kKeyFormatAny, key_format_options, PGC_USERSET, 0, nullptr, assigned<kKeyFormat>, nullptr);
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
        &principal_binding, kBindingOff, principal_binding_options, PGC_SUSET, 0, nullptr,
        assigned<kPrincipalBinding>, nullptr);
    DefineCustomEnumVariable(
        "idempotency.distributed",
        "How the protocol reads and writes idempotency.keys: auto or on.",
        "on: by SQL statements only, which Citus routes to the shard of the principal (the "
        "distributed mode). auto: so where Citus distributes idempotency.keys, and directly "
        "through the heap and the primary key of a local table otherwise.",
        &distributed, kDistributedAuto, distributed_options, PGC_USERSET, 0, nullptr,
        assigned<kDistributed>, nullptr);
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
        if (early[i] == nullptr) continue;
        if (!valid_early_value(static_cast<Setting>(i), early[i])) invalid_early_values |= 1u << i;
        pfree(early[i]);
    }
}

void require_valid_settings() {
    if (likely(invalid_early_values == 0)) return;
    for (int i = 0; i < kSettingCount; ++i)
        if (invalid_early_values & (1u << i))
            ereport(
                ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                 errmsg("%s was set to an invalid value before the idempotency library was loaded",
                        setting_names[i]),
                 errdetail(
                     "PostgreSQL could not check the value then and fell back to the default; "
                     "idempotency refuses to run with a setting other than the one you chose."),
                 errhint(
                     "Set a valid value (SET, ALTER ROLE ... SET, postgresql.conf), and add "
                     "idempotency "
                     "to shared_preload_libraries or session_preload_libraries so that values are "
                     "checked when they are set.")));
}

}  // namespace idem::pg
