// RFC 8785 JSON Canonicalization Scheme (JCS) over UTF-8 input.
//
// This header is part of the shared core: no PostgreSQL headers, no global
// state. The extension and the client library link the same code so that
// both compute the same canonical bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace idem::core {

/// Why a document was rejected.
enum class JsonErrc : std::uint8_t {
    none = 0,
    syntax,           ///< not JSON: unexpected byte, missing token, trailing data, empty input
    invalid_utf8,     ///< bytes inside a string that are not well-formed UTF-8
    lone_surrogate,   ///< a \uD800..\uDFFF escape without its partner, or the pair reversed
    duplicate_name,   ///< an object has two members with the same name (after unescaping)
    number_overflow,  ///< a number whose magnitude is beyond the largest finite double
    too_deep,         ///< nesting of arrays and objects deeper than the configured limit
    too_large,        ///< the document is larger than the canonicalizer can address (4 GiB)
};

/// A short, lower-case English description of an error code ("duplicate member name").
const char* describe(JsonErrc code) noexcept;

/// The outcome of a failed canonicalization: the reason and the byte offset in the
/// input where the problem was found (0-based).
struct JsonError {
    JsonErrc code = JsonErrc::none;
    std::size_t offset = 0;

    /// "invalid JSON at byte 12: unexpected character", the form used in messages.
    std::string message() const;
};

/// Thrown by the throwing overloads; carries the same reason and byte offset.
class JsonException : public std::runtime_error {
public:
    explicit JsonException(const JsonError& error);
    /// The reason and offset of the failure.
    const JsonError& error() const noexcept { return error_; }

private:
    JsonError error_;
};

/// Asked now and then by a long computation whether to stop: returns true when
/// the caller wants it abandoned. Must be cheap, must not throw and must not
/// longjmp (the PostgreSQL extension reads its pending-interrupt flags).
using InterruptProbe = bool (*)() noexcept;

/// Thrown by a computation whose InterruptProbe returned true. Nothing was
/// produced; running the computation again gives the full result.
class Interrupted : public std::exception {
public:
    /// "interrupted".
    const char* what() const noexcept override;
};

/// Throws Interrupted when `probe` is set and returns true.
inline void check_interrupt(InterruptProbe probe) {
    if (probe != nullptr && probe()) throw Interrupted();
}

/// How often long loops ask the probe: every this many input bytes (or hashed
/// bytes), or every kPollItems items (pointers, members, comparisons).
inline constexpr std::size_t kPollBytes = std::size_t{1} << 16;
/// See kPollBytes.
inline constexpr std::size_t kPollItems = 4096;

/// Limits applied while parsing, and the interrupt probe.
struct CanonicalizeOptions {
    /// Deepest nesting of arrays and objects accepted; `[[1]]` has depth 2.
    std::size_t max_depth = 1000;
    /// Asked about every kPollBytes of input (and every kPollItems pointers,
    /// sort comparisons or members of one object) while canonicalizing and
    /// hashing; when it returns true the call throws Interrupted. Documents
    /// smaller than kPollBytes are never long enough to ask. nullptr: never asked.
    InterruptProbe interrupt = nullptr;
};

/// An RFC 6901 JSON Pointer, split into unescaped reference tokens.
class JsonPointer {
public:
    /// Parses a pointer such as `/a/b~1c/0`. Throws std::invalid_argument when the
    /// text is not a pointer (does not start with '/', or has a '~' not followed
    /// by '0' or '1'). The empty pointer (the whole document) is rejected too:
    /// excluding the whole body is never what a caller means.
    static JsonPointer parse(std::string_view text);

    /// The reference tokens, with `~1` and `~0` already turned into `/` and `~`.
    const std::vector<std::string>& tokens() const noexcept { return tokens_; }

private:
    std::vector<std::string> tokens_;
};

/// Many RFC 6901 pointers in a compact form: their unescaped tokens back to
/// back in one buffer, with 4 bytes of bookkeeping per token. What
/// canonicalize() excludes by; building it costs one pass over the pointer
/// texts and a few allocations however many pointers there are (a
/// std::vector<JsonPointer> costs a std::string per token).
class PointerList {
public:
    /// Parses a pointer (same rules and errors as JsonPointer::parse) and
    /// appends it. Throws std::length_error past 4 GiB of tokens. A long
    /// pointer asks `probe` every kPollBytes bytes (throws Interrupted).
    void add(std::string_view text, InterruptProbe probe = nullptr);
    /// Appends a parsed pointer (one without tokens excludes nothing).
    void add(const JsonPointer& pointer);
    /// Number of pointers added.
    std::size_t size() const noexcept { return first_token_.size() - 1; }
    /// True when no pointer was added.
    bool empty() const noexcept { return size() == 0; }
    /// Number of tokens of pointer `i`.
    std::size_t token_count(std::size_t i) const noexcept {
        return first_token_[i + 1] - first_token_[i];
    }
    /// Token `j` of pointer `i`, unescaped.
    std::string_view token(std::size_t i, std::size_t j) const noexcept {
        const std::size_t k = first_token_[i] + j;
        return std::string_view(bytes_.data() + offsets_[k], offsets_[k + 1] - offsets_[k]);
    }

private:
    void end_token();

    std::string bytes_;                      // the tokens, back to back
    std::vector<std::uint32_t> offsets_{0};  // token k is bytes_[offsets_[k], offsets_[k + 1])
    std::vector<std::uint32_t> first_token_{
        0};  // pointer i has tokens [first_token_[i], first_token_[i + 1])
};

/// Writes the RFC 8785 canonical form of `json` into `out`, replacing its content.
///
/// Members and array elements named by `exclude` (pointers resolved against the
/// input document; one that matches nothing is ignored, so are duplicates and
/// pointers below an excluded value) are left out of the output. The pointers
/// are sorted once and each member or element of a container that a pointer
/// reaches into is looked up by binary search: O(document + pointers x log
/// pointers) overall. Returns false and fills `error` when the input is not
/// acceptable; `out` is then unspecified. Never throws for bad input; may throw
/// std::bad_alloc, and Interrupted when options.interrupt fires.
bool canonicalize(std::string_view json, std::string& out, JsonError& error,
                  const CanonicalizeOptions& options = {},
                  const std::vector<JsonPointer>* exclude = nullptr);

/// The same, excluding by a PointerList (the form to use for many pointers).
bool canonicalize(std::string_view json, std::string& out, JsonError& error,
                  const CanonicalizeOptions& options, const PointerList& exclude);

/// Convenience form: returns the canonical text or throws JsonException.
std::string canonicalize(std::string_view json, const CanonicalizeOptions& options = {});

/// Largest number of bytes format_number writes.
inline constexpr std::size_t kMaxNumberChars = 32;

/// Writes ECMAScript Number::toString(value) (what JavaScript's String(x) prints)
/// into `buffer`, which must hold kMaxNumberChars bytes, and returns the length.
/// `value` must be finite; -0 prints as "0".
std::size_t format_number(double value, char* buffer) noexcept;

/// The same as a string.
std::string format_number(double value);

/// True when `a` sorts before `b` as sequences of UTF-16 code units, given both as
/// well-formed UTF-8 (the member order RFC 8785 prescribes).
bool utf16_less(std::string_view a, std::string_view b) noexcept;

}  // namespace idem::core
