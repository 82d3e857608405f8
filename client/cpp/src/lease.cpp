#include "idem/lease.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "detail.hpp"
#include "pqxx_compat.hpp"

namespace idem {

const char* to_string(LeaseOutcome outcome) noexcept {
    switch (outcome) {
        case LeaseOutcome::fresh: return "fresh";
        case LeaseOutcome::replayed: return "replayed";
        case LeaseOutcome::in_progress: return "in_progress";
        case LeaseOutcome::duplicate: return "duplicate";
        case LeaseOutcome::mismatch: return "mismatch";
        case LeaseOutcome::fresh_unfenced: return "fresh_unfenced";
        case LeaseOutcome::rejected: return "rejected";
        case LeaseOutcome::expired: return "expired";
    }
    return "unknown";
}

namespace {

using detail::interval_ms;

// Renews a lease from its own thread and connection until stopped. A renewal
// that returns false means the fence no longer holds the key: the lease is
// lost and renewing stops. A renewal that fails (network, server restart) is
// retried at the next tick; after max_failures in a row renewing stops
// without declaring the lease lost.
class Renewer {
public:
    Renewer(std::string conninfo, std::string principal, std::string key, std::int64_t fence,
            std::chrono::milliseconds lease, int max_failures)
        : conninfo_(std::move(conninfo)),
          principal_(std::move(principal)),
          key_(std::move(key)),
          fence_(fence),
          lease_(lease),
          max_failures_(max_failures) {
        thread_ = std::thread([this] { loop(); });
    }
    ~Renewer() { stop(); }

    void stop() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        if (thread_.joinable()) thread_.join();
    }
    bool lost() const noexcept { return lost_; }
    int renewals() const noexcept { return renewals_; }

private:
    void loop() {
        const auto period = std::max(std::chrono::milliseconds(50), lease_ / 3);
        std::unique_ptr<pqxx::connection> connection;
        int failures = 0;
        std::unique_lock<std::mutex> lock(mutex_);
        while (!stopping_) {
            if (wake_.wait_for(lock, period, [this] { return stopping_; })) break;
            lock.unlock();
            try {
                if (!connection) connection = std::make_unique<pqxx::connection>(conninfo_);
                pqxx::nontransaction tx(*connection);
                const bool renewed =
                    pq::exec1(tx, "SELECT idempotency.renew($1, $2, $3, $4::interval)", principal_,
                              key_, fence_, interval_ms(lease_))[0]
                        .as<bool>();
                failures = 0;
                if (renewed) {
                    ++renewals_;
                } else {
                    lost_ = true;
                }
            } catch (const std::exception&) {
                connection.reset();
                ++failures;
            }
            lock.lock();
            if (lost_ || failures >= max_failures_) break;
        }
    }

    std::string conninfo_, principal_, key_;
    std::int64_t fence_;
    std::chrono::milliseconds lease_;
    int max_failures_;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool stopping_ = false;
    std::atomic<bool> lost_{false};
    std::atomic<int> renewals_{0};
    std::thread thread_;
};

}  // namespace

LeaseRunner::LeaseRunner(std::string conninfo, LeaseOptions options)
    : conninfo_(std::move(conninfo)), options_(std::move(options)) {
    if (options_.lease <= std::chrono::milliseconds(0))
        throw std::invalid_argument("lease must be positive");
}

LeaseRunner::~LeaseRunner() = default;

pqxx::connection& LeaseRunner::connection() {
    if (!connection_ || !connection_->is_open())
        connection_ = std::make_unique<pqxx::connection>(conninfo_);
    return *connection_;
}

bool LeaseRunner::is_final(int status) { return detail::is_final(final_, connection(), status); }

namespace {

// Calls idempotency.acquire for the request (autocommit: the lease row is
// visible at once) and returns its row, with the lease's remaining seconds.
pqxx::row acquire(pqxx::connection& connection, const Request& request, const std::string& key,
                  const Digest& digest, const LeaseOptions& options) {
    const std::string action = request.action.empty()
                                   ? detail::upper(request.method) + " " + request.path
                                   : request.action;
    const std::string ttl =
        options.ttl ? std::to_string(options.ttl->count()) + " seconds" : std::string();
    const bool reject = request.duplicates.value_or(options.duplicates) == Duplicates::reject;
    const std::string wait = reject         ? interval_ms(std::chrono::milliseconds(0))
                             : options.wait ? interval_ms(*options.wait)
                                            : std::string();
    pqxx::nontransaction tx(connection);
    return pq::exec1(
        tx,
        "SELECT outcome, fence, response_status, response_headers::text AS response_headers, "
        "response_body,"
        "       resource_id, ceil(extract(epoch FROM lease_until - "
        "pg_catalog.clock_timestamp()))::integer"
        "       AS lease_seconds, floor(extract(epoch FROM expires_at))::bigint AS expires_epoch"
        "  FROM idempotency.acquire($1, $2, $3, $4, $5::interval, $6::interval, $7::interval)",
        request.principal, key, action,
        pq::bytes(std::string_view(reinterpret_cast<const char*>(digest.data()), digest.size())),
        interval_ms(options.lease), options.ttl ? ttl.c_str() : nullptr,
        wait.empty() ? nullptr : wait.c_str());
}

// acquire()'s answer when it is not "started": the result to return without
// running the body (a replay, a problem response), or nothing for "started".
// Throws on an outcome this client does not know.
std::optional<LeaseResult> answer_without_running(const std::string& outcome,
                                                  std::optional<int> lease_seconds,
                                                  const pqxx::row& row,
                                                  const LeaseOptions& options) {
    LeaseResult result;
    if ((outcome == "replay" || outcome == "secret_replay") && options.policy != Policy::remember) {
        result.outcome = LeaseOutcome::duplicate;
        result.response = problem_response(
            Problem::already_processed,
            "A request with this Idempotency-Key was already processed; its result is not kept.",
            options.problem_type_base);
        return result;
    }
    if (outcome == "replay") {
        result.outcome = LeaseOutcome::replayed;
        result.response = detail::stored_response(row);
        return result;
    }
    if (std::optional<Response> problem = detail::problem_for_outcome(
            outcome, lease_seconds, std::chrono::seconds(1), options.problem_type_base)) {
        result.outcome = outcome == "mismatch"      ? LeaseOutcome::mismatch
                         : outcome == "in_progress" ? LeaseOutcome::in_progress
                         : outcome == "expired"     ? LeaseOutcome::expired
                                                    : LeaseOutcome::replayed;
        result.response = std::move(*problem);
        return result;
    }
    if (outcome != "started")
        throw std::runtime_error("idempotency.acquire returned an unknown outcome: " + outcome);
    return std::nullopt;
}

// A row or, on libpqxx 8, the row_ref that indexing a result gives: a template
// because libpqxx 8 no longer binds result[0] to a `const pqxx::row&`.
template <typename Row>
std::optional<long long> expiry_of(const Row& row) {
    if (row["expires_epoch"].is_null()) return std::nullopt;
    return row["expires_epoch"].template as<long long>();
}

// Sets the result's expiry and the response's Idempotency-Expires (when known).
void stamp(LeaseResult& result, std::optional<long long> expires_epoch) {
    result.expires_epoch = expires_epoch;
    if (expires_epoch) result.response.set_header(expires_header, http_date(*expires_epoch));
}

// The fenced statements that settle a key after its body ran; each returns
// whether the fence still held the key.
struct Fenced {
    pqxx::nontransaction& tx;
    const std::string& principal;
    const std::string& key;
    std::int64_t fence;

    bool complete(int status) const {
        return pq::exec1(tx, "SELECT idempotency.complete($1, $2, fence => $3, status => $4)",
                         principal, key, fence, status)[0]
            .as<bool>();
    }
    bool release() const {
        return pq::exec1(tx, "SELECT idempotency.release($1, $2, $3)", principal, key, fence)[0]
            .as<bool>();
    }
    // The settled row's expiry: acquire's while it is still ahead, read again after a
    // completion past it (complete keeps the key one more ttl from its own now()).
    std::optional<long long> expiry(std::optional<long long> acquired) const {
        const long long now = std::chrono::duration_cast<std::chrono::seconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
        if (!acquired || *acquired > now) return acquired;
        const pqxx::result rows = pq::exec(tx, detail::stored_expiry_sql, principal, key);
        if (rows.empty()) return std::nullopt;
        return expiry_of(rows[0]);
    }
    bool store(const Response& response, const std::vector<std::string>& kept_headers) const {
        return pq::exec1(
                   tx,
                   "SELECT idempotency.complete($1, $2, fence => $3, status => $4, body => $5,"
                   " headers => $6::jsonb, resource_id => $7, one_time_secret => $8)",
                   principal, key, fence, response.status, pq::bytes(response.body),
                   detail::kept_headers_json(response, kept_headers),
                   response.resource_id ? response.resource_id->c_str() : nullptr,
                   response.one_time_secret)[0]
            .as<bool>();
    }
};

}  // namespace

LeaseResult LeaseRunner::run(const Request& request, const ExternalBody& body) {
    LeaseResult result;
    if (!request.key || !detail::valid_key(*request.key, options_.max_key_length)) {
        result.outcome = LeaseOutcome::rejected;
        result.response = problem_response(
            request.key ? Problem::key_malformed : Problem::key_missing,
            "An Idempotency-Key of 1 to " + std::to_string(options_.max_key_length) +
                " visible ASCII characters is required.",
            options_.problem_type_base);
        return result;
    }
    const std::string& key = *request.key;
    const Digest digest = request.digest ? *request.digest : fingerprint(request);
    if (options_.policy == Policy::remember)
        is_final(200);  // load the table before holding anything
    const pqxx::row row = acquire(connection(), request, key, digest, options_);
    const std::string outcome = row["outcome"].as<std::string>();
    const std::optional<int> lease_seconds =
        row["lease_seconds"].is_null() ? std::nullopt
                                       : std::optional<int>(row["lease_seconds"].as<int>());
    if (std::optional<LeaseResult> answered =
            answer_without_running(outcome, lease_seconds, row, options_)) {
        stamp(*answered, expiry_of(row));
        return std::move(*answered);
    }
    result.fence = row["fence"].as<std::int64_t>();

    // Run the body, never cancelled, while a background thread renews the lease.
    std::unique_ptr<Renewer> renewer;
    if (options_.renew)
        renewer = std::make_unique<Renewer>(conninfo_, request.principal, key, result.fence,
                                            options_.lease, options_.max_renew_failures);
    std::exception_ptr failure;
    Response response;
    try {
        response = body();
    } catch (...) {
        failure = std::current_exception();
    }
    bool lost = false;
    if (renewer) {
        renewer->stop();
        lost = renewer->lost();
        result.renewals = renewer->renewals();
    }

    // Settle the key by the policy; every statement is fenced.
    pqxx::nontransaction tx(connection());
    const Fenced fenced{tx, request.principal, key, result.fence};
    if (failure) {
        // Settle by the policy; a lost fence changes nothing either way.
        if (options_.policy == Policy::once)
            fenced.complete(500);
        else
            fenced.release();
        std::rethrow_exception(failure);
    }
    // kept: settling leaves a row (done or stored); false when it releases the key.
    const bool kept = options_.policy == Policy::once ||
                      (options_.policy == Policy::commit_on_success ? response.status < 400
                                                                    : is_final(response.status));
    const bool settled = !kept ? fenced.release()
                         : options_.policy == Policy::remember
                             ? fenced.store(response, options_.kept_headers)
                             : fenced.complete(response.status);
    result.response = std::move(response);
    result.outcome = (settled && !lost) ? LeaseOutcome::fresh : LeaseOutcome::fresh_unfenced;
    stamp(result, settled && kept ? fenced.expiry(expiry_of(row)) : std::nullopt);
    return result;
}

}  // namespace idem
