// The RFC 8785 test vectors in tests/jcs (see tests/jcs/README.md for source and licence).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "jcs.hpp"

namespace {

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in.good()) << "cannot open " << path;
    std::ostringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
}

const std::string kData = IDEM_TESTDATA;

double from_bits(const std::string& hex) {
    std::uint64_t bits = std::stoull(hex, nullptr, 16);
    double value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

class Documents : public ::testing::TestWithParam<const char*> {};

TEST_P(Documents, CanonicalFormMatchesReference) {
    const std::string name = GetParam();
    std::string input = slurp(kData + "/input/" + name);
    std::string expected = slurp(kData + "/output/" + name);
    ASSERT_FALSE(expected.empty());
    EXPECT_EQ(idem::core::canonicalize(input), expected);
    // Canonical output is a fixed point.
    EXPECT_EQ(idem::core::canonicalize(expected), expected);
}

INSTANTIATE_TEST_SUITE_P(Rfc8785, Documents,
                         ::testing::Values("arrays.json", "french.json", "structures.json",
                                           "unicode.json", "values.json", "weird.json"));

class Primitives : public ::testing::TestWithParam<const char*> {};

TEST_P(Primitives, CanonicalFormMatchesReference) {
    const std::string name = GetParam();
    EXPECT_EQ(idem::core::canonicalize(slurp(kData + "/primitives/input/" + name)),
              slurp(kData + "/primitives/output/" + name));
}

INSTANTIATE_TEST_SUITE_P(Rfc8785, Primitives,
                         ::testing::Values("true.json", "false.json", "null.json",
                                           "simpleString.json"));

// Runs every "HEX,EXPECTED" line of a file through format_number and through the
// parser (the expected text must come back unchanged as a canonical document).
void check_number_file(const std::string& path, std::size_t expected_lines) {
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << path;
    std::string line;
    std::size_t lines = 0;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        ++lines;
        auto comma = line.find(',');
        ASSERT_NE(comma, std::string::npos) << line;
        const std::string expected = line.substr(comma + 1);
        const double value = from_bits(line.substr(0, comma));
        EXPECT_EQ(idem::core::format_number(value), expected) << line;
        EXPECT_EQ(idem::core::canonicalize(expected), expected) << line;
    }
    EXPECT_EQ(lines, expected_lines);
}

TEST(Numbers, AppendixB) { check_number_file(kData + "/numbers.txt", 24); }

TEST(Numbers, ReferenceFileFirstThousand) { check_number_file(kData + "/es6_1k.txt", 1000); }

TEST(Numbers, InvalidBitPatternsAreNotFinite) {
    std::ifstream in(kData + "/numbers_invalid.txt");
    std::string line;
    std::size_t lines = 0;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        ++lines;
        // NaN and Infinity have no JSON form: the parser must refuse every
        // literal that would produce them.
        EXPECT_FALSE(std::isfinite(from_bits(line))) << line;
    }
    EXPECT_EQ(lines, 2u);
    idem::core::JsonError error;
    std::string out;
    for (const char* literal : {"NaN", "Infinity", "-Infinity", "1e400", "-1e400", "[nan]"}) {
        EXPECT_FALSE(idem::core::canonicalize(literal, out, error)) << literal;
    }
}

}  // namespace
