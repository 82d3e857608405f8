#include "idem/client.hpp"

#include <algorithm>
#include <climits>

#include "detail.hpp"
#include "pipeline.hpp"
#include "pqxx_compat.hpp"
#include "stream.hpp"
#include "fingerprint.hpp"
#include "jcs.hpp"

namespace idem {

namespace {

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

// begin() and, for an outcome that does not run the handler, the extension's whole HTTP
// answer in the same statement (idempotency.http_answer, not called for "started"; $7 the
// problem type base, $8 Retry-After), in the one form Citus delegates: SELECT ... FROM
// f(...) with nothing else in FROM.
constexpr const char* begin_sql =
    "SELECT o.outcome, o.resource_id,"
    " floor(extract(epoch FROM o.expires_at))::bigint AS expires_epoch,"
    " CASE WHEN o.outcome <> 'started' THEN"
    " (idempotency.http_answer(o, $7::text, $8::integer)).status END AS status,"
    " CASE WHEN o.outcome <> 'started' THEN"
    " (idempotency.http_answer(o, $7::text, $8::integer)).headers::text END AS headers,"
    " CASE WHEN o.outcome <> 'started' THEN"
    " (idempotency.http_answer(o, $7::text, $8::integer)).body END AS body"
    " FROM idempotency.begin($1, $2, $3, $4, $5::interval, $6::interval) AS o";
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

// A column of a one-row libpq result in text format; empty when NULL.
std::optional<std::string> result_column(const PGresult* result, const char* name) {
    const int index = PQfnumber(result, name);
    if (index < 0 || PQntuples(result) != 1)
        throw std::runtime_error(std::string("idempotency.begin returned no column ") + name);
    if (PQgetisnull(result, 0, index)) return std::nullopt;
    return std::string(PQgetvalue(result, 0, index),
                       static_cast<std::size_t>(PQgetlength(result, 0, index)));
}

// Counts an outcome that does not run the handler.
void count_answer(Counters& counters, const std::string& outcome) {
    if (outcome == "replay")
        ++counters.replayed;
    else if (outcome == "mismatch")
        ++counters.mismatched;
    else if (outcome == "secret_replay")
        ++counters.secret_replayed;
    else if (outcome == "in_progress")
        ++counters.in_progress;
    else if (outcome == "expired")
        ++counters.expired;
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

    const Call call{detail::key_call(request, key, digest, options_)};
    for (int attempt = 1;; ++attempt) {
        try {
            return run_attempt(call, handler, any);
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

Client::Attempt Client::begin(const Call& call, bool pipelined) {
    using detail::Param;
    const bool prepared = options_.prepare_statements;
    const std::string retry_after =
        std::to_string(std::clamp<long long>(options_.retry_after.count(), 1, INT_MAX));
    Attempt attempt;
    auto read = [&](const detail::ColumnReader& column) {
        attempt.outcome = column("outcome").value_or("");
        attempt.expires = detail::expiry_of(column);
        attempt.answer = detail::answer_of(column);
    };
    if (pipelined) {
        PGconn* raw = pipelined_->raw_connection();
        if (prepared) prepare_raw(raw);
        const detail::Statement statement{
            begin_sql,
            {Param::text(call.principal), Param::text(call.key), Param::text(call.action),
             Param::bytes(call.digest), Param::text(call.ttl), Param::text(call.wait),
             Param::text(options_.problem_type_base), Param::text(retry_after)},
            prepared ? begin_raw_name : nullptr};
        auto tx = std::make_unique<detail::PipelinedTransaction>(connection_, raw, statement);
        const PGresult* row = tx->first_result();  // lives as long as tx
        read([row](const char* name) { return result_column(row, name); });
        attempt.pipelined = tx.get();
        attempt.tx = std::move(tx);
        return attempt;
    }
    auto tx = std::make_unique<pqxx::work>(connection_);  // a stream keeps it open
    const pqxx::result rows =
        pq::exec_as(*tx, prepared ? begin_name : nullptr, begin_sql, call.principal, call.key,
                    call.action, pq::bytes(call.digest), pq::c_str_or_null(call.ttl),
                    pq::c_str_or_null(call.wait), options_.problem_type_base, retry_after);
    read(detail::columns_of(rows[0]));  // one row, always
    attempt.work = tx.get();
    attempt.tx = std::move(tx);
    return attempt;
}

Response Client::run_attempt(const Call& call, const Handler* handler,
                             const TransactionHandler* any) {
    // Pipelining needs the raw connection open; otherwise libpqxx's own
    // path reconnects if it can.
    PGconn* raw = pipelined_ != nullptr ? pipelined_->raw_connection() : nullptr;
    Attempt attempt;
    try {
        attempt = begin(call, any != nullptr && raw != nullptr && PQstatus(raw) == CONNECTION_OK);
    } catch (const pqxx::sql_error& e) {
        if (e.sqlstate() != "22P02") throw;
        ++counters_.rejected_keys;  // the server's key checks (length, format)
        return problem_response(Problem::key_malformed,
                                "The Idempotency-Key was refused by the server.",
                                options_.problem_type_base);
    }
    if (attempt.answer) {
        count_answer(counters_, attempt.outcome);
        attempt.tx->commit();
        return std::move(*attempt.answer);
    }
    ++counters_.started;

    // Throws: the transaction rolls back, nothing is stored.
    Response response = handler != nullptr ? (*handler)(*attempt.work) : (*any)(*attempt.tx);
    const Disposition disposition = dispose(response);
    if (response.stream)
        return stream_response(call, std::move(attempt), std::move(response), disposition);
    if (disposition == Disposition::discard) {
        attempt.tx->abort();
        return response;
    }
    const std::string headers = detail::kept_headers_json(response, options_.kept_headers);
    if (disposition == Disposition::store_error) {
        attempt.tx->abort();
        attempt.tx.reset();
        const std::optional<long long> stored = store_final_error(call, response, headers);
        return detail::stamped(std::move(response), stored);
    }
    complete(attempt, call, response, headers);
    return detail::stamped(std::move(response), attempt.expires);
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
             secret ? nullptr : headers.c_str(), pq::c_str_or_null(call.ttl), secret);
    // The stored row's expiry, read in its transaction (save_final starts the key's ttl at
    // its own now(), not at begin's).
    const std::optional<long long> expires = detail::stored_expiry(store, call.principal, call.key);
    store.commit();
    ++counters_.stored_errors;
    return expires;
}

void Client::complete(Attempt& attempt, const Call& call, const Response& response,
                      const std::string& headers) {
    using detail::Param;
    const bool prepared = options_.prepare_statements;
    const std::string status = std::to_string(response.status);
    const std::string secret = response.one_time_secret ? "true" : "false";
    if (attempt.pipelined != nullptr) {
        attempt.pipelined->commit_with(detail::Statement{
            complete_sql,
            {Param::text(call.principal), Param::text(call.key), Param::text(status),
             Param::bytes(response.body), Param::text(headers), Param::text(response.resource_id),
             Param::text(secret)},
            prepared ? complete_raw_name : nullptr});
        return;
    }
    pq::exec_as(*attempt.tx, prepared ? complete_name : nullptr, complete_sql, call.principal,
                call.key, status, pq::bytes(response.body), headers,
                pq::c_str_or_null(response.resource_id), secret);
    attempt.tx->commit();
}

void Client::prepare_raw(PGconn* raw) {
    const int pid = PQbackendPID(raw);
    if (prepared_on_ == raw && prepared_pid_ == pid) return;
    using detail::Param;
    // Only the shapes matter here (which parameters are bytea); the values are unused.
    const std::string none;
    detail::prepare(raw, detail::Statement{begin_sql,
                                           {Param::text(none), Param::text(none), Param::text(none),
                                            Param::bytes(none), Param::null(), Param::null(),
                                            Param::text(none), Param::text(none)},
                                           begin_raw_name});
    detail::prepare(raw, detail::Statement{complete_sql,
                                           {Param::text(none), Param::text(none), Param::text(none),
                                            Param::bytes(none), Param::text(none), Param::null(),
                                            Param::text(none)},
                                           complete_raw_name});
    prepared_on_ = raw;
    prepared_pid_ = pid;
}

}  // namespace idem
