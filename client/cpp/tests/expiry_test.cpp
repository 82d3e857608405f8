// Integration tests of the key's expiry header (Idempotency-Expires) and of
// wait-or-reject per client and per call, on a pqxx::connection (five round
// trips) and on an idem::Connection (pipelined). Connection from the libpq
// environment, as client_test.cpp.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "idem/client.hpp"
#include "pqxx_compat.hpp"

namespace {

std::string conninfo() {
    const char* dsn = std::getenv("IDEM_TEST_DSN");
    return dsn != nullptr ? dsn : "";
}

std::string principal() {
    return "expiry-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

// The stored row's expires_at as the header writes it.
std::string stored_expiry(const std::string& who, const std::string& key) {
    pqxx::connection connection(conninfo());
    pqxx::nontransaction tx(connection);
    return idem::http_date(idem::pq::exec1(tx,
                                           "SELECT floor(extract(epoch FROM expires_at))::bigint "
                                           "FROM idempotency.lookup($1, $2)",
                                           who, key)[0]
                               .as<long long>());
}

std::vector<std::string> expiry_values(const idem::Response& response) {
    std::vector<std::string> values;
    for (const auto& [name, value] : response.headers)
        if (idem::header_name_equal(name, idem::expires_header)) values.push_back(value);
    return values;
}

idem::Request request(const std::string& who, const std::string& key, std::string body) {
    idem::Request r;
    r.principal = who;
    r.key = key;
    r.method = "POST";
    r.path = "/orders";
    r.body = std::move(body);
    return r;
}

// Answers `status` and sets the expiry header itself: the client's value replaces it.
idem::TransactionHandler answer(int status) {
    return [status](pqxx::transaction_base&) {
        idem::Response response;
        response.status = status;
        response.body = "{}";
        response.headers = {{"Content-Type", "application/json"},
                            {idem::expires_header, "handler's own"}};
        return response;
    };
}

class ExpiryTest : public ::testing::TestWithParam<bool> {  // true: pipelined
protected:
    void SetUp() override {
        if (GetParam())
            pipelined_ = std::make_unique<idem::Connection>(conninfo());
        else
            plain_ = std::make_unique<pqxx::connection>(conninfo());
    }
    idem::Client client(idem::Options options = {}) {
        if (pipelined_) return idem::Client(*pipelined_, std::move(options));
        return idem::Client(*plain_, std::move(options));
    }
    idem::Response run(idem::Client& c, const idem::Request& r, int status) {
        if (pipelined_) return c.handle(r, answer(status));
        const idem::TransactionHandler handler = answer(status);
        return c.handle(r, idem::Handler([&](pqxx::work& tx) { return handler(tx); }));
    }
    std::unique_ptr<idem::Connection> pipelined_;
    std::unique_ptr<pqxx::connection> plain_;
};

TEST_P(ExpiryTest, FirstAnswerReplayAnd422CarryTheStoredRowsExpiryNeverStored) {
    idem::Options options;
    options.kept_headers.push_back(idem::expires_header);  // still never stored
    idem::Client c = client(options);
    const std::string who = principal();
    const idem::Response first = run(c, request(who, "k", R"({"a":1})"), 201);
    ASSERT_EQ(first.status, 201);
    EXPECT_EQ(expiry_values(first), std::vector<std::string>{stored_expiry(who, "k")});
    {
        pqxx::connection connection(conninfo());
        pqxx::nontransaction tx(connection);
        const std::string stored = idem::pq::exec1(tx,
                                                   "SELECT response_headers::text FROM "
                                                   "idempotency.keys WHERE principal = $1",
                                                   who)[0]
                                       .as<std::string>();
        EXPECT_EQ(stored.find(idem::expires_header), std::string::npos) << stored;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // a recomputed value moves
    const idem::Response replay = run(c, request(who, "k", R"({"a":1})"), 201);
    EXPECT_TRUE(replay.replayed);
    EXPECT_EQ(expiry_values(replay), expiry_values(first));
    const idem::Response other = run(c, request(who, "k", R"({"a":2})"), 201);
    EXPECT_EQ(other.status, 422);
    EXPECT_EQ(expiry_values(other), expiry_values(first));
    const idem::Response error = run(c, request(who, "k409", "{}"), 409);
    EXPECT_EQ(expiry_values(error), std::vector<std::string>{stored_expiry(who, "k409")});
    const idem::Response unstored = run(c, request(who, "k500", "{}"), 500);
    EXPECT_EQ(expiry_values(unstored), std::vector<std::string>{"handler's own"});
}

TEST_P(ExpiryTest, RejectIs409AtOnceByOptionOrPerCall) {
    for (const bool per_call : {false, true}) {
        const std::string who = principal();
        pqxx::connection holder_connection(conninfo());
        pqxx::work holder(holder_connection);
        const idem::Digest digest = idem::fingerprint(request(who, "held", "{}"));
        const std::string outcome =
            idem::pq::exec1(holder,
                            "SELECT outcome FROM idempotency.begin($1, 'held', 'POST /orders', $2)",
                            who,
                            idem::pq::bytes(std::string_view(
                                reinterpret_cast<const char*>(digest.data()), digest.size())))[0]
                .as<std::string>();
        ASSERT_EQ(outcome, "started");
        idem::Options options;
        options.wait = std::chrono::seconds(3);
        if (!per_call) options.duplicates = idem::Duplicates::reject;
        idem::Client c = client(options);
        idem::Request r = request(who, "held", "{}");
        if (per_call) r.duplicates = idem::Duplicates::reject;
        const auto started = std::chrono::steady_clock::now();
        const idem::Response busy = run(c, r, 201);
        const auto took = std::chrono::steady_clock::now() - started;
        holder.abort();
        EXPECT_EQ(busy.status, 409);
        ASSERT_NE(busy.header("Retry-After"), nullptr);
        EXPECT_EQ(*busy.header("Retry-After"), "1");
        EXPECT_LT(took, std::chrono::seconds(1)) << "per_call " << per_call;
    }
}

std::string path_name(const ::testing::TestParamInfo<bool>& param) {
    return param.param ? "Pipelined" : "Work";
}

INSTANTIATE_TEST_SUITE_P(Modes, ExpiryTest, ::testing::Values(false, true), path_name);

}  // namespace
