// The boundary between C++ and PostgreSQL.
//
// No C++ exception may unwind into PostgreSQL, and no PostgreSQL error
// (a longjmp) may unwind through a C++ frame that owns a destructor. So every
// SQL entry point that runs C++ code does it through cpp_guard(): the C++ body
// runs inside try/catch, a failure is copied into a fixed buffer (no
// allocation, so nothing inside the catch block can longjmp), and the caller
// raises the PostgreSQL error with raise_sql_error() after the C++ frames are
// gone.
//
// Interrupts: CHECK_FOR_INTERRUPTS() longjmps as well, so the C++ core never
// calls it. A long computation is given an InterruptProbe that reads
// PostgreSQL's pending-interrupt flags; when it fires, the core throws
// idem::core::Interrupted, cpp_guard records it, and run_interruptible()
// (whose frame owns nothing to destroy) processes the interrupt once the C++
// frames are gone: a cancel or statement_timeout raises its error (57014)
// there; after a harmless interrupt the computation is run again.
#pragma once

#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>

#include "fingerprint.hpp"
#include "jcs.hpp"
#include "schema_version.hpp"
#include "settings.hpp"

extern "C" {
#include "postgres.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/elog.h"
}

namespace idem::pg {

/// A failure captured inside the C++ zone, raised later as a PostgreSQL error.
struct SqlError {
    int sqlstate = 0;
    bool interrupted = false;  ///< stopped by the interrupt probe (sqlstate 57014)
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
        for (const char* c = part; *c != '\0' && used + 1 < sizeof error.message; ++c)
            error.message[used++] = *c;
    error.message[used] = '\0';
}

/// Runs body(); returns true on success, false with `error` filled on any exception.
template <typename Body>
bool cpp_guard(SqlError& error, Body&& body) noexcept {
    try {
        body();
        return true;
    } catch (const idem::core::Interrupted&) {
        error.interrupted = true;
        error.sqlstate = ERRCODE_QUERY_CANCELED;
        set_message(error, "", "canceling statement due to an interrupt");
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

/// Interrupt probe: an interrupt is pending that CHECK_FOR_INTERRUPTS() would
/// process now (InterruptPending, and interrupts are not held off).
inline bool any_interrupt_pending() noexcept {
    return INTERRUPTS_PENDING_CONDITION() && INTERRUPTS_CAN_BE_PROCESSED();
}

/// Interrupt probe: a cancel, statement_timeout or termination is pending that
/// CHECK_FOR_INTERRUPTS() would raise now.
inline bool cancel_pending() noexcept {
    return (QueryCancelPending || ProcDiePending) && INTERRUPTS_CAN_BE_PROCESSED();
}

/// The probe for run `run` (0-based) of a computation restarted by
/// run_interruptible. The first runs stop at any interrupt, so that one that
/// does not cancel (a barrier, a memory-context dump request, a client
/// connection check) is served at once; a harmless interrupt restarts the
/// work, so from the fourth run on only a cancel or termination stops it (a
/// periodic interrupt such as client_connection_check_interval could
/// otherwise restart a long computation for ever), and from the tenth on
/// nothing does (a bound on restarts whatever PostgreSQL's flags do).
inline idem::core::InterruptProbe interrupt_probe(int run) noexcept {
    if (run < 3) return any_interrupt_pending;
    if (run < 10) return cancel_pending;
    return nullptr;
}

/// Runs `compute(probe, error)` (a noexcept function that returns false with
/// `error` filled on failure, its C++ body inside cpp_guard) until it finishes
/// or fails other than by interruption. When it was interrupted, processes the
/// pending interrupt: a cancel, statement_timeout (57014) or termination is
/// raised from here, by longjmp, which is safe because compute's C++ frames are
/// gone and this frame owns nothing with a destructor (keep it that way, and
/// pass a lambda that captures by reference). Returns what the last run returned.
template <typename Compute>
bool run_interruptible(SqlError& error, Compute compute) {
    for (int run = 0;; ++run) {
        error = SqlError{};
        if (compute(interrupt_probe(run), error)) return true;
        if (!error.interrupted) return false;
        if (INTERRUPTS_CAN_BE_PROCESSED())
            ProcessInterrupts();  // as CHECK_FOR_INTERRUPTS(), even if only
                                  // QueryCancelPending is set
    }
}

/// The one way into the extension from SQL: refuses to serve a schema newer
/// than this library (require_known_schema) and to run with a setting whose
/// value could not be applied (require_valid_settings), then runs
/// `body(fcinfo)` inside the C++ guard and raises a C++ failure as a PostgreSQL
/// error once the C++ frames are gone. A PostgreSQL error raised by the body
/// passes through: no object with a destructor lives in these frames. Each SQL
/// function keeps its own name where it is defined, the body a lambda:
///
///     extern "C" {
///     PG_FUNCTION_INFO_V1(idempotency_is_final);
///     }
///     Datum idempotency_is_final(FunctionCallInfo call) {
///         return sql_entry(call, [](FunctionCallInfo fcinfo) -> Datum { ... });
///     }
///
/// The outer parameter is not called `fcinfo` (PG_FUNCTION_ARGS): the body's
/// PG_GETARG_* macros name the lambda's, and g++ 14 refuses the shadowing.
template <typename Body>
Datum sql_entry(FunctionCallInfo fcinfo, Body&& body) {
    require_known_schema();
    require_valid_settings();
    SqlError error;
    Datum result = 0;
    if (cpp_guard(error, [fcinfo, &result, &body] { result = body(fcinfo); })) return result;
    raise_sql_error(error);
}

}  // namespace idem::pg
