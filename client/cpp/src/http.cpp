#include "idem/http.hpp"

#include <cstdio>
#include <ctime>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace idem {

bool header_name_equal(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
        char x = a[i], y = b[i];
        if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
        if (x != y) return false;
    }
    return true;
}

const std::string* Response::header(std::string_view name) const noexcept {
    for (const auto& field : headers)
        if (header_name_equal(field.first, name)) return &field.second;
    return nullptr;
}

void Response::set_header(std::string_view name, std::string value) {
    Headers kept;
    kept.reserve(headers.size() + 1);
    for (auto& field : headers)
        if (!header_name_equal(field.first, name)) kept.push_back(std::move(field));
    kept.emplace_back(std::string(name), std::move(value));
    headers = std::move(kept);
}

std::string http_date(long long epoch_seconds) {
    static const char* const days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char* const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    const std::time_t when = static_cast<std::time_t>(epoch_seconds);
    std::tm utc{};
    gmtime_r(&when, &utc);
    char text[40];
    std::snprintf(text, sizeof text, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[utc.tm_wday],
                  utc.tm_mday, months[utc.tm_mon], utc.tm_year + 1900, utc.tm_hour, utc.tm_min,
                  utc.tm_sec);
    return text;
}

const char* problem_slug(Problem problem) noexcept {
    return problem_texts[static_cast<std::size_t>(problem)].slug;
}

int problem_status(Problem problem) noexcept {
    return problem_texts[static_cast<std::size_t>(problem)].status;
}

Response problem_response(Problem problem, std::string_view detail, std::string_view type_base) {
    Response response;
    response.status = problem_status(problem);
    nlohmann::json body = {
        {"type", std::string(type_base) + problem_slug(problem)},
        {"title", problem_texts[static_cast<std::size_t>(problem)].title},
        {"status", response.status},
        {"detail", std::string(detail)},
    };
    response.body = body.dump();
    response.headers.emplace_back("Content-Type", problem_content_type);
    return response;
}

std::vector<std::string> split_chunks(std::string_view body, std::string_view lengths) {
    std::vector<std::string> chunks;
    std::size_t at = 0;
    while (!lengths.empty()) {
        const std::size_t comma = lengths.find(',');
        const std::string_view number = lengths.substr(0, comma);
        lengths = comma == std::string_view::npos ? std::string_view() : lengths.substr(comma + 1);
        if (number.empty() || number.size() > 12)
            throw std::invalid_argument("stored chunk lengths are malformed");
        std::size_t length = 0;
        for (char c : number) {
            if (c < '0' || c > '9')
                throw std::invalid_argument("stored chunk lengths are malformed");
            length = length * 10 + static_cast<std::size_t>(c - '0');
        }
        if (length > body.size() - at)
            throw std::invalid_argument("stored chunk lengths exceed the stored body");
        chunks.emplace_back(body.substr(at, length));
        at += length;
    }
    if (at != body.size())
        throw std::invalid_argument("stored chunk lengths do not add up to the stored body");
    return chunks;
}

}  // namespace idem
