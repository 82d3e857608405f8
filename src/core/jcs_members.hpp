// Member order (RFC 8785 section 3.2.3): the UTF-16 comparison of names, and
// Document::close_object, which sorts an object's members when it closes,
// rejects a duplicate name and rewrites the object's text in member order.
// Included by jcs.cpp only: the canonicalizer is one translation unit made
// of rooms (see jcs.cpp), so that its internal functions keep internal
// linkage and the compiler optimizes the pass and its callees together.
#pragma once
#ifndef IDEM_JCS_ROOMS
#error "a room of the canonicalizer: included by src/core/jcs.cpp only"
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "jcs_document.hpp"

namespace idem::core {

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

inline bool same_bytes(std::string_view a, std::string_view b) {
    for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i] != b[i]) return false;
    return true;
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
// The steps below are inlined into it (it is the one caller of each).
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
        mask = ~std::uint64_t{0};
        keys = sort_by_names<kPolled>(first, count, keys, flags);
        if (keys == nullptr) return nullptr;
    }
    bool in_order = !(flags & kRemoved);
    for (std::size_t i = 0; i < count && in_order; ++i) in_order = (keys[i] & mask) == i;
    if (!in_order) w = write_in_order<kPolled>(frame, first, keys, mask, count, w);
    members_.truncate(frame.first_member);
    return w;
}

// close_object's general case, many members or non-ASCII names: sorts them as
// MemberName entries (UTF-16 order where needed) and returns the array of
// their ordinals in sorted order (`keys` itself, or order_ for more than 16),
// with `flags` the union of the members' flags; nullptr (error_ set) at a
// duplicate name.
template <bool kPolled>
__attribute__((always_inline)) inline std::uint64_t* Document::sort_by_names(const Member* first,
                                                                             std::size_t count,
                                                                             std::uint64_t* keys,
                                                                             std::uint8_t& flags) {
    // Many members or non-ASCII names: sorted as MemberName entries.
    MemberName local[16];
    MemberName* names = local;
    if (count > 16) {
        if (names_.size() < count) names_.resize(count);
        names = names_.data();
        if (order_.size() < count) order_.resize(count);
        keys = order_.data();
    }
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
    return keys;
}

// close_object's last step when the members were out of order or one was
// excluded: copies the members' texts in sorted order into temp_, each
// followed by a comma (the last one's taken back), then back over the
// object's text; returns the new end of the output.
template <bool kPolled>
__attribute__((always_inline)) inline char* Document::write_in_order(const Frame& frame,
                                                                     const Member* first,
                                                                     const std::uint64_t* keys,
                                                                     std::uint64_t mask,
                                                                     std::size_t count, char* w) {
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
        t = copy_blocks(t, base_ + from, static_cast<std::size_t>(first[k + 1].out_pos - 1 - from));
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
    return w;
}
}  // namespace

}  // namespace idem::core
