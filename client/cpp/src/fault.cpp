// Which exceptions are database faults, and the answer to them (idem/fault.hpp).
#include "idem/fault.hpp"

#include <algorithm>
#include <string>
#include <string_view>

#include <pqxx/pqxx>

namespace idem {

bool is_database_fault(const std::exception& error) noexcept {
    if (dynamic_cast<const pqxx::broken_connection*>(&error) != nullptr) return true;
    if (dynamic_cast<const pqxx::in_doubt_error*>(&error) != nullptr) return true;
    const auto* sql = dynamic_cast<const pqxx::sql_error*>(&error);
    if (sql == nullptr) return false;
    const std::string_view code = sql->sqlstate();  // std::string in libpqxx 6 and 7
    if (code.size() != 5) return false;
    return std::any_of(fault_sqlstate_classes.begin(), fault_sqlstate_classes.end(),
                       [code](std::string_view c) { return code.substr(0, 2) == c; }) ||
           std::find(fault_sqlstates.begin(), fault_sqlstates.end(), code) != fault_sqlstates.end();
}

Response database_fault_response(int retry_after_seconds, std::string_view type_base) {
    Response response =
        problem_response(Problem::database_unavailable, database_fault_detail, type_base);
    response.set_header("Retry-After", std::to_string(std::max(1, retry_after_seconds)));
    return response;
}

}  // namespace idem
