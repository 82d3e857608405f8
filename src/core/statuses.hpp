// Lists of HTTP statuses such as idempotency.final_statuses ("2xx,400,409").
// Shared core: the extension's setting and the client's Options parse alike.
#pragma once

#include <array>
#include <string_view>

namespace idem::core {

/// Flags for the statuses 100..599: table[status - 100].
using StatusTable = std::array<bool, 500>;

/// Parses a comma-separated list of status codes (409) and classes (2xx, any
/// case), spaces allowed around entries; an empty list is valid. Returns false,
/// leaving `table` unspecified, for any other entry.
bool parse_status_list(std::string_view text, StatusTable& table) noexcept;

}  // namespace idem::core
