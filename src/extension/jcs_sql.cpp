// SQL entry points for canonical JSON and fingerprints:
//   idempotency.jcs(text), idempotency.jcs(jsonb), idempotency.fingerprint(...)
//
// Every loop here whose length grows with the input can be interrupted: the
// PostgreSQL-side loops call CHECK_FOR_INTERRUPTS() (their frames own nothing
// with a destructor), the C++ computations get an interrupt probe and are run
// through run_interruptible() (see guard.hpp).
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "guard.hpp"
#include "settings.hpp"

extern "C" {
#include "postgres.h"
#include "fmgr.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
}

namespace {

using idem::core::InterruptProbe;
using idem::pg::SqlError;

// How many elements the PostgreSQL-side loops handle between two
// CHECK_FOR_INTERRUPTS() calls.
constexpr std::uint32_t kCheckEvery = 1024;

// Canonicalizes [data, data+size) into a new palloc'd text. Runs entirely in
// the C++ zone; the only PostgreSQL call is palloc_extended with NO_OOM and a
// size checked beforehand, which cannot raise. Returns nullptr with `error`
// filled on failure (error.interrupted when `probe` fired).
text* canonical_text(const char* data, std::size_t size, InterruptProbe probe,
                     SqlError& error) noexcept {
    text* result = nullptr;
    idem::pg::cpp_guard(error, [&] {
        idem::core::CanonicalizeOptions options;
        options.max_depth = static_cast<std::size_t>(idem::pg::max_json_depth);
        options.interrupt = probe;
        std::string out;
        idem::core::JsonError json_error;
        if (!idem::core::canonicalize(std::string_view(data, size), out, json_error, options))
            throw idem::core::JsonException(json_error);
        if (out.size() > MaxAllocSize - VARHDRSZ) throw std::bad_alloc();
        result = static_cast<text*>(palloc_extended(out.size() + VARHDRSZ, MCXT_ALLOC_NO_OOM));
        if (result == nullptr) throw std::bad_alloc();
        SET_VARSIZE(result, out.size() + VARHDRSZ);
        std::memcpy(VARDATA(result), out.data(), out.size());
    });
    return result;
}

struct Slice {
    const char* data;
    int size;
};

// Computes the fingerprint into digest_out (32 bytes) in the C++ zone; false
// with `error` filled on failure (error.interrupted when `probe` fired).
bool fingerprint_into(const Slice& method, const Slice& path, const Slice* body,
                      const Slice* pointers, int pointer_count, InterruptProbe probe,
                      unsigned char* digest_out, SqlError& error) noexcept {
    return idem::pg::cpp_guard(error, [&] {
        idem::core::PointerList exclude;
        std::size_t bytes = 0;  // parsed since the probe was last asked
        for (int i = 0; i < pointer_count; ++i) {
            bytes += static_cast<std::size_t>(pointers[i].size) + 16;
            if (bytes >= idem::core::kPollBytes) {
                bytes = 0;
                idem::core::check_interrupt(probe);
            }
            exclude.add(std::string_view(pointers[i].data, pointers[i].size), probe);
        }
        idem::core::CanonicalizeOptions options;
        options.max_depth = static_cast<std::size_t>(idem::pg::max_json_depth);
        options.interrupt = probe;
        std::optional<std::string_view> body_view;
        if (body != nullptr) body_view = std::string_view(body->data, body->size);
        idem::core::Digest digest = idem::core::fingerprint_excluding(
            std::string_view(method.data, method.size), std::string_view(path.data, path.size),
            body_view, exclude, options);
        std::memcpy(digest_out, digest.data(), digest.size());
    });
}

// Appends the JSON text of a jsonb container to `out`: the tokens
// JsonbToCString writes (strings by escape_json, numerics by numeric_out),
// without its spaces, with CHECK_FOR_INTERRUPTS() at every token
// (JsonbToCString has none). PostgreSQL code only: its errors may longjmp.
void jsonb_to_json(StringInfo out, JsonbContainer* container) {
    JsonbIterator* it = JsonbIteratorInit(container);
    JsonbValue v;
    JsonbIteratorToken token;
    bool comma = false;       // a value was completed: the next one needs a comma
    bool raw_scalar = false;  // a scalar document, which the iterator wraps in an array
    while ((token = JsonbIteratorNext(&it, &v, false)) != WJB_DONE) {
        CHECK_FOR_INTERRUPTS();  // a load and a branch: cheap next to the iterator
        switch (token) {
            case WJB_BEGIN_ARRAY:
                if (v.val.array.rawScalar) {
                    raw_scalar = true;
                    break;
                }
                if (comma) appendStringInfoChar(out, ',');
                appendStringInfoChar(out, '[');
                comma = false;
                break;
            case WJB_BEGIN_OBJECT:
                if (comma) appendStringInfoChar(out, ',');
                appendStringInfoChar(out, '{');
                comma = false;
                break;
            case WJB_END_ARRAY:
                if (!raw_scalar) appendStringInfoChar(out, ']');
                comma = true;
                break;
            case WJB_END_OBJECT:
                appendStringInfoChar(out, '}');
                comma = true;
                break;
            case WJB_KEY:
            case WJB_VALUE:
            case WJB_ELEM:
                if (comma && token != WJB_VALUE) appendStringInfoChar(out, ',');
                switch (v.type) {
                    case jbvNull: appendStringInfoString(out, "null"); break;
                    case jbvBool:
                        appendStringInfoString(out, v.val.boolean ? "true" : "false");
                        break;
                    case jbvString: {
                        char* s = pnstrdup(v.val.string.val, v.val.string.len);
                        escape_json(out, s);
                        pfree(s);
                        break;
                    }
                    case jbvNumeric: {
                        char* s = DatumGetCString(
                            DirectFunctionCall1(numeric_out, NumericGetDatum(v.val.numeric)));
                        appendStringInfoString(out, s);
                        pfree(s);
                        break;
                    }
                    default:
                        elog(ERROR, "unexpected jsonb value type %d", static_cast<int>(v.type));
                }
                if (token == WJB_KEY) {
                    appendStringInfoChar(out, ':');
                    comma = false;
                } else {
                    comma = true;
                }
                break;
            default: break;
        }
    }
}

}  // namespace

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_jcs_text);
}
/// idempotency.jcs(text): the RFC 8785 canonical form of a JSON text.
Datum idempotency_jcs_text(FunctionCallInfo call) {
    return idem::pg::sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        text* document = PG_GETARG_TEXT_PP(0);
        const char* data = VARDATA_ANY(document);
        const std::size_t size = VARSIZE_ANY_EXHDR(document);
        SqlError error;
        text* result = nullptr;
        if (!idem::pg::run_interruptible(error, [&](InterruptProbe probe, SqlError& e) noexcept {
                result = canonical_text(data, size, probe, e);
                return result != nullptr;
            }))
            idem::pg::raise_sql_error(error);
        PG_RETURN_TEXT_P(result);
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_jcs_jsonb);
}
/// idempotency.jcs(jsonb): the canonical form of a jsonb value. jsonb's text form
/// is valid JSON without duplicates, so going through it gives the same bytes as
/// idempotency.jcs(text) for the same document, numerics rounded to doubles.
Datum idempotency_jcs_jsonb(FunctionCallInfo call) {
    return idem::pg::sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        Jsonb* document = PG_GETARG_JSONB_P(0);
        StringInfoData json;
        initStringInfo(&json);
        jsonb_to_json(&json, &document->root);
        SqlError error;
        text* result = nullptr;
        if (!idem::pg::run_interruptible(error, [&](InterruptProbe probe, SqlError& e) noexcept {
                result = canonical_text(json.data, static_cast<std::size_t>(json.len), probe, e);
                return result != nullptr;
            }))
            idem::pg::raise_sql_error(error);
        pfree(json.data);
        PG_RETURN_TEXT_P(result);
    });
}

extern "C" {
PG_FUNCTION_INFO_V1(idempotency_fingerprint);
}
/// idempotency.fingerprint(method, path, body, exclude): 32-byte SHA-256 request digest.
Datum idempotency_fingerprint(FunctionCallInfo call) {
    return idem::pg::sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum {
        if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
            ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                            errmsg("method and path of a fingerprint must not be null")));
        text* method_text = PG_GETARG_TEXT_PP(0);
        text* path_text = PG_GETARG_TEXT_PP(1);
        Slice method{VARDATA_ANY(method_text), static_cast<int>(VARSIZE_ANY_EXHDR(method_text))};
        Slice path{VARDATA_ANY(path_text), static_cast<int>(VARSIZE_ANY_EXHDR(path_text))};
        Slice body_slice{nullptr, 0};
        const Slice* body = nullptr;
        if (!PG_ARGISNULL(2)) {
            bytea* body_bytes = PG_GETARG_BYTEA_PP(2);
            body_slice =
                Slice{VARDATA_ANY(body_bytes), static_cast<int>(VARSIZE_ANY_EXHDR(body_bytes))};
            body = &body_slice;
        }
        Slice* pointers = nullptr;
        int pointer_count = 0;
        if (!PG_ARGISNULL(3)) {
            ArrayType* array = PG_GETARG_ARRAYTYPE_P(3);
            Datum* elements;
            bool* nulls;
            deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elements, &nulls,
                              &pointer_count);
            pointers = static_cast<Slice*>(
                palloc(sizeof(Slice) * (pointer_count > 0 ? pointer_count : 1)));
            for (int i = 0; i < pointer_count; ++i) {
                if (static_cast<std::uint32_t>(i) % kCheckEvery == kCheckEvery - 1)
                    CHECK_FOR_INTERRUPTS();
                if (nulls[i])
                    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                                    errmsg("exclude pointers must not be null")));
                text* pointer = reinterpret_cast<text*>(PG_DETOAST_DATUM_PACKED(elements[i]));
                pointers[i] =
                    Slice{VARDATA_ANY(pointer), static_cast<int>(VARSIZE_ANY_EXHDR(pointer))};
            }
        }
        bytea* result = static_cast<bytea*>(palloc(VARHDRSZ + 32));
        SET_VARSIZE(result, VARHDRSZ + 32);
        SqlError error;
        if (!idem::pg::run_interruptible(error, [&](InterruptProbe probe, SqlError& e) noexcept {
                return fingerprint_into(method, path, body, pointers, pointer_count, probe,
                                        reinterpret_cast<unsigned char*>(VARDATA(result)), e);
            }))
            idem::pg::raise_sql_error(error);
        PG_RETURN_BYTEA_P(result);
    });
}
