// Integration tests of streamed responses (Response::stream): captured chunk by chunk,
// completed when the stream ends, replayed with the same chunks; too large, not kept
// (409 on retry); not final, not stored; a peer gone or a stream that throws stores
// nothing. On a pqxx::connection (five round trips) and on an idem::Connection
// (pipelined). Connection from the libpq environment, as client_test.cpp.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "idem/client.hpp"
#include "pqxx_compat.hpp"

namespace {

std::string conninfo() {
    const char* dsn = std::getenv("IDEM_TEST_DSN");
    return dsn != nullptr ? dsn : "";
}

// What the transport sent: the chunks in order; `fail_after` chunks, then "peer gone".
struct Wire final : idem::ChunkSink {
    std::vector<std::string> chunks;
    std::size_t fail_after = SIZE_MAX;
    bool write(std::string_view chunk) override {
        if (chunks.size() >= fail_after) return false;
        chunks.emplace_back(chunk);
        return true;
    }
};

class StreamTest : public ::testing::TestWithParam<bool> {  // true: pipelined
protected:
    void SetUp() override {
        pqxx::connection setup(conninfo());
        pqxx::work tx(setup);
        tx.exec(
            "CREATE TABLE IF NOT EXISTS client_effects (id bigserial PRIMARY KEY, principal "
            "text, note text)");
        tx.commit();
        if (GetParam())
            pipelined_ = std::make_unique<idem::Connection>(conninfo());
        else
            plain_ = std::make_unique<pqxx::connection>(conninfo());
        principal_ =
            "stream-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    }

    idem::Client client(std::size_t max_stream_bytes = 1000) {
        idem::Options options;
        options.max_stream_bytes = max_stream_bytes;
        if (pipelined_) return idem::Client(*pipelined_, std::move(options));
        return idem::Client(*plain_, std::move(options));
    }

    idem::Request request(const std::string& key) const {
        idem::Request r;
        r.principal = principal_;
        r.key = key;
        r.method = "POST";
        r.path = "/orders/stream";
        r.body = R"({"chunks":3})";
        return r;
    }

    // Inserts one effect, then streams `chunks` (in the transaction that holds the key).
    idem::TransactionHandler streamer(int status, std::vector<std::string> chunks,
                                      bool throw_midway = false) {
        return [this, status, chunks, throw_midway](pqxx::transaction_base& tx) {
            ++calls_;
            idem::pq::exec(tx, "INSERT INTO client_effects (principal, note) VALUES ($1, 's')",
                           principal_);
            idem::Response response;
            response.status = status;
            response.headers = {{"Content-Type", "text/plain"}, {"X-Not-Kept", "1"}};
            response.stream = [&tx, chunks, throw_midway](idem::ChunkSink& sink) {
                for (std::size_t i = 0; i < chunks.size(); ++i) {
                    if (throw_midway && i == 1) throw std::runtime_error("broken stream");
                    // The stream still runs in the transaction that holds the key.
                    idem::pq::exec(tx, "SELECT 1");
                    if (!sink.write(chunks[i])) return;
                }
            };
            return response;
        };
    }

    // handle() and then the transport's part: run the stream into `wire`.
    idem::Response send(idem::Client& c, const std::string& key, idem::TransactionHandler h,
                        Wire& wire) {
        idem::Response response;
        if (pipelined_) {
            response = c.handle(request(key), h);
        } else {
            response = c.handle(request(key), idem::Handler([&](pqxx::work& tx) { return h(tx); }));
        }
        if (response.stream) response.stream(wire);
        return response;
    }

    long effects() const {
        pqxx::connection connection(conninfo());
        pqxx::nontransaction tx(connection);
        return idem::pq::exec1(tx, "SELECT count(*) FROM client_effects WHERE principal = $1",
                               principal_)[0]
            .as<long>();
    }

    // The stored row: headers (text) and body, or NULLs when there is none.
    std::pair<std::string, std::string> stored(const std::string& key) const {
        pqxx::connection connection(conninfo());
        pqxx::nontransaction tx(connection);
        const pqxx::result rows =
            idem::pq::exec(tx,
                           "SELECT coalesce(response_headers::text, ''), "
                           "coalesce(encode(response_body, 'escape'), '') "
                           "FROM idempotency.keys WHERE principal = $1 AND key = $2",
                           principal_, key);
        if (rows.empty()) return {"none", "none"};
        return {rows[0][0].as<std::string>(), rows[0][1].as<std::string>()};
    }

    std::unique_ptr<idem::Connection> pipelined_;
    std::unique_ptr<pqxx::connection> plain_;
    std::string principal_;
    std::atomic<int> calls_{0};
};

TEST_P(StreamTest, FirstStreamIsSentAsProducedStoredAndReplayedWithTheSameChunks) {
    idem::Client c = client();
    Wire first;
    idem::Response head = send(c, "k", streamer(200, {"00000", "1111", "222"}), first);
    EXPECT_EQ(head.status, 200);
    EXPECT_FALSE(head.replayed);
    EXPECT_NE(head.header(idem::expires_header), nullptr);
    EXPECT_EQ(first.chunks, (std::vector<std::string>{"00000", "1111", "222"}));
    EXPECT_EQ(stored("k").second, "000001111222");
    EXPECT_NE(stored("k").first.find(R"([":chunks", "5,4,3"])"), std::string::npos)
        << stored("k").first;

    Wire second;
    idem::Response replay = send(c, "k", streamer(200, {"x"}), second);
    EXPECT_EQ(replay.status, 200);
    EXPECT_TRUE(replay.replayed);
    ASSERT_NE(replay.header("Idempotent-Replay"), nullptr);
    EXPECT_EQ(replay.header(idem::stream_chunks_entry), nullptr);
    EXPECT_EQ(*replay.header("Content-Type"), "text/plain");
    EXPECT_EQ(replay.header("X-Not-Kept"), nullptr);
    EXPECT_EQ(second.chunks, first.chunks) << "same bytes, same boundaries";
    EXPECT_EQ(calls_.load(), 1);
    EXPECT_EQ(effects(), 1);
}

TEST_P(StreamTest, PastTheLimitIsSentWholeNotKeptAndARetryIs409) {
    idem::Client c = client(8);
    Wire first;
    send(c, "big", streamer(200, {"0000", "1111", "2"}), first);
    EXPECT_EQ(first.chunks, (std::vector<std::string>{"0000", "1111", "2"}));
    EXPECT_EQ(stored("big"),
              (std::pair<std::string, std::string>{R"([[":not_kept", "stream-too-large"]])", ""}));
    Wire second;
    idem::Response retry = send(c, "big", streamer(200, {"x"}), second);
    EXPECT_EQ(retry.status, 409);
    EXPECT_FALSE(retry.stream);
    EXPECT_EQ(nlohmann::json::parse(retry.body)["type"], "/problems/response-not-kept");
    EXPECT_EQ(calls_.load(), 1);
    EXPECT_EQ(effects(), 1);
    EXPECT_EQ(c.counters().streams_not_kept, 1u);
}

TEST_P(StreamTest, NonFinalStreamIsSentButNotStoredAndTheRetryRunsAgain) {
    idem::Client c = client();
    Wire first;
    idem::Response head = send(c, "k5", streamer(503, {"a", "b"}), first);
    EXPECT_EQ(head.status, 503);
    EXPECT_EQ(first.chunks, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(stored("k5").first, "none");
    EXPECT_EQ(effects(), 0) << "rolled back";
    Wire second;
    send(c, "k5", streamer(200, {"c"}), second);
    EXPECT_EQ(second.chunks, std::vector<std::string>{"c"});
    EXPECT_EQ(calls_.load(), 2);
    EXPECT_EQ(effects(), 1);
}

TEST_P(StreamTest, FinalErrorStreamIsStoredWithoutItsEffectAndReplayed) {
    idem::Client c = client();
    Wire first, second;
    send(c, "k4", streamer(409, {"no", "pe"}), first);
    EXPECT_EQ(effects(), 0);
    idem::Response replay = send(c, "k4", streamer(200, {"x"}), second);
    EXPECT_EQ(replay.status, 409);
    EXPECT_TRUE(replay.replayed);
    EXPECT_EQ(second.chunks, (std::vector<std::string>{"no", "pe"}));
    EXPECT_EQ(calls_.load(), 1);
}

TEST_P(StreamTest, PeerGoneOrBrokenStreamStoresNothing) {
    idem::Client c = client();
    Wire gone;
    gone.fail_after = 1;
    send(c, "g", streamer(200, {"a", "b", "c"}), gone);
    EXPECT_EQ(stored("g").first, "none");
    EXPECT_EQ(effects(), 0);
    Wire broken;
    EXPECT_THROW(send(c, "b", streamer(200, {"a", "b"}, true), broken), std::runtime_error);
    EXPECT_EQ(stored("b").first, "none");
    EXPECT_EQ(effects(), 0);
    Wire again;
    send(c, "b", streamer(200, {"a", "b"}), again);  // the connection is usable again
    EXPECT_EQ(again.chunks, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(effects(), 1);
}

TEST_P(StreamTest, StreamThatIsNeverSentRollsBack) {
    idem::Client c = client();
    {
        idem::Response dropped = c.handle(request("d"), streamer(200, {"a"}));
        (void)dropped;  // the transport never ran the stream (the peer left before)
    }
    EXPECT_EQ(stored("d").first, "none");
    EXPECT_EQ(effects(), 0);
}

// A named function, not a lambda: gtest's macro names its own parameter `info`
// (a lambda's would shadow it: -Werror=shadow).
std::string connection_name(const ::testing::TestParamInfo<bool>& param_info) {
    return param_info.param ? "Pipelined" : "Work";
}

INSTANTIATE_TEST_SUITE_P(Connections, StreamTest, ::testing::Values(false, true), connection_name);

}  // namespace
