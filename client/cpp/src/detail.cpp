// Pieces shared by Client (transactional protocol) and LeaseRunner (leases).
#include "detail.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "pqxx_compat.hpp"
#include "statuses.hpp"

namespace idem {

namespace detail {

std::string upper(std::string text) {
    for (char& c : text)
        if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    return text;
}

bool valid_key(const std::string& key, std::size_t max_length) {
    if (key.empty() || key.size() > max_length) return false;
    for (char c : key)
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e)
            return false;
    return true;
}

FinalStatuses parse_final_statuses(const std::string& text) {
    core::StatusTable table;
    if (!core::parse_status_list(text, table))
        throw std::invalid_argument("final_statuses is not a list of status codes and classes: " +
                                    text);
    return table;
}

bool is_final(FinalStatuses& cache, PqxxConnection& connection, int status) {
    if (!cache) {
        pqxx::nontransaction query(connection);
        core::StatusTable table{};
        for (const auto& row : query.exec("SELECT s FROM pg_catalog.generate_series(100, 599) AS s "
                                          "WHERE idempotency.is_final(s)"))
            table[static_cast<std::size_t>(row[0].as<int>() - 100)] = true;
        cache = table;
    }
    return status >= 100 && status <= 599 && (*cache)[static_cast<std::size_t>(status - 100)];
}

std::string kept_headers_json(const Response& response, const std::vector<std::string>& kept) {
    // An array of [name, value] pairs keeps the headers' order and repeated
    // names (Set-Cookie, Link); the server accepts it since 0.6.0.
    nlohmann::json pairs = nlohmann::json::array();
    for (const auto& [name, value] : response.headers) {
        // The expiry header is the key's, added to every answer: never stored.
        if (header_name_equal(name, expires_header)) continue;
        for (const std::string& wanted : kept)
            if (header_name_equal(name, wanted)) {
                pairs.push_back({name, value});
                break;
            }
    }
    return pairs.dump();
}

Response stored_response(int status, const std::optional<std::string>& headers_json,
                         std::optional<std::string> body, std::optional<std::string> resource_id) {
    Response response;
    response.status = status;
    if (headers_json) {
        // An array of [name, value] pairs, or the object form of name -> value.
        nlohmann::json headers = nlohmann::json::parse(*headers_json);
        if (headers.is_array()) {
            for (const auto& pair : headers)
                if (pair.is_array() && pair.size() == 2 && pair[0].is_string() &&
                    pair[1].is_string())
                    response.headers.emplace_back(pair[0].get<std::string>(),
                                                  pair[1].get<std::string>());
        } else {
            for (auto it = headers.begin(); it != headers.end(); ++it)
                if (it.value().is_string())
                    response.headers.emplace_back(it.key(), it.value().get<std::string>());
        }
    }
    if (body) response.body = std::move(*body);
    response.resource_id = std::move(resource_id);
    response.replayed = true;
    response.set_header(replay_header, "true");
    return response;
}

Response stored_response(const pqxx::row& row) {
    std::optional<std::string> headers, body, resource_id;
    if (!row["response_headers"].is_null()) headers = row["response_headers"].as<std::string>();
    if (!row["response_body"].is_null()) body = pq::bytes_of(row["response_body"]);
    if (!row["resource_id"].is_null()) resource_id = row["resource_id"].as<std::string>();
    return stored_response(row["response_status"].as<int>(), headers, std::move(body),
                           std::move(resource_id));
}

std::string interval_ms(std::chrono::milliseconds value) {
    return std::to_string(value.count()) + " milliseconds";
}

std::optional<Response> problem_for_outcome(const std::string& outcome,
                                            std::optional<int> lease_seconds,
                                            std::chrono::seconds retry_after,
                                            const std::string& problem_type_base) {
    if (outcome == "mismatch")
        return problem_response(Problem::key_reuse, mismatch_detail, problem_type_base);
    if (outcome == "secret_replay") {
        Response response =
            problem_response(Problem::one_time_secret, secret_replay_detail, problem_type_base);
        response.replayed = true;
        response.set_header(replay_header, "true");
        return response;
    }
    if (outcome == "in_progress") {
        long retry = retry_after.count();
        if (lease_seconds) retry = std::max(1, *lease_seconds);
        Response response =
            problem_response(Problem::request_in_progress, in_progress_detail, problem_type_base);
        response.set_header("Retry-After", std::to_string(std::max(1L, retry)));
        return response;
    }
    // A tombstone of a key that expired under on_expiry 'refuse': the caller adds
    // Idempotency-Expires (the past expiry begin/acquire returned).
    if (outcome == "expired")
        return problem_response(Problem::key_expired, expired_detail, problem_type_base);
    return std::nullopt;
}

}  // namespace detail

}  // namespace idem
