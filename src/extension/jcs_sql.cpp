// SQL entry points for canonical JSON and fingerprints:
//   idempotency.jcs(text), idempotency.jcs(jsonb), idempotency.fingerprint(...)
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
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

PG_FUNCTION_INFO_V1(idempotency_jcs_text);
PG_FUNCTION_INFO_V1(idempotency_jcs_jsonb);
PG_FUNCTION_INFO_V1(idempotency_fingerprint);
}

namespace {

using idem::pg::SqlError;

// Canonicalizes [data, data+size) into a new palloc'd text. Runs entirely in
// the C++ zone; the only PostgreSQL call is palloc_extended with NO_OOM and a
// size checked beforehand, which cannot raise.
text* canonical_text(const char* data, std::size_t size, SqlError& error) noexcept {
    text* result = nullptr;
    idem::pg::cpp_guard(error, [&] {
        idem::core::CanonicalizeOptions options;
        options.max_depth = static_cast<std::size_t>(idem::pg::max_json_depth);
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

bool fingerprint_into(const Slice& method, const Slice& path, const Slice* body, const Slice* pointers,
                      int pointer_count, unsigned char* digest_out, SqlError& error) noexcept {
    return idem::pg::cpp_guard(error, [&] {
        std::vector<idem::core::JsonPointer> exclude;
        exclude.reserve(static_cast<std::size_t>(pointer_count));
        for (int i = 0; i < pointer_count; ++i)
            exclude.push_back(idem::core::JsonPointer::parse(std::string_view(pointers[i].data, pointers[i].size)));
        idem::core::CanonicalizeOptions options;
        options.max_depth = static_cast<std::size_t>(idem::pg::max_json_depth);
        std::optional<std::string_view> body_view;
        if (body != nullptr) body_view = std::string_view(body->data, body->size);
        idem::core::Digest digest = idem::core::fingerprint(std::string_view(method.data, method.size),
                                                            std::string_view(path.data, path.size), body_view,
                                                            exclude, options);
        std::memcpy(digest_out, digest.data(), digest.size());
    });
}

}  // namespace

extern "C" {

/// idempotency.jcs(text): the RFC 8785 canonical form of a JSON text.
Datum idempotency_jcs_text(PG_FUNCTION_ARGS) {
    text* document = PG_GETARG_TEXT_PP(0);
    SqlError error;
    text* result = canonical_text(VARDATA_ANY(document), VARSIZE_ANY_EXHDR(document), error);
    if (result == nullptr) idem::pg::raise_sql_error(error);
    PG_RETURN_TEXT_P(result);
}

/// idempotency.jcs(jsonb): the canonical form of a jsonb value. jsonb's text form
/// is valid JSON without duplicates, so going through it gives the same bytes as
/// idempotency.jcs(text) for the same document, numerics rounded to doubles.
Datum idempotency_jcs_jsonb(PG_FUNCTION_ARGS) {
    Jsonb* document = PG_GETARG_JSONB_P(0);
    char* json = JsonbToCString(nullptr, &document->root, VARSIZE(document));
    SqlError error;
    text* result = canonical_text(json, std::strlen(json), error);
    pfree(json);
    if (result == nullptr) idem::pg::raise_sql_error(error);
    PG_RETURN_TEXT_P(result);
}

/// idempotency.fingerprint(method, path, body, exclude): 32-byte SHA-256 request digest.
Datum idempotency_fingerprint(PG_FUNCTION_ARGS) {
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
        body_slice = Slice{VARDATA_ANY(body_bytes), static_cast<int>(VARSIZE_ANY_EXHDR(body_bytes))};
        body = &body_slice;
    }
    Slice* pointers = nullptr;
    int pointer_count = 0;
    if (!PG_ARGISNULL(3)) {
        ArrayType* array = PG_GETARG_ARRAYTYPE_P(3);
        Datum* elements;
        bool* nulls;
        deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elements, &nulls, &pointer_count);
        pointers = static_cast<Slice*>(palloc(sizeof(Slice) * (pointer_count > 0 ? pointer_count : 1)));
        for (int i = 0; i < pointer_count; ++i) {
            if (nulls[i])
                ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                                errmsg("exclude pointers must not be null")));
            text* pointer = reinterpret_cast<text*>(PG_DETOAST_DATUM_PACKED(elements[i]));
            pointers[i] = Slice{VARDATA_ANY(pointer), static_cast<int>(VARSIZE_ANY_EXHDR(pointer))};
        }
    }
    bytea* result = static_cast<bytea*>(palloc(VARHDRSZ + 32));
    SET_VARSIZE(result, VARHDRSZ + 32);
    SqlError error;
    if (!fingerprint_into(method, path, body, pointers, pointer_count,
                          reinterpret_cast<unsigned char*>(VARDATA(result)), error))
        idem::pg::raise_sql_error(error);
    PG_RETURN_BYTEA_P(result);
}

}  // extern "C"
