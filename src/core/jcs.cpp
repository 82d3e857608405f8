// RFC 8785 canonicalizer.
//
// Design: a single pass parses the input and writes the canonical form as it
// goes; there is no tree. Scalars and array elements are written where they
// stand: an escape-free string is copied in the same 16-byte SSE2 blocks that
// are scanned for its closing quote; a string value with escapes is rewritten
// escape by escape (a member name is decoded into an arena instead, since it
// is sorted unescaped); a number already in canonical form is copied as it is,
// other numbers are laid out from their digits (up to 15 significant digits,
// or 16 to 17 when an exact 128-bit test shows them to be the shortest and
// closest decimal for their double) or else reformatted from their double
// (fast_float, then std::to_chars). An object's members are written in
// document order, each recorded with its name and the output offset of its
// text; when the object closes, the names are sorted (UTF-16 order, duplicates
// rejected; up to 16 ASCII names as 64-bit integers) and, unless they were
// already in order, the members' texts are copied in sorted order through a
// scratch buffer back over the object's text. A nested object is thus sorted
// before its parent moves it as one block.
//
// Nothing recurses: open containers live on an explicit stack, so the depth
// of the input is bounded only by CanonicalizeOptions::max_depth and never by
// the C stack. Excluded values (JSON pointers) are resolved during the same
// pass (see Document::run). Output room is reserved up front from the input
// size (plus one number's worth), which bounds everything but numbers; those
// check for room themselves.
#include "jcs.hpp"
#include "numbers.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include <fast_float/fast_float.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace idem::core {

const char* describe(JsonErrc code) noexcept {
    switch (code) {
        case JsonErrc::none: return "no error";
        case JsonErrc::syntax: return "invalid JSON";
        case JsonErrc::invalid_utf8: return "invalid UTF-8";
        case JsonErrc::lone_surrogate: return "lone or reversed UTF-16 surrogate";
        case JsonErrc::duplicate_name: return "duplicate member name";
        case JsonErrc::number_overflow: return "number out of range of a double";
        case JsonErrc::too_deep: return "nesting too deep";
        case JsonErrc::too_large: return "document too large";
    }
    return "unknown error";
}

std::string JsonError::message() const {
    std::string text = describe(code);
    text += " at byte ";
    text += std::to_string(offset);
    return text;
}

JsonException::JsonException(const JsonError& error)
    : std::runtime_error(error.message()), error_(error) {}

const char* Interrupted::what() const noexcept { return "interrupted"; }

JsonPointer JsonPointer::parse(std::string_view text) {
    if (text.empty())
        throw std::invalid_argument("JSON pointer \"\" would exclude the whole document");
    if (text.front() != '/') throw std::invalid_argument("JSON pointer must start with '/'");
    JsonPointer pointer;
    std::string token;
    for (std::size_t i = 1; i <= text.size(); ++i) {
        if (i == text.size() || text[i] == '/') {
            pointer.tokens_.push_back(std::move(token));
            token.clear();
            continue;
        }
        char c = text[i];
        if (c == '~') {
            if (i + 1 >= text.size() || (text[i + 1] != '0' && text[i + 1] != '1'))
                throw std::invalid_argument("JSON pointer has '~' not followed by '0' or '1'");
            token.push_back(text[i + 1] == '0' ? '~' : '/');
            ++i;
        } else {
            token.push_back(c);
        }
    }
    return pointer;
}

void PointerList::end_token() {
    if (bytes_.size() > std::numeric_limits<std::uint32_t>::max() ||
        offsets_.size() >= std::numeric_limits<std::uint32_t>::max())
        throw std::length_error("JSON pointers longer than 4 GiB in all");
    offsets_.push_back(static_cast<std::uint32_t>(bytes_.size()));
}

void PointerList::add(std::string_view text, InterruptProbe probe) {
    if (text.empty())
        throw std::invalid_argument("JSON pointer \"\" would exclude the whole document");
    if (text.front() != '/') throw std::invalid_argument("JSON pointer must start with '/'");
    const std::size_t bytes = bytes_.size(), offsets = offsets_.size();
    try {
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
                bytes_.push_back(text[i + 1] == '0' ? '~' : '/');
                ++i;
            } else {
                bytes_.push_back(c);
            }
        }
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

// ---------------------------------------------------------------------------
// Member order

bool utf16_less(std::string_view a, std::string_view b) noexcept {
    const std::size_t n = std::min(a.size(), b.size());
    const auto* x = reinterpret_cast<const unsigned char*>(a.data());
    const auto* y = reinterpret_cast<const unsigned char*>(b.data());
    for (std::size_t i = 0; i < n; ++i) {
        unsigned ca = x[i], cb = y[i];
        if (ca != cb) {
            // UTF-8 byte order is code point order. UTF-16 differs only where
            // U+E000..U+FFFF (lead byte EE/EF) meets a supplementary character
            // (lead byte F0..F4), which UTF-16 encodes with D800..DBFF first.
            if (ca >= 0xEE && cb >= 0xEE && ((ca >= 0xF0) != (cb >= 0xF0))) return ca > cb;
            return ca < cb;
        }
    }
    return a.size() < b.size();
}

namespace {

enum StringFlags : std::uint8_t {
    kInArena = 1,   // the unescaped text is in the arena, not in the input
    kRemoved = 4,   // a member excluded by a pointer
    kNonAscii = 8,  // holds bytes >= 0x80 (member order needs the UTF-16 rule)
};

inline bool same_bytes(std::string_view a, std::string_view b) {
    for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i] != b[i]) return false;
    return true;
}

// Byte classes for whitespace.
inline bool is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

inline int hex_value(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    c |= 0x20;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// The four hex digits at `at` (readable up to `end`) as a UTF-16 code unit;
// false when fewer than four remain or one is not a hex digit.
inline bool read_hex4(const unsigned char* at, const unsigned char* end, std::uint32_t& value) {
    if (end - at < 4) return false;
    value = 0;
    for (int i = 0; i < 4; ++i) {
        int h = hex_value(at[i]);
        if (h < 0) return false;
        value = value << 4 | static_cast<std::uint32_t>(h);
    }
    return true;
}

// A \uXXXX escape at `s`, with the \uXXXX of the low surrogate that must follow
// a high one: the code point and where the input goes on, or (next == nullptr)
// the error and where it is reported: a missing or bad hex digit at `s`, a lone
// or reversed surrogate at the first escape.
struct UnicodeEscape {
    const unsigned char* next;
    std::uint32_t code_point;
    JsonErrc error;
    const unsigned char* error_at;
};

inline UnicodeEscape read_unicode_escape(const unsigned char* s, const unsigned char* end) {
    std::uint32_t unit;
    if (!read_hex4(s + 2, end, unit)) return {nullptr, 0, JsonErrc::syntax, s};
    const unsigned char* after = s + 6;
    if (unit >= 0xDC00 && unit <= 0xDFFF) return {nullptr, 0, JsonErrc::lone_surrogate, s};
    if (unit < 0xD800 || unit > 0xDBFF) return {after, unit, JsonErrc::none, nullptr};
    std::uint32_t low;
    if (end - after < 6 || after[0] != '\\' || after[1] != 'u' || !read_hex4(after + 2, end, low) ||
        low < 0xDC00 || low > 0xDFFF)
        return {nullptr, 0, JsonErrc::lone_surrogate, s};
    return {after + 6, 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00), JsonErrc::none, nullptr};
}

// Length of the well-formed UTF-8 sequence starting at p (lead byte >= 0x80), or
// 0 when it is not well formed (overlong, surrogate, above U+10FFFF, truncated).
inline std::size_t utf8_sequence(const unsigned char* p, const unsigned char* end) {
    const unsigned c = p[0];
    const std::size_t avail = static_cast<std::size_t>(end - p);
    auto cont = [](unsigned b) { return (b & 0xC0) == 0x80; };
    if (c >= 0xC2 && c <= 0xDF) return (avail >= 2 && cont(p[1])) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (avail < 3 || !cont(p[2])) return 0;
        const unsigned b = p[1];
        if (c == 0xE0) return (b >= 0xA0 && b <= 0xBF) ? 3 : 0;
        if (c == 0xED) return (b >= 0x80 && b <= 0x9F) ? 3 : 0;
        return cont(b) ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (avail < 4 || !cont(p[2]) || !cont(p[3])) return 0;
        const unsigned b = p[1];
        if (c == 0xF0) return (b >= 0x90 && b <= 0xBF) ? 4 : 0;
        if (c == 0xF4) return (b >= 0x80 && b <= 0x8F) ? 4 : 0;
        return cont(b) ? 4 : 0;
    }
    return 0;
}

// Validates the run of non-ASCII bytes at s, moving s past it: whole UTF-8
// sequences up to the next ASCII byte or the end, each handed to
// each_sequence(start, length) once valid (a copy, or nothing). False, with s
// at the first byte that does not start a valid sequence, when one does not.
// The one place where strings are checked for UTF-8 (names, values, rewritten
// values).
template <typename EachSequence>
inline bool utf8_run(const unsigned char*& s, const unsigned char* end,
                     EachSequence each_sequence) {
    do {
        const std::size_t n = utf8_sequence(s, end);
        if (n == 0) return false;
        each_sequence(s, n);
        s += n;
    } while (s < end && *s >= 0x80);
    return true;
}

inline bool utf8_run(const unsigned char*& s, const unsigned char* end) {
    return utf8_run(s, end, [](const unsigned char*, std::size_t) {});
}

inline char* put_utf8(char* out, std::uint32_t cp) {
    if (cp < 0x80) {
        *out++ = static_cast<char>(cp);
    } else if (cp < 0x800) {
        *out++ = static_cast<char>(0xC0 | (cp >> 6));
        *out++ = static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *out++ = static_cast<char>(0xE0 | (cp >> 12));
        *out++ = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        *out++ = static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        *out++ = static_cast<char>(0xF0 | (cp >> 18));
        *out++ = static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        *out++ = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        *out++ = static_cast<char>(0x80 | (cp & 0x3F));
    }
    return out;
}

// A member name while its object is sorted. `prefix` holds the first 8 bytes
// big-endian, zero-padded: between ASCII names (where byte order is UTF-16
// order) unequal prefixes decide the order with one compare, and equal prefixes
// fall back to the remaining bytes (a name may contain NUL, so equal prefixes
// do not mean that the shorter name is a prefix of the longer one).
struct MemberName {
    std::uint64_t prefix;
    const char* data;
    std::uint32_t len;
    std::uint32_t node;  // the member's ordinal in its object
};

// The first 8 bytes of s as a big-endian number, zero-padded; s is readable up
// to `limit`, which lets most names load as one unaligned word.
inline std::uint64_t name_prefix(std::string_view s, const char* limit) {
    std::uint64_t word = 0;
    if (limit - s.data() >= 8) {
        std::memcpy(&word, s.data(), 8);
        word = __builtin_bswap64(word);
        if (s.size() < 8) word &= ~(~std::uint64_t{0} >> (8 * s.size()));  // keeps the name's bytes
    } else {
        for (std::size_t i = 0; i < 8 && i < s.size(); ++i)
            word |= std::uint64_t{static_cast<unsigned char>(s[i])} << (56 - 8 * i);
    }
    return word;
}

// Member order between ASCII names: bytes.
inline bool ascii_name_less(const MemberName& a, const MemberName& b) {
    if (a.prefix != b.prefix) return a.prefix < b.prefix;
    const std::uint32_t n = std::min(a.len, b.len);
    for (std::uint32_t i = 8; i < n; ++i)
        if (a.data[i] != b.data[i])
            return static_cast<unsigned char>(a.data[i]) < static_cast<unsigned char>(b.data[i]);
    return a.len < b.len;
}

// Member order in general: UTF-16 code units (RFC 8785 section 3.2.3).
inline bool utf16_name_less(const MemberName& a, const MemberName& b) {
    return utf16_less(std::string_view(a.data, a.len), std::string_view(b.data, b.len));
}

// Sorts names[0..count) with `less`: insertion sort for the few members of a
// typical API object (std::sort's bookkeeping costs more there).
template <typename Less>
inline void sort_names(MemberName* names, std::size_t count, Less less) {
    if (count > 16) {
        std::sort(names, names + count, less);
        return;
    }
    for (std::size_t i = 1; i < count; ++i) {
        const MemberName value = names[i];
        std::size_t hole = i;
        while (hole > 0 && less(value, names[hole - 1])) {
            names[hole] = names[hole - 1];
            --hole;
        }
        names[hole] = value;
    }
}

// A member of an object being parsed, in document order. Its canonical text
// ("name":value) is already in the output from out_pos on; the next member's
// text follows after one comma, or the object's text ends.
struct Member {
    std::uint64_t prefix;   // the name's first 8 bytes, see name_prefix
    std::uint64_t out_pos;  // output offset of the name's opening quote
    std::uint32_t key_pos;  // offset of the unescaped name in the input or the arena
    std::uint32_t key_len;
    std::uint32_t quote;  // input offset of the name's opening quote (error offsets)
    std::uint8_t flags;   // StringFlags
};

// An open array or object.
struct Frame {
    std::uint64_t out_pos;       // output offset just past the opening bracket
    std::uint64_t rewind;        // when dropped: the output offset to return to on close
    std::uint32_t first_member;  // object: its first entry in Document::members_
    std::uint32_t kept;          // array: elements written so far
    std::uint32_t index;         // array: index of the current element
    std::uint32_t match_begin;   // pointers that reach below this container:
    std::uint32_t match_end;     // Document::excluded_[match_begin, match_end)
    bool object;
    bool drop;  // an array element excluded by a pointer: its text is taken back on close
};

// Buffers reused across calls on one thread, so that canonicalizing many small
// documents does not pay for allocations each time (see release()).
struct Scratch {
    std::vector<Member> members;          // members of the open objects
    std::vector<Frame> stack;             // the open containers
    std::vector<MemberName> names;        // an object with many members being sorted
    std::vector<std::uint32_t> excluded;  // the exclusion pointers' indexes, sorted by their tokens
    std::vector<std::uint64_t> order;     // an object with many members: its sorted ordinals
    std::string arena;                    // unescaped strings
    std::string temp;                     // an object's text while its members are reordered

    void clear() {
        excluded.clear();
        arena.clear();
    }
    // Gives back memory after a large document instead of keeping it per thread.
    void release() {
        constexpr std::size_t kKeep = 1 << 18;
        if (members.capacity() > kKeep) std::vector<Member>().swap(members);
        if (stack.capacity() > kKeep) std::vector<Frame>().swap(stack);
        if (names.capacity() > kKeep) std::vector<MemberName>().swap(names);
        if (excluded.capacity() > kKeep) std::vector<std::uint32_t>().swap(excluded);
        if (order.capacity() > kKeep) std::vector<std::uint64_t>().swap(order);
        if (arena.capacity() > kKeep * 16) std::string().swap(arena);
        if (temp.capacity() > kKeep * 16) std::string().swap(temp);
    }
};

// A growable array over a borrowed (per-thread, reused) vector whose append
// is one compare and a store: std::vector::push_back compiles to a call in the
// parser's loop, which costs more than the work around it.
template <class T>
class Appender {
public:
    Appender(std::vector<T>& storage, std::size_t at_least) : storage_(storage) {
        if (storage_.size() < at_least) storage_.resize(at_least);
        data_ = storage_.data();
        capacity_ = storage_.size();
    }
    __attribute__((always_inline)) void push(const T& value) {
        if (size_ == capacity_) grow();
        data_[size_++] = value;
    }
    T& operator[](std::size_t i) { return data_[i]; }
    const T& operator[](std::size_t i) const { return data_[i]; }
    T& back() { return data_[size_ - 1]; }
    T* data() { return data_; }
    std::size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    /// Drops the last entry.
    void pop() { --size_; }
    /// Drops the entries from `size` on.
    void truncate(std::size_t size) { size_ = size; }

private:
    __attribute__((noinline)) void grow() {
        storage_.resize(storage_.size() * 2);
        data_ = storage_.data();
        capacity_ = storage_.size();
    }

    std::vector<T>& storage_;  // data_ points into it; size_ entries are used
    T* data_ = nullptr;
    std::size_t size_ = 0;
    std::size_t capacity_ = 0;
};

// Output slack: block copies (16 bytes at a time) may write this far past the
// end of what they copy.
constexpr std::size_t kWriteSlack = 16;

// Parses one document and writes its canonical form in the same pass.
//
// Output room: every construct but a number writes at most as many bytes as it
// consumes from the input (whitespace is dropped, escapes never grow, each
// comma written stands for one read), so the output keeps
// `cap_ - w >= (end_ - p) + kWriteSlack` and only numbers check for room.
class Document {
public:
    Document(std::string_view input, const CanonicalizeOptions& options, const PointerList* exclude,
             Scratch& scratch, std::string& out)
        : in_(reinterpret_cast<const unsigned char*>(input.data())),
          end_(in_ + input.size()),
          size_(input.size()),
          options_(options),
          exclude_(exclude),
          members_(scratch.members, 64),
          stack_(scratch.stack, 16),
          names_(scratch.names),
          excluded_(scratch.excluded),
          order_(scratch.order),
          arena_(scratch.arena),
          temp_(scratch.temp),
          out_(out),
          scratch_(scratch) {
        scratch.clear();
    }

    bool run(JsonError& error);

private:
    // The single pass; kPolled: asks options_.interrupt every kPollBytes of
    // input (a separate instance, so that the usual one carries no check).
    template <bool kPolled>
    bool run_pass(JsonError& error);
    // run_pass<true>, kept out of the usual path (a cleanup there costs the
    // usual pass registers); gives back the scratch buffers when interrupted.
    __attribute__((noinline)) bool run_polled(JsonError& error) {
        try {
            return run_pass<true>(error);
        } catch (...) {
            scratch_.release();
            throw;
        }
    }
    // Asks the interrupt probe (throws Interrupted) and sets the next point
    // where the polled pass asks again.
    __attribute__((noinline)) void poll(const unsigned char* at) {
        poll_at_ = static_cast<std::size_t>(end_ - at) > kPollBytes ? at + kPollBytes : end_;
        check_interrupt(options_.interrupt);
    }
    // Sorts the exclusion pointers into excluded_ and makes them all pending
    // for the root value.
    __attribute__((noinline)) void prepare_exclusions();
    void sort_exclusions();
    // Records the first error (code and input offset); returns false.
    bool fail(JsonErrc code, const unsigned char* at) {
        error_.code = code;
        error_.offset = static_cast<std::size_t>(at - in_);
        return false;
    }
    // Where parsing continues and writing continues after a value; p is null
    // after an error. The functions called out of line take and return the
    // positions by value: the parser's loop then keeps them in registers.
    struct Pos {
        const unsigned char* p;
        char* w;
    };
    Pos failed(JsonErrc code, const unsigned char* at) {
        fail(code, at);
        return {nullptr, nullptr};
    }
    template <bool kPolled>
    bool parse_string(const unsigned char*& p, char*& w, bool name);
    template <bool kPolled>
    __attribute__((noinline)) Pos parse_string_tail(const unsigned char* quote,
                                                    const unsigned char* s, char* w, bool name);
    template <bool kPolled>
    __attribute__((noinline)) Pos rewrite_escaped_string(const unsigned char* quote,
                                                         const unsigned char* s, char* w);
    template <bool kPolled>
    __attribute__((noinline)) Pos parse_escaped_string(const unsigned char* quote,
                                                       const unsigned char* s,
                                                       std::uint8_t non_ascii, char* w);
    __attribute__((noinline)) Pos parse_number(const unsigned char* p, char* w);
    template <bool kPolled>
    bool parse_member_name(const unsigned char*& p, char*& w);
    template <bool kPolled>
    __attribute__((noinline)) char* close_object(const Frame& frame, char* w);
    __attribute__((noinline)) char* grow(char* w, std::size_t need);
    bool descend(std::uint32_t begin, std::uint32_t end, std::size_t depth, std::string_view token);
    __attribute__((noinline)) void descend_member(const Frame& frame);
    __attribute__((noinline)) bool descend_element(const Frame& frame);

    // The unescaped name of a member (in the input or the arena).
    std::string_view key_text(const Member& m) const {
        const char* base =
            (m.flags & kInArena) ? arena_.data() : reinterpret_cast<const char*>(in_);
        return {base + m.key_pos, m.key_len};
    }

    const unsigned char* in_;
    const unsigned char* end_;
    std::size_t size_;
    const CanonicalizeOptions& options_;
    const PointerList* exclude_;
    JsonError error_;
    Appender<Member> members_;  // members of the open objects, innermost last
    Appender<Frame> stack_;     // the open containers, innermost last
    std::vector<MemberName>& names_;
    std::vector<std::uint32_t>& excluded_;
    std::vector<std::uint64_t>& order_;
    std::string& arena_;
    std::string& temp_;
    std::string& out_;
    Scratch& scratch_;
    char* base_ = nullptr;  // out_.data()
    char* cap_ = nullptr;   // out_.data() + out_.size()
    // The string parse_string consumed last (a member name is recorded from it).
    std::uint32_t str_pos_ = 0;
    std::uint32_t str_len_ = 0;
    std::uint8_t str_flags_ = 0;
    // The exclusion pointers that reach below the value about to be parsed:
    // excluded_[pending_begin_, pending_end_), set by descend.
    std::uint32_t pending_begin_ = 0;
    std::uint32_t pending_end_ = 0;
    // The polled pass asks the interrupt probe when the input reaches this.
    const unsigned char* poll_at_ = nullptr;
};

// Makes room for `need` more bytes of output at w; returns w in the new buffer.
char* Document::grow(char* w, std::size_t need) {
    const std::size_t at = static_cast<std::size_t>(w - base_);
    out_.resize(std::max(out_.size() * 2, at + need));
    base_ = out_.data();
    cap_ = base_ + out_.size();
    return base_ + at;
}

#if defined(__SSE2__)
// The bytes of v that a string cannot copy as they are: '"', '\\', control
// bytes and bytes >= 0x80. Flipping bit 1 moves '"' (0x22) to 0x20 and keeps
// the control bytes below 0x20, so one signed compare with 0x21 finds those
// three kinds (bytes >= 0x80 are negative) and one more finds the backslash.
__attribute__((always_inline)) inline __m128i special_bytes(__m128i v) {
    return _mm_or_si128(_mm_cmplt_epi8(_mm_xor_si128(v, _mm_set1_epi8(0x02)), _mm_set1_epi8(0x21)),
                        _mm_cmpeq_epi8(v, _mm_set1_epi8('\\')));
}
#endif

// The first byte at or after s that a string cannot copy as is: '"', '\\', a
// control byte, a byte >= 0x80; or end.
inline const unsigned char* scan_plain(const unsigned char* s, const unsigned char* end) {
#if defined(__SSE2__)
    while (end - s >= 16) {
        __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
        const __m128i special = special_bytes(v);
        int mask = _mm_movemask_epi8(special);
        if (mask != 0) return s + __builtin_ctz(static_cast<unsigned>(mask));
        s += 16;
    }
#endif
    while (s < end && *s >= 0x20 && *s < 0x80 && *s != '"' && *s != '\\') ++s;
    return s;
}

// Parses the string whose opening quote is at p and writes its canonical form
// at w. Inline in the parser's loop: most strings are short ASCII runs with no
// escape, which are copied to the output in the same 16-byte blocks that are
// scanned for the closing quote (an escape-free, well-formed string is its own
// canonical form). Anything else continues out of line in parse_string_tail.
template <bool kPolled>
__attribute__((always_inline)) inline bool Document::parse_string(const unsigned char*& p, char*& w,
                                                                  bool name) {
    const unsigned char* const quote = p;
    const unsigned char* s = p + 1;
    char* const o = w;  // the string's output; o[s - quote] is where the byte at s goes
#if defined(__SSE2__)
    // The block stores stay within the output's room: s + 16 <= end_ here.
    for (;;) {
        if (end_ - s < 16) {  // near the end of the input: the rest byte by byte
            const unsigned char* const from = s;
            s = scan_plain(s, end_);
            std::memcpy(o + (from - quote), from, static_cast<std::size_t>(s - from));
            break;
        }
        __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + (s - quote)), v);
        const __m128i special = special_bytes(v);
        const int mask = _mm_movemask_epi8(special);
        if (mask != 0) {
            s += __builtin_ctz(static_cast<unsigned>(mask));
            break;
        }
        s += 16;
        if constexpr (kPolled) {
            if (s >= poll_at_) poll(s);  // a long string
        }
    }
#else
    s = scan_plain(s, end_);
    std::memcpy(o + 1, quote + 1, static_cast<std::size_t>(s - quote - 1));
#endif
    if (s < end_ && *s == '"') {
        const auto len = static_cast<std::uint32_t>(s - quote - 1);
        o[0] = '"';
        o[len + 1] = '"';
        w = o + len + 2;
        str_pos_ = static_cast<std::uint32_t>(quote + 1 - in_);
        str_len_ = len;
        str_flags_ = 0;
        p = s + 1;
        return true;
    }
    const Pos next = parse_string_tail<kPolled>(p, s, w, name);
    p = next.p;
    w = next.w;
    return next.p != nullptr;
}

// The rest of parse_string from the first byte at `s` that is not plain ASCII:
// validates UTF-8 while the string can still be copied from the input as it
// is, and hands over at the first escape: to parse_escaped_string for a member
// name (which is needed unescaped), to rewrite_escaped_string for a value.
template <bool kPolled>
Document::Pos Document::parse_string_tail(const unsigned char* quote, const unsigned char* s,
                                          char* w, bool name) {
    std::uint8_t non_ascii = 0;
    for (;;) {
        if constexpr (kPolled) {
            if (s >= poll_at_) poll(s);
        }
        if (s >= end_) return failed(JsonErrc::syntax, s);
        const unsigned c = *s;
        if (c == '"') {
            const auto len = static_cast<std::uint32_t>(s - quote - 1);
            std::memcpy(w, quote, len + 2);
            w += len + 2;
            str_pos_ = static_cast<std::uint32_t>(quote + 1 - in_);
            str_len_ = len;
            str_flags_ = non_ascii;
            return {s + 1, w};
        }
        if (c == '\\')
            return name ? parse_escaped_string<kPolled>(quote, s, non_ascii, w)
                        : rewrite_escaped_string<kPolled>(quote, s, w);
        if (c < 0x20) return failed(JsonErrc::syntax, s);
        // Non-ASCII: validate whole sequences until the next ASCII byte.
        non_ascii = kNonAscii;
        if (!utf8_run(s, end_)) return failed(JsonErrc::invalid_utf8, s);
        s = scan_plain(s, end_);
    }
}

// Whether JSON.stringify escapes the character c: '"', '\\' and the controls.
inline bool needs_escape(std::uint32_t c) { return c < 0x20 || c == '"' || c == '\\'; }

// The letter of the two-character escape JSON.stringify writes for c, or 0
// when it has none (then it writes \u00xx): one of " \ b f n r t.
inline char short_escape(std::uint32_t c) {
    switch (c) {
        case '"': return '"';
        case '\\': return '\\';
        case '\b': return 'b';
        case '\f': return 'f';
        case '\n': return 'n';
        case '\r': return 'r';
        case '\t': return 't';
        default: return 0;
    }
}

// Writes the escape JSON.stringify writes for a character that needs_escape:
// the two-character form where there is one, \u00xx otherwise.
inline char* put_escape(char* w, std::uint32_t c) {
    static const char hex[] = "0123456789abcdef";
    *w++ = '\\';
    if (const char letter = short_escape(c)) {
        *w++ = letter;
        return w;
    }
    *w++ = 'u';
    *w++ = '0';
    *w++ = '0';
    *w++ = hex[c >> 4];
    *w++ = hex[c & 15];
    return w;
}

// Writes s (unescaped UTF-8) as a JSON string, escaped the way ECMAScript's
// JSON.stringify does; returns the end of what was written.
char* write_escaped(char* w, std::string_view s) {
    *w++ = '"';
    for (const char ch : s) {
        const unsigned char c = static_cast<unsigned char>(ch);
        if (needs_escape(c))
            w = put_escape(w, c);
        else
            *w++ = ch;
    }
    *w++ = '"';
    return w;
}

// Copies s, which is readable up to `limit`; short strings move as one
// 16-byte block (the output has kWriteSlack bytes of room past its end).
inline char* put_short(char* w, std::string_view s, const char* limit) {
#if defined(__SSE2__)
    if (s.size() <= 16 && limit - s.data() >= 16) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(w),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(s.data())));
        return w + s.size();
    }
#endif
    (void)limit;
    std::memcpy(w, s.data(), s.size());
    return w + s.size();
}

// The rest of parse_string once an escape is found at `s`: decodes the string
// into the arena (a member name is compared in its unescaped form), then writes
// it escaped the way JSON.stringify does. Kept out of line so that the common
// escape-free path stays small. While decoding, `extra` counts what escaping
// adds back: each decoded byte that JSON.stringify escapes adds 1 (short
// escapes) or 5 (\u00XX) to its length.
template <bool kPolled>
Document::Pos Document::parse_escaped_string(const unsigned char* quote, const unsigned char* s,
                                             std::uint8_t non_ascii, char* w) {
    const std::size_t start = arena_.size();
    std::size_t extra = 0;
    const unsigned char* run = quote + 1;  // bytes copied as they are, not yet appended
    char utf8[4];
    for (;;) {
        if constexpr (kPolled) {
            if (s >= poll_at_) poll(s);
        }
        s = scan_plain(s, end_);
        if (s >= end_) return failed(JsonErrc::syntax, s);
        const unsigned c = *s;
        if (c >= 0x80) {
            non_ascii = kNonAscii;
            if (!utf8_run(s, end_)) return failed(JsonErrc::invalid_utf8, s);
            continue;
        }
        arena_.append(reinterpret_cast<const char*>(run), static_cast<std::size_t>(s - run));
        if (c == '"') break;
        if (c < 0x20) return failed(JsonErrc::syntax, s);
        // A backslash.
        if (end_ - s < 2) return failed(JsonErrc::syntax, s);
        const unsigned e = s[1];
        char simple = 0;
        switch (e) {
            case '"': simple = '"'; break;
            case '\\': simple = '\\'; break;
            case '/': simple = '/'; break;
            case 'b': simple = '\b'; break;
            case 'f': simple = '\f'; break;
            case 'n': simple = '\n'; break;
            case 'r': simple = '\r'; break;
            case 't': simple = '\t'; break;
            case 'u': break;
            default: return failed(JsonErrc::syntax, s);
        }
        if (e != 'u') {
            arena_.push_back(simple);
            extra += simple != '/';  // written back as the same two-byte escape
            s += 2;
            run = s;
            continue;
        }
        const UnicodeEscape u = read_unicode_escape(s, end_);
        if (u.next == nullptr) return failed(u.error, u.error_at);
        const std::uint32_t cp = u.code_point;
        s = u.next;
        if (needs_escape(cp)) extra += short_escape(cp) != 0 ? 1 : 5;
        if (cp >= 0x80) non_ascii = kNonAscii;
        arena_.append(utf8, static_cast<std::size_t>(put_utf8(utf8, cp) - utf8));
        run = s;
    }
    const auto len = static_cast<std::uint32_t>(arena_.size() - start);
    const std::string_view text(arena_.data() + start, len);
    if (extra != 0) {
        w = write_escaped(w, text);
    } else {
        *w++ = '"';
        w = put_short(w, text, arena_.data() + arena_.size());
        *w++ = '"';
    }
    str_pos_ = static_cast<std::uint32_t>(start);
    str_len_ = len;
    str_flags_ = static_cast<std::uint8_t>(kInArena | non_ascii);
    return {s + 1, w};
}

// Copies plain bytes (see scan_plain) from s to o up to the first byte that is
// not plain or end, in 16-byte blocks while 16 bytes remain in the input;
// returns where the copy stopped in the input and advances o as far.
inline const unsigned char* copy_plain(const unsigned char* s, const unsigned char* end, char*& o) {
#if defined(__SSE2__)
    while (end - s >= 16) {
        __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o), v);
        const __m128i special = special_bytes(v);
        const int mask = _mm_movemask_epi8(special);
        if (mask != 0) {
            const int n = __builtin_ctz(static_cast<unsigned>(mask));
            o += n;
            return s + n;
        }
        s += 16;
        o += 16;
    }
#endif
    while (s < end && *s >= 0x20 && *s < 0x80 && *s != '"' && *s != '\\')
        *o++ = static_cast<char>(*s++);
    return s;
}

// The rest of a string value (not a member name) from its first escape at `s`:
// writes the canonical form straight to the output without decoding into the
// arena. Plain runs and well-formed UTF-8 are copied; each escape becomes what
// JSON.stringify writes for the character it stands for (\" \\ \b \f \n \r \t,
// \u00xx for other control characters, the character itself otherwise). The
// checks and their order are those of parse_escaped_string, so are the errors.
// [quote, s) was validated by the caller and is copied first; the output never
// outgrows the input consumed (an escape is never replaced by more bytes).
template <bool kPolled>
Document::Pos Document::rewrite_escaped_string(const unsigned char* quote, const unsigned char* s,
                                               char* w) {
    std::memcpy(w, quote, static_cast<std::size_t>(s - quote));
    char* o = w + (s - quote);
    for (;;) {
        if constexpr (kPolled) {
            if (s >= poll_at_) poll(s);
        }
        if (s >= end_) return failed(JsonErrc::syntax, s);
        const unsigned c = *s;
        if (c == '"') {
            *o++ = '"';
            return {s + 1, o};
        }
        if (c >= 0x80) {
            const bool valid =
                utf8_run(s, end_, [&o](const unsigned char* sequence, std::size_t n) {
                    for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<char>(sequence[i]);
                    o += n;
                });
            if (!valid) return failed(JsonErrc::invalid_utf8, s);
        } else if (c < 0x20) {
            return failed(JsonErrc::syntax, s);
        } else {  // a backslash
            if (end_ - s < 2) return failed(JsonErrc::syntax, s);
            const unsigned e = s[1];
            switch (e) {
                case '"':
                case '\\':
                case 'b':
                case 'f':
                case 'n':
                case 'r':
                case 't':  // written back as it is
                    o[0] = '\\';
                    o[1] = static_cast<char>(e);
                    o += 2;
                    s += 2;
                    break;
                case '/':
                    *o++ = '/';
                    s += 2;
                    break;
                case 'u': {
                    const UnicodeEscape u = read_unicode_escape(s, end_);
                    if (u.next == nullptr) return failed(u.error, u.error_at);
                    const std::uint32_t cp = u.code_point;
                    s = u.next;
                    o = needs_escape(cp) ? put_escape(o, cp) : put_utf8(o, cp);
                    break;
                }
                default: return failed(JsonErrc::syntax, s);
            }
        }
        s = copy_plain(s, end_, o);
    }
}

// First byte at or after s that is not an ASCII digit, or end. Numbers in API
// payloads are mostly 5 to 17 digits: one SSE2 block instead of a loop.
inline const unsigned char* scan_digits(const unsigned char* s, const unsigned char* end) {
#if defined(__SSE2__)
    while (end - s >= 16) {
        __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
        __m128i other =
            _mm_or_si128(_mm_cmplt_epi8(v, _mm_set1_epi8('0')),  // signed: also bytes >= 0x80
                         _mm_cmpgt_epi8(v, _mm_set1_epi8('9')));
        int mask = _mm_movemask_epi8(other);
        if (mask != 0) return s + __builtin_ctz(static_cast<unsigned>(mask));
        s += 16;
    }
#endif
    while (s < end && *s >= '0' && *s <= '9') ++s;
    return s;
}

// Parses the number at p and writes its canonical form at w.
Document::Pos Document::parse_number(const unsigned char* p, char* w) {
    const unsigned char* const start = p;
    const unsigned char* s = p;
    bool negative = false;
    if (*s == '-') {
        negative = true;
        ++s;
    }
    if (s >= end_) return failed(JsonErrc::syntax, s);
    const unsigned char* int_begin = s;
    if (*s == '0') {
        ++s;
    } else if (*s >= '1' && *s <= '9') {
        s = scan_digits(s + 1, end_);
    } else {
        return failed(JsonErrc::syntax, s);
    }
    const unsigned char* const int_end = s;
    const std::size_t int_digits = static_cast<std::size_t>(s - int_begin);
    const bool int_zero = *int_begin == '0';
    std::size_t frac_digits = 0, frac_leading_zeros = 0;
    bool frac_trailing_zero = false, has_exponent = false;
    const unsigned char* frac = s;
    const unsigned char* frac_end = s;
    if (s < end_ && *s == '.') {
        ++s;
        frac = s;
        s = scan_digits(s, end_);
        frac_end = s;
        frac_digits = static_cast<std::size_t>(s - frac);
        if (frac_digits == 0) return failed(JsonErrc::syntax, s);
        while (frac_leading_zeros < frac_digits && frac[frac_leading_zeros] == '0')
            ++frac_leading_zeros;
        frac_trailing_zero = s[-1] == '0';
    }
    const unsigned char* exp = s;  // the exponent's sign and digits: none unless 'e' follows
    if (s < end_ && (*s == 'e' || *s == 'E')) {
        has_exponent = true;
        ++s;
        exp = s;
        if (s < end_ && (*s == '+' || *s == '-')) ++s;
        const unsigned char* exp_digits = s;
        while (s < end_ && *s >= '0' && *s <= '9') ++s;
        if (s == exp_digits) return failed(JsonErrc::syntax, s);
    }
    const std::uint32_t len = static_cast<std::uint32_t>(s - start);
    if (len >= kPollBytes)
        check_interrupt(options_.interrupt);  // a huge literal: the passes below are linear

    // Already canonical? With at most 15 significant digits the literal is the
    // shortest decimal that round-trips (DBL_DIG = 15), so only the layout
    // matters: plain notation, no trailing fraction zero, no "-0", and not so
    // small that ECMAScript switches to exponent form (at most 5 leading zeros).
    // It is then copied as it is (room: it is no longer than what it consumed).
    if (!has_exponent && !frac_trailing_zero) {
        bool canonical;
        if (int_zero) {
            canonical = frac_digits == 0
                            ? !negative
                            : (frac_leading_zeros <= 5 && frac_digits - frac_leading_zeros <= 15);
        } else {
            canonical = int_digits + frac_digits <= 15;
        }
        if (canonical) {
            w = put_short(w, std::string_view(reinterpret_cast<const char*>(start), len),
                          reinterpret_cast<const char*>(end_));
            return {s, w};
        }
    }

    // Written directly into the output, which may be longer than the literal
    // ("1e21" -> "1e+21"): make room first.
    if (static_cast<std::size_t>(cap_ - w) <
        kMaxNumberChars + static_cast<std::size_t>(end_ - s) + kWriteSlack)
        w = grow(w, kMaxNumberChars + static_cast<std::size_t>(end_ - s) + kWriteSlack);
    // More than 15 significant digits and no trailing zero (typically a double
    // printed by another serializer) is never a rewrite: skip trying.
    const std::size_t significant =
        int_zero ? frac_digits - frac_leading_zeros : int_digits + frac_digits;
    const bool rewritable = significant <= 15 || frac_end[-1] == '0';
    std::size_t n = rewritable ? numbers::rewrite_decimal(negative, int_begin, int_end, frac,
                                                          frac_end, exp, s, w)
                               : 0;
    if (n == 0 && significant >= 16)
        n = numbers::keep_long_decimal(in_, end_, negative, int_begin, int_end, frac, frac_end,
                                       frac_leading_zeros, exp, s, w);
    if (n == 0) {
        double value = 0;
        auto res = fast_float::from_chars(reinterpret_cast<const char*>(start),
                                          reinterpret_cast<const char*>(s), value);
        // fast_float 3 (bookworm) reports overflow as an infinite value; 6 and
        // later (trixie, forky) also set result_out_of_range, for underflow (0) too.
        if ((res.ec != std::errc() && res.ec != std::errc::result_out_of_range) ||
            res.ptr != reinterpret_cast<const char*>(s))
            return failed(JsonErrc::syntax, start);
        if (!std::isfinite(value))
            return failed(JsonErrc::number_overflow, start);  // underflow gives 0
        n = numbers::shortest_decimal(value, w);
    }
    return {s, w + n};
}

// The common number inline: when the literal at p is `[-]int[.frac]` with no
// exponent, lies within the 16 bytes at p and is already canonical (the
// conditions of parse_number's first check), copies it in one block, advances
// p and w and returns true. Anything else (including every malformed literal)
// returns false and is left to parse_number.
__attribute__((always_inline)) inline bool copy_canonical_number(const unsigned char*& p, char*& w,
                                                                 const unsigned char* end) {
#if defined(__SSE2__)
    if (end - p < 16) return false;
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i digit =
        _mm_and_si128(_mm_cmpgt_epi8(v, _mm_set1_epi8('0' - 1)),  // signed: not bytes >= 0x80
                      _mm_cmplt_epi8(v, _mm_set1_epi8('9' + 1)));
    const unsigned non_digit =
        ~static_cast<unsigned>(_mm_movemask_epi8(digit));  // bit 16 and up set
    const unsigned start = p[0] == '-';
    const unsigned int_end = static_cast<unsigned>(__builtin_ctz(non_digit & (~0u << start)));
    const unsigned int_digits = int_end - start;
    if (int_digits == 0 || int_end >= 16) return false;
    const bool int_zero = p[start] == '0';
    if (int_zero && int_digits > 1)
        return false;  // a syntax error, reported by parse_number's caller
    unsigned number_end = int_end;
    unsigned frac_digits = 0;
    if (p[int_end] == '.') {
        const unsigned frac_begin = int_end + 1;
        number_end = static_cast<unsigned>(__builtin_ctz(non_digit & (~0u << frac_begin)));
        frac_digits = number_end - frac_begin;
        if (frac_digits == 0 || number_end >= 16 || p[number_end - 1] == '0') return false;
        if (int_zero) {
            const unsigned zeros =
                static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8('0'))));
            const unsigned leading = static_cast<unsigned>(__builtin_ctz(~zeros >> frac_begin));
            if (leading > 5 || frac_digits - leading > 15) return false;
        }
    } else if (int_zero && start != 0) {
        return false;  // "-0"
    }
    if ((p[number_end] | 0x20) == 'e') return false;
    if (!int_zero && int_digits + frac_digits > 15) return false;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(w), v);  // room: see Document
    w += number_end;
    p += number_end;
    return true;
#else
    (void)p;
    (void)w;
    (void)end;
    return false;
#endif
}

// Parses `"name" :` (whitespace allowed around it), writes `"name":` and
// records the member in members_. Inline in the parser's loop, like
// parse_string: a call per member costs more than the work it does.
template <bool kPolled>
__attribute__((always_inline)) inline bool Document::parse_member_name(const unsigned char*& p,
                                                                       char*& w) {
    if (!(p < end_ && *p == '"')) {  // whitespace first: rare
        while (p < end_ && is_ws(*p)) ++p;
        if (p >= end_ || *p != '"') return fail(JsonErrc::syntax, p);
    }
    const auto out_pos = static_cast<std::uint64_t>(w - base_);
    const unsigned char* const name = p + 1;
    if (!parse_string<kPolled>(p, w, true)) return false;
    const std::uint64_t prefix =
        (str_flags_ & kInArena)
            ? name_prefix({arena_.data() + str_pos_, str_len_}, arena_.data() + arena_.size())
            : name_prefix({reinterpret_cast<const char*>(name), str_len_},
                          reinterpret_cast<const char*>(end_));
    members_.push(Member{prefix, out_pos, str_pos_, str_len_,
                         static_cast<std::uint32_t>(name - 1 - in_), str_flags_});
    if (!(p < end_ && *p == ':')) {
        while (p < end_ && is_ws(*p)) ++p;
        if (p >= end_ || *p != ':') return fail(JsonErrc::syntax, p);
    }
    ++p;
    *w++ = ':';
    return true;
}

// Copies n bytes (n >= 1) from `from` to `to` in 16-byte blocks; both may be
// read or written up to 15 bytes past their n bytes. Returns to + n.
inline char* copy_blocks(char* to, const char* from, std::size_t n) {
#if defined(__SSE2__)
    std::size_t i = 0;
    do {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i)));
        i += 16;
    } while (i < n);
#else
    std::memcpy(to, from, n);
#endif
    return to + n;
}

// At the '}' of `frame` (its text written up to w, its members in members_ from
// frame.first_member on): sorts the members by name, rejects a duplicate name,
// and unless the members were already in order with none excluded, rewrites
// the object's text in member order (through temp_) and moves w to its end.
template <bool kPolled>
char* Document::close_object(const Frame& frame, char* w) {
    const std::size_t count = members_.size() - frame.first_member;
    if (count == 0 || (count == 1 && !(members_[frame.first_member].flags & kRemoved))) {
        members_.truncate(frame.first_member);
        return w;
    }
    // A sentinel after the last member, as if a comma followed it: member k's
    // text always ends one byte before member k + 1's.
    members_.push(Member{0, static_cast<std::uint64_t>(w - base_) + 1, 0, 0, 0, 0});
    Member* const first = members_.data() + frame.first_member;
    // The members' ordinals in sorted order: keys[i] & mask. local_keys[0] is
    // a sentinel no key is below, so that insertion needs no bounds check.
    std::uint64_t local_keys[17];
    local_keys[0] = 0;
    std::uint64_t* keys = local_keys + 1;
    std::uint64_t mask = 0xFF;
    std::uint8_t flags = 0;
    const std::size_t few = count < 16 ? count : 16;
    for (std::size_t i = 0; i < few; ++i) {
        keys[i] = (first[i].prefix & ~std::uint64_t{0xFF}) | i;
        flags |= first[i].flags;
    }
    if (count <= 16 && !(flags & kNonAscii)) {
        // The common case, a few ASCII names: sorted as integers made of the
        // first 7 bytes of the name and the ordinal (ties keep document order).
        for (std::size_t i = 1; i < count; ++i) {
            const std::uint64_t value = keys[i];
            std::uint64_t* hole = keys + i;
            while (value < hole[-1]) {
                hole[0] = hole[-1];
                --hole;
            }
            *hole = value;
        }
        // Names that share their first 7 bytes are adjacent: order each such
        // run by the whole names (stable) and look for duplicates there.
        for (std::size_t i = 1; i < count; ++i) {
            if ((keys[i] ^ keys[i - 1]) >> 8 != 0) continue;
            const std::size_t begin = i - 1;
            std::size_t end = i + 1;
            while (end < count && (keys[end] ^ keys[begin]) >> 8 == 0) ++end;
            for (std::size_t k = begin + 1; k < end; ++k) {
                const std::uint64_t value = keys[k];
                const std::string_view name = key_text(first[value & 0xFF]);
                std::size_t hole = k;
                while (hole > begin && name < key_text(first[keys[hole - 1] & 0xFF])) {
                    keys[hole] = keys[hole - 1];
                    --hole;
                }
                keys[hole] = value;
            }
            for (std::size_t k = begin + 1; k < end; ++k) {
                const Member& x = first[keys[k - 1] & 0xFF];
                const Member& y = first[keys[k] & 0xFF];
                if (key_text(x) == key_text(y)) {
                    error_.code = JsonErrc::duplicate_name;
                    error_.offset = std::max(x.quote, y.quote);  // the later occurrence
                    return nullptr;
                }
            }
            i = end - 1;
        }
    } else {
        // Many members or non-ASCII names: sorted as MemberName entries.
        MemberName local[16];
        MemberName* names = local;
        if (count > 16) {
            if (names_.size() < count) names_.resize(count);
            names = names_.data();
            if (order_.size() < count) order_.resize(count);
            keys = order_.data();
        }
        mask = ~std::uint64_t{0};
        const char* const input = reinterpret_cast<const char*>(in_);
        const char* const arena = arena_.data();
        flags = 0;
        for (std::size_t i = 0; i < count; ++i) {
            if constexpr (kPolled) {
                if (i % kPollItems == kPollItems - 1) check_interrupt(options_.interrupt);
            }
            const Member& m = first[i];
            names[i] = MemberName{m.prefix, ((m.flags & kInArena) ? arena : input) + m.key_pos,
                                  m.key_len, static_cast<std::uint32_t>(i)};
            flags |= m.flags;
        }
        if (kPolled && count > kPollItems) {
            // A huge object: the probe is asked every kPollItems comparisons.
            std::size_t compares = 0;
            const InterruptProbe probe = options_.interrupt;
            auto polled = [&compares, probe](bool (*less)(const MemberName&, const MemberName&)) {
                return [&compares, probe, less](const MemberName& a, const MemberName& b) {
                    if (++compares % kPollItems == 0) check_interrupt(probe);
                    return less(a, b);
                };
            };
            std::sort(names, names + count,
                      polled((flags & kNonAscii) ? utf16_name_less : ascii_name_less));
        } else if (flags & kNonAscii) {
            sort_names(names, count, utf16_name_less);
        } else {
            sort_names(names, count, ascii_name_less);
        }
        for (std::size_t i = 1; i < count; ++i) {
            if constexpr (kPolled) {
                if (i % kPollItems == 0) check_interrupt(options_.interrupt);
            }
            const MemberName& x = names[i - 1];
            const MemberName& y = names[i];
            if (x.prefix == y.prefix && x.len == y.len &&
                same_bytes({x.data, x.len}, {y.data, y.len})) {
                error_.code = JsonErrc::duplicate_name;
                error_.offset =
                    std::max(first[x.node].quote, first[y.node].quote);  // the later occurrence
                return nullptr;
            }
        }
        for (std::size_t i = 0; i < count; ++i) keys[i] = names[i].node;
    }
    bool in_order = !(flags & kRemoved);
    for (std::size_t i = 0; i < count && in_order; ++i) in_order = (keys[i] & mask) == i;
    if (!in_order) {
        char* const text = base_ + frame.out_pos;
        const std::size_t size = static_cast<std::size_t>(w - text);
        if (temp_.size() < size + kWriteSlack) temp_.resize(size + kWriteSlack);
        char* const begin = temp_.data();
        char* t = begin;  // each member is followed by a comma, the last one's taken back
        [[maybe_unused]] std::size_t poll_at = kPollBytes;  // output offset in temp_
        for (std::size_t i = 0; i < count; ++i) {
            const auto k = static_cast<std::size_t>(keys[i] & mask);
            if (first[k].flags & kRemoved) continue;
            const std::uint64_t from = first[k].out_pos;
            t = copy_blocks(t, base_ + from,
                            static_cast<std::size_t>(first[k + 1].out_pos - 1 - from));
            *t++ = ',';
            if constexpr (kPolled) {
                if (static_cast<std::size_t>(t - begin) >= poll_at) {
                    // a large object, or one deep inside others (each of them copies it again)
                    poll_at = static_cast<std::size_t>(t - begin) + kPollBytes;
                    check_interrupt(options_.interrupt);
                }
            }
        }
        if (t != begin) --t;
        std::memcpy(text, begin, static_cast<std::size_t>(t - begin));
        w = text + (t - begin);
    }
    members_.truncate(frame.first_member);
    return w;
}

// Exclusions. The pointers are kept sorted by their tokens (excluded_), so
// the pointers that agree on their first d tokens are one range, sorted by
// their token d. An open container knows the range of pointers that reach
// below it (all longer than its depth); a member or element of it is looked
// up in that range by binary search on its name or its index written in
// decimal (an RFC 6901 index has no leading zero, so equal text means equal
// index, and "-" or "01" never match an element).

// Sorts the non-empty pointers of exclude_ into excluded_ (the probe is asked
// every kPollItems comparisons) and makes them the root value's pending range.
void Document::prepare_exclusions() {
    try {
        sort_exclusions();
    } catch (...) {  // Interrupted, std::bad_alloc
        scratch_.release();
        throw;
    }
    pending_begin_ = 0;
    pending_end_ = static_cast<std::uint32_t>(excluded_.size());
}

// Orders pointers a and b of `list` by their tokens from `depth` on (the
// tokens before are equal): <0, 0 or >0. A pointer that ends sorts before its
// continuations.
inline int compare_tokens_at(const PointerList& list, std::uint32_t a, std::uint32_t b,
                             std::size_t depth) {
    const bool a_ends = list.token_count(a) <= depth;
    const bool b_ends = list.token_count(b) <= depth;
    if (a_ends || b_ends) return static_cast<int>(b_ends) - static_cast<int>(a_ends);
    return list.token(a, depth).compare(list.token(b, depth));
}

// Sorts the pointers of exclude_ that have tokens into excluded_ (their
// indexes), by their tokens (lexicographic order of the token sequences,
// tokens ordered by bytes): a multikey quicksort (Bentley and Sedgewick) over
// tokens, that is, a three-way partition on one token at a time, the equal
// part going on with the next token. Each partition step compares one token,
// so the expected cost is O(n log n) token comparisons plus one per token of
// every pointer (a plain sort compares whole sequences, which costs their
// shared prefix each time: 40 times slower on pointers that share 100
// tokens). Pivots are drawn pseudo-randomly and pending ranges kept on a heap
// stack, so no input makes the C stack deep. The probe is asked every
// kPollItems pointers or comparisons.
void Document::sort_exclusions() {
    const InterruptProbe probe = options_.interrupt;
    const PointerList& list = *exclude_;
    excluded_.reserve(list.size());
    for (std::size_t i = 0; i < list.size(); ++i) {
        if (i % kPollItems == kPollItems - 1) check_interrupt(probe);
        if (list.token_count(i) != 0)
            excluded_.push_back(static_cast<std::uint32_t>(i));  // none: excludes nothing
    }
    std::uint32_t* const a = excluded_.data();
    struct Part {
        std::size_t begin, end, depth;
    };
    std::vector<Part> parts;
    if (excluded_.size() > 1) parts.push_back({0, excluded_.size(), 0});
    std::uint64_t random = 0x9E3779B97F4A7C15u ^ excluded_.size();
    std::size_t compares = 0;
    while (!parts.empty()) {
        Part part = parts.back();
        parts.pop_back();
        for (;;) {
            const std::size_t n = part.end - part.begin;
            if (n < 12) {  // insertion sort on the whole remaining sequences
                for (std::size_t i = part.begin + 1; i < part.end; ++i) {
                    const std::uint32_t value = a[i];
                    std::size_t hole = i;
                    for (; hole > part.begin; --hole) {
                        const std::uint32_t other = a[hole - 1];
                        const std::size_t longer =
                            std::max(list.token_count(value), list.token_count(other));
                        int c = 0;
                        for (std::size_t d = part.depth; c == 0 && d < longer; ++d)
                            c = compare_tokens_at(list, value, other, d);
                        if (c >= 0) break;
                        a[hole] = other;
                    }
                    a[hole] = value;
                }
                break;
            }
            random ^= random << 13;
            random ^= random >> 7;
            random ^= random << 17;
            const std::uint32_t pivot = a[part.begin + random % n];
            std::size_t lt = part.begin, i = part.begin, gt = part.end;
            while (i < gt) {
                if (++compares % kPollItems == 0) check_interrupt(probe);
                const int c = compare_tokens_at(list, a[i], pivot, part.depth);
                if (c < 0)
                    std::swap(a[lt++], a[i++]);
                else if (c > 0)
                    std::swap(a[i], a[--gt]);
                else
                    ++i;
            }
            if (lt - part.begin > 1) parts.push_back({part.begin, lt, part.depth});
            if (part.end - gt > 1) parts.push_back({gt, part.end, part.depth});
            if (list.token_count(pivot) <= part.depth || gt - lt < 2)
                break;  // the equal part ended, or is one
            part = {lt, gt, part.depth + 1};
        }
    }
}

// Among excluded_[begin, end) (pointers longer than `depth` that agree on
// their first `depth` tokens), the ones whose token at `depth` is `token`:
// returns true when one of them ends there (the value is excluded, and nothing
// below it needs looking at), else leaves those that continue below it as the
// pending range (empty when there are none).
bool Document::descend(std::uint32_t begin, std::uint32_t end, std::size_t depth,
                       std::string_view token) {
    const PointerList& list = *exclude_;
    const std::uint32_t* const data = excluded_.data();
    const std::uint32_t* const lo = std::lower_bound(
        data + begin, data + end, token,
        [&list, depth](std::uint32_t t, std::string_view v) { return list.token(t, depth) < v; });
    const std::uint32_t* const hi = std::upper_bound(
        lo, data + end, token,
        [&list, depth](std::string_view v, std::uint32_t t) { return v < list.token(t, depth); });
    pending_begin_ = pending_end_ = 0;
    if (lo == hi) return false;
    if (list.token_count(*lo) == depth + 1)
        return true;  // the shortest sorts first: a pointer ends here
    pending_begin_ = static_cast<std::uint32_t>(lo - data);
    pending_end_ = static_cast<std::uint32_t>(hi - data);
    return false;
}

// The member just parsed (the last in members_) of the object `frame`, which
// pointers reach into: flags it removed when a pointer ends at it, and leaves
// the pointers that continue below it pending for its value.
void Document::descend_member(const Frame& frame) {
    Member& member = members_.back();
    if (descend(frame.match_begin, frame.match_end, stack_.size() - 1, key_text(member)))
        member.flags |= kRemoved;
}

// The element of the array `frame` about to be parsed (at frame.index), which
// pointers reach into: returns whether a pointer ends at it, and leaves the
// pointers that continue below it pending for it.
bool Document::descend_element(const Frame& frame) {
    char digits[16];
    const auto res = std::to_chars(digits, digits + sizeof digits, frame.index);
    return descend(frame.match_begin, frame.match_end, stack_.size() - 1,
                   std::string_view(digits, static_cast<std::size_t>(res.ptr - digits)));
}

// The single pass: at `value` one value is parsed and written; a container
// pushes a frame and continues with its first child; at `after_value` commas
// and closing brackets are consumed. Nothing recurses, so the depth of the
// input is bounded only by max_depth.
//
// Exclusions (JSON pointers) are resolved on the way: each open container
// knows the range of sorted pointers that reach into it (see descend); a
// member a pointer ends at is flagged and left out when its object is
// reordered, an array element a pointer ends at is written and then taken back.
//
// Interrupts: a document of kPollBytes or more, with a probe set, is parsed by
// the polled instance of the pass, which asks the probe when a value starts or
// a string goes on past the next multiple of kPollBytes of input (and in the
// loops over one object's members). Smaller documents take the other instance,
// which has no check at all.
bool Document::run(JsonError& error) {
    if (size_ >= std::numeric_limits<std::uint32_t>::max()) {
        error = JsonError{JsonErrc::too_large, 0};
        return false;
    }
    if (exclude_ != nullptr && !exclude_->empty()) prepare_exclusions();
    if (options_.interrupt != nullptr && size_ >= kPollBytes) return run_polled(error);
    return run_pass<false>(error);
}

template <bool kPolled>
bool Document::run_pass(JsonError& error) {
    // kMaxNumberChars more: a number's room check then fails only after
    // earlier numbers have outgrown their literals (most documents never grow).
    out_.resize(size_ + kWriteSlack + kMaxNumberChars);
    base_ = out_.data();
    cap_ = base_ + out_.size();
    char* w = base_;
    const unsigned char* p = in_;
    if constexpr (kPolled) poll(p);
    // The value about to be parsed when it is an array element a pointer ends
    // at: it is written, then the output goes back to `mark`.
    bool drop = false;
    std::uint64_t mark = 0;
    // Compact JSON has no whitespace: one compare rejects every token byte.
    auto skip_ws = [&] {
        while (p < end_ && *p <= ' ' && is_ws(*p)) ++p;
    };
    // The start of an element of the array on top of the stack: its comma and
    // its exclusion (the element's index is frame.index).
    auto start_element = [&](Frame & frame) __attribute__((always_inline)) {
        const auto before = static_cast<std::uint64_t>(w - base_);
        if (frame.kept++ != 0) *w++ = ',';
        if (frame.match_begin != frame.match_end) {
            drop = descend_element(frame);
            mark = before;
        }
    };
    // The start of a member of the object on top of the stack.
    auto start_member = [&](Frame & frame) __attribute__((always_inline)) {
        if (!parse_member_name<kPolled>(p, w)) return false;
        if (frame.match_begin != frame.match_end) descend_member(frame);
        return true;
    };

    // The next byte that is not whitespace, or end: one compare and one load
    // when there is no whitespace (compact JSON).
    auto next_byte = [&]() __attribute__((always_inline)) {
        if (__builtin_expect(p < end_, 1)) {
            const int c = *p;
            if (c > ' ') return c;
        }
        skip_ws();
        return p < end_ ? static_cast<int>(*p) : -1;
    };

value :  // a value starts at p (after whitespace)
{
    if constexpr (kPolled) {
        if (p >= poll_at_) poll(p);
    }
    const int c = next_byte();
    if (c == '"') {
        if (!parse_string<kPolled>(p, w, false)) goto failed;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        if (!copy_canonical_number(p, w, end_)) {
            const Pos next = parse_number(p, w);
            if (next.p == nullptr) goto failed;
            p = next.p;
            w = next.w;
        }
    } else if (c == '{' || c == '[') {
        if (stack_.size() >= options_.max_depth) {
            fail(JsonErrc::too_deep, p);
            goto failed;
        }
        *w++ = static_cast<char>(c);
        stack_.push(Frame{static_cast<std::uint64_t>(w - base_), mark,
                          static_cast<std::uint32_t>(members_.size()), 0, 0, pending_begin_,
                          pending_end_, c == '{', drop});
        drop = false;
        ++p;
        Frame& frame = stack_.back();
        if (next_byte() == (c == '{' ? '}' : ']')) goto after_value;  // empty: closed there
        if (c == '{') {
            if (!start_member(frame)) goto failed;  // the first member's
        } else {
            start_element(frame);
        }
        goto value;
    } else if (c == 't' && end_ - p >= 4 && p[1] == 'r' && p[2] == 'u' && p[3] == 'e') {
        std::memcpy(w, "true", 4);
        w += 4;
        p += 4;
    } else if (c == 'f' && end_ - p >= 5 && p[1] == 'a' && p[2] == 'l' && p[3] == 's' &&
               p[4] == 'e') {
        std::memcpy(w, "false", 5);
        w += 5;
        p += 5;
    } else if (c == 'n' && end_ - p >= 4 && p[1] == 'u' && p[2] == 'l' && p[3] == 'l') {
        std::memcpy(w, "null", 4);
        w += 4;
        p += 4;
    } else {
        fail(JsonErrc::syntax, p);  // also at the end of the input
        goto failed;
    }
    if (drop) {  // an excluded array element
        w = base_ + mark;
        --stack_.back().kept;
        drop = false;
    }
}

after_value:  // a value is complete: close containers or move to the next value
    while (!stack_.empty()) {
        Frame& frame = stack_.back();
        const int b = next_byte();
        if (b == ',') {
            ++p;
            if (frame.object) {
                *w++ = ',';
                if (!start_member(frame)) goto failed;
            } else {
                ++frame.index;
                start_element(frame);
            }
            goto value;
        }
        if (b == (frame.object ? '}' : ']')) {
            ++p;
            if (frame.object && (w = close_object<kPolled>(frame, w)) == nullptr) goto failed;
            *w++ = frame.object ? '}' : ']';
            const bool dropped = frame.drop;
            const std::uint64_t rewind = frame.rewind;
            stack_.pop();
            if (dropped) {  // an excluded array element
                w = base_ + rewind;
                --stack_.back().kept;
            }
            continue;
        }
        fail(JsonErrc::syntax, p);  // also at the end of the input
        goto failed;
    }
    // The root value is complete.
    skip_ws();
    if (p != end_) {
        fail(JsonErrc::syntax, p);
        goto failed;
    }
    out_.resize(static_cast<std::size_t>(w - base_));
    return true;

failed:
    error = error_;
    return false;
}

}  // namespace

namespace {

// Both canonicalize() overloads end here: the one place the pass is inlined
// into (it is too large to be inlined twice), with no cleanup around it.
__attribute__((noinline)) bool run_document(std::string_view json, std::string& out,
                                            JsonError& error, const CanonicalizeOptions& options,
                                            const PointerList* exclude) {
    thread_local Scratch scratch;
    Document document(json, options, exclude, scratch, out);
    const bool ok = document.run(error);  // releases the scratch itself when interrupted
    scratch.release();
    return ok;
}

// canonicalize() with a vector of pointers: converts them to a PointerList.
__attribute__((noinline)) bool canonicalize_excluding(std::string_view json, std::string& out,
                                                      JsonError& error,
                                                      const CanonicalizeOptions& options,
                                                      const std::vector<JsonPointer>& exclude) {
    PointerList list;
    for (std::size_t i = 0; i < exclude.size(); ++i) {
        if (i % kPollItems == kPollItems - 1) check_interrupt(options.interrupt);
        list.add(exclude[i]);
    }
    return run_document(json, out, error, options, &list);
}

}  // namespace

bool canonicalize(std::string_view json, std::string& out, JsonError& error,
                  const CanonicalizeOptions& options, const std::vector<JsonPointer>* exclude) {
    if (exclude != nullptr && !exclude->empty())
        return canonicalize_excluding(json, out, error, options, *exclude);
    return run_document(json, out, error, options, nullptr);
}

bool canonicalize(std::string_view json, std::string& out, JsonError& error,
                  const CanonicalizeOptions& options, const PointerList& exclude) {
    return run_document(json, out, error, options, &exclude);
}

std::string canonicalize(std::string_view json, const CanonicalizeOptions& options) {
    std::string out;
    JsonError error;
    if (!canonicalize(json, out, error, options, nullptr)) throw JsonException(error);
    return out;
}

}  // namespace idem::core
