// Unit tests of the HTTP mapping: problem bodies, header handling, fingerprint.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fingerprint.hpp"
#include "idem/client.hpp"
#include "idem/http.hpp"

namespace {

TEST(Problem, BodiesFollowRfc9457) {
    struct Case {
        idem::Problem problem;
        int status;
        const char* slug;
    };
    for (const Case& c :
         {Case{idem::Problem::key_missing, 400, "idempotency-key-missing"},
          Case{idem::Problem::key_malformed, 400, "idempotency-key-malformed"},
          Case{idem::Problem::body_invalid, 400, "request-body-invalid"},
          Case{idem::Problem::key_reuse, 422, "idempotency-key-reuse"},
          Case{idem::Problem::request_in_progress, 409, "request-in-progress"},
          Case{idem::Problem::one_time_secret, 409, "one-time-secret"},
          Case{idem::Problem::already_processed, 409, "request-already-processed"}}) {
        idem::Response r =
            idem::problem_response(c.problem, "detail \"quoted\" \xC3\xA9", "/problems/");
        EXPECT_EQ(r.status, c.status);
        ASSERT_NE(r.header("content-type"), nullptr);
        EXPECT_EQ(*r.header("Content-Type"), "application/problem+json");
        nlohmann::json body = nlohmann::json::parse(r.body);
        EXPECT_EQ(body["type"], std::string("/problems/") + c.slug);
        EXPECT_EQ(body["status"], c.status);
        EXPECT_EQ(body["detail"], "detail \"quoted\" \xC3\xA9");
        EXPECT_TRUE(body["title"].is_string());
        EXPECT_EQ(body.size(), 4u);
        EXPECT_FALSE(r.replayed);
    }
}

TEST(Problem, TypeBaseIsConfigurable) {
    nlohmann::json body = nlohmann::json::parse(
        idem::problem_response(idem::Problem::key_reuse, "d", "https://api.example.test/errors/")
            .body);
    EXPECT_EQ(body["type"], "https://api.example.test/errors/idempotency-key-reuse");
}

TEST(Headers, NamesAreCaseInsensitive) {
    idem::Response r;
    r.headers = {{"Location", "/a"}, {"X-Other", "1"}};
    EXPECT_EQ(*r.header("location"), "/a");
    EXPECT_EQ(r.header("ETag"), nullptr);
    r.set_header("LOCATION", "/b");
    EXPECT_EQ(r.headers.size(), 2u);
    EXPECT_EQ(*r.header("Location"), "/b");
    EXPECT_TRUE(idem::header_name_equal("Idempotent-Replay", "idempotent-replay"));
    EXPECT_FALSE(idem::header_name_equal("ETag", "ETags"));
}

TEST(Fingerprint, SameBytesAsTheCore) {
    idem::Request request;
    request.method = "post";
    request.path = "/orders";
    request.body = R"({ "b": 1, "a": [1.0, "x"], "ts": 7 })";
    request.exclude = {"/ts"};
    idem::Digest digest = idem::fingerprint(request);
    auto expected = idem::core::sha256("POST\n/orders\n{\"a\":[1,\"x\"],\"b\":1}");
    EXPECT_TRUE(std::equal(digest.begin(), digest.end(), expected.begin()));
}

TEST(Fingerprint, BadInputThrows) {
    idem::Request request;
    request.method = "PO ST";
    request.path = "/";
    EXPECT_THROW(idem::fingerprint(request), std::invalid_argument);
    request.method = "POST";
    request.exclude = {"no-slash"};
    EXPECT_THROW(idem::fingerprint(request), std::invalid_argument);
    request.exclude.clear();
    request.body = std::string(5000, '[') + std::string(5000, ']');
    EXPECT_THROW(idem::fingerprint(request), idem::BodyError);
}

}  // namespace
