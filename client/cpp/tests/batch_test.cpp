// Integration tests of the batch wrappers (begin_batch, complete_batch,
// claim_batch), push_unique and the array literal they send, against a
// server with the extension. Connection from the libpq environment, as
// client_test.cpp (directly and through pgbouncer in transaction pooling).
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "idem/batch.hpp"
#include "pqxx_compat.hpp"

namespace {

std::string conninfo() {
    const char* dsn = std::getenv("IDEM_TEST_DSN");
    return dsn != nullptr ? dsn : "";
}

std::string principal() {
    return "batch-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

idem::Digest digest_of(const std::string& body) {
    idem::Request r;
    r.method = "POST";
    r.path = "/batch";
    r.body = body;
    return idem::fingerprint(r);
}

std::vector<std::string> outcomes(const std::vector<idem::BatchOutcome>& rows) {
    std::vector<std::string> names;
    for (const auto& row : rows) names.push_back(row.outcome);
    return names;
}

std::vector<bool> values(const std::vector<idem::BatchFlag>& rows) {
    std::vector<bool> flags;
    for (const auto& row : rows) flags.push_back(row.value);
    return flags;
}

// Hostile array elements: quotes, backslashes, commas, braces, blanks, the
// word NULL, bytes above 0x7f. Each must come back from the server unchanged.
TEST(BatchArrays, LiteralRoundTripsThroughTheServer) {
    const std::vector<std::optional<std::string>> elements{
        "plain", "with \"quotes\"",   "back\\slash", "a,b", "{braces}", " blank ", "NULL",
        "",      "\xc3\xa9t\xc3\xa9", std::nullopt};
    pqxx::connection connection(conninfo());
    pqxx::nontransaction tx(connection);
    const pqxx::result rows =
        idem::pq::exec(tx,
                       "SELECT e, e IS NULL FROM unnest($1::text[]) WITH ORDINALITY AS u(e, i) "
                       "ORDER BY i",
                       idem::array_literal(elements));
    ASSERT_EQ(rows.size(), static_cast<int>(elements.size()));
    for (std::size_t i = 0; i < elements.size(); ++i) {
        const auto& row = rows[static_cast<int>(i)];
        if (!elements[i]) {
            EXPECT_TRUE(row[1].as<bool>()) << i;
        } else {
            EXPECT_FALSE(row[1].as<bool>()) << i;
            EXPECT_EQ(row[0].as<std::string>(), *elements[i]) << i;
        }
    }
    EXPECT_EQ(idem::array_literal({}), "{}");
}

// Every outcome in one batch, in input order; complete_batch stores what
// each key's response says; the next batch replays them.
TEST(Batch, BeginCompleteReplay) {
    const std::string who = principal();
    pqxx::connection connection(conninfo());
    {
        pqxx::work tx(connection);
        idem::pq::exec(tx, "SELECT * FROM idempotency.begin($1, 'done', 'consume', $2)", who,
                       idem::pq::bytes(std::string(32, '\x01')));
        idem::pq::exec(tx, "SELECT idempotency.complete($1, 'done', 200)", who);
        tx.commit();
    }
    const std::vector<std::string> keys{"m-3", "m-1", "done", "m-2"};
    const std::vector<idem::Digest> digests{digest_of("3"), digest_of("1"), digest_of("x"),
                                            digest_of("2")};
    {
        pqxx::work tx(connection);
        const auto rows = idem::begin_batch(tx, who, keys, "consume", digests,
                                            std::chrono::hours(2), std::chrono::milliseconds(0));
        ASSERT_EQ(rows.size(), 4u);
        EXPECT_EQ(outcomes(rows),
                  (std::vector<std::string>{"started", "started", "mismatch", "started"}));
        for (std::size_t i = 0; i < rows.size(); ++i) {
            EXPECT_EQ(rows[i].ord, static_cast<int>(i) + 1);
            EXPECT_EQ(rows[i].key, keys[i]);
            EXPECT_TRUE(rows[i].fence.has_value());
            ASSERT_TRUE(rows[i].expires_at && rows[i].created_at);
        }
        EXPECT_EQ(*rows[0].expires_at - *rows[0].created_at, std::chrono::hours(2));
        // The extension's answer of each key that does not start, as Client::handle's.
        EXPECT_FALSE(rows[0].answer.has_value());
        ASSERT_TRUE(rows[2].answer.has_value());
        EXPECT_EQ(rows[2].answer->status, 422);
        EXPECT_NE(rows[2].answer->body.find("/problems/idempotency-key-reuse"), std::string::npos);
        EXPECT_NE(rows[2].answer->header("Idempotency-Expires"), nullptr);
        EXPECT_FALSE(rows[2].answer->replayed);
        idem::BatchResponse created{201, std::string("m\0three", 7), R"({"Location": "/m/3"})",
                                    "3"};
        const auto done = idem::complete_batch(tx, who, {"m-3", "m-1", "m-2"},
                                               {created, {200, {}, {}, {}}, {422, "bad", {}, {}}});
        EXPECT_EQ(values(done), (std::vector<bool>{true, true, true}));
        EXPECT_EQ(done[2].key, "m-2");
        tx.commit();
    }
    pqxx::work tx(connection);
    const auto rows = idem::begin_batch(tx, who, {"m-1", "m-2", "m-3"}, "consume",
                                        {digest_of("1"), digest_of("2"), digest_of("3")});
    EXPECT_EQ(outcomes(rows), (std::vector<std::string>{"replay", "replay", "replay"}));
    EXPECT_EQ(rows[0].response_status, 200);
    EXPECT_FALSE(rows[0].response_body.has_value());
    EXPECT_EQ(rows[1].response_status, 422);
    EXPECT_EQ(rows[1].response_body, std::string("bad"));
    EXPECT_EQ(rows[2].response_body, std::string("m\0three", 7));
    EXPECT_EQ(rows[2].response_headers, std::string(R"({"Location": "/m/3"})"));
    EXPECT_EQ(rows[2].resource_id, std::string("3"));
    ASSERT_TRUE(rows[2].answer.has_value());
    EXPECT_EQ(rows[2].answer->status, 201);
    EXPECT_EQ(rows[2].answer->body, std::string("m\0three", 7));
    EXPECT_EQ(*rows[2].answer->header("Location"), "/m/3");
    EXPECT_EQ(*rows[2].answer->header("Idempotent-Replay"), "true");
    EXPECT_TRUE(rows[2].answer->replayed);
    const auto typed = idem::begin_batch(tx, who, {"m-1"}, "consume", {digest_of("other")},
                                         std::nullopt, std::nullopt, "/errors/");
    ASSERT_TRUE(typed[0].answer.has_value());
    EXPECT_NE(typed[0].answer->body.find("\"type\":\"/errors/idempotency-key-reuse\""),
              std::string::npos);
}

// The server's refusals come back as pqxx::sql_error with the SQLSTATE;
// mismatched sizes are refused before a statement is sent.
TEST(Batch, Refusals) {
    const std::string who = principal();
    pqxx::connection connection(conninfo());
    EXPECT_THROW(
        {
            pqxx::work tx(connection);
            idem::begin_batch(tx, who, {"a", "b"}, "consume", {digest_of("a")});
        },
        std::invalid_argument);
    auto sqlstate = [&](auto&& call) -> std::string {
        pqxx::work tx(connection);
        try {
            call(tx);
        } catch (const pqxx::sql_error& e) {
            return std::string(e.sqlstate());
        }
        return "none";
    };
    EXPECT_EQ(
        sqlstate([&](pqxx::work& tx) {
            idem::begin_batch(tx, who, {"a", "a"}, "consume", {digest_of("a"), digest_of("a")});
        }),
        "22023");
    std::vector<std::string> many;
    for (int i = 0; i < 1001; ++i) many.push_back("k" + std::to_string(i));
    EXPECT_EQ(sqlstate([&](pqxx::work& tx) { idem::claim_batch(tx, who, many); }), "54000");
    EXPECT_EQ(sqlstate([&](pqxx::work& tx) {
                  idem::complete_batch(tx, who, {"never-begun"}, {idem::BatchResponse{}});
              }),
              "55000");
    pqxx::work tx(connection);
    EXPECT_TRUE(idem::begin_batch(tx, who, {}, "consume", {}).empty());
    EXPECT_TRUE(idem::claim_batch(tx, who, {}).empty());
}

// claim_batch claims each key once; push_unique runs the enqueue only for a
// key it claimed, in the caller's transaction: a rollback takes both back.
TEST(Batch, ClaimBatchAndPushUnique) {
    const std::string who = principal();
    pqxx::connection connection(conninfo());
    {
        pqxx::work tx(connection);
        tx.exec("CREATE TABLE IF NOT EXISTS batch_jobs (principal text, key text, note text)");
        tx.commit();
    }
    {
        pqxx::work tx(connection);
        EXPECT_EQ(values(idem::claim_batch(tx, who, {"j-2", "j-1"}, std::chrono::hours(1))),
                  (std::vector<bool>{true, true}));
        EXPECT_EQ(values(idem::claim_batch(tx, who, {"j-1", "j-3"})),
                  (std::vector<bool>{false, true}));
        tx.commit();
    }
    auto enqueue = [&](const std::string& key, int* runs) {
        return [&who, key, runs](pqxx::transaction_base& tx) {
            ++*runs;
            idem::pq::exec(tx, "INSERT INTO batch_jobs VALUES ($1, $2, 'job')", who, key);
        };
    };
    int runs = 0;
    {
        pqxx::work tx(connection);
        EXPECT_TRUE(
            idem::push_unique(tx, who, "p-1", std::chrono::hours(1), enqueue("p-1", &runs)));
        tx.abort();  // neither the claim nor the job row stays
    }
    {
        pqxx::work tx(connection);
        EXPECT_TRUE(idem::push_unique(tx, who, "p-1", std::nullopt, enqueue("p-1", &runs)));
        EXPECT_FALSE(idem::push_unique(tx, who, "j-3", std::nullopt, enqueue("j-3", &runs)));
        tx.commit();
    }
    {
        pqxx::work tx(connection);
        EXPECT_FALSE(idem::push_unique(tx, who, "p-1", std::nullopt, enqueue("p-1", &runs)));
        EXPECT_EQ(runs, 2);
        EXPECT_EQ(
            idem::pq::exec1(tx, "SELECT count(*) FROM batch_jobs WHERE principal = $1", who)[0]
                .as<int>(),
            1);
    }
}

}  // namespace
