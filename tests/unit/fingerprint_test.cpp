// Fingerprint: the digest layout, JSON-insensitive equality, raw fallback.
#include <string>

#include <gtest/gtest.h>

#include "fingerprint.hpp"

namespace {

using idem::core::fingerprint;
using idem::core::sha256;
using idem::core::to_hex;

TEST(Sha256, KnownAnswer) {
    EXPECT_EQ(to_hex(sha256("")),
              "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(to_hex(sha256("abc")),
              "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Fingerprint, LayoutIsMethodPathBody) {
    EXPECT_EQ(fingerprint("post", "/orders", std::string_view(" {\"b\":1, \"a\":2} ")),
              sha256("POST\n/orders\n{\"a\":2,\"b\":1}"));
    EXPECT_EQ(fingerprint("POST", "/x", std::nullopt), sha256("POST\n/x\n"));
    EXPECT_EQ(fingerprint("POST", "/x", std::string_view("")), sha256("POST\n/x\n"));
}

TEST(Fingerprint, JsonBodiesCompareByMeaningOfText) {
    auto a = fingerprint(
        "POST", "/p", std::string_view(R"({"amount":1000,"currency":"eur","note":"caf\u00e9"})"));
    auto b = fingerprint(
        "POST", "/p",
        std::string_view("{ \"note\" : \"caf\xC3\xA9\", \"currency\":\"eur\",\n\"amount\":1e3 }"));
    EXPECT_EQ(a, b);
    EXPECT_NE(a,
              fingerprint("POST", "/p",
                          std::string_view(R"({"amount":1001,"currency":"eur","note":"café"})")));
    EXPECT_NE(a,
              fingerprint("PUT", "/p",
                          std::string_view(R"({"amount":1000,"currency":"eur","note":"café"})")));
}

TEST(Fingerprint, NonJsonBodiesUseRawBytes) {
    for (std::string body : {std::string("a=1&b=2"), std::string("{\"a\":1,\"a\":2}"),
                             std::string("\xFF\xFE"), std::string("[1e400]"), std::string("  ")}) {
        EXPECT_EQ(fingerprint("POST", "/p", std::string_view(body)), sha256("POST\n/p\n" + body))
            << body;
    }
}

TEST(Fingerprint, ExcludedMembersDoNotCount) {
    std::vector<idem::core::JsonPointer> exclude{idem::core::JsonPointer::parse("/nonce")};
    auto a = fingerprint("POST", "/p", std::string_view(R"({"x":1,"nonce":"abc"})"), exclude);
    auto b = fingerprint("POST", "/p", std::string_view(R"({"nonce":"def","x":1})"), exclude);
    EXPECT_EQ(a, b);
    EXPECT_EQ(a, sha256("POST\n/p\n{\"x\":1}"));
}

TEST(Fingerprint, RejectsAmbiguousMethodAndPath) {
    EXPECT_THROW(fingerprint("PO\nST", "/p", std::nullopt), idem::core::InvalidRequest);
    EXPECT_THROW(fingerprint("", "/p", std::nullopt), idem::core::InvalidRequest);
    EXPECT_THROW(fingerprint("POST", "/p\n/q", std::nullopt), idem::core::InvalidRequest);
}

TEST(Fingerprint, TooDeepJsonIsAnErrorNotRawBytes) {
    idem::core::CanonicalizeOptions options;
    options.max_depth = 2;
    EXPECT_THROW(fingerprint("POST", "/p", std::string_view("[[[1]]]"), {}, options),
                 idem::core::JsonException);
}

}  // namespace
