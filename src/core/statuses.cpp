#include "statuses.hpp"

namespace idem::core {

bool parse_status_list(std::string_view text, StatusTable& table) noexcept {
    table.fill(false);
    std::size_t i = 0;
    while (i < text.size()) {
        while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == ',')) ++i;
        const std::size_t start = i;
        while (i < text.size() && text[i] != ',' && text[i] != ' ' && text[i] != '\t') ++i;
        if (start == i) break;
        const std::string_view entry = text.substr(start, i - start);
        if (entry.size() != 3 || entry[0] < '1' || entry[0] > '5') return false;
        const int hundreds = (entry[0] - '0') * 100;
        auto is_x = [](char c) { return c == 'x' || c == 'X'; };
        auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
        if (is_x(entry[1]) && is_x(entry[2])) {
            for (int s = hundreds; s < hundreds + 100; ++s)
                table[static_cast<std::size_t>(s - 100)] = true;
        } else if (is_digit(entry[1]) && is_digit(entry[2])) {
            table[static_cast<std::size_t>(hundreds + (entry[1] - '0') * 10 + (entry[2] - '0') -
                                           100)] = true;
        } else {
            return false;
        }
    }
    return true;
}

}  // namespace idem::core
