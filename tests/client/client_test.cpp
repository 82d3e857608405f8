// Integration tests of the client library against a running PostgreSQL with
// the extension (connection from the libpq environment: PGHOST, PGPORT,
// PGDATABASE...). tests/integration/client.sh runs them directly and through
// pgbouncer in transaction pooling mode. Without a database they fail.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "idem/client.hpp"

namespace {

std::string conninfo() {
    const char* dsn = std::getenv("IDEM_TEST_DSN");
    return dsn != nullptr ? dsn : "";
}

// A principal of its own for every test, so tests never see each other's keys.
std::string unique_principal() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return std::string(info->name()) + "-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) +
           "-" + std::to_string(counter++);
}

class ClientTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        pqxx::connection connection(conninfo());
        pqxx::work tx(connection);
        tx.exec("CREATE TABLE IF NOT EXISTS client_effects (id bigserial PRIMARY KEY, principal text, note text)");
        tx.exec(R"(CREATE OR REPLACE FUNCTION client_fail(code text) RETURNS void LANGUAGE plpgsql AS
                   $$ BEGIN RAISE EXCEPTION 'simulated %', code USING ERRCODE = code; END $$)");
        tx.commit();
    }

    void SetUp() override {
        connection_ = std::make_unique<pqxx::connection>(conninfo());
        principal_ = unique_principal();
    }

    idem::Request request(const std::string& key, const std::string& body = R"({"item":"book"})") const {
        idem::Request r;
        r.principal = principal_;
        r.key = key;
        r.method = "POST";
        r.path = "/orders";
        r.body = body;
        return r;
    }

    // A handler that writes one effect and answers `status`.
    idem::Handler writer(int status, std::atomic<int>* calls = nullptr, const std::string& note = "order") const {
        return [this, status, calls, note](pqxx::work& tx) {
            if (calls != nullptr) ++*calls;
            long id = tx.exec_params1("INSERT INTO client_effects (principal, note) VALUES ($1, $2) RETURNING id",
                                      principal_, note)[0]
                          .as<long>();
            idem::Response response;
            response.status = status;
            response.body = nlohmann::json{{"id", id}, {"status", status}}.dump();
            response.headers = {{"Content-Type", "application/json"},
                                {"Location", "/orders/" + std::to_string(id)},
                                {"X-Request-Id", "not-kept"}};
            response.resource_id = std::to_string(id);
            return response;
        };
    }

    long effects() const {
        pqxx::connection connection(conninfo());
        pqxx::nontransaction tx(connection);
        return tx.exec_params1("SELECT count(*) FROM client_effects WHERE principal = $1", principal_)[0].as<long>();
    }

    long key_rows(const std::string& key) const {
        pqxx::connection connection(conninfo());
        pqxx::nontransaction tx(connection);
        return tx.exec_params1("SELECT count(*) FROM idempotency.keys WHERE principal = $1 AND key = $2", principal_,
                               key)[0]
            .as<long>();
    }

    static std::string problem_type(const idem::Response& response) {
        return nlohmann::json::parse(response.body)["type"].get<std::string>();
    }

    std::unique_ptr<pqxx::connection> connection_;
    std::string principal_;
};

TEST_F(ClientTest, FirstRequestRunsOnceAndRetriesReplayByteForByte) {
    idem::Client client(*connection_);
    std::atomic<int> calls{0};
    idem::Response first = client.handle(request("k1"), writer(201, &calls));
    EXPECT_EQ(first.status, 201);
    EXPECT_FALSE(first.replayed);
    EXPECT_EQ(first.header("Idempotent-Replay"), nullptr);

    idem::Request retry = request("k1", "{ \"item\" : \"book\" }");  // same meaning, other bytes
    idem::Response second = client.handle(retry, writer(201, &calls));
    EXPECT_EQ(second.status, 201);
    EXPECT_TRUE(second.replayed);
    ASSERT_NE(second.header("Idempotent-Replay"), nullptr);
    EXPECT_EQ(*second.header("Idempotent-Replay"), "true");
    EXPECT_EQ(second.body, first.body);
    ASSERT_NE(second.header("Location"), nullptr);
    EXPECT_EQ(*second.header("Location"), *first.header("Location"));
    EXPECT_EQ(*second.header("Content-Type"), "application/json");
    EXPECT_EQ(second.header("X-Request-Id"), nullptr) << "headers not in kept_headers are not stored";
    EXPECT_EQ(second.resource_id, first.resource_id);
    EXPECT_EQ(calls.load(), 1);
    EXPECT_EQ(effects(), 1);
    EXPECT_EQ(client.counters().started, 1u);
    EXPECT_EQ(client.counters().replayed, 1u);
}

TEST_F(ClientTest, AnotherRequestUnderTheSameKeyIs422) {
    idem::Client client(*connection_);
    client.handle(request("k1"), writer(201));
    std::atomic<int> calls{0};
    idem::Response response = client.handle(request("k1", R"({"item":"pen"})"), writer(201, &calls));
    EXPECT_EQ(response.status, 422);
    EXPECT_EQ(problem_type(response), "/problems/idempotency-key-reuse");
    EXPECT_EQ(*response.header("Content-Type"), "application/problem+json");
    EXPECT_EQ(calls.load(), 0);
    EXPECT_EQ(effects(), 1);
}

TEST_F(ClientTest, KeyHeldElsewhereIs409WithRetryAfter) {
    idem::Options options;
    options.wait = std::chrono::milliseconds(0);
    idem::Client client(*connection_, options);
    idem::Digest digest = idem::fingerprint(request("k1"));
    pqxx::connection other(conninfo());
    pqxx::work holder(other);
    EXPECT_EQ(holder.exec_params1("SELECT outcome FROM idempotency.begin($1, 'k1', 'POST /orders', $2)", principal_,
                                  pqxx::binarystring(digest.data(), digest.size()))[0]
                  .as<std::string>(),
              "started");
    std::atomic<int> calls{0};
    idem::Response response = client.handle(request("k1"), writer(201, &calls));
    EXPECT_EQ(response.status, 409);
    EXPECT_EQ(problem_type(response), "/problems/request-in-progress");
    ASSERT_NE(response.header("Retry-After"), nullptr);
    EXPECT_GE(std::stoi(*response.header("Retry-After")), 1);
    EXPECT_EQ(calls.load(), 0);
    holder.abort();
    // Once the holder rolled back, the request runs.
    EXPECT_EQ(client.handle(request("k1"), writer(201, &calls)).status, 201);
    EXPECT_EQ(calls.load(), 1);
}

TEST_F(ClientTest, DuplicateWaitsForTheFirstAndReplays) {
    idem::Client client(*connection_);
    idem::Digest digest = idem::fingerprint(request("k1"));
    pqxx::connection other(conninfo());
    std::thread first([&] {
        pqxx::work tx(other);
        tx.exec_params1("SELECT outcome FROM idempotency.begin($1, 'k1', 'POST /orders', $2)", principal_,
                        pqxx::binarystring(digest.data(), digest.size()));
        tx.exec_params("INSERT INTO client_effects (principal, note) VALUES ($1, 'first')", principal_);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        tx.exec_params("SELECT idempotency.complete($1, 'k1', 201, convert_to('from first', 'UTF8'))", principal_);
        tx.commit();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::atomic<int> calls{0};
    idem::Response response;
    try {
        response = client.handle(request("k1"), writer(201, &calls));
    } catch (...) {
        first.join();
        throw;
    }
    first.join();
    EXPECT_EQ(response.status, 201);
    EXPECT_TRUE(response.replayed);
    EXPECT_EQ(response.body, "from first");
    EXPECT_EQ(calls.load(), 0);
    EXPECT_EQ(effects(), 1);
}

TEST_F(ClientTest, OneTimeSecretIsSentOnceAndNeverStored) {
    idem::Client client(*connection_);
    idem::Handler secret = [](pqxx::work&) {
        idem::Response response;
        response.status = 201;
        response.body = R"({"api_key":"sk_live_123"})";
        response.headers = {{"Content-Type", "application/json"}};
        response.one_time_secret = true;
        return response;
    };
    idem::Response first = client.handle(request("k1"), secret);
    EXPECT_EQ(first.status, 201);
    EXPECT_EQ(first.body, R"({"api_key":"sk_live_123"})");
    idem::Response retry = client.handle(request("k1"), secret);
    EXPECT_EQ(retry.status, 409);
    EXPECT_EQ(problem_type(retry), "/problems/one-time-secret");
    EXPECT_EQ(*retry.header("Idempotent-Replay"), "true");
    EXPECT_EQ(retry.body.find("sk_live_123"), std::string::npos);
    pqxx::nontransaction tx(*connection_);
    pqxx::row row = tx.exec_params1(
        "SELECT response_body IS NULL, response_headers IS NULL, one_time_secret FROM idempotency.keys "
        "WHERE principal = $1 AND key = 'k1'",
        principal_);
    EXPECT_TRUE(row[0].as<bool>());
    EXPECT_TRUE(row[1].as<bool>());
    EXPECT_TRUE(row[2].as<bool>());
}

TEST_F(ClientTest, MissingOrMalformedKeyIs400) {
    idem::Client client(*connection_);
    std::atomic<int> calls{0};
    idem::Request missing = request("x");
    missing.key.reset();
    idem::Response response = client.handle(missing, writer(201, &calls));
    EXPECT_EQ(response.status, 400);
    EXPECT_EQ(problem_type(response), "/problems/idempotency-key-missing");
    for (const std::string& bad : {std::string(), std::string(256, 'k'), std::string("tab\tkey"), std::string("caf\xC3\xA9")}) {
        response = client.handle(request(bad), writer(201, &calls));
        EXPECT_EQ(response.status, 400) << bad;
        EXPECT_EQ(problem_type(response), "/problems/idempotency-key-malformed");
    }
    EXPECT_EQ(calls.load(), 0);
    // The server's own key checks (idempotency.max_key_length here) map the same way.
    idem::Options lenient;
    lenient.max_key_length = 1000;
    idem::Client relaxed(*connection_, lenient);
    response = relaxed.handle(request(std::string(300, 'k')), writer(201, &calls));
    EXPECT_EQ(response.status, 400);
    EXPECT_EQ(problem_type(response), "/problems/idempotency-key-malformed");
    EXPECT_EQ(calls.load(), 0);
    // A GET needs no key: the handler just runs.
    idem::Request get = request("x");
    get.method = "GET";
    get.key.reset();
    EXPECT_EQ(client.handle(get, writer(200, &calls)).status, 200);
    EXPECT_EQ(calls.load(), 1);
}

TEST_F(ClientTest, UnauthorizedThenSuccessHasOneEffect) {
    idem::Client client(*connection_);
    std::atomic<int> calls{0};
    idem::Response first = client.handle(request("k1"), writer(401, &calls, "unauthorized"));
    EXPECT_EQ(first.status, 401);
    EXPECT_EQ(effects(), 0) << "a 401 is rolled back";
    EXPECT_EQ(key_rows("k1"), 0) << "and not stored";
    idem::Response second = client.handle(request("k1"), writer(201, &calls));
    EXPECT_EQ(second.status, 201);
    EXPECT_FALSE(second.replayed);
    EXPECT_EQ(effects(), 1);
    EXPECT_EQ(calls.load(), 2);
}

TEST_F(ClientTest, ServerErrorsAndThrottlingAreNotStored) {
    idem::Client client(*connection_);
    for (int status : {500, 503, 429, 302}) {
        std::atomic<int> calls{0};
        const std::string key = "k-" + std::to_string(status);
        EXPECT_EQ(client.handle(request(key), writer(status, &calls)).status, status);
        EXPECT_EQ(key_rows(key), 0) << status;
        EXPECT_EQ(client.handle(request(key), writer(status, &calls)).status, status);
        EXPECT_EQ(calls.load(), 2) << "the retry runs again after " << status;
    }
    EXPECT_EQ(effects(), 0);
    EXPECT_EQ(client.counters().not_stored, 8u);
}

TEST_F(ClientTest, BusinessConflictIsStoredAndReplayedWithoutItsEffect) {
    idem::Client client(*connection_);
    std::atomic<int> calls{0};
    idem::Response first = client.handle(request("k1"), writer(409, &calls, "conflict"));
    EXPECT_EQ(first.status, 409);
    EXPECT_EQ(effects(), 0) << "the 409's writes were rolled back";
    EXPECT_EQ(key_rows("k1"), 1) << "but the response was stored";
    idem::Response retry = client.handle(request("k1"), writer(201, &calls));
    EXPECT_EQ(retry.status, 409);
    EXPECT_TRUE(retry.replayed);
    EXPECT_EQ(retry.body, first.body);
    EXPECT_EQ(calls.load(), 1);
    EXPECT_EQ(client.counters().stored_errors, 1u);
}

TEST_F(ClientTest, HandlerThatThrowsLeavesNoRowAndNoEffect) {
    idem::Client client(*connection_);
    idem::Handler failing = [this](pqxx::work& tx) -> idem::Response {
        tx.exec_params("INSERT INTO client_effects (principal, note) VALUES ($1, 'doomed')", principal_);
        throw std::runtime_error("handler failed");
    };
    EXPECT_THROW(client.handle(request("k1"), failing), std::runtime_error);
    EXPECT_EQ(effects(), 0);
    EXPECT_EQ(key_rows("k1"), 0);
    std::atomic<int> calls{0};
    EXPECT_EQ(client.handle(request("k1"), writer(201, &calls)).status, 201);
    EXPECT_EQ(calls.load(), 1);
    EXPECT_EQ(effects(), 1);
}

TEST_F(ClientTest, SerializationFailuresAndDeadlocksAreRetriedWithAFreshResponse) {
    for (const std::string& code : {std::string("40001"), std::string("40P01")}) {
        idem::Client client(*connection_);
        std::atomic<int> calls{0};
        const std::string key = "k-" + code;
        idem::Handler flaky = [&, code](pqxx::work& tx) {
            tx.exec_params("INSERT INTO client_effects (principal, note) VALUES ($1, 'attempt')", principal_);
            if (++calls == 1) tx.exec_params("SELECT client_fail($1)", code);
            idem::Response response;
            response.status = 201;
            response.body = "attempt " + std::to_string(calls.load());
            return response;
        };
        idem::Response response = client.handle(request(key), flaky);
        EXPECT_EQ(response.status, 201);
        EXPECT_EQ(response.body, "attempt 2");
        EXPECT_EQ(calls.load(), 2);
        EXPECT_EQ(client.counters().retries, 1u);
    }
    EXPECT_EQ(effects(), 2) << "one effect per key: the failed attempts were rolled back";
}

TEST_F(ClientTest, GivesUpAfterMaxAttempts) {
    idem::Options options;
    options.max_attempts = 3;
    idem::Client client(*connection_, options);
    std::atomic<int> calls{0};
    idem::Handler always = [&](pqxx::work& tx) -> idem::Response {
        ++calls;
        tx.exec("SELECT client_fail('40001')");
        return {};
    };
    EXPECT_THROW(client.handle(request("k1"), always), pqxx::serialization_failure);
    EXPECT_EQ(calls.load(), 3);
    EXPECT_EQ(key_rows("k1"), 0);
}

TEST_F(ClientTest, SixtyFourThreadsWithOneKeyHaveOneEffect) {
    constexpr int kThreads = 64;
    std::atomic<int> calls{0}, fresh{0}, replayed{0}, busy{0}, other{0};
    std::vector<std::thread> threads;
    std::mutex error_mutex;
    std::string first_error;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&] {
            try {
                pqxx::connection connection(conninfo());
                idem::Options options;
                options.wait = std::chrono::milliseconds(20000);
                idem::Client client(connection, options);
                idem::Handler slow = [&](pqxx::work& tx) {
                    ++calls;
                    tx.exec_params("INSERT INTO client_effects (principal, note) VALUES ($1, 'once')", principal_);
                    tx.exec("SELECT pg_sleep(0.2)");
                    idem::Response response;
                    response.status = 201;
                    response.body = "the one";
                    return response;
                };
                idem::Response response = client.handle(request("shared"), slow);
                if (response.status == 201 && !response.replayed) ++fresh;
                else if (response.status == 201 && response.replayed && response.body == "the one") ++replayed;
                else if (response.status == 409) ++busy;
                else ++other;
            } catch (const std::exception& e) {
                std::lock_guard<std::mutex> lock(error_mutex);
                if (first_error.empty()) first_error = e.what();
                ++other;
            }
        });
    }
    for (auto& thread : threads) thread.join();
    EXPECT_EQ(first_error, "");
    EXPECT_EQ(calls.load(), 1);
    EXPECT_EQ(fresh.load(), 1);
    EXPECT_EQ(fresh + replayed + busy, kThreads);
    EXPECT_EQ(other.load(), 0);
    EXPECT_EQ(effects(), 1);
}

TEST_F(ClientTest, ClientDigestEqualsServerFingerprint) {
    pqxx::nontransaction tx(*connection_);
    for (const std::string& body : {std::string(R"({"b":1,"a":[1.0,2e3,"\u00e9"]})"), std::string("a=1&b=2"), std::string(),
                                   std::string("{\"dup\":1,\"dup\":2}")}) {
        idem::Request r = request("k", body);
        r.exclude = {"/a/1"};
        idem::Digest digest = idem::fingerprint(r);
        pqxx::binarystring server(tx.exec_params1(
            "SELECT idempotency.fingerprint('POST', '/orders', $1, ARRAY['/a/1'])",
            pqxx::binarystring(body.data(), body.size()))[0]);
        ASSERT_EQ(server.size(), digest.size());
        EXPECT_EQ(std::memcmp(server.data(), digest.data(), digest.size()), 0) << body;
    }
}

}  // namespace
