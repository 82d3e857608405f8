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
    switch (problem) {
        case Problem::key_missing: return "idempotency-key-missing";
        case Problem::key_malformed: return "idempotency-key-malformed";
        case Problem::body_invalid: return "request-body-invalid";
        case Problem::key_reuse: return "idempotency-key-reuse";
        case Problem::request_in_progress: return "request-in-progress";
        case Problem::one_time_secret: return "one-time-secret";
        case Problem::already_processed: return "request-already-processed";
        case Problem::key_expired: return "idempotency-key-expired";
        case Problem::response_not_kept: return "response-not-kept";
        case Problem::database_unavailable: return "database-unavailable";
    }
    return "about:blank";
}

int problem_status(Problem problem) noexcept {
    switch (problem) {
        case Problem::key_missing:
        case Problem::key_malformed:
        case Problem::body_invalid: return 400;
        case Problem::key_reuse: return 422;
        case Problem::request_in_progress:
        case Problem::one_time_secret:
        case Problem::already_processed:
        case Problem::response_not_kept: return 409;
        case Problem::key_expired: return 410;
        case Problem::database_unavailable: return 503;
    }
    return 500;
}

namespace {

const char* problem_title(Problem problem) {
    switch (problem) {
        case Problem::key_missing: return "Idempotency-Key header is missing";
        case Problem::key_malformed: return "Idempotency-Key header is malformed";
        case Problem::body_invalid: return "Request body cannot be fingerprinted";
        case Problem::key_reuse: return "Idempotency-Key was used for another request";
        case Problem::request_in_progress:
            return "A request with this Idempotency-Key is in progress";
        case Problem::one_time_secret:
            return "The response to this request was sent once and not kept";
        case Problem::already_processed: return "This request was already processed";
        case Problem::key_expired: return "Idempotency-Key has expired";
        case Problem::response_not_kept:
            return "The response to this request was too large to keep";
        case Problem::database_unavailable: return "The database is unavailable";
    }
    return "Error";
}

}  // namespace

Response problem_response(Problem problem, std::string_view detail, std::string_view type_base) {
    Response response;
    response.status = problem_status(problem);
    nlohmann::json body = {
        {"type", std::string(type_base) + problem_slug(problem)},
        {"title", problem_title(problem)},
        {"status", response.status},
        {"detail", std::string(detail)},
    };
    response.body = body.dump();
    response.headers.emplace_back("Content-Type", "application/problem+json");
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
