// idempotency.http_answer against the client: for every outcome that does not
// run the handler, the answer the extension gives for the outcome `begin`
// returns is, byte for byte, the answer idem::Client gives for the same key
// (status, every header in its order, body): the client takes that answer in
// begin's statement and sends it as it is. Connection from IDEM_TEST_DSN, as
// client_test.cpp.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "idem/client.hpp"
#include "pqxx_compat.hpp"

namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

std::string conninfo() {
    const char* dsn = std::getenv("IDEM_TEST_DSN");
    return dsn != nullptr ? dsn : "";
}

std::string unique(const std::string& name) {
    return name + "-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

/// An answer as the test compares it.
struct Answer {
    int status = 0;
    Pairs headers;
    std::string body;
};

Answer of(const idem::Response& response) {
    return {response.status, response.headers, response.body};
}

/// What idempotency.http_answer says for the outcome of begin(principal, key,
/// action, digest) now, in a transaction that is rolled back.
Answer from_sql(const std::string& principal, const std::string& key, const std::string& action,
                const idem::Digest& digest, pqxx::connection& connection) {
    pqxx::work tx(connection);
    const pqxx::row row = idem::pq::exec1(
        tx,
        "SELECT a.status, a.headers::text, a.body FROM idempotency.begin($1, $2, $3, $4, "
        "wait => '0') AS o, idempotency.http_answer(o) AS a",
        principal, key, action,
        idem::pq::bytes(
            std::string_view(reinterpret_cast<const char*>(digest.data()), digest.size())));
    Answer answer;
    EXPECT_FALSE(row[0].is_null()) << "an outcome that runs the handler has no answer";
    if (row[0].is_null()) return answer;
    answer.status = row[0].as<int>();
    for (const auto& pair : nlohmann::json::parse(row[1].as<std::string>()))
        answer.headers.emplace_back(pair[0].get<std::string>(), pair[1].get<std::string>());
    answer.body = idem::pq::bytes_of(row[2]);
    tx.abort();
    return answer;
}

void expect_same(const Answer& sql, const Answer& client, const char* what) {
    EXPECT_EQ(sql.status, client.status) << what;
    EXPECT_EQ(sql.headers, client.headers) << what;
    EXPECT_EQ(sql.body, client.body) << what;
}

class HttpAnswerTest : public ::testing::Test {
protected:
    void SetUp() override {
        connection_ = std::make_unique<pqxx::connection>(conninfo());
        principal_ = unique("http-answer");
    }

    idem::Request request(const std::string& key, const std::string& body = R"({"item":"book"})",
                          const std::string& path = "/orders") const {
        idem::Request r;
        r.principal = principal_;
        r.key = key;
        r.method = "POST";
        r.path = path;
        r.body = body;
        return r;
    }

    /// The client's answer to r, and the extension's for the same key and request.
    std::pair<Answer, Answer> both(idem::Client& client, const idem::Request& r,
                                   const idem::Handler& handler) {
        const Answer by_client = of(client.handle(r, handler));
        return {from_sql(principal_, *r.key, "POST " + r.path, idem::fingerprint(r), *connection_),
                by_client};
    }

    std::unique_ptr<pqxx::connection> connection_;
    std::string principal_;
};

idem::Handler created(std::string body, Pairs headers, bool secret = false) {
    return [body = std::move(body), headers = std::move(headers), secret](pqxx::work&) {
        idem::Response response;
        response.status = 201;
        response.body = body;
        response.headers = headers;
        response.one_time_secret = secret;
        return response;
    };
}

TEST_F(HttpAnswerTest, ReplayMismatchAndSecretAreTheClientsAnswers) {
    idem::Options options;
    options.kept_headers = {"Content-Type", "Location", "Set-Cookie"};
    idem::Client client(*connection_, options);
    const idem::Handler handler =
        created(R"({"id":7,"note":"caf\u00e9"})", {{"Content-Type", "application/json"},
                                                   {"Set-Cookie", "a=1"},
                                                   {"Location", "/orders/7"},
                                                   {"X-Not-Kept", "1"},
                                                   {"Set-Cookie", "b=2"}});
    ASSERT_EQ(client.handle(request("k1"), handler).status, 201);

    auto [replay_sql, replay_client] = both(client, request("k1"), handler);
    ASSERT_TRUE(replay_client.status == 201 && !replay_client.headers.empty());
    expect_same(replay_sql, replay_client, "replay");

    auto [reuse_sql, reuse_client] = both(client, request("k1", R"({"item":"pen"})"), handler);
    ASSERT_EQ(reuse_client.status, 422);
    expect_same(reuse_sql, reuse_client, "mismatch (422)");

    ASSERT_EQ(client.handle(request("k2"), created(R"({"secret":"s"})", {}, true)).status, 201);
    auto [secret_sql, secret_client] = both(client, request("k2"), handler);
    ASSERT_EQ(secret_client.status, 409);
    expect_same(secret_sql, secret_client, "one-time secret (409)");
}

TEST_F(HttpAnswerTest, InProgressIsTheClientsAnswer) {
    idem::Options options;
    options.wait = std::chrono::milliseconds(0);
    idem::Client client(*connection_, options);
    const idem::Request r = request("k1");
    pqxx::connection other(conninfo());
    pqxx::work holder(other);
    const idem::Digest digest = idem::fingerprint(r);
    idem::pq::exec1(holder, "SELECT outcome FROM idempotency.begin($1, 'k1', 'POST /orders', $2)",
                    principal_,
                    idem::pq::bytes(std::string_view(reinterpret_cast<const char*>(digest.data()),
                                                     digest.size())));
    auto [sql, by_client] = both(client, r, created("{}", {}));
    ASSERT_EQ(by_client.status, 409);
    expect_same(sql, by_client, "in progress (409, Retry-After)");
    holder.abort();
}

TEST_F(HttpAnswerTest, AStreamNotKeptIsTheClientsAnswer) {
    idem::Client client(*connection_, idem::Options{});
    const idem::Request r = request("k1");
    const idem::Digest digest = idem::fingerprint(r);
    {
        pqxx::work tx(*connection_);
        idem::pq::exec1(tx, "SELECT outcome FROM idempotency.begin($1, 'k1', 'POST /orders', $2)",
                        principal_,
                        idem::pq::bytes(std::string_view(
                            reinterpret_cast<const char*>(digest.data()), digest.size())));
        idem::pq::exec1(tx,
                        "SELECT idempotency.complete($1, 'k1', 200, NULL, "
                        "'[[\":not_kept\", \"stream-too-large\"]]')",
                        principal_);
        tx.commit();
    }
    auto [sql, by_client] = both(client, r, created("{}", {}));
    ASSERT_EQ(by_client.status, 409);
    expect_same(sql, by_client, "a stream not kept (409)");
}

TEST_F(HttpAnswerTest, ExpiredIsTheClientsAnswer) {
    const std::string path = "/" + unique("expiring");
    const std::string action = "POST " + path;
    {
        pqxx::nontransaction tx(*connection_);
        idem::pq::exec(tx, "SELECT idempotency.set_expiry_policy($1, 'refuse', '1 hour')", action);
    }
    idem::Client client(*connection_, idem::Options{});
    const idem::Request r = request("k1", "{}", path);
    ASSERT_EQ(client.handle(r, created("{}", {})).status, 201);
    {
        pqxx::work tx(*connection_);
        idem::pq::exec(tx,
                       "UPDATE idempotency.keys SET created_at = created_at - interval '2 days', "
                       "expires_at = now() - interval '1 minute' WHERE principal = $1",
                       principal_);
        tx.commit();
    }
    auto [sql, by_client] = both(client, r, created("{}", {}));
    ASSERT_EQ(by_client.status, 410);
    expect_same(sql, by_client, "expired (410)");
    pqxx::nontransaction tx(*connection_);
    idem::pq::exec(tx, "SELECT idempotency.set_expiry_policy($1, 'run')", action);
}

}  // namespace
