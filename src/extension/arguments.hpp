// Checks of the arguments of the SQL functions: keys, principals, durations,
// statuses, headers, and the response a call stores.
#pragma once

#include "key_row.hpp"

extern "C" {
#include "postgres.h"

#include "fmgr.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
}

namespace idem::pg {

/// Whether argument `arg` exists in this call (an older SQL definition may
/// pass fewer) and is not NULL.
bool argument_given(FunctionCallInfo fcinfo, int arg);

/// Raises 22004 naming `names` when one of the first `count` arguments is NULL.
void require_arguments(FunctionCallInfo fcinfo, int count, const char* names);

/// Arguments 0-3 (principal, key, action, fingerprint), each checked.
Request request_arguments(FunctionCallInfo fcinfo);

/// 22P02 for a malformed key: empty, too long, control characters, not the
/// idempotency.key_format (uuid and uuidv7: lower-case digits only). Only the client's key gets
/// that SQLSTATE.
void check_key(text* key);

/// 22023 for an empty action or one over 1024 bytes.
void check_action(text* action);

/// 22023 unless the fingerprint is 32 bytes (SHA-256).
void check_fingerprint(bytea* fingerprint);

/// 22023 unless the HTTP status is 100 to 599.
void check_status(int status);

/// 22023 unless the headers are a JSON object of name to value or an array of
/// [name, value] pairs, names RFC 9110 tokens, values RFC 9110 field values
/// (visible ASCII, SP, HTAB, U+0080..U+00FF).
void check_headers(Jsonb* headers);

/// 22023 for an empty or over-long principal; 42501 when
/// idempotency.principal_binding forbids acting for it.
void check_principal(text* principal);

/// 42501 when idempotency.principal_binding = current_user and the principal
/// is not the name of the calling role.
void check_principal_binding(text* principal);

/// The ttl argument, or idempotency.key_ttl when absent; 22023 outside (0, 366 days].
Interval ttl_argument(FunctionCallInfo fcinfo, int arg);

/// 22023 unless an expiry policy's grace is more than 0 and at most 366 days,
/// by the same rule as the ttl (on the timestamps it gives from now).
void check_grace(const Interval* grace);

/// The lease argument, or idempotency.lease when absent; 22023 outside 100 ms to 24 h.
Interval lease_argument(FunctionCallInfo fcinfo, int arg);

/// The wait argument in milliseconds, or idempotency.wait_timeout when absent.
int wait_argument(FunctionCallInfo fcinfo, int arg);

/// The response from the arguments at these positions (-1: the function has
/// no such argument): status 100-599, headers a JSON object.
StoredResponse response_arguments(FunctionCallInfo fcinfo, int status_arg, int body_arg,
                                  int headers_arg, int resource_id_arg, int secret_arg);

}  // namespace idem::pg
