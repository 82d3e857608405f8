// HTTP side of pg_idempotency's client: responses, headers, problem bodies.
// No database here; tested on its own.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/protocol_gen.hpp"

namespace idem {

/// HTTP header fields in order; names compare case-insensitively.
using Headers = std::vector<std::pair<std::string, std::string>>;

/// True when two header names are equal ignoring ASCII case.
bool header_name_equal(std::string_view a, std::string_view b) noexcept;

/// Where a streamed body goes: the transport's chunked writer (an HTTP server's).
class ChunkSink {
public:
    virtual ~ChunkSink() = default;
    /// Sends one chunk (chunked transfer) and flushes it. False when the peer has gone:
    /// the producer should stop, and the client then stores nothing.
    virtual bool write(std::string_view chunk) = 0;
};

/// Produces a streamed body: calls `sink.write()` once per chunk, in order (an empty
/// chunk is skipped: chunked transfer would read it as the end).
using BodyStream = std::function<void(ChunkSink& sink)>;

/// An HTTP response produced by a handler or by the client library.
struct Response {
    /// HTTP status code (100..599).
    int status = 200;
    /// Header fields to send.
    Headers headers;
    /// Body bytes, sent and stored as they are.
    std::string body;
    /// True when this response is a stored one played back for a retry.
    bool replayed = false;
    /// Id of the resource the request created, stored with the key (for support and mismatch
    /// reports).
    std::optional<std::string> resource_id;
    /// The response carries a secret (a new API key, say): it is sent once and never stored.
    bool one_time_secret = false;
    /// A streamed body (chunked transfer): when set, `body` is not sent. The transport
    /// sends status and headers, then calls `stream` with its chunked writer. A handler
    /// sets it to stream; Client::handle() returns it wrapped (each chunk is captured on
    /// its way, and the key is completed when the stream ends), and a replay of a stored
    /// stream sets it to send the same chunks again. See docs/client.md, "Streams".
    BodyStream stream;

    /// The value of the first header with this name, or nullptr.
    const std::string* header(std::string_view name) const noexcept;
    /// Replaces every header with this name by one with `value`.
    void set_header(std::string_view name, std::string value);
};

/// Formats seconds since the Unix epoch as an RFC 9110 IMF-fixdate
/// ("Sun, 06 Nov 1994 08:49:37 GMT").
std::string http_date(long long epoch_seconds);

/// The slug of a problem type ("idempotency-key-reuse"), appended to the type base URI.
const char* problem_slug(Problem problem) noexcept;

/// The HTTP status of a problem type.
int problem_status(Problem problem) noexcept;

/// Builds an `application/problem+json` response (RFC 9457) with `type`
/// (`type_base` + slug), `title`, `status` and `detail`, serialized with
/// nlohmann_json.
Response problem_response(Problem problem, std::string_view detail, std::string_view type_base);

/// Splits a stored streamed body by its `:chunks` entry ("5,5,3"); throws
/// std::invalid_argument when the lengths are not decimal or do not add up to the body.
std::vector<std::string> split_chunks(std::string_view body, std::string_view lengths);

}  // namespace idem
