// Unit tests of the canonicalizer: layout, ordering, escapes, and every kind of
// rejected input with its byte offset.
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "jcs.hpp"

namespace {

using idem::core::canonicalize;
using idem::core::CanonicalizeOptions;
using idem::core::JsonErrc;
using idem::core::JsonError;
using idem::core::JsonPointer;

std::string canon(const std::string& input) { return canonicalize(input); }

JsonError rejection(const std::string& input, CanonicalizeOptions options = {}) {
    std::string out;
    JsonError error;
    EXPECT_FALSE(canonicalize(input, out, error, options)) << "accepted: " << input;
    return error;
}

TEST(Canonicalize, RemovesWhitespaceAndSortsMembers) {
    EXPECT_EQ(canon(" { \"b\" : [ 1 , 2 ] ,\n\t\"a\" : { \"d\":true, \"c\":null } } "),
              "{\"a\":{\"c\":null,\"d\":true},\"b\":[1,2]}");
}

TEST(Canonicalize, SortsByUtf16CodeUnitsNotCodePoints) {
    // U+FF21 (EF BC A1) sorts after U+1F600 (F0 9F 98 80) in UTF-16 (0xD83D < 0xFF21),
    // though before it in UTF-8 and by code point.
    const std::string fullwidth = "\xEF\xBC\xA1";
    const std::string emoji = "\xF0\x9F\x98\x80";
    EXPECT_EQ(canon("{\"" + fullwidth + "\":1,\"" + emoji + "\":2}"),
              "{\"" + emoji + "\":2,\"" + fullwidth + "\":1}");
    EXPECT_TRUE(idem::core::utf16_less(emoji, fullwidth));
    EXPECT_FALSE(idem::core::utf16_less(fullwidth, emoji));
    // Below U+E000 the orders agree.
    EXPECT_TRUE(idem::core::utf16_less("\xED\x9F\xBF", emoji));
    EXPECT_TRUE(idem::core::utf16_less("a", "ab"));
    EXPECT_FALSE(idem::core::utf16_less("ab", "ab"));
}

TEST(Canonicalize, EscapesLikeJsonStringify) {
    EXPECT_EQ(canon(R"(["\u0000\u001f\b\t\n\f\r\"\\\/\u0041\u00e9\u2028\u007f"])"),
              "[\"\\u0000\\u001f\\b\\t\\n\\f\\r\\\"\\\\/A\xC3\xA9\xE2\x80\xA8\x7F\"]");
    EXPECT_EQ(canon(R"("\uD83D\uDE00")"), "\"\xF0\x9F\x98\x80\"");
    EXPECT_EQ(canon(R"("\ud83d\ude00")"), "\"\xF0\x9F\x98\x80\"");
}

TEST(Canonicalize, DoesNotNormalizeUnicode) { EXPECT_EQ(canon("\"A\\u030a\""), "\"A\xCC\x8A\""); }

TEST(Canonicalize, NumbersFollowEcmaScript) {
    EXPECT_EQ(canon("[-0, 0.0, 1.0, 1e0, 10e-1, 1E+2, 0.1e1]"), "[0,0,1,1,1,100,1]");
    EXPECT_EQ(canon("[1e21, 1e20, 1e-7, 1e-6, 0.000001, 0.0000001]"),
              "[1e+21,100000000000000000000,1e-7,0.000001,0.000001,1e-7]");
    EXPECT_EQ(canon("[9007199254740993, 295147905179352825856]"),
              "[9007199254740992,295147905179352830000]");
    EXPECT_EQ(canon("[5e-324, 1e-400, -1e-400, 2.4703282292062327e-324]"), "[5e-324,0,0,0]");
    EXPECT_EQ(canon("[123456789012345, 1234567890123456, 0.1234567890123456789]"),
              "[123456789012345,1234567890123456,0.12345678901234568]");
    EXPECT_EQ(canon("[1.7976931348623157e308, 0.30000000000000004, 1e007]"),
              "[1.7976931348623157e+308,0.30000000000000004,10000000]");
    EXPECT_EQ(canon("[-0.5, 0.00001, -12.25]"), "[-0.5,0.00001,-12.25]");
}

TEST(Canonicalize, NumbersOfSixteenAndSeventeenDigits) {
    // Literals of 16 or 17 significant digits: kept when already the shortest
    // and closest form, reformatted otherwise (expected values from V8's
    // String(Number(literal))). Each is tried at the start of the document
    // (digits read byte by byte) and after some bytes (read as words).
    const std::pair<const char*, const char*> cases[] = {
        {"97.56308477371931", "97.56308477371931"},
        {"0.40524919028393924", "0.40524919028393924"},
        {"-0.0006669266866520048", "-0.0006669266866520048"},
        {"113536.06381453574", "113536.06381453574"},
        {"0.30000000000000004", "0.30000000000000004"},
        {"0.000001234567890123456", "0.000001234567890123456"},
        {"0.0000012345678901234567", "0.0000012345678901234567"},
        {"1234567890123456.7", "1234567890123456.8"},
        {"12345678901234567", "12345678901234568"},
        {"-1234567890123456", "-1234567890123456"},
        {"0.10000000000000001", "0.1"},
        {"0.1000000000000000055", "0.1"},
        {"9007199254740993", "9007199254740992"},
        {"9007199254740992.0", "9007199254740992"},
        {"1.0000000000000002", "1.0000000000000002"},
        {"0.29999999999999999", "0.3"},
        {"4.3499999999999996", "4.35"},
        {"1.00000000000000001", "1"},
        {"0.30000000000000005", "0.30000000000000004"},
        {"0.30000000000000003", "0.30000000000000004"},
        {"97.563084773719315", "97.56308477371931"},
        {"0.40524919028393925", "0.40524919028393924"},
        {"0.40524919028393923", "0.40524919028393924"},
        {"9.756308477371931e1", "97.56308477371931"},
        {"975630847737193.1e-13", "97.56308477371931"},
        {"0.9756308477371931E+2", "97.56308477371931"},
        {"97.5630847737193100", "97.56308477371931"},
        {"3.0000000000000004e-1", "0.30000000000000004"},
        {"1.2345678901234567e-7", "1.2345678901234566e-7"},
        {"1.2345678901234567e-6", "0.0000012345678901234567"},
        {"123456789012345678e-1", "12345678901234568"},
        {"1.2345678901234567e21", "1.2345678901234568e+21"},
        {"1.2345678901234567e20", "123456789012345670000"},
        {"-5.0000000000000004e-7", "-5.000000000000001e-7"},
        {"2.2250738585072014e-308", "2.2250738585072014e-308"},
        {"1.7976931348623157e308", "1.7976931348623157e+308"},
        {"4.9406564584124654e-324", "5e-324"},
        {"9007199254740995", "9007199254740996"},
        {"18014398509481985", "18014398509481984"},
        {"9999999999999999", "10000000000000000"},
        {"99999999999999999", "100000000000000000"},
        {"0.9999999999999999", "0.9999999999999999"},
        {"0.99999999999999999", "1"},
        {"1.9999999999999998", "1.9999999999999998"},
        {"4503599627370495.5", "4503599627370495.5"},
        {"4503599627370496.5", "4503599627370496"},
        {"0.1234567890123456", "0.1234567890123456"},
        {"1e-27", "1e-27"},
        {"1.234567890123456e-27", "1.234567890123456e-27"},
        {"1.2345678901234567e-28", "1.2345678901234567e-28"},
    };
    for (const auto& [literal, expected] : cases) {
        const std::string in(literal), out(expected);
        EXPECT_EQ(canon(in), out) << in;
        EXPECT_EQ(canon("[\"padding\", " + in + " ]"), "[\"padding\"," + out + "]") << in;
        EXPECT_EQ(canon("{\"k\":-1,\"a\":" + in + "}"), "{\"a\":" + out + ",\"k\":-1}") << in;
        if (in[0] != '-') {
            EXPECT_EQ(canon("[-" + in + "]"), "[" + (out == "0" ? out : "-" + out) + "]") << in;
        }
    }
}

TEST(Canonicalize, KeepsArrayOrderAndScalars) {
    EXPECT_EQ(canon("[3,1,2,true,false,null,\"x\",[],{}]"), "[3,1,2,true,false,null,\"x\",[],{}]");
    EXPECT_EQ(canon("  \"  lead\"  "), "\"  lead\"");
}

TEST(Canonicalize, NameComparisonAfterUnescaping) {
    // "\u0062" is "b": it sorts as b, not as a backslash.
    EXPECT_EQ(canon(R"({"\u0062":1,"a":2,"c":3})"), R"({"a":2,"b":1,"c":3})");
}

TEST(Canonicalize, DeepButAllowedNesting) {
    std::string deep(1000, '[');
    deep += std::string(1000, ']');
    EXPECT_EQ(canon(deep), deep);
}

TEST(Rejects, InvalidJsonWithOffset) {
    EXPECT_EQ(rejection("").code, JsonErrc::syntax);
    EXPECT_EQ(rejection("   ").offset, 3u);
    JsonError e = rejection("{\"a\":1} x");
    EXPECT_EQ(e.code, JsonErrc::syntax);
    EXPECT_EQ(e.offset, 8u);
    EXPECT_EQ(rejection("[1,]").offset, 3u);
    EXPECT_EQ(rejection("{\"a\" 1}").offset, 5u);
    EXPECT_EQ(rejection("[01]").code, JsonErrc::syntax);
    EXPECT_EQ(rejection("[1.]").code, JsonErrc::syntax);
    EXPECT_EQ(rejection("[.5]").code, JsonErrc::syntax);
    EXPECT_EQ(rejection("[+1]").code, JsonErrc::syntax);
    EXPECT_EQ(rejection("[1e]").code, JsonErrc::syntax);
    EXPECT_EQ(rejection("[-]").code, JsonErrc::syntax);
    EXPECT_EQ(rejection("tru").code, JsonErrc::syntax);
    EXPECT_EQ(rejection("[NaN]").code, JsonErrc::syntax);
    EXPECT_EQ(rejection("[Infinity]").code, JsonErrc::syntax);
    EXPECT_EQ(rejection("\"a\tb\"").code, JsonErrc::syntax);  // raw control character
    EXPECT_EQ(rejection("\"\\x\"").code, JsonErrc::syntax);
    EXPECT_EQ(rejection("\"\\u12G4\"").code, JsonErrc::syntax);
    EXPECT_EQ(rejection("\"abc").code, JsonErrc::syntax);
    EXPECT_EQ(rejection("\xEF\xBB\xBF{}").code, JsonErrc::syntax);  // byte order mark
    EXPECT_EQ(rejection("{\"a\":1}{").code, JsonErrc::syntax);
    EXPECT_EQ(rejection(std::string("[1]\0", 4)).code, JsonErrc::syntax);
}

TEST(Rejects, InvalidUtf8) {
    for (const char* bad :
         {"\"\xFF\"", "\"\xC0\xAF\"", "\"\xE0\x80\xAF\"", "\"\xED\xA0\x80\"",
          "\"\xF4\x90\x80\x80\"", "\"\xC3\"", "\"\x80\"", "\"\xF0\x9F\x98\"", "\"ok\\n\xFE\""}) {
        JsonError e = rejection(bad);
        EXPECT_EQ(e.code, JsonErrc::invalid_utf8) << bad;
    }
    EXPECT_EQ(rejection("\"abc\xFF\"").offset, 4u);
}

TEST(Rejects, LoneAndReversedSurrogates) {
    EXPECT_EQ(rejection(R"("\uD800")").code, JsonErrc::lone_surrogate);
    EXPECT_EQ(rejection(R"("\uDC00")").code, JsonErrc::lone_surrogate);
    EXPECT_EQ(rejection(R"("\uDE00\uD83D")").code, JsonErrc::lone_surrogate);
    EXPECT_EQ(rejection(R"("\uD83Dx")").code, JsonErrc::lone_surrogate);
    EXPECT_EQ(rejection(R"("\uD83D\u0041")").code, JsonErrc::lone_surrogate);
    EXPECT_EQ(rejection(R"(["ok", "x\uD800"])").offset, 9u);
    // Raw (UTF-8 encoded) surrogates are invalid UTF-8.
    EXPECT_EQ(rejection("\"\xED\xB0\x80\"").code, JsonErrc::invalid_utf8);
}

TEST(Rejects, DuplicateNamesAlsoAfterUnescaping) {
    JsonError e = rejection(R"({"a":1,"b":2,"a":3})");
    EXPECT_EQ(e.code, JsonErrc::duplicate_name);
    EXPECT_EQ(e.offset, 13u);  // the second "a"
    EXPECT_EQ(rejection(R"({"a":1,"\u0061":2})").code, JsonErrc::duplicate_name);
    EXPECT_EQ(rejection(R"({"x":{"\/":1,"/":2}})").code, JsonErrc::duplicate_name);
    // Same name in different objects is fine.
    EXPECT_EQ(canon(R"({"a":{"a":1},"b":{"a":2}})"), R"({"a":{"a":1},"b":{"a":2}})");
}

TEST(Rejects, NumbersThatOverflow) {
    EXPECT_EQ(rejection("1e400").code, JsonErrc::number_overflow);
    EXPECT_EQ(rejection("[0, -1.8e308]").offset, 4u);
    EXPECT_EQ(rejection(std::string("1") + std::string(400, '0')).code, JsonErrc::number_overflow);
}

TEST(Rejects, NestingBeyondTheLimit) {
    std::string deep(100000, '[');
    EXPECT_EQ(rejection(deep).code, JsonErrc::too_deep);
    CanonicalizeOptions options;
    options.max_depth = 3;
    EXPECT_EQ(rejection("[[[[1]]]]", options).offset, 3u);
    std::string out;
    JsonError error;
    EXPECT_TRUE(canonicalize("[[[1]]]", out, error, options));
}

TEST(Exclude, RemovesMembersNamedByPointers) {
    std::vector<JsonPointer> exclude{
        JsonPointer::parse("/meta/ts"),      JsonPointer::parse("/a~1b"),
        JsonPointer::parse("/m~0n"),         JsonPointer::parse("/list/1"),
        JsonPointer::parse("/nothing/here"), JsonPointer::parse("/list/9")};
    std::string out;
    JsonError error;
    ASSERT_TRUE(canonicalize(R"({"meta":{"ts":1,"id":2},"a/b":3,"m~n":4,"list":[0,1,2],"keep":5})",
                             out, error, {}, &exclude));
    EXPECT_EQ(out, R"({"keep":5,"list":[0,2],"meta":{"id":2}})");
}

TEST(Exclude, PointerSyntax) {
    EXPECT_THROW(JsonPointer::parse(""), std::invalid_argument);
    EXPECT_THROW(JsonPointer::parse("a"), std::invalid_argument);
    EXPECT_THROW(JsonPointer::parse("/a~2"), std::invalid_argument);
    EXPECT_THROW(JsonPointer::parse("/a~"), std::invalid_argument);
    EXPECT_EQ(JsonPointer::parse("/").tokens(), std::vector<std::string>{""});
    EXPECT_EQ(JsonPointer::parse("/~01").tokens(), std::vector<std::string>{"~1"});
    EXPECT_EQ(JsonPointer::parse("/a//b").tokens(), (std::vector<std::string>{"a", "", "b"}));
}

// Strings are copied to the output in the 16-byte blocks they are scanned in:
// quotes, escapes and non-ASCII bytes at every offset around a block boundary,
// with the string also ending at every distance from the end of the input.
TEST(SinglePass, StringsAroundBlockBoundaries) {
    for (std::size_t n = 0; n <= 40; ++n) {
        const std::string run(n, 'x');
        EXPECT_EQ(canon("\"" + run + "\""), "\"" + run + "\"") << n;
        EXPECT_EQ(canon("[\"" + run + "\" ]"), "[\"" + run + "\"]") << n;
        EXPECT_EQ(canon("[\"" + run + "\",\"" + run + "\"]"), "[\"" + run + "\",\"" + run + "\"]")
            << n;
        EXPECT_EQ(canon("\"" + run + "\\n" + run + "\""), "\"" + run + "\\n" + run + "\"") << n;
        EXPECT_EQ(canon("\"" + run + "\\u0041\""), "\"" + run + "A\"") << n;
        EXPECT_EQ(canon("\"" + run + "\\/y\""), "\"" + run + "/y\"") << n;
        EXPECT_EQ(canon("\"" + run + "\xc3\xa9" + run + "\""), "\"" + run + "\xc3\xa9" + run + "\"")
            << n;
        EXPECT_EQ(canon("\"" + run + "\xf0\x9f\x98\x80\"  "), "\"" + run + "\xf0\x9f\x98\x80\"")
            << n;
        EXPECT_EQ(canon("{\"" + run + "\":1,\"" + run + "a\":2}"),
                  "{\"" + run + "\":1,\"" + run + "a\":2}")
            << n;
        EXPECT_EQ(rejection("\"" + run + "\xc3\x28\"").code, JsonErrc::invalid_utf8) << n;
        EXPECT_EQ(rejection("\"" + run + "\xc3\x28\"").offset, n + 1) << n;
        EXPECT_EQ(rejection("[\"" + run + "\xe2\x82\"]").offset, n + 2) << n;
        EXPECT_EQ(rejection("\"" + run + "\x01\"").offset, n + 1) << n;
        EXPECT_EQ(rejection("\"" + run).offset, n + 1) << n;
        EXPECT_EQ(rejection("[\"" + run + "\\").offset, n + 2) << n;
    }
}

// A string value with escapes is rewritten straight into the output; a member
// name is decoded first (it is sorted unescaped). Both give the same text.
TEST(SinglePass, EscapedValuesAndNamesAgree) {
    const std::string raw =
        R"("a\u0022b\u005c\u0008\u000c\n\u001f\u007f\u00e9\u2028\ud83d\ude00\uDBFF\uDFFF\/\"\\\b\f\r\t\u0000x")";
    const std::string expected =
        "\"a\\\"b\\\\\\b\\f\\n\\u001f\x7f\xc3\xa9\xe2\x80\xa8\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf/"
        "\\\"\\\\\\b\\f\\r\\t\\u0000x\"";
    EXPECT_EQ(canon(raw), expected);
    EXPECT_EQ(canon("[" + raw + "]"), "[" + expected + "]");
    EXPECT_EQ(canon("{" + raw + ":" + raw + "}"), "{" + expected + ":" + expected + "}");
    for (const std::string prefix : {"", "[", "{\"k\":"}) {
        const std::size_t at = prefix.size();
        EXPECT_EQ(rejection(prefix + R"("ab\u12")").offset, at + 3) << prefix;
        EXPECT_EQ(rejection(prefix + R"("ab\x")").offset, at + 3) << prefix;
        EXPECT_EQ(rejection(prefix + R"("ab\uDC00")").code, JsonErrc::lone_surrogate) << prefix;
        EXPECT_EQ(rejection(prefix + R"("ab\uD800\u0041")").offset, at + 3) << prefix;
        EXPECT_EQ(rejection(prefix + R"("ab\n)" + "\xc3\x28\"").offset, at + 5) << prefix;
        EXPECT_EQ(rejection(prefix + R"("ab\n)" + "\x1f\"").offset, at + 5) << prefix;
        EXPECT_EQ(rejection(prefix + R"("ab\n)").offset, at + 5) << prefix;
        EXPECT_EQ(rejection(prefix + R"("ab\)").offset, at + 3) << prefix;
    }
}

// Every byte value at every offset of a 16-byte block, in a value and in a
// member name: copied as it is, or rejected where it stands.
TEST(SinglePass, EveryByteAtEveryBlockOffset) {
    for (int b = 1; b < 256; ++b) {
        if (b == '"' || b == '\\') continue;
        for (std::size_t n = 0; n < 20; ++n) {
            const std::string text =
                std::string(n, 'x') + static_cast<char>(b) + std::string(20, 'y');
            const std::string value = "[\"" + text + "\"]", member = "{\"" + text + "\":0}";
            if (b >= 0x20 && b < 0x80) {
                EXPECT_EQ(canon(value), value) << b << " at " << n;
                EXPECT_EQ(canon(member), member) << b << " at " << n;
            } else {
                const JsonErrc code = b < 0x20 ? JsonErrc::syntax : JsonErrc::invalid_utf8;
                EXPECT_EQ(rejection(value).code, code) << b << " at " << n;
                EXPECT_EQ(rejection(value).offset, n + 2) << b << " at " << n;
                EXPECT_EQ(rejection(member).offset, n + 2) << b << " at " << n;
            }
        }
    }
}

// Members are written in document order and reordered when the object closes:
// long members (several 16-byte blocks), nested objects, members that are
// already in order.
TEST(SinglePass, ReordersMembersOfAnyLength) {
    const std::string a(37, 'a'), b(16, 'b');
    EXPECT_EQ(
        canon("{\"z\":\"" + a + "\",\"y\":{\"d\":\"" + b + "\",\"c\":[\"" + a + "\"]},\"x\":1}"),
        "{\"x\":1,\"y\":{\"c\":[\"" + a + "\"],\"d\":\"" + b + "\"},\"z\":\"" + a + "\"}");
    EXPECT_EQ(canon("{\"a\":1,\"b\":{\"c\":2,\"d\":3},\"e\":[]}"),
              "{\"a\":1,\"b\":{\"c\":2,\"d\":3},\"e\":[]}");
    EXPECT_EQ(canon("[{},{\"b\":{},\"a\":[]},[]]"), "[{},{\"a\":[],\"b\":{}},[]]");
}

// Numbers that lie within a 16-byte block and are already canonical are
// copied in one block; the rest go the long way. With 16 bytes or fewer left in
// the input only the long way applies: both must give the same text.
TEST(SinglePass, NumbersAroundBlockBoundaries) {
    const std::vector<std::string> literals = {"0",
                                               "-0",
                                               "7",
                                               "-7",
                                               "10",
                                               "0.5",
                                               "-0.5",
                                               "0.50",
                                               "1.0",
                                               "0.000001",
                                               "0.0000001",
                                               "-0.000001234",
                                               "123456789012345",
                                               "1234567890123456",
                                               "-123456789012345",
                                               "12345678901234.5",
                                               "1234567890123.45",
                                               "0.123456789012345",
                                               "0.1234567890123456",
                                               "0.00000123456789",
                                               "99999999999999.9",
                                               "5e3",
                                               "5E-3",
                                               "1.5e2",
                                               "123456789012345678",
                                               "1.25",
                                               "-9007199254740993",
                                               "100000000000000.0",
                                               "01",
                                               "1.",
                                               "-",
                                               "-a",
                                               "1.5.2",
                                               "0.1e",
                                               "2.50e1"};
    EXPECT_EQ(canon("0.000001"), "0.000001");
    EXPECT_EQ(canon("0.0000001"), "1e-7");
    EXPECT_EQ(canon("-0"), "0");
    EXPECT_EQ(canon("123456789012345678"), "123456789012345680");
    EXPECT_EQ(canon("0.1234567890123456 "), "0.1234567890123456");
    EXPECT_EQ(canon("99999999999999.9  "), "99999999999999.9");
    for (const std::string& literal : literals) {
        std::string out;
        JsonError error;
        const bool ok = canonicalize(literal, out, error);
        for (std::size_t pad = 0; pad <= 20; ++pad) {
            const std::string padded = literal + std::string(pad, ' ');
            std::string padded_out;
            JsonError padded_error;
            ASSERT_EQ(canonicalize(padded, padded_out, padded_error), ok)
                << literal << " + " << pad;
            if (ok) {
                EXPECT_EQ(padded_out, out) << literal << " + " << pad;
                EXPECT_EQ(canon("[" + literal + "," + literal + "]" + std::string(pad, ' ')),
                          "[" + out + "," + out + "]");
            } else {
                EXPECT_EQ(padded_error.code, error.code) << literal << " + " << pad;
                EXPECT_EQ(padded_error.offset, error.offset) << literal << " + " << pad;
            }
        }
    }
}

// Numbers are the only values whose canonical form can be longer than their
// literal: the output grows while it is written.
TEST(SinglePass, NumbersLongerThanTheirLiteral) {
    std::string in = "[", out = "[";
    for (int i = 0; i < 2000; ++i) {
        in += i ? ",1e20" : "1e20";
        out += i ? ",100000000000000000000" : "100000000000000000000";
    }
    EXPECT_EQ(canon(in + "]"), out + "]");
    EXPECT_EQ(canon("1e20"), "100000000000000000000");
    EXPECT_EQ(canon("{\"b\":1E21,\"a\":1e20}"), "{\"a\":100000000000000000000,\"b\":1e+21}");
}

// Excluded array elements are written and then taken back, with their comma;
// excluded members are left out when their object is reordered.
TEST(Exclude, ElementsAndMembersAnywhere) {
    auto excluding = [](const std::string& input, std::vector<std::string> pointers) {
        std::vector<JsonPointer> exclude;
        for (const auto& p : pointers) exclude.push_back(JsonPointer::parse(p));
        std::string out;
        JsonError error;
        EXPECT_TRUE(canonicalize(input, out, error, {}, &exclude)) << input;
        return out;
    };
    EXPECT_EQ(excluding("[1,2,3]", {"/0"}), "[2,3]");
    EXPECT_EQ(excluding("[1,2,3]", {"/2"}), "[1,2]");
    EXPECT_EQ(excluding("[1,2,3]", {"/0", "/1", "/2"}), "[]");
    EXPECT_EQ(excluding("[[1,{\"a\":2}],{\"b\":[3]},4]", {"/0"}), "[{\"b\":[3]},4]");
    EXPECT_EQ(excluding("[[1,{\"a\":2}],{\"b\":[3]},4]", {"/0/1/a", "/1/b/0"}),
              "[[1,{}],{\"b\":[]},4]");
    EXPECT_EQ(excluding("{\"a\":1}", {"/a"}), "{}");
    EXPECT_EQ(excluding("{\"b\":{\"x\":[1]},\"a\":1}", {"/b/x", "/a"}), "{\"b\":{}}");
    EXPECT_EQ(excluding("{\"b\":1,\"a\":1}", {"/b", "/b/c", "/01", "/"}), "{\"a\":1}");
    EXPECT_EQ(excluding("{\"\":1,\"a\":1}", {"/"}), "{\"a\":1}");
    EXPECT_EQ(excluding("[0,1,2,3,4,5,6,7,8,9,10]", {"/10", "/01", "/-"}), "[0,1,2,3,4,5,6,7,8,9]");
    EXPECT_EQ(excluding("{\"a\\nb\":1,\"c\":2}", {"/a\nb"}), "{\"c\":2}");
    EXPECT_EQ(excluding("5", {"/a"}), "5");
    std::vector<JsonPointer> empty_pointer(1);  // no token: excludes nothing
    std::string out;
    JsonError error;
    EXPECT_TRUE(canonicalize("{\"a\":1}", out, error, {}, &empty_pointer));
    EXPECT_EQ(out, "{\"a\":1}");
}

// An error inside an excluded value is still an error.
TEST(Exclude, StillRejectsWhatItExcludes) {
    std::vector<JsonPointer> exclude{JsonPointer::parse("/a"), JsonPointer::parse("/b/0")};
    std::string out;
    JsonError error;
    EXPECT_FALSE(canonicalize("{\"a\":{\"x\":1,\"x\":2}}", out, error, {}, &exclude));
    EXPECT_EQ(error.code, JsonErrc::duplicate_name);
    EXPECT_FALSE(canonicalize("{\"b\":[\"\xff\"]}", out, error, {}, &exclude));
    EXPECT_EQ(error.code, JsonErrc::invalid_utf8);
    EXPECT_EQ(error.offset, 7u);
}

TEST(Errors, MessageNamesTheOffset) {
    try {
        canonicalize("[1,,2]");
        FAIL() << "no exception";
    } catch (const idem::core::JsonException& e) {
        EXPECT_EQ(std::string(e.what()), "invalid JSON at byte 3");
        EXPECT_EQ(e.error().offset, 3u);
    }
}

}  // namespace
