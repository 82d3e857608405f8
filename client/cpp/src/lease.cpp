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

// acquire() and, for an outcome that does not run the body, the extension's whole HTTP
// answer in the same statement (idempotency.http_answer, as begin's in client.cpp).
constexpr const char* acquire_sql =
    "SELECT o.outcome, o.fence, o.resource_id,"
    " floor(extract(epoch FROM o.expires_at))::bigint AS expires_epoch,"
    " CASE WHEN o.outcome <> 'started' THEN"
    " (idempotency.http_answer(o, $8::text, $9::integer)).status END AS status,"
    " CASE WHEN o.outcome <> 'started' THEN"
    " (idempotency.http_answer(o, $8::text, $9::integer)).headers::text END AS headers,"
    " CASE WHEN o.outcome <> 'started' THEN"
    " (idempotency.http_answer(o, $8::text, $9::integer)).body END AS body"
    " FROM idempotency.acquire($1, $2, $3, $4, $5::interval, $6::interval, $7::interval) AS o";

// Calls idempotency.acquire for the request (autocommit: the lease row is
// visible at once) and returns its row.
pqxx::result acquire(pqxx::connection& connection, const detail::KeyCall& call,
                     const LeaseOptions& options) {
    pqxx::nontransaction tx(connection);
    return pq::exec(tx, acquire_sql, call.principal, call.key, call.action, pq::bytes(call.digest),
                    interval_ms(options.lease), pq::c_str_or_null(call.ttl),
                    pq::c_str_or_null(call.wait), options.problem_type_base,
                    default_retry_after_seconds);
}

// acquire()'s answer when it is not "started": the result to return without running
// the body (the extension's answer, or 409 for a duplicate under a policy that keeps
// nothing), or nothing for "started".
std::optional<LeaseResult> answer_without_running(const detail::ColumnReader& column,
                                                  const LeaseOptions& options) {
    const std::string outcome = column("outcome").value_or("");
    if (outcome == "started") return std::nullopt;
    LeaseResult result;
    result.expires_epoch = detail::expiry_of(column);
    if ((outcome == "replay" || outcome == "secret_replay") && options.policy != Policy::remember) {
        result.outcome = LeaseOutcome::duplicate;
        result.response = detail::stamped(
            problem_response(Problem::already_processed,
                             "A request with this Idempotency-Key was already processed; its "
                             "result is not kept.",
                             options.problem_type_base),
            result.expires_epoch);
        return result;
    }
    result.outcome = outcome == "mismatch"      ? LeaseOutcome::mismatch
                     : outcome == "in_progress" ? LeaseOutcome::in_progress
                     : outcome == "expired"     ? LeaseOutcome::expired
                                                : LeaseOutcome::replayed;
    std::optional<Response> answer = detail::answer_of(column);
    if (!answer)
        throw std::runtime_error("idempotency.acquire returned an unknown outcome: " + outcome);
    result.response = std::move(*answer);
    return result;
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
        return detail::stored_expiry(tx, principal, key);
    }
    bool store(const Response& response, const std::vector<std::string>& kept_headers) const {
        return pq::exec1(
                   tx,
                   "SELECT idempotency.complete($1, $2, fence => $3, status => $4, body => $5,"
                   " headers => $6::jsonb, resource_id => $7, one_time_secret => $8)",
                   principal, key, fence, response.status, pq::bytes(response.body),
                   detail::kept_headers_json(response, kept_headers),
                   pq::c_str_or_null(response.resource_id), response.one_time_secret)[0]
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
    const pqxx::result rows =
        acquire(connection(), detail::key_call(request, key, digest, options_), options_);
    const detail::ColumnReader column = detail::columns_of(rows[0]);  // one row, always
    if (std::optional<LeaseResult> answered = answer_without_running(column, options_))
        return std::move(*answered);
    result.fence = std::stoll(*column("fence"));
    const std::optional<long long> acquired = detail::expiry_of(column);

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
    result.outcome = (settled && !lost) ? LeaseOutcome::fresh : LeaseOutcome::fresh_unfenced;
    result.expires_epoch = settled && kept ? fenced.expiry(acquired) : std::nullopt;
    result.response = detail::stamped(std::move(response), result.expires_epoch);
    return result;
}

}  // namespace idem
