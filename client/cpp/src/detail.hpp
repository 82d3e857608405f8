// Pieces shared by Client (transactional protocol) and LeaseRunner (leases).
// Private to the library.
#pragma once

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <pqxx/pqxx>

#include "idem/connection.hpp"
#include "idem/http.hpp"

namespace idem::detail {

/// 1 to max_length visible ASCII characters (what an HTTP header can carry).
bool valid_key(const std::string& key, std::size_t max_length);

/// Which statuses are stored: flags for 100..599 (index status - 100).
using FinalStatuses = std::optional<std::array<bool, 500>>;

/// Parses an explicit list ("2xx,409"); throws std::invalid_argument when it is not one.
FinalStatuses parse_final_statuses(const std::string& text);

/// Whether `status` is stored. On first use an empty cache is filled by asking the
/// server's idempotency.is_final() (its settings exist only once the extension's
/// library is loaded in the session, which that call does).
bool is_final(FinalStatuses& cache, PqxxConnection& connection, int status);

/// The kept headers of a response as a JSON object text.
std::string kept_headers_json(const Response& response, const std::vector<std::string>& kept);

/// A stored response from its columns (empty: NULL); marked replayed, with
/// Idempotent-Replay: true.
Response stored_response(int status, const std::optional<std::string>& headers_json,
                         std::optional<std::string> body, std::optional<std::string> resource_id);

/// The same from a row with response_status, response_headers (text),
/// response_body and resource_id.
Response stored_response(const pqxx::row& row);

/// idempotency.complete() as Client sends it (unprepared, and the text it prepares);
/// also what completes a key when its streamed response ends (stream.cpp).
inline constexpr const char* complete_sql =
    "SELECT idempotency.complete($1, $2, $3, $4, $5::jsonb, $6, $7)";

/// A key row's expiry in seconds since the epoch (column expires_epoch; no row: none),
/// read again where the server started the ttl at its own now(): after save_final, and
/// after a lease completed past acquire's expiry.
inline constexpr const char* stored_expiry_sql =
    "SELECT floor(extract(epoch FROM expires_at))::bigint AS expires_epoch"
    "  FROM idempotency.lookup($1, $2)";

/// Upper-case ASCII copy.
std::string upper(std::string text);

/// An interval literal for SQL: "N milliseconds".
std::string interval_ms(std::chrono::milliseconds value);

/// The one mapping from an outcome of begin()/acquire() to an HTTP problem
/// response: mismatch 422, in_progress 409 with Retry-After (the lease's end
/// when known, else retry_after), secret_replay 409 with Idempotent-Replay.
/// Empty for started and replay, which are not problems.
std::optional<Response> problem_for_outcome(const std::string& outcome,
                                            std::optional<int> lease_seconds,
                                            std::chrono::seconds retry_after,
                                            const std::string& problem_type_base);

}  // namespace idem::detail
