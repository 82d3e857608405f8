#include "idem/client.hpp"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "detail.hpp"
#include "fingerprint.hpp"
#include "statuses.hpp"
#include "jcs.hpp"

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
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) return false;
    return true;
}

FinalStatuses parse_final_statuses(const std::string& text) {
    core::StatusTable table;
    if (!core::parse_status_list(text, table))
        throw std::invalid_argument("final_statuses is not a list of status codes and classes: " + text);
    return table;
}

bool is_final(FinalStatuses& cache, pqxx::connection_base& connection, int status) {
    if (!cache) {
        pqxx::nontransaction query(connection);
        core::StatusTable table{};
        for (const pqxx::row& row :
             query.exec("SELECT s FROM pg_catalog.generate_series(100, 599) AS s WHERE idempotency.is_final(s)"))
            table[static_cast<std::size_t>(row[0].as<int>() - 100)] = true;
        cache = table;
    }
    return status >= 100 && status <= 599 && (*cache)[static_cast<std::size_t>(status - 100)];
}

std::string kept_headers_json(const Response& response, const std::vector<std::string>& kept) {
    nlohmann::json object = nlohmann::json::object();
    for (const auto& [name, value] : response.headers)
        for (const std::string& wanted : kept)
            if (header_name_equal(name, wanted)) object[name] = value;
    return object.dump();
}

Response stored_response(const pqxx::row& row) {
    Response response;
    response.status = row["response_status"].as<int>();
    if (!row["response_headers"].is_null()) {
        nlohmann::json headers = nlohmann::json::parse(row["response_headers"].as<std::string>());
        for (auto it = headers.begin(); it != headers.end(); ++it)
            if (it.value().is_string()) response.headers.emplace_back(it.key(), it.value().get<std::string>());
    }
    if (!row["response_body"].is_null()) {
        pqxx::binarystring body(row["response_body"]);
        response.body = body.str();
    }
    if (!row["resource_id"].is_null()) response.resource_id = row["resource_id"].as<std::string>();
    response.replayed = true;
    response.set_header("Idempotent-Replay", "true");
    return response;
}

}  // namespace detail

namespace {

using detail::upper;

std::string interval_ms(std::chrono::milliseconds value) { return std::to_string(value.count()) + " milliseconds"; }

}  // namespace

Digest fingerprint(const Request& request, std::size_t max_json_depth) {
    std::vector<core::JsonPointer> exclude;
    exclude.reserve(request.exclude.size());
    for (const std::string& pointer : request.exclude) exclude.push_back(core::JsonPointer::parse(pointer));
    core::CanonicalizeOptions options;
    options.max_depth = max_json_depth;
    std::optional<std::string_view> body;
    if (request.body) body = std::string_view(*request.body);
    try {
        return core::fingerprint(request.method, request.path, body, exclude, options);
    } catch (const core::JsonException& e) {
        throw BodyError(e.what());
    }
}

Client::Client(pqxx::connection_base& connection, Options options)
    : connection_(connection), options_(std::move(options)) {
    if (options_.max_attempts < 1) throw std::invalid_argument("max_attempts must be at least 1");
    if (!options_.final_statuses.empty()) final_ = detail::parse_final_statuses(options_.final_statuses);
}

bool Client::is_final(int status) { return detail::is_final(final_, connection_, status); }

Response Client::handle(const Request& request, const Handler& handler) {
    const std::string method = upper(request.method);
    const bool key_required = std::any_of(options_.methods_requiring_key.begin(), options_.methods_requiring_key.end(),
                                          [&](const std::string& m) { return upper(m) == method; });
    if (!request.key) {
        if (key_required) {
            ++counters_.rejected_keys;
            return problem_response(Problem::key_missing, method + " requests need an Idempotency-Key header.",
                                    options_.problem_type_base);
        }
        // Not an idempotent-by-key request: just run the handler in a transaction.
        pqxx::work tx(connection_);
        Response response = handler(tx);
        tx.commit();
        return response;
    }
    const std::string& key = *request.key;
    if (!detail::valid_key(key, options_.max_key_length)) {
        ++counters_.rejected_keys;
        return problem_response(Problem::key_malformed,
                                "The Idempotency-Key must be 1 to " + std::to_string(options_.max_key_length) +
                                    " visible ASCII characters.",
                                options_.problem_type_base);
    }
    Digest digest;
    if (request.digest) {
        digest = *request.digest;
    } else {
        try {
            digest = fingerprint(request);
        } catch (const BodyError& e) {
            return problem_response(Problem::body_invalid, e.what(), options_.problem_type_base);
        }
    }
    is_final(200);  // the table is known before any transaction starts

    for (int attempt = 1;; ++attempt) {
        try {
            return run_attempt(request, key, digest, handler);
        } catch (const pqxx::serialization_failure&) {  // 40001
            if (attempt >= options_.max_attempts) throw;
        } catch (const pqxx::deadlock_detected&) {  // 40P01
            if (attempt >= options_.max_attempts) throw;
        }
        // Anything else propagates, pqxx::in_doubt_error and 40003
        // (statement_completion_unknown) included: the commit may have happened,
        // so the handler must not run again.
        ++counters_.retries;
    }
}

Response Client::run_attempt(const Request& request, const std::string& key, const Digest& digest,
                             const Handler& handler) {
    const std::string action = request.action.empty() ? upper(request.method) + " " + request.path : request.action;
    const pqxx::binarystring digest_param(digest.data(), digest.size());
    const std::string ttl = options_.ttl ? std::to_string(options_.ttl->count()) + " seconds" : std::string();
    const std::string wait = options_.wait ? interval_ms(*options_.wait) : std::string();

    pqxx::work tx(connection_);
    std::optional<pqxx::row> begin_row;
    try {
        begin_row = tx.exec_params1(
            "SELECT outcome, response_status, response_headers::text AS response_headers, response_body,"
            "       resource_id, expires_at, ceil(extract(epoch FROM"
            "       lease_until - pg_catalog.clock_timestamp()))::integer AS lease_seconds"
            "  FROM idempotency.begin($1, $2, $3, $4, $5::interval, $6::interval)",
            request.principal, key, action, digest_param, options_.ttl ? ttl.c_str() : nullptr,
            options_.wait ? wait.c_str() : nullptr);
    } catch (const pqxx::sql_error& e) {
        if (e.sqlstate() == "22023") {  // the server's key checks (length, format)
            ++counters_.rejected_keys;
            return problem_response(Problem::key_malformed, "The Idempotency-Key was refused by the server.",
                                    options_.problem_type_base);
        }
        throw;
    }
    const pqxx::row& outcome_row = *begin_row;
    const std::string outcome = outcome_row["outcome"].as<std::string>();

    if (outcome == "replay") {
        ++counters_.replayed;
        Response response = detail::stored_response(outcome_row);
        tx.commit();
        return response;
    }
    if (outcome == "mismatch") {
        ++counters_.mismatched;
        tx.commit();
        return problem_response(Problem::key_reuse,
                                "This Idempotency-Key was used for a different request; use a new key for a new request.",
                                options_.problem_type_base);
    }
    if (outcome == "secret_replay") {
        ++counters_.secret_replayed;
        tx.commit();
        Response response = problem_response(
            Problem::one_time_secret,
            "The first response to this request carried a secret and was not kept; create a new one with a new key.",
            options_.problem_type_base);
        response.replayed = true;
        response.set_header("Idempotent-Replay", "true");
        return response;
    }
    if (outcome == "in_progress") {
        ++counters_.in_progress;
        long retry = options_.retry_after.count();
        if (!outcome_row["lease_seconds"].is_null()) retry = std::max(1, outcome_row["lease_seconds"].as<int>());
        tx.commit();
        Response response = problem_response(Problem::request_in_progress,
                                             "A request with this Idempotency-Key is still being processed; retry later.",
                                             options_.problem_type_base);
        response.set_header("Retry-After", std::to_string(std::max(1L, retry)));
        return response;
    }
    if (outcome != "started") throw std::runtime_error("idempotency.begin returned an unknown outcome: " + outcome);
    ++counters_.started;

    Response response = handler(tx);  // throws: tx rolls back, nothing stored
    if (response.status < 100 || response.status > 599)
        throw std::invalid_argument("handler returned HTTP status " + std::to_string(response.status));

    if (!is_final(response.status)) {
        // 401, 429, 3xx, 5xx...: no effect may stay and nothing is stored, so a
        // retry after a token refresh, throttling or a crash takes effect once.
        tx.abort();
        ++counters_.not_stored;
        return response;
    }
    const std::string headers = detail::kept_headers_json(response, options_.kept_headers);
    if (response.status >= 400) {
        // A final error has no effect to keep: roll back, then store it alone.
        tx.abort();
        pqxx::work store(connection_);
        store.exec_params(
            "SELECT idempotency.save_final($1, $2, $3, $4, $5, $6, $7::jsonb, $8::interval)", request.principal, key,
            action, digest_param, response.status, pqxx::binarystring(response.body.data(), response.body.size()),
            headers, options_.ttl ? ttl.c_str() : nullptr);
        store.commit();
        ++counters_.stored_errors;
        return response;
    }
    tx.exec_params("SELECT idempotency.complete($1, $2, $3, $4, $5::jsonb, $6, $7)", request.principal, key,
                   response.status, pqxx::binarystring(response.body.data(), response.body.size()), headers,
                   response.resource_id ? response.resource_id->c_str() : nullptr, response.one_time_secret);
    tx.commit();
    return response;
}

}  // namespace idem
