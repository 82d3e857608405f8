// Options that Client (transactional protocol) and LeaseRunner (leases) share.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace idem {

/// What a duplicate does while the first request with its key is still running.
enum class Duplicates {
    wait,    ///< wait for the first (up to `wait`), then replay its response (the default)
    reject,  ///< 409 request-in-progress with Retry-After at once (begin/acquire with wait 0)
};

/// What both runners need to know about keys, stored responses and problems.
struct KeyOptions {
    /// Response headers stored with the key and replayed (names, case-insensitive).
    std::vector<std::string> kept_headers{"Content-Type", "Location", "ETag", "Content-Location",
                                          "Last-Modified"};
    /// How long begin()/acquire() wait for a transaction holding the same key;
    /// empty: the server's idempotency.wait_timeout.
    std::optional<std::chrono::milliseconds> wait;
    /// Wait or reject a duplicate of a running request; `reject` sends wait => 0 (and
    /// overrides `wait`). Request::duplicates overrides it per call.
    Duplicates duplicates = Duplicates::wait;
    /// How long a key counts; empty: the server's idempotency.key_ttl.
    std::optional<std::chrono::seconds> ttl;
    /// Prefix of the problem `type` URIs (RFC 9457 allows relative references).
    std::string problem_type_base = "/problems/";
    /// Longest key accepted before asking the server (keep in line with
    /// idempotency.max_key_length).
    std::size_t max_key_length = 255;
};

}  // namespace idem
