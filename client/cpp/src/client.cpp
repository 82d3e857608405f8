#include "idem/client.hpp"

#include <algorithm>
#include <cstring>

#include "detail.hpp"
#include "pipeline.hpp"
#include "pqxx_compat.hpp"
#include "stream.hpp"
#include "fingerprint.hpp"
#include "statuses.hpp"
#include "jcs.hpp"

namespace idem {

namespace {

using detail::interval_ms;
using detail::upper;

}  // namespace

Digest fingerprint(const Request& request, std::size_t max_json_depth) {
    std::vector<core::JsonPointer> exclude;
    exclude.reserve(request.exclude.size());
    for (const std::string& pointer : request.exclude)
        exclude.push_back(core::JsonPointer::parse(pointer));
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

namespace {

using detail::complete_sql;
// The stored row's expiry, read after save_final in its transaction (save_final
// starts the key's ttl at its own now(), not at begin's).
using detail::stored_expiry_sql;

constexpr const char* begin_sql =
    "SELECT outcome, response_status, response_headers::text AS response_headers, response_body,"
    "       resource_id, expires_at, floor(extract(epoch FROM expires_at))::bigint AS "
    "expires_epoch,"
    "       ceil(extract(epoch FROM"
    "       lease_until - pg_catalog.clock_timestamp()))::integer AS lease_seconds"
    "  FROM idempotency.begin($1, $2, $3, $4, $5::interval, $6::interval)";
// Names of the prepared forms (Options::prepare_statements): *_1 through
// libpqxx, *_p1 on the raw connection when pipelining (libpqxx does not know
// those, so the names must differ).
constexpr const char* begin_name = "idempotency_begin_1";
constexpr const char* complete_name = "idempotency_complete_1";
constexpr const char* begin_raw_name = "idempotency_begin_p1";
constexpr const char* complete_raw_name = "idempotency_complete_p1";
constexpr const char* save_final_sql =
    "SELECT idempotency.save_final($1, $2, $3, $4, $5, $6, $7::jsonb, $8::interval, $9)";

}  // namespace

Client::Client(PqxxConnection& connection, Options options)
    : connection_(connection), options_(std::move(options)) {
    if (options_.max_attempts < 1) throw std::invalid_argument("max_attempts must be at least 1");
    if (!options_.final_statuses.empty())
        final_ = detail::parse_final_statuses(options_.final_statuses);
    if (options_.prepare_statements) {
        pq::prepare(connection_, begin_name, begin_sql);
        pq::prepare(connection_, complete_name, complete_sql);
    }
}

Client::Client(Connection& connection, Options options)
    : Client(connection.connection(), std::move(options)) {
    pipelined_ = &connection;
}

bool Client::is_final(int status) { return detail::is_final(final_, connection_, status); }

namespace {

const char* c_str_or_null(const std::optional<std::string>& value) {
    return value ? value->c_str() : nullptr;
}

detail::Param text_or_null(const std::optional<std::string>& value) {
    return value ? detail::Param::text(*value) : detail::Param::null();
}

// A column of a one-row libpq result in text format; empty when NULL.
std::optional<std::string> column(const PGresult* result, const char* name) {
    const int index = PQfnumber(result, name);
    if (index < 0 || PQntuples(result) != 1)
        throw std::runtime_error(std::string("idempotency.begin returned no column ") + name);
    if (PQgetisnull(result, 0, index)) return std::nullopt;
    return std::string(PQgetvalue(result, 0, index),
                       static_cast<std::size_t>(PQgetlength(result, 0, index)));
}

// Decodes a bytea column sent as text (hex format).
std::optional<std::string> bytea_column(const PGresult* result, const char* name) {
    std::optional<std::string> text = column(result, name);
    if (!text) return std::nullopt;
    std::size_t length = 0;
    unsigned char* bytes =
        PQunescapeBytea(reinterpret_cast<const unsigned char*>(text->c_str()), &length);
    if (bytes == nullptr) throw std::bad_alloc();
    std::string decoded(reinterpret_cast<const char*>(bytes), length);
    PQfreemem(bytes);
    return decoded;
}

std::optional<int> int_column(const PGresult* result, const char* name) {
    std::optional<std::string> text = column(result, name);
    if (!text) return std::nullopt;
    return std::stoi(*text);
}

std::optional<long long> expiry_column(const PGresult* result) {
    std::optional<std::string> text = column(result, "expires_epoch");
    if (!text) return std::nullopt;
    return std::stoll(*text);
}

std::optional<long long> expiry_column(const pqxx::row& row) {
    if (row["expires_epoch"].is_null()) return std::nullopt;
    return row["expires_epoch"].as<long long>();
}

// Adds the key's expiry header (when known) to an answer; it replaces any
// value the handler set, so the header appears once.
Response stamped(Response response, std::optional<long long> expires_epoch) {
    if (expires_epoch) response.set_header(expires_header, http_date(*expires_epoch));
    return response;
}

}  // namespace

Response Client::handle_request(const Request& request, const Handler* handler,
                                const TransactionHandler* any) {
    const std::string method = upper(request.method);
    const bool key_required =
        std::any_of(options_.methods_requiring_key.begin(), options_.methods_requiring_key.end(),
                    [&](const std::string& m) { return upper(m) == method; });
    if (!request.key) {
        if (key_required) {
            ++counters_.rejected_keys;
            return problem_response(Problem::key_missing,
                                    method + " requests need an Idempotency-Key header.",
                                    options_.problem_type_base);
        }
        // Not an idempotent-by-key request: just run the handler in a transaction.
        auto tx = std::make_unique<pqxx::work>(connection_);
        Response response = handler != nullptr ? (*handler)(*tx) : (*any)(*tx);
        if (response.stream) {
            // The stream may still use the transaction: it commits when the stream ends.
            std::shared_ptr<pqxx::work> open(std::move(tx));
            response.stream = [open, produce = std::move(response.stream)](ChunkSink& out) {
                produce(out);
                open->commit();
            };
            return response;
        }
        tx->commit();
        return response;
    }
    const std::string& key = *request.key;
    if (!detail::valid_key(key, options_.max_key_length)) {
        ++counters_.rejected_keys;
        return problem_response(Problem::key_malformed,
                                "The Idempotency-Key must be 1 to " +
                                    std::to_string(options_.max_key_length) +
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

    Call call{request.principal,
              key,
              request.action.empty() ? method + " " + request.path : request.action,
              std::string(reinterpret_cast<const char*>(digest.data()), digest.size()),
              std::nullopt,
              std::nullopt};
    if (options_.ttl) call.ttl = std::to_string(options_.ttl->count()) + " seconds";
    if (options_.wait) call.wait = interval_ms(*options_.wait);
    if (request.duplicates.value_or(options_.duplicates) == Duplicates::reject)
        call.wait = interval_ms(std::chrono::milliseconds(0));  // 409 at once, no waiting

    for (int attempt = 1;; ++attempt) {
        try {
            // Pipelining needs the raw connection open; otherwise libpqxx's own
            // path reconnects if it can.
            PGconn* raw = pipelined_ != nullptr ? pipelined_->raw_connection() : nullptr;
            if (any != nullptr && raw != nullptr && PQstatus(raw) == CONNECTION_OK)
                return run_pipelined_attempt(call, *any);
            if (handler != nullptr) return run_attempt(call, *handler);
            return run_attempt(call, [any](pqxx::work& tx) { return (*any)(tx); });
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

Response Client::refuse_key_on_server() {
    ++counters_.rejected_keys;
    return problem_response(Problem::key_malformed,
                            "The Idempotency-Key was refused by the server.",
                            options_.problem_type_base);
}

std::optional<Response> Client::answer(const std::string& outcome, std::optional<int> lease_seconds,
                                       const std::function<Response()>& stored) {
    if (outcome == "started") {
        ++counters_.started;
        return std::nullopt;
    }
    if (outcome == "replay") {
        ++counters_.replayed;
        return detail::restore_stream(stored(), options_.problem_type_base);
    }
    if (outcome == "mismatch")
        ++counters_.mismatched;
    else if (outcome == "secret_replay")
        ++counters_.secret_replayed;
    else if (outcome == "in_progress")
        ++counters_.in_progress;
    else if (outcome == "expired")
        ++counters_.expired;
    if (std::optional<Response> problem = detail::problem_for_outcome(
            outcome, lease_seconds, options_.retry_after, options_.problem_type_base))
        return problem;
    throw std::runtime_error("idempotency.begin returned an unknown outcome: " + outcome);
}

Client::Disposition Client::dispose(const Response& response) {
    if (response.status < 100 || response.status > 599)
        throw std::invalid_argument("handler returned HTTP status " +
                                    std::to_string(response.status));
    if (!is_final(response.status)) {
        // 401, 429, 3xx, 5xx...: no effect may stay and nothing is stored, so a
        // retry after a token refresh, throttling or a crash takes effect once.
        ++counters_.not_stored;
        return Disposition::discard;
    }
    // A final error has no effect to keep: roll back, then store it alone.
    return response.status >= 400 ? Disposition::store_error : Disposition::keep;
}

std::optional<long long> Client::store_final_error(const Call& call, const Response& response,
                                                   const std::string& headers) {
    pqxx::work store(connection_);
    // A one-time secret is sent without its body and headers: the server
    // would drop them anyway, and they need not cross the wire again.
    const bool secret = response.one_time_secret;
    pq::exec(store, save_final_sql, call.principal, call.key, call.action, pq::bytes(call.digest),
             response.status,
             pq::bytes(secret ? std::string_view() : std::string_view(response.body)),
             secret ? nullptr : headers.c_str(), c_str_or_null(call.ttl), secret);
    std::optional<long long> expires;
    const pqxx::result rows = pq::exec(store, stored_expiry_sql, call.principal, call.key);
    if (rows.size() == 1 && !rows[0][0].is_null()) expires = rows[0][0].as<long long>();
    store.commit();
    ++counters_.stored_errors;
    return expires;
}

Response Client::run_attempt(const Call& call, const Handler& handler) {
    const auto digest_param = pq::bytes(call.digest);
    auto owned = std::make_unique<pqxx::work>(connection_);  // a stream keeps it open
    pqxx::work& tx = *owned;
    std::optional<pqxx::row> begin_row;
    try {
        if (options_.prepare_statements)
            begin_row =
                pq::exec_prepared1(tx, begin_name, call.principal, call.key, call.action,
                                   digest_param, c_str_or_null(call.ttl), c_str_or_null(call.wait));
        else
            begin_row = pq::exec1(tx, begin_sql, call.principal, call.key, call.action,
                                  digest_param, c_str_or_null(call.ttl), c_str_or_null(call.wait));
    } catch (const pqxx::sql_error& e) {
        if (e.sqlstate() == "22P02")
            return refuse_key_on_server();  // the server's key checks (length, format)
        throw;
    }
    const pqxx::row& row = *begin_row;
    std::optional<int> lease_seconds;
    if (!row["lease_seconds"].is_null()) lease_seconds = row["lease_seconds"].as<int>();
    if (std::optional<Response> early = answer(row["outcome"].as<std::string>(), lease_seconds,
                                               [&] { return detail::stored_response(row); })) {
        tx.commit();
        return stamped(std::move(*early), expiry_column(row));
    }

    Response response = handler(tx);  // throws: tx rolls back, nothing stored
    const Disposition disposition = dispose(response);
    if (response.stream)
        return stream_response(call, std::move(owned), std::move(response), disposition,
                               expiry_column(row));
    if (disposition == Disposition::discard) {
        tx.abort();
        return response;
    }
    const std::string headers = detail::kept_headers_json(response, options_.kept_headers);
    if (disposition == Disposition::store_error) {
        tx.abort();
        const std::optional<long long> stored = store_final_error(call, response, headers);
        return stamped(std::move(response), stored);
    }
    const auto body = pq::bytes(response.body);
    const char* resource_id = response.resource_id ? response.resource_id->c_str() : nullptr;
    if (options_.prepare_statements)
        pq::exec_prepared(tx, complete_name, call.principal, call.key, response.status, body,
                          headers, resource_id, response.one_time_secret);
    else
        pq::exec(tx, complete_sql, call.principal, call.key, response.status, body, headers,
                 resource_id, response.one_time_secret);
    tx.commit();
    return stamped(std::move(response), expiry_column(row));
}

void Client::prepare_raw(PGconn* raw) {
    const int pid = PQbackendPID(raw);
    if (prepared_on_ == raw && prepared_pid_ == pid) return;
    using detail::Param;
    // Only the shapes matter here (which parameters are bytea); the values are unused.
    const std::string none;
    detail::prepare(raw, detail::Statement{begin_sql,
                                           {Param::text(none), Param::text(none), Param::text(none),
                                            Param::bytes(none), Param::null(), Param::null()},
                                           begin_raw_name});
    detail::prepare(raw, detail::Statement{complete_sql,
                                           {Param::text(none), Param::text(none), Param::text(none),
                                            Param::bytes(none), Param::text(none), Param::null(),
                                            Param::text(none)},
                                           complete_raw_name});
    prepared_on_ = raw;
    prepared_pid_ = pid;
}

Response Client::run_pipelined_attempt(const Call& call, const TransactionHandler& handler) {
    using detail::Param;
    PGconn* raw = pipelined_->raw_connection();
    const bool prepared = options_.prepare_statements;
    const detail::Statement begin{
        begin_sql,
        {Param::text(call.principal), Param::text(call.key), Param::text(call.action),
         Param::bytes(call.digest), text_or_null(call.ttl), text_or_null(call.wait)},
        prepared ? begin_raw_name : nullptr};
    std::unique_ptr<detail::PipelinedTransaction> tx;
    try {
        if (prepared) prepare_raw(raw);
        tx = std::make_unique<detail::PipelinedTransaction>(connection_, raw, begin);
    } catch (const pqxx::sql_error& e) {
        if (e.sqlstate() == "22P02") return refuse_key_on_server();
        throw;
    }
    const PGresult* row = tx->first_result();
    const std::optional<long long> expires = expiry_column(row);  // row ends with tx
    if (std::optional<Response> early =
            answer(*column(row, "outcome"), int_column(row, "lease_seconds"), [&] {
                return detail::stored_response(
                    *int_column(row, "response_status"), column(row, "response_headers"),
                    bytea_column(row, "response_body"), column(row, "resource_id"));
            })) {
        tx->commit();
        return stamped(std::move(*early), expires);
    }

    Response response = handler(*tx);  // throws: tx rolls back, nothing stored
    const Disposition disposition = dispose(response);
    if (response.stream)
        return stream_response(call, std::move(tx), std::move(response), disposition, expires);
    if (disposition == Disposition::discard) {
        tx->abort();
        return response;
    }
    const std::string headers = detail::kept_headers_json(response, options_.kept_headers);
    if (disposition == Disposition::store_error) {
        tx->abort();
        tx.reset();
        const std::optional<long long> stored = store_final_error(call, response, headers);
        return stamped(std::move(response), stored);
    }
    const std::string status = std::to_string(response.status);
    const std::string secret = response.one_time_secret ? "true" : "false";
    const detail::Statement complete{
        complete_sql,
        {Param::text(call.principal), Param::text(call.key), Param::text(status),
         Param::bytes(response.body), Param::text(headers), text_or_null(response.resource_id),
         Param::text(secret)},
        prepared ? complete_raw_name : nullptr};
    tx->commit_with(complete);
    return stamped(std::move(response), expires);
}

}  // namespace idem
