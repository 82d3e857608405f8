// Many keys in one call, from C++: the extension's begin_batch, complete_batch
// and claim_batch on a libpqxx transaction, and push_unique (enqueue a job at
// most once, in the caller's transaction).
//
//   pqxx::work tx(connection);
//   auto outcomes = idem::begin_batch(tx, "consumer-1", keys, "consume", digests);
//   ... the consumer's writes for the rows whose outcome is "started" ...
//   idem::complete_batch(tx, "consumer-1", started_keys, responses);
//   tx.commit();
//
//   if (idem::push_unique(tx, "producer", "job-7", std::chrono::hours(24),
//                         [&](pqxx::transaction_base& t) { t.exec("INSERT INTO jobs ..."); }))
//       ...  // enqueued by this call
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <pqxx/pqxx>

#include "idem/client.hpp"

namespace idem {

/// One row of idempotency.begin_batch: a key's outcome, as idempotency.begin gives it.
struct BatchOutcome {
    using Time = std::chrono::system_clock::time_point;
    int ord = 0;          ///< 1-based position of the key in the call's keys
    std::string key;      ///< the key
    std::string outcome;  ///< started, replay, mismatch, in_progress, secret_replay (or newer)
    std::optional<int> response_status;           ///< replay, secret_replay
    std::optional<std::string> response_headers;  ///< replay: the stored headers (JSON text)
    std::optional<std::string> response_body;     ///< replay: the stored body
    std::optional<std::string> resource_id;       ///< replay, mismatch, secret_replay
    std::optional<Time> created_at;               ///< when the key was first used
    std::optional<Time> expires_at;               ///< when the key stops counting
    std::optional<std::int64_t> fence;            ///< the row's generation
    std::optional<Time> lease_until;              ///< in_progress under a lease
    /// The HTTP answer of an outcome that does not run the work, the extension's as for
    /// Client::handle (idempotency.http_answer: the stored response, 409, 410, 422, with
    /// Idempotency-Expires); empty when started.
    std::optional<Response> answer;
};

/// One row of complete_batch (completed) or claim_batch (claimed).
struct BatchFlag {
    int ord = 0;         ///< 1-based position of the key in the call's keys
    std::string key;     ///< the key
    bool value = false;  ///< completed, or claimed by this call
};

/// The response complete_batch stores for one key.
struct BatchResponse {
    int status = 200;                         ///< a final status (idempotency.is_final)
    std::optional<std::string> body;          ///< the body bytes
    std::optional<std::string> headers_json;  ///< headers to replay: a JSON object or pairs
    std::optional<std::string> resource_id;   ///< what the request created
};

/// idempotency.begin_batch: begin for each key (fingerprints[i] is the request
/// of keys[i]), one row per key in input order, each with its answer
/// (BatchOutcome::answer, under `problem_type_base`, Retry-After `retry_after`
/// when no lease says more). Started keys are held by `tx`
/// until it ends: complete them all (complete_batch) before committing.
/// Throws std::invalid_argument when the sizes differ, pqxx::sql_error with the
/// server's SQLSTATE for what the server refuses (22023, 22P02, 54000, 55000).
std::vector<BatchOutcome> begin_batch(
    pqxx::transaction_base& tx, const std::string& principal, const std::vector<std::string>& keys,
    const std::string& action, const std::vector<Digest>& fingerprints,
    std::optional<std::chrono::milliseconds> ttl = std::nullopt,
    std::optional<std::chrono::milliseconds> wait = std::nullopt,
    const std::string& problem_type_base = default_problem_type_base,
    std::chrono::seconds retry_after = std::chrono::seconds(default_retry_after_seconds));

/// idempotency.complete_batch: stores responses[i] for keys[i], each begun in
/// `tx`; every row's value is true (a key that cannot be completed fails the
/// whole call, before anything is stored). std::invalid_argument when the
/// sizes differ.
std::vector<BatchFlag> complete_batch(pqxx::transaction_base& tx, const std::string& principal,
                                      const std::vector<std::string>& keys,
                                      const std::vector<BatchResponse>& responses);

/// idempotency.claim_batch: claims each key for `ttl` (empty: the server's
/// idempotency.key_ttl); a row's value is true when this call claimed the key.
/// The claims commit or roll back with `tx`.
std::vector<BatchFlag> claim_batch(pqxx::transaction_base& tx, const std::string& principal,
                                   const std::vector<std::string>& keys,
                                   std::optional<std::chrono::milliseconds> ttl = std::nullopt);

/// The caller's insert of a job row, run in the caller's transaction.
using Enqueue = std::function<void(pqxx::transaction_base&)>;

/// Enqueues a job at most once per key: inside `tx`, idempotency.claim(principal,
/// key, ttl); when it is true, runs `enqueue(tx)` and returns true; otherwise
/// returns false without running it. The claim and the job row commit together
/// (or neither does). An exception from `enqueue` propagates; roll `tx` back then.
bool push_unique(pqxx::transaction_base& tx, const std::string& principal, const std::string& key,
                 std::optional<std::chrono::milliseconds> ttl, const Enqueue& enqueue);

/// A PostgreSQL array literal ('{"a","b\\"c",NULL}') of `elements`, each quoted
/// (an empty optional is NULL): how the batch functions pass their arrays as
/// one text parameter, cast to text[], bytea[] or jsonb[] on the server.
std::string array_literal(const std::vector<std::optional<std::string>>& elements);

}  // namespace idem
