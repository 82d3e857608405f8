// Many keys in one call: the batch functions of the extension and push_unique.
// Arrays travel as one text parameter each, an array literal cast on the
// server (libpqxx 6 has no array parameters); every value is a parameter.
#include "idem/batch.hpp"

#include <algorithm>
#include <climits>
#include <stdexcept>

#include "detail.hpp"
#include "pqxx_compat.hpp"

namespace idem {

namespace {

// Each key's answer (but a started one's) from idempotency.http_answer in the same
// statement, as begin's in client.cpp ($7 the problem type base, $8 Retry-After).
const char* const kBeginBatch =
    "SELECT b.ord, b.key, b.outcome, b.response_status, b.response_headers::text, "
    "b.response_body, b.resource_id, "
    "(extract(epoch FROM b.created_at) * 1000000)::bigint, "
    "(extract(epoch FROM b.expires_at) * 1000000)::bigint, b.fence, "
    "(extract(epoch FROM b.lease_until) * 1000000)::bigint, "
    "CASE WHEN b.outcome <> 'started' THEN "
    "(idempotency.http_answer(b, $7::text, $8::integer)).status END AS status, "
    "CASE WHEN b.outcome <> 'started' THEN "
    "(idempotency.http_answer(b, $7::text, $8::integer)).headers::text END AS headers, "
    "CASE WHEN b.outcome <> 'started' THEN "
    "(idempotency.http_answer(b, $7::text, $8::integer)).body END AS body "
    "FROM idempotency.begin_batch($1, $2::text[], $3, $4::bytea[], $5::interval, $6::interval) "
    "AS b ORDER BY b.ord";
const char* const kCompleteBatch =
    "SELECT c.ord, c.key, c.completed FROM idempotency.complete_batch($1, $2::text[], "
    "$3::integer[], $4::bytea[], $5::jsonb[], $6::text[]) AS c";
const char* const kClaimBatch =
    "SELECT c.ord, c.key, c.claimed FROM idempotency.claim_batch($1, $2::text[], $3::interval) "
    "AS c";
const char* const kClaim = "SELECT idempotency.claim($1, $2, $3::interval)";

std::vector<std::optional<std::string>> optional_all(const std::vector<std::string>& values) {
    return {values.begin(), values.end()};
}

// The bytea input form of `bytes`: \x and two hex digits a byte.
std::string hex_bytea(const std::string& bytes) {
    static const char digits[] = "0123456789abcdef";
    std::string text = "\\x";
    text.reserve(2 + 2 * bytes.size());
    for (unsigned char c : bytes) {
        text.push_back(digits[c >> 4]);
        text.push_back(digits[c & 15]);
    }
    return text;
}

// A field of a row (pqxx::field, or libpqxx 8's field_ref): microseconds since the epoch.
template <class Field>
std::optional<BatchOutcome::Time> time_of(const Field& field) {
    if (field.is_null()) return std::nullopt;
    return BatchOutcome::Time(std::chrono::microseconds(field.template as<long long>()));
}

// An interval parameter: "N milliseconds", or NULL (the server's default).
std::optional<std::string> interval_of(std::optional<std::chrono::milliseconds> value) {
    if (!value) return std::nullopt;
    return detail::interval_ms(*value);
}

std::vector<BatchFlag> flags_of(const pqxx::result& rows) {
    std::vector<BatchFlag> flags;
    flags.reserve(static_cast<std::size_t>(rows.size()));
    for (const auto& row : rows)
        flags.push_back({row[0].as<int>(), row[1].as<std::string>(), row[2].as<bool>()});
    return flags;
}

}  // namespace

std::string array_literal(const std::vector<std::optional<std::string>>& elements) {
    std::string text = "{";
    for (std::size_t i = 0; i < elements.size(); ++i) {
        if (i > 0) text.push_back(',');
        if (!elements[i]) {
            text += "NULL";
            continue;
        }
        // Quoted, so that commas, braces, blanks and the word NULL are data;
        // inside the quotes only " and \ need a backslash.
        text.push_back('"');
        for (char c : *elements[i]) {
            if (c == '"' || c == '\\') text.push_back('\\');
            text.push_back(c);
        }
        text.push_back('"');
    }
    text.push_back('}');
    return text;
}

std::vector<BatchOutcome> begin_batch(
    pqxx::transaction_base& tx, const std::string& principal, const std::vector<std::string>& keys,
    const std::string& action, const std::vector<Digest>& fingerprints,
    std::optional<std::chrono::milliseconds> ttl, std::optional<std::chrono::milliseconds> wait,
    const std::string& problem_type_base, std::chrono::seconds retry_after) {
    if (fingerprints.size() != keys.size())
        throw std::invalid_argument("begin_batch: one fingerprint per key");
    std::vector<std::optional<std::string>> digests;
    digests.reserve(fingerprints.size());
    for (const Digest& digest : fingerprints)
        digests.emplace_back(hex_bytea(std::string(digest.begin(), digest.end())));
    const std::string key_array = array_literal(optional_all(keys));
    const std::string digest_array = array_literal(digests);
    const auto ttl_text = interval_of(ttl);
    const auto wait_text = interval_of(wait);
    const pqxx::result rows =
        pq::exec(tx, kBeginBatch, principal, key_array, action, digest_array,
                 pq::c_str_or_null(ttl_text), pq::c_str_or_null(wait_text), problem_type_base,
                 std::clamp<long long>(retry_after.count(), 1, INT_MAX));
    std::vector<BatchOutcome> outcomes;
    outcomes.reserve(static_cast<std::size_t>(rows.size()));
    for (const auto& row : rows) {
        const detail::ColumnReader column = detail::columns_of(row);
        BatchOutcome outcome;
        outcome.ord = row[0].as<int>();
        outcome.key = row[1].as<std::string>();
        outcome.outcome = row[2].as<std::string>();
        if (!row[3].is_null()) outcome.response_status = row[3].as<int>();
        outcome.response_headers = column("response_headers");
        if (!row[5].is_null()) outcome.response_body = pq::bytes_of(row[5]);
        outcome.resource_id = column("resource_id");
        outcome.created_at = time_of(row[7]);
        outcome.expires_at = time_of(row[8]);
        if (!row[9].is_null()) outcome.fence = row[9].as<std::int64_t>();
        outcome.lease_until = time_of(row[10]);
        outcome.answer = detail::answer_of(column);
        outcomes.push_back(std::move(outcome));
    }
    return outcomes;
}

std::vector<BatchFlag> complete_batch(pqxx::transaction_base& tx, const std::string& principal,
                                      const std::vector<std::string>& keys,
                                      const std::vector<BatchResponse>& responses) {
    if (responses.size() != keys.size())
        throw std::invalid_argument("complete_batch: one response per key");
    std::vector<std::optional<std::string>> statuses, bodies, headers, resource_ids;
    for (const BatchResponse& response : responses) {
        statuses.emplace_back(std::to_string(response.status));
        bodies.push_back(response.body ? std::optional<std::string>(hex_bytea(*response.body))
                                       : std::nullopt);
        headers.push_back(response.headers_json);
        resource_ids.push_back(response.resource_id);
    }
    return flags_of(pq::exec(tx, kCompleteBatch, principal, array_literal(optional_all(keys)),
                             array_literal(statuses), array_literal(bodies), array_literal(headers),
                             array_literal(resource_ids)));
}

std::vector<BatchFlag> claim_batch(pqxx::transaction_base& tx, const std::string& principal,
                                   const std::vector<std::string>& keys,
                                   std::optional<std::chrono::milliseconds> ttl) {
    const auto ttl_text = interval_of(ttl);
    return flags_of(pq::exec(tx, kClaimBatch, principal, array_literal(optional_all(keys)),
                             pq::c_str_or_null(ttl_text)));
}

bool push_unique(pqxx::transaction_base& tx, const std::string& principal, const std::string& key,
                 std::optional<std::chrono::milliseconds> ttl, const Enqueue& enqueue) {
    const auto ttl_text = interval_of(ttl);
    if (!pq::exec1(tx, kClaim, principal, key, pq::c_str_or_null(ttl_text))[0].as<bool>())
        return false;
    enqueue(tx);
    return true;
}

}  // namespace idem
