// Unit tests of the canonicalizer: layout, ordering, escapes, and every kind of
// rejected input with its byte offset.
#include <string>

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

TEST(Canonicalize, DoesNotNormalizeUnicode) {
    EXPECT_EQ(canon("\"A\\u030a\""), "\"A\xCC\x8A\"");
}

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
    for (const char* bad : {"\"\xFF\"", "\"\xC0\xAF\"", "\"\xE0\x80\xAF\"", "\"\xED\xA0\x80\"",
                            "\"\xF4\x90\x80\x80\"", "\"\xC3\"", "\"\x80\"", "\"\xF0\x9F\x98\"",
                            "\"ok\\n\xFE\""}) {
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
    std::vector<JsonPointer> exclude{JsonPointer::parse("/meta/ts"), JsonPointer::parse("/a~1b"),
                                     JsonPointer::parse("/m~0n"), JsonPointer::parse("/list/1"),
                                     JsonPointer::parse("/nothing/here"), JsonPointer::parse("/list/9")};
    std::string out;
    JsonError error;
    ASSERT_TRUE(canonicalize(R"({"meta":{"ts":1,"id":2},"a/b":3,"m~n":4,"list":[0,1,2],"keep":5})", out, error,
                             {}, &exclude));
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
