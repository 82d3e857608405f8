// Number literals in the canonicalizer's pass (RFC 8785 section 3.2.2.3): the
// common canonical literal copied inline by the parser (copy_canonical_number),
// and Document::parse_number, out of line, for the rest: validated, then copied
// as it is, laid out from its digits, or reformatted from its double (the
// digit algorithms are in jcs_decimal.hpp).
// Included by jcs.cpp only: the canonicalizer is one translation unit made
// of rooms (see jcs.cpp), so that its internal functions keep internal
// linkage and the compiler optimizes the pass and its callees together.
#pragma once
#ifndef IDEM_JCS_ROOMS
#error "a room of the canonicalizer: included by src/core/jcs.cpp only"
#endif

#include <charconv>
#include <cmath>
#include <cstring>

#include <fast_float/fast_float.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "jcs_decimal.hpp"
#include "jcs_document.hpp"
#include "jcs_strings.hpp"

namespace idem::core {

namespace {

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

// Parses the number at p and writes its canonical form at w. It is over 80
// lines because the literal is read once, left to right, into a dozen locals
// (sign, integer, fraction, exponent and their digit counts) that every later
// step reads; split, they would travel as a struct through each step.
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

}  // namespace

}  // namespace idem::core
