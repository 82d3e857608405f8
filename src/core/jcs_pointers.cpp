// RFC 6901 JSON pointers: the one parser of a pointer's text, behind both
// JsonPointer::parse and PointerList::add.
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "jcs.hpp"

namespace idem::core {

namespace {

// The one parser of RFC 6901 pointer text: checks `text` and hands each byte
// of each unescaped reference token to byte(c), and the end of each token to
// end_token(). Throws std::invalid_argument for the empty pointer (excluding
// the whole body is never what a caller means), one that does not start with
// '/', and a '~' not followed by '0' or '1'; asks `probe` every kPollBytes
// bytes (throws Interrupted).
template <typename Byte, typename EndToken>
void parse_pointer(std::string_view text, InterruptProbe probe, Byte byte, EndToken end_token) {
    if (text.empty())
        throw std::invalid_argument("JSON pointer \"\" would exclude the whole document");
    if (text.front() != '/') throw std::invalid_argument("JSON pointer must start with '/'");
    for (std::size_t i = 1; i <= text.size(); ++i) {
        if (i % kPollBytes == 0) check_interrupt(probe);
        if (i == text.size() || text[i] == '/') {
            end_token();
            continue;
        }
        const char c = text[i];
        if (c == '~') {
            if (i + 1 >= text.size() || (text[i + 1] != '0' && text[i + 1] != '1'))
                throw std::invalid_argument("JSON pointer has '~' not followed by '0' or '1'");
            byte(text[i + 1] == '0' ? '~' : '/');
            ++i;
        } else {
            byte(c);
        }
    }
}

}  // namespace

JsonPointer JsonPointer::parse(std::string_view text) {
    JsonPointer pointer;
    std::string token;
    parse_pointer(
        text, nullptr, [&token](char c) { token.push_back(c); },
        [&pointer, &token] {
            pointer.tokens_.push_back(std::move(token));
            token.clear();
        });
    return pointer;
}

void PointerList::end_token() {
    if (bytes_.size() > std::numeric_limits<std::uint32_t>::max() ||
        offsets_.size() >= std::numeric_limits<std::uint32_t>::max())
        throw std::length_error("JSON pointers longer than 4 GiB in all");
    offsets_.push_back(static_cast<std::uint32_t>(bytes_.size()));
}

void PointerList::add(std::string_view text, InterruptProbe probe) {
    const std::size_t bytes = bytes_.size(), offsets = offsets_.size();
    try {
        parse_pointer(
            text, probe, [this](char c) { bytes_.push_back(c); }, [this] { end_token(); });
    } catch (...) {  // leaves the list as it was
        bytes_.resize(bytes);
        offsets_.resize(offsets);
        throw;
    }
    first_token_.push_back(static_cast<std::uint32_t>(offsets_.size() - 1));
}

void PointerList::add(const JsonPointer& pointer) {
    for (const std::string& token : pointer.tokens()) {
        bytes_ += token;
        end_token();
    }
    first_token_.push_back(static_cast<std::uint32_t>(offsets_.size() - 1));
}

}  // namespace idem::core
