// The boundary between C++ and PostgreSQL.
//
// No C++ exception may unwind into PostgreSQL, and no PostgreSQL error
// (a longjmp) may unwind through a C++ frame that owns a destructor. So every
// SQL entry point that runs C++ code does it through cpp_guard(): the C++ body
// runs inside try/catch, a failure is copied into a fixed buffer (no
// allocation, so nothing inside the catch block can longjmp), and the caller
// raises the PostgreSQL error with raise_sql_error() after the C++ frames are
// gone.
#pragma once

#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>

#include "fingerprint.hpp"
#include "jcs.hpp"
#include "settings.hpp"

extern "C" {
#include "postgres.h"
#include "fmgr.h"
#include "utils/elog.h"
}

namespace idem::pg {

/// A failure captured inside the C++ zone, raised later as a PostgreSQL error.
struct SqlError {
    int sqlstate = 0;
    char message[512] = {0};
};

/// The SQLSTATE for a canonicalization failure: 22P02 for text that is not
/// JSON, 22032 for JSON that RFC 8785 cannot canonicalize, 54000 for limits.
inline int json_sqlstate(idem::core::JsonErrc code) {
    switch (code) {
        case idem::core::JsonErrc::syntax:
        case idem::core::JsonErrc::invalid_utf8: return ERRCODE_INVALID_TEXT_REPRESENTATION;
        case idem::core::JsonErrc::too_deep:
        case idem::core::JsonErrc::too_large: return ERRCODE_PROGRAM_LIMIT_EXCEEDED;
        default: return ERRCODE_INVALID_JSON_TEXT;
    }
}

/// Copies prefix and text into the fixed buffer, truncating; never allocates.
inline void set_message(SqlError& error, const char* prefix, const char* text) noexcept {
    std::size_t used = 0;
    for (const char* part : {prefix, text})
        for (const char* c = part; *c != '\0' && used + 1 < sizeof error.message; ++c) error.message[used++] = *c;
    error.message[used] = '\0';
}

/// Runs body(); returns true on success, false with `error` filled on any exception.
template <typename Body>
bool cpp_guard(SqlError& error, Body&& body) noexcept {
    try {
        body();
        return true;
    } catch (const idem::core::JsonException& e) {
        error.sqlstate = json_sqlstate(e.error().code);
        set_message(error, "", e.what());
    } catch (const std::invalid_argument& e) {
        error.sqlstate = ERRCODE_INVALID_PARAMETER_VALUE;
        set_message(error, "", e.what());
    } catch (const std::bad_alloc&) {
        error.sqlstate = ERRCODE_OUT_OF_MEMORY;
        set_message(error, "", "out of memory");
    } catch (const std::exception& e) {
        error.sqlstate = ERRCODE_INTERNAL_ERROR;
        set_message(error, "internal error: ", e.what());
    } catch (...) {
        error.sqlstate = ERRCODE_INTERNAL_ERROR;
        set_message(error, "internal error: ", "unknown exception");
    }
    return false;
}

/// Raises the captured error. Call only where no C++ object with a destructor is alive.
[[noreturn]] void raise_sql_error(const SqlError& error);

/// The one way into the extension from SQL: refuses to run with a setting that
/// fell back to its default (require_valid_settings), then runs the body inside
/// the C++ guard and raises a C++ failure as a PostgreSQL error once the C++
/// frames are gone. A PostgreSQL error raised by the body passes through: no
/// object with a destructor lives in these frames.
template <Datum (*Body)(FunctionCallInfo)>
Datum sql_entry(FunctionCallInfo fcinfo) {
    require_valid_settings();
    SqlError error;
    Datum result = 0;
    if (cpp_guard(error, [fcinfo, &result] { result = Body(fcinfo); })) return result;
    raise_sql_error(error);
}

}  // namespace idem::pg

/// Defines the SQL-callable C function `name` (at global scope), its
/// PG_FUNCTION_INFO_V1 record, and routes it through idem::pg::sql_entry; the
/// braces that follow are its body, with `fcinfo` in scope:
///
///     IDEM_SQL_FUNCTION(idempotency_is_final) { PG_RETURN_BOOL(...); }
#define IDEM_SQL_FUNCTION(name)                                                          \
    static Datum name##_body(FunctionCallInfo fcinfo);                                   \
    extern "C" {                                                                         \
    PG_FUNCTION_INFO_V1(name);                                                           \
    Datum name(PG_FUNCTION_ARGS) { return idem::pg::sql_entry<name##_body>(fcinfo); }    \
    }                                                                                    \
    static Datum name##_body(FunctionCallInfo fcinfo)
