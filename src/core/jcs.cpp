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
//
// Rooms. This file holds the entry points, the errors and the pass itself; the
// rest is in rooms by concern, included here so that the whole canonicalizer is
// one translation unit (its internal functions keep internal linkage, and the
// pass is compiled together with what it calls: split into separate units the
// same code costs 2 % more instructions per byte):
//   jcs_document.hpp    the working state: members, frames, scratch, Document
//   jcs_strings.hpp     UTF-8, escapes, the string scanners
//   jcs_numbers.hpp     number literals (digit algorithms: jcs_decimal.hpp)
//   jcs_members.hpp     member order and duplicate names
//   jcs_exclusions.hpp  the pointers given to canonicalize(), sorted and looked up
// RFC 6901 pointer parsing itself is jcs_pointers.cpp.
#include <algorithm>
#include <cstring>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "jcs.hpp"

#define IDEM_JCS_ROOMS
#include "jcs_document.hpp"
#include "jcs_exclusions.hpp"
#include "jcs_members.hpp"
#include "jcs_numbers.hpp"
#include "jcs_strings.hpp"
#undef IDEM_JCS_ROOMS

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

namespace {

// Makes room for `need` more bytes of output at w; returns w in the new buffer.
char* Document::grow(char* w, std::size_t need) {
    const std::size_t at = static_cast<std::size_t>(w - base_);
    out_.resize(std::max(out_.size() * 2, at + need));
    base_ = out_.data();
    cap_ = base_ + out_.size();
    return base_ + at;
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

// run_pass is over 80 lines because it is one loop written as a state machine
// (`value`, `after_value`, `failed`): p and w stay in registers across it, and
// the hot steps (strings, canonical numbers, member names) are inlined into
// it; split into functions, each step would pass them through memory.
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
