// Integration tests of the outcome `expired` (a retry of a key that expired under its
// action's on_expiry 'refuse' policy: 410 with the past Idempotency-Expires) through
// Client and LeaseRunner, and of the lease runner's expiry and wait/reject mode.
// Connection from IDEM_TEST_DSN, as client_test.cpp. The expired test needs an
// extension with idempotency.set_expiry_policy (0.8.0) and is skipped on an older one.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "idem/client.hpp"
#include "idem/lease.hpp"
#include "pqxx_compat.hpp"

namespace {

std::string conninfo() {
    const char* dsn = std::getenv("IDEM_TEST_DSN");
    return dsn != nullptr ? dsn : "";
}

std::string unique(const std::string& name) {
    return name + "-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

long long now_epoch() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// One statement on a connection of its own; the first column of the first row.
template <typename... Args>
std::string scalar(const char* sql, const Args&... args) {
    pqxx::connection connection(conninfo());
    pqxx::nontransaction tx(connection);
    const pqxx::result rows = idem::pq::exec(tx, sql, args...);
    return rows.empty() || rows[0][0].is_null() ? std::string() : rows[0][0].as<std::string>();
}

idem::Request request(const std::string& who, const std::string& key, std::string body,
                      std::string action = "") {
    idem::Request r;
    r.principal = who;
    r.key = key;
    r.method = "POST";
    r.path = "/orders";
    r.body = std::move(body);
    r.action = std::move(action);
    return r;
}

idem::Response created() {
    idem::Response response;
    response.status = 201;
    response.body = "{}";
    return response;
}

void expect_gone(const idem::Response& response, const char* what) {
    EXPECT_EQ(response.status, 410) << what;
    const nlohmann::json body = nlohmann::json::parse(response.body);
    EXPECT_EQ(body["type"], "/problems/idempotency-key-expired") << what;
    EXPECT_EQ(body["title"], "Idempotency-Key has expired") << what;
    EXPECT_FALSE(response.replayed) << what;
    EXPECT_EQ(response.header("Idempotent-Replay"), nullptr) << what;
}

TEST(LeaseExpiry, TheResultCarriesTheRowsExpiryAndAReleasedKeyNone) {
    idem::LeaseRunner runner(conninfo());
    const std::string who = unique("lease-expiry");
    const idem::LeaseResult first = runner.run(request(who, "k", "{}"), created);
    const long long want = std::stoll(scalar(
        "SELECT floor(extract(epoch FROM expires_at))::bigint FROM idempotency.lookup($1, $2)", who,
        std::string("k")));
    EXPECT_EQ(first.outcome, idem::LeaseOutcome::fresh);
    EXPECT_GT(want, now_epoch());
    EXPECT_EQ(first.expires_epoch, want);
    ASSERT_NE(first.response.header(idem::expires_header), nullptr);
    EXPECT_EQ(*first.response.header(idem::expires_header), idem::http_date(want));
    const idem::LeaseResult again = runner.run(request(who, "k", "{}"), created);
    EXPECT_EQ(again.outcome, idem::LeaseOutcome::replayed);
    EXPECT_EQ(again.expires_epoch, want);
    const idem::LeaseResult released = runner.run(request(who, "k2", "{}"), [] {
        idem::Response response;
        response.status = 503;
        return response;
    });
    EXPECT_FALSE(released.expires_epoch.has_value());
    EXPECT_EQ(released.response.header(idem::expires_header), nullptr);
}

TEST(LeaseExpiry, RejectIs409AtOnceByOptionOrPerCall) {
    for (const bool per_call : {false, true}) {
        const std::string who = unique("lease-reject");
        pqxx::connection holder_connection(conninfo());
        pqxx::work holder(holder_connection);
        idem::Request r = request(who, "held", "{}");
        const idem::Digest digest = idem::fingerprint(r);
        const std::string outcome =
            idem::pq::exec1(holder,
                            "SELECT outcome FROM idempotency.begin($1, 'held', 'POST /orders', $2)",
                            who,
                            idem::pq::bytes(std::string_view(
                                reinterpret_cast<const char*>(digest.data()), digest.size())))[0]
                .as<std::string>();
        ASSERT_EQ(outcome, "started");
        idem::LeaseOptions options;
        options.wait = std::chrono::seconds(3);
        if (per_call)
            r.duplicates = idem::Duplicates::reject;
        else
            options.duplicates = idem::Duplicates::reject;
        idem::LeaseRunner runner(conninfo(), options);
        int runs = 0;
        const auto started = std::chrono::steady_clock::now();
        const idem::LeaseResult busy = runner.run(r, [&] {
            ++runs;
            return created();
        });
        const auto took = std::chrono::steady_clock::now() - started;
        holder.abort();
        EXPECT_EQ(busy.outcome, idem::LeaseOutcome::in_progress) << "per_call " << per_call;
        EXPECT_EQ(runs, 0);
        EXPECT_LT(took, std::chrono::seconds(1)) << "per_call " << per_call;
    }
}

TEST(Expired, ARetryAfterExpiryIs410WithThePastExpiryWithoutRunning) {
    if (scalar("SELECT to_regproc('idempotency.set_expiry_policy') IS NOT NULL") != "t")
        GTEST_SKIP() << "the extension has no idempotency.set_expiry_policy (0.8.0 tombstones)";
    const std::string action = unique("gone-action"), who = unique("gone");
    scalar("SELECT idempotency.set_expiry_policy($1, 'refuse')", action);
    idem::Connection connection(conninfo());
    idem::Client client(connection);
    int runs = 0;
    const idem::TransactionHandler handler = [&](pqxx::transaction_base&) {
        ++runs;
        return created();
    };
    ASSERT_EQ(client.handle(request(who, "k", "{}", action), handler).status, 201);
    // The contract's test sequence: the key expires now and cleanup leaves a tombstone.
    scalar(
        "UPDATE idempotency.keys SET created_at = now() - interval '1 hour',"
        " expires_at = now() - interval '1 second'"
        " WHERE principal = $1 AND key = $2",
        who, std::string("k"));
    const long long expired = now_epoch() - 1;
    scalar("SELECT idempotency.cleanup_batch(1000)");
    const idem::Response gone = client.handle(request(who, "k", "{}", action), handler);
    expect_gone(gone, "client");
    ASSERT_NE(gone.header(idem::expires_header), nullptr);
    const std::string told = *gone.header(idem::expires_header);
    EXPECT_TRUE(told == idem::http_date(expired) || told == idem::http_date(expired - 1) ||
                told == idem::http_date(expired + 1))
        << told;
    EXPECT_EQ(client.counters().expired, 1u);
    EXPECT_EQ(client.handle(request(who, "k", R"({"a":2})", action), handler).status, 422);
    idem::LeaseRunner runner(conninfo());
    const idem::LeaseResult leased = runner.run(request(who, "k", "{}", action), [&] {
        ++runs;
        return created();
    });
    EXPECT_EQ(leased.outcome, idem::LeaseOutcome::expired);
    expect_gone(leased.response, "lease");
    ASSERT_TRUE(leased.expires_epoch.has_value());
    EXPECT_LE(std::abs(*leased.expires_epoch - expired), 1);
    EXPECT_EQ(runs, 1);
    scalar("SELECT idempotency.set_expiry_policy($1, 'run')", action);
}

}  // namespace
