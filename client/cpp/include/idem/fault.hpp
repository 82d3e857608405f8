// Database faults: which exceptions mean the database failed under a request (the
// connection lost or refused, the server shut down, crashed or restarting, a cancelled
// statement, a commit whose outcome is unknown), not the request's own, and the one
// answer to them (client/protocol.json `database_fault`): 503 database-unavailable with
// Retry-After. A retry with the same key runs the request once or replays it.
#pragma once

#include <array>
#include <exception>
#include <string_view>

#include "idem/http.hpp"

namespace idem {

/// fault_sqlstate_classes, fault_sqlstates and database_fault_detail are generated
/// (idem/protocol_gen.hpp, client/protocol.json `database_fault`).

/// True for pqxx::broken_connection (a connection lost or refused), pqxx::in_doubt_error (a
/// commit whose outcome is unknown) and a pqxx::sql_error whose SQLSTATE is a fault's; false
/// for everything else (the handler's own exceptions, constraint violations).
bool is_database_fault(const std::exception& error) noexcept;

/// The one answer to a database fault: 503 database-unavailable, Retry-After (at least 1).
Response database_fault_response(int retry_after_seconds, std::string_view type_base);

}  // namespace idem
