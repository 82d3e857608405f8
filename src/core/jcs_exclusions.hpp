// Exclusions: the Document's side of the RFC 6901 pointers given to
// canonicalize(). The pointers are sorted once; each member or element of a
// container they reach into is looked up among them.
// Included by jcs.cpp only: the canonicalizer is one translation unit made
// of rooms (see jcs.cpp), so that its internal functions keep internal
// linkage and the compiler optimizes the pass and its callees together.
#pragma once
#ifndef IDEM_JCS_ROOMS
#error "a room of the canonicalizer: included by src/core/jcs.cpp only"
#endif

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <vector>

#include "jcs_document.hpp"

namespace idem::core {

namespace {

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

}  // namespace

}  // namespace idem::core
