// Integration tests of the lease protocol from C++ (idem::LeaseRunner): renewal,
// takeover, fencing, the three policies, and a holder killed with SIGKILL.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "idem/lease.hpp"
#include "pqxx_compat.hpp"

namespace {

using namespace std::chrono_literals;

std::string conninfo() {
    const char* dsn = std::getenv("IDEM_TEST_DSN");
    return dsn != nullptr ? dsn : "";
}

class LeaseTest : public ::testing::Test {
protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        principal_ = std::string("lease-") + info->name() + "-" +
                     std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    }

    idem::Request request(const std::string& key) const {
        idem::Request r;
        r.principal = principal_;
        r.key = key;
        r.method = "POST";
        r.path = "/v1/call/charge";
        r.body = R"({"amount":500})";
        return r;
    }

    static idem::ExternalBody slow_body(std::chrono::milliseconds duration, std::atomic<int>* calls,
                                        int status = 200, const std::string& text = "charged") {
        return [=] {
            ++*calls;
            std::this_thread::sleep_for(duration);
            idem::Response response;
            response.status = status;
            response.body = text;
            response.headers = {{"Content-Type", "text/plain"}};
            return response;
        };
    }

    std::int64_t stored_fence(const std::string& key) const {
        pqxx::connection connection(conninfo());
        pqxx::nontransaction tx(connection);
        return idem::pq::exec1(
                   tx, "SELECT fence FROM idempotency.keys WHERE principal = $1 AND key = $2",
                   principal_, key)[0]
            .as<std::int64_t>();
    }

    std::string principal_;
};

TEST_F(LeaseTest, RenewalHoldsTheKeyWhileALongBodyRuns) {
    idem::LeaseOptions options;
    options.lease = 300ms;
    std::atomic<int> calls{0};
    idem::LeaseRunner first(conninfo(), options);
    auto running = std::async(std::launch::async,
                              [&] { return first.run(request("k1"), slow_body(1000ms, &calls)); });
    std::this_thread::sleep_for(500ms);  // past the first 300 ms lease: only renewal keeps it
    idem::LeaseRunner duplicate(conninfo(), options);
    idem::LeaseResult during = duplicate.run(request("k1"), slow_body(0ms, &calls));
    EXPECT_EQ(during.outcome, idem::LeaseOutcome::in_progress);
    EXPECT_EQ(during.response.status, 409);
    ASSERT_NE(during.response.header("Retry-After"), nullptr);
    idem::LeaseResult done = running.get();
    EXPECT_EQ(done.outcome, idem::LeaseOutcome::fresh);
    EXPECT_EQ(done.fence, stored_fence("k1"));
    EXPECT_GE(done.renewals, 2);
    EXPECT_EQ(calls.load(), 1);
    // remember: the next call replays the stored response.
    idem::LeaseResult after = duplicate.run(request("k1"), slow_body(0ms, &calls));
    EXPECT_EQ(after.outcome, idem::LeaseOutcome::replayed);
    EXPECT_EQ(after.response.body, "charged");
    EXPECT_EQ(*after.response.header("Idempotent-Replay"), "true");
    EXPECT_EQ(calls.load(), 1);
}

TEST_F(LeaseTest, WithoutRenewalTheKeyIsTakenOverAndTheFirstHolderIsUnfenced) {
    idem::LeaseOptions options;
    options.lease = 300ms;
    options.renew = false;
    std::atomic<int> calls{0};
    idem::LeaseRunner first(conninfo(), options);
    auto running = std::async(std::launch::async, [&] {
        return first.run(request("k1"), slow_body(1000ms, &calls, 200, "first"));
    });
    std::this_thread::sleep_for(500ms);
    idem::LeaseRunner second(conninfo(), options);
    idem::LeaseResult takeover = second.run(request("k1"), slow_body(0ms, &calls, 200, "second"));
    EXPECT_EQ(takeover.outcome, idem::LeaseOutcome::fresh);
    idem::LeaseResult stale = running.get();
    EXPECT_GT(takeover.fence, stale.fence)
        << "fences come from one sequence: higher at every takeover";
    EXPECT_EQ(stale.outcome, idem::LeaseOutcome::fresh_unfenced);
    EXPECT_EQ(stale.response.body, "first")
        << "the body is never cancelled; its response is still returned";
    EXPECT_EQ(calls.load(), 2);
    EXPECT_EQ(stored_fence("k1"), takeover.fence);
    idem::LeaseResult replay = second.run(request("k1"), slow_body(0ms, &calls));
    EXPECT_EQ(replay.response.body, "second") << "the stale holder changed nothing";
}

TEST_F(LeaseTest, OnceAfterAFailingBodyIsADuplicate) {
    idem::LeaseOptions options;
    options.policy = idem::Policy::once;
    idem::LeaseRunner runner(conninfo(), options);
    std::atomic<int> calls{0};
    idem::ExternalBody failing = [&]() -> idem::Response {
        ++calls;
        throw std::runtime_error("provider timed out");
    };
    EXPECT_THROW(runner.run(request("k1"), failing), std::runtime_error);
    idem::LeaseResult retry = runner.run(request("k1"), slow_body(0ms, &calls));
    EXPECT_EQ(retry.outcome, idem::LeaseOutcome::duplicate);
    EXPECT_EQ(retry.response.status, 409);
    EXPECT_EQ(calls.load(), 1);
    // A successful once is a duplicate afterwards too.
    EXPECT_EQ(runner.run(request("k2"), slow_body(0ms, &calls)).outcome, idem::LeaseOutcome::fresh);
    EXPECT_EQ(runner.run(request("k2"), slow_body(0ms, &calls)).outcome,
              idem::LeaseOutcome::duplicate);
    EXPECT_EQ(calls.load(), 2);
}

TEST_F(LeaseTest, CommitOnSuccessAfterAFailingBodyLetsTheRetryRun) {
    idem::LeaseOptions options;
    options.policy = idem::Policy::commit_on_success;
    idem::LeaseRunner runner(conninfo(), options);
    std::atomic<int> calls{0};
    idem::ExternalBody failing = [&]() -> idem::Response {
        ++calls;
        throw std::runtime_error("broker unavailable");
    };
    EXPECT_THROW(runner.run(request("k1"), failing), std::runtime_error);
    const std::int64_t released_fence = stored_fence("k1");
    idem::LeaseResult retry = runner.run(request("k1"), slow_body(0ms, &calls));
    EXPECT_EQ(retry.outcome, idem::LeaseOutcome::fresh);
    EXPECT_GT(retry.fence, released_fence) << "the released key is taken again with a higher fence";
    EXPECT_EQ(runner.run(request("k1"), slow_body(0ms, &calls)).outcome,
              idem::LeaseOutcome::duplicate);
    // An error status is a failure too.
    EXPECT_EQ(runner.run(request("k3"), slow_body(0ms, &calls, 503)).outcome,
              idem::LeaseOutcome::fresh);
    EXPECT_EQ(runner.run(request("k3"), slow_body(0ms, &calls, 200)).outcome,
              idem::LeaseOutcome::fresh);
    EXPECT_EQ(calls.load(), 4);
}

TEST_F(LeaseTest, RememberReleasesNonFinalResponsesAndReplaysFinalOnes) {
    idem::LeaseRunner runner(conninfo());
    std::atomic<int> calls{0};
    EXPECT_EQ(
        runner.run(request("k1"), slow_body(0ms, &calls, 503, "upstream down")).response.status,
        503);
    idem::LeaseResult again = runner.run(request("k1"), slow_body(0ms, &calls, 201, "made"));
    EXPECT_EQ(again.outcome, idem::LeaseOutcome::fresh);
    idem::LeaseResult replay = runner.run(request("k1"), slow_body(0ms, &calls));
    EXPECT_EQ(replay.outcome, idem::LeaseOutcome::replayed);
    EXPECT_EQ(replay.response.status, 201);
    EXPECT_EQ(replay.response.body, "made");
    EXPECT_EQ(*replay.response.header("Content-Type"), "text/plain");
    EXPECT_EQ(calls.load(), 2);
    idem::Request other = request("k1");
    other.body = R"({"amount":501})";
    EXPECT_EQ(runner.run(other, slow_body(0ms, &calls)).outcome, idem::LeaseOutcome::mismatch);
    idem::Request no_key = request("k1");
    no_key.key.reset();
    EXPECT_EQ(runner.run(no_key, slow_body(0ms, &calls)).outcome, idem::LeaseOutcome::rejected);
}

TEST_F(LeaseTest, HolderKilledWithSigkillIsTakenOverAfterTheLease) {
    const std::string key = "killed";
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        // The holder: takes the key with a 1 s lease (renewed) and never finishes.
        close(ready[0]);
        try {
            idem::LeaseOptions options;
            options.lease = 1000ms;
            idem::LeaseRunner runner(conninfo(), options);
            runner.run(request(key), [&]() -> idem::Response {
                (void)!write(ready[1], "x", 1);
                for (;;) std::this_thread::sleep_for(1s);
            });
        } catch (...) {
        }
        _exit(1);
    }
    close(ready[1]);
    char byte;
    ASSERT_EQ(read(ready[0], &byte, 1), 1) << "the holder never started its body";
    close(ready[0]);
    std::this_thread::sleep_for(1500ms);  // the holder renews past its first lease
    idem::LeaseRunner runner(conninfo());
    std::atomic<int> calls{0};
    EXPECT_EQ(runner.run(request(key), slow_body(0ms, &calls)).outcome,
              idem::LeaseOutcome::in_progress)
        << "a live, renewed lease";
    ASSERT_EQ(kill(child, SIGKILL), 0);
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status));
    const std::int64_t killed_fence = stored_fence(key);
    // Nobody renews now: once the lease has run out, the key is taken over and
    // the work runs once more (as documented for the lease protocol).
    idem::LeaseResult result;
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    do {
        std::this_thread::sleep_for(200ms);
        result = runner.run(request(key), slow_body(0ms, &calls));
    } while (result.outcome == idem::LeaseOutcome::in_progress &&
             std::chrono::steady_clock::now() < deadline);
    EXPECT_EQ(result.outcome, idem::LeaseOutcome::fresh);
    EXPECT_GT(result.fence, killed_fence);
    EXPECT_EQ(calls.load(), 1);
}

}  // namespace
