// Request fingerprints: SHA-256 over the method, the path and the canonical body.
//
// Shared core: no PostgreSQL headers. The SQL function idempotency.fingerprint
// and the client library both call fingerprint() so a client can send either
// the body or the digest and get the same key comparison.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jcs.hpp"

namespace idem::core {

/// A SHA-256 digest.
using Digest = std::array<unsigned char, 32>;

/// Bytes hashed between two questions to an InterruptProbe (1 MiB).
inline constexpr std::size_t kHashChunk = std::size_t{1} << 20;

/// SHA-256 of `data` (OpenSSL EVP), fed in chunks of kHashChunk bytes; asks
/// `probe` (when set) before each chunk and throws Interrupted when it fires.
/// Throws std::runtime_error if OpenSSL fails.
Digest sha256(std::string_view data, InterruptProbe probe = nullptr);

/// Lower-case hexadecimal form of a digest (64 characters).
std::string to_hex(const Digest& digest);

/// Thrown for a method or path that cannot be fingerprinted unambiguously.
class InvalidRequest : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

/// Throws InvalidRequest unless `method` is a non-empty HTTP token (RFC 9110
/// tchar); a newline in it would make two requests share a digest. Asks
/// `probe` every kPollBytes bytes (throws Interrupted when it fires).
void check_method(std::string_view method, InterruptProbe probe = nullptr);

/// Throws InvalidRequest if `path` holds a line feed (the field separator).
void check_path(std::string_view path);

/// SHA-256( upper(method) || '\n' || path || '\n' || body ), the body in its
/// RFC 8785 form when it is a JSON document that canonicalizes (valid UTF-8,
/// no duplicate names, numbers in range) after the members named by `exclude`
/// are removed, its raw bytes otherwise, and nothing when absent or empty. A
/// JSON body nested deeper than options.max_depth throws JsonException rather
/// than falling back to raw bytes: the digest must never depend on a limit.
/// Throws InvalidRequest for a bad method or path (see check_method, check_path).
/// With options.interrupt set, asks it while canonicalizing (see canonicalize)
/// and before each kHashChunk bytes hashed; throws Interrupted when it fires.
Digest fingerprint(std::string_view method, std::string_view path,
                   std::optional<std::string_view> body,
                   const std::vector<JsonPointer>& exclude = {},
                   const CanonicalizeOptions& options = {});

/// fingerprint(), excluding by a PointerList (the form to use for many pointers).
Digest fingerprint_excluding(std::string_view method, std::string_view path,
                             std::optional<std::string_view> body, const PointerList& exclude,
                             const CanonicalizeOptions& options = {});

}  // namespace idem::core
