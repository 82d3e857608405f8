// Integration tests of the client library against a running PostgreSQL with
// the extension (connection from the libpq environment: PGHOST, PGPORT,
// PGDATABASE...). tests/integration/client.sh runs them directly and through
// pgbouncer in transaction pooling mode. Without a database they fail.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <libpq-fe.h>

#include "idem/client.hpp"
#include "pqxx_compat.hpp"

namespace {

std::string conninfo() {
    const char* dsn = std::getenv("IDEM_TEST_DSN");
    return dsn != nullptr ? dsn : "";
}

// A principal of its own for every test, so tests never see each other's keys.
std::string unique_principal() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return std::string(info->name()) + "-" +
           std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "-" +
           std::to_string(counter++);
}

// A digest as a bytea parameter.
auto digest_bytes(const idem::Digest& digest) {
    return idem::pq::bytes(
        std::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

// The tables and functions the tests write to (idempotent: every suite calls it).
void create_tables() {
    pqxx::connection connection(conninfo());
    pqxx::work tx(connection);
    tx.exec(
        "CREATE TABLE IF NOT EXISTS client_effects (id bigserial PRIMARY KEY, principal text, note "
        "text)");
    tx.exec(R"(CREATE OR REPLACE FUNCTION client_fail(code text) RETURNS void LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'simulated %', code USING ERRCODE = code; END $$)");
    // Rows checked only at COMMIT: a deferred unique constraint, and a deferred
    // trigger that fails the commit with the SQLSTATE in `fail_with`.
    tx.exec(R"(CREATE TABLE IF NOT EXISTS client_deferred (
                 principal text, slot int, fail_with text,
                 UNIQUE (principal, slot) DEFERRABLE INITIALLY DEFERRED))");
    tx.exec(
        R"(CREATE OR REPLACE FUNCTION client_deferred_check() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN IF NEW.fail_with IS NOT NULL THEN PERFORM client_fail(NEW.fail_with); END IF;
                  RETURN NULL; END $$)");
    tx.exec("DROP TRIGGER IF EXISTS client_deferred_check ON client_deferred");
    tx.exec(R"(CREATE CONSTRAINT TRIGGER client_deferred_check AFTER INSERT ON client_deferred
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION client_deferred_check())");
    tx.commit();
}

// Every test runs with handlers on pqxx::work& over a pqxx::connection (the
// classic path: BEGIN, begin(), handler, complete(), COMMIT as five round
// trips), and with handlers on pqxx::transaction_base& over an idem::Connection
// (BEGIN + begin() and complete() + COMMIT pipelined); and each of these with
// Options::prepare_statements, except through pgbouncer in transaction mode
// (IDEM_TEST_PGBOUNCER set), which cannot route named prepared statements.
enum class Mode { work, pipelined, work_prepared, pipelined_prepared };

bool is_pipelined(Mode mode) { return mode == Mode::pipelined || mode == Mode::pipelined_prepared; }
bool is_prepared(Mode mode) {
    return mode == Mode::work_prepared || mode == Mode::pipelined_prepared;
}

std::string mode_name(const ::testing::TestParamInfo<Mode>& info) {
    return std::string(is_pipelined(info.param) ? "Pipelined" : "Work") +
           (is_prepared(info.param) ? "Prepared" : "");
}

std::vector<Mode> modes() {
    if (std::getenv("IDEM_TEST_PGBOUNCER") != nullptr) return {Mode::work, Mode::pipelined};
    return {Mode::work, Mode::pipelined, Mode::work_prepared, Mode::pipelined_prepared};
}

class ClientTest : public ::testing::TestWithParam<Mode> {
protected:
    static void SetUpTestSuite() { create_tables(); }

    void SetUp() override {
        if (is_pipelined(GetParam()))
            pipelined_ = std::make_unique<idem::Connection>(conninfo());
        else
            plain_ = std::make_unique<pqxx::connection>(conninfo());
        principal_ = unique_principal();
    }

    idem::PqxxConnection& db() const {
        if (pipelined_) return *pipelined_;
        return *plain_;
    }

    idem::Client make_client(idem::Options options = {}) const {
        options.prepare_statements = is_prepared(GetParam());
        if (pipelined_) return idem::Client(*pipelined_, std::move(options));
        return idem::Client(*plain_, std::move(options));
    }

    // Runs `handler` through the entry point of this test's mode.
    idem::Response run(idem::Client& client, const idem::Request& r,
                       const idem::TransactionHandler& handler) const {
        if (is_pipelined(GetParam())) return client.handle(r, handler);
        return client.handle(r, idem::Handler([&handler](pqxx::work& tx) { return handler(tx); }));
    }

    idem::Request request(const std::string& key,
                          const std::string& body = R"({"item":"book"})") const {
        idem::Request r;
        r.principal = principal_;
        r.key = key;
        r.method = "POST";
        r.path = "/orders";
        r.body = body;
        return r;
    }

    // A handler that writes one effect and answers `status`.
    idem::TransactionHandler writer(int status, std::atomic<int>* calls = nullptr,
                                    const std::string& note = "order") const {
        return [this, status, calls, note](pqxx::transaction_base& tx) {
            if (calls != nullptr) ++*calls;
            long id =
                idem::pq::exec1(
                    tx, "INSERT INTO client_effects (principal, note) VALUES ($1, $2) RETURNING id",
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
        return idem::pq::exec1(tx, "SELECT count(*) FROM client_effects WHERE principal = $1",
                               principal_)[0]
            .as<long>();
    }

    long key_rows(const std::string& key) const {
        pqxx::connection connection(conninfo());
        pqxx::nontransaction tx(connection);
        return idem::pq::exec1(
                   tx, "SELECT count(*) FROM idempotency.keys WHERE principal = $1 AND key = $2",
                   principal_, key)[0]
            .as<long>();
    }

    static std::string problem_type(const idem::Response& response) {
        return nlohmann::json::parse(response.body)["type"].get<std::string>();
    }

    std::unique_ptr<pqxx::connection> plain_;
    std::unique_ptr<idem::Connection> pipelined_;
    std::string principal_;
};

TEST_P(ClientTest, FirstRequestRunsOnceAndRetriesReplayByteForByte) {
    idem::Client client = make_client();
    std::atomic<int> calls{0};
    idem::Response first = run(client, request("k1"), writer(201, &calls));
    EXPECT_EQ(first.status, 201);
    EXPECT_FALSE(first.replayed);
    EXPECT_EQ(first.header("Idempotent-Replay"), nullptr);

    idem::Request retry = request("k1", "{ \"item\" : \"book\" }");  // same meaning, other bytes
    idem::Response second = run(client, retry, writer(201, &calls));
    EXPECT_EQ(second.status, 201);
    EXPECT_TRUE(second.replayed);
    ASSERT_NE(second.header("Idempotent-Replay"), nullptr);
    EXPECT_EQ(*second.header("Idempotent-Replay"), "true");
    EXPECT_EQ(second.body, first.body);
    ASSERT_NE(second.header("Location"), nullptr);
    EXPECT_EQ(*second.header("Location"), *first.header("Location"));
    EXPECT_EQ(*second.header("Content-Type"), "application/json");
    EXPECT_EQ(second.header("X-Request-Id"), nullptr)
        << "headers not in kept_headers are not stored";
    EXPECT_EQ(second.resource_id, first.resource_id);
    EXPECT_EQ(calls.load(), 1);
    EXPECT_EQ(effects(), 1);
    EXPECT_EQ(client.counters().started, 1u);
    EXPECT_EQ(client.counters().replayed, 1u);
}

TEST_P(ClientTest, RepeatedHeadersReplayInTheirOrder) {
    idem::Options options;
    options.kept_headers = {"Set-Cookie", "Link"};
    idem::Client client = make_client(options);
    std::atomic<int> calls{0};
    idem::TransactionHandler handler = [&](pqxx::transaction_base&) {
        ++calls;
        idem::Response response;
        response.status = 201;
        response.body = "ok";
        response.headers = {{"Set-Cookie", "a=1; Path=/"},
                            {"Link", "</x>; rel=next"},
                            {"Set-Cookie", "b=2"},
                            {"X-Not-Kept", "1"}};
        return response;
    };
    run(client, request("k1"), handler);
    idem::Response replay = run(client, request("k1"), handler);
    EXPECT_TRUE(replay.replayed);
    std::vector<std::pair<std::string, std::string>> kept;
    for (const auto& header : replay.headers)
        // The replay marker and the key's expiry (expiry_test.cpp) are added, not stored.
        if (header.first != "Idempotent-Replay" && header.first != idem::expires_header)
            kept.push_back(header);
    const std::vector<std::pair<std::string, std::string>> expected{
        {"Set-Cookie", "a=1; Path=/"}, {"Link", "</x>; rel=next"}, {"Set-Cookie", "b=2"}};
    EXPECT_EQ(kept, expected) << "order and repeated names survive (the array form of 0.6.0)";
    EXPECT_EQ(calls.load(), 1);
}

TEST_P(ClientTest, AnotherRequestUnderTheSameKeyIs422) {
    idem::Client client = make_client();
    run(client, request("k1"), writer(201));
    std::atomic<int> calls{0};
    idem::Response response = run(client, request("k1", R"({"item":"pen"})"), writer(201, &calls));
    EXPECT_EQ(response.status, 422);
    EXPECT_EQ(problem_type(response), "/problems/idempotency-key-reuse");
    EXPECT_EQ(*response.header("Content-Type"), "application/problem+json");
    EXPECT_EQ(calls.load(), 0);
    EXPECT_EQ(effects(), 1);
}

TEST_P(ClientTest, KeyHeldElsewhereIs409WithRetryAfter) {
    idem::Options options;
    options.wait = std::chrono::milliseconds(0);
    idem::Client client = make_client(options);
    idem::Digest digest = idem::fingerprint(request("k1"));
    pqxx::connection other(conninfo());
    pqxx::work holder(other);
    EXPECT_EQ(idem::pq::exec1(holder,
                              "SELECT outcome FROM idempotency.begin($1, 'k1', 'POST /orders', $2)",
                              principal_, digest_bytes(digest))[0]
                  .as<std::string>(),
              "started");
    std::atomic<int> calls{0};
    idem::Response response = run(client, request("k1"), writer(201, &calls));
    EXPECT_EQ(response.status, 409);
    EXPECT_EQ(problem_type(response), "/problems/request-in-progress");
    ASSERT_NE(response.header("Retry-After"), nullptr);
    EXPECT_GE(std::stoi(*response.header("Retry-After")), 1);
    EXPECT_EQ(calls.load(), 0);
    holder.abort();
    // Once the holder rolled back, the request runs.
    EXPECT_EQ(run(client, request("k1"), writer(201, &calls)).status, 201);
    EXPECT_EQ(calls.load(), 1);
}

TEST_P(ClientTest, DuplicateWaitsForTheFirstAndReplays) {
    idem::Client client = make_client();
    idem::Digest digest = idem::fingerprint(request("k1"));
    pqxx::connection other(conninfo());
    std::thread first([&] {
        pqxx::work tx(other);
        idem::pq::exec1(tx, "SELECT outcome FROM idempotency.begin($1, 'k1', 'POST /orders', $2)",
                        principal_, digest_bytes(digest));
        idem::pq::exec(tx, "INSERT INTO client_effects (principal, note) VALUES ($1, 'first')",
                       principal_);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        idem::pq::exec(
            tx, "SELECT idempotency.complete($1, 'k1', 201, convert_to('from first', 'UTF8'))",
            principal_);
        tx.commit();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::atomic<int> calls{0};
    idem::Response response;
    try {
        response = run(client, request("k1"), writer(201, &calls));
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

TEST_P(ClientTest, OneTimeSecretIsSentOnceAndNeverStored) {
    idem::Client client = make_client();
    idem::TransactionHandler secret = [](pqxx::transaction_base&) {
        idem::Response response;
        response.status = 201;
        response.body = R"({"api_key":"sk_live_123"})";
        response.headers = {{"Content-Type", "application/json"}};
        response.one_time_secret = true;
        return response;
    };
    idem::Response first = run(client, request("k1"), secret);
    EXPECT_EQ(first.status, 201);
    EXPECT_EQ(first.body, R"({"api_key":"sk_live_123"})");
    idem::Response retry = run(client, request("k1"), secret);
    EXPECT_EQ(retry.status, 409);
    EXPECT_EQ(problem_type(retry), "/problems/one-time-secret");
    EXPECT_EQ(*retry.header("Idempotent-Replay"), "true");
    EXPECT_EQ(retry.body.find("sk_live_123"), std::string::npos);
    pqxx::nontransaction tx(db());
    pqxx::row row = idem::pq::exec1(tx,
                                    "SELECT response_body IS NULL, response_headers IS NULL, "
                                    "one_time_secret FROM idempotency.keys "
                                    "WHERE principal = $1 AND key = 'k1'",
                                    principal_);
    EXPECT_TRUE(row[0].as<bool>());
    EXPECT_TRUE(row[1].as<bool>());
    EXPECT_TRUE(row[2].as<bool>());
}

TEST_P(ClientTest, MissingOrMalformedKeyIs400) {
    idem::Client client = make_client();
    std::atomic<int> calls{0};
    idem::Request missing = request("x");
    missing.key.reset();
    idem::Response response = run(client, missing, writer(201, &calls));
    EXPECT_EQ(response.status, 400);
    EXPECT_EQ(problem_type(response), "/problems/idempotency-key-missing");
    for (const std::string& bad : {std::string(), std::string(256, 'k'), std::string("tab\tkey"),
                                   std::string("caf\xC3\xA9")}) {
        response = run(client, request(bad), writer(201, &calls));
        EXPECT_EQ(response.status, 400) << bad;
        EXPECT_EQ(problem_type(response), "/problems/idempotency-key-malformed");
    }
    EXPECT_EQ(calls.load(), 0);
    // The server's own key checks (idempotency.max_key_length here) map the same way.
    idem::Options lenient;
    lenient.max_key_length = 1000;
    idem::Client relaxed = make_client(lenient);
    response = run(relaxed, request(std::string(300, 'k')), writer(201, &calls));
    EXPECT_EQ(response.status, 400);
    EXPECT_EQ(problem_type(response), "/problems/idempotency-key-malformed");
    EXPECT_EQ(calls.load(), 0);
    // A GET needs no key: the handler just runs.
    idem::Request get = request("x");
    get.method = "GET";
    get.key.reset();
    EXPECT_EQ(run(client, get, writer(200, &calls)).status, 200);
    EXPECT_EQ(calls.load(), 1);
}

TEST_P(ClientTest, UnauthorizedThenSuccessHasOneEffect) {
    idem::Client client = make_client();
    std::atomic<int> calls{0};
    idem::Response first = run(client, request("k1"), writer(401, &calls, "unauthorized"));
    EXPECT_EQ(first.status, 401);
    EXPECT_EQ(effects(), 0) << "a 401 is rolled back";
    EXPECT_EQ(key_rows("k1"), 0) << "and not stored";
    idem::Response second = run(client, request("k1"), writer(201, &calls));
    EXPECT_EQ(second.status, 201);
    EXPECT_FALSE(second.replayed);
    EXPECT_EQ(effects(), 1);
    EXPECT_EQ(calls.load(), 2);
}

TEST_P(ClientTest, ServerErrorsAndThrottlingAreNotStored) {
    idem::Client client = make_client();
    for (int status : {500, 503, 429, 302}) {
        std::atomic<int> calls{0};
        const std::string key = "k-" + std::to_string(status);
        EXPECT_EQ(run(client, request(key), writer(status, &calls)).status, status);
        EXPECT_EQ(key_rows(key), 0) << status;
        EXPECT_EQ(run(client, request(key), writer(status, &calls)).status, status);
        EXPECT_EQ(calls.load(), 2) << "the retry runs again after " << status;
    }
    EXPECT_EQ(effects(), 0);
    EXPECT_EQ(client.counters().not_stored, 8u);
}

TEST_P(ClientTest, BusinessConflictIsStoredAndReplayedWithoutItsEffect) {
    idem::Client client = make_client();
    std::atomic<int> calls{0};
    idem::Response first = run(client, request("k1"), writer(409, &calls, "conflict"));
    EXPECT_EQ(first.status, 409);
    EXPECT_EQ(effects(), 0) << "the 409's writes were rolled back";
    EXPECT_EQ(key_rows("k1"), 1) << "but the response was stored";
    idem::Response retry = run(client, request("k1"), writer(201, &calls));
    EXPECT_EQ(retry.status, 409);
    EXPECT_TRUE(retry.replayed);
    EXPECT_EQ(retry.body, first.body);
    EXPECT_EQ(calls.load(), 1);
    EXPECT_EQ(client.counters().stored_errors, 1u);
}

TEST_P(ClientTest, HandlerThatThrowsLeavesNoRowAndNoEffect) {
    idem::Client client = make_client();
    idem::TransactionHandler failing = [this](pqxx::transaction_base& tx) -> idem::Response {
        idem::pq::exec(tx, "INSERT INTO client_effects (principal, note) VALUES ($1, 'doomed')",
                       principal_);
        throw std::runtime_error("handler failed");
    };
    EXPECT_THROW(run(client, request("k1"), failing), std::runtime_error);
    EXPECT_EQ(effects(), 0);
    EXPECT_EQ(key_rows("k1"), 0);
    std::atomic<int> calls{0};
    EXPECT_EQ(run(client, request("k1"), writer(201, &calls)).status, 201);
    EXPECT_EQ(calls.load(), 1);
    EXPECT_EQ(effects(), 1);
}

TEST_P(ClientTest, SerializationFailuresAndDeadlocksAreRetriedWithAFreshResponse) {
    for (const std::string& code : {std::string("40001"), std::string("40P01")}) {
        idem::Client client = make_client();
        std::atomic<int> calls{0};
        const std::string key = "k-" + code;
        idem::TransactionHandler flaky = [&, code](pqxx::transaction_base& tx) {
            idem::pq::exec(tx,
                           "INSERT INTO client_effects (principal, note) VALUES ($1, 'attempt')",
                           principal_);
            if (++calls == 1) idem::pq::exec(tx, "SELECT client_fail($1)", code);
            idem::Response response;
            response.status = 201;
            response.body = "attempt " + std::to_string(calls.load());
            return response;
        };
        idem::Response response = run(client, request(key), flaky);
        EXPECT_EQ(response.status, 201);
        EXPECT_EQ(response.body, "attempt 2");
        EXPECT_EQ(calls.load(), 2);
        EXPECT_EQ(client.counters().retries, 1u);
    }
    EXPECT_EQ(effects(), 2) << "one effect per key: the failed attempts were rolled back";
}

TEST_P(ClientTest, GivesUpAfterMaxAttempts) {
    idem::Options options;
    options.max_attempts = 3;
    idem::Client client = make_client(options);
    std::atomic<int> calls{0};
    idem::TransactionHandler always = [&](pqxx::transaction_base& tx) -> idem::Response {
        ++calls;
        tx.exec("SELECT client_fail('40001')");
        return {};
    };
    EXPECT_THROW(run(client, request("k1"), always), pqxx::serialization_failure);
    EXPECT_EQ(calls.load(), 3);
    EXPECT_EQ(key_rows("k1"), 0);
}

TEST_P(ClientTest, SixtyFourThreadsWithOneKeyHaveOneEffect) {
    constexpr int kThreads = 64;
    std::atomic<int> calls{0}, fresh{0}, replayed{0}, busy{0}, other{0};
    std::vector<std::thread> threads;
    std::mutex error_mutex;
    std::string first_error;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&] {
            try {
                idem::Options options;
                options.wait = std::chrono::milliseconds(20000);
                idem::TransactionHandler slow = [&](pqxx::transaction_base& tx) {
                    ++calls;
                    idem::pq::exec(
                        tx, "INSERT INTO client_effects (principal, note) VALUES ($1, 'once')",
                        principal_);
                    tx.exec("SELECT pg_sleep(0.2)");
                    idem::Response response;
                    response.status = 201;
                    response.body = "the one";
                    return response;
                };
                idem::Response response;
                options.prepare_statements = is_prepared(GetParam());
                if (is_pipelined(GetParam())) {
                    idem::Connection connection(conninfo());
                    idem::Client client(connection, options);
                    response = run(client, request("shared"), slow);
                } else {
                    pqxx::connection connection(conninfo());
                    idem::Client client(connection, options);
                    response = run(client, request("shared"), slow);
                }
                if (response.status == 201 && !response.replayed)
                    ++fresh;
                else if (response.status == 201 && response.replayed && response.body == "the one")
                    ++replayed;
                else if (response.status == 409)
                    ++busy;
                else
                    ++other;
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

TEST_P(ClientTest, ClientDigestEqualsServerFingerprint) {
    pqxx::nontransaction tx(db());
    for (const std::string& body :
         {std::string(R"({"b":1,"a":[1.0,2e3,"\u00e9"]})"), std::string("a=1&b=2"), std::string(),
          std::string("{\"dup\":1,\"dup\":2}")}) {
        idem::Request r = request("k", body);
        r.exclude = {"/a/1"};
        idem::Digest digest = idem::fingerprint(r);
        const std::string server = idem::pq::bytes_of(idem::pq::exec1(
            tx, "SELECT idempotency.fingerprint('POST', '/orders', $1, ARRAY['/a/1'])",
            idem::pq::bytes(body))[0]);
        ASSERT_EQ(server.size(), digest.size());
        EXPECT_EQ(std::memcmp(server.data(), digest.data(), digest.size()), 0) << body;
    }
}

TEST_P(ClientTest, FailedCommitLeavesNoRowNoEffectAndAUsableConnection) {
    idem::Client client = make_client();
    std::atomic<int> calls{0};
    idem::TransactionHandler duplicate = [&](pqxx::transaction_base& tx) {
        ++calls;
        idem::pq::exec(tx, "INSERT INTO client_effects (principal, note) VALUES ($1, 'doomed')",
                       principal_);
        idem::pq::exec(tx, "INSERT INTO client_deferred (principal, slot) VALUES ($1, 1), ($1, 1)",
                       principal_);
        idem::Response response;
        response.status = 201;
        return response;
    };
    try {
        run(client, request("k1"), duplicate);
        ADD_FAILURE() << "the deferred unique constraint fails the COMMIT";
    } catch (const pqxx::sql_error& e) {
        EXPECT_EQ(e.sqlstate(), "23505") << e.what();
    }
    EXPECT_EQ(calls.load(), 1);
    EXPECT_EQ(effects(), 0);
    EXPECT_EQ(key_rows("k1"), 0);
    // The same client and connection go on: the next attempt with the key runs.
    EXPECT_EQ(run(client, request("k1"), writer(201, &calls)).status, 201);
    EXPECT_EQ(calls.load(), 2);
    EXPECT_EQ(effects(), 1);
    EXPECT_EQ(key_rows("k1"), 1);
}

TEST_P(ClientTest, SerializationFailureAtCommitIsRetried) {
    idem::Client client = make_client();
    std::atomic<int> calls{0};
    idem::TransactionHandler flaky = [&](pqxx::transaction_base& tx) {
        const bool first = ++calls == 1;
        idem::pq::exec(tx, "INSERT INTO client_effects (principal, note) VALUES ($1, 'attempt')",
                       principal_);
        idem::pq::exec(
            tx, "INSERT INTO client_deferred (principal, slot, fail_with) VALUES ($1, $2, $3)",
            principal_, calls.load(), first ? "40001" : nullptr);
        idem::Response response;
        response.status = 201;
        response.body = "attempt " + std::to_string(calls.load());
        return response;
    };
    idem::Response response = run(client, request("k1"), flaky);
    EXPECT_EQ(response.status, 201);
    EXPECT_EQ(response.body, "attempt 2");
    EXPECT_EQ(client.counters().retries, 1u);
    EXPECT_EQ(effects(), 1);
    EXPECT_EQ(run(client, request("k1"), flaky).body, "attempt 2")
        << "the second attempt's response was stored";
}

INSTANTIATE_TEST_SUITE_P(Transports, ClientTest, ::testing::ValuesIn(modes()), mode_name);

// Round trips of one keyed request, counted from libpq's protocol trace: every
// Sync and every simple Query waits for the server once.
class RoundTripTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() { create_tables(); }

    static int round_trips(idem::Connection& connection, const std::function<void()>& work) {
        std::FILE* trace = std::tmpfile();
        if (trace == nullptr) throw std::runtime_error("tmpfile failed");
        PQtrace(connection.raw_connection(), trace);
        PQsetTraceFlags(connection.raw_connection(), PQTRACE_SUPPRESS_TIMESTAMPS);
        try {
            work();
        } catch (...) {
            PQuntrace(connection.raw_connection());
            std::fclose(trace);
            throw;
        }
        PQuntrace(connection.raw_connection());
        std::rewind(trace);
        int count = 0;
        char line[4096];
        while (std::fgets(line, sizeof line, trace) != nullptr) {
            // "F\t<length>\tSync" / "F\t<length>\tQuery\t..." (frontend messages)
            const std::string text(line);
            if (text.rfind("F\t", 0) != 0) continue;
            const std::size_t name = text.find('\t', 2);
            if (name == std::string::npos) continue;
            const std::string message =
                text.substr(name + 1, text.find_first_of("\t\n", name + 1) - name - 1);
            if (message == "Sync" || message == "Query") ++count;
        }
        std::fclose(trace);
        return count;
    }

    static idem::Response created(pqxx::transaction_base& tx, const std::string& principal) {
        idem::pq::exec(tx, "INSERT INTO client_effects (principal, note) VALUES ($1, 'traced')",
                       principal);
        idem::Response response;
        response.status = 201;
        response.body = "{}";
        return response;
    }
};

TEST_F(RoundTripTest, PipelinedKeyedRequestCostsWhatAPlainTransactionCosts) {
    idem::Connection connection(conninfo());
    idem::Options options;
    options.final_statuses =
        "2xx,4xx";  // known up front: no query for the server's list in the count
    idem::Client client(connection, options);
    const std::string principal = unique_principal();
    idem::Request r;
    r.principal = principal;
    r.method = "POST";
    r.path = "/orders";
    r.body = "{}";

    const int plain = round_trips(connection, [&] {
        pqxx::work tx(connection);
        created(tx, principal);
        tx.commit();
    });
    EXPECT_EQ(plain, 3) << "BEGIN, INSERT, COMMIT";

    int count = 0;
    r.key = "pipelined";
    count = round_trips(connection, [&] {
        EXPECT_EQ(
            client.handle(r, [&](pqxx::transaction_base& tx) { return created(tx, principal); })
                .status,
            201);
    });
    EXPECT_EQ(count, plain) << "BEGIN + begin(), INSERT, complete() + COMMIT";

    count = round_trips(connection, [&] {
        EXPECT_TRUE(
            client.handle(r, [&](pqxx::transaction_base& tx) { return created(tx, principal); })
                .replayed);
    });
    EXPECT_EQ(count, 2) << "BEGIN + begin(), COMMIT";

    r.key = "classic";
    count = round_trips(connection, [&] {
        EXPECT_EQ(client.handle(r, [&](pqxx::work& tx) { return created(tx, principal); }).status,
                  201);
    });
    EXPECT_EQ(count, 5) << "a pqxx::work handler: BEGIN, begin(), INSERT, complete(), COMMIT";

    // Prepared statements: the first request prepares them (two round trips more),
    // later ones cost the same three round trips, and the server holds them.
    if (std::getenv("IDEM_TEST_PGBOUNCER") == nullptr) {
        options.prepare_statements = true;
        idem::Client prepared(connection, options);
        r.key = "prepared-1";
        count = round_trips(connection, [&] {
            EXPECT_EQ(
                prepared
                    .handle(r, [&](pqxx::transaction_base& tx) { return created(tx, principal); })
                    .status,
                201);
        });
        EXPECT_EQ(count, plain + 2) << "PREPARE begin, PREPARE complete, then as before";
        r.key = "prepared-2";
        count = round_trips(connection, [&] {
            EXPECT_EQ(
                prepared
                    .handle(r, [&](pqxx::transaction_base& tx) { return created(tx, principal); })
                    .status,
                201);
        });
        EXPECT_EQ(count, plain);
        pqxx::nontransaction query(connection);
        EXPECT_EQ(idem::pq::exec1(query,
                                  "SELECT count(*) FROM pg_prepared_statements WHERE name IN "
                                  "('idempotency_begin_p1', 'idempotency_complete_p1')")[0]
                      .as<int>(),
                  2);
    }

    // The same handler on a plain pqxx::connection takes the classic path.
    pqxx::connection plain_connection(conninfo());
    idem::Client plain_client(plain_connection);
    r.key = "adapted";
    EXPECT_EQ(
        plain_client.handle(r, [&](pqxx::transaction_base& tx) { return created(tx, principal); })
            .status,
        201);
    r.key = "pipelined";
    EXPECT_TRUE(
        plain_client.handle(r, [&](pqxx::transaction_base& tx) { return created(tx, principal); })
            .replayed);
}

}  // namespace
