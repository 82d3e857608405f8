// The lease protocol from C++: run an effect outside the database (an upstream
// HTTP call, a payment provider, a broker) at most once per key, with the key
// held by a lease that a background thread renews while the effect runs.
//
//   idem::LeaseRunner runner("dbname=shop", {idem::Policy::remember});
//   idem::LeaseResult result = runner.run(request, [&] { return call_upstream(); });
//   switch (result.outcome) { ... }   // result.response is ready to send
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "idem/client.hpp"
#include "idem/http.hpp"
#include "idem/options.hpp"

namespace idem {

/// What happens to the key after the effect ran.
enum class Policy {
    /// At most once: the key is marked done whether the body succeeded, failed or
    /// threw, for the key's TTL; every later call is a duplicate.
    once,
    /// Done on success (a status below 400); a failure or an exception releases the
    /// key so that a retry runs the body again. Later calls after success are duplicates.
    commit_on_success,
    /// The body's final response is stored and replayed to later calls (like the
    /// transactional protocol); a non-final one (5xx, 429, 401...) or an exception
    /// releases the key.
    remember,
};

/// How a LeaseRunner::run call ended.
enum class LeaseOutcome {
    fresh,           ///< the body ran under this call and the key was settled with its fence
    replayed,        ///< policy remember: the stored response of an earlier call
    in_progress,     ///< another holder's lease is live (or a transaction holds the key): 409
    duplicate,       ///< policies once / commit_on_success: an earlier call already did it
    mismatch,        ///< the key was used for another request: 422
    fresh_unfenced,  ///< the body ran, but the lease was lost meanwhile: nothing was stored,
                     ///< another holder may have run (or may yet run) the body too
    rejected,        ///< missing or malformed key: 400
    expired,         ///< the key expired under an on_expiry 'refuse' policy (a tombstone): 410,
                     ///< the body did not run
};

/// Name of an outcome ("fresh_unfenced"), for logs and metrics.
const char* to_string(LeaseOutcome outcome) noexcept;

/// The effect: runs outside any database transaction and is never cancelled
/// (it may already have charged a card). May throw; then the policy decides.
using ExternalBody = std::function<Response()>;

/// Settings of a LeaseRunner. KeyOptions::duplicates (or Request::duplicates) set to
/// `reject` calls acquire with wait 0: a transaction holding the key is answered 409 at
/// once instead of after `wait` (a live lease is answered 409 at once in both modes).
struct LeaseOptions : KeyOptions {
    /// What a finished or failed body does to the key.
    Policy policy = Policy::remember;
    /// Length of the lease, 100 ms to 24 h; renewed every third of it, never
    /// more often than every 50 ms.
    std::chrono::milliseconds lease{30000};
    /// Renew the lease from a background thread while the body runs.
    bool renew = true;
    /// Consecutive failed renewals (errors, not a lost fence) after which renewing
    /// stops; a failed renewal is not a lost lease.
    int max_renew_failures = 3;
};

/// The result of one run.
struct LeaseResult {
    /// How the call ended.
    LeaseOutcome outcome = LeaseOutcome::fresh;
    /// What to send: the body's response (fresh, fresh_unfenced), the stored one
    /// (replayed, with Idempotent-Replay: true), or a problem response.
    Response response;
    /// The fence this call held (0 when it held none).
    std::int64_t fence = 0;
    /// Successful renewals while the body ran.
    int renewals = 0;
    /// When the key stops counting: its row's expires_at in seconds since the epoch (in
    /// the past for `expired`); empty when no row backs the answer (rejected,
    /// released). `response` already carries it as Idempotency-Expires.
    std::optional<long long> expires_epoch;
};

/// Runs external effects under leases. Not thread-safe: one runner per thread.
class LeaseRunner {
public:
    /// `conninfo` is used for the runner's own connection (acquire, complete,
    /// release) and for a second connection per run for the renewal thread.
    explicit LeaseRunner(std::string conninfo, LeaseOptions options = {});
    ~LeaseRunner();
    LeaseRunner(const LeaseRunner&) = delete;
    LeaseRunner& operator=(const LeaseRunner&) = delete;

    /// Acquires the key, runs `body` while renewing the lease, and settles the
    /// key by the policy. The body's exception propagates after the key was
    /// settled (once: marked done; the other policies: released).
    LeaseResult run(const Request& request, const ExternalBody& body);

private:
    pqxx::connection& connection();
    bool is_final(int status);

    std::string conninfo_;
    LeaseOptions options_;
    std::unique_ptr<pqxx::connection> connection_;
    std::optional<std::array<bool, 500>> final_;  // index status - 100; empty until known
};

}  // namespace idem
