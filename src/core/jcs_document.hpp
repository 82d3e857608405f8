// The canonicalizer's working state: the records of open containers and
// object members, the per-thread scratch buffers, and the Document class,
// whose single pass (jcs.cpp) calls out to strings (jcs_strings.hpp), numbers
// (jcs_numbers.hpp), member order (jcs_members.hpp) and exclusions
// (jcs_exclusions.hpp).
// Included by jcs.cpp only: the canonicalizer is one translation unit made
// of rooms (see jcs.cpp), so that its internal functions keep internal
// linkage and the compiler optimizes the pass and its callees together.
#pragma once
#ifndef IDEM_JCS_ROOMS
#error "a room of the canonicalizer: included by src/core/jcs.cpp only"
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "jcs.hpp"

namespace idem::core {

namespace {

enum StringFlags : std::uint8_t {
    kInArena = 1,   // the unescaped text is in the arena, not in the input
    kRemoved = 4,   // a member excluded by a pointer
    kNonAscii = 8,  // holds bytes >= 0x80 (member order needs the UTF-16 rule)
};

// Byte classes for whitespace.
inline bool is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

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
    template <bool kPolled>
    std::uint64_t* sort_by_names(const Member* first, std::size_t count, std::uint64_t* keys,
                                 std::uint8_t& flags);
    template <bool kPolled>
    char* write_in_order(const Frame& frame, const Member* first, const std::uint64_t* keys,
                         std::uint64_t mask, std::size_t count, char* w);
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

}  // namespace

}  // namespace idem::core
