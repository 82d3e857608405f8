// pg_idempotency client library: runs an application handler through the
// extension's transactional protocol and maps the outcome to HTTP.
//
//   idem::Client client(connection);
//   idem::Response response = client.handle(request, [&](pqxx::work& tx) {
//       auto id = tx.exec_params1("INSERT INTO orders ... RETURNING id", ...)[0].as<long>();
//       idem::Response created{201};
//       created.body = ...;
//       created.set_header("Location", "/orders/" + std::to_string(id));
//       return created;
//   });
//
// A handler may also take any libpqxx transaction (pqxx::transaction_base&).
// Then, on an idem::Connection, BEGIN travels with idempotency.begin() and
// idempotency.complete() with COMMIT (libpq pipeline mode): the wrapper adds no
// network round trip to the handler's own transaction.
//
// One Client per connection, one connection per thread (libpqxx connections
// are not thread-safe).
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <pqxx/pqxx>

#include "idem/connection.hpp"
#include "idem/fault.hpp"
#include "idem/http.hpp"
#include "idem/options.hpp"

namespace idem {

/// A SHA-256 request fingerprint (the same bytes as idempotency.fingerprint()).
using Digest = std::array<unsigned char, 32>;

/// An incoming HTTP request, as far as idempotency is concerned.
struct Request {
    /// Whoever the key belongs to: user id, API key id, tenant. Keys never cross principals.
    std::string principal;
    /// The Idempotency-Key header, if the client sent one.
    std::optional<std::string> key;
    /// HTTP method ("POST").
    std::string method;
    /// Request target ("/orders").
    std::string path;
    /// Request body bytes, if any.
    std::optional<std::string> body;
    /// A digest the caller computed already (then `body` and `exclude` are not used).
    std::optional<Digest> digest;
    /// RFC 6901 pointers of body members left out of the fingerprint (timestamps, nonces).
    std::vector<std::string> exclude;
    /// Operation name stored with the key; empty means "METHOD path".
    std::string action;
    /// Wait or reject a duplicate for this call; empty: Options::duplicates.
    std::optional<Duplicates> duplicates;
};

/// Computes the request fingerprint with the shared core, exactly as
/// idempotency.fingerprint() does on the server. Throws std::invalid_argument
/// for a method that is not an HTTP token, a path with a line feed or a bad
/// pointer, and idem::BodyError for a JSON body nested too deeply.
Digest fingerprint(const Request& request, std::size_t max_json_depth = 1000);

/// Thrown by fingerprint() when the body cannot be fingerprinted.
class BodyError : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

/// The application's handler: runs inside the transaction that holds the key
/// and returns the response. It may throw; then nothing is stored.
using Handler = std::function<Response(pqxx::work&)>;

/// A handler that works with any libpqxx transaction. On an idem::Connection
/// it runs in a transaction whose BEGIN and COMMIT carry the protocol's
/// statements (one round trip each); elsewhere in a pqxx::work.
using TransactionHandler = std::function<Response(pqxx::transaction_base&)>;

/// How the client behaves.
struct Options : KeyOptions {
    /// Methods that must carry an Idempotency-Key (400 without one). Other methods
    /// run without the protocol unless the client sends a key anyway.
    std::vector<std::string> methods_requiring_key{"POST", "PATCH"};
    /// Attempts in all for one request when the database reports a serialization
    /// failure (40001) or a deadlock (40P01). Each attempt runs the handler anew
    /// with a fresh response.
    int max_attempts = 3;
    /// Retry-After for in_progress answers when no lease end is known.
    std::chrono::seconds retry_after{1};
    /// Statuses that are stored, in the syntax of idempotency.final_statuses
    /// ("2xx,400,409"). Empty: read the server's setting once, on first use.
    std::string final_statuses;
    /// Run idempotency.begin() and complete() as named server-side prepared
    /// statements (idempotency_begin_1, idempotency_complete_1 and their *_p1
    /// twins for pipelining), parsed and planned once per connection instead of
    /// on every request. Off by default because pgbouncer in transaction pooling
    /// mode cannot route them (before 1.21 and its max_prepared_statements);
    /// turn it on for direct connections and session pooling. With libpqxx 7
    /// and 8 the Client's constructor prepares them at once: make the Client
    /// while no transaction is open on the connection.
    bool prepare_statements = false;
    /// Longest streamed body kept, in bytes (the sum of its chunks; a handler streams by
    /// setting Response::stream). A longer stream is still sent whole, once; the key is
    /// completed without its body and a retry gets 409 response-not-kept.
    std::size_t max_stream_bytes = default_max_stream_bytes;
};

namespace detail {
class CapturingSink;
}

/// Counts of outcomes since the client was created (for metrics).
struct Counters {
    unsigned long long started = 0, replayed = 0, mismatched = 0, in_progress = 0,
                       secret_replayed = 0, stored_errors = 0, not_stored = 0, retries = 0,
                       rejected_keys = 0, streams_not_kept = 0;
    /// Retries of keys that expired under an on_expiry 'refuse' policy (410).
    unsigned long long expired = 0;
};

/// Runs handlers through begin / handler / complete on one connection.
class Client {
public:
    /// The connection must stay open for the client's lifetime; it may point at
    /// PostgreSQL or at pgbouncer in transaction pooling mode (the client keeps no
    /// session state and uses no named prepared statements).
    explicit Client(PqxxConnection& connection, Options options = {});

    /// The same on an idem::Connection: TransactionHandler handlers then run
    /// with BEGIN + idempotency.begin() and idempotency.complete() + COMMIT sent
    /// as one round trip each (libpq pipeline mode, also through pgbouncer in
    /// transaction pooling mode).
    explicit Client(Connection& connection, Options options = {});

    /// Handles one request:
    ///  - no key where one is required, or a malformed key: 400 problem;
    ///  - started: runs the handler in the transaction that holds the key. A final
    ///    success is stored with complete() and committed with the handler's
    ///    writes; a final error (4xx) is rolled back and stored with save_final();
    ///    anything else (401, 429, 3xx, 5xx) is rolled back and not stored;
    ///  - the outcomes that do not run the handler get the extension's answer
    ///    (idempotency.http_answer, in begin's statement), sent as it is:
    ///  - replay: the stored status, kept headers and body, Idempotent-Replay: true;
    ///  - mismatch: 422; in_progress: 409 with Retry-After; secret_replay: 409;
    ///  - expired (a key that expired under an on_expiry 'refuse' policy): 410 with
    ///    Idempotency-Expires set to the past expiry; the handler does not run.
    /// A handler that streams (sets Response::stream) gets back a response whose stream
    /// runs the handler's stream, still in the transaction that holds the key, captures
    /// each chunk on its way and completes the key when it ends (Options::max_stream_bytes);
    /// a replay of a stored stream sends the same chunks. The caller's transport must run
    /// (or drop) that stream before this client or its connection serve anything else.
    /// Serialization failures and deadlocks are retried (Options::max_attempts);
    /// when attempts run out the last pqxx::serialization_failure or
    /// pqxx::deadlock_detected propagates. A commit whose outcome is unknown
    /// (pqxx::in_doubt_error, 40003) is never retried and propagates, as do the
    /// handler's own exceptions (then nothing is stored).
    Response handle(const Request& request, const Handler& handler) {
        return handle_request(request, &handler, nullptr);
    }

    /// handle() for a handler that takes pqxx::transaction_base& (see
    /// TransactionHandler): the same outcomes, fewer round trips on an
    /// idem::Connection.
    template <class F, std::enable_if_t<
                           std::is_invocable_r_v<Response, F&, pqxx::transaction_base&>, int> = 0>
    Response handle(const Request& request, F&& handler) {
        const TransactionHandler any(std::forward<F>(handler));
        return handle_request(request, nullptr, &any);
    }

    /// Outcome counts so far.
    const Counters& counters() const noexcept { return counters_; }

    /// Whether a response with this status is stored (Options::final_statuses or the server's).
    bool is_final(int status);

private:
    struct Call;
    struct Attempt;
    struct StreamState;
    enum class Disposition { discard, store_error, keep };

    Response handle_request(const Request& request, const Handler* handler,
                            const TransactionHandler* any);
    // One attempt: begin() with the extension's answer, or the handler and the key settled.
    Response run_attempt(const Call& call, const Handler* handler, const TransactionHandler* any);
    // Opens the attempt's transaction with begin() in it (pipelined: in BEGIN's round trip).
    Attempt begin(const Call& call, bool pipelined);
    Disposition dispose(const Response& response);
    // Stores a final error alone; returns the stored row's expiry (epoch seconds).
    std::optional<long long> store_final_error(const Call& call, const Response& response,
                                               const std::string& headers);
    // Stores a final success with complete() and commits (pipelined: in COMMIT's round trip).
    void complete(Attempt& attempt, const Call& call, const Response& response,
                  const std::string& headers);
    // A started streamed response: the returned stream owns the attempt (stream.cpp).
    Response stream_response(const Call& call, Attempt attempt, Response response,
                             Disposition disposition);
    void finish_stream(const Call& call, Attempt& attempt, const Response& head,
                       Disposition disposition, const detail::CapturingSink& capture);

    void prepare_raw(PGconn* raw);

    PqxxConnection& connection_;
    Connection* pipelined_ = nullptr;  // set when connection_ is an idem::Connection
    // The raw connection (and its server process) the *_p1 statements were
    // prepared on; anything else (a reconnect) prepares them again.
    const void* prepared_on_ = nullptr;
    int prepared_pid_ = 0;
    Options options_;
    std::optional<std::array<bool, 500>> final_;  // index status - 100; empty until known
    Counters counters_;
};

}  // namespace idem
