// Pieces shared by Client (transactional protocol) and LeaseRunner (leases).
// Private to the library.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <pqxx/pqxx>

#include "idem/client.hpp"

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

/// Reads a column of a one-row result by name, as text; empty when NULL.
using ColumnReader = std::function<std::optional<std::string>(const char* name)>;

/// The columns of a libpqxx row (a copy of the pqxx::row, or of the row_ref of libpqxx 8,
/// whose result must then outlive the reader).
template <class Row>
ColumnReader columns_of(const Row& row) {
    return [row](const char* name) -> std::optional<std::string> {
        if (row[name].is_null()) return std::nullopt;
        return row[name].template as<std::string>();
    };
}

/// The extension's answer (idempotency.http_answer) in a row of begin's, acquire's or
/// begin_batch's statement: columns status, headers (JSON text), body (bytea as text) and
/// resource_id; empty when status is NULL (started: the handler runs). The headers keep
/// their order; a name starting with ":" is the client's instruction, not sent: a stored
/// stream's `:chunks` gives the chunks back (`stream` set, `body` empty). `replayed` when
/// it carries Idempotent-Replay.
std::optional<Response> answer_of(const ColumnReader& column);

/// The key row's expiry in seconds since the epoch (column expires_epoch; NULL: none).
std::optional<long long> expiry_of(const ColumnReader& column);

/// `response` with Idempotency-Expires set to the key's expiry (when known), replacing any
/// value the handler set, so that the header appears once.
Response stamped(Response response, std::optional<long long> expires_epoch);

/// One keyed request's arguments to begin() or acquire(), complete() and save_final().
struct KeyCall {
    std::string principal;
    std::string key;
    /// Request::action, or "METHOD path".
    std::string action;
    /// The fingerprint: 32 raw bytes.
    std::string digest;
    /// Intervals as text; empty: NULL, the server's setting.
    std::optional<std::string> ttl, wait;
};

/// The arguments of `request` (whose key is `key`) under `options`: wait 0 when
/// duplicates are rejected (409 at once), else KeyOptions::wait.
KeyCall key_call(const Request& request, const std::string& key, const Digest& digest,
                 const KeyOptions& options);

/// idempotency.complete() as Client sends it (unprepared, and the text it prepares);
/// also what completes a key when its streamed response ends (stream.cpp).
inline constexpr const char* complete_sql =
    "SELECT idempotency.complete($1, $2, $3, $4, $5::jsonb, $6, $7)";

/// A key row's expiry in seconds since the epoch (no row: none), read again where the
/// server started the ttl at its own now(): after save_final, and after a lease completed
/// past acquire's expiry.
std::optional<long long> stored_expiry(pqxx::transaction_base& tx, const std::string& principal,
                                       const std::string& key);

/// Upper-case ASCII copy.
std::string upper(std::string text);

/// An interval literal for SQL: "N milliseconds".
std::string interval_ms(std::chrono::milliseconds value);

}  // namespace idem::detail
