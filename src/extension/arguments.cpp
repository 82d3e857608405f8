// Checks of the arguments of the SQL functions. Keys and principals are never
// echoed in messages above DEBUG: they may be secrets.
#include "arguments.hpp"

#include "settings.hpp"

extern "C" {
#include "postgres.h"

#include <limits.h>

#include "access/xact.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
}

namespace idem::pg {

namespace {

[[noreturn]] void invalid(const char* message, const char* detail = nullptr) {
    if (detail != nullptr)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s", message),
                        errdetail("%s", detail)));
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s", message)));
    pg_unreachable();
}

// A key the client sent that the server refuses: 22P02, so that a client can
// answer 400 for exactly these and treat every 22023 as its own bug.
[[noreturn]] void malformed_key(const char* message, const char* detail = nullptr) {
    if (detail != nullptr)
        ereport(ERROR, (errcode(ERRCODE_INVALID_TEXT_REPRESENTATION), errmsg("%s", message),
                        errdetail("%s", detail)));
    ereport(ERROR, (errcode(ERRCODE_INVALID_TEXT_REPRESENTATION), errmsg("%s", message)));
    pg_unreachable();
}

bool is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

void check_action(text* action) {
    if (VARSIZE_ANY_EXHDR(action) == 0) invalid("action must not be empty");
    if (VARSIZE_ANY_EXHDR(action) > 1024) invalid("action must be at most 1024 bytes long");
}

void check_fingerprint(bytea* fingerprint) {
    if (VARSIZE_ANY_EXHDR(fingerprint) != 32)
        invalid("fingerprint must be 32 bytes (SHA-256)",
                "Compute it with idempotency.fingerprint().");
}

namespace {

// Microseconds of an interval (a month counts 30 days), saturated to the int64
// range so that no interval, however extreme, overflows.
int64 interval_usecs(const Interval* span) {
    const __int128 usecs = static_cast<__int128>(span->time) +
                           static_cast<__int128>(span->day) * USECS_PER_DAY +
                           static_cast<__int128>(span->month) * DAYS_PER_MONTH * USECS_PER_DAY;
    if (usecs > PG_INT64_MAX) return PG_INT64_MAX;
    if (usecs < PG_INT64_MIN) return PG_INT64_MIN;
    return static_cast<int64>(usecs);
}

Interval interval_of_usecs(int64 usecs) {
    Interval span;
    memset(&span, 0, sizeof span);
    span.time = usecs;
    return span;
}

int status_argument(FunctionCallInfo fcinfo, int arg) {
    int status = PG_GETARG_INT32(arg);
    check_status(status);
    return status;
}

// An RFC 9110 field name: a token (tchar: ALPHA, DIGIT and !#$%&'*+-.^_`|~).
bool is_token(const char* name, int length) {
    if (length == 0) return false;
    for (int i = 0; i < length; ++i) {
        const unsigned char c = static_cast<unsigned char>(name[i]);
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr("!#$%&'*+-.^_`|~", c) != nullptr) ||
            c == '\0')
            return false;
    }
    return true;
}

// A field value that every client can replay as it was (RFC 9110 5.5: VCHAR,
// SP, HTAB and obs-text). A JSON string holds characters, which the clients
// send as octets the way their servers do (Node's http and WSGI take a header
// value as Latin-1): obs-text is U+0080..U+00FF, in a UTF-8 database the two
// bytes C2 80..C3 BF. Refused: the other C0 controls (CR, LF and NUL split or
// end the line; Node throws on the rest at replay), DEL, and characters above
// U+00FF, which no Latin-1 header can carry. In a database of another encoding
// every byte from 0x80 up counts as obs-text.
bool is_field_value(const char* value, int length) {
    const bool utf8 = GetDatabaseEncoding() == PG_UTF8;
    for (int i = 0; i < length; ++i) {
        const unsigned char c = static_cast<unsigned char>(value[i]);
        if (c == '\t' || (c >= 0x20 && c < 0x7f)) continue;
        if (c < 0x80) return false;  // C0 controls but HTAB, and DEL
        if (!utf8) continue;
        // jsonb holds valid UTF-8: a lead byte C2 or C3 and its continuation
        // byte are U+0080..U+00FF; any other lead byte is above U+00FF.
        if ((c != 0xc2 && c != 0xc3) || i + 1 >= length) return false;
        ++i;
    }
    return true;
}

// The clients' reserved entries of a streamed response's stored headers (docs/http.md):
// the chunk lengths and the marker of a stream too large to keep. Their names start with
// a colon, which no HTTP field name has, so they never collide with a kept header; the
// clients read them and never send them.
bool is_reserved_entry(const char* name, int length) {
    static const char* const reserved[] = {":chunks", ":not_kept"};
    for (const char* entry : reserved)
        if (length == static_cast<int>(strlen(entry)) && memcmp(name, entry, length) == 0)
            return true;
    return false;
}

void check_header(const JsonbValue& name, const JsonbValue& value) {
    if (name.type != jbvString || !(is_token(name.val.string.val, name.val.string.len) ||
                                    is_reserved_entry(name.val.string.val, name.val.string.len)))
        invalid("header names must be RFC 9110 tokens",
                "A name is letters, digits and !#$%&'*+-.^_`|~ (or a client's reserved entry "
                ":chunks or :not_kept).");
    if (value.type != jbvString || !is_field_value(value.val.string.val, value.val.string.len))
        invalid("header values must be RFC 9110 field values",
                "A value is visible ASCII, spaces, tabs and the characters U+0080 to U+00FF: no "
                "other control character and nothing above U+00FF.");
}

void check_headers_argument(FunctionCallInfo fcinfo, int arg) {
    if (argument_given(fcinfo, arg)) check_headers(PG_GETARG_JSONB_P(arg));
}

}  // namespace

void check_status(int status) {
    if (status < 100 || status > 599) invalid("HTTP status must be between 100 and 599");
}

// Headers are a JSON object of name to value, or (to keep their order and
// repeated names such as Set-Cookie and Link) an array of [name, value] pairs.
void check_headers(Jsonb* headers) {
    if (JB_ROOT_IS_SCALAR(headers) || !(JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_ARRAY(headers)))
        invalid(
            "headers must be a JSON object of name to value or an array of [name, value] pairs");
    const bool pairs = JB_ROOT_IS_ARRAY(headers);
    JsonbIterator* it = JsonbIteratorInit(&headers->root);
    JsonbValue token = {};
    JsonbValue name = {};  // set by the WJB_KEY before each WJB_VALUE
    JsonbValue pair[2] = {};
    int depth = 0;
    int in_pair = 0;
    uint32 seen = 0;
    JsonbIteratorToken kind;
    while ((kind = JsonbIteratorNext(&it, &token, false)) != WJB_DONE) {
        if ((++seen & 1023) == 0) CHECK_FOR_INTERRUPTS();
        switch (kind) {
            case WJB_BEGIN_ARRAY:
            case WJB_BEGIN_OBJECT:
                ++depth;
                if (depth == 2 && pairs && kind == WJB_BEGIN_ARRAY) {
                    in_pair = 0;
                    break;
                }
                if (depth > 1)
                    invalid(
                        "headers must be a JSON object of name to value or an array of [name, "
                        "value] pairs");
                break;
            case WJB_END_ARRAY:
            case WJB_END_OBJECT:
                if (depth == 2) {
                    if (in_pair != 2) invalid("each header must be a [name, value] pair");
                    check_header(pair[0], pair[1]);
                }
                --depth;
                break;
            case WJB_KEY: name = token; break;
            case WJB_VALUE: check_header(name, token); break;
            case WJB_ELEM:
                if (depth != 2) invalid("each header must be a [name, value] pair");
                if (in_pair >= 2) invalid("each header must be a [name, value] pair");
                pair[in_pair++] = token;
                break;
            default: break;
        }
    }
}

bool argument_given(FunctionCallInfo fcinfo, int arg) {
    return arg >= 0 && PG_NARGS() > arg && !PG_ARGISNULL(arg);
}

void require_arguments(FunctionCallInfo fcinfo, int count, const char* names) {
    for (int i = 0; i < count; ++i)
        if (PG_ARGISNULL(i))
            ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                            errmsg("%s must not be null", names)));
}

Request request_arguments(FunctionCallInfo fcinfo) {
    require_arguments(fcinfo, 4, "principal, key, action and fingerprint");
    Request request{PG_GETARG_TEXT_PP(0), PG_GETARG_TEXT_PP(1), PG_GETARG_TEXT_PP(2),
                    PG_GETARG_BYTEA_PP(3)};
    check_principal(request.principal);
    check_key(request.key);
    check_action(request.action);
    check_fingerprint(request.fingerprint);
    return request;
}

void check_key(text* key) {
    const char* p = VARDATA_ANY(key);
    const int length = VARSIZE_ANY_EXHDR(key);
    if (length == 0) malformed_key("idempotency key must not be empty");
    if (length > max_key_length)
        ereport(
            ERROR,
            (errcode(ERRCODE_INVALID_TEXT_REPRESENTATION),
             errmsg("idempotency key is %d bytes long, longer than idempotency.max_key_length (%d)",
                    length, max_key_length)));
    const bool utf8 = GetDatabaseEncoding() == PG_UTF8;
    for (int i = 0; i < length; ++i) {
        unsigned char c = static_cast<unsigned char>(p[i]);
        // C0 controls, DEL, and the C1 controls U+0080..U+009F (UTF-8 C2 80..C2 9F).
        const bool c1 =
            utf8 && c == 0xc2 && i + 1 < length && static_cast<unsigned char>(p[i + 1]) < 0xa0;
        if (c < 0x20 || c == 0x7f || c1)
            malformed_key("idempotency key must not contain control characters");
    }
    if (key_format == kKeyFormatAny) return;
    bool ok = length == 36;
    for (int i = 0; ok && i < 36; ++i)
        ok = (i == 8 || i == 13 || i == 18 || i == 23) ? p[i] == '-' : is_hex(p[i]);
    if (!ok)
        malformed_key("idempotency key is not a UUID",
                      "idempotency.key_format requires the form 8-4-4-4-12 hexadecimal digits.");
    // One UUID has one spelling here: upper-case digits are refused rather than
    // folded, since 0.8.0 stored keys as given and a folded lookup would miss
    // such a key and run its request again. A client that upper-cases gets 400
    // every time, never a second run.
    for (int i = 0; i < 36; ++i)
        if (p[i] >= 'A' && p[i] <= 'F')
            malformed_key("idempotency key is not a lower-case UUID",
                          "idempotency.key_format requires lower-case hexadecimal digits, as "
                          "RFC 9562 writes them.");
    if (key_format == kKeyFormatUuidV7 && (p[14] != '7' || strchr("89ab", p[19]) == nullptr))
        malformed_key("idempotency key is not a version 7 UUID",
                      "idempotency.key_format is uuidv7.");
}

// An empty principal is refused: it is what an unauthenticated request turns
// into when an auth layer maps "nobody" to "", and every such request would
// share one key space. Single-tenant applications pass a constant.
void check_principal(text* principal) {
    if (VARSIZE_ANY_EXHDR(principal) == 0)
        invalid("principal must not be empty",
                "Pass the authenticated user, API key or tenant; a constant such as "
                "'default' for a single-tenant application.");
    if (VARSIZE_ANY_EXHDR(principal) > 1024) invalid("principal must be at most 1024 bytes long");
    check_principal_binding(principal);
}

// The role is the session's current role (after SET ROLE): GetOuterUserId()
// is not changed by SECURITY DEFINER functions or by the switch to the
// extension owner around table access.
void check_principal_binding(text* principal) {
    if (principal_binding == kBindingOff) return;
    const char* role = GetUserNameFromId(GetOuterUserId(), false);
    const size_t length = VARSIZE_ANY_EXHDR(principal);
    if (strlen(role) != length || memcmp(role, VARDATA_ANY(principal), length) != 0)
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("principal is not the calling role"),
                        errdetail("idempotency.principal_binding is current_user."),
                        errhint("Connect (or SET ROLE) as the role whose name is the principal.")));
}

// A duration argument, or `default_usecs` when absent; 22023 with `message`
// outside (min_usecs, max_usecs] (min inclusive when `min_inclusive`). The
// one check behind ttl and lease.
Interval duration_argument(FunctionCallInfo fcinfo, int arg, int64 default_usecs, int64 min_usecs,
                           bool min_inclusive, int64 max_usecs, const char* message,
                           const char* detail) {
    if (!argument_given(fcinfo, arg)) return interval_of_usecs(default_usecs);
    Interval span = *PG_GETARG_INTERVAL_P(arg);
    const int64 usecs = interval_usecs(&span);
    if ((min_inclusive ? usecs < min_usecs : usecs <= min_usecs) || usecs > max_usecs)
        invalid(message, detail);
    return span;
}

// Whether now + ttl is after now and at most now + 366 days (the setting's
// own maximum), by PostgreSQL's timestamptz + interval - the arithmetic that
// computes expires_at - with now the transaction's start, as there. A month
// is not 30 days there: '12 mon 6 days' is 371 days, '11 mon 36 days' 370 or
// so. Fields so large that the sum could leave the timestamp range (over
// 10,000 years either way) are refused before it.
static bool ttl_within_limit(const Interval& ttl) {
    constexpr int64 kFieldLimitDays = 3660000;
    if (ttl.month > 120000 || ttl.month < -120000 || ttl.day > kFieldLimitDays ||
        ttl.day < -kFieldLimitDays || ttl.time > kFieldLimitDays * USECS_PER_DAY ||
        ttl.time < -kFieldLimitDays * USECS_PER_DAY)
        return false;
    Interval limit;
    memset(&limit, 0, sizeof limit);
    limit.day = kMaxTtlSeconds / SECS_PER_DAY;
    const Datum now = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
    const TimestampTz expires = DatumGetTimestampTz(DirectFunctionCall2(
        timestamptz_pl_interval, now, IntervalPGetDatum(const_cast<Interval*>(&ttl))));
    const TimestampTz latest = DatumGetTimestampTz(
        DirectFunctionCall2(timestamptz_pl_interval, now, IntervalPGetDatum(&limit)));
    return expires > DatumGetTimestampTz(now) && expires <= latest;
}

void check_grace(const Interval* grace) {
    if (!ttl_within_limit(*grace)) invalid("grace must be more than 0 and at most 366 days");
}

// The ttl: more than 0 and at most 366 days, on the timestamps it gives.
Interval ttl_argument(FunctionCallInfo fcinfo, int arg) {
    if (!argument_given(fcinfo, arg))
        return interval_of_usecs(static_cast<int64>(key_ttl_seconds) * USECS_PER_SEC);
    const Interval ttl = *PG_GETARG_INTERVAL_P(arg);
    if (!ttl_within_limit(ttl)) invalid("ttl must be more than 0 and at most 366 days");
    return ttl;
}

// The lease: the setting's own range. The floor is one a renewer can keep:
// clients renew every third of the lease but never more often than every 50 ms.
Interval lease_argument(FunctionCallInfo fcinfo, int arg) {
    return duration_argument(fcinfo, arg, static_cast<int64>(lease_ms) * 1000,
                             static_cast<int64>(kMinLeaseMs) * 1000, true,
                             static_cast<int64>(kMaxLeaseMs) * 1000,
                             "lease must be between 100 milliseconds and 24 hours",
                             "idempotency.lease has the same range.");
}

int wait_argument(FunctionCallInfo fcinfo, int arg) {
    if (!argument_given(fcinfo, arg)) return wait_timeout_ms;
    int64 usecs = interval_usecs(PG_GETARG_INTERVAL_P(arg));
    if (usecs < 0) invalid("wait must not be negative");
    int64 ms = usecs / 1000 + (usecs % 1000 != 0);
    return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

StoredResponse response_arguments(FunctionCallInfo fcinfo, int status_arg, int body_arg,
                                  int headers_arg, int resource_id_arg, int secret_arg) {
    StoredResponse response{};
    response.status = status_argument(fcinfo, status_arg);
    check_headers_argument(fcinfo, headers_arg);
    response.one_time_secret = argument_given(fcinfo, secret_arg) && PG_GETARG_BOOL(secret_arg);
    response.headers_null = response.one_time_secret || !argument_given(fcinfo, headers_arg);
    response.headers = response.headers_null ? (Datum)0 : PG_GETARG_DATUM(headers_arg);
    response.body_null = response.one_time_secret || !argument_given(fcinfo, body_arg);
    response.body = response.body_null ? (Datum)0 : PG_GETARG_DATUM(body_arg);
    response.resource_id_null = !argument_given(fcinfo, resource_id_arg);
    response.resource_id = response.resource_id_null ? (Datum)0 : PG_GETARG_DATUM(resource_id_arg);
    return response;
}

}  // namespace idem::pg
