// Unit tests of the HTTP mapping: problem bodies, header handling, fingerprint.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <nlohmann/json.hpp>

#include "../src/detail.hpp"
#include "../src/stream.hpp"
#include "fingerprint.hpp"
#include "idem/client.hpp"
#include "idem/http.hpp"
#include "idem/router.hpp"

namespace {

TEST(Problem, BodiesFollowRfc9457) {
    struct Case {
        idem::Problem problem;
        int status;
        const char* slug;
    };
    for (const Case& c : {Case{idem::Problem::key_missing, 400, "idempotency-key-missing"},
                          Case{idem::Problem::key_malformed, 400, "idempotency-key-malformed"},
                          Case{idem::Problem::body_invalid, 400, "request-body-invalid"},
                          Case{idem::Problem::key_reuse, 422, "idempotency-key-reuse"},
                          Case{idem::Problem::request_in_progress, 409, "request-in-progress"},
                          Case{idem::Problem::one_time_secret, 409, "one-time-secret"},
                          Case{idem::Problem::already_processed, 409, "request-already-processed"},
                          Case{idem::Problem::key_expired, 410, "idempotency-key-expired"},
                          Case{idem::Problem::response_not_kept, 409, "response-not-kept"}}) {
        idem::Response r =
            idem::problem_response(c.problem, "detail \"quoted\" \xC3\xA9", "/problems/");
        EXPECT_EQ(r.status, c.status);
        ASSERT_NE(r.header("content-type"), nullptr);
        EXPECT_EQ(*r.header("Content-Type"), "application/problem+json");
        nlohmann::json body = nlohmann::json::parse(r.body);
        EXPECT_EQ(body["type"].get<std::string>(), std::string("/problems/") + c.slug);
        EXPECT_EQ(body["status"].get<int>(), c.status);
        EXPECT_EQ(body["detail"].get<std::string>(), "detail \"quoted\" \xC3\xA9");
        EXPECT_TRUE(body["title"].is_string());
        EXPECT_EQ(body.size(), 4u);
        EXPECT_FALSE(r.replayed);
    }
}

TEST(Problem, TypeBaseIsConfigurable) {
    nlohmann::json body = nlohmann::json::parse(
        idem::problem_response(idem::Problem::key_reuse, "d", "https://api.example.test/errors/")
            .body);
    EXPECT_EQ(body["type"].get<std::string>(),
              "https://api.example.test/errors/idempotency-key-reuse");
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

// The protocol table (client/protocol.json, the one source every client follows):
// this client's problems, details, outcome -> HTTP mapping, kept headers and
// Retry-After default, field by field. The file is found beside this source.
nlohmann::json protocol_table() {
    std::filesystem::path file =
        std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "protocol.json";
    std::ifstream in(file);
    EXPECT_TRUE(in.good()) << file;
    return nlohmann::json::parse(in);
}

// The problem table itself is generated (idem/protocol_gen.hpp, checked fresh by the
// ctest protocol_gen_fresh); problem_response builds each body from it.
TEST(ProtocolTable, ProblemResponsesCarryTheirTypeTitleAndStatus) {
    nlohmann::json table = protocol_table();
    const std::string base = table["problem_type_base"];
    for (const idem::ProblemText& text : idem::problem_texts) {
        const auto problem = static_cast<idem::Problem>(&text - idem::problem_texts.data());
        idem::Response r = idem::problem_response(problem, "d", base);
        nlohmann::json body = nlohmann::json::parse(r.body);
        EXPECT_EQ(r.status, text.status) << text.slug;
        EXPECT_EQ(body["status"].get<int>(), text.status) << text.slug;
        EXPECT_EQ(body["title"].get<std::string>(), text.title) << text.slug;
        EXPECT_EQ(body["type"].get<std::string>(), base + text.slug) << text.slug;
        EXPECT_EQ(body["detail"].get<std::string>(), "d") << text.slug;
        EXPECT_EQ(*r.header("Content-Type"), table["problem_content_type"].get<std::string>());
    }
    EXPECT_EQ(idem::problem_texts.size(), table["problems"].size());
}

TEST(ProtocolTable, DefaultsAreTheTables) {
    nlohmann::json table = protocol_table();
    idem::Options options;
    EXPECT_EQ(options.kept_headers, table["kept_headers"].get<std::vector<std::string>>());
    EXPECT_EQ(options.problem_type_base, table["problem_type_base"].get<std::string>());
    EXPECT_EQ(options.retry_after.count(), table["default_retry_after_seconds"].get<int>());
}

TEST(ProtocolTable, ExpiryHeaderAndDuplicateModesAreTheTables) {
    nlohmann::json table = protocol_table();
    EXPECT_EQ(std::string(idem::expires_header), table["expires_header"].get<std::string>());
    EXPECT_EQ(table["expires_format"].get<std::string>(), "IMF-fixdate");
    EXPECT_EQ(idem::http_date(784111777), "Sun, 06 Nov 1994 08:49:37 GMT");  // RFC 9110's example
    EXPECT_EQ(table["duplicate_modes"], (nlohmann::json{"wait", "reject"}));
    EXPECT_EQ(table["default_duplicate_mode"], "wait");
    EXPECT_EQ(idem::Options{}.duplicates, idem::Duplicates::wait);
}

TEST(ProtocolTable, ExpiryHeaderIsNeverAKeptHeader) {
    idem::Response response;
    response.headers = {{"Content-Type", "a/b"}, {"idempotency-expires", "x"}};
    EXPECT_EQ(idem::detail::kept_headers_json(response, {"Content-Type", "Idempotency-Expires"}),
              R"([["Content-Type","a/b"]])");
}

// Contract C of the streamed responses: the reserved entries and the default limit (the
// 409 answer to a retry of a stream that was not kept is the extension's:
// sql/http_answer.sql, http_answer_test.cpp).
TEST(ProtocolTable, StreamEntriesAreTheTables) {
    nlohmann::json table = protocol_table();
    EXPECT_EQ(std::string(idem::stream_chunks_entry),
              table["stream_chunks_entry"].get<std::string>());
    EXPECT_EQ(std::string(idem::not_kept_entry), table["not_kept_entry"].get<std::string>());
    EXPECT_EQ(idem::default_max_stream_bytes, table["default_max_stream_bytes"].get<std::size_t>());
    EXPECT_EQ(idem::Options{}.max_stream_bytes, idem::default_max_stream_bytes);
}

// The routing defaults (client/protocol.json `routing`): idem::routing and RouterOptions.
TEST(ProtocolTable, RoutingDefaultsAreTheTables) {
    const nlohmann::json table = protocol_table()["routing"];
    EXPECT_EQ(std::string(idem::routing::placement_sql), table["placement_sql"].get<std::string>());
    EXPECT_EQ(idem::routing::default_refresh_seconds, table["default_refresh_seconds"].get<int>());
    EXPECT_EQ(idem::routing::default_node_down_seconds,
              table["default_node_down_seconds"].get<int>());
    EXPECT_EQ(idem::routing::default_max_principals,
              table["default_max_principals"].get<std::size_t>());
    const idem::RouterOptions options;
    EXPECT_EQ(options.placement_sql, table["placement_sql"].get<std::string>());
    EXPECT_EQ(options.refresh, std::chrono::seconds(table["default_refresh_seconds"].get<int>()));
    EXPECT_EQ(options.node_down,
              std::chrono::seconds(table["default_node_down_seconds"].get<int>()));
    EXPECT_EQ(options.max_principals, table["default_max_principals"].get<std::size_t>());
    EXPECT_EQ(std::string(idem::routing::stale_placement_sqlstate),
              table["stale_placement"]["sqlstate"].get<std::string>());
    EXPECT_EQ(std::string(idem::routing::stale_placement_message),
              table["stale_placement"]["message"].get<std::string>());
    // Every key of `routing` is one of the above: a new one needs its constant here.
    std::set<std::string> keys;
    for (const auto& item : table.items()) keys.insert(item.key());
    EXPECT_EQ(keys, (std::set<std::string>{"placement_sql", "default_refresh_seconds",
                                           "default_node_down_seconds", "default_max_principals",
                                           "stale_placement"}));
    EXPECT_EQ(table["stale_placement"].size(), 2u);
}

// The stale placement predicate: SQLSTATE 0A000 and exactly the protocol's primary message,
// read from libpq's error text as libpqxx keeps it (severity first, detail lines after).
TEST(Routing, StalePlacementIsThatSqlstateAndThatMessage) {
    const std::string message = idem::routing::stale_placement_message;
    EXPECT_TRUE(idem::is_stale_placement("0A000", message));
    EXPECT_FALSE(idem::is_stale_placement("0A000", message + "."));
    EXPECT_FALSE(idem::is_stale_placement("XX000", message));
    EXPECT_TRUE(
        idem::is_stale_placement(pqxx::sql_error("ERROR:  " + message + "\n", "", "0A000")));
    EXPECT_TRUE(idem::is_stale_placement(pqxx::feature_not_supported(
        "ERROR:  " + message + "\nDETAIL:  principal alice\nHINT:  route it\n", "", "0A000")));
    EXPECT_TRUE(idem::is_stale_placement(pqxx::sql_error("ERROR:  0A000: " + message + "\n", "",
                                                         "0A000")));  // verbose errors
    EXPECT_TRUE(idem::is_stale_placement(pqxx::sql_error("FEHLER:  " + message, "", "0A000")));
    // Another feature not supported, the message under another SQLSTATE, no SQLSTATE at all,
    // and errors that are not the database's: not stale.
    EXPECT_FALSE(idem::is_stale_placement(pqxx::sql_error(
        "ERROR:  idempotency.keys is distributed by Citus, but not by principal\n", "", "0A000")));
    EXPECT_FALSE(idem::is_stale_placement(
        pqxx::sql_error("ERROR:  " + message + " (moved)\n", "", "0A000")));
    EXPECT_FALSE(
        idem::is_stale_placement(pqxx::sql_error("ERROR:  " + message + "\n", "", "XX000")));
    EXPECT_FALSE(idem::is_stale_placement(pqxx::sql_error("ERROR:  " + message + "\n")));
    EXPECT_FALSE(idem::is_stale_placement(pqxx::broken_connection(message)));
    EXPECT_FALSE(idem::is_stale_placement(std::runtime_error(message)));
}

// report_stale_placement counts, and marks no node down (it needs no database: the router
// connects only to look a placement up). That it drops the cached placement is in
// router_test.cpp, which has placements to look up.
TEST(Routing, ReportStalePlacementCountsAndMarksNoNodeDown) {
    idem::Router router("host=127.0.0.1 port=1 dbname=none", {{"a.test:5432", "dbname=a"}});
    router.report_stale_placement("alice");
    router.report_stale_placement("alice");
    const idem::RouterCounters counters = router.counters();
    EXPECT_EQ(counters.stale_placements, 2u);
    EXPECT_EQ(counters.nodes_marked_down, 0u);
    EXPECT_EQ(counters.lookups, 0u);
}

// A sink that records what the transport would send; `fail_after` chunks, then "peer gone".
struct RecordingSink final : idem::ChunkSink {
    std::vector<std::string> chunks;
    std::size_t fail_after = SIZE_MAX;
    bool write(std::string_view chunk) override {
        if (chunks.size() >= fail_after) return false;
        chunks.emplace_back(chunk);
        return true;
    }
};

TEST(Stream, CaptureKeepsChunksWithinTheLimitAndNothingPastIt) {
    RecordingSink out;
    idem::detail::CapturingSink capture(out, 10);
    EXPECT_TRUE(capture.write("abcd"));
    EXPECT_TRUE(capture.write(""));  // skipped: chunked transfer would read it as the end
    EXPECT_TRUE(capture.write("efghij"));
    EXPECT_FALSE(capture.over_limit());
    EXPECT_EQ(capture.body(), "abcdefghij");
    EXPECT_EQ(capture.lengths(), "4,6");
    idem::Response head;
    head.headers = {{"Content-Type", "text/plain"}, {"X-Other", "1"}};
    EXPECT_EQ(idem::detail::stream_headers_json(head, {"Content-Type"}, capture),
              R"([["Content-Type","text/plain"],[":chunks","4,6"]])");
    EXPECT_TRUE(capture.write("k"));  // 11 bytes: past the limit, still sent
    EXPECT_TRUE(capture.over_limit());
    EXPECT_EQ(capture.body(), "");
    EXPECT_EQ(idem::detail::stream_headers_json(head, {"Content-Type"}, capture),
              R"([[":not_kept","stream-too-large"]])");
    EXPECT_EQ(out.chunks, (std::vector<std::string>{"abcd", "efghij", "k"}));
    EXPECT_FALSE(capture.peer_gone());
}

TEST(Stream, PeerGoneStopsTheStream) {
    RecordingSink out;
    out.fail_after = 1;
    idem::detail::CapturingSink capture(out, 100);
    EXPECT_TRUE(capture.write("a"));
    EXPECT_FALSE(capture.write("b"));
    EXPECT_FALSE(capture.write("c"));
    EXPECT_TRUE(capture.peer_gone());
    EXPECT_EQ(out.chunks, std::vector<std::string>{"a"});
}

// A row of begin's statement: its text columns by name (absent: NULL).
idem::detail::ColumnReader row_of(std::map<std::string, std::string> columns) {
    return [columns](const char* name) -> std::optional<std::string> {
        auto found = columns.find(name);
        if (found == columns.end()) return std::nullopt;
        return found->second;
    };
}

TEST(Answer, TheExtensionsAnswerIsSentAsItIs) {
    EXPECT_FALSE(idem::detail::answer_of(row_of({{"outcome", "started"}})));
    const auto r = idem::detail::answer_of(
        row_of({{"status", "422"},
                {"headers", R"([["Content-Type", "application/problem+json"],)"
                            R"( ["Idempotency-Expires", "Sun, 06 Nov 1994 08:49:37 GMT"]])"},
                {"body", "\\x7b7d"},
                {"resource_id", "7"}}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 422);
    EXPECT_EQ(r->headers,
              (idem::Headers{{"Content-Type", "application/problem+json"},
                             {"Idempotency-Expires", "Sun, 06 Nov 1994 08:49:37 GMT"}}));
    EXPECT_EQ(r->body, "{}");
    EXPECT_EQ(r->resource_id, std::optional<std::string>("7"));
    EXPECT_FALSE(r->replayed);
    EXPECT_FALSE(r->stream);
}

TEST(Stream, ReplayCutsTheBodyAtTheStoredLengths) {
    const auto r = idem::detail::answer_of(
        row_of({{"status", "200"},
                {"headers", R"([["Content-Type", "text/plain"], [":chunks", "2,0,3"],)"
                            R"( [":other", "x"], ["Idempotent-Replay", "true"]])"},
                {"body", "\\x6161626262"}}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->header(":chunks"), nullptr) << "the reserved entry is never sent";
    EXPECT_EQ(r->header(":other"), nullptr) << "nor any other instruction to the client";
    EXPECT_EQ(*r->header("Content-Type"), "text/plain");
    EXPECT_EQ(*r->header("Idempotent-Replay"), "true");
    EXPECT_TRUE(r->replayed);
    EXPECT_EQ(r->body, "");
    ASSERT_TRUE(r->stream);
    RecordingSink out;
    r->stream(out);
    EXPECT_EQ(out.chunks, (std::vector<std::string>{"aa", "bbb"}));
    EXPECT_THROW(idem::detail::answer_of(row_of(
                     {{"status", "200"}, {"headers", R"([[":chunks", "4"]])"}, {"body", "\\x61"}})),
                 std::invalid_argument);
}

TEST(Stream, BadStoredLengthsThrow) {
    EXPECT_EQ(idem::split_chunks("", ""), std::vector<std::string>{});
    EXPECT_EQ(idem::split_chunks("abc", "1,2"), (std::vector<std::string>{"a", "bc"}));
    EXPECT_THROW(idem::split_chunks("abc", "1,1"), std::invalid_argument);
    EXPECT_THROW(idem::split_chunks("abc", "4"), std::invalid_argument);
    EXPECT_THROW(idem::split_chunks("abc", "1,x"), std::invalid_argument);
    EXPECT_THROW(idem::split_chunks("abc", "-3"), std::invalid_argument);
    EXPECT_THROW(idem::split_chunks("abc", ",3"), std::invalid_argument);
}

}  // namespace

// The answer to a database fault (client/protocol.json `database_fault`) and the
// SQLSTATEs that make one.
TEST(ProtocolTable, DatabaseFaultIsTheTables) {
    nlohmann::json table = protocol_table();
    const nlohmann::json& want = table["database_fault"];
    const nlohmann::json& kind = table["problems"][want["problem"].get<std::string>()];
    const std::string base = table["problem_type_base"];
    const int retry_default = table["default_retry_after_seconds"];
    idem::Response r = idem::database_fault_response(retry_default, base);
    nlohmann::json body = nlohmann::json::parse(r.body);
    EXPECT_EQ(r.status, kind["status"].get<int>());
    EXPECT_EQ(body["type"].get<std::string>(), base + kind["type"].get<std::string>());
    EXPECT_EQ(body["title"], kind["title"]);
    EXPECT_EQ(body["detail"].get<std::string>(), want["detail"].get<std::string>());
    EXPECT_EQ(std::string(idem::database_fault_detail), want["detail"].get<std::string>());
    ASSERT_EQ(r.header("Retry-After") != nullptr, want["retry_after"].get<bool>());
    EXPECT_EQ(*r.header("Retry-After"), std::to_string(retry_default));
    EXPECT_EQ(r.header(table["replay_header"].get<std::string>()) != nullptr,
              want["replayed"].get<bool>());
    std::vector<std::string> classes(idem::fault_sqlstate_classes.begin(),
                                     idem::fault_sqlstate_classes.end());
    std::vector<std::string> states(idem::fault_sqlstates.begin(), idem::fault_sqlstates.end());
    EXPECT_EQ(classes, want["sqlstate_classes"].get<std::vector<std::string>>());
    EXPECT_EQ(states, want["sqlstates"].get<std::vector<std::string>>());
}

TEST(DatabaseFault, ConnectionsSqlstatesAndInDoubtCommitsAreFaults) {
    EXPECT_TRUE(idem::is_database_fault(pqxx::broken_connection("lost")));
    EXPECT_TRUE(idem::is_database_fault(pqxx::in_doubt_error("commit lost")));
    for (const char* state : {"57P01", "57P02", "57P03", "57014", "08006", "08001", "53300"})
        EXPECT_TRUE(idem::is_database_fault(pqxx::sql_error("m", "q", state))) << state;
    for (const char* state : {"23505", "40001", "22P02", "42P01"})
        EXPECT_FALSE(idem::is_database_fault(pqxx::sql_error("m", "q", state))) << state;
    EXPECT_FALSE(idem::is_database_fault(std::runtime_error("the handler failed")));
}
