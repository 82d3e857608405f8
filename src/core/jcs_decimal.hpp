// Number formatting of the canonicalizer (RFC 8785 section 3.2.2.3, which is
// ECMAScript's Number::toString): the layout of a decimal, the shortest
// round-trip form of a double, and the canonical form of a literal from its
// digits alone where that is exact. Internal to src/core (jcs_numbers.hpp reads
// the literal that these functions lay out).
#pragma once

#include <cstddef>
#include <cstdint>
#include <charconv>
#include <cstring>

#include <fast_float/fast_float.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "jcs.hpp"  // kMaxNumberChars

namespace idem::core::numbers {

// Everything is inline: Document::parse_number (jcs_numbers.hpp) is the one
// caller, and out of line these cost 0.7 % more instructions per byte
// (callgrind, api-1k). jcs_decimal.cpp holds only the public format_number().

// Writes the decimal value (-)0.d1d2...dk × 10^n, given its significant digits
// (k >= 1, no leading or trailing zero) in ECMAScript Number::toString's layout
// (ECMA-262 section 6.1.6.1.20, steps 6 to 10); returns the end of the text.
inline char* layout_decimal(char* out, bool negative, const char* digits, int k, int n) {
    if (negative) *out++ = '-';
    if (k <= n && n <= 21) {
        std::memcpy(out, digits, k);
        out += k;
        std::memset(out, '0', n - k);
        out += n - k;
    } else if (0 < n && n <= 21) {
        std::memcpy(out, digits, n);
        out += n;
        *out++ = '.';
        std::memcpy(out, digits + n, k - n);
        out += k - n;
    } else if (-6 < n && n <= 0) {
        *out++ = '0';
        *out++ = '.';
        std::memset(out, '0', -n);
        out += -n;
        std::memcpy(out, digits, k);
        out += k;
    } else {
        *out++ = digits[0];
        if (k > 1) {
            *out++ = '.';
            std::memcpy(out, digits + 1, k - 1);
            out += k - 1;
        }
        *out++ = 'e';
        *out++ = n - 1 >= 0 ? '+' : '-';
        const unsigned e = static_cast<unsigned>(n - 1 >= 0 ? n - 1 : 1 - n);  // at most 324
        if (e >= 100) *out++ = static_cast<char>('0' + e / 100);
        if (e >= 10) *out++ = static_cast<char>('0' + e / 10 % 10);
        *out++ = static_cast<char>('0' + e % 10);
    }
    return out;
}

// The canonical form of a number literal with at most 15 significant digits,
// from its digits alone: such a literal is the shortest decimal that round-trips
// to its double (DBL_DIG = 15: no other decimal of 15 or fewer digits reads as
// the same double), so only ECMAScript's layout has to be applied ("1.50" ->
// "1.5", "2.5E-3" -> "0.0025", "-0" -> "0", "6.02e23" -> "6.02e+23"). Writes
// into buffer (kMaxNumberChars bytes) and returns the length; returns 0 when the
// literal has more significant digits or its magnitude is near the ends of the
// double range (where subnormals carry fewer digits and large values overflow),
// which are left to the general path. The parts are the literal's integer digits,
// fraction digits (possibly empty) and exponent (sign and digits, possibly empty).
inline std::size_t rewrite_decimal(bool negative, const unsigned char* int_begin,
                                   const unsigned char* int_end, const unsigned char* frac_begin,
                                   const unsigned char* frac_end, const unsigned char* exp_begin,
                                   const unsigned char* exp_end, char* buffer) {
    char digits[15];
    int k = 0;
    int zeros = 0;  // zeros seen since the last nonzero digit, written only if one follows
    auto take = [&](const unsigned char* from, const unsigned char* to) {
        for (; from < to; ++from) {
            if (*from == '0') {
                ++zeros;
                continue;
            }
            if (k + zeros >= 15) return false;
            for (; zeros > 0; --zeros) digits[k++] = '0';  // a few at most: no memset call
            digits[k++] = static_cast<char>(*from);
        }
        return true;
    };
    long n;  // value = 0.digits × 10^n
    if (*int_begin != '0') {
        n = int_end - int_begin;
        if (n > 400 || !take(int_begin, int_end)) return 0;
    } else {
        const unsigned char* first = frac_begin;
        while (first < frac_end && *first == '0') ++first;
        n = -(first - frac_begin);
        frac_begin = first;
    }
    if (!take(frac_begin, frac_end)) return 0;
    if (k == 0) {  // every zero, with any sign and exponent
        buffer[0] = '0';
        return 1;
    }
    if (exp_begin < exp_end) {
        const bool negative_exponent = *exp_begin == '-';
        exp_begin += *exp_begin == '-' || *exp_begin == '+';
        long e = 0;
        for (; exp_begin < exp_end && e < 100000; ++exp_begin) e = e * 10 + (*exp_begin - '0');
        n += negative_exponent ? -e : e;
    }
    if (n < -300 || n > 300) return 0;
    return static_cast<std::size_t>(
        layout_decimal(buffer, negative, digits, k, static_cast<int>(n)) - buffer);
}

// 5^0 .. 5^27 (5^27 < 2^63).
inline constexpr std::uint64_t kPowersOfFive[28] = {
    1ull,
    5ull,
    25ull,
    125ull,
    625ull,
    3125ull,
    15625ull,
    78125ull,
    390625ull,
    1953125ull,
    9765625ull,
    48828125ull,
    244140625ull,
    1220703125ull,
    6103515625ull,
    30517578125ull,
    152587890625ull,
    762939453125ull,
    3814697265625ull,
    19073486328125ull,
    95367431640625ull,
    476837158203125ull,
    2384185791015625ull,
    11920928955078125ull,
    59604644775390625ull,
    298023223876953125ull,
    1490116119384765625ull,
    7450580596923828125ull,
};

inline constexpr bool kLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

// 10^0 .. 10^8.
inline constexpr std::uint64_t kPowersOfTen[9] = {1,      10,      100,      1000,     10000,
                                                  100000, 1000000, 10000000, 100000000};

// The value of the r (1 to 8) ASCII digits that end at `to`, from one 8-byte
// load (the 8 - r bytes before them, which must be readable, are masked off):
// the bytes become digit values (XOR with '0': no borrows), then neighbouring
// values are merged into 2-, 4- and 8-digit values in wider and wider lanes.
inline std::uint64_t digits_before(const unsigned char* to, int r) {
    std::uint64_t x;
    std::memcpy(&x, to - 8, 8);  // little-endian: the first digit is the low byte
    x ^= 0x3030303030303030u;
    x &= ~std::uint64_t{0} << (8 * (8 - r));
    x = (x * 10 + (x >> 8)) & 0x00FF00FF00FF00FFu;
    x = (x * 100 + (x >> 16)) & 0x0000FFFF0000FFFFu;
    return (x * 10000 + (x >> 32)) & 0xFFFFFFFFu;
}

// Whether the decimal d × 10^q, with 16 or 17 significant digits (d has no
// trailing zero; r is its last digit) and |q| <= 27, is exactly what Number::toString prints for
// the double v it reads as (the shortest decimal that reads as v, the closest
// to v among those). True when, with v's rounding interval approximated from
// outside by v ± ulp/2 (the true lower half is narrower below a power of two):
//   (1) d is the closest decimal of its length to v: v lies strictly between
//       (d - 1/2) × 10^q and (d + 1/2) × 10^q, and
//   (2) no shorter decimal reads as v: every decimal with fewer significant
//       digits at this magnitude is a multiple of 10^(q+1), and the two around
//       d × 10^q, (d / 10) × 10^(q+1) and (d / 10 + 1) × 10^(q+1), lie
//       strictly outside v ± ulp/2 (so do the rest, beyond them).
// v comes from fast_float's Eisel-Lemire step, exact whenever it decides; the
// comparisons are exact, in 128-bit integers. False also when undecided (ties
// included): the caller then reformats from the double.
inline bool is_shortest_decimal(std::uint64_t d, std::uint64_t r, int q) {
    __extension__ using u128 = unsigned __int128;
    const auto v = fast_float::compute_float<fast_float::binary_format<double>>(q, d);
    if (v.power2 <= 0) return false;  // undecided (or subnormal, which |q| <= 27 rules out)
    // v = m × 2^e. Each test compares a × 2^(e-1) with b × 10^q / 2, that is
    // a × 5^-q × 2^(e-q) with b when q < 0, a × 2^(e-q) with b × 5^q otherwise.
    const std::uint64_t m = v.mantissa | (std::uint64_t{1} << 52);
    const int e = v.power2 - 1075;
    const std::uint64_t five = kPowersOfFive[q < 0 ? -q : q];
    const int t = q - e;
    if (q < 0 && t > 0 && t <= 58) {
        // The usual case (a fraction), in units of 2^-t: with x = m × 5^-q,
        // v = x, a unit of d is 2^t, ulp/2 is 5^-q / 2. With R = x - d × 2^t,
        // u = R + 2^(t-1) and r the last digit of d, (1) is 0 < u < 2^t, and
        // (2) is 2u + (2r - 1) × 2^t > 5^-q (v - ulp/2 above (d / 10) × 10^(q+1))
        // and 2u + 5^-q < (21 - 2r) × 2^t (v + ulp/2 below (d / 10 + 1) × 10^(q+1)).
        // x < 2^116 and d × 2^t < 2^115; R wraps when negative, and once it is
        // known to fit in 64 bits, t <= 58 keeps everything else below 2^64.
        const u128 big_r = static_cast<u128>(m) * five - (static_cast<u128>(d) << t);
        const auto low = static_cast<std::uint64_t>(big_r);
        if (static_cast<std::uint64_t>(big_r >> 64) !=
            static_cast<std::uint64_t>(static_cast<std::int64_t>(low) >> 63))
            return false;  // |R| >= 2^63: (1) fails
        const std::uint64_t unit = std::uint64_t{1} << t;
        const std::uint64_t u = low + (unit >> 1);
        if (u - 1 >= unit - 1) return false;  // (1)
        return 2 * u + (2 * r - 1) * unit > five && 2 * u + five < (21 - 2 * r) * unit;
    }
    const u128 f = q < 0 ? five : 1;  // left factor
    const u128 g = q < 0 ? 1 : five;  // right factor
    const u128 mf = static_cast<u128>(m) * f;
    u128 below = 2 * mf - f, at = 2 * mf, above = 2 * mf + f;  // (2m - 1, 2m, 2m + 1) × f
    const std::uint64_t shorter = d / 10;
    u128 lo = static_cast<u128>(2 * d - 1) * g, hi = static_cast<u128>(2 * d + 1) * g;
    u128 down = static_cast<u128>(20 * shorter) * g, up = static_cast<u128>(20 * (shorter + 1)) * g;
    const int shift = -t;
    if (shift > 0) {
        if (shift > 126 || (above >> (127 - shift)) != 0) return false;
        below <<= shift;
        at <<= shift;
        above <<= shift;
    } else if (shift < 0) {
        if (shift < -126 || (up >> (127 + shift)) != 0)
            return false;  // up is the largest right side
        lo <<= -shift;
        hi <<= -shift;
        down <<= -shift;
        up <<= -shift;
    }
    return lo < at && at < hi && down < below && above < up;
}

// The canonical form of a literal with 16 or more significant digits when its
// digits (at most 17 of them once trailing zeros are dropped) are already the
// canonical ones (see is_shortest_decimal): the digits laid out as
// ECMAScript's Number::toString does. Writes into buffer (kMaxNumberChars
// bytes) and returns the length, or returns 0 (the caller then reformats from
// the double). Typically a double printed by another serializer.
inline std::size_t keep_long_decimal(const unsigned char* input_begin,
                                     const unsigned char* input_end, bool negative,
                                     const unsigned char* int_begin, const unsigned char* int_end,
                                     const unsigned char* frac_begin, const unsigned char* frac_end,
                                     std::size_t frac_leading_zeros, const unsigned char* exp_begin,
                                     const unsigned char* exp_end, char* buffer) {
    const long frac_digits = frac_end - frac_begin;
    const bool has_exponent = exp_begin < exp_end;
    const unsigned char* first =
        *int_begin == '0' ? frac_begin + frac_leading_zeros : int_begin;  // first significant digit
    // Digits from first on, skipping the '.' if first is in the integer part.
    const long k_all = first == int_begin ? (int_end - int_begin) + frac_digits : frac_end - first;
    if (k_all > 19) return 0;  // d below 10^19 < 2^64
    std::uint64_t d = 0;
    // Too close to the input's start for word loads before the digits?
    const bool bytewise = !kLittleEndian || int_begin - input_begin < 8;
    auto take = [&](const unsigned char* from, const unsigned char* to) {
        if (bytewise) {
            for (; from < to; ++from) d = d * 10 + static_cast<unsigned>(*from - '0');
            return;
        }
        for (; to - from > 8; from += 8) d = d * 100000000 + digits_before(from + 8, 8);
        const int r = static_cast<int>(to - from);
        if (r > 0) d = d * kPowersOfTen[r] + digits_before(to, r);
    };
    if (first == int_begin) {
        take(int_begin, int_end);
        take(frac_begin, frac_end);
    } else {
        take(first, frac_end);
    }
    int k = static_cast<int>(k_all);
    long q = -frac_digits;  // value = d × 10^q
    if (has_exponent) {
        const bool negative_exponent = *exp_begin == '-';
        exp_begin += *exp_begin == '-' || *exp_begin == '+';
        if (exp_end - exp_begin > 4) return 0;
        long x = 0;
        for (; exp_begin < exp_end; ++exp_begin) x = x * 10 + (*exp_begin - '0');
        q += negative_exponent ? -x : x;
    }
    const int k_literal = k;
    const unsigned char last = frac_digits != 0 ? frac_end[-1] : int_end[-1];
    while (last == '0' && d % 10 == 0 && d != 0) {
        d /= 10;
        --k;
        ++q;
    }
    if (k < 16 || k > 17 || q < -27 || q > 27) return 0;
    if (!is_shortest_decimal(d, k == k_literal ? last - '0' : d % 10, static_cast<int>(q)))
        return 0;
    const long n = q + k;  // value = 0.digits × 10^n
    if (k == k_literal && !has_exponent && n > -6) {
        // [-]int[.frac] with no trailing zero, and ECMAScript's layout is plain
        // notation too (n <= 21 as k <= 17): the literal is the canonical text.
        const unsigned char* literal = int_begin - negative;
        const auto len =
            static_cast<std::size_t>(exp_end - literal);  // no exponent: the literal ends there
#if defined(__SSE2__)
        if (input_end - literal >=
            32) {  // at most 25 bytes; the output has kMaxNumberChars of room
            const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(literal));
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(literal + 16));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(buffer), a);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(buffer + 16), b);
            return len;
        }
#endif
        (void)input_end;
        std::memcpy(buffer, literal, len);
        return len;
    }
    char digits[17];
    for (int i = 0; i < k; ++first) {
        if (*first != '.') digits[i++] = static_cast<char>(*first);
    }
    return static_cast<std::size_t>(
        layout_decimal(buffer, negative, digits, k, static_cast<int>(n)) - buffer);
}

/// The ECMAScript Number::toString of `value` into buffer (kMaxNumberChars
/// bytes): its shortest round-trip digits, laid out; returns the length.
inline std::size_t shortest_decimal(double value, char* buffer) noexcept {
    if (value == 0) {  // both zeros
        buffer[0] = '0';
        return 1;
    }
    // Shortest round-trip digits (Ryu in libstdc++) as "[-]d[.ddd]e[+-]x",
    // then ECMAScript's layout.
    char sci[kMaxNumberChars];
    auto res = std::to_chars(sci, sci + sizeof sci, value, std::chars_format::scientific);
    const char* p = sci;
    const char* const end = res.ptr;
    const bool negative = *p == '-';
    p += negative;
    char digits[20];
    digits[0] = *p++;
    int k = 1;
    if (*p == '.') {
        ++p;
        const char* e =
            static_cast<const char*>(std::memchr(p, 'e', static_cast<std::size_t>(end - p)));
        std::memcpy(digits + 1, p, static_cast<std::size_t>(e - p));
        k += static_cast<int>(e - p);
        p = e;
    }
    ++p;  // 'e'
    const bool negative_exponent = *p == '-';
    ++p;  // to_chars always writes the exponent's sign
    int exponent = 0;
    for (; p < end; ++p) exponent = exponent * 10 + (*p - '0');
    if (negative_exponent) exponent = -exponent;
    return static_cast<std::size_t>(layout_decimal(buffer, negative, digits, k, exponent + 1) -
                                    buffer);
}

}  // namespace idem::core::numbers
