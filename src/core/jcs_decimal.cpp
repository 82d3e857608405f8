// The public number formatting of the core (jcs.hpp's format_number): the
// layout itself is in jcs_decimal.hpp, inline for the parser.
#include "jcs_decimal.hpp"

#include <string>

#include "jcs.hpp"

namespace idem::core {

std::size_t format_number(double value, char* buffer) noexcept {
    return numbers::shortest_decimal(value, buffer);
}

std::string format_number(double value) {
    char buffer[kMaxNumberChars];
    return std::string(buffer, format_number(value, buffer));
}

}  // namespace idem::core
