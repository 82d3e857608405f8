// Strings of the canonicalizer: the SSE2 scan for bytes a string cannot copy
// as they are, UTF-8 validation, \u escapes and surrogate pairs, and the
// escaping JSON.stringify does. The escape-free string is copied inline by the
// parser (Document::parse_string in jcs.cpp); everything else continues here,
// out of line: parse_string_tail validates UTF-8 and hands an escaped member
// name to parse_escaped_string (decoded into the arena, since names are sorted
// unescaped) and an escaped value to rewrite_escaped_string (rewritten
// straight into the output).
// Included by jcs.cpp only: the canonicalizer is one translation unit made
// of rooms (see jcs.cpp), so that its internal functions keep internal
// linkage and the compiler optimizes the pass and its callees together.
#pragma once
#ifndef IDEM_JCS_ROOMS
#error "a room of the canonicalizer: included by src/core/jcs.cpp only"
#endif

#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "jcs_document.hpp"

namespace idem::core {

namespace {

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

}  // namespace

}  // namespace idem::core
